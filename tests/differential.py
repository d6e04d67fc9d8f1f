"""Differential testing: one device API over two backends, checked against each other.

`DifferentialDevice` pairs a *reference* device (the functional simulator, the golden
model) with a *candidate* (the cycle-accurate Verilator backend; for now a second
functional device stands in). Everything the host does is mirrored onto both, and after
every `run` the DRAM of every live allocation must agree byte for byte, so any test that
drives a `vdla.runtime.Device` becomes a differential test by swapping in this object.

Two rules keep the two devices' histories comparable when a long-lived candidate (a
Verilator model is expensive to build) meets a fresh reference per test:

- new allocations are zero-filled on both, so bytes nobody writes agree whatever either
  device's DRAM held before;
- closing the pair frees everything it allocated, so the candidate's allocator is back
  where a fresh reference starts and both hand out the same addresses next time.

SRAM contents are not reset by anything: programs run on such a pair must only read SRAM
elements they wrote themselves (see `program_gen`).
"""

from __future__ import annotations

import numpy as np

import vdla
from vdla.isa import Program
from vdla.runtime import Device, dram_alignment
from vdla.sim import SimError

__all__ = ["CANDIDATE", "COMPARED_STATS", "DW", "EXTENDED", "DifferentialDevice",
           "open_differential", "pair_with", "store_and_run"]

#: The backend the tests compare against the functional simulator (the one line to
#: change): a second functional device stands in; "verilator" tests the hardware.
CANDIDATE = "verilator"

#: The configs the differential tests cover besides the default, shared by the test
#: modules so they share model builds: VTA's non-square test config with MUL on a 128-bit
#: bus, and small queues (back-pressure everywhere) on a 256-bit bus.
B2X8X32 = vdla.HardwareConfig(batch=2, block_in=8, block_out=32, uop_buff_size=4096,
                              inp_buff_size=8192, wgt_buff_size=32768, acc_buff_size=65536,
                              alu_ops={"MIN", "MAX", "ADD", "SHR", "MUL"}, dram_bus_width=128)
#: The extensions past VTA, every one on (REQ, the lookup table TAB, the divide DIV,
#: alu_hold, the depthwise window with 3 taps: one inp row a column on this 16x16 core),
#: on small buffers.
EXTENDED = vdla.HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR", "REQ", "TAB", "DIV"},
                               alu_hold=True, dw_taps=3, uop_buff_size=8192,
                               inp_buff_size=8192, wgt_buff_size=32768, acc_buff_size=32768)
#: The depthwise window with two inp rows a column (r = 2) and plain columns past 2T.
DW = vdla.HardwareConfig(block_in=8, block_out=16, dw_taps=3, uop_buff_size=4096,
                         inp_buff_size=4096, wgt_buff_size=16384, acc_buff_size=32768)
SMALL_QUEUES = vdla.HardwareConfig(cmd_queue_depth=8, token_queue_depth=4, dram_bus_width=256,
                                   inp_buff_size=8192, wgt_buff_size=65536,
                                   acc_buff_size=32768)

#: Statistics both backends must agree on when both report them. Byte counts are not
#: comparable: the hardware moves whole bus words.
COMPARED_STATS = ("load_insns", "compute_insns", "store_insns")

# How many differing bytes of each side an error message shows.
_SHOWN = 8


class DifferentialDevice:
    """A `vdla.runtime.Device`-like pair of a reference and a candidate device.

    alloc/free/write/load_program go to both (the two allocators must return the same
    addresses); `read` and `run` compare the two sides and raise AssertionError on any
    difference. `run` returns the reference's statistics; ``last_stats`` holds
    ``(reference, candidate)`` statistics and ``last_errors`` the ``(reference,
    candidate)`` `vdla.sim.SimError` of the latest run (None where it completed).

    With ``close_candidate=False`` (``close_reference=False``) closing leaves the candidate
    (the reference) open for another pair.
    """

    def __init__(self, reference: Device, candidate: Device, *, close_candidate: bool = True,
                 close_reference: bool = True):
        if reference.config != candidate.config:
            raise ValueError(f"the reference has config {reference.config.name}, the "
                             f"candidate {candidate.config.name}")
        self.reference = reference
        self.candidate = candidate
        self.close_candidate = close_candidate
        self.close_reference = close_reference
        self.last_stats: tuple[dict | None, dict | None] = (None, None)
        self.last_errors: tuple[SimError | None, SimError | None] = (None, None)
        self._align = dram_alignment(reference.config)
        self._blocks: dict[int, int] = {}  # address -> bytes of each live allocation's block

    @property
    def config(self) -> vdla.HardwareConfig:
        return self.reference.config

    @property
    def backend(self) -> str:
        return f"{self.reference.backend}+{self.candidate.backend}"

    @property
    def allocations(self) -> dict[int, int]:
        """Live allocations: byte address -> bytes of the block (the size rounded up to
        the DRAM alignment; the comparisons cover the whole block)."""
        return dict(self._blocks)

    # --- memory -------------------------------------------------------------------------------

    def alloc(self, nbytes: int) -> int:
        addr = self.reference.alloc(nbytes)
        try:
            other = self.candidate.alloc(nbytes)
        except BaseException:
            self.reference.free(addr)
            raise
        if other != addr:
            self.reference.free(addr)
            self.candidate.free(other)
            raise AssertionError(f"alloc({nbytes}) returned {addr:#x} on the reference and "
                                 f"{other:#x} on the candidate: the allocators' histories differ")
        block = -(-nbytes // self._align) * self._align
        self._blocks[addr] = block
        zeros = np.zeros(block, np.uint8)
        self.reference.write(addr, zeros)
        self.candidate.write(addr, zeros)
        return addr

    def free(self, addr: int):
        self.reference.free(addr)
        self.candidate.free(addr)
        del self._blocks[addr]

    def write(self, addr: int, data) -> None:
        self.reference.write(addr, data)
        self.candidate.write(addr, data)

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        """The reference's bytes, after checking the candidate holds the same."""
        ref = self.reference.read(addr, nbytes)
        problem = _compare(ref, self.candidate.read(addr, nbytes), addr)
        if problem:
            raise AssertionError(f"read({addr:#x}, {nbytes}): the backends differ: {problem}")
        return ref

    def load_program(self, program: Program) -> tuple[int, int]:
        """As `Device.load_program`, through this pair's alloc and write (so the block is
        zero-filled and tracked like any other)."""
        if program.config != self.config:
            raise ValueError(f"program is encoded for config {program.config.name}, the "
                             f"device has {self.config.name}")
        addr = self.alloc(program.nbytes)
        self.write(addr, program.to_bytes())
        return addr, len(program)

    # --- running --------------------------------------------------------------------------------

    def run(self, insn_addr: int, insn_count: int) -> dict:
        """Run on both devices, then compare statistics and every live allocation.

        A `SimError` on one side only fails the comparison; on both, the reference's
        error is raised (the candidate's is in ``last_errors``).
        """
        results = []
        for device in (self.reference, self.candidate):
            try:
                results.append((device.run(insn_addr, insn_count), None))
            except SimError as exc:
                results.append((None, exc))
        (ref_stats, ref_exc), (cand_stats, cand_exc) = results
        self.last_stats = (ref_stats, cand_stats)
        self.last_errors = (ref_exc, cand_exc)
        if ref_exc is not None and cand_exc is not None:
            raise ref_exc
        if ref_exc is not None or cand_exc is not None:
            sides = [("reference", self.reference, ref_exc), ("candidate", self.candidate, cand_exc)]
            if ref_exc is None:
                sides.reverse()
            (failed, failed_dev, exc), (passed, passed_dev, _) = sides
            raise AssertionError(
                f"the {failed} ({failed_dev.backend}) raised {type(exc).__name__}: {exc}; "
                f"the {passed} ({passed_dev.backend}) ran the program to FINISH") from exc
        self._compare_stats(ref_stats, cand_stats)
        self._compare_dram()
        return ref_stats

    def _compare_stats(self, ref: dict, cand: dict):
        differ = {key: (ref[key], cand[key]) for key in COMPARED_STATS
                  if key in ref and key in cand and ref[key] != cand[key]}
        if differ:
            detail = ", ".join(f"{key}: reference {a}, candidate {b}" for key, (a, b) in differ.items())
            raise AssertionError(f"the backends' statistics differ: {detail}")

    def _compare_dram(self):
        problems = []
        for addr, block in sorted(self._blocks.items()):
            problem = _compare(self.reference.read(addr, block),
                               self.candidate.read(addr, block), addr)
            if problem:
                problems.append(problem)
        if problems:
            raise AssertionError(f"DRAM differs after the run in {len(problems)} of "
                                 f"{len(self._blocks)} allocations:\n  " + "\n  ".join(problems))

    # --- lifetime -------------------------------------------------------------------------------

    def close(self):
        """Free every live allocation on both devices, then close the reference and the
        candidate (unless ``close_reference`` / ``close_candidate`` is False)."""
        for addr in list(self._blocks):
            self.free(addr)
        if self.close_reference:
            self.reference.close()
        if self.close_candidate:
            self.candidate.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _compare(ref: np.ndarray, cand: np.ndarray, addr: int) -> str:
    """'' when equal, else where and how the candidate's bytes differ from the reference's."""
    differ = np.flatnonzero(ref != cand)
    if not differ.size:
        return ""
    first = int(differ[0])
    shown = differ[:_SHOWN]
    return (f"allocation {addr:#x}: {differ.size} of {ref.size} bytes differ, the first at "
            f"offset {first} (address {addr + first:#x}); at offsets {shown.tolist()} the "
            f"reference has {ref[shown].tolist()}, the candidate {cand[shown].tolist()}")


def open_differential(config: vdla.HardwareConfig, candidate_backend: str = "functional",
                      dram_size: int = 1 << 24) -> DifferentialDevice:
    """A pair of a fresh functional reference and a fresh `candidate_backend` device."""
    reference = vdla.runtime.open(config, backend="functional", dram_size=dram_size)
    try:
        candidate = vdla.runtime.open(config, backend=candidate_backend, dram_size=dram_size)
    except BaseException:
        reference.close()
        raise
    return DifferentialDevice(reference, candidate)


def pair_with(candidate: Device) -> DifferentialDevice:
    """A fresh functional reference paired with a long-lived `candidate`, which closing
    the pair leaves open (and with nothing allocated by the pair)."""
    reference = vdla.runtime.open(candidate.config, backend="functional",
                                  dram_size=candidate.dram_size)
    return DifferentialDevice(reference, candidate, close_candidate=False)


def store_and_run(dev, p, rows: int) -> tuple[np.ndarray, dict]:
    """End the compute part of the program builder `p` with a STORE of out rows
    0..`rows`-1 (behind a compute->store token, FINISH behind a store->compute one) and
    run it on `dev`: (those rows' bytes as int8, flat; the run's statistics)."""
    from vdla.runtime import COMPUTE, STORE
    c = dev.config
    out_addr = dev.alloc(rows * c.out_elem_bytes)
    p.dep_push(COMPUTE, STORE)
    p.dep_pop(COMPUTE, STORE)
    p.store(sram_base=0, dram_base=out_addr // c.out_elem_bytes, y_size=1, x_size=rows,
            x_stride=rows)
    p.dep_push(STORE, COMPUTE)
    p.dep_pop(STORE, COMPUTE)
    stats = dev.run(*dev.load_program(p.finish()))
    return dev.read(out_addr, rows * c.out_elem_bytes).view(np.int8), stats
