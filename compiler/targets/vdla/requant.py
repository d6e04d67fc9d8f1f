"""The ALU steps of a requantization, shared by the op families: `requant_steps` (MUL,
the rounding ADD, SHR, as `vdla.compiler.reference.integer.requantize` defines them),
`clamp_steps` (MAX and MIN, or with the ALU's REQ one fused step), and the checks and
words they need. An `AluStep` is one ALU pass over a tile, with an immediate or a
per-channel constant row of the op's acc-buffer table as its vector operand."""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.targets.vdla.common import IMM_MAX
from vdla.config import AluOp, HardwareConfig

__all__ = ["AluStep", "channel_param", "check_alu_ops", "clamp_steps", "req_word",
           "requant_steps"]


@dataclasses.dataclass(frozen=True)
class AluStep:
    """One ALU pass over a tile: `op` with an immediate, or with per-channel constant row
    `row` (of the op's constant rows in the acc buffer) as its vector operand."""

    op: AluOp
    imm: int | None = None
    row: int | None = None


def channel_param(node, name: str, value, channels: int, low: int, high: int):
    """An int, or an int64 array with one value per channel; a per-channel value whose
    entries are all equal becomes an int (an immediate instead of a vector operand)."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu" or arr.ndim > 1:
        raise ValueError(f"{node.op} node {node.name!r}: {name} must be an integer or one "
                         f"integer per output channel, not {value!r}")
    arr = arr.astype(np.int64).reshape(-1)
    if arr.size not in (1, channels):
        raise ValueError(f"{node.op} node {node.name!r}: {name} has {arr.size} values; it "
                         f"needs 1 or one per output channel ({channels})")
    if ((arr < low) | (arr > high)).any():
        raise ValueError(f"{node.op} node {node.name!r}: {name} {arr.tolist()} is outside "
                         f"[{low}, {high}]")
    return int(arr[0]) if (arr == arr[0]).all() else arr


def requant_steps(node, multiplier, shift, channels: int, padded: int, rows: list,
                  fold: bool) -> tuple[list[AluStep], np.ndarray | None]:
    """ALU steps of ``requantize(acc, multiplier, shift)`` (`vdla.compiler.reference.integer`);
    appends the vector operands it needs to `rows` (int64 rows of `padded` channels).
    With `fold` (no multiplier before the rounding ADD), the rounding constant is returned
    to be added to the bias instead. Returns (steps, rounding to fold or None)."""

    def vector(values, pad_value):
        row = np.full(padded, pad_value, dtype=np.int64)
        row[:channels] = values
        rows.append(row)
        return len(rows) - 1

    steps = []
    if multiplier is not None:
        m = channel_param(node, "multiplier", multiplier, channels, 1, IMM_MAX)
        steps.append(AluStep(AluOp.MUL, imm=m) if isinstance(m, int)
                     else AluStep(AluOp.MUL, row=vector(m, 1)))
    s = channel_param(node, "shift", shift, channels, -31, 31)
    rounding = np.where(np.asarray(s) > 0, np.int64(1) << np.clip(np.asarray(s) - 1, 0, 30), 0)
    folded = None
    if np.any(rounding):
        if fold:
            folded = np.zeros(padded, dtype=np.int64)
            folded[:channels] = rounding
        elif isinstance(s, int) and rounding <= IMM_MAX:
            steps.append(AluStep(AluOp.ADD, imm=int(rounding)))
        else:  # per channel, or 1 << (shift - 1) beyond the 16-bit immediate
            steps.append(AluStep(AluOp.ADD, row=vector(np.broadcast_to(rounding, channels), 0)))
    if isinstance(s, int):
        if s:
            steps.append(AluStep(AluOp.SHR, imm=s))
    else:
        steps.append(AluStep(AluOp.SHR, row=vector(s, 0)))
    return steps, folded


def req_word(shift, lo: int, hi: int):
    """The operand word of the ALU's REQ (`vdla.config.AluOp`): shift in bits 5:0, lo in
    15:8, hi in 23:16; `shift` an int or an int64 array (one word per lane)."""
    return (np.asarray(shift, np.int64) & 63) | ((lo & 255) << 8) | ((hi & 255) << 16)


def clamp_steps(main: list[AluStep], rows: list, padded: int, lo: int, hi: int, fuse: bool,
                config: HardwareConfig) -> tuple[list[AluStep], tuple[AluStep, ...] | None]:
    """The clamp to [lo, hi] that ends an epilogue, given its requantization `main`
    (whose constant `rows` it may change or append to). Without the ALU's REQ: (main,
    None), the clamp being a MAX and a MIN with immediates. With REQ and `fuse` (nothing
    comes between the requantization and the clamp), the last SHR and the clamp become
    one REQ: (main with it, ()). With REQ otherwise, a REQ that only clamps (shift 0):
    (main, (that step,)). A REQ takes an immediate when hi is 127 and the shift a
    single value, else a constant row (of `padded` channels)."""
    if AluOp.REQ not in config.alu_ops:
        return main, None
    shift = 0
    if fuse and main and main[-1].op == AluOp.SHR:
        *main, last = main
        if last.row is not None:
            rows[last.row] = req_word(rows[last.row], lo, hi)
            return main + [AluStep(AluOp.REQ, row=last.row)], ()
        shift = last.imm
    if hi == 127:
        imm = int(req_word(shift, lo, 0))
        step = AluStep(AluOp.REQ, imm=imm - (1 << 16) if imm > IMM_MAX else imm)
    else:
        rows.append(np.full(padded, req_word(shift, lo, hi), np.int64))
        step = AluStep(AluOp.REQ, row=len(rows) - 1)
    return (main + [step], ()) if fuse else (main, (step,))


def check_alu_ops(node, steps, config: HardwareConfig):
    """ValueError when `steps` use an ALU op (MUL) that `config` lacks."""
    if any(step.op not in config.alu_ops for step in steps):
        missing = sorted({step.op.name for step in steps} - {op.name for op in config.alu_ops})
        raise ValueError(f"{node.op} node {node.name!r} requantizes with a multiplier, which "
                         f"needs the ALU {', '.join(missing)}; config {config.name} has only "
                         f"{', '.join(sorted(op.name for op in config.alu_ops))}")
