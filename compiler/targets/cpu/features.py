"""The CPU target's features for cost models that span layers and instruction sets
(`vdla.compiler.tuner.features`): the workload, the schedule's register tile and loop
structure, its footprints, the instruction set and the thread count, and the
chooser's cost model. Sizes are logarithms, so that one model reads the same meaning
on every layer; the instruction set enters as numbers (vector width, registers, how
int8 dot products run), so that a model trained on one can be adapted to another
(`bench/tuner_transfer.py`'s CPU part), and so does the machine (`MachineCosts`: one
core's FMA lanes and int8 multiply-adds a cycle, its L1d and L2, AMX), so that rows of
AMD and Intel machines train one model.

The chooser's cost (`estimate_conv`) counts about cycles at a nominal rate while the
costs are nanoseconds on this machine: a model that corrects it (``residual=True``)
learns the scale as part of the correction.

Three sets: the convolutions' (`CONV2D`), the dense layers' (`DENSE`: one row for a
classifier, many for a transformer's tokens) and the batched products of two activations
(`MATMUL`). Why the products are not dense layers with other features: both multiply
(M, K) by (K, N) in a register tile, but a dense layer's weights are constants packed
once at compile time with its epilogue's tables, its row tile follows from its output
vectors (`dense.tile_rows`) and its int8 path from its rows and weights (`dense.int8_path`),
while a product's B is an activation read in place (float32) or packed on every run
(int8), its work comes in batches of small products, and its tile and AVX2 path are
free knobs. One set would carry each family's terms as constants on the other's rows,
and a model would learn two cost structures from a set that measures far more dense
layers than products."""

from __future__ import annotations

import math

from vdla.compiler.targets.cpu.dense import tile_rows
from vdla.compiler.targets.cpu.dense_schedule import DenseSchedule
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.machine import NOMINAL, MachineCosts
from vdla.compiler.targets.cpu.matmul_schedule import (STEP_OPS, MatmulSchedule, MatmulShape,
                                                       estimate_matmul, matmul_terms)
from vdla.compiler.targets.cpu.schedule import (ORDERS, PARALLEL, ConvSchedule, cost_terms,
                                                estimate_conv)
from vdla.compiler.targets.cpu.shapes import ConvShape, DenseShape
from vdla.compiler.tuner.features import Feature, FeatureSet, log2

__all__ = ["CONV2D", "DENSE", "MATMUL", "conv2d_values", "dense_values", "matmul_values"]

#: How an instruction set runs int8 dot products, as a number (`Isa.int8`).
_INT8 = {"portable": 0.0, "maddubs": 1.0, "vnni": 2.0, "amx": 3.0}

_PLATFORM = (
    Feature("log_vector_lanes", "log2 of the widest vector's 32-bit lanes of the "
            "instruction set"),
    Feature("log_registers", "log2 of the vector registers a register tile may fill"),
    Feature("int8_dot", "how int8 dot products run: 0 portable C, 1 AVX2 "
            "vpmaddubsw+vpmaddwd, 2 AVX-512 VNNI vpdpbusd"),
    Feature("log_threads", "log2 of the thread count the layer runs on"),
    # The machine (`MachineCosts`), per cycle of one core.
    Feature("log_fma_lanes", "log2 of the machine's float32 lane-FMAs a cycle at the "
            "instruction set's widest vector (2 x 512-bit ports: 5, Zen 4's 512-bit FMA "
            "as two halves or 2 x 256-bit: 4)"),
    Feature("log_int8_macs", "log2 of the machine's int8 multiply-adds a cycle on the "
            "instruction set's int8 path: measured where its benchmark ran that path, "
            "else from the FMA lanes (`_INT8_PER_LANE`)"),
    Feature("log_l1d", "log2 of the L1 data cache bytes of one core"),
    Feature("log_l2", "log2 of the L2 cache bytes of one core"),
    Feature("amx", "1 when the machine runs AMX int8 tiles"),
)

#: int8 multiply-adds per float32 lane-FMA of the same cycle, by int8 path (`Isa.int8`),
#: for a path the machine's benchmark did not measure: vpdpbusd sums four products a
#: 32-bit lane at the FMA's rate (AMX's vector code is VNNI's), AVX2's vpmaddubsw,
#: vpmaddwd and add four in three instructions, portable C about one.
_INT8_PER_LANE = {"portable": 1.0, "maddubs": 4.0 / 3.0, "vnni": 4.0, "amx": 4.0}
#: The benchmark's name of each path it measures (`machine_bench.Figures.int8_path`).
_INT8_BENCH = {"maddubs": "vpmaddubsw+vpmaddwd", "vnni": "vpdpbusd", "amx": "vpdpbusd"}

CONV2D = FeatureSet("cpu.conv2d", 4, (
    # The workload.
    Feature("log_macs", "log2 of the layer's useful multiply-accumulates"),
    Feature("log_out_pixels", "log2 of output pixels (batch x rows x columns)"),
    Feature("log_cin_group", "log2 of input channels per group"),
    Feature("log_cout_group", "log2 of output channels per group"),
    Feature("log_groups", "log2 of the groups"),
    Feature("depthwise", "1 for one channel per group"),
    Feature("pointwise", "1 for a 1x1 kernel of stride 1"),
    Feature("kernel_taps", "kernel rows x columns"),
    Feature("stride", "the vertical stride"),
    Feature("int8", "1 for the int8 kernel, 0 for float32"),
    Feature("residual", "1 when a residual is added in the epilogue"),
    # The schedule.
    Feature("log_vl", "log2 of the schedule's vector lanes"),
    Feature("log_mr", "log2 of the register tile's output channels (rows)"),
    Feature("log_nv", "log2 of the register tile's pixel vectors"),
    Feature("reg_fill", "the register tile's accumulators over the registers"),
    Feature("log_tile_co", "log2 of the channel tile in register tiles"),
    Feature("log_tile_h", "log2 of the row tile (output rows a work item computes)"),
    Feature("tile_ci_share", "the input-channel block over the padded input channels"),
    Feature("order_px", "1 when the loops run pixel blocks outside channel tiles"),
    Feature("lanes_co", "1 when the vector lanes run along output channels"),
    Feature("log_unroll", "log2 of the reduction loop's unroll"),
    Feature("blocked", "1 when the layer reads and writes the blocked layout NCHW{vl}c "
            "(its register tile is then mr pixels by nv channel vectors)"),
    Feature("winograd", "1 for Winograd F(2x2, 3x3) (the blocked layout's float 3x3 "
            "layers)"),
    *(Feature(f"parallel_{p}", f"1 when the threads split the work by {p}")
      for p in PARALLEL if p != "all"),
    Feature("waste_co", "padding the register tiles add to the output channels, as a "
            "fraction of them"),
    Feature("waste_px", "padding the pixel vectors add to the output plane, as a "
            "fraction of it"),
    Feature("thread_idle", "the share of the threads' turns left idle by work items that "
            "do not split evenly"),
    Feature("log_items", "log2 of the work items (groups x channel tiles x row tiles)"),
    # Footprints.
    Feature("log_wgt_tile_bytes", "log2 of the weight bytes one channel tile reads"),
    Feature("log_inp_tile_bytes", "log2 of the input bytes one row tile reads"),
    Feature("log_wgt_bytes", "log2 of the layer's weight bytes"),
    Feature("log_in_bytes", "log2 of the layer's input bytes"),
    Feature("log_wgt_per_px", "log2 of a channel tile's weight bytes over the pixels of "
            "one register tile: the weight traffic behind each output vector"),
    Feature("log_passes", "log2 of the passes over the accumulators (the group's padded "
            "input channels over tile_ci)"),
    Feature("log_px_blocks", "log2 of a row tile's pixel blocks (nv x vl pixels each)"),
    Feature("tap_loads", "input vectors loaded per reduction step: kernel taps x nv"),
    *_PLATFORM,
    # The chooser's model, whole and by term (`cost_terms`).
    Feature("log_est", "log2 of the chooser's cost (about cycles at a nominal rate)"),
    Feature("log_work", "log2 of the register tiles' vector multiply-adds at 16 lanes, "
            "padding included (the chooser's work term)"),
    Feature("log_restream", "log2 of 1 + the cycles the chooser counts for reading weights "
            "and input again beyond the cache"),
    Feature("log_stall", "log2 of 1 + the cycles the chooser counts for a register tile "
            "waiting for weights from memory"),
), baseline=("log_est",))

#: The dense layers' int8 paths (`dense.int8_path`) that are features, and what each is
#: (an input known non-negative, "plain", and float32 are none of them).
_DENSE_PATHS = {
    "sign": "the input's sign moved onto the weights (AVX2, up to 12 rows)",
    "wide": "int16 pairs (AVX2: the input widened once, vpmaddwd)",
    "offset": "the input read as x + 128 (one that may be negative; AVX2 splits it in "
              "nibbles)"}

DENSE = FeatureSet("cpu.dense", 3, (
    # The workload.
    Feature("log_macs", "log2 of the layer's multiply-accumulates"),
    Feature("log_in", "log2 of the input features"),
    Feature("log_out", "log2 of the output features"),
    Feature("log_batch", "log2 of the rows"),
    Feature("int8", "1 for the int8 kernel, 0 for float32"),
    Feature("residual", "1 when a residual is added in the epilogue"),
    # The schedule and the register tile it makes.
    Feature("log_vl", "log2 of the schedule's vector lanes"),
    Feature("log_ov", "log2 of the output vectors held in registers"),
    Feature("log_unroll", "log2 of the reduction loop's unroll"),
    Feature("serial", "1 when the layer runs on one thread"),
    Feature("waste_out", "padding the vectors add to the output features, as a fraction"),
    Feature("log_row_tile", "log2 of the register tile's rows (`dense.tile_rows`: as many as "
            "fit beside the ov weight vectors, at most 6)"),
    Feature("reg_fill", "the register tile's accumulators and weight vectors over the "
            "registers"),
    Feature("log_row_blocks", "log2 of the row blocks (the rows over the row tile, rounded "
            "up)"),
    Feature("waste_rows", "rows the last row block leaves empty, as a fraction of the rows"),
    Feature("log_out_tiles", "log2 of the output tiles (output features over vl x ov, "
            "rounded up)"),
    Feature("log_items", "log2 of the work items (output tiles x row blocks)"),
    Feature("thread_idle", "the share of the threads' turns left idle by work items that "
            "do not split evenly"),
    *(Feature(f"int8_{p}", f"1 when the int8 layer takes `dense.int8_path`'s \"{p}\": {doc}")
      for p, doc in _DENSE_PATHS.items()),
    # Footprints.
    Feature("log_wgt_bytes", "log2 of the packed weight bytes (int16 on the wide path)"),
    Feature("log_in_bytes", "log2 of the input bytes"),
    Feature("log_wgt_tile_bytes", "log2 of one output tile's packed weight bytes (what stays "
            "in the cache while the row blocks pass)"),
    Feature("log_wgt_per_row", "log2 of an output tile's weight bytes over the row tile's "
            "rows: the weight traffic behind each row"),
    Feature("log_steps", "log2 of a register tile's reduction steps (the input features; "
            "int8 words of four, int16 pairs on the wide path)"),
    *_PLATFORM,
    Feature("log_est", "log2 of the chooser's cost (about cycles at a nominal rate)"),
    Feature("log_work", "log2 of the register tiles' vector multiply-adds, padding "
            "included, times the instructions one takes on the layer's path"),
    Feature("log_loads", "log2 of the weight vectors loaded (once a step per row block)"),
), baseline=("log_est",))

MATMUL = FeatureSet("cpu.matmul", 2, (
    # The workload.
    Feature("log_macs", "log2 of the products' multiply-accumulates"),
    Feature("log_batches", "log2 of the products (output batches)"),
    Feature("log_m", "log2 of A's rows (each product's)"),
    Feature("log_k", "log2 of the reduction (A's columns, B's rows)"),
    Feature("log_n", "log2 of B's columns"),
    Feature("int8", "1 for the int8 kernel, 0 for float32"),
    Feature("transpose_b", "1 when int8 B comes as (n, k) rows"),
    Feature("log_b_matrices", "log2 of the distinct B matrices (int8 packs each every run)"),
    Feature("pack_share", "the distinct B matrices over the products' rows: packing's "
            "work against the multiply-adds'"),
    # The schedule.
    Feature("log_vl", "log2 of the schedule's vector lanes"),
    Feature("log_mr", "log2 of the register tile's rows of A"),
    Feature("log_nv", "log2 of the register tile's vectors of B's columns"),
    Feature("reg_fill", "the register tile's accumulators and B vectors over the registers"),
    Feature("log_unroll", "log2 of the reduction loop's unroll"),
    Feature("serial", "1 when the products run on one thread"),
    Feature("wide", "1 when int8 on AVX2 multiplies int16 pairs, 0 for x + 128 in nibbles"),
    Feature("waste_rows", "rows the last row block leaves empty, as a fraction of m"),
    Feature("waste_cols", "padding the vectors add to B's columns, as a fraction of n"),
    Feature("single_share", "the share of n computed one vector at a time (after the "
            "whole groups of nv vectors)"),
    Feature("log_items", "log2 of the work items (products x row blocks)"),
    Feature("thread_idle", "the share of the threads' turns left idle by work items that "
            "do not split evenly"),
    # Footprints.
    Feature("log_a_bytes", "log2 of one A matrix's bytes"),
    Feature("log_b_bytes", "log2 of one B matrix's bytes as the tile reads it (int8: packed, "
            "int16 pairs twice as wide)"),
    Feature("log_b_per_row", "log2 of B's bytes over the tile's rows: the B traffic behind "
            "each row of A"),
    Feature("log_steps", "log2 of a register tile's reduction steps (k; int8 words of four, "
            "int16 pairs when wide)"),
    *_PLATFORM,
    # The default's cost model, whole and by term (`matmul_terms`).
    Feature("log_est", "log2 of the cost model's estimate (`estimate_matmul`: about cycles)"),
    Feature("log_work", "log2 of the vector multiply-adds, partial vectors counted whole, "
            "times the instructions one takes on the kernel's path"),
    Feature("log_loads", "log2 of B's vectors loaded (once a step per row block)"),
    Feature("log_broadcasts", "log2 of A's values broadcast (once a step per row and column "
            "group)"),
    Feature("log_packing", "log2 of 1 + the vectors of B packed (and of A widened) every "
            "run"),
), baseline=("log_est",))


def _platform(isa: Isa, threads: int, costs: MachineCosts) -> dict[str, float]:
    lanes = costs.lanes_per_cycle(max(isa.lanes))
    macs = costs.int8_macs
    if macs is None or costs.int8_path != _INT8_BENCH.get(isa.int8):
        macs = lanes * _INT8_PER_LANE[isa.int8]
    return {"log_vector_lanes": math.log2(max(isa.lanes)),
            "log_registers": math.log2(isa.registers), "int8_dot": _INT8[isa.int8],
            "log_threads": math.log2(threads), "log_fma_lanes": math.log2(lanes),
            "log_int8_macs": math.log2(macs), "log_l1d": math.log2(costs.l1d),
            "log_l2": math.log2(costs.l2), "amx": float(costs.amx)}


def _blocks(total: int, size: int) -> int:
    return -(-total // size)


def conv2d_values(shape: ConvShape, s: ConvSchedule, isa: Isa, threads: int,
                  costs: MachineCosts = NOMINAL) -> dict:
    """`CONV2D`'s values for `s` on `shape`, as `isa` runs it on `threads` of the machine
    `costs` describes."""
    elem = 1 if shape.int8 else 4
    og = shape.og_padded(s.mr)
    tiles = _blocks(og, s.tile_co)
    rows = _blocks(shape.ho, s.tile_h)
    items = shape.groups * tiles * rows
    team = 1 if s.parallel == "none" else threads
    plane = shape.ho * shape.grid_pitch
    taps = shape.kh * shape.kw
    terms = cost_terms(shape, s, costs)
    return {
        "log_macs": log2(shape.macs), "log_out_pixels": log2(shape.n * shape.ho * shape.wo),
        "log_cin_group": log2(shape.cg), "log_cout_group": log2(shape.og),
        "log_groups": log2(shape.groups), "depthwise": float(shape.depthwise),
        "pointwise": float(shape.pointwise), "kernel_taps": float(taps),
        "stride": float(shape.sh), "int8": float(shape.int8),
        "residual": float(shape.residual),
        "log_vl": log2(s.vl), "log_mr": log2(s.mr), "log_nv": log2(s.nv),
        "reg_fill": s.mr * s.nv / isa.registers,
        "log_tile_co": log2(s.tile_co / s.unit), "log_tile_h": log2(s.tile_h),
        "tile_ci_share": s.tile_ci / shape.cg_padded,
        "order_px": float(s.order == ORDERS[1]), "lanes_co": float(s.lanes == "co"),
        "log_unroll": log2(s.unroll),
        "blocked": float(s.layout != "plain"), "winograd": float(s.wino > 0),
        **{f"parallel_{p}": float(s.parallel == p) for p in PARALLEL if p != "all"},
        "waste_co": og / shape.og - 1.0,
        "waste_px": _blocks(plane, s.nv * s.vl) * s.nv * s.vl / max(plane, 1) - 1.0,
        "thread_idle": _blocks(items, team) * team / items - 1.0,
        "log_items": log2(items),
        "log_wgt_tile_bytes": log2(s.tile_co * s.tile_ci * taps * elem),
        "log_inp_tile_bytes": log2(min(shape.h, (s.tile_h - 1) * shape.sh + shape.kh)
                                   * shape.w * s.tile_ci * elem),
        "log_wgt_bytes": log2(shape.groups * og * shape.cg_padded * taps * elem),
        "log_in_bytes": log2(shape.groups * shape.cg_padded * shape.h * shape.w * elem),
        "log_wgt_per_px": log2(s.tile_co * s.tile_ci * taps * elem) - log2(s.nv * s.vl),
        "log_passes": log2(shape.cg_padded / s.tile_ci),
        "log_px_blocks": log2(_blocks(min(s.tile_h, shape.ho) * shape.grid_pitch,
                                      s.nv * s.vl)),
        "tap_loads": float(taps * s.nv),
        **_platform(isa, threads, costs),
        "log_est": log2(estimate_conv(shape, s, threads, costs)),
        "log_work": log2(terms["work"]), "log_restream": math.log2(1 + terms["restream"]),
        "log_stall": math.log2(1 + terms["stall"]),
    }


def _dense_kind(shape: DenseShape, path: str, isa: Isa) -> str:
    """The key of `STEP_OPS` a dense layer's reduction step runs as."""
    if not shape.int8:
        return "float32"
    if path in ("sign", "wide"):
        return path
    if isa.int8 == "maddubs" and path == "plain":
        return "dot4"
    return isa.int8


def dense_values(shape: DenseShape, s: DenseSchedule, isa: Isa, threads: int,
                 estimate: float, path: str, costs: MachineCosts = NOMINAL) -> dict:
    """`DENSE`'s values for `s` on `shape`, as `isa` runs it on `threads` of the machine
    `costs` describes; `estimate` is the chooser's cost and `path` the layer's int8 path
    (`dense.int8_path`: "plain" for float32)."""
    width = s.vl * s.ov
    rows = tile_rows(shape.n, s.ov, isa, path)
    blocks = _blocks(shape.n, rows)
    tiles = _blocks(shape.o, width)
    items = tiles * blocks
    team = 1 if s.parallel == "none" else threads
    wide = path == "wide"
    steps = shape.k if not shape.int8 else _blocks(shape.k, 2 if wide else 4)
    # A step reads 4 bytes an output: a float, or an int8 word of four or two int16.
    tile_bytes = steps * width * 4
    return {
        "log_macs": log2(shape.macs), "log_in": log2(shape.k), "log_out": log2(shape.o),
        "log_batch": log2(shape.n), "int8": float(shape.int8),
        "residual": float(shape.residual),
        "log_vl": log2(s.vl), "log_ov": log2(s.ov), "log_unroll": log2(s.unroll),
        "serial": float(s.parallel == "none"),
        "waste_out": _blocks(shape.o, width) * width / shape.o - 1.0,
        "log_row_tile": log2(rows), "reg_fill": (rows * s.ov + s.ov) / isa.registers,
        "log_row_blocks": log2(blocks), "waste_rows": blocks * rows / shape.n - 1.0,
        "log_out_tiles": log2(tiles), "log_items": log2(items),
        "thread_idle": _blocks(items, team) * team / items - 1.0,
        **{f"int8_{p}": float(shape.int8 and path == p) for p in _DENSE_PATHS},
        "log_wgt_bytes": log2(tiles * tile_bytes),
        "log_in_bytes": log2(shape.n * shape.k * (1 if shape.int8 else 4)),
        "log_wgt_tile_bytes": log2(tile_bytes),
        "log_wgt_per_row": log2(tile_bytes) - log2(rows),
        "log_steps": log2(steps),
        **_platform(isa, threads, costs),
        "log_est": log2(estimate),
        "log_work": log2(tiles * s.ov * shape.n * steps
                         * STEP_OPS[_dense_kind(shape, path, isa)]),
        "log_loads": log2(tiles * blocks * steps * s.ov),
    }


def matmul_values(shape: MatmulShape, s: MatmulSchedule, isa: Isa, threads: int,
                  costs: MachineCosts = NOMINAL) -> dict:
    """`MATMUL`'s values for `s` on `shape`, as `isa` runs it on `threads` of the machine
    `costs` describes."""
    elem = 1 if shape.int8 else 4
    steps = shape.steps(bool(s.wide))
    vectors = _blocks(shape.n, s.vl)
    blocks = _blocks(shape.m, s.mr)
    whole = shape.n // (s.nv * s.vl) * s.nv * s.vl
    items = shape.batches * blocks
    terms = matmul_terms(shape, s, isa, threads)
    team = int(terms["team"])
    # A word of the packed B is 4 bytes (int8 four k, or two int16); float32 one k.
    b_bytes = steps * vectors * s.vl * 4
    return {
        "log_macs": log2(shape.macs), "log_batches": log2(shape.batches),
        "log_m": log2(shape.m), "log_k": log2(shape.k), "log_n": log2(shape.n),
        "int8": float(shape.int8), "transpose_b": float(shape.transpose_b),
        "log_b_matrices": log2(shape.b_matrices),
        "pack_share": shape.b_matrices / (shape.batches * shape.m) if shape.int8 else 0.0,
        "log_vl": log2(s.vl), "log_mr": log2(s.mr), "log_nv": log2(s.nv),
        "reg_fill": (s.mr * s.nv + s.nv) / isa.registers, "log_unroll": log2(s.unroll),
        "serial": float(team == 1), "wide": float(s.wide),
        "waste_rows": blocks * s.mr / shape.m - 1.0,
        "waste_cols": vectors * s.vl / shape.n - 1.0,
        "single_share": (shape.n - whole) / shape.n,
        "log_items": log2(items), "thread_idle": terms["idle"],
        "log_a_bytes": log2(shape.m * shape.k * elem), "log_b_bytes": log2(b_bytes),
        "log_b_per_row": log2(b_bytes) - log2(s.mr), "log_steps": log2(steps),
        **_platform(isa, threads, costs),
        "log_est": log2(estimate_matmul(shape, s, isa, threads)),
        "log_work": log2(terms["work"]), "log_loads": log2(terms["loads"]),
        "log_broadcasts": log2(terms["broadcasts"]),
        "log_packing": math.log2(1 + terms["packing"]),
    }
