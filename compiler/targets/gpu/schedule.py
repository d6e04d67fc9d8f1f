"""Schedules of the GPU target's GEMM kernels (convolutions and dense layers): tile sizes,
warps, pipeline stages and split-K, their checks, the default chooser and the tuner's
space. No Triton here: schedules are chosen, checked and recorded without it.

A `GemmShape` is what a schedule depends on: the implicit GEMM's M (output pixels), N
(output channels per group) and K (input channels per group x kernel taps), the groups,
and the dtype the dot runs on (``int8``, ``float32``, ``float16``). A batched matmul
(matmul, qmatmul) is `groups` GEMMs of M x N x K, one per batch index, without split-K.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

__all__ = ["DOT_DTYPES", "GemmSchedule", "GemmShape", "MATMUL_OPS", "ScheduleError", "choose",
           "gemm_shape", "next_pow2", "space"]

#: The batched matmuls (both operands may be computed), scheduled like the GEMMs.
MATMUL_OPS = ("matmul", "qmatmul")
#: What a GEMM's dot runs on.
DOT_DTYPES = ("int8", "float32", "float16")
#: tl.dot needs every tile side >= 16; int8 dots take K in steps of 32 on tensor cores.
_MIN_BLOCK = 16
_MIN_BLOCK_K = {"int8": 32, "float32": 16, "float16": 16}
_MAX_BLOCK = 256
_WARPS = (1, 2, 4, 8, 16)
_MAX_STAGES = 6
_MAX_SPLIT = 64
#: Output tiles that keep a GPU busy: an H100 has 132 SMs, an A100 108. Below about
#: this many tiles the chooser splits K (one wave of tiles per SM at least).
_BUSY_TILES = 128


class ScheduleError(ValueError):
    """A schedule that does not fit its GEMM: the message names the field, its value and
    what is allowed."""


@dataclasses.dataclass(frozen=True)
class GemmShape:
    """m, n, k : the GEMM's sizes (per group); groups : how many such GEMMs;
    dtype : what the dot runs on (`DOT_DTYPES`)."""

    m: int
    n: int
    k: int
    groups: int = 1
    dtype: str = "int8"

    def describe(self) -> str:
        g = f" x {self.groups} groups" if self.groups > 1 else ""
        return f"{self.dtype} GEMM {self.m}x{self.n}x{self.k}{g}"


@dataclasses.dataclass(frozen=True)
class GemmSchedule:
    """One way to run a GEMM.

    block_m, block_n, block_k : the tile (output pixels x output channels) and the K step,
        powers of two in [16, 256] (block_k at least 32 for int8)
    num_warps : warps per program (1-16, a power of two)
    num_stages : software-pipeline stages of the K loop (1-6)
    split_k : K slices summed by a second kernel (1: none), for GEMMs with too few output
        tiles to fill the GPU
    """

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "GemmSchedule":
        """A schedule from `to_dict`'s form; TypeError for anything else."""
        fields = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(d, dict) or not {"block_m", "block_n", "block_k"} <= set(d) \
                or not set(d) <= fields:
            raise TypeError(f"a GPU GEMM schedule is a dict with keys {sorted(fields)} "
                            f"(block_m, block_n, block_k required), not {d!r}")
        return cls(**d)

    def check(self, shape: GemmShape) -> None:
        """ScheduleError when this schedule cannot run `shape`."""
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            low = _MIN_BLOCK_K[shape.dtype] if name == "block_k" else _MIN_BLOCK
            if not _pow2(value) or not low <= value <= _MAX_BLOCK:
                raise ScheduleError(f"{name} {value!r}: a power of two in [{low}, "
                                    f"{_MAX_BLOCK}] for a {shape.dtype} GEMM")
        if self.num_warps not in _WARPS:
            raise ScheduleError(f"num_warps {self.num_warps!r}: one of {_WARPS}")
        if _bad_int(self.num_stages) or not 1 <= self.num_stages <= _MAX_STAGES:
            raise ScheduleError(f"num_stages {self.num_stages!r}: an integer in [1, "
                                f"{_MAX_STAGES}]")
        steps = math.ceil(shape.k / self.block_k)
        if _bad_int(self.split_k) or not 1 <= self.split_k <= min(_MAX_SPLIT, steps):
            raise ScheduleError(f"split_k {self.split_k!r}: an integer in [1, "
                                f"{min(_MAX_SPLIT, steps)}] (K = {shape.k} is {steps} "
                                f"steps of block_k {self.block_k})")
        # Tiles far beyond the GEMM only waste programs' lanes; refuse the silly ones.
        if self.block_m > max(_MIN_BLOCK, next_pow2(shape.m)) * 2 \
                or self.block_n > max(_MIN_BLOCK, next_pow2(shape.n)) * 2:
            raise ScheduleError(f"tile {self.block_m}x{self.block_n} is more than twice the "
                                f"GEMM's {shape.m}x{shape.n} (rounded up to a power of two)")

    def k_split(self, shape: GemmShape) -> int:
        """K elements per slice: a multiple of block_k."""
        steps = math.ceil(shape.k / self.block_k)
        return math.ceil(steps / self.split_k) * self.block_k

    def splits(self, shape: GemmShape) -> int:
        """Slices that hold any K (the last ones may be empty once rounded)."""
        return math.ceil(shape.k / self.k_split(shape))


def _pow2(v) -> bool:
    return not _bad_int(v) and v > 0 and v & (v - 1) == 0


def _bad_int(v) -> bool:
    return isinstance(v, bool) or not isinstance(v, int)


def next_pow2(v: int) -> int:
    """The smallest power of two at least `v` (1 for v <= 1)."""
    return 1 << max(0, (int(v) - 1).bit_length())


def gemm_shape(node, graph, dtype: str) -> GemmShape:
    """The implicit GEMM of a conv2d/qconv2d or dense/qdense `node` of `graph`, or the
    batched GEMMs of a matmul/qmatmul, its dot on `dtype`."""
    if dtype not in DOT_DTYPES:
        raise ValueError(f"dtype must be one of {DOT_DTYPES}, not {dtype!r}")
    x = graph.tensors[node.inputs[0]].shape
    w = graph.tensors[node.inputs[1]].shape
    out = graph.tensors[node.outputs[0]].shape
    if node.op in MATMUL_OPS:
        # one GEMM per batch index (`groups`: the broadcast batch axes' size)
        return GemmShape(out[-2], out[-1], x[-1], math.prod(out[:-2]), dtype)
    if node.op.endswith("dense"):
        return GemmShape(x[0], w[0], w[1], 1, dtype)
    groups = int(node.attrs["groups"])
    return GemmShape(out[0] * out[2] * out[3], w[0] // groups, w[1] * w[2] * w[3], groups,
                     dtype)


def choose(shape: GemmShape, *, split_k: bool = True) -> GemmSchedule:
    """The default schedule: tiles as large as the GEMM allows up to 128x128, K steps of
    64 (int8, float16) or 32 (float32), 8 warps for 128x128 tiles, 3 stages, and K split
    until the GEMM has about `_BUSY_TILES` tiles (the late ResNet layers and dense layers
    at batch 1 have a handful)."""
    bm = min(128, max(_MIN_BLOCK, next_pow2(shape.m)))
    bn = min(128, max(_MIN_BLOCK, next_pow2(shape.n)))
    bk_max = 32 if shape.dtype == "float32" else 64
    bk = max(_MIN_BLOCK_K[shape.dtype], min(bk_max, next_pow2(shape.k)))
    warps = 8 if bm * bn >= 128 * 128 else 4
    tiles = math.ceil(shape.m / bm) * math.ceil(shape.n / bn) * shape.groups
    steps = math.ceil(shape.k / bk)
    split = 1
    # Each slice keeps at least 4 K steps, so the pipeline has something to overlap.
    while split_k and tiles * split * 2 <= _BUSY_TILES and steps // (split * 2) >= 4 \
            and split < 16:
        split *= 2
    return GemmSchedule(bm, bn, bk, warps, 3 if steps > 2 else 2, split)


def space(shape: GemmShape, *, split_k: bool = True) -> list[GemmSchedule]:
    """Every schedule the tuner may try for `shape`, in a fixed order (without `split_k`:
    those of one K slice, for the batched matmul kernel, which has no split-K)."""
    blocks_k = (32, 64, 128) if shape.dtype == "int8" else (16, 32, 64)
    found = []
    for bm, bn, bk, warps, stages, split in itertools.product(
            (16, 32, 64, 128, 256), (16, 32, 64, 128, 256), blocks_k, (2, 4, 8), (2, 3, 4),
            (1, 2, 4, 8, 16) if split_k else (1,)):
        s = GemmSchedule(bm, bn, bk, warps, stages, split)
        try:
            s.check(shape)
        except ScheduleError:
            continue
        if bm * bn > 128 * 256 or (warps == 8 and bm * bn < 64 * 64):
            continue     # register spills / idle warps: never faster
        found.append(s)
    return found
