"""What vdla knows about an FPGA board: its part, its processing system and its memory.

A `Board` is plain data. The definitions live in `vdla.boards.catalog`, one short block
each; everything else (the wrapper, the constraints, the vendor scripts, the estimate
and the runtime's memory model) is derived from these fields.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Mapping

import vdla.runtime
from vdla.config import HardwareConfig
from vdla.isa.registers import CONTROL_ADDR_WIDTH
from vdla.deploy.board.hardware import (BoardError, bitstream_config, bitstream_mismatch,
                                        open_layers)
from vdla.deploy.board_device import BoardDevice
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
        default config uses it; a config for the board must match it, or be wider where
        the port has its own clock (`dram_port_mhz`)
    dram_port_mhz : the fastest clock of the DRAM port where it may run faster than the
        accelerator (Zynq-7000's HP ports take 150 MHz on the -1 speed grade), else None.
        A config with a wider bus is then bridged to the port by the project's AXI
        interconnect (a width and a clock converter), and the port, at this clock, carries
        ``dram_bus_width / 8 * dram_port_mhz / clock_mhz`` bytes per accelerator cycle
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
    dram_port_mhz: float | None = None
    vendor: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.register_base % REGISTER_WINDOW_BYTES:
            raise ValueError(f"board {self.name}: register_base {self.register_base:#x} is not "
                             f"aligned to the {REGISTER_WINDOW_BYTES}-byte window")
        if self.dram_port_mhz is not None and not self.dram_port_mhz > self.clock_mhz:
            raise ValueError(f"board {self.name}: dram_port_mhz {self.dram_port_mhz!r} must "
                             f"be above the clock ({self.clock_mhz:g} MHz), or None")
        # The default config is checked like any other and reports time at the board's clock.
        object.__setattr__(self, "config", self.apply(self.config))

    @property
    def family(self) -> Family:
        return self.part.family_info

    @property
    def runs_runtime(self) -> bool:
        """Whether vdla's board runtime runs on this board's own Linux: a Zynq's, whose
        processor reaches the accelerator's registers and DMA memory (pynq, or
        ``/dev/mem`` and u-dma-buf). Other boards' projects build, and have no host
        for it."""
        return self.family.name.startswith("zynq")

    def apply(self, config: HardwareConfig | None) -> HardwareConfig:
        """`config` (the board's default when None) on this board: its clock becomes the
        board's and its `dram_bytes_per_cycle` what the board's DRAM gives it (the method
        `dram_bytes_per_cycle`). Its DRAM bus must be the board's port width (the wrapper
        wires the master straight to that port), or, where the port has its own faster
        clock (`dram_port_mhz`), any wider bus (`bridged`: the project puts a width and
        clock converter between them)."""
        if config is None:
            return self.config
        width = config.dram_bus_width
        wider = self.dram_port_mhz is not None and width > self.dram_bus_width
        if width != self.dram_bus_width and not wider:
            allowed = (f"{self.dram_bus_width} bits" if not self.dram_port_mhz else
                       f"{self.dram_bus_width} bits or wider (bridged to the port at "
                       f"{self.dram_port_mhz:g} MHz)")
            raise ValueError(
                f"config {config.name} has a {width}-bit DRAM bus, but "
                f"{self.name}'s DRAM port ({self.host}) takes {allowed}; set "
                f'"dram_bus_width": {self.dram_bus_width} in the config')
        return dataclasses.replace(config, clock_mhz=self.clock_mhz,
                                   dram_bytes_per_cycle=self.dram_bytes_per_cycle(config))

    def bridged(self, config: HardwareConfig | None = None) -> bool:
        """Whether `config` (the board's default when None) reaches the DRAM port through
        a width and clock converter: its bus is wider than the port (`apply`)."""
        config = self.config if config is None else config
        return config.dram_bus_width > self.dram_bus_width

    def dram_bytes_per_cycle(self, config: HardwareConfig | None = None) -> float:
        """Bytes per accelerator cycle, each way, the board's DRAM gives `config` (the
        board's default when None): the least of its bus width, what the port carries
        (its width at the accelerator's clock, or, bridged, at `dram_port_mhz`) and the
        DRAM chips' peak bandwidth at the clock; rounded down to eighths of a byte (the
        DRAM model's unit: never faster than the board)."""
        config = self.config if config is None else config
        port = self.dram_bus_width / 8
        if self.bridged(config):
            port *= self.dram_port_mhz / self.clock_mhz
        dram = self.dram_gbytes_per_s * 1e9 / (self.clock_mhz * 1e6)
        return math.floor(min(port, config.dram_bus_width / 8, dram) * 8) / 8

    def dram_timing(self, config: HardwareConfig | None = None):
        """The Verilator DRAM model of `config` (the board's default when None) on this
        board (`DramTiming`): the bytes per cycle of `dram_bytes_per_cycle`, read latency
        = `dram_read_latency_ns` in cycles of the board's clock."""
        config = self.apply(config)
        latency = max(1, math.ceil(self.dram_read_latency_ns * self.clock_mhz / 1e3))
        return DramTiming(read_latency=latency, bytes_per_cycle=config.dram_bytes_per_cycle)

    def open_device(self, config: HardwareConfig | None = None, backend: str = "functional",
                    **options):
        """A `vdla.runtime` device for `config` (the board's default when None) on this
        board: the config at the board's clock, and on Verilator the board's DRAM model
        (unless `options` give ``dram``)."""
        config = self.apply(config)
        if backend == "verilator":
            options.setdefault("dram", self.dram_timing(config))
        return vdla.runtime.open(config, backend=backend, **options)

    def open_hardware(self, config: HardwareConfig | None = None, *,
                      manifest: str | os.PathLike | None = None, dram_size: int = 64 << 20,
                      **options):
        """The accelerator of this board's bitstream, from the board's own Linux (as
        root): a `vdla.deploy.board_device.BoardDevice` with its registers at `register_base`
        through pynq where it is installed, else ``/dev/mem``, and `dram_size` bytes of
        DMA memory from `pynq.allocate`, else the first u-dma-buf device, and the done
        interrupt where a UIO device named ``vdla`` has it (else CTRL is polled).
        `options` go to the device (``timeout``, ``interrupt``).

        The config is the bitstream's: its `manifest` (the ``manifest.json`` `vdla
        verilog --board` writes beside the project) when given, else `config`, else the
        board's default. `BoardError` when `config` and the manifest's differ, naming
        how (`bitstream_mismatch`): programs of one do not run on the other, or when the
        board has no processor for the runtime (`runs_runtime`)."""
        if not self.runs_runtime:
            raise BoardError(f"board {self.name} ({self.family.name}): the board runtime runs "
                             "on a Zynq's Linux")
        if manifest is not None:
            built = bitstream_config(manifest)
            problem = bitstream_mismatch(built, config) if config is not None else ""
            if problem:
                raise BoardError(problem)
            config = built
        config = self.config if config is None else config
        # The same layers the bundle's runner opens (`open_layers`); the done interrupt
        # where the board's Linux exposes it as a UIO device, else the runtime polls CTRL.
        mmio, memory, interrupt = open_layers(self.register_base, dram_size,
                                              interrupt="interrupt" not in options)
        if interrupt is not None:
            options["interrupt"] = interrupt
        return BoardDevice(config, mmio=mmio, memory=memory, **options)

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
            "dram_port_mhz": self.dram_port_mhz,
            "dram_gbytes_per_s": self.dram_gbytes_per_s,
            "dram_read_latency_ns": self.dram_read_latency_ns,
            "register_base": self.register_base, "dram_base": self.dram_base,
            "dram_size": self.dram_size, "host": self.host,
            "capacity": self.part.capacity.to_dict(),
            "config": self.config.name,
        }
