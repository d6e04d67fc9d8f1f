"""The fetch module in Verilator (cocotb): routing, back-pressure, bus widths."""

import dataclasses

import pytest

from cocotb_harness import run_cocotb
from hw_harnesses import HW_CONFIGS
from store_fetch_harness import FetchHarness, verilator_lint
from vdla import HardwareConfig

#: Buses narrower than (32, 64), as wide as (128) and wider than (256) an instruction.
CONFIGS = {"bus32": HardwareConfig(dram_bus_width=32),
           "default": HW_CONFIGS["default"],
           "mul-bus128": HW_CONFIGS["mul-bus128"],
           "bus256": dataclasses.replace(HW_CONFIGS["block8"], dram_bus_width=256)}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fetch_module(name):
    cfg = CONFIGS[name]
    run_cocotb(FetchHarness(cfg), toplevel="fetch_harness", testbench="tb_fetch", config=cfg)


LINT_CONFIGS = {**HW_CONFIGS, **CONFIGS,
                "bus1024": HardwareConfig(block_in=4, block_out=4, uop_buff_size=4096,
                                          inp_buff_size=4096, wgt_buff_size=4096,
                                          acc_buff_size=4096, dram_bus_width=1024)}


@pytest.mark.parametrize("name", list(LINT_CONFIGS))
def test_fetch_module_lints_clean(name, tmp_path):
    from vdla.hw.fetch import FetchModule
    assert verilator_lint(FetchModule(LINT_CONFIGS[name]), "fetch", tmp_path) == ""
