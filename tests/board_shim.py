"""The board's two lower layers (`vdla.deploy.board.hardware.Mmio`, `DmaMemory`) over the
Verilator model of the same Verilog: a test fixture, so that the board runtime's own
code, the code that runs on the board, makes every register access it would make there,
in the same order, on the RTL's AXI4-Lite port, and the accelerator masters the model's
DRAM as it would the board's.

    sim = VerilatorSimulator(config, dram_size)
    board = BoardDevice(config, mmio=RegisterLog(VerilatorMmio(sim.model)),
                        memory=VerilatorMemory(sim.model, base=1 << 20),
                        interrupt=VerilatorInterrupt(sim.model))   # or poll: None

`serve_layers` serves the same layers to another process over a pipe
(``tests/deploy/board_child.py``), so a bundle's own run.py runs there, in a Python
with numpy alone, against the model here.
"""

from __future__ import annotations

import struct
import time

import numpy as np

from vdla.deploy.board.hardware import DmaMemory, Interrupt, Mmio
from vdla.isa.registers import REGISTERS

CTRL = REGISTERS["CTRL"][0]


class VerilatorMmio(Mmio):
    """The model's control window. Time passes on a board between two reads of CTRL
    while the host polls; here each such read first runs the model `cycles` cycles
    (in the model's own loop, not cycle by cycle from Python). The counters freeze at
    done, so how far past it the model ran does not change what the host reads."""

    def __init__(self, model, cycles: int = 4096):
        self.model, self.cycles = model, cycles

    def read(self, offset: int) -> int:
        if offset == CTRL:
            self.model.step(self.cycles)
        return self.model.ctrl_read(offset)

    def write(self, offset: int, value: int) -> None:
        self.model.ctrl_write(offset, value)


class VerilatorMemory(DmaMemory):
    """The model's DRAM from bus address `base` on, as a board's DMA region at that
    physical address: the accelerator reads and writes it where the host does. The
    cache operations are recorded in `syncs` (nothing is cached here)."""

    def __init__(self, model, base: int = 0):
        self.physical_address = base
        self.array = model.dram[base:]
        self.syncs: list[tuple[str, int, int]] = []

    def flush(self, offset: int, nbytes: int) -> None:
        self.syncs.append(("flush", offset, nbytes))

    def invalidate(self, offset: int, nbytes: int) -> None:
        self.syncs.append(("invalidate", offset, nbytes))


class VerilatorInterrupt(Interrupt):
    """The core's ``irq`` port of the model, as the processor's interrupt line: `wait`
    runs the model `cycles` cycles at a time (in its own loop) until the port is high.
    `armed` counts the `arm` calls."""

    def __init__(self, model, cycles: int = 4096):
        self.model, self.cycles, self.armed = model, cycles, 0

    def arm(self) -> None:
        self.armed += 1

    def wait(self, seconds: float) -> bool:
        limit = time.perf_counter() + seconds
        while not self.model.peek("irq"):
            if time.perf_counter() > limit:
                return False
            self.model.step(self.cycles)
        return True


#: A request of `tests/deploy/board_child.py`'s layers: op, then two numbers.
PIPE_HEADER = struct.Struct("<cQQ")


def serve_layers(rx, tx, model, base: int, cycles: int = 4096) -> int:
    """Apply the requests a board's process sends over a pipe (``tests/deploy/
    board_child.py``: its register accesses, and its DMA region's flushes and
    invalidates) to the Verilator `model`, whose DRAM from bus address `base` on is the
    region, until the process closes the pipe; returns the count of requests.

    rx, tx : the pipe's ends here (binary files, unbuffered)
    model : the `VerilatorModel` (a `VerilatorSimulator`'s ``model``)
    base : the region's bus address, the process's `physical_address`
    cycles : the model's cycles per read of CTRL (`VerilatorMmio`)
    """
    mmio, memory = VerilatorMmio(model, cycles), VerilatorMemory(model, base)
    count = 0

    def receive(n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = rx.read(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    while (header := receive(PIPE_HEADER.size)) is not None:
        op, a, b = PIPE_HEADER.unpack(header)
        count += 1
        if op == b"r":
            tx.write(struct.pack("<I", mmio.read(a)))
        elif op == b"w":
            mmio.write(a, b)
        elif op == b"f":
            memory.array[a:a + b] = np.frombuffer(receive(b), np.uint8)
        elif op == b"i":
            tx.write(memory.array[a:a + b].tobytes())
        else:
            raise ValueError(f"unknown request {op!r} from the board's process")
    return count
