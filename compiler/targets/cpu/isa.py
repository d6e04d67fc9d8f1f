"""The instruction sets the CPU target generates code for, chosen from what the C compiler
reports about the machine (`vdla.compiler.targets.cpu.build.machine_features`).

    isa = detect()                 # the best this machine's compiler offers
    isa = get("avx2")              # or a named one (tests, other machines' figures)

An `Isa` says which vector widths schedules may use, how many vector registers there
are (the register tile must fit), how int8 dot products are computed, and the compiler
flags that select it on top of ``-march=native`` (so a machine with AVX-512 can build
and check the AVX2 and portable code too). Every ISA computes the same bits: the int8
paths are exact by construction (`vdla_cpu.h`), and the tests run each one.

``amx`` is AVX-512 VNNI plus Intel's AMX tiles: its int8 matrix products and dense
layers run on tiles (`vdla.compiler.targets.cpu.amx`), every other op runs the AVX-512
VNNI code (`Isa.vector_int8`; every CPU with AMX has VNNI). It runs where the compiler
reports the tiles for ``-march=native`` *and* Linux grants this process the tile state
(`tiles_granted`): a kernel's first tile instruction faults without it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import platform
import sys

from vdla.compiler.targets.cpu.build import machine_features

__all__ = ["ISAS", "Isa", "detect", "get", "tiles_granted"]

#: arch_prctl's number on x86-64 Linux, its request for a permission, and the tile data
#: state's feature number (Linux's uapi asm/prctl.h and the XSAVE feature numbers).
_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


@dataclasses.dataclass(frozen=True)
class Isa:
    """name : what users and records call it
    lanes : vector widths (32-bit lanes) its schedules may use, the best first
    registers : vector registers a register tile may fill
    int8 : how int8 dot products run (``vnni``: vpdpbusd; ``maddubs``: AVX2
        vpmaddubsw + vpmaddwd; ``portable``: C over the lanes; ``amx``: the int8 GEMMs
        on AMX tiles, tdpbssd, the rest as ``vnni``)
    flags : compiler flags after ``-march=native`` that select it
    requires : `MachineFeatures` fields that must be true for it to run here
    """

    name: str
    lanes: tuple[int, ...]
    registers: int
    int8: str
    flags: tuple[str, ...]
    requires: tuple[str, ...]

    @property
    def tiles(self) -> bool:
        """Whether its int8 GEMMs run on AMX tiles."""
        return self.int8 == "amx"

    @property
    def vector_int8(self) -> str:
        """How its vector code (every kernel without tiles) runs int8 dot products: `int8`,
        but ``vnni`` for ``amx``."""
        return "vnni" if self.tiles else self.int8

    def refusal(self, features) -> str | None:
        """Why it does not run on the machine `features` describes (None: it does). For
        tiles, also whether this process is granted the tile state (`tiles_granted`)."""
        missing = [f for f in self.requires if not getattr(features, f)]
        if self.tiles and not (features.amx_tile and features.amx_int8):
            return ("this machine has no AMX: its C compiler's -march=native (the CPU's "
                    "flags) lists no amx_tile and amx_int8")
        if missing:
            return (f"this machine's C compiler does not offer {self.name} (it needs "
                    f"{', '.join(self.requires)}; it lacks {', '.join(missing)})")
        if self.tiles and not tiles_granted():
            return ("the OS refused the tile state: arch_prctl(ARCH_REQ_XCOMP_PERM, "
                    "XFEATURE_XTILEDATA) failed, so a tile instruction would fault (Linux "
                    "5.16 or later grants it)")
        return None

    def runs_on(self, features) -> bool:
        return self.refusal(features) is None


ISAS = {
    # AMX tiles beside AVX-512 VNNI (its vector code is avx512vnni's, flags included);
    # -mamx-*: what -march=native adds on a CPU with tiles, explicit so that a machine
    # without them still compiles the tile kernels (the tests' build check).
    "amx": Isa("amx", (16, 8), 32, "amx",
               ("-mtune=generic", "-mamx-tile", "-mamx-int8", "-mamx-bf16"),
               ("avx512f", "avx512vnni", "amx_tile", "amx_int8")),
    # -mtune=generic: on an AMD Zen 4 host gcc 12 takes -march=native's tuning to be
    # znver3, a CPU without AVX-512, and its register allocator then spilled one of a
    # two-vector tile's weight vectors to the stack and read it back per multiply-add
    # (zmm18-30 unused). Measured against the native tuning, whole models at 2 threads:
    # level to 1.05x faster (ResNet-18 int8 1.05x, MobileNet-v1 1.02x, the rest +-0.6%).
    "avx512vnni": Isa("avx512vnni", (16, 8), 32, "vnni", ("-mtune=generic",),
                      ("avx512f", "avx512vnni")),
    "avx2": Isa("avx2", (8,), 16, "maddubs", ("-mno-avx512f",), ("avx2", "fma")),
    # No intrinsics at all: the vector extensions as the compiler lowers them.
    "portable": Isa("portable", (8,), 16, "portable", ("-DVDLA_PORTABLE",), ()),
}


@functools.lru_cache(maxsize=None)
def tiles_granted() -> bool:
    """Whether Linux grants this process the AMX tile data state, asked once per process
    (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``): the permission is the
    process's, and the kernels run in it. Asking is what the generated libraries do too
    (``c/runtime.c``); a CPU or kernel without AMX refuses. False off x86-64 Linux.
    (The machine model's ``amx_usable`` is the same question put to a separate probe
    program, which also runs a tile.)"""
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(_ARCH_REQ_XCOMP_PERM),
                        ctypes.c_long(_XFEATURE_XTILEDATA)) == 0


def get(name: str) -> Isa:
    try:
        return ISAS[name]
    except KeyError:
        raise ValueError(f"unknown CPU instruction set {name!r}; available: "
                         f"{', '.join(ISAS)}") from None


def detect(features=None) -> Isa:
    """The best ISA whose requirements `features` (default: this machine's) meet."""
    if features is None:
        features = machine_features()
    for isa in ISAS.values():
        if isa.runs_on(features):
            return isa
    return ISAS["portable"]
