"""Functional simulator: bit-exact ISA semantics and the token protocol, in numpy.

The golden model for every other backend. It models what decides *whether* and *what*
a program computes, not how long it takes:

- fetch routes instructions in order into the load, compute and store command queues
  (``cmd_queue_depth`` entries each; fetch stalls on a full queue, as the hardware does);
- each module executes its queue in order, popping the token queues its instruction
  names before executing and pushing after (``token_queue_depth`` tokens each);
- a state where nothing can move and FINISH has not run is a deadlock, reported with
  what every blocked unit waits on.

That scheduling, and every check of indices and addresses, is the validator's
(`vdla.sim.validate`), which every backend runs before a program: this module executes
the instructions in the order the validator's walk yields, on data it knows is in range.

Work inside an instruction is vectorized over all its micro-ops: GEMM products come from
one float32 matrix product over the distinct inputs and weights the instruction touches
(exact: |int8·int8| sums stay far below 2**24) and are accumulated per destination with
``np.bincount`` in float64 (exact) before the int32 wrap-around. ALU micro-ops are
applied in conflict-free batches so read-after-write chains inside one instruction
(pooling, reductions) keep their sequential meaning.
"""

from __future__ import annotations

import collections
from typing import Sequence

import numpy as np

from vdla.config import AluOp, HardwareConfig
from vdla.isa import INSN_BYTES, Alu, Gemm, Insn, Load, MemoryType, Store
from vdla.sim.protocol import fetch_program
from vdla.sim.validate import ProgramValidator, decode_uops

__all__ = ["FunctionalSimulator"]

# Elements per batch of products: bounds the memory of temporary arrays.
_CHUNK_ELEMS = 1 << 22


def _unique_inverse(index: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values of `index` (all in [0, depth)) and each element's position among them."""
    present = np.zeros(depth, dtype=bool)
    present[index] = True
    uniq = np.flatnonzero(present)
    remap = np.empty(depth, dtype=np.intp)
    remap[uniq] = np.arange(len(uniq))
    return uniq, remap[index]


class FunctionalSimulator:
    """Bit-exact simulator of one accelerator over a DRAM byte array.

    The SRAMs keep their contents between runs, as on the hardware.

    Parameters
    ----------
    config : HardwareConfig
    dram : numpy.ndarray of uint8
        The DRAM the accelerator sees; shared with the caller (not copied).
    """

    def __init__(self, config: HardwareConfig, dram: np.ndarray):
        if not isinstance(dram, np.ndarray) or dram.dtype != np.uint8 or dram.ndim != 1:
            raise TypeError("dram must be a 1-D numpy uint8 array")
        self.config = config
        self.dram = dram
        c = config
        self._elem_bytes = {MemoryType.UOP: c.uop_bytes, MemoryType.WGT: c.wgt_elem_bytes,
                            MemoryType.INP: c.inp_elem_bytes, MemoryType.ACC: c.acc_elem_bytes,
                            MemoryType.OUT: c.out_elem_bytes}
        depths = {MemoryType.UOP: c.uop_depth, MemoryType.WGT: c.wgt_depth,
                  MemoryType.INP: c.inp_depth, MemoryType.ACC: c.acc_depth,
                  MemoryType.OUT: c.out_depth}
        # Each SRAM is raw bytes (what DMA moves) with a typed view (what compute uses).
        self.sram = {m: np.zeros((depths[m], self._elem_bytes[m]), dtype=np.uint8)
                     for m in MemoryType}
        self.inp = self.sram[MemoryType.INP].view(np.int8).reshape(-1, c.batch, c.block_in)
        self.wgt = self.sram[MemoryType.WGT].view(np.int8).reshape(-1, c.block_out, c.block_in)
        self.acc = self.sram[MemoryType.ACC].view("<i4").reshape(-1, c.batch, c.block_out)
        self.out = self.sram[MemoryType.OUT].view(np.int8).reshape(-1, c.batch, c.block_out)
        # Micro-ops decoded once when loaded, as index arrays.
        self.uop_dst = np.zeros(c.uop_depth, dtype=np.int64)
        self.uop_src = np.zeros(c.uop_depth, dtype=np.int64)
        self.uop_wgt = np.zeros(c.uop_depth, dtype=np.int64)
        self.validator = ProgramValidator(config)

    # --- running ------------------------------------------------------------------------

    def run_from_dram(self, insn_addr: int, insn_count: int, *,
                      max_cycles: int | None = None) -> dict:
        """Fetch `insn_count` instructions from DRAM byte address `insn_addr` and run them."""
        insns = fetch_program(self.dram, insn_addr, insn_count, self.config)
        return self.run(insns, insn_addr=insn_addr, max_cycles=max_cycles)

    def run(self, insns: Sequence[Insn], *, insn_addr: int | None = None,
            max_cycles: int | None = None) -> dict:
        """Run a program to FINISH and return its statistics.

        Statistics (a dict of ints; counters that stayed 0 are left out):
        ``instructions`` up to and including FINISH, ``fetch_bytes``;
        ``load_insns``, ``compute_insns``, ``store_insns`` executed per module;
        ``load_bytes_{uop,wgt,inp,acc}`` and ``store_bytes_out`` moved by DMA (padding
        is not read); ``dram_bytes_read`` (fetch and loads) and ``dram_bytes_written``;
        ``gemm_uops``, ``gemm_macs`` (batch·block_in·block_out per non-reset GEMM
        micro-op) and ``alu_uops``.

        The program is validated first (`vdla.sim.validate`, as on every backend):
        `DeadlockError` when no module can move before FINISH, `ProgramError` for an
        invalid instruction (naming its index), a program without FINISH, work still
        pending when FINISH runs, or tokens left in a queue at the end, and
        `vdla.sim.validate.BudgetError` for work past `max_cycles` (default
        `vdla.sim.validate.DEFAULT_MAX_CYCLES`). `insn_addr`, where the instructions
        sit in DRAM, lets validation refuse a STORE over them.
        """
        insns = list(insns)
        plan = self.validator.validate(insns, self.dram, insn_addr=insn_addr,
                                       max_cycles=max_cycles)
        self.stats = stats = collections.Counter()
        for index in plan.order:
            self._execute(insns[index])
        for module, count in plan.module_insns.items():
            stats[f"{module}_insns"] = count
        stats["instructions"] = plan.finish + 1
        stats["fetch_bytes"] = (plan.finish + 1) * INSN_BYTES
        stats["dram_bytes_read"] += stats["fetch_bytes"]
        return dict(stats)

    # --- instruction semantics ------------------------------------------------------------

    # Every index and address below was checked by the validator before the program ran.

    def _execute(self, insn: Insn):
        if isinstance(insn, Load):
            self._load(insn)
        elif isinstance(insn, Store):
            self._store(insn)
        elif isinstance(insn, Gemm):
            self._gemm(insn)
        elif isinstance(insn, Alu):
            self._alu(insn)

    @staticmethod
    def _dram_elements(insn) -> np.ndarray:
        """Element indices (y_size × x_size) in DRAM of a 2-D LOAD or STORE."""
        rows = insn.dram_base + insn.x_stride * np.arange(insn.y_size, dtype=np.int64)
        return rows[:, None] + np.arange(insn.x_size, dtype=np.int64)

    def _dram_view(self, memory_type: MemoryType) -> np.ndarray:
        elem = self._elem_bytes[memory_type]
        return self.dram[:len(self.dram) // elem * elem].reshape(-1, elem)

    def _load(self, insn: Load):
        if insn.x_size == 0:
            return  # a dependency-only no-op
        mem = insn.memory_type
        sram = self.sram[mem]
        width = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        rows = insn.y_pad_0 + insn.y_size + insn.y_pad_1
        end = insn.sram_base + rows * width
        if rows == 0:
            return  # no rows and no padding rows: nothing to write (found by fuzzing)
        data = self._dram_view(mem)[self._dram_elements(insn)]
        block = sram[insn.sram_base:end].reshape(rows, width, -1)
        block[...] = 0
        block[insn.y_pad_0:insn.y_pad_0 + insn.y_size, insn.x_pad_0:insn.x_pad_0 + insn.x_size] = data
        if mem == MemoryType.UOP:
            self._decode_uops(insn.sram_base, end)
        key = mem.name.lower()
        nbytes = insn.y_size * insn.x_size * self._elem_bytes[mem]
        self.stats[f"load_bytes_{key}"] += nbytes
        self.stats["dram_bytes_read"] += nbytes

    def _decode_uops(self, begin: int, end: int):
        (self.uop_dst[begin:end], self.uop_src[begin:end],
         self.uop_wgt[begin:end]) = decode_uops(self.sram[MemoryType.UOP][begin:end], self.config)

    def _store(self, insn: Store):
        if insn.x_size == 0 or insn.y_size == 0:
            return  # nothing to write (stores have no padding)
        count = insn.y_size * insn.x_size
        end = insn.sram_base + count
        out = self.sram[MemoryType.OUT]
        index = self._dram_elements(insn)
        self._dram_view(MemoryType.OUT)[index] = out[insn.sram_base:end].reshape(
            insn.y_size, insn.x_size, -1)
        nbytes = count * self._elem_bytes[MemoryType.OUT]
        self.stats["store_bytes_out"] += nbytes
        self.stats["dram_bytes_written"] += nbytes

    @staticmethod
    def _indices(insn, uop_field: np.ndarray, prefix: str) -> np.ndarray:
        """The field's index for every (iter_out, iter_in, micro-op), flattened in loop order."""
        o = np.arange(insn.iter_out, dtype=np.int64)[:, None, None]
        i = np.arange(insn.iter_in, dtype=np.int64)[None, :, None]
        base = uop_field[insn.uop_bgn:insn.uop_end][None, None, :]
        return (base + o * getattr(insn, f"{prefix}_factor_out")
                + i * getattr(insn, f"{prefix}_factor_in")).reshape(-1)

    @staticmethod
    def _has_work(insn) -> bool:
        """Whether a GEMM or ALU loop nest runs at least once."""
        return bool(insn.iter_out and insn.iter_in and insn.uop_end > insn.uop_bgn)

    def _gemm(self, insn: Gemm):
        c = self.config
        if not self._has_work(insn):
            return
        count = insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
        self.stats["gemm_uops"] += count
        if insn.reset_reg:
            dst = self._indices(insn, self.uop_dst, "dst")
            self.acc[dst] = 0
            self.out[dst] = 0
            return
        self.stats["gemm_macs"] += count * c.macs_per_cycle
        if insn.dw:
            self._gemm_dw(insn)
            return
        matmul = self._gemm_as_matmul(insn)
        if matmul is not None:
            self._accumulate(*matmul)
            return
        dst = self._indices(insn, self.uop_dst, "dst")
        src = self._indices(insn, self.uop_src, "src")
        wgt = self._indices(insn, self.uop_wgt, "wgt")
        step = max(1, _CHUNK_ELEMS // (c.batch * c.block_out))
        for start in range(0, len(dst), step):
            part = slice(start, start + step)
            self._accumulate(dst[part], self._gemm_products(src[part], wgt[part]))

    def _gemm_dw(self, insn: Gemm):
        """A depthwise-window GEMM (`vdla.isa.Gemm`'s `dw`): each micro-op's window rows
        (`dw_window`), its lanes' inputs picked from them, times its weight row."""
        c = self.config
        dst = self._indices(insn, self.uop_dst, "dst")
        src = self._indices(insn, self.uop_src, "src")
        wgt = self._indices(insn, self.uop_wgt, "wgt")
        rows = dw_window(src, insn.uop_end - insn.uop_bgn, c)      # (n, T·r)
        taps, r, bi = c.dw_taps, c.dw_column_rows, c.block_in
        n = np.arange(c.block_out)[:, None]
        k = np.arange(bi)[None, :]
        # Columns past 2T multiply the last row read (the window's last row), channel k.
        row = np.where(k < 2 * taps, (k // 2) * r + n // bi, taps * r - 1)  # (bo, bi)
        lane = np.where(k < 2 * taps, (n - n % 2) % bi + k % 2, k)
        step = max(1, _CHUNK_ELEMS // (c.batch * c.block_out * bi))
        for start in range(0, len(dst), step):
            part = slice(start, start + step)
            window = self.inp[rows[part]].transpose(0, 2, 1, 3)    # (m, batch, T·r, bi)
            x = window[:, :, row, lane].astype(np.float32)          # (m, batch, bo, bi)
            w = self.wgt[wgt[part]].astype(np.float32)              # (m, bo, bi)
            products = np.einsum("mbnk,mnk->mbn", x, w)
            self._accumulate(dst[part], products)

    def _gemm_as_matmul(self, insn: Gemm):
        """(dst, products) from one matrix product, when the loop nest is a matrix multiply.

        That is the case when every micro-op of the range has the same dst, src moves only
        with iter_out and wgt only with iter_in (the shape of blocked GEMMs and of
        convolutions): each (o, i) then reduces over the micro-ops' K blocks. None otherwise.
        """
        c = self.config
        uops = slice(insn.uop_bgn, insn.uop_end)
        udst = self.uop_dst[uops]
        n_out, n_in = insn.iter_out, insn.iter_in
        if (insn.src_factor_in or insn.wgt_factor_out or (udst != udst[0]).any()
                or n_out * n_in * c.batch * c.block_out > _CHUNK_ELEMS):
            return None
        o = np.arange(n_out, dtype=np.int64)[:, None]
        i = np.arange(n_in, dtype=np.int64)[:, None]
        src = self.uop_src[uops][None, :] + o * insn.src_factor_out   # (iter_out, uops)
        wgt = self.uop_wgt[uops][None, :] + i * insn.wgt_factor_in    # (iter_in, uops)
        k = (insn.uop_end - insn.uop_bgn) * c.block_in
        # float32 is exact while every partial sum of int8 products stays below 2**24.
        dtype = np.float32 if k * 2**14 < 2**24 else np.float64
        a = self.inp[src].transpose(0, 2, 1, 3).reshape(n_out * c.batch, k).astype(dtype)
        b = self.wgt[wgt].transpose(0, 2, 1, 3).reshape(n_in * c.block_out, k).astype(dtype)
        products = (a @ b.T).reshape(n_out, c.batch, n_in, c.block_out).transpose(0, 2, 1, 3)
        dst = udst[0] + o * insn.dst_factor_out + i.T * insn.dst_factor_in
        return dst.reshape(-1), products.reshape(-1, c.batch, c.block_out)

    def _gemm_products(self, src: np.ndarray, wgt: np.ndarray) -> np.ndarray:
        """inp[src] · wgt[wgt]ᵀ for each micro-op, as float32 (n, batch, block_out)."""
        c = self.config
        uniq_src, src_pos = _unique_inverse(src, c.inp_depth)
        uniq_wgt, wgt_pos = _unique_inverse(wgt, c.wgt_depth)
        if len(uniq_src) * len(uniq_wgt) <= 4 * len(src):
            # Operands reused many times: one BLAS product over the distinct ones, then
            # pick each micro-op's tile.
            a = self.inp[uniq_src].reshape(-1, c.block_in).astype(np.float32)
            b = self.wgt[uniq_wgt].reshape(-1, c.block_in).astype(np.float32)
            table = (a @ b.T).reshape(len(uniq_src), c.batch, len(uniq_wgt), c.block_out)
            return table[src_pos, :, wgt_pos, :]
        a = self.inp[src].astype(np.float32)
        b = self.wgt[wgt].astype(np.float32)
        return np.matmul(a, b.transpose(0, 2, 1))

    def _accumulate(self, dst: np.ndarray, products: np.ndarray):
        """acc[dst] += products (exact integers as floats), with int32 wrap-around; the
        out buffer gets the narrowed results. Repeated destinations add up."""
        c = self.config
        uniq, pos = _unique_inverse(dst, c.acc_depth)
        if len(uniq) == len(dst):
            uniq, total = dst, products.astype(np.int64)
        elif np.abs(products).max() * len(dst) < 2**53:
            # float64 sums of these integers are exact below 2**53: bincount is fastest.
            lanes = c.batch * c.block_out
            keys = (pos[:, None] * lanes + np.arange(lanes)).reshape(-1)
            total = np.bincount(keys, weights=products.reshape(-1), minlength=len(uniq) * lanes)
            total = total.astype(np.int64).reshape(-1, c.batch, c.block_out)
        else:  # sums that could pass 2**53: add as integers (wrapping int64 keeps mod 2**32)
            total = np.zeros((len(uniq), c.batch, c.block_out), dtype=np.int64)
            np.add.at(total, pos, products.astype(np.int64))
        # Adding exact sums modulo 2**32 equals the hardware's sequential int32 wrap.
        result = (self.acc[uniq].astype(np.int64) + total).astype(np.int32)
        self.acc[uniq] = result
        self.out[uniq] = result.astype(np.int8)

    def _alu(self, insn: Alu):
        c = self.config
        if not self._has_work(insn):
            return
        vector = not insn.use_imm and not insn.reset_reg
        dst = self._indices(insn, self.uop_dst, "dst")
        src = self._indices(insn, self.uop_src, "src") if vector else None
        self.stats["alu_uops"] += len(dst)
        if vector and holds_operand(insn, c) and np.isin(src, dst).any():
            # The held operand row is written by the instruction itself: each group of
            # micro-ops uses the row as it was at the group's first micro-op.
            group = len(dst) // insn.iter_out if insn.src_factor_out else len(dst)
            for start in range(0, len(dst), group):
                operand = self.acc[src[start]].copy()
                self._alu_apply_runs(insn, dst[start:start + group], None, operand)
            return
        self._alu_apply_runs(insn, dst, src, None)

    def _alu_apply_runs(self, insn: Alu, dst: np.ndarray, src: np.ndarray | None, held):
        """Apply `insn`'s operation to acc rows `dst` in order: with `src` rows, or the
        `held` operand row, or the immediate (neither)."""
        c = self.config
        for part in _conflict_free_batches(dst, src, c.acc_depth):
            d = dst[part]
            if insn.reset_reg:
                result = np.zeros((len(d), c.batch, c.block_out), dtype=np.int32)
            else:
                if src is not None:
                    operand = self.acc[src[part]]
                elif held is not None:
                    operand = held
                else:
                    operand = np.int64(insn.imm)
                result = _alu_apply(insn.alu_opcode, self.acc[d], operand, insn.use_imm)
            # REQ writes its result to the out buffer and clears the accumulators.
            self.acc[d] = 0 if insn.alu_opcode == AluOp.REQ and not insn.reset_reg else result
            self.out[d] = result.astype(np.int8)


def dw_window(src: np.ndarray, pass_uops: int, config: HardwareConfig) -> np.ndarray:
    """The inp rows in the depthwise window of each micro-op of a `dw` GEMM.

    src : the micro-ops' src indices in issue order, passes of `pass_uops` each
    Returns (len(src), dw_taps · r) row indices, r = `dw_column_rows`: the first micro-op
    of a pass loads rows src .. src + T·r - 1; each later one shifts the window by a
    column and reads its last column at src + (T-1)·r. So column t of micro-op m (in
    its pass) came from micro-op m' = m - (T-1-t) as its last column if m' >= 1, else
    from the pass's full load as its column t + m."""
    taps, r = config.dw_taps, config.dw_column_rows
    passes = src.reshape(-1, pass_uops)                            # (p, u)
    m = np.arange(pass_uops)[:, None]                              # micro-op in its pass
    t = np.arange(taps)[None, :]
    loaded = m - (taps - 1 - t)                                    # (u, T)
    late = np.where(loaded >= 1, passes[:, np.clip(loaded, 0, None)] + (taps - 1) * r,
                    passes[:, :1, None] + (t + m) * r)             # (p, u, T)
    rows = late[..., None] + np.arange(r)                          # (p, u, T, r)
    return rows.reshape(len(src), taps * r)


def holds_operand(insn: Alu, config: HardwareConfig) -> bool:
    """Whether `insn` reads its vector operand once per outer iteration and holds it
    (`HardwareConfig.alu_hold`): a vector ALU instruction with one micro-op whose src
    does not move with the inner loop. With ``src_factor_out == 0`` it reads the row
    once, at its first micro-op."""
    return (config.alu_hold and not insn.use_imm and not insn.reset_reg
            and insn.uop_end - insn.uop_bgn == 1 and insn.src_factor_in == 0)


def _alu_apply(op: AluOp, a: np.ndarray, b, use_imm: bool = True) -> np.ndarray:
    """One ALU operation on int32 lanes with the hardware's wrap-around."""
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


def _conflict_free_batches(dst: np.ndarray, src: np.ndarray | None, depth: int) -> list[slice]:
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
