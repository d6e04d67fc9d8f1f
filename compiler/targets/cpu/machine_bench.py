"""The CPU target's microbenchmark of one core and its AMX probe: what
`vdla.compiler.targets.cpu.machine` measures once per machine and caches.

    figures = measure(l3_bytes)            # about a second
    amx = probe_amx(log)                   # only where the CPU lists amx_tile

`measure` builds ``c/machine_bench.c`` by the target's own build path (`build_library`,
cached like the kernels, with the flags of the best instruction set this machine's
compiler offers, `isa.detect`), loads it and times its kernels on the calling thread:

- float32 FMAs a nanosecond on 512-bit (AVX-512) and 256-bit (FMA3) vectors, with enough
  independent accumulators to cover the FMA's latency, so the loop runs at the FMA
  ports' throughput; over the clock, FMAs a cycle, and over a vector's lanes, the ports
  (`machine.MachineModel.fma_ports`). That is what tells AMD Zen 4 (a 512-bit FMA as two
  256-bit halves: one port at 512 bits, two at 256) from Intel Sapphire Rapids (two
  512-bit ports);
- int8 multiply-adds a nanosecond on the widest dot-product path the build has:
  vpdpbusd on 512 bits (AVX-512 VNNI), on 256 bits (AVX-512 VNNI with VL, or AVX-VNNI),
  else the vpmaddubsw + vpmaddwd path of vdla's AVX2 kernels;
- the clock: a chain of dependent adds, one a cycle on every x86 core, beside the
  time-stamp counter's rate (its nominal clock, a sanity figure);
- one core's read bandwidth from a buffer four times the L3 (64 MiB to 512 MiB).

Each figure is the best of many short runs, the kernels taking turns: noise only ever
slows a run, and a run shorter than a scheduler's time slice escapes a neighbour that
shares the core. On a shared virtual machine the figures still vary from one
measurement to the next (the read bandwidth most: 14-27 GB/s on this project's 2-core
host within minutes; the compute figures by well under a percent when the core is
free, by tens of percent when the host is busy).

`probe_amx` builds ``c/amx_probe.c`` with ``-mamx-tile`` (`AMX_BUILD_FLAGS`) into a
program and runs it: palette 1's tile limits (CPUID leaves 0x1D/0x1E), and whether a
tile runs here (Linux grants a process the tile state only on request).
"""

from __future__ import annotations

import ctypes
import dataclasses
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from vdla.compiler.targets.cpu import isa as cpu_isa
from vdla.compiler.targets.cpu.build import (BASE_FLAGS, BuildError, build_library,
                                             find_c_compiler)
from vdla.compiler.targets.cpu.cfiles import static_text

__all__ = ["AMX_BUILD_FLAGS", "BENCH_SOURCE", "PROBE_SOURCE", "Figures", "build_amx_probe",
           "measure", "probe_amx"]

#: The AMX probe's flags on top of `BASE_FLAGS`.
AMX_BUILD_FLAGS = ("-mamx-tile", "-mamx-int8", "-mamx-bf16")
#: The C files (in ``c/``) of the benchmark and the probe.
BENCH_SOURCE, PROBE_SOURCE = "machine_bench.c", "amx_probe.c"
#: The kernels of ``c/machine_bench.c`` (its enum).
_CLOCK, _FMA512, _FMA256, _DOT512, _DOT256, _MADD256 = range(6)
#: The int8 paths, widest first: (kernel, instructions, bits).
_INT8_PATHS = ((_DOT512, "vpdpbusd", 512), (_DOT256, "vpdpbusd", 256),
               (_MADD256, "vpmaddubsw+vpmaddwd", 256))
#: Each kernel runs this long per repeat, and the best of `_REPEATS` counts: short runs,
#: many of them, so that some run while no other process has the core (a scheduler's
#: time slice is a few milliseconds).
_RUN_NS, _REPEATS = 1e6, 40
#: The read bandwidth's buffer: four times the L3, within these bounds.
_STREAM_MIN, _STREAM_MAX = 64 << 20, 512 << 20


@dataclasses.dataclass(frozen=True)
class Figures:
    """What the microbenchmark measured on one core (None: not measured here: the build
    lacks the kernel, or the machine is no x86).

    clock_ghz : cycles a nanosecond, from a chain of dependent adds
    tsc_ghz : the time-stamp counter's ticks a nanosecond (its nominal clock)
    fma512_per_ns, fma256_per_ns : float32 FMAs (lanes) a nanosecond on 512- and
        256-bit vectors
    int8_path, int8_bits : the int8 dot-product instructions measured and their width
    int8_macs_per_ns : int8 multiply-adds a nanosecond on that path
    read_gb_s : bytes read a nanosecond from a buffer four times the L3
    seconds : how long measuring took
    """

    clock_ghz: float | None
    tsc_ghz: float | None
    fma512_per_ns: float | None
    fma256_per_ns: float | None
    int8_path: str | None
    int8_bits: int | None
    int8_macs_per_ns: float | None
    read_gb_s: float | None
    seconds: float


def build_amx_probe(folder: Path, cc: str | None = None) -> Path:
    """Build ``c/amx_probe.c`` into the program ``folder/amx_probe`` with `BASE_FLAGS` and
    `AMX_BUILD_FLAGS` (on any x86 machine whose compiler takes them; it runs only where
    the CPU has AMX). BuildError with the compiler's output when it fails.

    folder : where the source and the program go
    cc : the C compiler (default `find_c_compiler()`)
    """
    cc = find_c_compiler() if cc is None else cc
    (folder / PROBE_SOURCE).write_text(static_text(PROBE_SOURCE))
    command = [cc, *BASE_FLAGS, *AMX_BUILD_FLAGS, PROBE_SOURCE, "-o", "amx_probe"]
    proc = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"the AMX probe does not build ({' '.join(command)}):\n"
                         f"{proc.stderr.strip()}")
    return folder / "amx_probe"


def probe_amx(log: Callable[[str], None]) -> dict:
    """The AMX fields of `machine.MachineModel` (amx_max_rows, amx_bytes_per_row,
    amx_tiles, amx_usable) from the probe, None each when it cannot tell. Run it only
    where the CPU lists amx_tile: elsewhere the program's instructions may fault.

    log : receives why the probe told nothing, when it did not
    """
    none = {"amx_max_rows": None, "amx_bytes_per_row": None, "amx_tiles": None,
            "amx_usable": None}
    with tempfile.TemporaryDirectory(prefix="vdla-amx-") as folder:
        try:
            program = build_amx_probe(Path(folder))
            out = subprocess.run([str(program)], capture_output=True, text=True, timeout=30)
            palettes, rows, row_bytes, tiles, _, _, usable = map(int, out.stdout.split())
        except (BuildError, OSError, ValueError, subprocess.SubprocessError) as exc:
            log(f"the AMX probe told nothing: {exc}")
            return none
    if palettes < 1:
        return none
    return {"amx_max_rows": rows, "amx_bytes_per_row": row_bytes, "amx_tiles": tiles,
            "amx_usable": {1: True, 0: False}.get(usable)}


def _load_bench(log: Callable[[str], None]) -> ctypes.CDLL:
    """The benchmark's library, built (and cached) like the target's kernels."""
    build = build_library({BENCH_SOURCE: static_text(BENCH_SOURCE)}, name="vdla_machine_bench",
                          flags=cpu_isa.detect().flags, openmp=False, log=log)
    lib = build.load()
    lib.vdla_mb_ops.argtypes, lib.vdla_mb_ops.restype = [ctypes.c_int], ctypes.c_double
    lib.vdla_mb_run.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.POINTER(ctypes.c_double)]
    lib.vdla_mb_run.restype = ctypes.c_double
    lib.vdla_mb_stream.argtypes = [ctypes.c_int64, ctypes.c_int]
    lib.vdla_mb_stream.restype = ctypes.c_double
    return lib


def _calibrate(lib: ctypes.CDLL, kind: int) -> int:
    """Iterations of bench kernel `kind` that run for about `_RUN_NS`."""
    ticks = ctypes.c_double()
    iters = 16
    while (ns := lib.vdla_mb_run(kind, iters, ctypes.byref(ticks))) < _RUN_NS / 5:
        iters *= 8 if ns < _RUN_NS / 50 else 2
    return max(1, int(iters * _RUN_NS / ns))


def _rates(lib: ctypes.CDLL, kinds: list[int]) -> dict[int, tuple[float, float | None]]:
    """kind -> (work a nanosecond, TSC ticks a nanosecond) of the bench kernels `kinds`
    this build has: the best of `_REPEATS` short runs each, the kernels taking turns (a
    neighbour that takes the core for a while then slows some runs of each, not every
    run of one)."""
    kinds = [kind for kind in kinds if lib.vdla_mb_ops(kind) > 0]
    iters = {kind: _calibrate(lib, kind) for kind in kinds}
    best: dict[int, tuple[float, float | None]] = {kind: (0.0, None) for kind in kinds}
    ticks = ctypes.c_double()
    for _ in range(_REPEATS):
        for kind in kinds:
            ns = lib.vdla_mb_run(kind, iters[kind], ctypes.byref(ticks))
            rate = lib.vdla_mb_ops(kind) * iters[kind] / ns if ns > 0 else 0.0
            if rate > best[kind][0]:
                best[kind] = rate, (ticks.value / ns if ticks.value else None)
    return best


def measure(l3_bytes: int | None, log: Callable[[str], None] | None = None) -> Figures:
    """Run the microbenchmark on this core (module docstring); about a second, plus the
    benchmark's build the first time.

    l3_bytes : the L3's size (the read bandwidth's buffer is four times it), None when
        unknown
    log : receives the build's lines (default: nothing)
    """
    log = log or (lambda message: None)
    started = time.perf_counter()
    lib = _load_bench(log)
    # the widest int8 path this build has
    path = next((p for p in _INT8_PATHS if lib.vdla_mb_ops(p[0]) > 0), None)
    found = _rates(lib, [_CLOCK, _FMA512, _FMA256] + ([path[0]] if path else []))
    clock = found.get(_CLOCK, (None, None))
    int8 = (path[1], path[2], found[path[0]][0]) if path else (None, None, None)
    size = min(max(4 * (l3_bytes or 0), _STREAM_MIN), _STREAM_MAX) // 256 * 256
    read = lib.vdla_mb_stream(size, 5)
    return Figures(
        clock_ghz=_round(clock[0]), tsc_ghz=_round(clock[1]),
        fma512_per_ns=_round(found.get(_FMA512, (None,))[0]),
        fma256_per_ns=_round(found.get(_FMA256, (None,))[0]),
        int8_path=int8[0], int8_bits=int8[1], int8_macs_per_ns=_round(int8[2]),
        read_gb_s=_round(read if read > 0 else None),
        seconds=round(time.perf_counter() - started, 2))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
