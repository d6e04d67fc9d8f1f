"""The design's Verilog from vdla's cache (`vdla.hw.verilog.cached_verilog`): the same
text `to_verilog` writes, read back without Amaranth, keyed on the hardware (not the
clock), the form and the code that generates it, and computed again over a damaged
entry."""

from __future__ import annotations

import dataclasses

import pytest

from vdla import HardwareConfig
from vdla.hw import verilog
from vdla.hw.verilog import TOP_NAME, cached_verilog, to_verilog

TINY = HardwareConfig(block_in=4, block_out=4, uop_buff_size=1024, inp_buff_size=1024,
                      wgt_buff_size=2048, acc_buff_size=2048, cmd_queue_depth=16,
                      token_queue_depth=16)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_cached_design_is_the_generated_one_and_is_read_back(cache, monkeypatch):
    text = cached_verilog(TINY)
    assert text == to_verilog(TINY)
    assert list((cache / "verilog").rglob("*.json"))

    def no_amaranth(*args, **kwargs):
        raise AssertionError("generated again, though the cache holds the design")

    monkeypatch.setattr(verilog, "to_verilog", no_amaranth)
    assert cached_verilog(TINY) == text
    # The clock and the DRAM's bandwidth are no part of the design.
    assert cached_verilog(dataclasses.replace(TINY, clock_mhz=TINY.clock_mhz * 2)) == text
    # Another top name, GEMM form or hardware is another design.
    for other in (dict(name="other_top"), dict(gemm_arithmetic="wide")):
        with pytest.raises(AssertionError, match="generated again"):
            cached_verilog(TINY, **other)
    with pytest.raises(AssertionError, match="generated again"):
        cached_verilog(dataclasses.replace(TINY, block_out=8))


def test_a_damaged_entry_is_generated_again(cache):
    text = cached_verilog(TINY)
    entries = list((cache / "verilog").rglob("*.json"))
    assert len(entries) == 1
    entries[0].write_text(entries[0].read_text()[:1000])
    assert cached_verilog(TINY) == text
    assert f"module {TOP_NAME}(" in entries[0].read_text()


def test_the_key_covers_every_module_the_design_is_made_from():
    """The code digest of the cache's key covers what `vdla.hw.top` imports,
    transitively, derived from the source: the config's extensions registry among it,
    a module the hand-written list the Verilator builds used to hash left out."""
    from vdla._keys import code_files
    files = code_files(("vdla.hw.top", "vdla.hw.verilog"))
    assert {"vdla.config", "vdla.extensions", "vdla.hw.compute", "vdla.hw.top",
            "vdla.isa"} <= set(files)
