"""The accelerator's control register map: the host's view of the hardware, as plain data.

This module is the one source of truth for the AXI4-Lite control window: the hardware
(`vdla.hw.control.ControlRegisters`), the Verilog manifest, the Verilator harness, the
board files and the drivers all read it, and docs/isa.md ("Memory map") describes it (a
test holds that page's table to `REGISTERS`). It imports only the standard library, so
host-side code (boards, simulators, drivers) can use the map without loading Amaranth.

Register map (32-bit registers, byte offsets in the ``2**CONTROL_ADDR_WIDTH``-byte
control window):

======  ==================  ====  ========================================================
offset  name                 acc  meaning
======  ==================  ====  ========================================================
0x00    CTRL                 RW   write bit 0 = 1 (`CTRL_START`): start (ignored while
                                  running); read: bit 0 running (`STATUS_RUNNING`),
                                  bit 1 done since the last start (`STATUS_DONE`)
0x04    ID                   RO   `ACCEL_ID`, 0x56444C41 ("VDLA")
0x08    VERSION              RO   register-map version (`REGMAP_VERSION`)
0x10    INSN_ADDR            RW   DRAM byte address of the first instruction (16-aligned)
0x14    INSN_COUNT           RW   number of instructions
0x18    STATE                RO   live state of every unit (`STATE_BITS`), to diagnose a
                                  run that hangs
0x20..  counters             RO   64-bit counters (`COUNTERS`), low word at the offset,
                                  high word at offset + 4; cleared by start, counting
                                  while running
======  ==================  ====  ========================================================

Counters (`COUNTERS`): ``cycles``; ``fetch_busy``, ``load_busy``, ``compute_busy``,
``store_busy`` (cycles with an instruction executing or pushing its tokens);
``gemm_active`` and ``alu_active`` (cycles a GEMM / ALU micro-op entered the pipeline);
``stall_load_compute``, ``stall_compute_load``, ``stall_compute_store``,
``stall_store_compute`` (cycles the consumer of that token queue waited on it with an
instruction at its head); ``dram_bytes_read`` and ``dram_bytes_written`` (whole bus
words moved on the AXI master, so a partial word counts in full); ``fetched_insns``
(instructions fetch routed), ``load_insns``, ``compute_insns`` and ``store_insns``
(instructions each module retired).
The counters freeze at done, so the host reads a consistent set after a run. They count
while the run goes on, so a host that finds a run hung reads how far each unit got, and
STATE says what each is waiting on.

`register_map()` lists every 32-bit register, each counter as its ``_LO`` and ``_HI``
halves: the manifest's and the board files' form of the map.
"""

from __future__ import annotations

__all__ = ["ACCEL_ID", "REGMAP_VERSION", "CONTROL_ADDR_WIDTH", "CTRL_START",
           "STATUS_RUNNING", "STATUS_DONE", "REGISTERS", "STATE_BITS", "COUNTERS",
           "register_map"]

ACCEL_ID = 0x56444C41  # "VDLA"
REGMAP_VERSION = 2  # 2: STATE register and the instruction counters
CONTROL_ADDR_WIDTH = 12  # a 4 KiB register window

#: CTRL write bit that starts a run.
CTRL_START = 1 << 0
#: CTRL read bits.
STATUS_RUNNING = 1 << 0
STATUS_DONE = 1 << 1

#: name -> (offset, access, description) of the plain registers.
REGISTERS = {
    "CTRL": (0x00, "RW", "write bit 0 = 1 to start; read bit 0 running, bit 1 done"),
    "ID": (0x04, "RO", f"constant {ACCEL_ID:#010x} ('VDLA')"),
    "VERSION": (0x08, "RO", f"register-map version ({REGMAP_VERSION})"),
    "INSN_ADDR": (0x10, "RW", "DRAM byte address of the first instruction"),
    "INSN_COUNT": (0x14, "RW", "number of instructions to fetch"),
    "STATE": (0x18, "RO", "live state of the units, one bit each (STATE_BITS)"),
}

#: Bits of the STATE register (and of the top's ``state`` port): name -> (bit, meaning).
#: Token queues are named producer_consumer, as in the stall counters.
STATE_BITS = {
    "fetch_busy": (0, "fetch has instructions left to read or route"),
    "load_busy": (1, "load executes an instruction or pushes its tokens"),
    "compute_busy": (2, "compute executes an instruction or pushes its tokens"),
    "store_busy": (3, "store executes an instruction or pushes its tokens"),
    "load_pending": (4, "an instruction is at the head of load's command queue"),
    "compute_pending": (5, "an instruction is at the head of compute's command queue"),
    "store_pending": (6, "an instruction is at the head of store's command queue"),
    "wait_token_compute_load": (8, "load waits for a compute->load token"),
    "wait_token_load_compute": (9, "compute waits for a load->compute token"),
    "wait_token_store_compute": (10, "compute waits for a store->compute token"),
    "wait_token_compute_store": (11, "store waits for a compute->store token"),
    "wait_space_load_compute": (12, "load waits for room in the load->compute queue"),
    "wait_space_compute_load": (13, "compute waits for room in the compute->load queue"),
    "wait_space_compute_store": (14, "compute waits for room in the compute->store queue"),
    "wait_space_store_compute": (15, "store waits for room in the store->compute queue"),
    "wait_space_load_cmd": (16, "fetch waits for room in load's command queue"),
    "wait_space_compute_cmd": (17, "fetch waits for room in compute's command queue"),
    "wait_space_store_cmd": (18, "fetch waits for room in store's command queue"),
    "tokens_load_compute": (20, "the load->compute queue holds a token"),
    "tokens_compute_load": (21, "the compute->load queue holds a token"),
    "tokens_compute_store": (22, "the compute->store queue holds a token"),
    "tokens_store_compute": (23, "the store->compute queue holds a token"),
}

_COUNTER_BASE = 0x20
_COUNTER_NAMES = [
    ("cycles", "clock cycles from start to done"),
    ("fetch_busy", "cycles the fetch module had instructions left to read or route"),
    ("load_busy", "cycles the load module executed an instruction or pushed its tokens"),
    ("compute_busy", "cycles the compute module executed an instruction or pushed its tokens"),
    ("store_busy", "cycles the store module executed an instruction or pushed its tokens"),
    ("gemm_active", "cycles a GEMM micro-op entered the GEMM pipeline"),
    ("alu_active", "cycles an ALU micro-op entered the ALU pipeline"),
    ("stall_load_compute", "cycles compute waited for a load->compute token"),
    ("stall_compute_load", "cycles load waited for a compute->load token"),
    ("stall_compute_store", "cycles store waited for a compute->store token"),
    ("stall_store_compute", "cycles compute waited for a store->compute token"),
    ("dram_bytes_read", "bytes read on the AXI master (whole bus words)"),
    ("dram_bytes_written", "bytes written on the AXI master (whole bus words)"),
    ("fetched_insns", "instructions fetch routed into a command queue"),
    ("load_insns", "instructions the load module retired"),
    ("compute_insns", "instructions the compute module retired"),
    ("store_insns", "instructions the store module retired"),
]
#: counter name -> (offset of the low word, description); 64 bits each.
COUNTERS = {name: (_COUNTER_BASE + 8 * i, text) for i, (name, text) in enumerate(_COUNTER_NAMES)}


def register_map() -> list[dict]:
    """Every 32-bit register of the window as ``{"name", "offset", "access",
    "description"}``: the plain registers, then each counter's low and high words
    (``CYCLES_LO``, ``CYCLES_HI``, ...), in offset order."""
    rows = [{"name": name, "offset": off, "access": acc, "description": text}
            for name, (off, acc, text) in REGISTERS.items()]
    for name, (off, text) in COUNTERS.items():
        rows.append({"name": f"{name.upper()}_LO", "offset": off, "access": "RO",
                     "description": f"{text} (bits 31:0)"})
        rows.append({"name": f"{name.upper()}_HI", "offset": off + 4, "access": "RO",
                     "description": f"{text} (bits 63:32)"})
    return rows
