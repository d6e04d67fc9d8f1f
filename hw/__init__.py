"""Amaranth description of the accelerator, parameterized only by `vdla.HardwareConfig`.

- `Accelerator` (`vdla.hw.top`): the top level, an AXI4-Lite control slave
  (`vdla.hw.control` has the register map) and an AXI4 master to DRAM.
- Modules: `FetchModule`, `LoadModule`, `ComputeModule` (micro-op engine, GEMM core,
  ALU), `StoreModule`; `DepQueue` and `CommandQueue`; the 2-D DMA engines; the SRAMs.
- `vdla.hw.verilog.generate(config, out_dir)` writes the Verilog and a manifest.

The functional simulator (`vdla.sim`) defines the behaviour the hardware must match.
"""

__all__ = ["Accelerator", "generate", "to_verilog"]


def __getattr__(name):
    # Amaranth is imported only when the hardware is asked for.
    if name == "Accelerator":
        from vdla.hw.top import Accelerator
        return Accelerator
    if name in ("generate", "to_verilog"):
        from vdla.hw import verilog
        return getattr(verilog, name)
    raise AttributeError(f"module 'vdla.hw' has no attribute {name!r}")
