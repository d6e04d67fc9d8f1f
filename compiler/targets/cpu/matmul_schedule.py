"""Schedules of the CPU target's batched matrix products (``matmul``, ``qmatmul``:
`vdla.compiler.targets.cpu.matmul`): the shape a schedule's cost depends on, the knobs,
their checks, the default and the space the tuner searches.

A product computes each output batch's (M, K) @ (K, N) with a register tile of ``mr``
rows of A by ``nv`` vectors of ``vl`` columns of B (``mr * nv`` accumulators), the
columns of a row block in groups of ``nv`` vectors and then single vectors. Its
`MatmulSchedule`:

    vl        lanes per vector: one of the instruction set's widths
    mr        rows of A in the register tile (1 to `MAX_ROWS`)
    nv        vectors of B's columns in the register tile (1 to `MAX_VECTORS`); the tile
              must fit the vector registers with its nv B vectors (`tile_fits`)
    unroll    unroll of the reduction loop (1: as gcc decides)
    parallel  "all": OpenMP shares (batch, row block) pairs when the product has
              `PARALLEL_MACS` multiply-adds or more and more than one pair; "none":
              one thread
    wide      int8 on AVX2 only: 1 widens both operands to int16 pairs (``vpmaddwd``),
              0 keeps ``x + 128`` split in nibbles (`matmul`'s docstring has both)

The default (`choose_matmul`) is the tile the kernels had before they had knobs: 6 x 2
vectors with 32 registers, 4 x 2 with 16, no unroll, the team for large products, and
on AVX2 int16 pairs from `WIDE_ROWS` rows of A on (the measured rule). So a model
compiled without records runs the C it always did.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.machine import NOMINAL, MachineCosts
from vdla.compiler.targets.cpu.schedule import (UNROLLS, ScheduleError, SpaceBlock, check_int,
                                                knobs_from_dict, tile_fits)

__all__ = ["MATMUL_PARALLEL", "MAX_ROWS", "MAX_VECTORS", "MatmulSchedule", "MatmulShape",
           "PARALLEL_MACS", "STEP_OPS", "WIDE_ROWS", "choose_matmul", "estimate_matmul", "matmul_blocks",
           "matmul_terms", "parallel_team"]

#: The register tile's most rows and B vectors.
MAX_ROWS = 8
MAX_VECTORS = 4
#: Below this many multiply-adds a product runs on one thread whatever its schedule
#: says: starting the team costs more than the second core saves.
PARALLEL_MACS = 1 << 16
MATMUL_PARALLEL = ("all", "none")
#: Rows of A from which the default int8 product on AVX2 widens to int16 pairs: with
#: fewer, packing B twice as wide costs more than the pairs save (`matmul`).
WIDE_ROWS = 4


@dataclasses.dataclass(frozen=True)
class MatmulShape:
    """What a product's schedules cost depends on (the tuner's workload key).

    batches : output batches (products); m, k, n : each is (m, k) @ (k, n)
    dtype : ``int8`` (``qmatmul``) or ``float32``
    transpose_b : int8 B given as (n, k) rows (``qmatmul``'s ``transpose_b``)
    a_matrices, b_matrices : distinct A and B matrices among the batches (a broadcast
        operand repeats; int8 packs each distinct B once per run)
    """

    batches: int
    m: int
    k: int
    n: int
    dtype: str = "int8"
    transpose_b: bool = False
    a_matrices: int = 1
    b_matrices: int = 1

    @classmethod
    def from_node(cls, node: Node, graph: Graph) -> "MatmulShape":
        """The shape of a ``matmul`` / ``qmatmul`` node (operands of rank 2 or more)."""
        a = graph.tensors[node.inputs[0]].shape
        b = graph.tensors[node.inputs[1]].shape
        out = graph.tensors[node.outputs[0]].shape
        int8 = node.op == "qmatmul"
        trans = int8 and bool(node.attrs.get("transpose_b", False))
        return cls(batches=int(np.prod(out[:-2], dtype=np.int64)), m=a[-2], k=a[-1],
                   n=b[-2] if trans else b[-1], dtype="int8" if int8 else "float32",
                   transpose_b=trans, a_matrices=int(np.prod(a[:-2], dtype=np.int64)),
                   b_matrices=int(np.prod(b[:-2], dtype=np.int64)))

    @property
    def int8(self) -> bool:
        return self.dtype == "int8"

    @property
    def macs(self) -> int:
        return self.batches * self.m * self.k * self.n

    def steps(self, wide: bool) -> int:
        """Reduction steps a register tile takes: k in float32; int8 32-bit words of A,
        ``ceil(k / 2)`` int16 pairs (`wide`) or ``ceil(k / 4)`` bytes of four."""
        if not self.int8:
            return self.k
        return -(-self.k // (2 if wide else 4))

    def describe(self) -> str:
        return (f"{self.batches} x {self.m}x{self.k} @ {self.k}x{self.n}"
                + (" (b^T)" if self.transpose_b else ""))


@dataclasses.dataclass(frozen=True)
class MatmulSchedule:
    """See the module docstring."""

    vl: int
    mr: int
    nv: int
    unroll: int = 1
    parallel: str = "all"
    wide: int = 0

    def check(self, shape: MatmulShape, isa: Isa) -> "MatmulSchedule":
        """This schedule when it fits `shape` on `isa`; else `ScheduleError` naming the
        knob."""
        if self.vl not in isa.lanes:
            raise ScheduleError(f"schedule knob vl={self.vl!r} is not a vector width of "
                                f"the {isa.name} code: allowed {list(isa.lanes)}")
        check_int("mr", self.mr, 1, MAX_ROWS)
        check_int("nv", self.nv, 1, MAX_VECTORS)
        if not tile_fits(self.mr, self.nv, isa):
            raise ScheduleError(f"schedule knobs mr={self.mr}, nv={self.nv}: the register "
                                f"tile and its B vectors do not fit {isa.name}'s "
                                f"{isa.registers} vector registers")
        if self.unroll not in UNROLLS:
            raise ScheduleError(f"schedule knob unroll={self.unroll!r}: allowed "
                                f"{list(UNROLLS)}")
        if self.parallel not in MATMUL_PARALLEL:
            raise ScheduleError(f"schedule knob parallel={self.parallel!r}: allowed "
                                f"{list(MATMUL_PARALLEL)}")
        check_int("wide", self.wide, 0, 1)
        if self.wide and not (shape.int8 and isa.int8 == "maddubs"):
            raise ScheduleError(f"schedule knob wide=1 is AVX2's int8 path; this is "
                                f"{shape.dtype} on {isa.name}")
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "MatmulSchedule":
        return knobs_from_dict(cls, data, "matmul")


def choose_matmul(shape: MatmulShape, isa: Isa, costs: MachineCosts = NOMINAL
                  ) -> MatmulSchedule:
    """The default: the kernels' tile before they had knobs (module docstring), on
    vectors of the width the machine `costs` describes runs fastest
    (`MachineCosts.vector_lanes`: the widest on every machine measured)."""
    mr = 6 if isa.registers >= 32 else 4
    wide = int(shape.int8 and isa.int8 == "maddubs" and shape.m >= WIDE_ROWS)
    return MatmulSchedule(costs.vector_lanes(isa.lanes), mr, 2, 1, "all", wide)


def matmul_blocks(shape: MatmulShape, isa: Isa) -> list[SpaceBlock]:
    """The space as products (`vdla.compiler.tuner.space.ProductSpace`): each register
    tile that fits, crossed with the unrolls, the split and (int8 on AVX2) the path.
    Rows past m and vectors past n's only repeat a smaller tile, and below
    `PARALLEL_MACS` both splits are one thread, so those are left out, save the
    default's."""
    default = choose_matmul(shape, isa)
    wides = (0, 1) if shape.int8 and isa.int8 == "maddubs" else (0,)
    splits = MATMUL_PARALLEL if shape.macs >= PARALLEL_MACS else (default.parallel,)
    blocks = []
    for vl in isa.lanes:
        rows = sorted({r for r in range(1, MAX_ROWS + 1) if r <= shape.m} | {default.mr})
        vectors = sorted({v for v in range(1, MAX_VECTORS + 1) if v <= -(-shape.n // vl)}
                         | {default.nv})
        for mr in rows:
            for nv in vectors:
                if tile_fits(mr, nv, isa):
                    blocks.append(({"vl": vl, "mr": mr, "nv": nv},
                                   (("unroll", UNROLLS), ("parallel", splits),
                                    ("wide", wides))))
    return blocks


#: Vector instructions per reduction step of one accumulator vector, by how the step
#: runs (`vdla_cpu.h`): float32 one FMA; int8 words of four products, AVX-512 VNNI one
#: ``vpdpbusd``, the portable C about four, and on AVX2 ("maddubs", an input that may
#: be negative as ``x + 128`` split in nibbles) ten, three for a non-negative input
#: ("dot4": ``vpmaddubsw``, ``vpmaddwd``, the add), five with the sign moved onto the
#: weights ("sign", the dense layers'); AVX2's int16 pairs ("wide") two (``vpmaddwd``
#: and the add) per word of two products. The dense layers' features use it too. "amx"
#: (tiles: `vdla.compiler.targets.cpu.amx`) counts as "vnni": the tile kernels' speed is
#: not measured, and of the knobs they read only the team's.
STEP_OPS = {"float32": 1.0, "vnni": 1.0, "portable": 4.0, "maddubs": 10.0, "dot4": 3.0,
            "sign": 5.0, "wide": 2.0, "amx": 1.0}


def matmul_terms(shape: MatmulShape, s: MatmulSchedule, isa: Isa,
                 threads: int) -> dict[str, float]:
    """The terms of `estimate_matmul` for `s` on `isa` with a team of `threads`, in
    vector instructions of one thread: ``work`` (multiply-adds, partial vectors counted
    whole), ``loads`` (B's vectors, loaded once a step per row block), ``broadcasts``
    (A's values, once a step per row and column group), ``packing`` (int8: each distinct
    B packed every run, and A widened with `wide`); and ``team`` (the threads sharing
    the work items: 1 when serial) and ``idle`` (the share of their turns left idle)."""
    steps = shape.steps(bool(s.wide))
    vectors = -(-shape.n // s.vl)
    blocks = -(-shape.m // s.mr)
    whole = shape.n // (s.nv * s.vl)
    groups = whole + -(-(shape.n - whole * s.nv * s.vl) // s.vl)
    kind = "float32" if not shape.int8 else "wide" if s.wide else isa.int8
    packing = 0.0
    if shape.int8:
        packing = shape.b_matrices * vectors * steps * (2.0 if s.wide else 1.0)
        if s.wide:
            packing += shape.a_matrices * shape.m * steps / s.vl
    items = shape.batches * blocks
    team = min(threads, items) if parallel_team(shape, s) else 1
    return {"work": float(shape.batches * shape.m * vectors * steps) * STEP_OPS[kind],
            "loads": float(shape.batches * blocks * vectors * steps),
            "broadcasts": float(shape.batches * shape.m * groups * steps),
            "packing": packing, "team": float(team),
            "idle": math.ceil(items / team) * team / items - 1.0}


def parallel_team(shape: MatmulShape, s: MatmulSchedule) -> bool:
    """Whether the kernel starts the team: "all", `PARALLEL_MACS` or more multiply-adds
    and more than one work item ((batch, row block) pairs)."""
    return (s.parallel == "all" and shape.macs >= PARALLEL_MACS
            and shape.batches * -(-shape.m // s.mr) > 1)


def estimate_matmul(shape: MatmulShape, s: MatmulSchedule, isa: Isa, threads: int) -> float:
    """The default's cost model, about cycles at two vector instructions a cycle: the
    terms of `matmul_terms` summed, over the team (its idle turns included)."""
    t = matmul_terms(shape, s, isa, threads)
    busy = t["work"] + t["loads"] + t["broadcasts"] + t["packing"]
    return busy / 2.0 / t["team"] * (1.0 + t["idle"])
