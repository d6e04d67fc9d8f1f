"""The CPU target's features for cost models that span layers and instruction sets
(`vdla.compiler.tuner.features`): the workload, the schedule's register tile and loop
structure, its footprints, the instruction set and the thread count, and the
chooser's cost model. Sizes are logarithms, so that one model reads the same meaning
on every layer; the instruction set enters as numbers (vector width, registers, how
int8 dot products run), so that a model trained on one can be adapted to another
(`bench/tuner_transfer.py`'s CPU part).

The chooser's cost (`estimate_conv`) counts about cycles at a nominal rate while the
costs are nanoseconds on this machine: a model that corrects it (``residual=True``)
learns the scale as part of the correction."""

from __future__ import annotations

import math

from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.schedule import (ORDERS, PARALLEL, ConvSchedule, DenseSchedule,
                                                cost_terms, estimate_conv)
from vdla.compiler.targets.cpu.shapes import ConvShape, DenseShape
from vdla.compiler.tuner.features import Feature, FeatureSet, log2

__all__ = ["CONV2D", "DENSE", "conv2d_values", "dense_values"]

#: How an instruction set runs int8 dot products, as a number (`Isa.int8`).
_INT8 = {"portable": 0.0, "maddubs": 1.0, "vnni": 2.0}

_PLATFORM = (
    Feature("log_vector_lanes", "log2 of the widest vector's 32-bit lanes of the "
            "instruction set"),
    Feature("log_registers", "log2 of the vector registers a register tile may fill"),
    Feature("int8_dot", "how int8 dot products run: 0 portable C, 1 AVX2 "
            "vpmaddubsw+vpmaddwd, 2 AVX-512 VNNI vpdpbusd"),
    Feature("log_threads", "log2 of the thread count the layer runs on"),
)

CONV2D = FeatureSet("cpu.conv2d", 3, (
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

DENSE = FeatureSet("cpu.dense", 1, (
    Feature("log_macs", "log2 of the layer's multiply-accumulates"),
    Feature("log_in", "log2 of the input features"),
    Feature("log_out", "log2 of the output features"),
    Feature("log_batch", "log2 of the rows"),
    Feature("int8", "1 for the int8 kernel, 0 for float32"),
    Feature("log_vl", "log2 of the schedule's vector lanes"),
    Feature("log_ov", "log2 of the output vectors held in registers"),
    Feature("log_unroll", "log2 of the reduction loop's unroll"),
    Feature("serial", "1 when the layer runs on one thread"),
    Feature("waste_out", "padding the vectors add to the output features, as a fraction"),
    *_PLATFORM,
    Feature("log_est", "log2 of the chooser's cost (about cycles at a nominal rate)"),
), baseline=("log_est",))


def _platform(isa: Isa, threads: int) -> dict[str, float]:
    return {"log_vector_lanes": math.log2(max(isa.lanes)),
            "log_registers": math.log2(isa.registers), "int8_dot": _INT8[isa.int8],
            "log_threads": math.log2(threads)}


def _blocks(total: int, size: int) -> int:
    return -(-total // size)


def conv2d_values(shape: ConvShape, s: ConvSchedule, isa: Isa, threads: int) -> dict:
    """`CONV2D`'s values for `s` on `shape`, as `isa` runs it on `threads`."""
    elem = 1 if shape.int8 else 4
    og = shape.og_padded(s.mr)
    tiles = _blocks(og, s.tile_co)
    rows = _blocks(shape.ho, s.tile_h)
    items = shape.groups * tiles * rows
    team = 1 if s.parallel == "none" else threads
    plane = shape.ho * shape.grid_pitch
    taps = shape.kh * shape.kw
    terms = cost_terms(shape, s)
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
        **_platform(isa, threads),
        "log_est": log2(estimate_conv(shape, s, threads)),
        "log_work": log2(terms["work"]), "log_restream": math.log2(1 + terms["restream"]),
        "log_stall": math.log2(1 + terms["stall"]),
    }


def dense_values(shape: DenseShape, s: DenseSchedule, isa: Isa, threads: int,
                 estimate: float) -> dict:
    """`DENSE`'s values for `s` on `shape`; `estimate` is the chooser's cost."""
    width = s.vl * s.ov
    return {
        "log_macs": log2(shape.macs), "log_in": log2(shape.k), "log_out": log2(shape.o),
        "log_batch": log2(shape.n), "int8": float(shape.int8),
        "log_vl": log2(s.vl), "log_ov": log2(s.ov), "log_unroll": log2(s.unroll),
        "serial": float(s.parallel == "none"),
        "waste_out": _blocks(shape.o, width) * width / shape.o - 1.0,
        **_platform(isa, threads),
        "log_est": log2(estimate),
    }
