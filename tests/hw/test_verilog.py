"""Verilog generation: every tested config lints cleanly; the manifest tells the truth."""

from __future__ import annotations

import json
import pytest

from cocotb_harness import lint_verilog
from hw_harnesses import HW_CONFIGS
from vdla.cli import main
from vdla.isa.registers import COUNTERS, REGISTERS
from vdla.hw import Accelerator
from vdla.hw.verilog import TOP_NAME, VERILATOR_WAIVERS, generate, to_verilog
from vdla import HardwareConfig


@pytest.mark.parametrize("name", sorted(HW_CONFIGS))
def test_verilog_lints_with_only_documented_waivers(name, tmp_path):
    cfg = HW_CONFIGS[name]
    paths = generate(cfg, tmp_path)
    assert lint_verilog(paths["verilog"], TOP_NAME) == ""

    info = json.loads(paths["manifest"].read_text())
    assert info["top"] == TOP_NAME and info["config_name"] == cfg.name
    assert info["config"] == cfg.to_dict()
    text = paths["verilog"].read_text()
    header = text[text.index(f"module {TOP_NAME}("):]
    header = header[:header.index(");")]
    for port in info["ports"]:
        assert port["name"] in header, port
        decl = f"[{port['width'] - 1}:0] {port['name']};" if port["width"] > 1 else f" {port['name']};"
        assert f"{port['direction']} {decl.strip()}" in text or \
            f"{port['direction']}{decl}" in text, port
    names = {p["name"] for p in info["ports"]}
    assert {"clk", "rst", "m_axi__araddr", "m_axi__wdata", "s_axi_ctrl__awaddr",
            "s_axi_ctrl__rdata", "irq"} <= names
    assert next(p for p in info["ports"] if p["name"] == "m_axi__rdata")["width"] == cfg.dram_bus_width
    regs = {r["name"]: r["offset"] for r in info["control"]["registers"]}
    assert regs["CTRL"] == REGISTERS["CTRL"][0]
    assert regs["CYCLES_LO"] == COUNTERS["cycles"][0]
    assert regs["CYCLES_HI"] == COUNTERS["cycles"][0] + 4
    assert len(set(regs.values())) == len(regs), "two registers share an offset"
    assert set(info["verilator_waivers"]) == set(VERILATOR_WAIVERS)


def test_cli_writes_verilog_and_manifest(tmp_path, capsys):
    cfg_path = tmp_path / "small.json"
    HW_CONFIGS["small"].to_json(cfg_path)
    out = tmp_path / "out"
    assert main(["verilog", "--config", str(cfg_path), "-o", str(out)]) == 0
    assert (out / f"{TOP_NAME}.v").read_text().count(f"module {TOP_NAME}(") == 1
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config_name"] == HW_CONFIGS["small"].name
    assert str(out / "manifest.json") in capsys.readouterr().out


def test_cli_rejects_bad_config(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"batch": 3}')
    assert main(["verilog", "--config", str(bad), "-o", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "batch" in err and "power of two" in err
    assert not (tmp_path / "o").exists()


def test_cli_refuses_an_output_that_is_a_file(tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("keep me")
    assert main(["verilog", "-o", str(target)]) == 1
    err = capsys.readouterr().err
    assert "taken" in err and "not a folder" in err
    assert target.read_text() == "keep me"


def test_accelerator_needs_a_config():
    with pytest.raises(TypeError, match="HardwareConfig"):
        Accelerator({"batch": 1})


def test_extensions_are_only_elaborated_where_the_config_has_them():
    """The default config's Verilog has none of the extensions' logic (its hardware is
    VTA's: the extension blocks of `vdla.hw.compute` are Python conditionals on the
    config), and a config with an extension has it: REQ's clamp, alu_hold's capture enable, the
    depthwise window's register, beat counter and multiplier-input muxes, the table's DMA
    and its per-lane memories (TAB), the dividers and their issue gate (DIV)."""
    default = to_verilog(HardwareConfig())
    extended = to_verilog(HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR", "REQ", "TAB",
                                                  "DIV"}, alu_hold=True, dw_taps=3))
    for marker in ("alu0_req", "src_read", "src_moves", "dw_window", "dw_beat",
                   "dw_last_beat", "multiply_last", "dw_x_b0_n0_k0", "dw_x_b0_n14_k5",
                   "dma_tab", "table0 ", "table15 ", "div_wait", "div_count",
                   "div0_rem", "div15_divisor"):
        assert marker not in default and marker in extended, marker
    assert "dw_x_b0_n0_k6" not in extended     # columns past 2T: no mux
    assert len(extended) > len(default)
    # The pipelined divider replaces the sequential one: its stages and scoreboard, and
    # the micro-op word the uop SRAM reads a cycle ahead for it.
    pipelined = to_verilog(HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR", "DIV"},
                                          div_pipeline=True))
    for marker in ("divp_sb0_valid", "divp_sb8_row", "divp0_rem1", "divp15_shift8",
                   "divp_valid8", "uop_word"):
        assert marker not in extended and marker in pipelined, marker
    for marker in ("div_wait", "div_count", "div0_rem", "divp0_rem8", "divp_sb9_valid"):
        assert marker not in pipelined, marker


def test_cli_writes_the_unpacked_core(tmp_path):
    """`vdla verilog` of a config with `dsp_pack` off: one 16-bit product register per
    product (lane 1's too), where the packed core has one 33-bit register per pair."""
    small = HW_CONFIGS["small"]
    written = {}
    for dsp_pack in (True, False):
        cfg = small.replace(dsp_pack=dsp_pack)
        cfg.to_json(tmp_path / f"{dsp_pack}.json")
        out = tmp_path / f"out{dsp_pack}"
        assert main(["verilog", "--config", str(tmp_path / f"{dsp_pack}.json"),
                     "-o", str(out)]) == 0
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["config"]["dsp_pack"] is dsp_pack
        assert ("-unpacked" in manifest["config_name"]) is not dsp_pack
        written[dsp_pack] = (out / f"{TOP_NAME}.v").read_text()
    assert "[32:0] mul_b0_n0_k0" in written[True] and "mul_b0_n1_k0" not in written[True]
    assert "[15:0] mul_b0_n0_k0" in written[False] and "[15:0] mul_b0_n1_k0" in written[False]
