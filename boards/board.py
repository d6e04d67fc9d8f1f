"""What vdla knows about an FPGA board: its part, its processing system and its memory.

A `Board` is plain data. The definitions live in `vdla.boards.catalog`, one short block
each; everything else (the wrapper, the constraints, the vendor scripts, the estimate
and the runtime's memory model) is derived from these fields.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import vdla.runtime
from vdla.config import HardwareConfig
from vdla.isa.registers import CONTROL_ADDR_WIDTH
from vdla.sim.verilator import DramTiming

__all__ = ["Board", "Family", "Part", "Resources", "FAMILIES", "REGISTER_WINDOW_BYTES"]

#: Bytes of address space the host maps for the control registers.
REGISTER_WINDOW_BYTES = 1 << CONTROL_ADDR_WIDTH


@dataclasses.dataclass(frozen=True)
class Resources:
    """Counts of the four resources vdla reports, in the units of the part's family.

    lut : logic cells (LUT6 on Xilinx, LUT4 on ECP5; on Cyclone V the ALMs, each of
        which holds one 6-input or two smaller LUTs, see `Family.lut_unit`)
    ff : flip-flops
    dsp : hard multiplier blocks (DSP48E1/E2, MULT18X18D, Cyclone V variable-precision
        DSP blocks)
    bram : block RAMs (RAMB36, ECP5 EBR of 18 Kbit, Cyclone V M10K)
    """

    lut: float
    ff: float
    dsp: float
    bram: float

    KEYS = ("lut", "ff", "dsp", "bram")

    def to_dict(self) -> dict[str, float]:
        return {key: getattr(self, key) for key in self.KEYS}

    def overflows(self, capacity: "Resources") -> dict[str, tuple[float, float]]:
        """The resources where `self` exceeds `capacity`: {key: (used, available)}."""
        return {key: (getattr(self, key), getattr(capacity, key)) for key in self.KEYS
                if getattr(self, key) > getattr(capacity, key)}


@dataclasses.dataclass(frozen=True)
class Family:
    """An FPGA family as vdla's tools see it.

    name : vdla's name of the family
    vendor : "xilinx", "intel" or "lattice"; picks the wrapper's port naming and the
        project-script template
    yosys : the yosys synthesis command for the family (without ``-top``)
    lut_unit, bram_unit : how the family counts those resources (for tables)
    bram_bits : data bits of one block RAM (the quick on-chip memory check uses it)
    """

    name: str
    vendor: str
    yosys: str
    lut_unit: str
    bram_unit: str
    bram_bits: int


FAMILIES = {family.name: family for family in (
    Family("zynq-7000", "xilinx", "synth_xilinx -family xc7 -flatten -noiopad",
           "LUT6", "RAMB36", 36 * 1024),
    Family("zynq-ultrascale+", "xilinx", "synth_xilinx -family xcup -flatten -noiopad",
           "LUT6", "RAMB36", 36 * 1024),
    # yosys has no flow for the Cyclone V's hard processor system, but synth_intel_alm
    # maps the fabric (ALMs, M10K, DSP blocks) of the Cyclone V, which is what we count.
    Family("cyclone-v", "intel", "synth_intel_alm -family cyclonev",
           "ALM", "M10K", 10 * 1024),
    Family("ecp5", "lattice", "synth_ecp5 -noiopad",
           "LUT4", "EBR", 18 * 1024),
)}


@dataclasses.dataclass(frozen=True)
class Part:
    """An FPGA part: its vendor name (as the vendor tool spells it), family and capacity."""

    name: str
    family: str
    capacity: Resources

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"part {self.name}: unknown family {self.family!r}; known: "
                             f"{', '.join(FAMILIES)}")

    @property
    def family_info(self) -> Family:
        return FAMILIES[self.family]


@dataclasses.dataclass(frozen=True)
class Board:
    """One FPGA board.

    name : vdla's name (``vdla verilog --board NAME``)
    title : the board as its maker names it
    part : the FPGA
    clock_mhz : the accelerator's default clock (the fabric clock the processing system
        or a PLL gives it); the untested vendor scripts request this clock
    dram_bus_width : bits of the DRAM port the accelerator's AXI master connects to
        (Zynq's S_AXI_HP0: 64; Zynq UltraScale+'s S_AXI_HP0_FPD: 128; ...). The board's
        default config uses it, and a config for the board must match it.
    dram_gbytes_per_s : peak bandwidth of the board's DRAM chips; with the port width
        and the clock it sets the simulated bytes per cycle
    dram_read_latency_ns : latency of a read burst's first beat through the port
    dram_size : bytes of DRAM the accelerator's port can reach, from `dram_base`
    dram_base : the byte address of the first DRAM byte on the accelerator's port
    register_base : the host's (processor's) physical address of the control register
        window (4 KiB)
    host : the processor and the ports used, in words (for the manifest and README)
    config : the default `HardwareConfig` (it fits the part; `bench/boards.py` shows it)
    vendor : vendor-flow facts for the project-script template (board part, PS IP, port
        names, pins); free-form, read only by the templates
    """

    name: str
    title: str
    part: Part
    clock_mhz: float
    dram_bus_width: int
    dram_gbytes_per_s: float
    dram_read_latency_ns: float
    dram_size: int
    register_base: int
    host: str
    config: HardwareConfig
    dram_base: int = 0
    vendor: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.register_base % REGISTER_WINDOW_BYTES:
            raise ValueError(f"board {self.name}: register_base {self.register_base:#x} is not "
                             f"aligned to the {REGISTER_WINDOW_BYTES}-byte window")
        # The default config is checked like any other and reports time at the board's clock.
        object.__setattr__(self, "config", self.apply(self.config))

    @property
    def family(self) -> Family:
        return self.part.family_info

    def apply(self, config: HardwareConfig | None) -> HardwareConfig:
        """`config` (the board's default when None) for this board: its clock becomes the
        board's, and its DRAM bus must be the board's port width (the wrapper wires the
        master straight to that port, and the memory model assumes it)."""
        if config is None:
            return self.config
        if config.dram_bus_width != self.dram_bus_width:
            raise ValueError(
                f"config {config.name} has a {config.dram_bus_width}-bit DRAM bus, but "
                f"{self.name}'s DRAM port ({self.host}) is {self.dram_bus_width} bits; set "
                f'"dram_bus_width": {self.dram_bus_width} in the config')
        return dataclasses.replace(config, clock_mhz=self.clock_mhz)

    def dram_timing(self):
        """The Verilator DRAM model of this board at its clock (`DramTiming`): bytes per
        cycle = the lesser of the port's width and the DRAM's peak bandwidth at the clock,
        read latency = `dram_read_latency_ns` in cycles. Every config for the board has
        the port's width (`apply`), so the model is the board's alone."""
        port_bytes = self.dram_bus_width / 8
        dram_bytes = self.dram_gbytes_per_s * 1e9 / (self.clock_mhz * 1e6)
        per_cycle = min(port_bytes, dram_bytes)
        # DramTiming takes eighths of a byte; round down (never faster than the board).
        per_cycle = math.floor(per_cycle * 8) / 8
        latency = max(1, math.ceil(self.dram_read_latency_ns * self.clock_mhz / 1e3))
        return DramTiming(read_latency=latency, bytes_per_cycle=per_cycle)

    def open_device(self, config: HardwareConfig | None = None, backend: str = "functional",
                    **options):
        """A `vdla.runtime` device for `config` (the board's default when None) on this
        board: the config at the board's clock, and on Verilator the board's DRAM model
        (unless `options` give ``dram``)."""
        config = self.apply(config)
        if backend == "verilator":
            options.setdefault("dram", self.dram_timing())
        return vdla.runtime.open(config, backend=backend, **options)

    def check_memory(self, config: HardwareConfig | None = None) -> None:
        """Fail fast (before minutes of synthesis) when the config's SRAMs alone need more
        bits than all the part's block RAMs hold."""
        config = self.apply(config)
        need = 8 * (config.uop_buff_size + config.inp_buff_size + config.wgt_buff_size
                    + config.acc_buff_size + config.out_buff_size)
        family = self.family
        have = int(self.part.capacity.bram) * family.bram_bits
        if need > have:
            raise ValueError(
                f"config {config.name} does not fit {self.name} ({self.part.name}): its "
                f"buffers need {need // 1024:,} Kbit of on-chip RAM, the part has "
                f"{have // 1024:,} Kbit ({int(self.part.capacity.bram)} {family.bram_unit}); "
                "make the wgt, inp or acc buffer smaller")

    def address_map(self) -> dict:
        """The host's and the accelerator's view of the address space (for the manifest)."""
        return {
            "registers": {"base": self.register_base, "size": REGISTER_WINDOW_BYTES,
                          "master": "host"},
            "dram": {"base": self.dram_base, "size": self.dram_size, "master": "accelerator"},
        }

    def to_dict(self) -> dict:
        """The board's facts as JSON-ready data (``vdla boards --json``, manifests)."""
        return {
            "name": self.name, "title": self.title, "part": self.part.name,
            "family": self.part.family, "vendor": self.family.vendor,
            "clock_mhz": self.clock_mhz, "dram_bus_width": self.dram_bus_width,
            "dram_gbytes_per_s": self.dram_gbytes_per_s,
            "dram_read_latency_ns": self.dram_read_latency_ns,
            "register_base": self.register_base, "dram_base": self.dram_base,
            "dram_size": self.dram_size, "host": self.host,
            "capacity": self.part.capacity.to_dict(),
            "config": self.config.name,
        }
