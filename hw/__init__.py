"""Amaranth description of the accelerator (fetch, load, compute, store, queues, SRAMs,
AXI, top level), parameterized by `vdla.HardwareConfig`. Arrives with the hardware issue;
the functional simulator (`vdla.sim`) defines the behaviour it must match."""
