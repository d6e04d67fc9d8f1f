"""Speed of the Verilator backend: simulated cycles per second on a long GEMM-bound
program (default config, default DRAM model) for each of the model's build levels side
by side, the model's build time cold and cached, and the wall-clock ratio against the
functional simulator on the same program.

The builds (`LADDER`) are measured in one run, in interleaved rounds, so that the ratios
hold whatever the machine's speed that minute: the old build (the recipe before
the speed-up: g++ -O3, the WIDE GEMM core, the raw reset), then one change at a time: the reset
behind a register, the NATIVE GEMM core (its products, and the SRAMs they read, held by
the harness, and its bus inputs latched so that one evaluation settles a cycle),
link-time optimisation (what the test suite builds), profile-guided optimisation (the
default).

The backend simulates the NATIVE form of the GEMM core by default (`vdla.hw.gemm_forms.
GemmArithmetic`); the PACKED form that `vdla verilog` writes for boards (two products per
DSP) gives the same results in the same cycles, and its speed is printed too
(`--no-packed` skips it).

Target: at least 2,000,000 simulated cycles per second on a two-core machine with the
default build (anchors: Gemmini on Verilator 34-120 k cycles/s; Amaranth's
Python simulator ~10 k cycles/s).

    python bench/sim_speed.py [--size M N K] [--repeat R] [--no-cold] [--no-packed]
                              [--json FILE]

Each figure is the best of R rounds (default 5), timeit's convention: on a shared
virtual machine noise only ever adds time, and this machine has phases where everything
runs about 25% slower.

The cold build uses a fresh temporary cache (Verilog generation, Verilator, g++, and
the profile's training run); the cached figure is `build_model` in a new process finding
that build (the key's hashing and the entry's check, not Python's start-up).
"""

import os

# numpy's BLAS threads spin after the functional simulator's matrix products and would
# steal the second core from the Verilator model: one thread is the fair comparison.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import vdla  # noqa: E402
from vdla.runtime.kernels import BlockedGemm, blocked_gemm_reference  # noqa: E402
from vdla._fileio import atomic_write  # noqa: E402
from vdla._platform import cpu_name  # noqa: E402
from vdla.sim.verilator import build_model  # noqa: E402

TARGET = 2_000_000


def time_build(config, cold: bool):
    if not cold:
        return None, None
    folder = tempfile.mkdtemp(prefix="vdla-bench-cache-")
    try:
        start = time.perf_counter()
        first = build_model(config, cache=folder)
        cold_s = time.perf_counter() - start
        probe = ("import json, sys, time, vdla; from vdla.sim.verilator import build_model; "
                 "t = time.perf_counter(); b = build_model(vdla.HardwareConfig(), cache=sys.argv[1]); "
                 "print(json.dumps([b.built, time.perf_counter() - t]))")
        # -P: the current folder (perhaps a clone's root) stays off the child's path.
        out = subprocess.run([sys.executable, "-P", "-c", probe, folder], capture_output=True,
                             text=True, check=True).stdout
        built_again, cached_s = json.loads(out)
        assert first.built and not built_again
        return cold_s, cached_s
    finally:
        shutil.rmtree(folder, ignore_errors=True)


#: The builds measured, from the recipe before the simulator's speed-up (the old build) to today's
#: default, each step adding one change (`vdla.sim.verilator.build_model`'s options).
LADDER = (
    ("old: O3, wide GEMM, raw reset", dict(optimise="O3", gemm_arithmetic="wide",
                                           reset="raw")),
    ("+ registered reset", dict(optimise="O3", gemm_arithmetic="wide")),
    ("+ native GEMM", dict(optimise="O3")),
    ("+ link-time optimisation", dict(optimise="lto")),
    ("+ profile-guided (default)", dict(optimise="pgo")),
)


class GemmRun:
    """The GEMM program resident on one device, ready to run again and again."""

    def __init__(self, backend, config, a, b, **options):
        self.dev = vdla.runtime.open(config, backend=backend, dram_size=256 << 20, **options)
        self.gemm = BlockedGemm(self.dev, a, b, shift=8, virtual_threads=2)
        self.a, self.b = a, b
        self.best, self.stats = float("inf"), None

    def round(self):
        start = time.perf_counter()
        self.stats = self.gemm.run()
        self.best = min(self.best, time.perf_counter() - start)

    def close(self, label):
        try:
            if not np.array_equal(self.gemm.result(),
                                  blocked_gemm_reference(self.a, self.b, 8)):
                raise SystemExit(f"{label}: the GEMM's result differs from numpy")
        finally:
            self.gemm.free()
            self.dev.close()


def measure(runs: dict, repeat: int):
    """Best wall time of each run over `repeat` interleaved rounds."""
    for _ in range(repeat):
        for run in runs.values():
            run.round()
    for label, run in runs.items():
        run.close(label)


def machine() -> str:
    """The CPU, its cores and its widest vector ISA. The model is compiled for the
    baseline x86-64 (no -march), so the ISA is context, not a build input."""
    from vdla.compiler.targets.cpu import isa as cpu_isa
    from vdla.compiler.targets.cpu.build import machine_features
    features = machine_features()
    widest = next(name for name, isa in cpu_isa.ISAS.items() if isa.runs_on(features))
    return f"{cpu_name()}, {len(os.sched_getaffinity(0))} cores, {widest}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, nargs=3, default=(1024, 512, 512),
                        metavar=("M", "N", "K"), help="GEMM size (default 1024 512 512)")
    parser.add_argument("--repeat", type=int, default=5, help="best of R runs (default 5)")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold build")
    parser.add_argument("--no-packed", action="store_true",
                        help="skip the run of the packed (board) form of the GEMM core")
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write the figures there as JSON")
    args = parser.parse_args()
    config = vdla.HardwareConfig()
    m, n, k = args.size
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (n, k), dtype=np.int8)

    print(f"Verilator backend, config {config.name}, blocked GEMM {m}x{n}x{k} "
          f"(2 virtual threads), default DRAM model, best of {args.repeat} interleaved rounds")
    print(f"machine: {machine()}")
    cold_s, cached_s = time_build(config, cold=not args.no_cold)
    builds = {label: build_model(config, log=print, **recipe) for label, recipe in LADDER}
    libraries = {label: build.library for label, build in builds.items()}
    runs = {label: GemmRun("verilator", config, a, b, library=libraries[label])
            for label, _ in LADDER}
    if not args.no_packed:
        runs["packed"] = GemmRun("verilator", config, a, b, gemm_arithmetic="packed")
    runs["functional"] = GemmRun("functional", config, a, b)
    default = LADDER[-1][0]
    program = runs[default].gemm.program
    measure(runs, args.repeat)
    cycles = runs[default].stats["cycles"]
    for label, run in runs.items():
        if label != "functional" and run.stats["cycles"] != cycles:
            raise SystemExit(f"the {label} model took {run.stats['cycles']} cycles and the "
                             f"default model {cycles}: they must agree")

    def rate(label):
        return cycles / runs[label].best

    old = rate(LADDER[0][0])
    utilization = m * n * k / (cycles * config.macs_per_cycle)
    rows = [
        ("instructions", f"{len(program)}"),
        ("simulated cycles", f"{cycles:,}"),
        ("GEMM utilization", f"{utilization:.1%}"),
        ("cycles per second:", ""),
        *((f"  {label}", f"{rate(label):,.0f}   ({rate(label) / old:.2f}x the old build, "
           f"{runs[label].best:.3f} s)") for label, _ in LADDER),
        ("  packed GEMM core", "skipped" if args.no_packed else
         f"{rate('packed'):,.0f}   (the board netlist, default build; same cycles)"),
        ("functional run", f"{runs['functional'].best * 1e3:.1f} ms"),
        ("Verilator / functional", f"{runs[default].best / runs['functional'].best:.0f}x "
                                   "the wall time"),
        ("build, cold (default)", "skipped" if cold_s is None else f"{cold_s:.1f} s"),
        ("build, cached", "skipped" if cached_s is None else f"{cached_s:.2f} s"),
        ("model library", f"{libraries[default]}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    best = rate(default)
    print("PASS" if best >= TARGET else "BELOW TARGET",
          f"({best:,.0f} cycles/s with the default build vs {TARGET:,}; {best / old:.2f}x "
          "the old build)")
    if args.json:
        atomic_write(args.json, json.dumps({
            "machine": machine(), "config": config.name, "size": [m, n, k],
            "cycles": cycles, "repeat": args.repeat,
            "cycles_per_second": {label: rate(label) for label in runs
                                  if label != "functional"},
            "default": default, "old": LADDER[0][0],
            "functional_seconds": runs["functional"].best,
            "build_cold_seconds": cold_s, "build_cached_seconds": cached_s,
        }, indent=2).encode())


if __name__ == "__main__":
    main()
