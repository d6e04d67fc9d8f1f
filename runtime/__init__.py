"""Host runtime: devices (the device API), DRAM allocation, instruction-stream building."""

from vdla.runtime.allocator import DramAllocator, OutOfMemory
from vdla.runtime.builder import COMPUTE, LOAD, STORE, ProgramBuilder
from vdla.runtime.device import BACKENDS, Device, FunctionalDevice, dram_alignment, open

__all__ = ["open", "Device", "FunctionalDevice", "BACKENDS", "dram_alignment",
           "DramAllocator", "OutOfMemory", "ProgramBuilder", "LOAD", "COMPUTE", "STORE"]
