"""The accelerator's compiled ops of a model resident on a device (`VdlaSession`): each
op's arena and program in DRAM, the activations in the model's buffer plan, and the
runs, each op's program at a time.

A session allocates every op's arena and program when it opens, in one order, and
writes an op's weights and relocated program before its first run. So every session of
a compiled model places each op at the same addresses (its DMA bursts, and with them its
cycles, are the same in each), and a session that runs a few of the ops (a parallel
run's worker, `vdla.compiler.targets.op_parallel`) writes only theirs.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

import vdla.runtime
from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.base import (CompiledOp, DeviceValue, OpRun, OpStats,
                                        TargetSession, Transfer)
from vdla.compiler.targets.vdla.conv import LoweredConv2d
from vdla.compiler.targets.vdla.elementwise import LoweredElementwise
from vdla.compiler.targets.vdla.kernel import VdlaKernel, activation_regions
from vdla.isa.relocate import relocate_encoded
from vdla.compiler.targets.vdla.placement import BufferPlan, region_mover
from vdla.compiler.targets.vdla.pool import LoweredPool2d
from vdla.compiler.targets.vdla.tap_pack import pack_taps
from vdla.isa import INSN_BYTES
from vdla.runtime.device import program_mismatch

if TYPE_CHECKING:   # (the target module imports this one)
    from vdla.compiler.targets.vdla.target import VdlaTarget

__all__ = ["VdlaSession"]


@dataclasses.dataclass
class _Placed:
    """An op's DRAM: its arena and its relocated program, allocated when the session
    opens and written (`written`) before the op's first run. Every session of a compiled
    model allocates the same sizes in the same order, so an op's addresses, and with
    them its DMA bursts and cycles, are the same in each (a parallel run's workers place
    only the ops they run)."""

    arena: int
    insn_addr: int
    insn_count: int
    written: bool = False


class VdlaSession(TargetSession):
    """The accelerator's ops of a compiled model resident on a device.

    target : the `VdlaTarget`
    graph : the compiled graph
    ops : its `CompiledOp` s on this target
    device : an open `vdla.runtime.Device` of the target's config, or None to open one
        of the target's backend (closed with the session; a given one stays open)
    Allocates every op's arena and program and the activation buffers of the ops' plan
    (if any) and writes the static data now.
    """

    def __init__(self, target: VdlaTarget, graph: Graph, ops: Sequence[CompiledOp],
                 device: Any = None):
        self.target, self.graph = target, graph
        config = target.config
        if device is not None and getattr(device, "config", None) != config:
            raise ValueError(f"the model is compiled for config {config.name}; the device has "
                             f"{getattr(getattr(device, 'config', None), 'name', device)!r}")
        plans = {id(op.kernel.plan): op.kernel.plan for op in ops}
        if len(plans) > 1:
            raise ValueError("the ops were compiled apart (they carry different buffer plans); "
                             "compile the model's ops together (compile_nodes)")
        self.plan: BufferPlan | None = next(iter(plans.values()), None)
        views = [op.name for op in ops if op.kernel.lowered is None]
        if views and self.plan is None:
            raise ValueError(f"view ops {views} need the buffer plan of compile_nodes")
        self._own = device is None
        self.device = device if device is not None else vdla.runtime.open(
            config, backend=target.backend, **target.device_options)
        self._placed: dict[str, _Placed] = {}
        # Inputs the host writes with kernel columns packed into channels.
        self._tap_packs = {graph.node(op.name).inputs[0]: op.kernel.lowered.layer.packed
                           for op in ops if isinstance(op.kernel.lowered, LoweredConv2d)
                           and op.kernel.lowered.layer.packed is not None}
        self._allocated: list[int] = []
        self._buffers: dict[str, int] = {}
        self._transfers: list[Transfer] = []
        try:
            if self.plan is not None:
                for name, buf in self.plan.buffers.items():
                    self._buffers[name] = self._alloc(buf.nbytes)
            for op in ops:
                if op.kernel.lowered is not None:
                    self._placed[op.name] = self._place(op.kernel, graph.node(op.name))
        except BaseException:
            self.close()
            raise

    def _alloc(self, nbytes: int) -> int:
        addr = self.device.alloc(nbytes)
        self._allocated.append(addr)
        return addr

    def _place(self, kernel: VdlaKernel, node: Node) -> _Placed:
        """Allocate the op's arena and program (written by `_write` before its first
        run: relocating a program and writing weights is most of a session's opening)."""
        lowered = kernel.lowered
        arena = self._alloc(lowered.arena_bytes)
        insn_addr = self._alloc(len(lowered.program) * INSN_BYTES)
        return _Placed(arena, insn_addr, len(lowered.program))

    def _write(self, op: CompiledOp, node: Node) -> _Placed:
        """The op's placement, its static data and relocated program written on first use."""
        placed = self._placed[op.name]
        if placed.written:
            return placed
        kernel, dev = op.kernel, self.device
        lowered, arena = kernel.lowered, placed.arena
        for region, array in kernel.static.items():
            if array.nbytes:
                dev.write(arena + lowered.regions[region].offset, array)
        move = None
        if self.plan is not None:
            moved = {}
            for region, tensor in activation_regions(lowered, node, kernel.static).items():
                p = self.plan.placements[tensor]
                moved[region] = (self._buffers[p.buffer], p, self.plan.buffers[p.buffer])
            move = region_mover(lowered.regions, moved)
        problem = program_mismatch(lowered.program, self.target.config)
        if problem:
            raise ValueError(problem)
        program = relocate_encoded(lowered.program, kernel.encoded, arena,
                                   self.target.config, move)
        dev.write(placed.insn_addr, program)
        placed.written = True
        return placed

    def close(self):
        device, self.device = self.device, None
        if device is None:
            return
        for addr in self._allocated:
            device.free(addr)
        self._allocated, self._placed, self._buffers = [], {}, {}
        if self._own:
            device.close()

    # --- activations in DRAM ------------------------------------------------------------

    def holds(self, tensor: str) -> bool:
        return self.plan is not None and tensor in self.plan.placements

    def put(self, tensor: str, value: np.ndarray) -> int:
        self._check_open("put")
        base = self._buffers[self.plan.placements[tensor].buffer]
        if tensor in self._tap_packs:
            value = pack_taps(np.asarray(value), self._tap_packs[tensor])
        runs = self.plan.pack_placed(tensor, value)
        for offset, data in runs:
            self.device.write(base + offset, data)
        return sum(data.nbytes for _, data in runs)

    def locations(self, tensor: str) -> list[tuple[int, int]]:
        """[(DRAM address, bytes)] where held `tensor` lies, in the order `put` writes
        and `fetch` reads them (an exported model's inputs and outputs,
        `vdla.compiler.targets.vdla.export`)."""
        self._check_open("locations")
        base = self._buffers[self.plan.placements[tensor].buffer]
        return [(base + offset, nbytes) for offset, nbytes in self.plan.read_runs(tensor)]

    def fetch(self, tensor: str) -> np.ndarray:
        self._check_open("fetch")
        base = self._buffers[self.plan.placements[tensor].buffer]
        return self.plan.unpack_placed(tensor, [self.device.read(base + offset, nbytes)
                                                for offset, nbytes in
                                                self.plan.read_runs(tensor)])

    def drain_transfers(self) -> list[Transfer]:
        moved, self._transfers = self._transfers, []
        return moved

    def _check_open(self, what: str):
        if self.device is None:
            raise ValueError(f"the vdla session is closed ({what})")

    # --- running --------------------------------------------------------------------------

    def run(self, op: CompiledOp, node: Node, args) -> OpRun:
        self._check_open("run")
        lowered = op.kernel.lowered
        if self.plan is not None:
            for name, arg in zip(node.inputs, args):
                if self.holds(name) and not (isinstance(arg, DeviceValue)
                                             and arg.session is self):
                    raise ValueError(f"{node.op} node {node.name!r}: input {name!r} lives in "
                                     "this session's DRAM; pass it as its DeviceValue")
            if lowered is None:     # a view: its output is already where its readers look
                # No program: no cycles on a backend that counts them (the functional
                # one counts none, and reports wall time like its other ops).
                clocked = self.device.backend == "verilator"
                return OpRun([DeviceValue(self, out) for out in node.outputs], 0, 0, 0,
                             {"gemm_utilization": None, "view": True},
                             0.0 if clocked else None,
                             f"cycles at {self.target.config.clock_mhz:g} MHz" if clocked
                             else None)
            placed = self._write(op, node)
            stats = self.device.run(placed.insn_addr, placed.insn_count)
            return self._op_run(op.kernel, stats, [DeviceValue(self, node.outputs[0])])
        return self._run_in_arena(op, node, args)

    def replay(self, op: CompiledOp, node: Node, ran: OpRun) -> OpRun:
        """As `TargetSession.replay`: outputs that stay in DRAM are written to their
        placements; an op run in its arena hands its outputs back as arrays."""
        self._check_open("replay")
        if self.plan is None or op.kernel.lowered is None:
            return ran
        for out, value in zip(node.outputs, ran.outputs):
            self.put(out, np.asarray(value))
        return dataclasses.replace(ran, outputs=[DeviceValue(self, out)
                                                 for out in node.outputs])

    def _run_in_arena(self, op: CompiledOp, node: Node, args) -> OpRun:
        """Run `op` with its activations packed into its own arena and its output
        unpacked after it (a config whose activations cannot stay in DRAM); the moves
        are reported as transfers."""
        lowered, dev, placed = op.kernel.lowered, self.device, self._write(op, node)
        t0 = time.perf_counter()
        if isinstance(lowered, LoweredPool2d):
            data = lowered.input_data(args[0])
        elif isinstance(lowered, LoweredElementwise):
            data = lowered.input_data(*args)   # a zero constant operand is not written
        else:
            data = lowered.input_data(args[0], args[3] if len(args) > 3 else None)
        names = activation_regions(lowered, node)
        for region, array in data.items():
            if array.nbytes:
                dev.write(placed.arena + lowered.regions[region].offset, array)
            self._transfers.append(Transfer(names[region], self.target.name, "to_target",
                                            op.name, array.nbytes, time.perf_counter() - t0))
            t0 = time.perf_counter()
        stats = dev.run(placed.insn_addr, placed.insn_count)
        t0 = time.perf_counter()
        out = lowered.regions["output"]
        y = lowered.unpack_output(dev.read(placed.arena + out.offset, out.nbytes))
        self._transfers.append(Transfer(node.outputs[0], self.target.name, "to_host", op.name,
                                        out.nbytes, time.perf_counter() - t0))
        return self._op_run(op.kernel, stats, [y])

    def _op_run(self, kernel: VdlaKernel, stats: dict, outputs: list) -> OpRun:
        cycles = stats.get("cycles")
        macs = kernel.useful_macs
        config = self.target.config
        util = macs / (int(cycles) * config.macs_per_cycle) if cycles and macs else None
        return OpRun(outputs, None if cycles is None else int(cycles), macs,
                     int(stats["dram_bytes_read"]) + int(stats["dram_bytes_written"]),
                     {"gemm_utilization": util},
                     None if cycles is None else int(cycles) / (config.clock_mhz * 1e6),
                     None if cycles is None else f"cycles at {config.clock_mhz:g} MHz")

    def summary(self, stats: Sequence[OpStats]) -> dict:
        """The backend; the total cycles of this target's ops (None on a backend without
        cycles) and their time at the config's clock; ``macs``, the useful MACs of its
        ops (the layers' own sizes, no block padding; pools do none); and
        ``gemm_utilization``, those MACs over the total cycles times the GEMM core's peak
        MACs per cycle (batch x block_in x block_out). The cycles are every program's on
        the accelerator, pools and epilogues included; ops on the host and the host's
        packing between ops are not counted. None without cycles or MACs."""
        config = self.target.config
        cycles = [s.cycles for s in stats if not s.extra.get("view")]   # views: no program
        total = None if not cycles or None in cycles else int(sum(cycles))
        macs = sum(s.macs or 0 for s in stats)
        util = macs / (total * config.macs_per_cycle) if total and macs else None
        return {"backend": None if self.device is None else self.device.backend,
                "cycles": total, "clock_mhz": config.clock_mhz,
                "seconds_at_clock": None if total is None else total / (config.clock_mhz * 1e6),
                "macs": macs, "macs_per_cycle": config.macs_per_cycle,
                "gemm_utilization": util}
