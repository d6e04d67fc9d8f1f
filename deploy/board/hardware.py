"""The accelerator on a Zynq board, seen from the board's Linux: its control registers
and its DMA memory, the protocol of a run, and the checks of a bitstream. Board side
(`vdla.deploy.board`): the standard library, numpy and vdla's light core; pynq only
where it is used.

    accel = Accelerator(*open_layers(register_base, dram_size))
    device = RegionDevice(config, accel)        # what a device script plays on

Two layers sit under the accelerator, and a test swaps them as a pair
(``tests/board_shim.py`` drives the Verilator model of the same Verilog through
them, register access for register access):

- `Mmio`: the control registers (`vdla.isa.registers`), 32-bit reads and writes at
  byte offsets of the 4 KiB window at the board's `register_base`: `pynq.MMIO`
  (`PynqMmio`) or a mapping of ``/dev/mem`` (`DevMemMmio`) where pynq is absent.
- `DmaMemory`: one physically contiguous region the accelerator's AXI master reads and
  writes, mapped into this process: `pynq.allocate` (`PynqMemory`) or a u-dma-buf
  device (`UdmabufMemory`). The addresses the accelerator sees are bus addresses, the
  region's physical address plus an offset, because it has no base register: its
  instructions carry the addresses it puts on the bus.

The protocol of a run (docs/isa.md, "Memory map"), the same on every board
(`Accelerator`):

1. once, at open: read ID (must be `ACCEL_ID`) and VERSION (must be `REGMAP_VERSION`);
2. flush the CPU's caches over what the host wrote since the last run;
3. write INSN_ADDR, then INSN_COUNT, then CTRL = `CTRL_START`;
4. wait for the done interrupt where there is one (`Interrupt`: the core's ``irq``,
   through a UIO device), then read CTRL until `STATUS_DONE` is set (one read after the
   interrupt; without one, reads with sleeps between them), for at most `timeout`
   seconds; a run still going then reads STATE and every counter and raises
   `BoardTimeout`, naming the units that are busy and what each waits on;
5. read every counter (`COUNTERS`: low word, then high word), which froze at done;
6. invalidate the CPU's caches over the region before the host reads results.

An optional third layer, `Interrupt`, waits for the core's done interrupt instead of
reading CTRL again and again: the Linux UIO device of the interrupt (`UioInterrupt`),
swapped in the tests for the Verilator model's ``irq`` port.

Every register access goes through `Mmio.read` and `Mmio.write`, so a log of them is
the protocol as the hardware saw it (`RegisterLog`).

Two devices are built on `Accelerator`: `RegionDevice` here, the device a bundle's
device script plays on (the script's own placement, nothing checked but the region's
bounds: the script's programs were validated when it was exported), and
`vdla.deploy.board_device.BoardDevice`, vdla's full device API (its allocator,
programs validated before they start, work counters), which needs vdla installed.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import mmap
import os
import select
import struct
import time
from pathlib import Path

import numpy as np

from vdla.config import HardwareConfig
from vdla.deploy.board.dma import Blocks, check_dma
from vdla.extensions import EXTENSIONS, lacking_extensions
from vdla.isa import INSN_BYTES
from vdla.isa.encoding import decode_stream
from vdla.isa.registers import (ACCEL_ID, COUNTERS, CTRL_START, REGISTERS, REGMAP_VERSION,
                                STATE_BITS, STATUS_DONE)

__all__ = ["Accelerator", "BoardError", "BoardTimeout", "DevMemMmio", "DmaMemory",
           "Interrupt", "Mmio", "PynqMemory", "PynqMmio", "RegionDevice", "RegisterLog",
           "UdmabufMemory", "UioInterrupt", "bitstream_config", "bitstream_mismatch",
           "decode_state", "open_layers", "register_name"]

#: Bytes of the control window (`vdla.isa.registers.CONTROL_ADDR_WIDTH`).
WINDOW = 4096
#: Seconds between two reads of CTRL while a run goes on: short runs finish within a
#: few reads, and the processor is not kept busy on long ones.
POLL_SECONDS = 0.0002


class BoardError(RuntimeError):
    """The board is not the accelerator this device expects (ID, register map)."""


class BoardTimeout(RuntimeError):
    """A run did not finish within the timeout. `state` is the STATE register,
    `counters` every counter as read then."""

    def __init__(self, message: str, state: int, counters: dict[str, int]):
        super().__init__(message)
        self.state, self.counters = state, counters


class Mmio(abc.ABC):
    """The control window: 32-bit registers at byte offsets."""

    @abc.abstractmethod
    def read(self, offset: int) -> int:
        """The 32-bit register at `offset`."""

    @abc.abstractmethod
    def write(self, offset: int, value: int) -> None:
        """Write `value` (32 bits) to the register at `offset`."""

    def close(self) -> None:
        pass


class DmaMemory(abc.ABC):
    """A physically contiguous region the accelerator masters.

    physical_address : the bus address of its first byte
    array : the region as this process sees it, a uint8 numpy array
    """

    physical_address: int
    array: np.ndarray

    @abc.abstractmethod
    def flush(self, offset: int, nbytes: int) -> None:
        """Write the CPU's caches over [offset, offset + nbytes) back to DRAM, before the
        accelerator reads it."""

    @abc.abstractmethod
    def invalidate(self, offset: int, nbytes: int) -> None:
        """Drop the CPU's cached copies of [offset, offset + nbytes), before the host
        reads what the accelerator wrote."""

    def close(self) -> None:
        pass


class Interrupt(abc.ABC):
    """The accelerator's done interrupt: the core's ``irq`` output, high while a finished
    run's done flag is set (the next START clears it), wired to the processor by the
    board's project (Zynq's IRQ_F2P, Zynq UltraScale+'s pl_ps_irq0)."""

    @abc.abstractmethod
    def arm(self) -> None:
        """Enable the interrupt for one firing, after START: the previous run's level has
        fallen by then, and a run that already finished holds it high, so none is
        lost."""

    @abc.abstractmethod
    def wait(self, seconds: float) -> bool:
        """Block until the interrupt fires (True) or `seconds` pass (False)."""

    def close(self) -> None:
        pass


class UioInterrupt(Interrupt):
    """The interrupt through the Linux UIO device named `name` (a device-tree node of
    ``compatible = "generic-uio"`` for the fabric interrupt, docs/boards.md): writing 1
    enables it, a read returns once it has fired (the kernel masks it again)."""

    def __init__(self, name: str = "vdla"):
        device = self.device(name)
        if device is None:
            raise FileNotFoundError(f"no UIO device named {name!r} in /sys/class/uio")
        self.fd = os.open(f"/dev/{device}", os.O_RDWR)

    @staticmethod
    def device(name: str = "vdla") -> str | None:
        """The UIO device (``uio0``, ...) named `name`, or None."""
        for path in sorted(Path("/sys/class/uio").glob("uio*")):
            try:
                if (path / "name").read_text().strip() == name:
                    return path.name
            except OSError:
                continue
        return None

    def arm(self) -> None:
        os.write(self.fd, struct.pack("=I", 1))

    def wait(self, seconds: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], max(0.0, seconds))
        if not ready:
            return False
        os.read(self.fd, 4)     # the count of firings; reading it consumes this one
        return True

    def close(self) -> None:
        os.close(self.fd)


class RegisterLog(Mmio):
    """An `Mmio` that passes every access on to `inner` and records it in `accesses`
    as ``("r" | "w", register name, value)``: the protocol as the hardware saw it."""

    def __init__(self, inner: Mmio):
        self.inner, self.accesses = inner, []

    def read(self, offset: int) -> int:
        value = self.inner.read(offset)
        self.accesses.append(("r", register_name(offset), value))
        return value

    def write(self, offset: int, value: int) -> None:
        self.inner.write(offset, value)
        self.accesses.append(("w", register_name(offset), value))

    def close(self) -> None:
        self.inner.close()


def register_name(offset: int) -> str:
    """The name of the register at `offset` (a counter's ``_LO`` or ``_HI`` half)."""
    for name, (at, *_) in REGISTERS.items():
        if at == offset:
            return name
    for name, (at, _) in COUNTERS.items():
        if offset in (at, at + 4):
            return f"{name.upper()}_{'LO' if offset == at else 'HI'}"
    return f"{offset:#x}"


def decode_state(state: int) -> str:
    """The STATE register in words: every bit set, with what it means."""
    found = [f"{name} ({text})" for name, (bit, text) in STATE_BITS.items()
             if state >> bit & 1]
    return "; ".join(found) if found else "nothing busy, nothing waiting"


class Accelerator:
    """The accelerator behind `mmio`, over the DMA region `memory`: the register protocol
    of a run (module docstring) and the region's cache maintenance, nothing of vdla's
    device API (no allocator, no program checks: the devices built on it add those).

    mmio, memory : the control window and the DMA region (`Mmio`, `DmaMemory`)
    interrupt : the done interrupt (`Interrupt`), or None to poll CTRL
    timeout : seconds a run may take before `BoardTimeout`
    poll : seconds between reads of CTRL while a run goes on
    BoardError when the window does not answer as a vdla accelerator of this register
    map's version, naming what it read; ValueError for a timeout that is not a positive
    number.
    """

    def __init__(self, mmio: Mmio, memory: DmaMemory, interrupt: Interrupt | None = None, *,
                 timeout: float = 10.0, poll: float = POLL_SECONDS):
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self.mmio, self.memory, self.interrupt = mmio, memory, interrupt
        self.timeout, self.poll = float(timeout), float(poll)
        #: The bus address of the region's first byte: what its offsets are moved by.
        self.base = int(memory.physical_address)
        self._check_identity()

    @property
    def size(self) -> int:
        """Bytes of the DMA region."""
        return len(self.memory.array)

    def _check_identity(self) -> None:
        ident = self.mmio.read(REGISTERS["ID"][0])
        if ident != ACCEL_ID:
            raise BoardError(f"the control window reads ID {ident:#010x}, not a vdla "
                             f"accelerator's {ACCEL_ID:#010x}: is the bitstream loaded, and "
                             "the register base the board's?")
        version = self.mmio.read(REGISTERS["VERSION"][0])
        if version != REGMAP_VERSION:
            raise BoardError(f"the accelerator's register map is version {version}; this "
                             f"runtime speaks version {REGMAP_VERSION}: build the bitstream "
                             "and the runtime from one vdla")

    # --- the region ---------------------------------------------------------------------------

    def write(self, offset: int, raw: np.ndarray) -> None:
        """Copy the uint8 array `raw` into the region at `offset`, then flush the CPU's
        caches over it (the accelerator reads DRAM, not the caches)."""
        self.memory.array[offset:offset + len(raw)] = raw
        self.memory.flush(offset, len(raw))

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        """A copy of `nbytes` of the region at `offset`, read after invalidating the CPU's
        cached copies (the accelerator wrote DRAM behind them)."""
        self.memory.invalidate(offset, nbytes)
        return self.memory.array[offset:offset + nbytes].copy()

    # --- running ------------------------------------------------------------------------------

    def run(self, insn_addr: int, insn_count: int, timeout: float | None = None) -> dict:
        """Start the `insn_count` instructions at bus address `insn_addr` and wait for
        done (steps 3 to 5 of the module docstring); returns every hardware counter
        (`COUNTERS`) and ``wall_seconds``. `BoardTimeout` after `timeout` seconds (the
        accelerator's by default)."""
        regs = self.mmio
        start = time.perf_counter()
        regs.write(REGISTERS["INSN_ADDR"][0], int(insn_addr))
        regs.write(REGISTERS["INSN_COUNT"][0], int(insn_count))
        regs.write(REGISTERS["CTRL"][0], CTRL_START)
        limit = start + (self.timeout if timeout is None else float(timeout))
        if self.interrupt is not None:
            self.interrupt.arm()
            self.interrupt.wait(limit - time.perf_counter())   # then CTRL says which
        while not regs.read(REGISTERS["CTRL"][0]) & STATUS_DONE:
            if time.perf_counter() > limit:
                self._timed_out(time.perf_counter() - start)
            time.sleep(self.poll)
        wall = time.perf_counter() - start
        return {**self.counters(), "wall_seconds": wall}

    def counters(self) -> dict[str, int]:
        """Every hardware counter, its low word read before its high word."""
        out = {}
        for name, (offset, _) in COUNTERS.items():
            low = self.mmio.read(offset)
            out[name] = low | self.mmio.read(offset + 4) << 32
        return out

    def _timed_out(self, seconds: float):
        state = self.mmio.read(REGISTERS["STATE"][0])
        counters = self.counters()
        raise BoardTimeout(
            f"the accelerator did not finish in {seconds:.1f} s ({counters['cycles']:,} "
            f"cycles counted): STATE {state:#010x}: {decode_state(state)}; instructions "
            f"fetched {counters['fetched_insns']}, retired by load "
            f"{counters['load_insns']}, compute {counters['compute_insns']}, store "
            f"{counters['store_insns']}. Reset the accelerator (reload the bitstream) "
            "before the next run.", state, counters)

    def close(self) -> None:
        mmio, memory, self.mmio, self.memory = self.mmio, self.memory, None, None
        interrupt, self.interrupt = self.interrupt, None
        if interrupt is not None:
            interrupt.close()
        if mmio is not None:
            mmio.close()
        if memory is not None:
            memory.close()


class RegionDevice:
    """The device a device script (`vdla.deploy.board.player.DeviceScript`) plays on, on
    the board: `accelerator`'s DMA region, its buffers placed where the script recorded
    them (`place`), so no allocator runs here; the recording's allocator gave those
    places, and its programs were validated when the script was exported. Writes and
    reads are checked against the region's bounds; a program, before it starts, against
    the blocks placed (`vdla.deploy.board.dma.check_dma`: its instructions and every
    LOAD and STORE inside them), so a script edited by hand cannot reach the rest of
    the region or, through a bus address, memory outside it.

    config : the `HardwareConfig` of the bitstream (the script's, checked by the runner)
    accelerator : the `Accelerator`; `close` closes it
    """

    backend = "board"

    def __init__(self, config: HardwareConfig, accelerator: Accelerator):
        self.config, self.accelerator = config, accelerator
        self.base, self.dram_size = accelerator.base, accelerator.size
        self.placed: dict[int, int] = {}     # bus address -> bytes, of every block placed

    def place(self, offset: int, nbytes: int) -> int:
        """The bus address of `nbytes` at region offset `offset`, which programs may then
        reach; ValueError when they do not fit in the region."""
        if offset < 0 or nbytes <= 0 or offset + nbytes > self.dram_size:
            raise ValueError(f"{nbytes:,} bytes at offset {offset:#x} do not fit in the DMA "
                             f"region of {self.dram_size:,} bytes")
        self.placed[self.base + offset] = max(nbytes, self.placed.get(self.base + offset, 0))
        return self.base + offset

    def _offset(self, addr: int, nbytes: int, what: str) -> int:
        offset = int(addr) - self.base
        if offset < 0 or offset + nbytes > self.dram_size:
            raise ValueError(f"{what} of {nbytes:,} bytes at {int(addr):#x} is outside the DMA "
                             f"region ({self.base:#x}, {self.dram_size:,} bytes)")
        return offset

    def write(self, addr: int, data) -> None:
        """Copy a numpy array (little-endian) or bytes into the region at bus address
        `addr`."""
        raw = np.frombuffer(memoryview(data).cast("B"), np.uint8) \
            if not isinstance(data, np.ndarray) \
            else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self.accelerator.write(self._offset(addr, len(raw), "write"), raw)

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        """A copy of `nbytes` at bus address `addr`, as uint8."""
        return self.accelerator.read(self._offset(addr, nbytes, "read"), int(nbytes))

    def run(self, insn_addr: int, insn_count: int) -> dict:
        """`Accelerator.run`: the hardware counters and ``wall_seconds``. ValueError
        (`DmaOutsideBlocks`, or a word that does not decode) before the start for a
        program whose instructions or DMA reach outside the blocks placed."""
        insn_addr, insn_count = int(insn_addr), int(insn_count)
        if insn_count < 1:
            raise ValueError(f"a program of {insn_count} instructions: at least 1")
        offset = self._offset(insn_addr, INSN_BYTES * insn_count, "a program")
        encoded = self.accelerator.read(offset, INSN_BYTES * insn_count).tobytes()
        check_dma(decode_stream(encoded, self.config), self.config, Blocks(self.placed),
                  insn_addr=insn_addr, insn_count=insn_count)
        return self.accelerator.run(insn_addr, insn_count)

    def close(self) -> None:
        self.accelerator.close()


def open_layers(register_base: int, dram_size: int, *,
                interrupt: bool = True) -> tuple[Mmio, DmaMemory, Interrupt | None]:
    """The board's own layers, from its Linux (as root): the control window at
    `register_base` and `dram_size` bytes of DMA memory through pynq where it is
    installed, else ``/dev/mem`` and the first u-dma-buf device; and the done interrupt
    where a UIO device named ``vdla`` has it (a device-tree overlay, docs/boards.md), else
    None (CTRL is polled; also with ``interrupt=False``, for a caller that brings its
    own). OSError when the board's Linux lacks them."""
    try:
        import pynq  # noqa: F401  heavy (it loads the overlay's drivers), board image only
    except ImportError:
        mmio, memory = DevMemMmio(register_base), UdmabufMemory()
    else:
        mmio, memory = PynqMmio(register_base), PynqMemory(dram_size)
    done = UioInterrupt() if interrupt and UioInterrupt.device() is not None else None
    return mmio, memory, done

def bitstream_config(manifest: str | os.PathLike) -> HardwareConfig:
    """The config a bitstream was built from: its project's ``manifest.json``."""
    try:
        data = json.loads(Path(manifest).read_text())
        return HardwareConfig.from_dict(data["config"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BoardError(f"bitstream manifest {os.fspath(manifest)!r}: {exc}") from None


def bitstream_mismatch(bitstream: HardwareConfig, model: HardwareConfig) -> str:
    """Why a model compiled for `model` cannot run on a bitstream of `bitstream`, naming
    the extensions one has and the other lacks and every other parameter that differs;
    "" when they are the same config."""
    if bitstream == model:
        return ""
    parts = [f"the bitstream is config {bitstream.name}, the model is compiled for "
             f"{model.name}"]
    needed = lacking_extensions(model, bitstream)
    if needed:
        parts.append("the model needs extension(s) " + ", ".join(f"{s} ({w})" for s, w in needed)
                     + ", which the bitstream lacks")
    extra = lacking_extensions(bitstream, model)
    if extra:
        parts.append("the bitstream has extension(s) " + ", ".join(s for s, _ in extra)
                     + ", which the model's config lacks")
    skip = {ext.field for ext in EXTENSIONS if ext.in_programs}     # said above
    others = [f"{f.name} (bitstream {getattr(bitstream, f.name)!r}, model "
              f"{getattr(model, f.name)!r})" for f in dataclasses.fields(HardwareConfig)
              if f.name not in skip and getattr(bitstream, f.name) != getattr(model, f.name)]
    if others:
        parts.append("they differ in " + ", ".join(others))
    return "; ".join(parts) + ": build the bitstream for the model's config, or compile " \
        "the model for the bitstream's"


# --- the board's own layers --------------------------------------------------------------------

class PynqMmio(Mmio):
    """The control window through `pynq.MMIO`."""

    def __init__(self, base: int, length: int = WINDOW):
        from pynq import MMIO  # heavy (it loads the overlay's drivers), board image only
        self._mmio = MMIO(base, length)

    def read(self, offset: int) -> int:
        return int(self._mmio.read(offset))

    def write(self, offset: int, value: int) -> None:
        self._mmio.write(offset, int(value) & 0xFFFFFFFF)


class DevMemMmio(Mmio):
    """The control window mapped from ``/dev/mem`` (uncached: O_SYNC), for a Linux
    without pynq. Needs root."""

    def __init__(self, base: int, length: int = WINDOW, path: str = "/dev/mem"):
        page = mmap.PAGESIZE
        if base % page:
            raise ValueError(f"register base {base:#x} is not page-aligned ({page} bytes)")
        fd = os.open(path, os.O_RDWR | os.O_SYNC)
        try:
            self._map = mmap.mmap(fd, length, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE, offset=base)
        finally:
            os.close(fd)
        self._words = np.frombuffer(self._map, dtype="<u4")

    def read(self, offset: int) -> int:
        return int(self._words[offset // 4])

    def write(self, offset: int, value: int) -> None:
        self._words[offset // 4] = int(value) & 0xFFFFFFFF

    def close(self) -> None:
        self._words = None
        self._map.close()


class PynqMemory(DmaMemory):
    """`nbytes` of contiguous memory from `pynq.allocate` (its CMA pool)."""

    def __init__(self, nbytes: int):
        from pynq import allocate  # heavy (it loads the overlay's drivers), board image only
        self._buffer = allocate(shape=(nbytes,), dtype=np.uint8)
        self.physical_address = int(self._buffer.device_address)
        self.array = self._buffer

    def flush(self, offset: int, nbytes: int) -> None:
        if not self._buffer.coherent:
            self._buffer.flush()

    def invalidate(self, offset: int, nbytes: int) -> None:
        if not self._buffer.coherent:
            self._buffer.invalidate()

    def close(self) -> None:
        self._buffer.freebuffer()


class UdmabufMemory(DmaMemory):
    """The u-dma-buf device `name` (a kernel module that reserves contiguous memory and
    exports its physical address and cache syncs in sysfs), mapped with caching so the
    host reads fast, synced around each run."""

    def __init__(self, name: str = "udmabuf0"):
        sysfs = next((p for p in (Path("/sys/class/u-dma-buf") / name,
                                  Path("/sys/class/udmabuf") / name) if p.is_dir()), None)
        if sysfs is None:
            raise FileNotFoundError(f"no u-dma-buf device {name!r} (load the u-dma-buf "
                                    "module, or install pynq)")
        self._sysfs = sysfs
        self.physical_address = int((sysfs / "phys_addr").read_text(), 0)
        size = int((sysfs / "size").read_text(), 0)
        fd = os.open(f"/dev/{name}", os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.array = np.frombuffer(self._map, dtype=np.uint8)

    def _sync(self, what: str, offset: int, nbytes: int) -> None:
        (self._sysfs / "sync_offset").write_text(str(offset))
        (self._sysfs / "sync_size").write_text(str(nbytes))
        (self._sysfs / what).write_text("1")

    def flush(self, offset: int, nbytes: int) -> None:
        self._sync("sync_for_device", offset, nbytes)

    def invalidate(self, offset: int, nbytes: int) -> None:
        self._sync("sync_for_cpu", offset, nbytes)

    def close(self) -> None:
        self.array = None
        self._map.close()
