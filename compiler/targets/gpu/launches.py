"""What a lowered node is: its kernels' launches (`Launch`), the arguments the session
binds (`Ref`) and the node's `GpuKernel`. Plain data, no Triton: `lower` and
`lower_sequence` make them, `vdla.compiler.targets.gpu.target.GpuSession` runs them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, NamedTuple

import numpy as np

__all__ = ["GpuKernel", "IndexCheck", "Launch", "Ref"]


class Ref(NamedTuple):
    """A launch argument the session binds: ``in`` (node input `key`), ``out`` (output
    0), ``const`` (constant `key`), ``scratch`` (the split-K buffer), ``buf`` (the named
    device buffer `key` of `GpuKernel.buffers`), or ``dummy`` (an unused pointer of dtype
    `key`)."""

    kind: str
    key: Any = None


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch: the kernel's name (in `kernels` or `sequence_kernels`), its
    grid, its positional arguments (`Ref`s and scalars) and its keyword ones (constexprs,
    num_warps, num_stages)."""

    kernel: str
    grid: tuple[int, ...]
    args: tuple
    meta: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class IndexCheck:
    """A gather's bounds check: the kernel writes, into int32 buffer `buffer` (zeroed
    before each run), one more than the position of an index outside [-n, n) of input
    `indices` (0: all in range); the session then raises the reference's ValueError
    (`vdla.compiler.ir.ops_sequence.check_gather_indices`) instead of returning data."""

    buffer: str
    indices: int
    n: int


@dataclasses.dataclass(frozen=True, eq=False)
class GpuKernel:
    """A node lowered: its launches in order, the constants they read (uploaded once per
    session), a scratch buffer (split-K partial sums: shape, dtype), named device buffers
    (`buffers`: key -> (shape, dtype); the ones in `zeroed` are zeroed before each run),
    bounds checks to read after the launches, the node's MACs and, when the target names
    a GPU, its roofline estimate in seconds. A view (flatten, reshape) has no launches:
    its output is its input's memory."""

    node: str
    launches: tuple[Launch, ...]
    consts: Mapping[str, np.ndarray]
    scratch: tuple[tuple[int, ...], str] | None = None
    macs: int = 0
    view: bool = False
    roofline_seconds: float | None = None
    buffers: Mapping[str, tuple[tuple[int, ...], str]] = dataclasses.field(
        default_factory=dict)
    zeroed: tuple[str, ...] = ()
    checks: tuple[IndexCheck, ...] = ()
