"""The accelerator's convolution features for cost models that span configs
(`vdla.compiler.tuner.features`): the workload, the schedule's loop extents, its
footprint in each on-chip buffer, its threads, the hardware config, and the analytical
timing model's view of it. Sizes are logarithms and footprints fractions of their
buffer, so that one model reads the same meaning on every config; cycles are compared
with the layer's ideal (its MACs at the core's MACs per cycle), which is what a config's
schedule can hope for."""

from __future__ import annotations

from vdla.compiler.targets.vdla.common import ceil_div
from vdla.compiler.targets.vdla.conv_layer import Conv2dLayer
from vdla.compiler.targets.vdla.conv_schedule import Conv2dSchedule
from vdla.compiler.targets.vdla.timing import Conv2dEstimate
from vdla.compiler.tuner.features import Feature, FeatureSet, log2
from vdla.config import HardwareConfig
from vdla.extensions import EXTENSIONS

__all__ = ["CONV2D", "conv2d_values"]

#: Axes a schedule tiles: (feature suffix, what it tiles).
_AXES = (("h", "output rows"), ("w", "output columns"), ("ci", "input-channel blocks"),
         ("co", "output-channel blocks"))
_BUFFERS = ("inp", "wgt", "acc", "out", "uop")

CONV2D = FeatureSet("vdla.conv2d", 1, (
    # The workload.
    Feature("log_macs", "log2 of the layer's useful multiply-accumulates"),
    Feature("log_ideal_cycles", "log2 of its ideal cycles: MACs over the core's MACs a "
            "cycle (batch x block_in x block_out)"),
    Feature("log_out_pixels", "log2 of output pixels (batch x rows x columns)"),
    Feature("log_in_blocks", "log2 of the most input-channel blocks one GEMM chunk takes"),
    Feature("log_out_blocks", "log2 of the most output-channel blocks of a span"),
    Feature("kernel_taps", "weight blocks per (output block, input block): kernel taps, or "
            "a depthwise window's rows"),
    Feature("stride", "the vertical stride"),
    Feature("residual", "1 when a residual is added in the epilogue"),
    # The schedule: each tiled axis.
    *(f for axis, what in _AXES for f in (
        Feature(f"log_tile_{axis}", f"log2 of the tile along {what}"),
        Feature(f"log_tiles_{axis}", f"log2 of the number of tiles along {what}"),
        Feature(f"waste_{axis}", f"padding the tiles add along {what}, as a fraction of it"))),
    Feature("log_acc_tile", "log2 of accumulator rows one tile holds (rows x columns x "
            "output blocks)"),
    Feature("threads_oc", "1 with two virtual threads over output-channel tiles"),
    Feature("threads_h", "1 with two virtual threads over row tiles"),
    Feature("thread_idle", "the share of a thread's turns left idle when the threaded "
            "axis's tiles do not split evenly between two threads"),
    # Footprints.
    *(Feature(f"fill_{b}", f"elements of the {b} buffer the schedule needs (every thread's "
              "regions), as a fraction of its depth") for b in _BUFFERS),
    # The hardware config.
    Feature("log_batch", "log2 of the core's batch rows"),
    Feature("log_block_in", "log2 of the core's block_in"),
    Feature("log_block_out", "log2 of the core's block_out"),
    *(Feature(f"log_{b}_depth", f"log2 of the {b} buffer's depth, in elements")
      for b in _BUFFERS),
    Feature("log_bus_bytes", "log2 of DRAM bytes a cycle each way"),
    # The hardware extensions' inputs, as each declares it (`vdla.extensions`).
    *(Feature(ext.cost_input[0], ext.cost_input[1]) for ext in EXTENSIONS if ext.cost_input),
    # The analytical timing model.
    Feature("log_est_over_ideal", "log2 of the timing model's cycles over the ideal cycles"),
    Feature("est_gemm", "the GEMM's share of the timing model's busy cycles"),
    Feature("est_epilogue", "the epilogue's share (reset, ALU passes, residual, overheads)"),
    Feature("est_load", "the load module's share"),
    Feature("est_store", "the store module's share"),
), baseline=("log_est_over_ideal", "log_ideal_cycles"),   # the timing model's log2 cycles
    # It ranks the schedules of a config it never saw at pairwise 0.98 against Verilator
    # (bench/tuner_transfer.py, part 1): where the correction turns its order around, the
    # correction is the likelier one wrong (`pretrained_chooser.pretrained_choice`).
    baseline_vetoes=True)


def conv2d_values(layer: Conv2dLayer, schedule: Conv2dSchedule, config: HardwareConfig,
                  estimate: Conv2dEstimate) -> dict[str, float]:
    """The `CONV2D` features of `schedule` for `layer` on `config`, with the timing
    model's `estimate` of it (`estimate_conv2d`)."""
    s = schedule.clamped(layer)
    ideal = layer.macs / (config.batch * config.block_in * config.block_out)
    values = {
        "log_macs": log2(layer.macs), "log_ideal_cycles": log2(ideal),
        "log_out_pixels": log2(layer.n * layer.out_h * layer.out_w),
        "log_in_blocks": log2(layer.span_in), "log_out_blocks": log2(layer.span_out),
        "kernel_taps": float(layer.wgt_taps), "stride": float(layer.stride_h),
        "residual": float(layer.has_residual),
    }
    counts = {}
    for (axis, _), tile, total in zip(_AXES, (s.tile_h, s.tile_w, s.tile_ci, s.tile_co),
                                      (layer.out_h, layer.out_w, layer.span_in,
                                       layer.span_out)):
        counts[axis] = ceil_div(total, tile)
        values[f"log_tile_{axis}"] = log2(tile)
        values[f"log_tiles_{axis}"] = log2(counts[axis])
        values[f"waste_{axis}"] = counts[axis] * tile / total - 1.0
    values["log_acc_tile"] = log2(s.tile_h * s.tile_w * s.tile_co)
    values["threads_oc"] = float(s.oc_nthread == 2)
    values["threads_h"] = float(s.h_nthread == 2)
    split = counts["co"] if s.oc_nthread == 2 else counts["h"] if s.h_nthread == 2 else 0
    values["thread_idle"] = (split % 2) / (split + 1) if split else 0.0
    depths = {"inp": config.inp_depth, "wgt": config.wgt_depth, "acc": config.acc_depth,
              "out": config.out_depth, "uop": config.uop_depth}
    for name, (need, depth) in s.needs(layer, config).items():
        values[f"fill_{name}"] = need / depth
    values.update({
        "log_batch": log2(config.batch), "log_block_in": log2(config.block_in),
        "log_block_out": log2(config.block_out),
        **{f"log_{b}_depth": log2(depths[b]) for b in _BUFFERS},
        "log_bus_bytes": log2(config.dram_bytes_per_cycle),
        **{ext.cost_input[0]: ext.cost_value(config) for ext in EXTENSIONS if ext.cost_input},
    })
    busy = max(1, estimate.gemm + estimate.epilogue + estimate.load + estimate.store)
    values.update({
        "log_est_over_ideal": log2(estimate.cycles) - log2(ideal),
        "est_gemm": estimate.gemm / busy, "est_epilogue": estimate.epilogue / busy,
        "est_load": estimate.load / busy, "est_store": estimate.store / busy,
    })
    return values
