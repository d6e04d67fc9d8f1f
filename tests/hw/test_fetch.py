"""The fetch module in Verilator (cocotb): routing, back-pressure, bus widths."""

import pytest

from cocotb_harness import lint_component, run_cocotb
from hw_harnesses import BUS_CONFIGS, HW_CONFIGS
from store_fetch_harness import FetchHarness

#: Buses narrower than (32, 64), as wide as (128) and wider than (256) an instruction.
CONFIGS = {"bus32": BUS_CONFIGS["bus32"],
           "default": HW_CONFIGS["default"],
           "mul-bus128": HW_CONFIGS["mul-bus128"],
           "bus256": BUS_CONFIGS["block8-bus256"]}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fetch_module(name):
    cfg = CONFIGS[name]
    run_cocotb(FetchHarness(cfg), toplevel="fetch_harness", testbench="tb_fetch", config=cfg)


LINT_CONFIGS = {**HW_CONFIGS, **BUS_CONFIGS}


@pytest.mark.parametrize("name", list(LINT_CONFIGS))
def test_fetch_module_lints_clean(name, tmp_path):
    from vdla.hw.fetch import FetchModule
    assert lint_component(FetchModule(LINT_CONFIGS[name]), "fetch", tmp_path) == ""
