"""The instruction sets the CPU target generates code for, chosen from what the C compiler
reports about the machine (`vdla.compiler.targets.cpu.build.machine_features`).

    isa = detect()                 # the best this machine's compiler offers
    isa = get("avx2")              # or a named one (tests, other machines' figures)

An `Isa` says which vector widths schedules may use, how many vector registers there
are (the register tile must fit), how int8 dot products are computed, and the compiler
flags that select it on top of ``-march=native`` (so a machine with AVX-512 can build
and check the AVX2 and portable code too). Every ISA computes the same bits: the int8
paths are exact by construction (`vdla_cpu.h`), and the tests run each one.
"""

from __future__ import annotations

import dataclasses

from vdla.compiler.targets.cpu.build import machine_features

__all__ = ["ISAS", "Isa", "detect", "get"]


@dataclasses.dataclass(frozen=True)
class Isa:
    """name : what users and records call it
    lanes : vector widths (32-bit lanes) its schedules may use, the best first
    registers : vector registers a register tile may fill
    int8 : how int8 dot products run (``vnni``: vpdpbusd; ``maddubs``: AVX2
        vpmaddubsw + vpmaddwd; ``portable``: C over the lanes)
    flags : compiler flags after ``-march=native`` that select it
    requires : `MachineFeatures` fields that must be true for it to run here
    """

    name: str
    lanes: tuple[int, ...]
    registers: int
    int8: str
    flags: tuple[str, ...]
    requires: tuple[str, ...]

    def runs_on(self, features) -> bool:
        return all(getattr(features, f) for f in self.requires)


ISAS = {
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
