"""Host runtime: devices (the device API), DRAM allocation, instruction-stream building."""

from vdla.runtime.allocator import DramAllocator, OutOfMemory
from vdla.runtime.builder import COMPUTE, LOAD, STORE, ProgramBuilder
from vdla.runtime.device import (BACKENDS, STAT_KEYS, Device, FunctionalDevice, dram_alignment,
                                  open)

__all__ = ["open", "Device", "FunctionalDevice", "BACKENDS", "STAT_KEYS", "dram_alignment",
           "DramAllocator", "OutOfMemory", "ProgramBuilder", "LOAD", "COMPUTE", "STORE"]
