"""Amaranth description of the accelerator, parameterized only by `vdla.HardwareConfig`.

- `Accelerator` (`vdla.hw.top`): the top level, an AXI4-Lite control slave
  (`vdla.hw.control`, the register map of `vdla.isa.registers`) and an AXI4 master to DRAM.
- Modules: `FetchModule`, `LoadModule`, `ComputeModule` (micro-op engine, GEMM core,
  ALU), `StoreModule`; `DepQueue` and `CommandQueue`; the 2-D DMA engines; the SRAMs.
- `vdla.hw.verilog.generate(config, out_dir)` writes the Verilog and a manifest.

The functional simulator (`vdla.sim`) defines the behaviour the hardware must match.
"""

# vdla.hw.verilog itself loads Amaranth only when it builds the design.
from vdla.hw.verilog import generate, to_verilog

__all__ = ["Accelerator", "generate", "to_verilog"]


def __getattr__(name):
    if name == "Accelerator":
        # Amaranth is a heavy import: it is loaded only when the hardware is asked for.
        from vdla.hw.top import Accelerator
        return Accelerator
    raise AttributeError(f"module 'vdla.hw' has no attribute {name!r}")
