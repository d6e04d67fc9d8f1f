"""The load module in Verilator (cocotb): padding, strides, tokens, throughput."""

import pytest

from cocotb_harness import run_cocotb
from hw_harnesses import HW_CONFIGS, LoadHarness


@pytest.mark.parametrize("name", ["default", "block8", "mul-bus128"])
def test_load_module(name):
    cfg = HW_CONFIGS[name]
    run_cocotb(LoadHarness(cfg), toplevel="load_harness", testbench="tb_load", config=cfg)
