"""The machine the CPU target runs on, as its kernels see it: a machine model, not an
instruction set's name. Read and measured once per machine, then read from a cache.

    model = machine_model()                   # measured the first time, then cached
    model.vector_bits, model.fma_ports(), model.has_amx
    print("\\n".join(model.lines()))
    costs = model.costs()                     # what the default schedules read of it

What a `MachineModel` holds, and where it comes from:

- the CPU's model name and vendor, the ISA extensions that matter to the kernels
  (`ISA_FLAGS`), and the cores and logical CPUs this process may run on
  (``/proc/cpuinfo`` and ``sched_getaffinity``);
- the L1 data, L2 and L3 caches: each one's size and how many logical CPUs share it
  (``/sys/devices/system/cpu/cpu0/cache/index*/``; a file missing is a cache unknown,
  never an error);
- where ``amx_tile`` is listed, palette 1's tile limits (CPUID leaves 0x1D/0x1E) and
  whether a tile runs here, from a small C program (`machine_bench.probe_amx`);
- `Figures` from a microbenchmark of one core (`machine_bench.measure`: float32 FMAs and
  int8 multiply-adds a nanosecond, the clock, the read bandwidth), from which the model
  derives the FMA ports (`fma_ports`: FMAs a cycle over a vector's lanes). The figures
  of a shared virtual machine vary from one measurement to the next.

The cache is ``<cache_root()>/machine/<key>.json`` (`vdla._buildcache.cache_root`: the
build cache's root), written atomically; the key hashes the CPU's model name and flags,
the logical CPUs, the C sources of the benchmark and the probe, and `FORMAT`. A file
that does not parse, was written under another key or describes another machine is
measured again, never trusted. ``use_cache=False`` (``vdla targets --no-cache``)
measures again and rewrites it. Two processes that want the model at once measure it
once: the second waits on a lock for the first's file.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from vdla._buildcache import cache_root
from vdla._fileio import atomic_write
from vdla.compiler.targets.cpu import isa as cpu_isa
from vdla.compiler.targets.cpu.cfiles import static_text
from vdla.compiler.targets.cpu.machine_bench import (BENCH_SOURCE, PROBE_SOURCE, Figures,
                                                    measure, probe_amx)

__all__ = ["FORMAT", "ISA_FLAGS", "NOMINAL", "Cache", "MachineCosts", "MachineModel",
           "cache_file", "machine_model", "parse_cpu_list", "parse_cpuinfo", "read_caches",
           "read_machine"]

#: The ISA extensions the model records (as ``/proc/cpuinfo`` spells them).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
             "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16")
#: Bump when what is measured or recorded changes in a way the C sources do not show.
FORMAT = 1
CPUINFO = Path("/proc/cpuinfo")
CACHES = Path("/sys/devices/system/cpu/cpu0/cache")


@dataclasses.dataclass(frozen=True)
class Cache:
    """One cache level of cpu0: `size` in bytes, `shared_cpus` the logical CPUs sharing
    it (its ``shared_cpu_list``)."""

    size: int
    shared_cpus: int


@dataclasses.dataclass(frozen=True)
class MachineModel:
    """This machine as the kernels see it (module docstring).

    model_name, vendor : ``/proc/cpuinfo``'s model name and vendor_id
    logical_cpus, cores : the logical CPUs this process may run on, and the physical
        cores they belong to
    threads_per_core : logical CPUs a core runs (siblings / cpu cores)
    l1d, l2, l3 : cpu0's caches, None when sysfs does not say
    flags : those of `ISA_FLAGS` the CPU has
    amx_max_rows, amx_bytes_per_row, amx_tiles : palette 1's tile limits (None without
        amx_tile)
    amx_usable : whether a tile ran here (the OS grants the tile state); None without
        amx_tile
    figures : the microbenchmark's, None when not measured
    """

    model_name: str
    vendor: str
    logical_cpus: int
    cores: int
    threads_per_core: int
    l1d: Cache | None
    l2: Cache | None
    l3: Cache | None
    flags: tuple[str, ...]
    amx_max_rows: int | None = None
    amx_bytes_per_row: int | None = None
    amx_tiles: int | None = None
    amx_usable: bool | None = None
    figures: Figures | None = None

    def has(self, flag: str) -> bool:
        """Whether the CPU has ISA extension `flag` (one of `ISA_FLAGS`)."""
        if flag not in ISA_FLAGS:
            raise ValueError(f"unknown ISA flag {flag!r}; the model records "
                             f"{', '.join(ISA_FLAGS)}")
        return flag in self.flags

    @property
    def vector_bits(self) -> int:
        """The widest vector the CPU computes on: 512 (AVX-512), 256 (AVX2) or 128."""
        return 512 if self.has("avx512f") else 256 if self.has("avx2") else 128

    @property
    def has_amx(self) -> bool:
        """Whether AMX int8 tiles run here: the flags, and a tile the probe ran."""
        return self.has("amx_tile") and self.has("amx_int8") and self.amx_usable is True

    def fma_per_ns(self, bits: int | None = None) -> float | None:
        """float32 FMAs a nanosecond on one core on `bits`-wide vectors (default: the
        widest measured), None when not measured."""
        f = self.figures
        if f is None:
            return None
        if bits is None:
            return f.fma512_per_ns if f.fma512_per_ns is not None else f.fma256_per_ns
        return {512: f.fma512_per_ns, 256: f.fma256_per_ns}.get(bits)

    def fma_bits(self) -> int | None:
        """The widest vector whose FMAs were measured."""
        f = self.figures
        if f is None:
            return None
        if f.fma512_per_ns is not None:
            return 512
        return 256 if f.fma256_per_ns is not None else None

    def fma_per_cycle(self, bits: int | None = None) -> float | None:
        """float32 FMAs a cycle on one core (`fma_per_ns` over the measured clock)."""
        per_ns = self.fma_per_ns(bits)
        if per_ns is None or not self.figures.clock_ghz:
            return None
        return per_ns / self.figures.clock_ghz

    def fma_ports(self, bits: int | None = None) -> int | None:
        """FMA ports at `bits` (default: the widest measured): FMAs a cycle over the
        float32 lanes of a vector, rounded (at least 1)."""
        bits = self.fma_bits() if bits is None else bits
        per_cycle = self.fma_per_cycle(bits)
        if per_cycle is None:
            return None
        return max(1, round(per_cycle / (bits // 32)))

    @property
    def gflops(self) -> float | None:
        """float32 GFLOP/s of one core (two a FMA) at the widest vector measured."""
        per_ns = self.fma_per_ns()
        return None if per_ns is None else 2 * per_ns

    @property
    def int8_gmacs(self) -> float | None:
        """int8 multiply-adds a nanosecond (GMAC/s) of one core."""
        return None if self.figures is None else self.figures.int8_macs_per_ns

    def vector_isa(self) -> str:
        """The instruction set of the CPU target (`isa.ISAS`' names) whose vector code
        the flags allow: ``avx512vnni``, ``avx2`` or ``portable`` (AMX tiles aside: their
        instruction set's vector code is ``avx512vnni``'s)."""
        if self.has("avx512f") and self.has("avx512_vnni"):
            return "avx512vnni"
        return "avx2" if self.has("avx2") and self.has("fma") else "portable"

    def costs(self) -> MachineCosts:
        """What the default schedules read of this machine (`MachineCosts`): FMA ports
        times lanes at 512 and 256 bits (a width not measured runs at the lanes a cycle
        of the widest measured: a 512-bit FMA as two 256-bit halves, as on AMD Zen 4),
        int8 multiply-adds a cycle, the L1d and L2 of one core, AMX. Without figures,
        `NOMINAL`'s rates, with the caches read."""
        l1d = _per_core(self.l1d, self.threads_per_core, NOMINAL.l1d)
        l2 = _per_core(self.l2, self.threads_per_core, NOMINAL.l2)
        lanes = {bits: ports * bits / 32 for bits in (512, 256)
                 if (ports := self.fma_ports(bits))}
        if self.fma_bits() not in lanes:            # not measured, or no clock
            return dataclasses.replace(NOMINAL, l1d=l1d, l2=l2, amx=self.has_amx,
                                       source=self.model_name)
        widest = lanes[self.fma_bits()]
        f = self.figures
        macs = f.int8_macs_per_ns / f.clock_ghz if f.int8_macs_per_ns is not None else None
        return MachineCosts(fma_lanes=tuple((b, lanes.get(b, widest)) for b in (512, 256)),
                            int8_macs=None if macs is None else round(macs, 2),
                            int8_path=f.int8_path if macs is not None else None,
                            l1d=l1d, l2=l2, amx=self.has_amx, source=self.model_name)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"flags": list(self.flags)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "MachineModel":
        """The model `to_dict` wrote; ValueError for anything else (a field missing or
        extra, or of the wrong type)."""
        fields = _fields(cls, data)
        for name in ("l1d", "l2", "l3"):
            if fields[name] is not None:
                fields[name] = Cache(**_fields(Cache, fields[name]))
        if fields["figures"] is not None:
            fields["figures"] = Figures(**_fields(Figures, fields["figures"]))
        flags = fields["flags"]
        if not isinstance(flags, list) or not set(flags) <= set(ISA_FLAGS):
            raise ValueError(f"flags must be a list of {ISA_FLAGS}, not {flags!r}")
        model = cls(**(fields | {"flags": tuple(flags)}))
        _check_types(model)
        return model

    def identity(self) -> "MachineModel":
        """What is read, not measured: the model without the probe's and the
        benchmark's figures."""
        return dataclasses.replace(self, amx_max_rows=None, amx_bytes_per_row=None,
                                   amx_tiles=None, amx_usable=None, figures=None)

    def lines(self) -> list[str]:
        """The model for people, a few lines (`vdla targets`)."""
        from_cpus = ("" if self.logical_cpus == self.cores
                     else f" ({self.logical_cpus} logical CPUs)")
        out = [f"{self.model_name} ({self.vendor}), {self.cores} "
               f"core{'s' if self.cores != 1 else ''}{from_cpus}",
               "caches: " + ", ".join(self._cache_text(name, getattr(self, name))
                                      for name in ("l1d", "l2", "l3")),
               "ISA: " + (" ".join(self.flags) or "none of " + " ".join(ISA_FLAGS)),
               self._amx_text()]
        return out + self._figure_lines()

    def _cache_text(self, name: str, cache: Cache | None) -> str:
        label = name.upper().replace("D", "d")
        if cache is None:
            return f"{label} unknown"
        where = ("per core" if cache.shared_cpus <= self.threads_per_core
                 else f"shared by {cache.shared_cpus} CPUs")
        return f"{label} {_size_text(cache.size)} {where}"

    def _amx_text(self) -> str:
        if not self.has("amx_tile"):
            return "AMX: none"
        if self.amx_tiles is None:
            return "AMX: listed, tile limits not read (the probe did not run)"
        kinds = "/".join(k for k in ("int8", "bf16") if self.has(f"amx_{k}"))
        runs = {True: "tiles run here", False: "the OS refuses the tile state",
                None: "not run"}[self.amx_usable]
        return (f"AMX {kinds}: {self.amx_tiles} tiles of {self.amx_max_rows} rows x "
                f"{self.amx_bytes_per_row} bytes ({runs})")

    def _figure_lines(self) -> list[str]:
        f = self.figures
        if f is None:
            return ["figures: not measured"]
        out = []
        bits = self.fma_bits()
        if bits is not None:
            ports, per_cycle = self.fma_ports(bits), self.fma_per_cycle(bits)
            shape = f"{ports} x {bits}-bit" if ports else f"{bits}-bit"
            cycle = (f", {per_cycle:.1f} FMAs/cycle at {f.clock_ghz:.2f} GHz"
                     if per_cycle else "")
            other = ""
            if bits == 512 and self.fma_ports(256):
                other = f"; at 256 bits {self.fma_ports(256)} x 256-bit"
            out.append(f"float32 FMA: {shape}{cycle}: {self.gflops:.1f} GFLOP/s per core"
                       + other)
        if f.int8_macs_per_ns is not None:
            out.append(f"int8: {f.int8_path} {f.int8_bits}-bit: "
                       f"{f.int8_macs_per_ns:.1f} GMAC/s per core")
        extra = []
        if f.read_gb_s is not None:
            extra.append(f"read {f.read_gb_s:.1f} GB/s from one core")
        if f.clock_ghz is not None:
            extra.append(f"clock {f.clock_ghz:.2f} GHz")
        if f.tsc_ghz is not None:
            extra.append(f"TSC {f.tsc_ghz:.2f} GHz")
        if extra:
            out.append(", ".join(extra))
        return out


#: The caches the choosers' byte thresholds were set on (one AMD EPYC core's): a threshold
#: of n bytes there is n x (this machine's cache / this one) elsewhere.
NOMINAL_L1D, NOMINAL_L2 = 32 << 10, 1 << 20
#: That core's float32 lane-FMAs a cycle by vector bits (AMD Zen 4: a 512-bit FMA as two
#: 256-bit halves, so the same at both widths).
NOMINAL_FMA_LANES = {512: 16.0, 256: 16.0}


@dataclasses.dataclass(frozen=True)
class MachineCosts:
    """What the CPU target's default schedules read of a machine (`MachineModel.costs`):
    one core's figures a cycle, the FMAs rounded to whole ports so that a shared host's
    noise never moves a default.

    fma_lanes : ((bits, float32 lane-FMAs a cycle), ...) for 512- and 256-bit vectors
    int8_macs : int8 multiply-adds a cycle on the widest int8 path measured (`int8_path`),
        None when not measured
    int8_path : that path's instructions (`machine_bench.Figures.int8_path`), or None
    l1d, l2 : bytes of L1 data and L2 cache one core has
    amx : whether AMX int8 tiles run
    source : where the figures come from: ``nominal``, or the CPU's name
    """

    fma_lanes: tuple[tuple[int, float], ...]
    int8_macs: float | None
    int8_path: str | None
    l1d: int
    l2: int
    amx: bool = False
    source: str = "nominal"

    def lanes_per_cycle(self, vl: int) -> float:
        """float32 lane-FMAs a cycle on vectors of `vl` 32-bit lanes."""
        return dict(self.fma_lanes)[vl * 32]

    def work_scale(self, vl: int) -> float:
        """What the convolution chooser's work term counts per vector multiply-add of
        `vl` lanes: the ``16 / vl`` its constants were fitted with on the `NOMINAL` host
        (a 256-bit vector two 512-bit ones' share), times how much slower this machine's
        FMAs are at that width than that host's (Sapphire Rapids' 512-bit: 0.5). Why not
        the cycles a vector takes at the ports' rate (0.5 for 8 lanes on two 256-bit
        ports): against the chooser's cache terms, fitted at 16 lanes, that picked plain
        AVX2 tiles that ran 1.04-1.08x slower than the old scale's on that host."""
        return 16 / vl * NOMINAL_FMA_LANES[vl * 32] / self.lanes_per_cycle(vl)

    def vector_lanes(self, widths) -> int:
        """Of the vector widths `widths` (lanes, an instruction set's), the one with the
        most lane-FMAs a cycle; the wider on a tie (fewer instructions for the same
        work: Zen 4's 512-bit FMA, two 256-bit halves, is level with two 256-bit ones)."""
        return max(widths, key=lambda vl: (self.lanes_per_cycle(vl), vl))

    def l1_bytes(self, nominal: int) -> int:
        """`nominal` bytes of a 32 KiB L1 data cache, scaled to this one's."""
        return nominal * self.l1d // NOMINAL_L1D

    def l2_bytes(self, nominal: int) -> int:
        """`nominal` bytes of a 1 MiB L2, scaled to this one's."""
        return nominal * self.l2 // NOMINAL_L2

    def key(self) -> dict:
        """The costs as JSON values (memo keys)."""
        return dataclasses.asdict(self) | {"fma_lanes": [list(p) for p in self.fma_lanes]}


#: The costs of a machine without figures: the AMD EPYC (Zen 4) host the choosers' constants
#: were tuned on, with AVX-512 (`NOMINAL_FMA_LANES`, 32 KiB of L1d and 1 MiB of L2 a
#: core), so that the defaults there are the constants' exactly.
NOMINAL = MachineCosts(fma_lanes=tuple(NOMINAL_FMA_LANES.items()), int8_macs=None,
                       int8_path=None, l1d=NOMINAL_L1D, l2=NOMINAL_L2)


def _per_core(cache: Cache | None, threads_per_core: int, nominal: int) -> int:
    """A cache's bytes one core has (`nominal` when unknown)."""
    if cache is None:
        return nominal
    return cache.size // max(1, cache.shared_cpus // max(1, threads_per_core))


def _fields(cls, data) -> dict:
    if not isinstance(data, Mapping):
        raise ValueError(f"{cls.__name__}: expected an object, not {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    if set(data) != names:
        raise ValueError(f"{cls.__name__}: fields {sorted(data)}, expected {sorted(names)}")
    return dict(data)


def _check_types(model: MachineModel) -> None:
    """ValueError unless every field holds a value of its type (a JSON file may say
    anything)."""
    def check(obj, name, kinds, optional):
        value = getattr(obj, name)
        if value is None and optional:
            return
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise ValueError(f"{type(obj).__name__}.{name} = {value!r}")

    for name in ("model_name", "vendor"):
        check(model, name, (str,), False)
    for name in ("logical_cpus", "cores", "threads_per_core"):
        check(model, name, (int,), False)
    for name in ("amx_max_rows", "amx_bytes_per_row", "amx_tiles"):
        check(model, name, (int,), True)
    check(model, "amx_usable", (bool,), True)
    for cache in (model.l1d, model.l2, model.l3):
        if cache is not None:
            check(cache, "size", (int,), False)
            check(cache, "shared_cpus", (int,), False)
    f = model.figures
    if f is not None:
        for name in ("clock_ghz", "tsc_ghz", "fma512_per_ns", "fma256_per_ns",
                     "int8_macs_per_ns", "read_gb_s"):
            check(f, name, (int, float), True)
        check(f, "int8_path", (str,), True)
        check(f, "int8_bits", (int,), True)
        check(f, "seconds", (int, float), False)


def _size_text(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


# --- reading the machine ------------------------------------------------------------------

def parse_cpu_list(text: str) -> set[int]:
    """The CPUs of a Linux CPU list (``0-3,8,10-11``)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def parse_cpuinfo(text: str, cpus: set[int] | None = None) -> dict:
    """From ``/proc/cpuinfo``'s `text`, for the logical CPUs `cpus` (default: all it
    lists): model_name, vendor, flags (every flag, a set), logical_cpus, cores (distinct
    physical id and core id pairs; the logical CPUs when it lists none) and
    threads_per_core."""
    blocks = []
    for chunk in text.split("\n\n"):
        fields = {}
        for line in chunk.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if "processor" in fields:
            blocks.append(fields)
    if cpus is not None:
        blocks = [b for b in blocks if b["processor"].isdigit()
                  and int(b["processor"]) in cpus] or blocks
    first = blocks[0] if blocks else {}
    pairs = {(b.get("physical id"), b.get("core id")) for b in blocks}
    cores = len(pairs) if blocks and all("core id" in b for b in blocks) else len(blocks)
    try:
        per_core = max(1, int(first["siblings"]) // int(first["cpu cores"]))
    except (KeyError, ValueError, ZeroDivisionError):
        per_core = 1
    return {"model_name": " ".join(first.get("model name", "unknown CPU").split()),
            "vendor": first.get("vendor_id", "unknown"),
            "flags": set(first.get("flags", "").split()),
            "logical_cpus": max(1, len(blocks) if cpus is None else len(cpus)),
            "cores": max(1, cores), "threads_per_core": per_core}


def _size_bytes(text: str) -> int:
    text = text.strip()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text.rstrip("KkMmGg")) * scale


def read_caches(folder: Path = CACHES) -> dict[str, Cache | None]:
    """cpu0's L1 data, L2 and L3 caches from sysfs's `folder` (``index*/level``,
    ``type``, ``size``, ``shared_cpu_list``): {"l1d", "l2", "l3"} -> `Cache`, None for
    one it does not describe (or describes in files that are missing or unreadable)."""
    found: dict[str, Cache | None] = {"l1d": None, "l2": None, "l3": None}
    for index in sorted(Path(folder).glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _size_bytes((index / "size").read_text())
            shared = len(parse_cpu_list((index / "shared_cpu_list").read_text()))
        except (OSError, ValueError):
            continue
        name = {1: "l1d", 2: "l2", 3: "l3"}.get(level)
        if name is None or (level == 1 and kind != "Data") or kind == "Instruction":
            continue
        found[name] = Cache(size, max(1, shared))
    return found


def _affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        return None


def read_machine(cpuinfo: Path = CPUINFO, caches: Path = CACHES,
                 cpus: set[int] | None = None) -> MachineModel:
    """What is read, not measured (`MachineModel.identity`): the CPU from `cpuinfo`, for
    the logical CPUs `cpus` (default: those this process may run on), and the caches
    from `caches`."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        text = ""
    info = parse_cpuinfo(text, _affinity() if cpus is None else cpus)
    return MachineModel(
        model_name=info["model_name"], vendor=info["vendor"],
        logical_cpus=info["logical_cpus"], cores=info["cores"],
        threads_per_core=info["threads_per_core"], **read_caches(caches),
        flags=tuple(f for f in ISA_FLAGS if f in info["flags"]))


# --- the cache ------------------------------------------------------------------------------

def _key(model: MachineModel) -> str:
    """What the cached figures depend on: the CPU, its logical CPUs, the C that measures
    and `FORMAT` (the figures of another CPU, or of older code, are never read)."""
    try:
        all_flags = sorted(parse_cpuinfo(CPUINFO.read_text())["flags"])
    except OSError:
        all_flags = list(model.flags)
    text = json.dumps({"format": FORMAT, "model": model.model_name, "vendor": model.vendor,
                       "flags": all_flags, "logical_cpus": model.logical_cpus,
                       "bench": static_text(BENCH_SOURCE), "probe": static_text(PROBE_SOURCE),
                       "isa": cpu_isa.detect().name}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cache_file(model: MachineModel | None = None,
               cache: str | os.PathLike | None = None) -> Path:
    """The file that holds a machine's model.

    model : the machine (its `identity` counts; default: this machine's, as read)
    cache : the cache root (default `cache_root()`)
    """
    model = read_machine() if model is None else model
    root = cache_root() if cache is None else Path(cache).expanduser()
    return root / "machine" / f"{_key(model.identity())}.json"


def _read_cached(path: Path, key: str, identity: MachineModel) -> MachineModel | None:
    """The model in `path` when it is whole, was written under `key` and describes the
    machine `identity` says; None otherwise."""
    try:
        record = json.loads(path.read_text())
        if record.get("format") != FORMAT or record.get("key") != key:
            return None
        model = MachineModel.from_dict(record["model"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return model if model.identity() == identity else None


def machine_model(*, cache: str | os.PathLike | None = None, use_cache: bool = True,
                  log: Callable[[str], None] | None = None) -> MachineModel:
    """This machine's model: from the cache, or read, probed and measured (then cached).

    cache : the cache root (default `cache_root()`: ``$VDLA_CACHE`` or ``~/.cache/vdla``)
    use_cache : False measures again even when a cached model exists, and rewrites it
    log : receives a line when it measures, and why (default: nothing)
    """
    log = log or (lambda message: None)
    identity = read_machine()
    path = cache_file(identity, cache)
    key = path.stem
    if use_cache and (found := _read_cached(path, key, identity)) is not None:
        return found
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)    # released when the file closes (or we die)
        if use_cache and (found := _read_cached(path, key, identity)) is not None:
            return found                    # measured by the process we waited for
        if use_cache and path.exists():
            log(f"the machine model in {path} is damaged or another machine's; measuring "
                "again")
        log(f"measuring this machine's cores (once; about a second), cached in {path}")
        amx = probe_amx(log) if identity.has("amx_tile") else {}
        figures = measure(identity.l3.size if identity.l3 is not None else None, log)
        model = dataclasses.replace(identity, **amx, figures=figures)
        record = {"format": FORMAT, "key": key, "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "model": model.to_dict()}
        atomic_write(path, (json.dumps(record, indent=2) + "\n").encode())
    return model
