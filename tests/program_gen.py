"""Seeded random programs for differential testing, with their DRAM data.

`random_program` writes a random but *valid* program and its operands into a device's
DRAM: every SRAM index stays inside its buffer, every DRAM access inside an allocation,
and dependency tokens order every RAW and WAR hazard, so the functional simulator runs
it to FINISH and any backend must produce the same DRAM bytes. It is built like
`vdla.runtime.kernels.BlockedGemm`: a sequence of tiles, each

- load module: LOAD INP and LOAD WGT (1-2 each; random shapes, all four paddings,
  strides past x_size, DRAM bases off bus-word boundaries), then a load->compute token;
- compute module: LOAD UOP (2-D, strided, one per group of instructions, overwriting
  micro-ops already used), an initialisation of the tile's acc region (LOAD ACC with
  padding, or a reset GEMM covering it), then random GEMMs (accumulating or reset, with
  several micro-ops and random loop counts and factors, some shaped as a matrix
  multiply; with ``dw_taps``, half of them depthwise-window GEMMs, whose micro-ops'
  srcs slide by a column or jump, every window inside the tile's inp region), ALU
  instructions (every op of ``config.alu_ops``, immediate or second acc operand,
  read-after-write chains included; DIV by small, large and non-positive divisors, acc
  rows of both signs as dividends; with ``alu_hold``, half the vector ones of the
  shape that holds its operand row) and LOAD ACC over parts of the region; with TAB
  in ``alu_ops``, the first tile loads the whole lookup table first (1-3 strided 2-D
  LOADs of TAB of random 32-bit entries, so the 18 bits an entry keeps matter) and
  later LOADs of TAB overwrite stretches of it;
- store module: STOREs of out elements the tile computed, strided, into DRAM buffers
  pre-filled with random bytes (so a stray or missing write shows).

With two virtual threads, tiles alternate between ping-pong halves of the inp, wgt and
acc/out buffers and only same-thread tiles are ordered by WAR tokens (compute->load,
store->compute), so one thread's loads overlap the other's compute.

Each program reads only SRAM elements it wrote (loads, padding, reset, computed
results): its outcome does not depend on what earlier programs left in the SRAMs, which
lets a long-lived candidate device run it next to a fresh reference.

`deadlock_program` is the opposite: a program whose tokens form a cycle.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Callable, NamedTuple

import numpy as np

from vdla.config import TABLE_ENTRIES, AluOp, HardwareConfig
from vdla.isa import Alu, Gemm, Insn, Load, MemoryType, Program, Store, Uop, encode_uops
from vdla.runtime import COMPUTE, LOAD, STORE, Device, ProgramBuilder

__all__ = ["GeneratedProgram", "random_program", "deadlock_program", "DEADLOCK_WAITS"]

# Size limits, small enough that the functional simulator runs a program in milliseconds.
_REGION_CAP = {MemoryType.INP: 64, MemoryType.WGT: 32, MemoryType.ACC: 64}  # elements per tile
_MAX_PAD = 3       # each of y_pad_0, y_pad_1, x_pad_0, x_pad_1
_MAX_ROWS, _MAX_COLS = 3, 5
_MAX_GAP = 3       # x_stride - x_size
_MAX_LEAD = 3      # elements between an allocation's start and a DRAM base
_NEAR = 8          # most regions start this close to their half's start, so that tiles
                   # of one thread overlap and a missing WAR token would change results
_MAX_UOPS = 4      # micro-ops per GEMM or ALU
_MAX_ITER = 4      # iter_out, iter_in
_MAX_FACTOR = 3    # *_factor_out, *_factor_in


@dataclasses.dataclass(frozen=True)
class GeneratedProgram:
    """A random program whose operands are in a device's DRAM.

    `outputs` are the DRAM buffers its stores write into, as ``(byte address, bytes)``.
    """

    program: Program
    outputs: tuple[tuple[int, int], ...]
    description: str


class _Region(NamedTuple):
    """SRAM elements [base, base + size) of one buffer, all written by the current tile."""

    base: int
    size: int


@dataclasses.dataclass
class _Op:
    """A planned compute instruction; `make` builds it, given uop_bgn and uop_end when it
    has micro-ops (which go into the uop buffer just before it)."""

    make: Callable[..., Insn]
    uops: list[Uop]


def random_program(dev: Device, rng: np.random.Generator, *, n_tiles: int = 4,
                   virtual_threads: int = 1, max_compute_ops: int = 5) -> GeneratedProgram:
    """A random valid program of `n_tiles` tiles on `virtual_threads` (1 or 2) threads,
    with up to `max_compute_ops` GEMM/ALU/LOAD ACC instructions per tile after the acc
    initialisation. Allocates and writes its DRAM on `dev` (the program itself is not
    loaded: ``dev.run(*dev.load_program(generated.program))``)."""
    if virtual_threads not in (1, 2):
        raise ValueError(f"virtual_threads must be 1 or 2, not {virtual_threads}")
    if n_tiles < 1 or max_compute_ops < 0:
        raise ValueError(f"need n_tiles >= 1 and max_compute_ops >= 0, not {n_tiles}, "
                         f"{max_compute_ops}")
    return _Generator(dev, rng, virtual_threads).build(n_tiles, max_compute_ops)


class _Generator:
    def __init__(self, dev: Device, rng: np.random.Generator, threads: int):
        c = dev.config
        self.dev, self.rng, self.c, self.threads = dev, rng, c, threads
        self.half = {MemoryType.INP: c.inp_depth // threads, MemoryType.WGT: c.wgt_depth // threads,
                     MemoryType.ACC: c.acc_depth // threads}
        self.elem_bytes = {MemoryType.UOP: c.uop_bytes, MemoryType.INP: c.inp_elem_bytes,
                           MemoryType.WGT: c.wgt_elem_bytes, MemoryType.ACC: c.acc_elem_bytes,
                           MemoryType.OUT: c.out_elem_bytes, MemoryType.TAB: 4}
        self.alu_ops = sorted(c.alu_ops)
        self.table = AluOp.TAB in c.alu_ops
        self.p = ProgramBuilder(c)
        self.outputs: list[tuple[int, int]] = []

    def _int(self, low: int, high: int) -> int:
        """A random integer in [low, high] (inclusive)."""
        return int(self.rng.integers(low, high + 1))

    def build(self, n_tiles: int, max_ops: int) -> GeneratedProgram:
        p = self.p
        for k in range(n_tiles):
            self._tile(k % self.threads, reused=k >= self.threads,
                       reused_later=k + self.threads < n_tiles, max_ops=max_ops)
        # FINISH waits for the last store (the store module runs in order: for all).
        p.dep_push(STORE, COMPUTE)
        p.dep_pop(STORE, COMPUTE)
        program = p.finish()
        return GeneratedProgram(program, tuple(self.outputs),
                                _describe(program, n_tiles, self.threads))

    # --- one tile -------------------------------------------------------------------------------

    def _tile(self, thread: int, *, reused: bool, reused_later: bool, max_ops: int):
        p = self.p
        # Load: wait until compute is done with this thread's inp/wgt half (WAR).
        if reused:
            p.dep_pop(COMPUTE, LOAD)
        inp = self._fill(MemoryType.INP, thread)
        wgt = self._fill(MemoryType.WGT, thread)
        p.dep_push(LOAD, COMPUTE)

        # Compute: wait for the loads (RAW) and for the store of this half's last tile (WAR).
        p.dep_pop(LOAD, COMPUTE)
        if reused:
            p.dep_pop(STORE, COMPUTE)
        acc, init = self._init_acc(thread)
        out_written = np.zeros(acc.size, bool)  # out elements of the region computed so far
        ops = [init]
        if self.table and not reused:   # the first tile fills the whole table
            ops[:0] = self._fill_table()
        if init.uops:  # a reset GEMM writes zeros to the out buffer too
            out_written[:] = True
        elif self.rng.random() < 0.5:  # random data under the padded LOAD ACC
            ops.insert(0, _Op(functools.partial(self._dma_load, MemoryType.ACC, acc.base,
                                                (1, acc.size, (0, 0, 0, 0))), []))
        for _ in range(self._int(1, max_ops) if max_ops else 0):
            ops.append(self._compute_op(inp, wgt, acc, out_written))
        if not out_written.any():  # give the stores something to read
            ops.append(self._alu(acc, out_written))
        self._emit_compute(ops)
        if reused_later:
            p.dep_push(COMPUTE, LOAD)
        p.dep_push(COMPUTE, STORE)

        # Store: wait for the results (RAW); then free the out half for a later tile.
        p.dep_pop(COMPUTE, STORE)
        self._stores(acc, out_written)
        if reused_later:
            p.dep_push(STORE, COMPUTE)

    def _fill(self, mem: MemoryType, thread: int) -> _Region:
        """1-2 padded LOADs of `mem` into one contiguous region of the thread's half,
        sometimes over random data loaded there first."""
        cap = min(self.half[mem], _REGION_CAP[mem])
        shapes, total = [], 0
        for _ in range(self._int(1, 2)):
            if total >= cap:
                break
            shapes.append(self._shape(cap - total))
            total += _written(shapes[-1])
        region = self._region(thread, mem, total)
        if self.rng.random() < 0.5:  # random data first, so padding that is not written shows
            self.p.append(self._dma_load(mem, region.base, (1, total, (0, 0, 0, 0))))
        at = region.base
        for shape in shapes:
            self.p.append(self._dma_load(mem, at, shape))
            at += _written(shape)
        return region

    def _shape(self, room: int) -> tuple[int, int, tuple[int, ...]]:
        """(y_size, x_size, pads) of a 2-D load writing at most `room` SRAM elements."""
        for _ in range(100):
            rows, cols = self._int(1, _MAX_ROWS), self._int(1, _MAX_COLS)
            pads = tuple(int(x) for x in self.rng.integers(0, _MAX_PAD + 1, size=4))
            if self.rng.random() < 0.3:
                pads = (0, 0, 0, 0)
            shape = (rows, cols, pads)
            if _written(shape) <= room:
                return shape
        return 1, 1, (0, 0, 0, 0)

    def _dma_load(self, mem: MemoryType, sram_base: int, shape) -> Load:
        """A LOAD of `mem` with `shape`, its source rows strided in a new DRAM buffer of
        random data that starts a few elements before the DRAM base."""
        rows, cols, (y0, y1, x0, x1) = shape
        stride, lead = cols + self._int(0, _MAX_GAP), self._int(0, _MAX_LEAD)
        elems = lead + rows * stride
        elem = self.elem_bytes[mem]
        if mem in (MemoryType.ACC, MemoryType.TAB):
            scale = int(self.rng.choice([1 << 7, 1 << 15, 1 << 31]))
            data = self.rng.integers(-scale, scale, size=(elems, elem // 4)).astype(np.int32)
        else:
            data = self.rng.integers(-128, 128, size=(elems, elem), dtype=np.int8)
        addr = self.dev.alloc(data.nbytes)
        self.dev.write(addr, data)
        return Load(memory_type=mem, sram_base=sram_base, dram_base=addr // elem + lead,
                    y_size=rows, x_size=cols, x_stride=stride,
                    y_pad_0=y0, y_pad_1=y1, x_pad_0=x0, x_pad_1=x1)

    def _init_acc(self, thread: int) -> tuple[_Region, _Op]:
        """The tile's acc region and the instruction that writes all of it: a padded LOAD
        ACC, or a reset GEMM whose loop nest covers it exactly (micro-ops permuted)."""
        half = self.half[MemoryType.ACC]
        cap = min(half, _REGION_CAP[MemoryType.ACC])
        if self.rng.random() < 0.5:
            shape = self._shape(cap)
            region = self._region(thread, MemoryType.ACC, _written(shape))
            return region, _Op(functools.partial(self._dma_load, MemoryType.ACC, region.base, shape), [])
        while True:
            n_uops, iter_in, iter_out = (self._int(1, _MAX_UOPS), self._int(1, _MAX_ITER),
                                         self._int(1, _MAX_ITER))
            if n_uops * iter_in * iter_out <= cap:
                break
        region = self._region(thread, MemoryType.ACC, n_uops * iter_in * iter_out)
        uops = [Uop(region.base + int(d), 0, 0) for d in self.rng.permutation(n_uops)]
        return region, _Op(functools.partial(
            Gemm, reset_reg=True, iter_out=iter_out, iter_in=iter_in, dst_factor_in=n_uops,
            dst_factor_out=n_uops * iter_in), uops)

    def _region(self, thread: int, mem: MemoryType, size: int) -> _Region:
        """A region of `size` elements of `mem` in the thread's half: mostly near the
        half's start, sometimes anywhere in it."""
        half = self.half[mem]
        room = half - size if self.rng.random() < 0.25 else min(half - size, _NEAR)
        return _Region(thread * half + self._int(0, room), size)

    # --- compute instructions -------------------------------------------------------------------

    def _fill_table(self) -> list[_Op]:
        """1-3 LOADs of TAB that write every table entry, in order, each a 2-D shape."""
        cuts = sorted(self.rng.choice(np.arange(1, TABLE_ENTRIES), self._int(0, 2),
                                      replace=False).tolist())
        edges = [0, *cuts, TABLE_ENTRIES]
        return [self._table_op(a, b - a) for a, b in zip(edges, edges[1:])]

    def _table_op(self, first: int, count: int) -> _Op:
        """A LOAD of TAB writing entries [first, first + count): rows of a random divisor
        of `count` entries, strided in DRAM (a LOAD of TAB cannot pad)."""
        cols = int(self.rng.choice([d for d in range(1, count + 1) if count % d == 0]))
        shape = (count // cols, cols, (0, 0, 0, 0))
        return _Op(functools.partial(self._dma_load, MemoryType.TAB, first, shape), [])

    def _compute_op(self, inp: _Region, wgt: _Region, acc: _Region, out_written) -> _Op:
        kinds = ["gemm", "gemm", "reset", "alu", "alu", "alu", "load_acc"]
        kind = str(self.rng.choice(kinds + ["load_tab"] if self.table else kinds))
        if kind == "load_tab":   # overwrite a stretch of the table
            count = self._int(1, 48)
            return self._table_op(self._int(0, TABLE_ENTRIES - count), count)
        if kind == "load_acc":  # overwrite part of the region (acc only; out keeps its values)
            shape = self._shape(acc.size)
            base = acc.base + self._int(0, acc.size - _written(shape))
            return _Op(functools.partial(self._dma_load, MemoryType.ACC, base, shape), [])
        if kind == "alu":
            return self._alu(acc, out_written)
        # The depthwise window reads rows past src: only where the inp region has room
        # for a window and a slide of every micro-op (a reset reads no inp: any size).
        c = self.c
        dw = bool(c.dw_taps and self.rng.random() < 0.5 and (
            kind == "reset" or inp.size >= c.dw_window_rows + _MAX_UOPS * c.dw_column_rows))
        fields, uops, dst = self._loop(
            {"dst": acc, "src": inp, "wgt": wgt}, matmul=not dw and self.rng.random() < 0.4,
            window=dw and kind != "reset", slide=dw and self.rng.random() < 0.5)
        out_written[dst - acc.base] = True
        if dw:
            fields["dw"] = True
        return _Op(functools.partial(Gemm, reset_reg=kind == "reset", **fields), uops)

    def _alu(self, acc: _Region, out_written) -> _Op:
        """A random ALU instruction inside the acc region; src may overlap dst (chains)."""
        op = self.alu_ops[self._int(0, len(self.alu_ops) - 1)]
        use_imm = bool(self.rng.random() < 0.5)
        # With alu_hold, half the vector instructions are of the shape that holds its
        # operand row (one micro-op, src fixed in the inner loop), src often inside dst.
        held = self.c.alu_hold and not use_imm and self.rng.random() < 0.5
        fields, uops, dst = self._loop({"dst": acc, "src": acc}, held=held)
        out_written[dst - acc.base] = True
        return _Op(functools.partial(Alu, alu_opcode=op, use_imm=use_imm,
                                     imm=self._imm(op) if use_imm else 0, **fields), uops)

    def _imm(self, op: AluOp) -> int:
        """An immediate for `op`: mostly small, sometimes extreme; SHR amounts of both
        signs, some past the 6-bit amount field."""
        if op == AluOp.SHR:
            return int(self.rng.choice([self._int(-8, 12), self._int(-40, 40)]))
        if op == AluOp.DIV:   # divisors: small and large, and some not positive
            return int(self.rng.choice([self._int(1, 12), self._int(1, 3000), 32767,
                                        self._int(-3, 0), -32768]))
        if self.rng.random() < 0.3:
            return int(self.rng.choice([-32768, 32767, self._int(-32768, 32767)]))
        return self._int(-9, 9) if op == AluOp.MUL else self._int(-300, 300)

    def _loop(self, regions: dict[str, _Region], *, matmul: bool = False, held: bool = False,
              window: bool = False, slide: bool = False):
        """Loop fields and micro-ops keeping each index field inside its region.

        With `matmul`, the shape the functional simulator runs as one matrix product:
        one dst for all micro-ops, src moving only with iter_out and wgt with iter_in.
        With `held`, the shape whose operand an `alu_hold` config holds: one micro-op,
        src fixed by the inner loop.
        With `window`, each src's depthwise window (`dw_window_rows` rows from src) stays
        inside the src region too; with `slide`, each micro-op's src is the previous
        one's plus a column (`dw_column_rows`), the shape of a depthwise convolution's
        row (else srcs are random: the window keeps older columns, the stateful rule).
        Returns (fields, micro-ops, every dst index the loop nest writes).
        """
        n_uops, iter_out, iter_in = (1 if held else self._int(1, _MAX_UOPS),
                                     self._int(1, _MAX_ITER), self._int(1, _MAX_ITER))
        fields = dict(iter_out=iter_out, iter_in=iter_in)
        columns = {"wgt": np.zeros(n_uops, np.int64)}
        for name, region in regions.items():
            f_out, f_in = self._int(0, _MAX_FACTOR), self._int(0, _MAX_FACTOR)
            if (matmul or held) and name == "src":
                f_in = 0
            if matmul and name == "wgt":
                f_out = 0
            # Rows read past the loop's index: the window, and the slide's steps.
            past = 0
            if window and name == "src":
                step = self.c.dw_column_rows if slide else 0
                past = self.c.dw_window_rows - 1 + (n_uops - 1) * step
            reach = (iter_out - 1) * f_out + (iter_in - 1) * f_in
            if reach + past >= region.size:
                f_out = f_in = reach = 0
            count = 1 if (matmul and name == "dst") or past and slide else n_uops
            start = region.base + self.rng.integers(0, region.size - reach - past, size=count)
            if past and slide:
                start = start + np.arange(n_uops) * self.c.dw_column_rows
            columns[name] = np.broadcast_to(start, n_uops)
            fields[f"{name}_factor_out"], fields[f"{name}_factor_in"] = f_out, f_in
        uops = [Uop(int(d), int(s), int(w))
                for d, s, w in zip(columns["dst"], columns["src"], columns["wgt"])]
        dst = (columns["dst"][None, None, :]
               + np.arange(iter_out)[:, None, None] * fields["dst_factor_out"]
               + np.arange(iter_in)[None, :, None] * fields["dst_factor_in"])
        return fields, uops, dst.reshape(-1)

    def _emit_compute(self, ops: list[_Op]):
        """The ops in 1-2 groups, each after a LOAD UOP of its micro-ops (the compute
        module runs in order, so a later group may overwrite the uops of an earlier one)."""
        cut = self._int(1, len(ops))
        for group in (ops[:cut], ops[cut:]):
            uops = [u for op in group for u in op.uops]
            at = self._load_uops(uops) if uops else 0
            for op in group:
                if op.uops:
                    self.p.append(op.make(uop_bgn=at, uop_end=at + len(op.uops)))
                    at += len(op.uops)
                else:
                    self.p.append(op.make())

    def _load_uops(self, uops: list[Uop]) -> int:
        """A strided 2-D LOAD UOP of `uops` to a random place; returns where they start.

        DRAM holds them in rows of x_size with junk micro-ops in the stride gaps (and the
        last row padded with junk), so only a correct 2-D load gets them in order."""
        c = self.c
        cols = self._int(1, len(uops))
        rows = -(-len(uops) // cols)
        stride, lead = cols + self._int(0, _MAX_GAP), self._int(0, _MAX_LEAD)
        table = [self._junk_uop() for _ in range(lead + rows * stride)]
        for index, uop in enumerate(uops):
            table[lead + index // cols * stride + index % cols] = uop
        addr = self.dev.alloc(len(table) * c.uop_bytes)
        self.dev.write(addr, np.frombuffer(encode_uops(table, c), np.uint8))
        sram_base = self._int(0, c.uop_depth - rows * cols)
        self.p.load(MemoryType.UOP, sram_base=sram_base, dram_base=addr // c.uop_bytes + lead,
                    y_size=rows, x_size=cols, x_stride=stride)
        return sram_base

    def _junk_uop(self) -> Uop:
        c = self.c
        return Uop(self._int(0, c.acc_depth - 1), self._int(0, min(c.inp_depth, c.acc_depth) - 1),
                   self._int(0, c.wgt_depth - 1))

    # --- stores ------------------------------------------------------------------------------------

    def _stores(self, acc: _Region, out_written: np.ndarray):
        """1-3 STOREs, each of a contiguous run of computed out elements, as y_size rows
        of x_size with a row stride, into a new DRAM buffer of random bytes."""
        c = self.c
        edges = np.flatnonzero(np.diff(np.concatenate([[0], out_written.view(np.int8), [0]])))
        runs = edges.reshape(-1, 2)  # [start, end) of each run of written elements
        for _ in range(self._int(1, 3)):
            start, end = (int(x) for x in runs[self._int(0, len(runs) - 1)])
            length = self._int(1, end - start)
            start += self._int(0, end - start - length)
            cols = int(self.rng.choice([d for d in range(1, length + 1) if length % d == 0]))
            rows = length // cols
            stride, lead = cols + self._int(0, _MAX_GAP), self._int(0, _MAX_LEAD)
            nbytes = (lead + rows * stride) * c.out_elem_bytes
            addr = self.dev.alloc(nbytes)
            self.dev.write(addr, self.rng.integers(0, 256, size=nbytes, dtype=np.uint8))
            self.outputs.append((addr, nbytes))
            self.p.store(sram_base=acc.base + start, dram_base=addr // c.out_elem_bytes + lead,
                         y_size=rows, x_size=cols, x_stride=stride)


def _written(shape) -> int:
    """SRAM elements a 2-D load of `shape` writes (data and padding)."""
    rows, cols, (y0, y1, x0, x1) = shape
    return (y0 + rows + y1) * (x0 + cols + x1)


def _describe(program: Program, n_tiles: int, threads: int) -> str:
    kinds = collections.Counter()
    for insn in program:
        if isinstance(insn, Load):
            kinds[f"LOAD {insn.memory_type.name}"] += insn.x_size > 0
        elif isinstance(insn, Alu):
            kinds[f"ALU {insn.alu_opcode.name}"] += 1
        elif isinstance(insn, Gemm):
            kinds[("GEMM reset" if insn.reset_reg else "GEMM") + (" dw" if insn.dw else "")] += 1
        elif isinstance(insn, Store):
            kinds["STORE"] += insn.x_size > 0
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()) if n)
    return (f"{n_tiles} tiles on {threads} thread(s), {len(program)} instructions "
            f"for {program.config.name}: {counts}")


#: What `deadlock_program` waits on: (unit, instruction index, queue, reason).
DEADLOCK_WAITS = [("load", 0, "compute->load", "token"),
                  ("compute", 1, "load->compute", "token"),
                  ("store", 2, "compute->store", "token")]


def deadlock_program(config: HardwareConfig) -> Program:
    """A program with balanced tokens that deadlocks: load and compute each pop a token
    only the other pushes (after its own pop), and the store waits on compute.

    0 LOAD (no-op)  pops compute->load, pushes load->compute
    1 LOAD UOP (no-op, compute)  pops load->compute, pushes compute->load and compute->store
    2 STORE (no-op)  pops compute->store, pushes store->compute
    3 FINISH  pops store->compute
    """
    p = ProgramBuilder(config)
    p.dep_pop(COMPUTE, LOAD)
    p.nop(LOAD)
    p.dep_push(LOAD, COMPUTE)
    p.dep_pop(LOAD, COMPUTE)
    p.nop(COMPUTE)
    p.dep_push(COMPUTE, LOAD)
    p.dep_push(COMPUTE, STORE)
    p.dep_pop(COMPUTE, STORE)
    p.nop(STORE)
    p.dep_push(STORE, COMPUTE)
    p.dep_pop(STORE, COMPUTE)
    return p.finish()
