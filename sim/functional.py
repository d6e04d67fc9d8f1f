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

Work inside an instruction is vectorized over all its micro-ops, with no Python per
micro-op. A GEMM whose micro-ops form a matrix product (a convolution's: a group of taps
per output pixel, the same weight taps in every group; a blocked GEMM's) runs as one
BLAS product over gathered operands (`vdla.sim.functional_plan.plan_gemm`), in float32
while every partial sum of int8 products stays below 2**24 (exact), else float64. Any
other GEMM takes one float32 product over the distinct inputs and weights it touches,
accumulated per destination with ``np.bincount`` in float64 (exact). Sums are added to
the accumulators modulo 2**32, which equals the hardware's sequential int32 wrap-around.
ALU micro-ops are applied in conflict-free runs so read-after-write chains inside one
instruction (pooling, reductions) keep their sequential meaning (`vdla.sim.functional_alu`).

A compiled model runs the same loop nests over the same micro-ops once per tile, so the
index work of each (its plan) is cached, keyed by the loop nest and its micro-ops
(`vdla.sim.functional_plan.PlanCache`); each distinct instruction word is decoded once
(`vdla.sim.protocol.fetch_program`, for every backend). Performance notes, measured
on ResNet-18's 23 programs: numpy's ``take`` and 1-D record scatters move SRAM rows
several times faster than fancy indexing on 3-D arrays, and BLAS runs on one thread
(`_OneBlasThread`).
"""

from __future__ import annotations

import collections
import threading
from typing import Sequence

import numpy as np
from threadpoolctl import ThreadpoolController

from vdla.config import TABLE_ENTRIES, AluOp, HardwareConfig
from vdla.isa import INSN_BYTES, Alu, Gemm, Insn, Load, MemoryType, Store, memory_geometry
from vdla.sim.functional_alu import alu_apply, alu_runs, holds_operand, table_entries
from vdla.sim.functional_plan import (AluPlan, GemmPlan, PlanCache, loop_indices, plan_alu,
                                      plan_gemm)
from vdla.sim.protocol import fetch_program
from vdla.sim.validate import ProgramValidator, decode_uops

__all__ = ["FunctionalSimulator", "dw_window", "holds_operand"]

# Elements per batch of products: bounds the memory of temporary arrays.
_CHUNK_ELEMS = 1 << 22


class _OneBlasThread:
    """Context manager: numpy's BLAS on one thread while a program runs (nested and
    concurrent uses share one setting; the last to leave restores it).

    The products here are small (a tile: hundreds of rows), and OpenBLAS's worker
    threads spin after every call: on this project's shared 2-core machines, with the
    other core busy, two threads ran ResNet-18's 23 programs about eight times slower
    than one (14.6 s against 1.8 s, before the plans of `vdla.sim.functional_plan`);
    on an idle machine two threads gain nothing on products of this size.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._users = 0
        self._libraries = None
        self._saved: list[int] = []

    def __enter__(self):
        with self._lock:
            if self._users == 0:
                if self._libraries is None:
                    self._libraries = _blas_libraries()
                self._saved = [lib.num_threads for lib in self._libraries]
                for lib in self._libraries:
                    lib.set_num_threads(1)
            self._users += 1
        return self

    def __exit__(self, *exc):
        with self._lock:
            self._users -= 1
            if self._users == 0:
                for lib, threads in zip(self._libraries, self._saved):
                    lib.set_num_threads(threads)


def _blas_libraries() -> list:
    """threadpoolctl's controllers of the BLAS libraries loaded (found once: looking
    takes about 2 ms)."""
    return ThreadpoolController().select(user_api="blas").lib_controllers


_ONE_BLAS_THREAD = _OneBlasThread()


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
        geometry = memory_geometry(c)
        self._elem_bytes = {mem: size for mem, (size, _) in geometry.items()}
        depths = {mem: depth for mem, (_, depth) in geometry.items()}
        # Each SRAM is raw bytes (what DMA moves) with a typed view (what compute uses).
        self.sram = {m: np.zeros((depths[m], self._elem_bytes[m]), dtype=np.uint8)
                     for m in MemoryType}
        self.inp = self.sram[MemoryType.INP].view(np.int8).reshape(-1, c.batch, c.block_in)
        self.wgt = self.sram[MemoryType.WGT].view(np.int8).reshape(-1, c.block_out, c.block_in)
        self.acc = self.sram[MemoryType.ACC].view("<i4").reshape(-1, c.batch, c.block_out)
        self.out = self.sram[MemoryType.OUT].view(np.int8).reshape(-1, c.batch, c.block_out)
        # acc and out rows as single void records: numpy scatters a 1-D array of records
        # several times faster than rows of a 3-D array (np.take does the same for gathers).
        self._acc_rows = _records(self.sram[MemoryType.ACC])
        self._out_rows = _records(self.sram[MemoryType.OUT])
        # The ALU's lookup table as TAB reads it (`table_entries`), refreshed by a LOAD.
        self.table = np.zeros(TABLE_ENTRIES, dtype=np.int32)
        # Micro-ops decoded once when loaded, as index arrays.
        self.uop_dst = np.zeros(c.uop_depth, dtype=np.int64)
        self.uop_src = np.zeros(c.uop_depth, dtype=np.int64)
        self.uop_wgt = np.zeros(c.uop_depth, dtype=np.int64)
        self.validator = ProgramValidator(config)
        self._dram_views: dict = {}   # DRAM as elements of each memory type
        self._load_stat = {m: f"load_bytes_{m.name.lower()}" for m in MemoryType}
        # Index plans of the loop nests run so far (`vdla.sim.functional_plan`).
        self.plans = PlanCache()

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
        with _ONE_BLAS_THREAD:
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

    def _dram_block(self, insn, memory_type: MemoryType, *, writeable: bool = False):
        """The (y_size, x_size, element bytes) block of a LOAD or STORE as a strided
        view of DRAM, which costs no index array; None when rows overlap in a block to be
        written (then writes must land in order) or the block is not inside DRAM."""
        view = self._dram_view(memory_type)
        y, x, stride = insn.y_size, insn.x_size, insn.x_stride
        if y < 1 or (writeable and y > 1 and stride < x):
            return None  # no rows (a LOAD of padding only), or rows that overlap
        start = insn.dram_base
        if stride >= x and start + y * stride <= len(view):
            # Whole rows of the stride fit: a reshape and a slice, no strides to build.
            return view[start:start + y * stride].reshape(y, stride, -1)[:, :x]
        stop = start + (y - 1) * stride + x
        part = view[start:stop]
        if len(part) != stop - start:
            return None
        step, byte = part.strides
        return np.lib.stride_tricks.as_strided(part, (y, x, view.shape[1]),
                                               (stride * step, step, byte),
                                               writeable=writeable)

    def _dram_view(self, memory_type: MemoryType) -> np.ndarray:
        view = self._dram_views.get(memory_type)
        if view is None:
            elem = self._elem_bytes[memory_type]
            view = self._dram_views[memory_type] = self.dram[
                :len(self.dram) // elem * elem].reshape(-1, elem)
        return view

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
        data = self._dram_block(insn, mem)
        if data is None:
            data = self._dram_view(mem)[self._dram_elements(insn)]
        block = sram[insn.sram_base:end].reshape(rows, width, -1)
        if rows != insn.y_size or width != insn.x_size:
            block[...] = 0  # padding
        block[insn.y_pad_0:insn.y_pad_0 + insn.y_size,
              insn.x_pad_0:insn.x_pad_0 + insn.x_size] = data
        if mem == MemoryType.UOP:
            self._decode_uops(insn.sram_base, end)
        elif mem == MemoryType.TAB:
            self.table = table_entries(self.sram[MemoryType.TAB].view("<i4"))
        nbytes = insn.y_size * insn.x_size * self._elem_bytes[mem]
        self.stats[self._load_stat[mem]] += nbytes
        self.stats["dram_bytes_read"] += nbytes

    def _decode_uops(self, begin: int, end: int):
        (self.uop_dst[begin:end], self.uop_src[begin:end],
         self.uop_wgt[begin:end]) = decode_uops(self.sram[MemoryType.UOP][begin:end], self.config)

    def _store(self, insn: Store):
        if insn.x_size == 0 or insn.y_size == 0:
            return  # nothing to write (stores have no padding)
        count = insn.y_size * insn.x_size
        end = insn.sram_base + count
        data = self.sram[MemoryType.OUT][insn.sram_base:end].reshape(insn.y_size, insn.x_size, -1)
        block = self._dram_block(insn, MemoryType.OUT, writeable=True)
        if block is None:
            self._dram_view(MemoryType.OUT)[self._dram_elements(insn)] = data
        else:
            block[...] = data
        nbytes = count * self._elem_bytes[MemoryType.OUT]
        self.stats["store_bytes_out"] += nbytes
        self.stats["dram_bytes_written"] += nbytes

    @staticmethod
    def _has_work(insn) -> bool:
        """Whether a GEMM or ALU loop nest runs at least once."""
        return bool(insn.iter_out and insn.iter_in and insn.uop_end > insn.uop_bgn)

    def _plan(self, insn, make):
        """The cached plan of `insn` over the micro-ops it reads now, made by
        ``make(insn)`` on a miss (None is a plan too: "no fast path")."""
        # The key is what a plan is made from: the loop nest (not the flags, the ALU
        # opcode or immediate) and the decoded micro-ops, so a LOAD that changes them
        # (or anything else that does) misses.
        if isinstance(insn, Gemm):
            kind = ("gemm", insn.dw, insn.wgt_factor_out, insn.wgt_factor_in)
        else:
            kind = ("alu", insn.use_imm)
        uops = slice(insn.uop_bgn, insn.uop_end)
        key = (kind, insn.reset_reg, insn.uop_bgn, insn.uop_end, insn.iter_out, insn.iter_in,
               insn.dst_factor_out, insn.dst_factor_in, insn.src_factor_out,
               insn.src_factor_in, self.uop_dst[uops].tobytes(), self.uop_src[uops].tobytes(),
               self.uop_wgt[uops].tobytes())
        return self.plans.lookup(key, lambda: make(insn))

    def _gemm(self, insn: Gemm):
        c = self.config
        if not self._has_work(insn):
            return
        count = insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
        self.stats["gemm_uops"] += count
        if insn.reset_reg:
            for rows, _, n in self._plan(insn, self._reset_plan).runs:
                zeros = np.zeros((n, c.batch, c.block_out), dtype=np.int32)
                self._write_acc(rows, zeros, zeros.astype(np.int8))
            return
        self.stats["gemm_macs"] += count * c.macs_per_cycle
        if insn.dw:
            self._gemm_dw(insn)
            return
        plan = self._plan(insn, self._matmul_plan)
        if plan is not None:
            self._gemm_planned(plan)
            return
        dst = loop_indices(insn, self.uop_dst, "dst")
        src = loop_indices(insn, self.uop_src, "src")
        wgt = loop_indices(insn, self.uop_wgt, "wgt")
        step = max(1, _CHUNK_ELEMS // (c.batch * c.block_out))
        for start in range(0, len(dst), step):
            part = slice(start, start + step)
            self._accumulate(dst[part], self._gemm_products(src[part], wgt[part]))

    def _reset_plan(self, insn) -> AluPlan:
        dst = loop_indices(insn, self.uop_dst, "dst")
        return AluPlan(dst, None, alu_runs(dst, None, self.config.acc_depth))

    def _matmul_plan(self, insn: Gemm) -> GemmPlan | None:
        uops = slice(insn.uop_bgn, insn.uop_end)
        return plan_gemm(insn, self.uop_dst[uops], self.uop_src[uops], self.uop_wgt[uops],
                         self.config)

    def _gemm_planned(self, plan: GemmPlan):
        """Run a GEMM as the matrix product `plan` describes (`plan_gemm`)."""
        c = self.config
        nb, rows, cols, taps = plan.batches, plan.rows, plan.cols, plan.taps
        k = taps * c.block_in
        dtype = np.float32 if plan.exact32 else np.float64
        a = _take(self.inp, plan.src).astype(dtype).reshape(nb, rows, taps, c.batch, c.block_in)
        b = _take(self.wgt, plan.wgt).astype(dtype).reshape(nb, cols, taps, c.block_out,
                                                             c.block_in)
        if c.batch > 1:
            a = a.transpose(0, 1, 3, 2, 4)
        a = a.reshape(nb, rows * c.batch, k)
        b = b.transpose(0, 1, 3, 2, 4).reshape(nb, cols * c.block_out, k)
        products = a[0] @ b[0].T if nb == 1 else a @ b.transpose(0, 2, 1)
        products = products.reshape(nb, rows, c.batch, cols, c.block_out)
        if c.batch > 1:
            products = products.transpose(0, 1, 3, 2, 4)
        # (products, repeat, batch, block_out): the loops that move neither operand add
        # the same product to `repeat` rows each.
        products = products.reshape(-1, 1, c.batch, c.block_out)
        if not plan.distinct:
            products = np.broadcast_to(products, (len(products), plan.repeat) + products.shape[2:])
            self._accumulate(plan.dst, products.reshape(-1, c.batch, c.block_out))
            return
        dst, repeat = plan.dst, plan.repeat
        if plan.order is not None:
            products = np.broadcast_to(products, (len(products), repeat) + products.shape[2:])
            products = products.reshape(-1, c.batch, c.block_out).take(plan.order, axis=0)
            products, repeat = products.reshape(-1, 1, c.batch, c.block_out), 1
        acc = _take(self.acc, dst).reshape(-1, repeat, c.batch, c.block_out)
        # Sums modulo 2**32 (uint32 arithmetic wraps) equal the hardware's sequential
        # int32 wrap; float32 products are below 2**24, so they convert exactly.
        if plan.exact32:
            result = (acc.view(np.uint32) + products.astype(np.int32).view(np.uint32)).view(
                np.int32)
        else:
            result = (acc.astype(np.int64) + products.astype(np.int64)).astype(np.int32)
        result = result.reshape(-1, c.batch, c.block_out)
        self._write_acc(dst, result, result.astype(np.int8))

    def _write_acc(self, rows, acc: np.ndarray, out: np.ndarray):
        """acc[rows] = `acc` and out[rows] = `out` (int32 and int8 arrays of the rows'
        shape); `rows` is a slice or distinct row indices."""
        if isinstance(rows, slice):
            self.acc[rows] = acc
            self.out[rows] = out
            return
        n = len(rows)
        self._acc_rows[rows] = np.ascontiguousarray(acc).reshape(n, -1).view(
            self._acc_rows.dtype).reshape(n)
        self._out_rows[rows] = np.ascontiguousarray(out).reshape(n, -1).view(
            self._out_rows.dtype).reshape(n)

    def _gemm_dw(self, insn: Gemm):
        """A depthwise-window GEMM (`vdla.isa.Gemm`'s `dw`): each micro-op's window rows
        (`dw_window`), its lanes' inputs picked from them, times its weight row."""
        c = self.config
        dst = loop_indices(insn, self.uop_dst, "dst")
        src = loop_indices(insn, self.uop_src, "src")
        wgt = loop_indices(insn, self.uop_wgt, "wgt")
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
        result = (_take(self.acc, uniq).astype(np.int64) + total).astype(np.int32)
        self._write_acc(uniq, result, result.astype(np.int8))

    def _alu(self, insn: Alu):
        if not self._has_work(insn):
            return
        plan = self._plan(insn, self._alu_plan)
        self.stats["alu_uops"] += len(plan.dst)
        if plan.runs is None:
            # The held operand row is written by the instruction itself: each group of
            # micro-ops uses the row as it was at the group's first micro-op.
            for runs, row in plan.held:
                self._alu_apply_runs(insn, runs, self.acc[row].copy())
            return
        self._alu_apply_runs(insn, plan.runs, None)

    def _alu_plan(self, insn: Alu) -> AluPlan:
        return plan_alu(insn, self.uop_dst, self.uop_src, self.config)

    def _alu_apply_runs(self, insn: Alu, runs: list, held):
        """Apply `insn`'s operation to the acc rows of each run in order (`alu_runs`): with
        the run's src rows, or the `held` operand row, or the immediate (neither)."""
        c = self.config
        reset = insn.reset_reg
        req = insn.alu_opcode == AluOp.REQ and not reset
        for d, s, n in runs:
            if reset:
                result = np.zeros((n, c.batch, c.block_out), dtype=np.int32)
            else:
                if s is not None:
                    operand = _take(self.acc, s)
                elif held is not None:
                    operand = held
                else:
                    operand = insn.imm
                result = alu_apply(insn.alu_opcode, _take(self.acc, d), operand, insn.use_imm,
                                   self.table)
            # REQ writes its result to the out buffer and clears the accumulators.
            self._write_acc(d, np.zeros_like(result) if req else result, result.astype(np.int8))


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


def _records(sram: np.ndarray) -> np.ndarray:
    """A 1-D view of an SRAM's (depth, row bytes) array with one void record per row."""
    return sram.view(f"V{sram.shape[1]}").reshape(-1)


def _take(table: np.ndarray, rows) -> np.ndarray:
    """table[rows] for a slice or an index array (np.take: faster than fancy indexing)."""
    return table[rows] if isinstance(rows, slice) else table.take(rows, axis=0)


