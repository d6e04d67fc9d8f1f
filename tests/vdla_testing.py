"""Helpers shared by the tests: programs that expose SRAM contents through the ISA, and
a naive per-micro-op reference of GEMM and ALU semantics.

Everything here drives a device only through the device API, so the same tests can run
on every backend.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from hypothesis import strategies as st

from vdla import AluOp, HardwareConfig
from vdla.isa import (DEP_FLAGS, Alu, Finish, Gemm, Load, MemoryType, Store, Uop, encode_uops,
                      layouts_for)
from vdla.runtime import COMPUTE, STORE, Device, ProgramBuilder


# --- hypothesis strategies for instructions -------------------------------------------------

FLAG_FIELDS = set(DEP_FLAGS) | {"reset_reg", "use_imm"}
PAD_FIELDS = ("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1")


def insn_fields(cfg: HardwareConfig, kind: str, skip=()) -> st.SearchStrategy:
    """Keyword arguments for one instruction kind, each value within its field's width."""
    strategies = {}
    for name, (_, width) in layouts_for(cfg)[kind].fields.items():
        if name in ("opcode", "memory_type", "alu_opcode") or name in skip:
            continue
        if name in FLAG_FIELDS:
            strategies[name] = st.booleans()
        elif name == "imm":
            strategies[name] = st.integers(-(1 << (width - 1)), (1 << (width - 1)) - 1)
        else:
            strategies[name] = st.integers(0, (1 << width) - 1)
    return st.fixed_dictionaries(strategies)


def instructions(cfg: HardwareConfig) -> st.SearchStrategy:
    """Any valid instruction for `cfg` (every kind, memory type and implemented ALU op)."""
    return st.one_of(
        st.builds(lambda mem, kw: Load(memory_type=mem, **kw),
                  st.sampled_from(["UOP", "WGT", "INP", "ACC"]), insn_fields(cfg, "LOAD")),
        insn_fields(cfg, "STORE", skip=PAD_FIELDS).map(lambda kw: Store(**kw)),
        insn_fields(cfg, "GEMM").map(lambda kw: Gemm(**kw)),
        st.builds(lambda op, kw: Alu(alu_opcode=op, **kw),
                  st.sampled_from(sorted(cfg.alu_ops)), insn_fields(cfg, "ALU")),
        insn_fields(cfg, "FINISH").map(lambda kw: Finish(**kw)))


# --- programs over the device API -------------------------------------------------------------

def put(dev: Device, array: np.ndarray) -> int:
    """Allocate DRAM for `array`, write it, return the byte address."""
    addr = dev.alloc(max(1, array.nbytes))
    dev.write(addr, array)
    return addr


def run_acc_program(dev: Device, uops: list[Uop],
                    body: Callable[[ProgramBuilder, int], None], n_out: int) -> np.ndarray:
    """Run `body` on the compute module and return acc[0:n_out] as full int32 values.

    `uops` are loaded into the uop buffer from index 0 before `body(p, uop_dram_elem)`
    appends its instructions. Then the acc contents come out through the out buffer one
    byte at a time: ALU SHR 0, STORE, then three times ALU SHR 8, STORE (the out buffer
    keeps the low 8 bits of each accumulator), and the bytes are put back together.
    """
    c = dev.config
    table = list(uops) + [Uop(0, 0, 0)]
    read_uop = len(table) - 1
    uop_addr = put(dev, np.frombuffer(encode_uops(table, c), np.uint8))
    out_bytes = n_out * c.out_elem_bytes
    out_addr = dev.alloc(4 * out_bytes)
    p = ProgramBuilder(c)
    p.load(MemoryType.UOP, sram_base=0, dram_base=uop_addr // c.uop_bytes, y_size=1,
           x_size=len(table), x_stride=len(table))
    body(p, uop_addr // c.uop_bytes)
    for byte in range(4):
        if byte:
            p.dep_pop(STORE, COMPUTE)  # the store has read the out buffer
        p.alu(AluOp.SHR, use_imm=True, imm=8 if byte else 0, uop_bgn=read_uop,
              uop_end=read_uop + 1, iter_out=n_out, iter_in=1, dst_factor_out=1,
              src_factor_out=1)
        p.dep_push(COMPUTE, STORE)
        p.dep_pop(COMPUTE, STORE)
        p.store(sram_base=0, dram_base=(out_addr + byte * out_bytes) // c.out_elem_bytes,
                y_size=1, x_size=n_out, x_stride=n_out)
        p.dep_push(STORE, COMPUTE)
    p.dep_pop(STORE, COMPUTE)
    addr, count = dev.load_program(p.finish())
    dev.run(addr, count)
    raw = dev.read(out_addr, 4 * out_bytes).reshape(4, n_out, c.batch, c.block_out)
    value = sum(raw[i].astype(np.uint32) << (8 * i) for i in range(4))
    return value.astype(np.uint32).view(np.int32)


def load_acc_insn(c: HardwareConfig, dram_addr: int, **fields) -> dict:
    """Keyword arguments of a LOAD ACC from byte address `dram_addr`."""
    return dict(memory_type=MemoryType.ACC, dram_base=dram_addr // c.acc_elem_bytes, **fields)


# --- naive reference of the loop semantics ---------------------------------------------------

def _loop_nest(insn, uops: list[Uop]):
    """(dst, src, wgt) of every micro-op execution of a GEMM or ALU, in order."""
    def index(uop, o, i, field):
        return (getattr(uop, field) + o * getattr(insn, f"{field}_factor_out", 0)
                + i * getattr(insn, f"{field}_factor_in", 0))

    for o in range(insn.iter_out):
        for i in range(insn.iter_in):
            for uop in uops[insn.uop_bgn:insn.uop_end]:
                yield index(uop, o, i, "dst"), index(uop, o, i, "src"), index(uop, o, i, "wgt")


def reference_gemm(insn: Gemm, uops: list[Uop], inp, wgt, acc, out):
    """Apply one GEMM to numpy SRAM arrays in place, one micro-op at a time."""
    for d, s, w in _loop_nest(insn, uops):
        if insn.reset_reg:
            acc[d] = 0
        else:
            prod = inp[s].astype(np.int64) @ wgt[w].astype(np.int64).T
            acc[d] = _wrap32(acc[d].astype(np.int64) + prod)
        out[d] = _narrow8(acc[d])


def _narrow8(x: np.ndarray) -> np.ndarray:
    """Low 8 bits as a signed value (two's-complement truncation)."""
    return ((x.astype(np.int64) + 128) % 256 - 128).astype(np.int8)


def _wrap32(x: np.ndarray) -> np.ndarray:
    return ((x.astype(np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


def _int8(value: int) -> int:
    return value - 256 if value >= 128 else value


def reference_alu_op(op: AluOp, a: int, b: int, use_imm: bool = True,
                     table=None) -> int:
    """One ALU lane, written from the ISA description with Python integers (REQ: the
    value it narrows into the out buffer; it clears the accumulator; TAB reads `table`,
    its 256 entries as the hardware holds them)."""
    if op == AluOp.TAB:
        return int(table[(b - a) % 256])
    if op == AluOp.DIV:
        return min(max(a, 0) // b, 127) if b > 0 else 127
    if op == AluOp.MIN:
        return min(a, b)
    if op == AluOp.MAX:
        return max(a, b)
    if op == AluOp.ADD:
        return int(_wrap32(np.array(a + b)))
    if op == AluOp.MUL:
        return int(_wrap32(np.array(a * b)))
    amount = b & 0x3F
    amount = amount - 64 if amount >= 32 else amount
    shifted = a >> amount if amount >= 0 else int(_wrap32(np.array((a << -amount) & 0xFFFFFFFF)))
    if op == AluOp.SHR:
        return shifted
    # REQ: the shift, then min(max(., lo), hi); lo is bits 15:8, hi bits 23:16 (127 with
    # an immediate), each an int8.
    lo, hi = _int8((b >> 8) & 0xFF), 127 if use_imm else _int8((b >> 16) & 0xFF)
    return min(max(shifted, lo), hi)


def reference_alu(insn: Alu, uops: list[Uop], acc, out, table=None):
    """Apply one ALU instruction to numpy SRAM arrays in place, one micro-op at a time
    (`table`: the lookup table TAB reads)."""
    op = np.vectorize(lambda a, b: reference_alu_op(insn.alu_opcode, int(a), int(b),
                                                    insn.use_imm, table), otypes=[np.int64])
    for d, s, _ in _loop_nest(insn, uops):
        if insn.reset_reg:
            acc[d] = 0
            out[d] = 0
        elif insn.alu_opcode == AluOp.REQ:   # the result to the out buffer, acc cleared
            out[d] = _narrow8(op(acc[d], insn.imm if insn.use_imm else acc[s].copy()))
            acc[d] = 0
        else:
            acc[d] = op(acc[d], insn.imm if insn.use_imm else acc[s].copy())
            out[d] = _narrow8(acc[d])
