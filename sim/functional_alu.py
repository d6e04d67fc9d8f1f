"""The functional simulator's ALU: the operations on int32 lanes, and how an ALU
instruction's micro-ops split into runs that can be applied at once.

Kept apart from `vdla.sim.functional` (which imports it) so that the simulator module
stays readable; the semantics are the ISA's (docs: the ISA page, ALU).
"""

from __future__ import annotations

import numpy as np

from vdla.config import DIV_MAX, TABLE_BITS, TABLE_ENTRIES, AluOp, HardwareConfig
from vdla.isa import Alu

__all__ = ["alu_apply", "alu_apply_wide", "alu_runs", "as_index", "conflict_free_batches",
           "divide", "holds_operand", "table_entries", "table_lookup"]


def holds_operand(insn: Alu, config: HardwareConfig) -> bool:
    """Whether `insn` reads its vector operand once per outer iteration and holds it
    (`HardwareConfig.alu_hold`): a vector ALU instruction with one micro-op whose src
    does not move with the inner loop. With ``src_factor_out == 0`` it reads the row
    once, at its first micro-op."""
    return (config.alu_hold and not insn.use_imm and not insn.reset_reg
            and insn.uop_end - insn.uop_bgn == 1 and insn.src_factor_in == 0)


_INT32 = (-2**31, 2**31 - 1)


def table_entries(raw: np.ndarray) -> np.ndarray:
    """The table as the hardware holds it: int32 entries as a LOAD of TAB moved them,
    each cut to its low `TABLE_BITS` bits and sign-extended (int32[TABLE_ENTRIES])."""
    unused = 32 - TABLE_BITS
    return (np.asarray(raw, np.int32).reshape(TABLE_ENTRIES) << unused) >> unused


def table_lookup(a: np.ndarray, b, table: np.ndarray) -> np.ndarray:
    """TAB lane by lane: ``table[(b - a) mod TABLE_ENTRIES]`` (int32 lanes `a`, an
    immediate or lanes `b`; `table` from `table_entries`). Only the difference's low 8
    bits index, so the wrap of a 32-bit subtraction does not matter."""
    index = (np.asarray(b, np.int64) - np.asarray(a, np.int64)) & (TABLE_ENTRIES - 1)
    return table[index]


def divide(a: np.ndarray, b) -> np.ndarray:
    """DIV lane by lane: ``min(max(a, 0) // b, DIV_MAX)``, and DIV_MAX where b <= 0
    (int32 lanes `a`, an immediate or lanes `b`)."""
    a = np.maximum(np.asarray(a, np.int64), 0)
    b = np.asarray(b, np.int64)
    quotient = a // np.maximum(b, 1)
    return np.where(b > 0, np.minimum(quotient, DIV_MAX), DIV_MAX).astype(np.int32)


def alu_apply(op: AluOp, a: np.ndarray, b, use_imm: bool = True,
              table: np.ndarray | None = None) -> np.ndarray:
    """One ALU operation on int32 lanes with the hardware's wrap-around.

    a : int32 lanes; b : an immediate (int) or int32 lanes broadcasting against them.
    table : the lookup table (`table_entries`), which TAB reads.
    The common cases stay in 32 bits (wrapping sums and products in uint32, which is
    exact modulo 2**32); the rest go through `alu_apply_wide`.
    """
    if op == AluOp.TAB:
        return table_lookup(a, b, table)
    if op == AluOp.DIV:
        return divide(a, b)
    scalar = isinstance(b, (int, np.integer))
    if scalar and not _INT32[0] <= b <= _INT32[1]:
        return alu_apply_wide(op, a, b, use_imm)
    if op == AluOp.MIN:
        return np.minimum(a, np.int32(b) if scalar else b)
    if op == AluOp.MAX:
        return np.maximum(a, np.int32(b) if scalar else b)
    if op in (AluOp.ADD, AluOp.MUL):
        u = np.uint32(int(b) & 0xFFFFFFFF) if scalar else b.view(np.uint32)
        wrapped = a.view(np.uint32) + u if op == AluOp.ADD else a.view(np.uint32) * u
        return wrapped.view(np.int32)
    if scalar:
        amount = ((int(b) & 63) ^ 32) - 32
        if amount >= 0:
            shifted = a >> np.int32(amount)
        elif amount == -32:
            shifted = np.zeros_like(a)  # every bit shifted out of the low 32
        else:
            shifted = (a.view(np.uint32) << np.uint32(-amount)).view(np.int32)
    else:
        amount = ((b & 63) ^ 32) - 32
        if (amount < 0).any():
            return alu_apply_wide(op, a, b, use_imm)
        shifted = a >> amount
    if op == AluOp.SHR:
        return shifted
    # REQ (see `alu_apply_wide`).
    lo = (((b >> 8) & 255) ^ 128) - 128
    hi = 127 if use_imm else (((b >> 16) & 255) ^ 128) - 128
    if scalar:
        lo, hi = np.int32(lo), np.int32(hi)
    return np.minimum(np.maximum(shifted, lo), hi)


def alu_apply_wide(op: AluOp, a: np.ndarray, b, use_imm: bool = True,
                   table: np.ndarray | None = None) -> np.ndarray:
    """One ALU operation on int32 lanes with the hardware's wrap-around, in int64 (TAB
    and DIV, which `table_lookup` and `divide` compute in int64 already, as in
    `alu_apply`)."""
    if op == AluOp.TAB:
        return table_lookup(a, b, table)
    if op == AluOp.DIV:
        return divide(a, b)
    if op == AluOp.MIN:
        return np.minimum(a, b).astype(np.int32)
    if op == AluOp.MAX:
        return np.maximum(a, b).astype(np.int32)
    wide = a.astype(np.int64)
    if op == AluOp.ADD:
        return (wide + b).astype(np.int32)
    if op == AluOp.MUL:
        return (wide * b).astype(np.int32)  # low 32 bits of the product
    # SHR: the amount is the operand's low 6 bits as a signed number (-32..31);
    # negative amounts shift left, and the result keeps the low 32 bits.
    b = np.asarray(b, dtype=np.int64)
    amount = ((b & 63) ^ 32) - 32
    right = wide >> np.clip(amount, 0, 31)
    left = wide << np.clip(-amount, 0, 32)
    shifted = np.where(amount >= 0, right, left).astype(np.int32)
    if op == AluOp.SHR:
        return shifted
    # REQ: the shift, then a clamp to [lo, hi], int8 fields of the operand word (hi is
    # 127 with an immediate); min(max(x, lo), hi), so hi wins where lo > hi.
    lo = (((b >> 8) & 255) ^ 128) - 128
    hi = np.int64(127) if use_imm else (((b >> 16) & 255) ^ 128) - 128
    return np.minimum(np.maximum(shifted, lo), hi).astype(np.int32)


def as_index(rows: np.ndarray):
    """`rows` as a slice when they are consecutive (a view is cheaper than a gather),
    else the array itself."""
    if len(rows) and rows[-1] - rows[0] == len(rows) - 1 and (np.diff(rows) == 1).all():
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows


def alu_runs(dst: np.ndarray, src: np.ndarray | None, depth: int) -> list:
    """(dst rows, src rows or None, micro-ops) of each run of `conflict_free_batches`,
    rows as slices where they are consecutive."""
    return [(as_index(dst[part]), None if src is None else as_index(src[part]),
             part.stop - part.start)
            for part in conflict_free_batches(dst, src, depth)]


def conflict_free_batches(dst: np.ndarray, src: np.ndarray | None, depth: int) -> list[slice]:
    """Split micro-ops into consecutive runs that can be applied at once.

    A run must not write one acc element twice nor read an element an earlier micro-op
    of the run wrote; within those limits a vectorized update equals sequential order.
    """
    n = len(dst)
    written = np.zeros(depth, dtype=bool)
    written[dst] = True
    if np.count_nonzero(written) == n and (
            src is None or np.array_equal(src, dst) or not written[src].any()):
        return [slice(0, n)]  # the common case: distinct destinations, no chained reads
    order = np.argsort(dst, kind="stable")
    keys = dst[order] * n + order  # sorted by (dst, position)
    # Latest earlier writer of the same dst / of each src, or -1.
    barrier = _previous_writer(keys, dst, n)
    if src is not None:
        barrier = np.maximum(barrier, _previous_writer(keys, src, n))
    if barrier.max(initial=-1) < 0:
        return [slice(0, n)]
    bounds, start = [0], 0
    for position in np.flatnonzero(barrier >= 0).tolist():
        if barrier[position] >= start:
            bounds.append(position)
            start = position
    bounds.append(n)
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


def _previous_writer(sorted_keys: np.ndarray, target: np.ndarray, n: int) -> np.ndarray:
    """For each position p, the largest q < p with dst[q] == target[p], else -1."""
    query = target * n + np.arange(n)
    found = np.searchsorted(sorted_keys, query) - 1
    ok = found >= 0
    hit = np.where(ok, sorted_keys[np.maximum(found, 0)], -1)
    same = ok & (hit // n == target)
    return np.where(same, hit % n, -1)
