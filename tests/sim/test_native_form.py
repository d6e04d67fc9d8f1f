"""The NATIVE form's contract with the Verilator harness (`vdla.hw.gemm_forms`,
`vdla.hw.top._latched`): the harness drives the bus inputs a cycle ahead and never runs
Verilator's input region, so no logic may read a top-level input but a latch. That the
form gives the other forms' results and cycles is tests/sim/test_gemm_arithmetic.py's."""

import re

import pytest

import vdla
from vdla.hw.gemm_forms import native_gemm_memories, native_gemm_ports
from vdla.sim.verilator import BuildError
from vdla.sim.verilator.build import _check_inputs_latched, cached_verilog

# Inputs whose only reader is a register anyway: the clock, the reset (registered by
# the build, `registered_reset`) and the sums (the reduce stage registers them).
DIRECT = {"clk", "rst", "native_gemm_sums"}


def top_body(verilog: str) -> str:
    """The top module's body, after its port list."""
    start = verilog.index(");\n", verilog.index("module vdla_accelerator("))
    return verilog[start + 3:verilog.index("endmodule", start)]


@pytest.mark.parametrize("config", [vdla.HardwareConfig(),
                                    vdla.HardwareConfig(dw_taps=3)], ids=["default", "dw"])
def test_every_bus_input_is_read_only_by_its_latch(config):
    # The Verilog the Verilator backend builds (the reset registered), from the cache
    # the suite's builds of these configs fill.
    top = top_body(cached_verilog(config, gemm_arithmetic="native"))
    inputs = re.findall(r"^\s*input (?:\[[0-9:]+\] )?(\w+);", top, re.M)
    assert {"m_axi__rdata", "m_axi__rvalid", "s_axi_ctrl__wdata"} <= set(inputs)
    for name in set(inputs) - DIRECT:
        uses = [line.strip() for line in top.splitlines()
                if re.search(rf"(?<![\w$]){name}(?![\w$])", line)
                and not re.match(rf"\s*(input|wire)\b.*\b{name};", line)]
        assert uses == [f"m_axi_latched__{name[len('m_axi__'):]} <= {name};"
                        if name.startswith("m_axi__") else
                        f"s_axi_ctrl_latched__{name[len('s_axi_ctrl__'):]} <= {name};"], \
            (name, uses)


def test_the_ports_and_memories_follow_the_config():
    plain, dw = vdla.HardwareConfig(), vdla.HardwareConfig(dw_taps=3)
    assert set(native_gemm_memories(plain)) == {"inp", "wgt"}
    assert set(native_gemm_memories(dw)) == {"wgt"}   # the dw window reads inp itself
    wgt = native_gemm_memories(plain)["wgt"]
    assert (wgt.depth, wgt.row_bytes, wgt.lanes) == (plain.wgt_depth, plain.wgt_elem_bytes,
                                                     plain.wgt_elem_bytes * 8
                                                     // plain.dram_bus_width)
    ports = native_gemm_ports(plain)
    assert ports["native_wgt_write_word"] == plain.dram_bus_width
    assert "native_gemm_inp_addr" in ports and "native_gemm_x" not in ports
    assert "native_gemm_x" in native_gemm_ports(dw)
    assert "native_gemm_inp_addr" not in native_gemm_ports(dw)


def test_a_model_with_input_logic_is_refused(tmp_path):
    """What the build checks after Verilating the NATIVE form: Verilator's input region
    is empty (its harness never runs it)."""
    (tmp_path / "Vvdla_accelerator___024root__0.cpp").write_text(
        "void Vvdla_accelerator___024root___eval_nba(Vvdla_accelerator___024root* vlSelf) {}\n")
    _check_inputs_latched(tmp_path)
    (tmp_path / "Vvdla_accelerator___024root__1.cpp").write_text(
        "void Vvdla_accelerator___024root___ico_sequent__TOP__0(Vvdla_accelerator___024root*"
        " vlSelf) {}\n")
    with pytest.raises(BuildError, match="depends on a top-level input"):
        _check_inputs_latched(tmp_path)
