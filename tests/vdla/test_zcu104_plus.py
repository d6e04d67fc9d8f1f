"""The shipped ZCU104 design against the Vitis AI DPU (docs/dpu.md): a 2,048-MAC core on
1,024 DSPs that fits the xczu7ev by the calibrated resource model with room to spare,
gets 32 DRAM bytes a cycle through the bridged HP port, and runs a whole model on its
Verilator model bit for bit in fewer cycles than the DPU's published latency implies."""

from __future__ import annotations

import pytest

from vdla.boards import get as get_board
from vdla.compiler import pipeline
from vdla.compiler.targets import get as get_target
from vdla.dse.resources import ResourceModel
from vdla.shipped import shipped

#: MobileNet-v2 on the DPU B4096 (ZCU104, Vitis AI 1.3 model zoo): 3.92 ms at 300 MHz.
DPU_MOBILENET_V2_CYCLES = 1_176_000


def test_zcu104_plus_is_a_2048_mac_core_on_1024_dsps_that_fits_with_room():
    entry = shipped("zcu104-plus")
    config, board = entry.config, get_board("zcu104")
    assert entry.board == "zcu104" and board.apply(config) == config
    assert config.macs_per_cycle == 2048 and config.gemm_multipliers == 1024
    assert config.extensions == ("req", "hold", "dw3")
    # The 256-bit master is bridged to the 128-bit HP port on its own clock.
    assert board.bridged(config) and config.dram_bytes_per_cycle == 32
    predicted = ResourceModel.for_board(board).predict(config)
    capacity = board.part.capacity
    assert all(getattr(predicted, key) <= 0.96 * getattr(capacity, key)
               for key in predicted.KEYS)
    # Unpacked, the same core needs more DSPs than the part has.
    assert config.replace(dsp_pack=False).gemm_multipliers > capacity.dsp
    # yosys's count (`vdla estimate`, recorded in the file) against the model's: the
    # DSPs and block RAMs exact, the LUTs and flip-flops within 2%.
    measured = entry.figures["resources"]
    assert entry.fits and "vdla estimate" in measured["source"]
    assert measured["dsp"]["used"] == predicted.dsp and measured["bram"]["used"] == predicted.bram
    for key in ("lut", "ff"):
        assert abs(getattr(predicted, key) / measured[key]["used"] - 1) < 0.02
    runs = {run["model"]: run for run in entry.figures["runs"]}
    assert set(runs) == {"resnet50", "resnet18", "mobilenet_v1", "mobilenet_v2"}
    assert all(run["bit_exact"] and run["backend"] == "verilator" for run in runs.values())


def test_mobilenet_v2_on_zcu104_plus_is_bit_exact_and_beats_the_dpu_in_cycles():
    """The whole MobileNet-v2 (its 17 depthwise layers on the window, the residual adds,
    the classifier) on the design's Verilator model at the board's DRAM model."""
    board = get_board("zcu104")
    config = shipped("zcu104-plus").config
    target = get_target("vdla", config=config, dram=board.dram_timing(config))
    outcome = pipeline.run_model("mobilenet_v2", target, jobs=2)
    assert outcome.bit_exact, outcome.mismatch
    ops = outcome.result.ops
    assert {s.name for s in ops if s.target == "host"} == {"input_quantize",
                                                           "logits_dequantize"}
    cycles = sum(s.cycles or 0 for s in ops if s.target == "vdla")
    assert cycles < DPU_MOBILENET_V2_CYCLES
