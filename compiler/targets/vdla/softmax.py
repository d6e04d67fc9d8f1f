"""The integer softmax down the rows of a transposed score matrix on the vector ALU.

A ``qsoftmax`` with axis -2 over an int8 (T, S) sequence (T keys down the rows, S
queries across: ``s^T``, which ``k @ q^T`` gives) is laid out as the image of its rows,
``[S/L][T][L]`` (`vdla.compiler.targets.vdla.sequence`): each of the S/L query blocks
is T consecutive rows of L lanes, one query a lane. Every reduction of the softmax is
then over the rows, lane by lane, which is what the ALU does; and the definition's steps
(`vdla.compiler.reference.integer_transformer`, qsoftmax) map onto it exactly, on a
config with the ALU's lookup table (TAB) and divide (DIV):

    m = max over rows of x              # ADD the first row into a cleared row, MAX the rest
    e = exp(x - m)                      # TAB by the row m: entry m - x holds exp2_neg(-(m-x) c)
    s = sum over rows of e              # ADD every row into a cleared row
    h = s >> 1                          # ADD s into a cleared row, SHR 1
    p = min(((e << k) + h) // s, 127)   # SHR by -k, ADD h, DIV by s

Per query block (a tile) the load module brings its T rows (one DMA: they are
consecutive), the compute module clears the tile's acc rows (which also zeroes their out
rows), widens the rows into the accumulators on the GEMM core with an identity weight
block, runs the passes above and the store module writes the T out rows back. With
``causal`` (keys t > query s + (T - S) excluded, T >= S), a query block's rows past its
last query's diagonal are left cleared (their probabilities are 0) and are neither
loaded nor computed; the L - 1 rows its diagonal crosses are masked lane by lane with
two constant row sets: MIN by 127 or -128 before the maximum (an excluded score cannot
raise it) and MIN by 2**20 or 0 after the exponential (an excluded one adds nothing),
so the result is the definition's, where an excluded position's probability is
``(s >> 1) // s = 0``.

Tiles alternate between two inp windows and two acc/out regions (`PingPong`), so the
next block's load and the previous one's store overlap this one's passes; tokens as in
`vdla.compiler.targets.vdla.elementwise`. The program first loads its micro-ops, the
mask rows, the identity block and the exponentials' table.

The passes with a held operand row (TAB by m, ADD h, DIV by s) take one issue slot a
micro-op on a config with ``alu_hold``; the reductions (MAX, ADD into one row) read a
moving row and take two. `estimate_softmax` counts them, the DIV's own cycles
(`div_cycles`), and the DMAs, per tile as the elementwise ops' model does.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference.integer_transformer import exp_table
from vdla.compiler.targets.vdla.common import (INSN_CYCLES, KernelTable, check_array,
                                               dense_dma, dma_cycles, layout_arena,
                                               load_tables, overflow_detail, pack_activation,
                                               start_lowering, store_cycles,
                                               vector_pass_cycles)
from vdla.compiler.targets.vdla.elementwise import (ElementwiseLayer, LoweredElementwise,
                                                    run_elementwise)
from vdla.compiler.targets.vdla.sequence import pixel_rows
from vdla.compiler.targets.vdla.table import (TAB_ENTRY_BYTES, load_table,
                                              table_load_cycles)
from vdla.config import DIV_MAX, TABLE_ENTRIES, AluOp, HardwareConfig
from vdla.isa import Program, Uop, encode_uops
from vdla.runtime.builder import ProgramBuilder
from vdla.runtime.tokens import PingPong, RegionTokens

__all__ = ["SoftmaxLayer", "SoftmaxSchedule", "choose_softmax", "div_cycles",
           "estimate_softmax", "lower_softmax", "run_softmax", "softmax_entries",
           "softmax_layer", "softmax_problem"]

#: The scratch rows after a tile's T rows: the maximum, the sum, half the sum.
_SCRATCH = 3
#: What the mask after the exponential keeps (above any exponential, 2**16).
_KEEP = 1 << 20


def div_cycles(config: HardwareConfig, held: bool = True) -> int:
    """Issue cycles of one DIV micro-op: its divider finds the saturation test and 7
    quotient bits a cycle each, and the next DIV starts 10 cycles after it, 11 when it
    reads a moving operand row (measured by the compute module's cocotb test: 10 N + 8
    by an immediate, 11 N + 7 by rows, 10 N + 7 plus a read of a held row). With the
    pipelined divider (``div_pipeline``) DIVs on distinct rows issue as other ALU
    micro-ops: 1 by a held row, 2 by moving rows (N + 16, 2 N + 15; `div_fill_cycles`)."""
    if config.div_pipeline:
        return 1 if held and config.alu_hold else 2
    return DIV_MAX.bit_length() + 3 + (0 if held and config.alu_hold else 1)


def div_fill_cycles(config: HardwareConfig) -> int:
    """Cycles a DIV instruction takes past its micro-ops' issue and an ALU instruction's
    fixed cost: the pipelined divider's 8 steps after the last micro-op's write stage
    (0 for the sequential one, whose steps `div_cycles` counts)."""
    return DIV_MAX.bit_length() + 1 if config.div_pipeline else 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class SoftmaxLayer(ElementwiseLayer):
    """A qsoftmax down the rows as the elementwise family sees it (one int8 operand, a
    sequence of `h` = T rows and `c` = S channels, `blocks` = S / L query blocks), with
    `prob_bits` k and `causal`."""

    prob_bits: int = 7
    causal: bool = False
    masked: bool = False
    keys: int | None = None

    @property
    def region_rows(self) -> int:
        """Acc rows of a tile: its T rows, the scratch rows, the mask's T rows."""
        return self.h + _SCRATCH + (self.h if self.masked else 0)

    def kept_rows(self, block: int) -> int:
        """Rows query block `block` reads: the first `keys` (all T when None), and with
        causal only those up to its last query's diagonal."""
        keys = self.h if self.keys is None else self.keys
        if not self.causal:
            return keys
        return min(keys, (block + 1) * self.c_block + (self.h - self.c))

    @property
    def c_block(self) -> int:
        """Queries per block (lanes), as the layer was built."""
        return self.c // self.blocks

    def diagonal(self, block: int) -> tuple[int, int]:
        """(first masked row, masked rows) of query block `block`: the rows its
        diagonal crosses after its first query's own (none without causal)."""
        n = self.kept_rows(block)
        if not self.causal:
            return n, 0
        first = block * self.c_block + (self.h - self.c) + 1
        return first, max(0, n - first)


@dataclasses.dataclass(frozen=True)
class SoftmaxSchedule:
    """One query block a tile: there is nothing to choose yet (a tile's rows are all the
    keys, which the reductions need together)."""

    def clamped(self, layer) -> "SoftmaxSchedule":
        return self

    def needs(self, layer: SoftmaxLayer, config: HardwareConfig, uops: bool = True) -> dict:
        need = {"inp": (2 * layer.h * layer.operands, config.inp_depth),
                "acc": (2 * layer.region_rows + layer.const_rows, config.acc_depth),
                "out": (2 * layer.region_rows, config.out_depth),
                "wgt": (1, config.wgt_depth)}
        if uops:
            need["uop"] = (len(SoftmaxUops(layer, config).uops), config.uop_depth)
        return need

    def check(self, layer: SoftmaxLayer, config: HardwareConfig):
        over = {k: v for k, v in self.needs(layer, config).items() if v[0] > v[1]}
        if over:
            raise ValueError(f"qsoftmax of {layer.h} keys does not fit config "
                             f"{config.name}: {overflow_detail(over)}")

    def fits(self, layer, config) -> bool:
        try:
            self.check(layer, config)
        except ValueError:
            return False
        return True


def softmax_problem(node: Node, graph: Graph, config: HardwareConfig) -> str | None:
    """Why `config` cannot run qsoftmax `node` down the rows, or None."""
    need = [op for op in (AluOp.TAB, AluOp.DIV) if op not in config.alu_ops]
    if need:
        return (f"the softmax runs on the accelerator with the ALU's lookup table and "
                f"divide (TAB and DIV in alu_ops); config {config.name} lacks "
                f"{' and '.join(op.name for op in need)}")
    x = graph.tensors[node.inputs[0]]
    axis = int(node.attrs.get("axis", -1))
    if len(x.shape) != 2 or axis not in (-2, 0):
        return (f"the accelerator's softmax runs down the rows of a 2-D score matrix "
                f"(axis -2, keys down the rows), not axis {axis} of {tuple(x.shape)}")
    if node.input(1):
        m = graph.tensors[node.inputs[1]]
        if m.dtype != "int8" or tuple(m.shape) != tuple(x.shape):
            return (f"its mask {node.inputs[1]!r} is {m.dtype} {tuple(m.shape)}; the "
                    f"accelerator reads an int8 one of the scores' shape {tuple(x.shape)} "
                    "(negative: excluded), which the attention split makes")
    if config.block_in != config.block_out:
        return (f"the softmax widens its rows with one identity block: block_in "
                f"({config.block_in}) must equal block_out ({config.block_out})")
    if x.dtype != "int8" or not pixel_rows(graph, node.inputs[0], config):
        return "its input must be an int8 sequence (the image of its rows)"
    t, s = (int(d) for d in x.shape)
    if s % config.block_out or (node.attrs.get("causal") and t < s):
        return (f"{s} queries must be whole blocks of {config.block_out}"
                + (f", and causal needs keys >= queries ({t} < {s})" if t < s else ""))
    return None


def softmax_layer(node: Node, graph: Graph,
                  config: HardwareConfig) -> tuple[SoftmaxLayer, np.ndarray]:
    """(layer, mask rows) of qsoftmax `node` down the rows; ValueError naming what the
    back half cannot run (`softmax_problem`)."""
    if node.op != "qsoftmax":
        raise ValueError(f"lower_softmax lowers qsoftmax nodes, not {node.name!r} ({node.op})")
    problem = softmax_problem(node, graph, config)
    if problem:
        raise ValueError(f"qsoftmax node {node.name!r}: {problem}")
    t, s = (int(d) for d in graph.tensors[node.inputs[0]].shape)
    L = config.block_out
    causal = bool(node.attrs.get("causal"))
    rows = np.zeros((0, L), np.int32)
    if causal:   # diagonal row j keeps lane l where j <= l: the same for every block
        keep = np.arange(L)[:, None] <= np.arange(L)[None, :]
        rows = np.concatenate([np.where(keep, 127, -128), np.where(keep, _KEEP, 0)])
    masked = bool(node.input(1))
    keys = _kept_keys(graph.constant(node.input(1))) if masked else None
    masked = masked and keys is None
    layer = SoftmaxLayer(op="qsoftmax", n=1, c=s, h=t, w=1, rank=2, sequence=True,
                         batch_blocks=1, blocks=s // L, const_rows=len(rows),
                         inputs=(0, 1) if masked else (0,),
                         prob_bits=int(node.attrs["params"]["prob_bits"]), causal=causal,
                         masked=masked, keys=keys)
    return layer, rows.astype(np.int32)


def _kept_keys(mask: np.ndarray | None) -> int | None:
    """n where constant int8 `mask` keeps every query's first n keys (rows) and
    excludes the rest, as a sequence padded to whole blocks masks its padded keys
    (`vdla.compiler.targets.vdla.row_padding`): the program then reads only those
    rows, as causal's blocks read theirs, with no mask passes; else None."""
    if mask is None:
        return None
    kept = np.all(mask >= 0, axis=1)
    n = len(kept) if kept.all() else int(np.argmin(kept))   # the first row not all kept
    return n if n and np.all(mask[n:] < 0) else None


def softmax_entries(node: Node) -> np.ndarray:
    """The table of `node`'s exponentials by distance below the row's maximum: entry j
    is the exponential of -j (`exp_table`'s entry 255 - j)."""
    return exp_table(node)[::-1].astype(np.int32)


class SoftmaxUops(KernelTable):
    """The program's micro-ops: windows (inp) and regions (acc/out: T rows, then the
    maximum, the sum and half the sum) ping-pong; the mask rows at the acc buffer's top
    (`const_base`: rows 0..L-1 before the exponential, L..2L-1 after, one set for every
    query block). Every kernel is interned at once (the table is loaded first)."""

    def __init__(self, L: SoftmaxLayer, config: HardwareConfig):
        super().__init__()
        self.L, self.lanes = L, config.block_out
        self.windows = PingPong(L.h * L.operands)
        self.regions = PingPong(L.region_rows)
        self.const_base = config.acc_depth - L.const_rows
        self.table = [self._kernels_of(k) for k in range(L.blocks)]

    def _kernels_of(self, k: int) -> dict:
        L = self.L
        o, win, h = self.regions.base(k), self.windows.base(k), L.h
        m, s, half = o + h, o + h + 1, o + h + 2
        first, _ = L.diagonal(k)
        before = self.const_base + 1                           # mask row j = 1
        after = self.const_base + self.lanes + 1
        masks = {}
        if L.causal:
            masks = {"mask_max": self.kernel([Uop(o + first, before)]),
                     "mask_exp": self.kernel([Uop(o + first, after)])}
        if L.masked:   # the mask's rows after the scratch rows
            mo = o + h + _SCRATCH
            masks |= {"widen_mask": self.kernel([Uop(mo, win + h, 0)]),
                      "by_mask": self.kernel([Uop(o, mo)]), "mask": self.kernel([Uop(mo, 0)]),
                      "sum_floor": self.kernel([Uop(s, 0)])}
        return masks | {
                "reset": self.kernel([Uop(o, 0, 0)]), "widen": self.kernel([Uop(o, win, 0)]),
                "first": self.kernel([Uop(m, o)]), "max": self.kernel([Uop(m, o + 1)]),
                "rows_by_max": self.kernel([Uop(o, m)]), "sum": self.kernel([Uop(s, o)]),
                "half": self.kernel([Uop(half, s)]), "half_shift": self.kernel([Uop(half, 0)]),
                "shift": self.kernel([Uop(o, 0)]), "rows_by_half": self.kernel([Uop(o, half)]),
                "rows_by_sum": self.kernel([Uop(o, s)])}


@dataclasses.dataclass(frozen=True, eq=False)
class LoweredSoftmax(LoweredElementwise):
    """A lowered softmax: an elementwise-family op of one operand (``input0``) and an
    output, whose static data also holds the exponentials' table."""

    def input_data(self, x, mask=None) -> dict:
        """{"input0": the (T, S) scores, "input1": the int8 mask (masked only), each
        packed as the image of its rows}."""
        L = self.layer
        return {f"input{i}": self.packed(a, what)
                for i, (what, a) in zip(L.inputs, (("input", x), ("mask", mask)))}

    def packed(self, a, what: str = "mask") -> np.ndarray:
        """An int8 (T, S) operand (`what`: for errors) packed as the image of its rows
        (a constant mask is the kernel's static ``input1``)."""
        L, c = self.layer, self.config
        a = check_array(a, (L.h, L.c), np.int8, what, self.node)
        return pack_activation(a.T[None, :, :, None], c, c.block_in)


def lower_softmax(node: Node | str, graph: Graph, config: HardwareConfig,
                  schedule: SoftmaxSchedule | None = None) -> LoweredSoftmax:
    """Lower qsoftmax `node` (down the rows) of `graph` for `config` (module docstring)."""
    node, (layer, rows), s = start_lowering("lower_softmax", node, graph, config, schedule,
                                            softmax_layer, choose_softmax, SoftmaxSchedule)
    u, c = SoftmaxUops(layer, config), config
    regions, arena_bytes = layout_arena({
        "uop": len(u.uops) * c.uop_bytes,
        "table": TABLE_ENTRIES * TAB_ENTRY_BYTES,
        "const": layer.const_rows * c.acc_elem_bytes,
        "weights": c.wgt_elem_bytes,
        **{f"input{i}": layer.blocks * layer.h * c.inp_elem_bytes for i in layer.inputs},
        "output": layer.blocks * layer.h * c.out_elem_bytes,
    }, config)
    program = _emit(layer, c, u, regions)
    return LoweredSoftmax(node.name, config, layer, s, program, regions, arena_bytes,
                          encode_uops(u.uops, config), rows, softmax_entries(node))


def _emit(L: SoftmaxLayer, c: HardwareConfig, u: SoftmaxUops, regions: dict) -> Program:
    ins = [regions[f"input{i}"].offset // c.inp_elem_bytes for i in L.inputs]
    out0 = regions["output"].offset // c.out_elem_bytes
    p = ProgramBuilder(c)
    tokens = RegionTokens(p)
    load_tables(p, regions, c, len(u.uops), u.const_base, L.const_rows, 1)
    load_table(p, regions, c)
    for k in range(L.blocks):
        n, ker = L.kept_rows(k), u.table[k]
        o, win = u.regions.base(k), u.windows.base(k)
        tokens.load_into(("window", win))
        for q, base in enumerate(ins):   # the scores' rows, the mask's after them
            dense_dma(p, False, win + q * L.h, base + k * L.h, 1, n, n, 1)
        tokens.loaded()

        def rows(name, count, op=None, dst=1, src=0, **fields):
            bgn, end = ker[name]
            loop = dict(uop_bgn=bgn, uop_end=end, iter_out=1, iter_in=count,
                        dst_factor_in=dst, src_factor_in=src, **fields)
            if op is None:
                p.gemm(**loop)
            else:
                p.alu(op, **loop)

        tokens.compute_into(("out", o))
        rows("reset", L.region_rows, reset_reg=True)
        tokens.wait_loaded()
        rows("widen", n, src=1)
        if L.masked:
            rows("widen_mask", n, src=1)
        tokens.read(("window", win))
        if L.masked:   # an excluded score (mask -128) cannot raise the maximum; then the
            # mask becomes what keeps an exponential: (mask + 128) << 12, 0 or 1,044,480
            rows("by_mask", n, AluOp.MIN, src=1)
            rows("mask", n, AluOp.ADD, use_imm=True, imm=128)
            rows("mask", n, AluOp.SHR, use_imm=True, imm=-12)
        _, partial = L.diagonal(k)
        if partial:   # the diagonal's excluded scores cannot raise the maximum
            rows("mask_max", partial, AluOp.MIN, src=1)
        rows("first", 1, AluOp.ADD)
        if n > 1:
            rows("max", n - 1, AluOp.MAX, dst=0, src=1)
        rows("rows_by_max", n, AluOp.TAB)
        if partial:   # ... and add nothing to the sum
            rows("mask_exp", partial, AluOp.MIN, src=1)
        if L.masked:
            rows("by_mask", n, AluOp.MIN, src=1)
        rows("sum", n, AluOp.ADD, dst=0, src=1)
        if L.masked:   # a query that sees no key: its probabilities are 0 // 1
            rows("sum_floor", 1, AluOp.MAX, use_imm=True, imm=1)
        rows("half", 1, AluOp.ADD)
        rows("half_shift", 1, AluOp.SHR, use_imm=True, imm=1)
        rows("shift", n, AluOp.SHR, use_imm=True, imm=-L.prob_bits)
        rows("rows_by_half", n, AluOp.ADD)
        rows("rows_by_sum", n, AluOp.DIV)
        tokens.computed()
        tokens.wait_computed()
        dense_dma(p, True, o, out0 + k * L.h, 1, L.h, L.h, 1)
        tokens.stored(("out", o))
    return tokens.finish()


def _tile_compute(L: SoftmaxLayer, c: HardwareConfig, n: int, partial: int) -> float:
    """Compute-module cycles of one query block of `n` rows, `partial` of them masked."""
    held = functools.partial(vector_pass_cycles, outer=1, config=c, held=True)
    moving = functools.partial(vector_pass_cycles, outer=1, config=c, held=False)
    passes = [L.region_rows, n,                             # reset, widen (GEMM)
              moving(1), moving(max(n - 1, 0)),             # the maximum
              held(n), moving(n),                           # TAB by m, the sum
              moving(1), 1, n, held(n),                     # half, SHR 1, SHR -k, ADD h
              n * div_cycles(c) + div_fill_cycles(c)]       # DIV by s
    insns = len(passes)
    if partial:
        passes += [moving(partial), moving(partial)]
        insns += 2
    if L.masked:   # widen, MIN, ADD 128, SHR -12, MIN; the sum's floor of 1
        passes += [n, moving(n), n, n, moving(n), 1]
        insns += 6
    return sum(passes) + insns * INSN_CYCLES


def estimate_softmax(layer: SoftmaxLayer, schedule: SoftmaxSchedule, config: HardwareConfig,
                     *, bytes_per_cycle: float | None = None,
                     read_latency: int | None = None) -> int:
    """Predicted cycles of `layer` on `config`: per query block the longest of its load,
    its passes (`_tile_compute`) and its store, as blocks overlap in pairs; the first
    block's compute waits behind its load and the compute module's LOADs of the mask rows
    and the exponentials' table (`table_load_cycles`), and the last block's store runs
    alone."""
    c, bw = config, float(bytes_per_cycle or config.dram_bytes_per_cycle)
    cycles = first = last = 0.0
    for k in range(layer.blocks):
        n, (_, partial) = layer.kept_rows(k), layer.diagonal(k)
        load = layer.operands * (n * c.inp_elem_bytes / bw + dma_cycles(bw, read_latency))
        store = store_cycles(layer.h, 1, c, bw)
        cycles += max(load, _tile_compute(layer, c, n, partial), store)
        if k == 0:   # behind the compute module's loads: the mask rows, the table
            first = load + table_load_cycles(c) + (
                layer.const_rows * c.acc_elem_bytes / bw + dma_cycles(bw, read_latency)
                if layer.const_rows else 0)
        last = store
    return int(math.ceil(cycles + first + last))


@functools.lru_cache(maxsize=256)
def choose_softmax(layer: SoftmaxLayer, config: HardwareConfig) -> SoftmaxSchedule:
    """The only schedule (a query block a tile), checked against the buffers."""
    s = SoftmaxSchedule()
    s.check(layer, config)
    return s


def run_softmax(dev, lowered: LoweredSoftmax, x, mask=None, return_stats: bool = False):
    """Run `lowered` on `dev` for int8 scores `x` (T, S) and, where it has one, its int8
    mask (T, S): the (T, S) probabilities (and the run's statistics with
    `return_stats`)."""
    args = (x,) if mask is None else (x, mask)
    return run_elementwise(dev, lowered, *args, return_stats=return_stats)
