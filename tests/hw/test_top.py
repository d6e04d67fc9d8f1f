"""The whole accelerator in Verilator, driven through its AXI4-Lite registers."""

import pytest

from cocotb_harness import run_cocotb
from hw_harnesses import HW_CONFIGS
from vdla.hw import Accelerator


# The default config's run is slow: "small" runs the same program through the same top,
# test_compute's default-packed covers the default core, and the Verilator backend's
# differential tests run the default config's whole accelerator on every program.
@pytest.mark.parametrize("name", [pytest.param("default", marks=pytest.mark.slow), "small"])
def test_accelerator_runs_a_program(name):
    cfg = HW_CONFIGS[name]
    run_cocotb(Accelerator(cfg), toplevel="vdla_accelerator", testbench="tb_top", config=cfg)
