"""Hand-scheduled kernels: a blocked int8 GEMM with requantization.

This is the main job of the foundation (``vdla demo``), the workload of
``bench/functional_sim.py`` and a test of the token protocol with one and two virtual
threads. The compiler's tensorizer (a later issue) generates such programs for any layer;
this one is written by hand, the way VTA's own blocked-GEMM test is.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.config import AluOp, HardwareConfig
from vdla.isa import MemoryType, Program, Uop, encode_uops
from vdla.runtime.builder import ProgramBuilder
from vdla.runtime.device import Device
from vdla.runtime.tokens import PingPong, RegionTokens

__all__ = ["GemmSchedule", "BlockedGemm", "blocked_gemm", "blocked_gemm_reference", "pack_rows",
           "unpack_rows"]


def blocked_gemm_reference(a: np.ndarray, b: np.ndarray, shift: int) -> np.ndarray:
    """What `blocked_gemm` computes, in plain numpy: int8(clip((a · bᵀ) >> shift))."""
    acc = a.astype(np.int64) @ b.astype(np.int64).T
    return np.clip(acc.astype(np.int32) >> shift, -128, 127).astype(np.int8)


def pack_rows(x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """(R, C) → (R/rows, C/cols, rows, cols): the DRAM layout of SRAM-element tiles."""
    r, c = x.shape
    return np.ascontiguousarray(x.reshape(r // rows, rows, c // cols, cols).transpose(0, 2, 1, 3))


def unpack_rows(x: np.ndarray) -> np.ndarray:
    """Inverse of `pack_rows`."""
    rb, cb, rows, cols = x.shape
    return x.transpose(0, 2, 1, 3).reshape(rb * rows, cb * cols)


@dataclasses.dataclass(frozen=True)
class GemmSchedule:
    """Tiling of a blocked GEMM, in SRAM elements.

    tile_m : rows of inp elements (each `batch` rows of A) per tile
    tile_n : blocks of `block_out` output columns per tile
    virtual_threads : 1, or 2 to split the inp, wgt and acc buffers into ping-pong
        halves so one tile's loads overlap the previous tile's compute and store
    """

    tile_m: int
    tile_n: int
    virtual_threads: int = 1

    @classmethod
    def default(cls, config: HardwareConfig, mb: int, kb: int, nb: int,
                virtual_threads: int = 1) -> "GemmSchedule":
        """Largest tiles that fit each thread's share of the buffers."""
        inp, wgt, acc = (d // virtual_threads for d in (config.inp_depth, config.wgt_depth,
                                                        config.acc_depth))
        tile_n = max(1, min(nb, wgt // kb))
        tile_m = max(1, min(mb, inp // kb, acc // tile_n))
        return cls(tile_m, tile_n, virtual_threads)


class BlockedGemm:
    """``int8(clip((a · bᵀ) >> shift))`` as a program on `dev`, ready to run.

    `a` is int8 (M, K), `b` int8 (N, K); M, K and N are padded with zeros to multiples of
    batch, block_in and block_out. The whole K dimension is reduced inside one tile.
    Construction writes the operands, micro-ops and program into the device's DRAM;
    `run` executes it (as often as wanted), `result` reads C back, `free` releases DRAM.
    """

    def __init__(self, dev: Device, a: np.ndarray, b: np.ndarray, *, shift: int = 0,
                 schedule: GemmSchedule | None = None, virtual_threads: int = 1):
        c = dev.config
        a, b = np.asarray(a), np.asarray(b)
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
            raise ValueError(f"blocked GEMM needs a (M, K) and b (N, K); got {a.shape} and "
                             f"{b.shape}")
        if a.dtype != np.int8 or b.dtype != np.int8:
            raise ValueError(f"blocked GEMM takes int8 operands, not {a.dtype} and {b.dtype}")
        if not 0 <= shift <= 31:
            raise ValueError(f"shift must be in 0..31, not {shift}")
        self.dev, self.shift, self.shape = dev, shift, (a.shape[0], b.shape[0])
        m, k = a.shape
        n = b.shape[0]
        self.blocks = mb, kb, nb = -(-m // c.batch), -(-k // c.block_in), -(-n // c.block_out)
        a_pad = np.zeros((mb * c.batch, kb * c.block_in), np.int8)
        a_pad[:m, :k] = a
        b_pad = np.zeros((nb * c.block_out, kb * c.block_in), np.int8)
        b_pad[:n, :k] = b
        self.schedule = schedule or GemmSchedule.default(c, mb, kb, nb, virtual_threads)
        _check_fits(c, self.schedule, kb)
        # The SRAM region each virtual thread owns (its ping-pong half, or all of it).
        threads = self.schedule.virtual_threads
        self._inp, self._wgt, self._acc = (PingPong(d // threads, threads)
                                           for d in (c.inp_depth, c.wgt_depth, c.acc_depth))

        # DRAM: A and B in SRAM-element tiles, C as out elements, and the micro-op table.
        self._addrs = []
        try:
            a_addr = self._put(pack_rows(a_pad, c.batch, c.block_in))
            b_addr = self._put(pack_rows(b_pad, c.block_out, c.block_in))
            self._c_bytes = mb * nb * c.out_elem_bytes
            self._c_addr = self._alloc(self._c_bytes)
            uops, kernels = self._uop_kernels(kb)
            uop_addr = self._put(np.frombuffer(encode_uops(uops, c), np.uint8))
            self.program = self._build(a_addr, b_addr, uop_addr, len(uops), kernels)
            self._insn_addr, self._insn_count = dev.load_program(self.program)
            self._addrs.append(self._insn_addr)
        except BaseException as exc:
            self._free_after(exc)  # leave the device's DRAM as it was
            raise

    def _alloc(self, nbytes: int) -> int:
        addr = self.dev.alloc(nbytes)
        self._addrs.append(addr)
        return addr

    def _put(self, array: np.ndarray) -> int:
        addr = self._alloc(array.nbytes)
        self.dev.write(addr, array)
        return addr

    def _uop_kernels(self, kb: int):
        threads = self.schedule.virtual_threads
        inp, wgt, acc = self._inp, self._wgt, self._acc
        uops, kernels = [], []
        for t in range(threads):
            # Per thread: kb GEMM micro-ops (one per K block), one reset, one ALU micro-op.
            gemm_bgn = len(uops)
            uops += [Uop(acc.base(t), inp.base(t) + kk, wgt.base(t) + kk) for kk in range(kb)]
            reset = len(uops)
            uops.append(Uop(acc.base(t), 0, 0))
            alu = len(uops)
            uops.append(Uop(acc.base(t), acc.base(t), 0))
            kernels.append((gemm_bgn, reset, alu))
        return uops, kernels

    def _build(self, a_addr, b_addr, uop_addr, n_uops, kernels) -> Program:
        c, sched = self.dev.config, self.schedule
        mb, kb, nb = self.blocks
        threads = sched.virtual_threads
        p = ProgramBuilder(c)
        tokens = RegionTokens(p)
        p.load(MemoryType.UOP, sram_base=0, dram_base=uop_addr // c.uop_bytes, y_size=1,
               x_size=n_uops, x_stride=n_uops)
        tiles = [(m0, n0) for m0 in range(0, mb, sched.tile_m) for n0 in range(0, nb, sched.tile_n)]
        for index, (m0, n0) in enumerate(tiles):
            t = index % threads                       # the thread, and its buffer regions
            tm, tn = min(sched.tile_m, mb - m0), min(sched.tile_n, nb - n0)
            gemm_bgn, reset, alu = kernels[t]

            # Load into this thread's inp/wgt regions once compute has read them (WAR).
            tokens.load_into(("inp", t))
            p.load(MemoryType.INP, sram_base=self._inp.base(t),
                   dram_base=a_addr // c.inp_elem_bytes + m0 * kb, y_size=tm, x_size=kb,
                   x_stride=kb)
            p.load(MemoryType.WGT, sram_base=self._wgt.base(t),
                   dram_base=b_addr // c.wgt_elem_bytes + n0 * kb, y_size=tn, x_size=kb,
                   x_stride=kb)
            tokens.loaded()

            # Compute once the loads are in (RAW) and this thread's acc/out region is
            # stored (WAR).
            tokens.wait_loaded()
            tokens.compute_into(("acc", t))
            loops = dict(iter_out=tm, iter_in=tn, dst_factor_out=tn, dst_factor_in=1)
            p.gemm(reset_reg=True, uop_bgn=reset, uop_end=reset + 1, **loops)
            p.gemm(uop_bgn=gemm_bgn, uop_end=gemm_bgn + kb, src_factor_out=kb, wgt_factor_in=kb,
                   **loops)
            tokens.read(("inp", t))
            flat = dict(uop_bgn=alu, uop_end=alu + 1, iter_out=tm * tn, iter_in=1,
                        dst_factor_out=1, src_factor_out=1, use_imm=True)
            if self.shift:
                p.alu(AluOp.SHR, imm=self.shift, **flat)
            p.alu(AluOp.MIN, imm=127, **flat)
            p.alu(AluOp.MAX, imm=-128, **flat)
            tokens.computed()

            # Store once the results are in (RAW).
            tokens.wait_computed()
            p.store(sram_base=self._acc.base(t),
                    dram_base=self._c_addr // c.out_elem_bytes + m0 * nb + n0,
                    y_size=tm, x_size=tn, x_stride=nb)
            tokens.stored(("acc", t))
        return tokens.finish()

    def run(self) -> dict:
        """Run the program; returns the device's statistics."""
        return self.dev.run(self._insn_addr, self._insn_count)

    def result(self) -> np.ndarray:
        """C as int8 (M, N)."""
        c = self.dev.config
        mb, _, nb = self.blocks
        raw = self.dev.read(self._c_addr, self._c_bytes).view(np.int8)
        rows = unpack_rows(raw.reshape(mb, nb, c.batch, c.block_out))
        return rows[:self.shape[0], :self.shape[1]]

    def free(self):
        for addr in self._addrs:
            self.dev.free(addr)
        self._addrs = []

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            self.free()
        else:
            self._free_after(exc)

    def _free_after(self, exc: BaseException) -> None:
        """`free` while `exc` propagates. Where freeing fails too (a remote device whose
        connection broke with `exc`), `exc` stays the error reported, with a note that
        says so: the first error says what went wrong."""
        try:
            self.free()
        except Exception as again:
            exc.add_note(f"freeing the GEMM's device memory failed too: {again}")


def blocked_gemm(dev: Device, a: np.ndarray, b: np.ndarray, *, shift: int = 0,
                 schedule: GemmSchedule | None = None,
                 virtual_threads: int = 1) -> tuple[np.ndarray, dict, Program]:
    """Run ``int8(clip((a · bᵀ) >> shift))`` on `dev` once; returns (C, stats, program)."""
    with BlockedGemm(dev, a, b, shift=shift, schedule=schedule,
                     virtual_threads=virtual_threads) as gemm:
        stats = gemm.run()
        return gemm.result(), stats, gemm.program


def _check_fits(c: HardwareConfig, s: GemmSchedule, kb: int):
    if s.virtual_threads not in (1, 2):
        raise ValueError(f"virtual_threads must be 1 or 2, not {s.virtual_threads}")
    if s.tile_m < 1 or s.tile_n < 1:
        raise ValueError(f"tile_m and tile_n must be positive, not {s.tile_m}, {s.tile_n}")
    t = s.virtual_threads
    needs = {"inp": (s.tile_m * kb, c.inp_depth // t), "wgt": (s.tile_n * kb, c.wgt_depth // t),
             "acc": (s.tile_m * s.tile_n, c.acc_depth // t)}
    over = {name: v for name, v in needs.items() if v[0] > v[1]}
    if over:
        detail = ", ".join(f"{name} needs {need} elements, {have} available per thread"
                           for name, (need, have) in over.items())
        raise ValueError(f"GEMM tile {s.tile_m}x{s.tile_n} (K = {kb} blocks) with "
                         f"{t} virtual thread(s) does not fit config {c.name}: {detail}")
