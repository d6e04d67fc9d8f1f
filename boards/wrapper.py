"""The board-level Verilog wrapper: the accelerator with ports named the vendor's way.

Vendor tools find bus interfaces by port names. Vivado's IP packager groups
``m_axi_awaddr``-style ports into an AXI interface and reads the ``X_INTERFACE_INFO``
attributes the wrapper also carries; Platform Designer (Quartus) uses its
``<kind>_<interface>_<signal>`` prefixes (``axs_`` AXI slave, ``axm_`` AXI master,
``csi_`` clock sink, ``rsi_`` reset sink, ``ins_`` interrupt sender); the open ECP5 flow
has no IP integrator and keeps AXI's own names. The wrapper also turns the reset into
the vendor's polarity (AXI's active-low ``aresetn`` on Xilinx) and drives the AXI4
master's optional attributes (cache, protection, lock, QoS) that the core leaves out.

`wrapper_ports(vendor, manifest)` maps every core port to its wrapper name;
`to_verilog(vendor, manifest, clock_mhz)` writes the module.
"""

from __future__ import annotations

import dataclasses

__all__ = ["WRAPPER_NAME", "Naming", "NAMINGS", "wrapper_ports", "to_verilog"]

WRAPPER_NAME = "vdla_axi"

#: AXI4 master signals the core does not have, as (width, value) the wrapper drives:
#: AxCACHE 0011 (normal, non-cacheable, bufferable: what Xilinx's HP ports expect for
#: ordinary DRAM traffic), no protection bits, normal (not exclusive) access, QoS 0.
EXTRA_MASTER_OUTPUTS = {"cache": (4, 0b0011), "prot": (3, 0), "lock": (1, 0), "qos": (4, 0)}


@dataclasses.dataclass(frozen=True)
class Naming:
    """How one vendor names the wrapper's ports.

    clock, reset : port names; `reset_active_low` says which polarity the reset has
    ctrl, dram : the prefixes of the control slave's and the DRAM master's signals
    irq : the interrupt port
    attributes : add Xilinx ``X_INTERFACE_INFO`` attributes
    """

    clock: str
    reset: str
    reset_active_low: bool
    ctrl: str
    dram: str
    irq: str
    attributes: bool = False


NAMINGS = {
    "xilinx": Naming(clock="aclk", reset="aresetn", reset_active_low=True,
                     ctrl="s_axi_ctrl_", dram="m_axi_", irq="irq", attributes=True),
    "intel": Naming(clock="csi_clock_clk", reset="rsi_reset_reset", reset_active_low=False,
                    ctrl="axs_ctrl_", dram="axm_dram_", irq="ins_irq_irq"),
    "lattice": Naming(clock="clk", reset="rst", reset_active_low=False,
                      ctrl="s_axi_ctrl_", dram="m_axi_", irq="irq"),
}

#: Core interface names (the `Accelerator`'s members) and the naming field of each.
_BUSES = {"s_axi_ctrl": "ctrl", "m_axi": "dram"}


def _naming(vendor: str) -> Naming:
    try:
        return NAMINGS[vendor]
    except KeyError:
        raise ValueError(f"unknown vendor {vendor!r}; known: {', '.join(NAMINGS)}") from None


def wrapper_ports(vendor: str, manifest: dict) -> list[dict]:
    """The wrapper's ports: {"name", "direction", "width", "core" (the core port it
    drives or reads, None for the constants), "bus", "signal"} in the core's order, then
    the AXI4 master's extra outputs (with their constant "value")."""
    naming = _naming(vendor)
    ports = []
    for port in manifest["ports"]:
        name = port["name"]
        entry = {"direction": port["direction"], "width": port["width"], "core": name,
                 "bus": None, "signal": None}
        if name == "clk":
            entry["name"] = naming.clock
        elif name == "rst":
            entry["name"] = naming.reset
        elif name == "irq":
            entry["name"] = naming.irq
        elif "__" in name and name.split("__")[0] in _BUSES:
            bus, signal = name.split("__", 1)
            prefix = getattr(naming, _BUSES[bus])
            entry.update(name=prefix + signal, bus=bus, signal=signal)
        else:
            continue  # the debug state vector stays inside the wrapper
        ports.append(entry)
    for channel in ("aw", "ar"):
        for what, (width, value) in EXTRA_MASTER_OUTPUTS.items():
            signal = channel + what
            ports.append({"name": naming.dram + signal, "direction": "output", "width": width,
                          "core": None, "bus": "m_axi", "signal": signal, "value": value})
    return ports


def _attributes(port: dict, naming: Naming, clock_mhz: float) -> list[str]:
    """Xilinx interface attributes for one port (empty for other vendors)."""
    if not naming.attributes:
        return []
    if port["core"] == "clk":
        hz = round(clock_mhz * 1e6)
        return ['(* X_INTERFACE_INFO = "xilinx.com:signal:clock:1.0 aclk CLK" *)',
                f'(* X_INTERFACE_PARAMETER = "ASSOCIATED_BUSIF s_axi_ctrl:m_axi, '
                f'ASSOCIATED_RESET {naming.reset}, FREQ_HZ {hz}" *)']
    if port["core"] == "rst":
        return [f'(* X_INTERFACE_INFO = "xilinx.com:signal:reset:1.0 {naming.reset} RST" *)',
                '(* X_INTERFACE_PARAMETER = "POLARITY ACTIVE_LOW" *)']
    if port["core"] == "irq":
        return ['(* X_INTERFACE_INFO = "xilinx.com:signal:interrupt:1.0 irq INTERRUPT" *)',
                '(* X_INTERFACE_PARAMETER = "SENSITIVITY LEVEL_HIGH" *)']
    if port["bus"]:
        return [f'(* X_INTERFACE_INFO = "xilinx.com:interface:aximm:1.0 {port["bus"]} '
                f'{port["signal"].upper()}" *)']
    return []


def to_verilog(vendor: str, manifest: dict, clock_mhz: float, *,
               name: str = WRAPPER_NAME) -> str:
    """Verilog of the wrapper module `name` around the core in `manifest` (its ``top``
    and ``ports``) for `vendor`'s tools."""
    naming = _naming(vendor)
    ports = wrapper_ports(vendor, manifest)
    core = manifest["top"]
    lines = [
        f"// {name}: vdla's {manifest['config_name']} accelerator with {vendor} port naming.",
        "// Generated by vdla (`vdla verilog --board`); edit the generator, not this file.",
        "`default_nettype none",
        f"module {name} (",
    ]
    decls = []
    for port in ports:
        width = f"[{port['width'] - 1}:0] " if port["width"] > 1 else ""
        decl = [f"    {a}" for a in _attributes(port, naming, clock_mhz)]
        decl.append(f"    {port['direction']} wire {width}{port['name']}")
        decls.append("\n".join(decl))
    lines.append(",\n".join(decls))
    lines.append(");")
    reset = f"~{naming.reset}" if naming.reset_active_low else naming.reset
    lines.append("    // The core's state vector (a debug aid) is left unconnected here.")
    lines.append("    wire [31:0] state_unused;")
    connections = []
    for port in ports:
        if port["core"] is None:
            continue
        signal = reset if port["core"] == "rst" else port["name"]
        connections.append(f"        .{port['core']}({signal})")
    connections.append("        .state(state_unused)")
    lines.append(f"    {core} core (")
    lines.append(",\n".join(connections))
    lines.append("    );")
    for port in ports:
        if port["core"] is None:
            lines.append(f"    assign {port['name']} = "
                         f"{port['width']}'b{port['value']:0{port['width']}b};")
    lines += ["endmodule", "`default_nettype wire", ""]
    return "\n".join(lines)
