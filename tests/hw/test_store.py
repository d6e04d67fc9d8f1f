"""The store module in Verilator (cocotb): DRAM contents, bursts, tokens, throughput."""

import dataclasses

import pytest

from cocotb_harness import run_cocotb
from hw_harnesses import HW_CONFIGS
from vdla import HardwareConfig
from store_fetch_harness import StoreHarness, verilator_lint

#: Out elements narrower than the bus (8-byte elements on a 32-byte bus): packed into
#: beats and written with byte strobes.
NARROW = dataclasses.replace(HW_CONFIGS["block8"], dram_bus_width=256)
CONFIGS = {"default": HW_CONFIGS["default"],          # an element is two bus words
           "narrow-bus256": NARROW,
           # An element is one bus word: the default's path without the word select;
           # every config is linted below.
           "mul-bus128": pytest.param(HW_CONFIGS["mul-bus128"], marks=pytest.mark.slow)}


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
def test_store_module(cfg):
    run_cocotb(StoreHarness(cfg), toplevel="store_harness", testbench="tb_store", config=cfg)


LINT_CONFIGS = {**HW_CONFIGS, "narrow-bus256": NARROW,
                "bus1024": HardwareConfig(block_in=4, block_out=4, uop_buff_size=4096,
                                          inp_buff_size=4096, wgt_buff_size=4096,
                                          acc_buff_size=4096, dram_bus_width=1024)}


@pytest.mark.parametrize("name", list(LINT_CONFIGS))
def test_store_module_lints_clean(name, tmp_path):
    from vdla.hw.store import StoreModule
    assert verilator_lint(StoreModule(LINT_CONFIGS[name]), "store", tmp_path) == ""
