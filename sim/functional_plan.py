"""Index plans for the functional simulator: what a GEMM or ALU instruction reads and
writes, worked out once per instruction and micro-op range and then reused.

A compiled model runs the same few loop nests over and over (a convolution's GEMM once
per tile, its epilogue's ALU instructions after it), each time over the same micro-ops:
only the SRAM data changes. The index arithmetic of a loop nest (every micro-op's dst,
src and wgt, the shape of its products, which destinations repeat, how ALU read-after-
write chains split) costs more than the arithmetic on small tiles, so `PlanCache` keeps
it, keyed by the loop nest and the decoded micro-ops it reads (their dst, src and wgt
fields): a LOAD that changes those micro-ops changes the key, so a plan is never used
for micro-ops it was not made from.

A GEMM whose micro-ops form a matrix product (`plan_gemm`) runs as one BLAS product
over gathered operands, the convolution's im2col: the micro-ops fall into groups of
equal size by destination, and either every group reads the same weight sequence (the
groups are rows of the product, the shape of a convolution: a group per output pixel,
a micro-op per tap) or the same input sequence (the groups are columns). Each loop of
the nest then moves the input, the weight, both (a batch of products) or neither (the
same product lands in several places).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from vdla.config import HardwareConfig
from vdla.sim.functional_alu import alu_runs, holds_operand

__all__ = ["AluPlan", "GemmPlan", "PlanCache", "loop_indices", "plan_alu", "plan_gemm"]

# Largest operand or product array (elements) a GEMM plan gathers at once; a larger
# instruction runs on the simulator's chunked general path instead.
MAX_PLAN_ELEMS = 1 << 22

# Index elements the cache may hold in all (int64: 8 bytes each).
CACHE_ELEMS = 1 << 23


def loop_indices(insn, field: np.ndarray, prefix: str) -> np.ndarray:
    """The micro-op field's index for every (iter_out, iter_in, micro-op) of `insn`'s
    loop nest, flattened in issue order.

    insn : a GEMM or ALU instruction
    field : the decoded micro-op field for the whole uop buffer (dst, src or wgt)
    prefix : ``dst``, ``src`` or ``wgt``: which factors move the field
    """
    o = np.arange(insn.iter_out, dtype=np.int64)[:, None, None]
    i = np.arange(insn.iter_in, dtype=np.int64)[None, :, None]
    base = field[insn.uop_bgn:insn.uop_end][None, None, :]
    return (base + o * getattr(insn, f"{prefix}_factor_out")
            + i * getattr(insn, f"{prefix}_factor_in")).reshape(-1)


@dataclasses.dataclass(frozen=True, eq=False)
class GemmPlan:
    """A GEMM loop nest as one (batched) matrix product.

    src : inp rows to gather, flat, for an operand of shape (batches, rows, taps)
    wgt : wgt rows to gather, flat, for an operand of shape (batches, cols, taps)
    batches, rows, cols, taps : the product's sizes in micro-op units: rows of inp
        blocks, columns of wgt blocks, and taps (micro-ops) summed per result
    dst : the acc row of each result, flat, (batches · rows · cols, repeat) in
        (batch, row, col) order; `repeat` > 1 when loops that move neither operand
        land the same product in several rows. When the rows are distinct and
        consecutive (in that order, or in `order`), a slice of them
    repeat : how many rows each product is added to
    distinct : whether no acc row appears twice in `dst` (then no sums need merging)
    exact32 : whether float32 is exact for the product (every partial sum of int8
        products stays below 2**24)
    order : None, or the permutation of the results (repeats included) that makes a
        `dst` slice consecutive (a convolution's pixels come in (row, pixel, channel
        block) order, its acc tile in (channel block, row, pixel) order): a gather of
        the small products instead of a gather and a scatter of acc rows
    """

    src: np.ndarray
    wgt: np.ndarray
    batches: int
    rows: int
    cols: int
    taps: int
    dst: np.ndarray
    repeat: int
    distinct: bool
    exact32: bool
    order: np.ndarray | None = None

    @property
    def elems(self) -> int:
        """Index elements the plan holds (what it costs the cache)."""
        return (len(self.src) + len(self.wgt) + (1 if isinstance(self.dst, slice) else
                                                   len(self.dst))
                + (0 if self.order is None else len(self.order)))


@dataclasses.dataclass(frozen=True, eq=False)
class AluPlan:
    """An ALU loop nest's indices.

    dst : acc rows written, in issue order
    src : acc rows read (None with an immediate or a reset)
    runs : (dst rows, src rows or None, micro-ops) of each run of micro-ops that can be
        applied at once, rows as slices or arrays; None for an instruction that holds an
        operand row it writes itself (`held` says how)
    held : (runs, src row) per group of micro-ops that use one held row, when the held
        row is written by the instruction; else empty
    """

    dst: np.ndarray
    src: np.ndarray | None
    runs: list | None
    held: tuple = ()

    @property
    def elems(self) -> int:
        """Index elements the plan holds (what it costs the cache)."""
        return len(self.dst) + (0 if self.src is None else len(self.src))


class PlanCache:
    """Plans by (loop nest, its decoded micro-ops), oldest dropped first past
    `CACHE_ELEMS` index elements.

    Parameters
    ----------
    limit : the most index elements kept (default `CACHE_ELEMS`)
    """

    def __init__(self, limit: int = CACHE_ELEMS):
        self.limit = limit
        self.plans: dict = {}
        self.elems = 0
        self.hits = self.misses = 0

    def lookup(self, key, make):
        """The plan stored under `key`, else ``make()``'s, stored (None is a plan too:
        "this instruction has no fast path")."""
        try:
            plan = self.plans[key]
        except KeyError:
            self.misses += 1
            plan = self.plans[key] = make()
            self.elems += _size(plan)
            if self.elems > self.limit:
                self._shrink()
            return plan
        self.hits += 1
        return plan

    def _shrink(self) -> None:
        """Drop the oldest plans until the total is within the limit (the newest one
        stays, even alone over it, until the next plan is stored)."""
        while self.elems > self.limit and len(self.plans) > 1:
            self.elems -= _size(self.plans.pop(next(iter(self.plans))))


def _size(plan) -> int:
    return 0 if plan is None else plan.elems


def _groups(udst: np.ndarray):
    """(distinct dst rows, their micro-ops' positions as (groups, taps)) when every dst
    of the range has the same number of micro-ops, else None. Taps keep issue order."""
    order = np.argsort(udst, kind="stable")
    ordered = udst[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    taps = starts[1] if len(starts) > 1 else len(udst)
    if (np.diff(starts) != taps).any() or len(udst) != len(starts) * taps:
        return None
    return ordered[starts], order.reshape(len(starts), taps)


def _axis(values: np.ndarray, position: int, ndim: int) -> np.ndarray:
    """`values` (1-D, or 2-D spanning `position` and the last axis) shaped to broadcast
    along axis `position` of an `ndim`-dimensional array."""
    shape = [1] * ndim
    shape[position] = values.shape[0]
    if values.ndim == 2:
        shape[-1] = values.shape[1]
    return values.reshape(shape)


def plan_gemm(insn, udst: np.ndarray, usrc: np.ndarray, uwgt: np.ndarray,
              config: HardwareConfig) -> GemmPlan | None:
    """The matrix-product plan of a non-reset, non-depthwise GEMM that has work, or None
    when its micro-ops do not have that shape or its arrays would pass `MAX_PLAN_ELEMS`.

    insn : the `vdla.isa.Gemm`
    udst, usrc, uwgt : the decoded fields of its micro-ops (uop_bgn..uop_end)
    config : the `HardwareConfig`
    """
    c = config
    grouped = _groups(udst)
    if grouped is None:
        return None
    uniq, order = grouped
    taps = order.shape[1]
    # A group's taps may come in any order (their sum does not depend on it): sort each
    # group by the operand that should be the same sequence in every group.
    for groups_move, shared in (("src", uwgt), ("wgt", usrc)):
        ordered = np.take_along_axis(order, np.argsort(shared[order], axis=1, kind="stable"),
                                     axis=1)
        table = shared[ordered]                                  # (groups, taps)
        if (table == table[0]).all():
            break        # "src": groups are rows (a convolution's output pixels), else columns
    else:
        return None
    src_table, wgt_table = usrc[ordered], uwgt[ordered]
    # Each loop: (size, dst factor, src factor, wgt factor); a loop of one iteration
    # adds nothing.
    loops = [(insn.iter_out, insn.dst_factor_out, insn.src_factor_out, insn.wgt_factor_out),
             (insn.iter_in, insn.dst_factor_in, insn.src_factor_in, insn.wgt_factor_in)]
    both = [lp for lp in loops if lp[0] > 1 and lp[2] and lp[3]]
    a_only = [lp for lp in loops if lp[0] > 1 and lp[2] and not lp[3]]
    b_only = [lp for lp in loops if lp[0] > 1 and lp[3] and not lp[2]]
    neither = [lp for lp in loops if lp[0] > 1 and not lp[2] and not lp[3]]
    # Axes of the src index: both.., a_axes.., taps; of the wgt index: both.., b_axes..,
    # taps; of dst: both.., a_axes.., b_axes.., neither... The groups (None below) are an
    # axis of whichever operand moves with them.
    groups = len(uniq)
    a_axes = a_only + ([None] if groups_move == "src" else [])
    b_axes = b_only + ([None] if groups_move == "wgt" else [])
    nb = len(both)

    def sizes(axes):
        return [groups if lp is None else lp[0] for lp in axes]

    batches, rows, cols, repeat = (math.prod(sizes(axes))
                                   for axes in (both, a_axes, b_axes, neither))
    elems = batches * taps * max(rows * c.batch * c.block_in, cols * c.block_out * c.block_in)
    if max(elems, batches * rows * cols * repeat * c.batch * c.block_out) > MAX_PLAN_ELEMS:
        return None

    def operand(axes, factor, table, own):
        """Index of one operand over (both.., axes.., taps)."""
        ndim = nb + len(axes) + 1
        index = np.zeros((1,) * ndim, dtype=np.int64)
        for k, lp in enumerate(both):
            index = index + _axis(np.arange(lp[0]) * lp[factor], k, ndim)
        for k, lp in enumerate(axes):
            values = table if lp is None else np.arange(lp[0]) * lp[factor]
            index = index + _axis(values, nb + k, ndim)
        if not own:      # the groups move the other operand: this one reads one sequence
            index = index + table[0].reshape((1,) * (ndim - 1) + (taps,))
        return np.broadcast_to(index, sizes(both) + sizes(axes) + [taps]).reshape(-1)

    src = operand(a_axes, 2, src_table, groups_move == "src")
    wgt = operand(b_axes, 3, wgt_table, groups_move == "wgt")
    out_axes = both + a_axes + b_axes + neither
    ndim = len(out_axes)
    dst = np.zeros((1,) * ndim, dtype=np.int64)
    for k, lp in enumerate(out_axes):
        dst = dst + _axis(uniq if lp is None else np.arange(lp[0]) * lp[1], k, ndim)
    dst = np.broadcast_to(dst, sizes(out_axes)).reshape(-1)
    present = np.zeros(c.acc_depth, dtype=bool)
    present[dst] = True
    distinct = np.count_nonzero(present) == len(dst)
    order = None
    if distinct and dst.max() - dst.min() == len(dst) - 1:   # a block of rows
        order = np.argsort(dst)
        if (order == np.arange(len(dst))).all():
            order = None
        dst = slice(int(dst.min()), int(dst.max()) + 1)
    # float32 is exact while every partial sum of int8 products stays below 2**24.
    exact32 = taps * c.block_in * 2**14 < 2**24
    return GemmPlan(src, wgt, batches, rows, cols, taps, dst, repeat, distinct, exact32,
                    order)


def plan_alu(insn, udst: np.ndarray, usrc: np.ndarray, config: HardwareConfig) -> AluPlan:
    """An ALU instruction's indices, and how its micro-ops split into runs applied at
    once (`alu_runs`).

    insn : the `vdla.isa.Alu` (with work)
    udst, usrc : the decoded dst and src fields of the whole uop buffer
    config : the `HardwareConfig`
    """
    c = config
    vector = not insn.use_imm and not insn.reset_reg
    dst = loop_indices(insn, udst, "dst")
    src = loop_indices(insn, usrc, "src") if vector else None
    if vector and holds_operand(insn, c) and np.isin(src, dst).any():
        # The held operand row is written by the instruction itself: each group of
        # micro-ops uses the row as it was at the group's first micro-op.
        group = len(dst) // insn.iter_out if insn.src_factor_out else len(dst)
        held = tuple((alu_runs(dst[start:start + group], None, c.acc_depth), int(src[start]))
                     for start in range(0, len(dst), group))
        return AluPlan(dst, src, None, held)
    return AluPlan(dst, src, alu_runs(dst, src, c.acc_depth))
