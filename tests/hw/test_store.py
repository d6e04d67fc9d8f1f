"""The store module in Verilator (cocotb): DRAM contents, bursts, tokens, throughput."""

import pytest

from cocotb_harness import lint_component, run_cocotb
from hw_harnesses import BUS_CONFIGS, HW_CONFIGS
from store_fetch_harness import StoreHarness

#: Out elements narrower than the bus (8-byte elements on a 32-byte bus): packed into
#: beats and written with byte strobes.
NARROW = BUS_CONFIGS["block8-bus256"]
CONFIGS = {"default": HW_CONFIGS["default"],          # an element is two bus words
           "narrow-bus256": NARROW,
           # An element is one bus word: the default's path without the word select;
           # every config is linted below.
           "mul-bus128": pytest.param(HW_CONFIGS["mul-bus128"], marks=pytest.mark.slow)}


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
def test_store_module(cfg):
    run_cocotb(StoreHarness(cfg), toplevel="store_harness", testbench="tb_store", config=cfg)


LINT_CONFIGS = {**HW_CONFIGS, **BUS_CONFIGS}


@pytest.mark.parametrize("name", list(LINT_CONFIGS))
def test_store_module_lints_clean(name, tmp_path):
    from vdla.hw.store import StoreModule
    assert lint_component(StoreModule(LINT_CONFIGS[name]), "store", tmp_path) == ""
