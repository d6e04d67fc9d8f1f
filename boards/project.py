"""Everything a board's vendor flow needs, written into one folder.

`generate(board, config, out_dir)` writes:

- ``vdla_accelerator.v``: the accelerator (`vdla.hw.verilog`, the packed GEMM form);
- ``vdla_axi.v``: the board-level wrapper with the vendor's port naming
  (`vdla.boards.wrapper`);
- the constraints (``.xdc``, ``.sdc`` or ``.lpf``) and the project script
  (``build_vivado.tcl``; ``build_quartus.tcl`` with a Platform Designer component and a
  top level; ``build_ecp5.sh``), each from the one template of the board's vendor in
  ``templates/`` with the board's facts filled in;
- ``manifest.json``: the core's manifest (config, ports, register map, AXI parameters)
  plus the board, its clock, the absolute register addresses, the address map and the
  list of files.

The vendor scripts are generated and their facts tested, but they have not been run on
the vendors' tools or on hardware (docs/boards.md). Every file is written atomically.
"""

from __future__ import annotations

import json
import os
import re
from importlib import resources
from pathlib import Path

from vdla._fileio import atomic_write
from vdla.boards import wrapper as wrapper_mod
from vdla.boards.board import REGISTER_WINDOW_BYTES, Board
from vdla.config import HardwareConfig
from vdla.hw.verilog import TOP_NAME, cached_verilog, manifest

__all__ = ["VENDOR_FILES", "generate", "board_manifest", "render"]

#: Per vendor: output file name -> template name. `{board_id}` is the board's name with
#: dashes as underscores (a valid identifier for module and file names).
VENDOR_FILES = {
    "xilinx": {"build_vivado.tcl": "vivado.tcl", "{board_id}.xdc": "vivado.xdc"},
    "intel": {"build_quartus.tcl": "quartus.tcl", "vdla_axi_hw.tcl": "quartus_hw.tcl",
              "vdla_{board_id}_top.v": "quartus_top.v", "{board_id}.sdc": "quartus.sdc"},
    "lattice": {"build_ecp5.sh": "ecp5.sh", "{board_id}.lpf": "ecp5.lpf"},
}
#: The constraints file of each vendor (also named in its project script).
_CONSTRAINTS = {"xilinx": "{board_id}.xdc", "intel": "{board_id}.sdc",
                "lattice": "{board_id}.lpf"}

#: Processing-system settings for the Vivado template: the PS IP's automation rule,
#: its configuration (ports, widths, clocks, interrupt; of a board and a config) and its
#: external pins. A config whose bus is wider than the port (`Board.bridged`) gets a
#: second fabric clock at the port's speed for the port alone.
_XILINX_PS = {
    "processing_system7": {
        "rule": "xilinx.com:bd_rule:processing_system7",
        "config": lambda b, c: {
            "CONFIG.PCW_USE_M_AXI_GP0": 1, "CONFIG.PCW_USE_S_AXI_HP0": 1,
            "CONFIG.PCW_S_AXI_HP0_DATA_WIDTH": b.dram_bus_width,
            "CONFIG.PCW_FPGA0_PERIPHERAL_FREQMHZ": f"{b.clock_mhz:g}",
            **({"CONFIG.PCW_EN_CLK1_PORT": 1,
                "CONFIG.PCW_FPGA1_PERIPHERAL_FREQMHZ": f"{b.dram_port_mhz:g}"}
               if b.bridged(c) else {}),
            "CONFIG.PCW_USE_FABRIC_INTERRUPT": 1, "CONFIG.PCW_IRQ_F2P_INTR": 1},
        "external": "apply_bd_automation -rule xilinx.com:bd_rule:processing_system7 "
                    "-config {make_external \"FIXED_IO, DDR\"} $ps",
    },
    "zynq_ultra_ps_e": {
        "rule": "xilinx.com:bd_rule:zynq_ultra_ps_e",
        "config": lambda b, c: {
            "CONFIG.PSU__USE__M_AXI_GP0": 1, "CONFIG.PSU__USE__M_AXI_GP1": 0,
            "CONFIG.PSU__USE__M_AXI_GP2": 0, "CONFIG.PSU__USE__S_AXI_GP2": 1,
            "CONFIG.PSU__SAXIGP2__DATA_WIDTH": b.dram_bus_width,
            "CONFIG.PSU__FPGA_PL0_ENABLE": 1,
            "CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ": f"{b.clock_mhz:g}",
            **({"CONFIG.PSU__FPGA_PL1_ENABLE": 1,
                "CONFIG.PSU__CRL_APB__PL1_REF_CTRL__FREQMHZ": f"{b.dram_port_mhz:g}"}
               if b.bridged(c) else {}),
            "CONFIG.PSU__USE__IRQ0": 1},
        "external": "# Zynq UltraScale+: DDR and MIO are inside the PS; nothing to export.",
    },
}

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def render(template: str, values: dict) -> str:
    """`template` with each ``{{name}}`` replaced by ``values[name]``; a name without a
    value is an error (a template and its generator must agree)."""
    missing = sorted({m.group(1) for m in _PLACEHOLDER.finditer(template)} - set(values))
    if missing:
        raise KeyError(f"template needs values for: {', '.join(missing)}")
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)


def _template(name: str) -> str:
    return resources.files("vdla.boards").joinpath("templates", name).read_text()


def board_id(board: Board) -> str:
    return board.name.replace("-", "_")


def board_manifest(board: Board, core: dict, files: list[str]) -> dict:
    """The core's manifest `core` extended with the board's facts."""
    info = dict(core)
    naming = wrapper_mod.NAMINGS[board.family.vendor]
    info["board"] = board.to_dict()
    info["clock"] = {"port": naming.clock, "mhz": board.clock_mhz,
                     "core_port": core["clock"]["port"]}
    info["reset"] = {"port": naming.reset,
                     "active": "low" if naming.reset_active_low else "high",
                     "synchronous": True, "core_port": core["reset"]["port"]}
    control = dict(core["control"])
    control["base"] = board.register_base
    control["registers"] = [dict(reg, address=board.register_base + reg["offset"])
                            for reg in core["control"]["registers"]]
    control["counters"] = {name: dict(c, address=board.register_base + c["offset"])
                           for name, c in core["control"]["counters"].items()}
    info["control"] = control
    info["address_map"] = board.address_map()
    info["wrapper"] = {"top": wrapper_mod.WRAPPER_NAME, "vendor": board.family.vendor,
                       "ports": wrapper_mod.wrapper_ports(board.family.vendor, core)}
    info["files"] = files
    info["tested_on_hardware"] = False
    return info


def _values(board: Board, config: HardwareConfig, core: dict) -> dict:
    ident = board_id(board)
    values = {
        "board": board.name, "board_id": ident, "board_title": board.title,
        "part": board.part.name, "clock_mhz": f"{board.clock_mhz:g}",
        "period_ns": f"{1e3 / board.clock_mhz:.3f}",
        "register_base": f"0x{board.register_base:08X}",
        "register_range": REGISTER_WINDOW_BYTES, "dram_bus_width": board.dram_bus_width,
        **_dram_link(board, config),
        "config_name": config.name, "wrapper": wrapper_mod.WRAPPER_NAME,
        "vdla_version": core["generator"]["vdla"],
        "constraints": _CONSTRAINTS[board.family.vendor].format(board_id=ident),
    }
    vendor = dict(board.vendor)
    if "ps_ip" in vendor:
        ps = _XILINX_PS[vendor["ps_ip"]]
        values["ps_rule"] = ps["rule"]
        values["ps_config"] = " ".join(f"{k} {{{v}}}"
                                       for k, v in ps["config"](board, config).items())
        values["ps_external"] = ps["external"]
    if "clock_pin_mhz" in vendor:
        values["clock_pin_hz"] = int(vendor["clock_pin_mhz"] * 1e6)
        values["clock_pin_period_ns"] = f"{1e3 / vendor['clock_pin_mhz']:.3f}"
    if board.family.vendor == "intel":
        values.update(_platform_designer_ports(core))
    values.update({k: v for k, v in vendor.items() if k not in values})
    return values


def _dram_link(board: Board, config: HardwareConfig) -> dict[str, str]:
    """How the Vivado template connects the accelerator's master to the DRAM port: the
    automation's clock options, and the link in words. A master as wide as the port
    shares the fabric clock with it; a wider one (`Board.bridged`) reaches it through
    the interconnect's width and clock converters, with the port on its own clock at
    `Board.dram_port_mhz`."""
    if not board.bridged(config):
        return {"dram_clocks": "Clk Auto", "dram_link": f"{board.dram_bus_width} bits"}
    fclk, port_fclk = board.vendor.get("fclk"), board.vendor.get("port_fclk")
    return {"dram_clocks": f"Clk_master /ps/{fclk} Clk_slave /ps/{port_fclk} "
                           f"Clk_xbar /ps/{port_fclk}",
            "dram_link": f"a {config.dram_bus_width}-bit master bridged to the "
                         f"{board.dram_bus_width}-bit port at {board.dram_port_mhz:g} MHz "
                         f"from {port_fclk}"}


def _platform_designer_ports(core: dict) -> dict[str, str]:
    """``add_interface_port`` lines of each interface of the Quartus component."""
    groups = {"clock_ports": [], "reset_ports": [], "ctrl_ports": [], "dram_ports": [],
              "irq_ports": []}
    for port in wrapper_mod.wrapper_ports("intel", core):
        direction = "Input" if port["direction"] == "input" else "Output"
        if port["core"] == "clk":
            groups["clock_ports"].append(("clock", port["name"], "clk", direction, 1))
        elif port["core"] == "rst":
            groups["reset_ports"].append(("reset", port["name"], "reset", direction, 1))
        elif port["core"] == "irq":
            groups["irq_ports"].append(("irq", port["name"], "irq", direction, 1))
        else:
            interface = "ctrl" if port["bus"] == "s_axi_ctrl" else "dram"
            groups[f"{interface}_ports"].append(
                (interface, port["name"], port["signal"], direction, port["width"]))
    return {key: "\n".join(f"add_interface_port {i} {n} {role} {d} {w}"
                           for i, n, role, d, w in rows)
            for key, rows in groups.items()}


def generate(board: Board, config: HardwareConfig | None, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write the board's files for `config` (the board's default when None) into
    `out_dir`; returns {file name: path}. Fails before writing anything when the config
    does not suit the board (bus width, on-chip memory)."""
    config = board.apply(config)
    board.check_memory(config)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"output {str(out)!r} exists and is not a folder")
    core = manifest(config)
    vendor = board.family.vendor
    ident = board_id(board)
    texts = {f"{TOP_NAME}.v": cached_verilog(config),
             f"{wrapper_mod.WRAPPER_NAME}.v": wrapper_mod.to_verilog(vendor, core,
                                                                     board.clock_mhz)}
    values = _values(board, config, core)
    for out_name, template in VENDOR_FILES[vendor].items():
        texts[out_name.format(board_id=ident)] = render(_template(template), values)
    files = sorted(texts) + ["manifest.json"]
    texts["manifest.json"] = json.dumps(board_manifest(board, core, files),
                                        indent=2) + "\n"
    paths = {}
    for name, text in texts.items():
        paths[name] = atomic_write(out / name, text.encode())
        if name.endswith(".sh"):
            paths[name].chmod(paths[name].stat().st_mode | 0o111)
    return paths
