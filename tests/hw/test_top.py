"""The whole accelerator in Verilator, driven through its AXI4-Lite registers."""

import pytest

from cocotb_harness import run_cocotb
from hw_harnesses import HW_CONFIGS
from vdla.hw import Accelerator


@pytest.mark.parametrize("name", ["default", "small"])
def test_accelerator_runs_a_program(name):
    cfg = HW_CONFIGS[name]
    run_cocotb(Accelerator(cfg), toplevel="vdla_accelerator", testbench="tb_top", config=cfg)
