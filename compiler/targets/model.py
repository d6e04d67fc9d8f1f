"""Whole models on any target: compile once (the target's nodes, the rest on the host),
then run many times.

    target = vdla.compiler.targets.get("vdla", config=config, backend="functional")
    compiled = compile_model(quantized_graph, target)
    with compiled.session() as session:
        result = session.run({"input": x})        # outputs + per-op `OpStats`

`compile_model` partitions the graph by asking the target about every node
(`vdla.compiler.passes.partition`); the nodes it refuses fall back to the host target,
which runs the numpy reference kernels, so every graph compiles and the fallback ops are
bit-exact by construction. This is the one place the fallback rule lives.

A `ModelSession` opens a session of every target the model uses and runs the ops in
topological order, feeding each op the values its inputs hold; each op's `OpStats`
carries the common fields, and `RunResult.summary` each target's totals. A value a
target session keeps in its own memory (the accelerator's DRAM) stays there as a
`DeviceValue`: the model session writes a tensor to a target only when the target holds
it and did not produce it, and reads one back only for another target (a host op) or a
model output. Every such move is a `Transfer` of the run (`RunResult.host_time`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping

import numpy as np

from vdla.compiler.ir.graph import DTYPES, Graph
from vdla.compiler.passes.partition import Partition, partition
from vdla.compiler.reference.executor import check_inputs
from vdla.compiler.targets.base import (WALL, CompiledOp, DeviceValue, GraphRun, OpRun,
                                        OpStats, Progress, Target, TargetSession, Transfer)
from vdla.compiler.targets.host import HOST, HostTarget

__all__ = ["CompiledModel", "ModelSession", "RunResult", "compile_model"]


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledModel:
    """A quantized graph compiled for `target`, with host fallback.

    graph : the graph (not modified)
    target : the primary `Target`
    ops : one `CompiledOp` per node, in execution (topological) order
    partition : the `Partition` that decided where each node runs
    compile_seconds : wall time of the whole compilation
    """

    graph: Graph
    target: Target
    ops: tuple[CompiledOp, ...]
    partition: Partition
    compile_seconds: float

    @property
    def targets(self) -> dict[str, Target]:
        """The targets the ops run on, by name (the primary target first)."""
        used = {op.target for op in self.ops}
        found = {self.target.name: self.target} if self.target.name in used else {}
        if HOST in used and HOST not in found:
            found[HOST] = HostTarget()
        return found

    def ops_on(self, target: str) -> list[CompiledOp]:
        """The ops that run on the target named `target`, in order."""
        return [op for op in self.ops if op.target == target]

    def session(self, device: Any = None) -> "ModelSession":
        """A `ModelSession` of this model. `device` is handed to the primary target (an
        open `vdla.runtime.Device` for the accelerator); None lets it open its own."""
        return ModelSession(self, device)


def compile_model(graph: Graph, target: Target, *,
                  schedules: Mapping[str, Any] | None = None,
                  progress: Progress | None = None) -> CompiledModel:
    """Compile `graph` for `target`; the nodes it does not support run on the host.

    graph : a `Graph` (quantized for the target, `vdla.compiler.passes.quantize`)
    target : a `Target` (`vdla.compiler.targets.get`)
    schedules : node name -> one of the target's schedules, for nodes that should not
        get the target's default (from the tuner's records, `best_schedules`)
    progress : called as each node starts, with (nodes done, total nodes, node name)
    Raises TypeError for arguments of the wrong type and ValueError for a schedule that
    names a node the target does not run (or what the target's own checks refuse)."""
    if not isinstance(graph, Graph):
        raise TypeError(f"compile_model: graph must be a vdla.compiler.Graph, not "
                        f"{type(graph).__name__}")
    if not isinstance(target, Target):
        raise TypeError(f"compile_model: target must be a vdla.compiler.targets.Target, not "
                        f"{type(target).__name__}")
    start = time.perf_counter()
    target.check_graph(graph)
    graph = target.legalize(graph)
    plan = partition(graph, target)
    nodes = graph.nodes()
    mine = [n for n in nodes if plan.target_of(n.name) == target.name]
    schedules = dict(schedules or {})
    unknown = sorted(set(schedules) - {n.name for n in mine})
    if unknown:
        raise ValueError(f"compile_model: schedules name {unknown}, which are not nodes of "
                         f"graph {graph.name!r} that target {target.name!r} runs (those are: "
                         f"{', '.join(n.name for n in mine) or 'none'})")
    compiled = {op.name: op for op in target.compile_nodes(
        graph, mine, schedules=schedules, progress=progress, total=len(nodes))}
    rest = [n for n in nodes if n.name not in compiled]
    if rest:
        host = target if target.name == HOST else HostTarget()
        compiled.update((op.name, op) for op in host.compile_nodes(
            graph, rest, schedules={}, progress=progress, start=len(mine), total=len(nodes)))
    # The partition's reason is the one reason of every op (a fallback's says why the
    # primary target refused it).
    ops = tuple(dataclasses.replace(compiled[n.name], reason=plan.reason(n.name))
                for n in nodes)
    return CompiledModel(graph, target, ops, plan, time.perf_counter() - start)


@dataclasses.dataclass(frozen=True)
class RunResult:
    """The result of `ModelSession.run`.

    outputs : graph output name -> array
    ops : one `OpStats` per op, in execution order
    wall_seconds : host wall time of the whole run
    summary : per target name, its totals (`TargetSession.summary`; vdla: ``cycles``,
        ``seconds_at_clock``)
    values : every tensor of the run (only with ``run(..., keep=True)``), else None
    transfers : every move of activations between the host and a target (`Transfer`)
    """

    outputs: dict[str, np.ndarray]
    ops: tuple[OpStats, ...]
    wall_seconds: float
    summary: dict[str, dict]
    values: dict[str, np.ndarray] | None = None
    transfers: tuple[Transfer, ...] = ()

    def host_time(self) -> dict:
        """What the host did in this run, apart from the targets' devices: its ops
        (count, wall seconds) and its moves of activations (count, bytes, seconds),
        and of those the moves between two target ops (``between_*``: zero when every
        activation stays in the target's memory from producer to consumer);
        ``seconds`` is the host ops' and the moves' time together."""
        host_ops = [s for s in self.ops if s.target == HOST]
        between = [t for t in self.transfers if t.between]
        ops_s = sum(s.wall_seconds for s in host_ops)
        moved_s = sum(t.seconds for t in self.transfers)
        return {"ops": len(host_ops), "op_seconds": ops_s,
                "transfers": len(self.transfers),
                "transfer_bytes": sum(t.bytes for t in self.transfers),
                "transfer_seconds": moved_s,
                "between_transfers": len(between),
                "between_bytes": sum(t.bytes for t in between),
                "between_seconds": sum(t.seconds for t in between),
                "seconds": ops_s + moved_s}

    @property
    def cycles(self) -> int | None:
        """Device cycles of the whole run: the sum of the targets' ``cycles`` totals, or
        None when a target that counts cycles has none this run (a functional simulator)
        or no target counts them."""
        totals = [s["cycles"] for s in self.summary.values() if "cycles" in s]
        if not totals or any(t is None for t in totals):
            return None
        return int(sum(totals))


class ModelSession:
    """A compiled model ready to run: a session of every target it uses.

    compiled : a `CompiledModel`
    device : handed to the primary target's session (see `CompiledModel.session`)
    `run(feed)` runs the model; `close()` (or leaving a ``with`` block) closes every
    target session. A device passed in stays open: its owner closes it.
    """

    def __init__(self, compiled: CompiledModel, device: Any = None):
        if not isinstance(compiled, CompiledModel):
            raise TypeError(f"ModelSession: compiled must be a CompiledModel, not "
                            f"{type(compiled).__name__}")
        self.compiled = compiled
        self._where = {op.name: op.target for op in compiled.ops}
        self._sessions: dict[str, TargetSession] = {}
        try:
            for name, target in compiled.targets.items():
                primary = name == compiled.target.name
                self._sessions[name] = target.open_session(
                    compiled.graph, compiled.ops_on(name), device if primary else None)
        except BaseException:
            self.close()
            raise

    @property
    def closed(self) -> bool:
        return self._sessions is None

    def target_session(self, name: str) -> TargetSession:
        """The open session of the target named `name` (KeyError for a target the model
        does not use)."""
        if self.closed:
            raise ValueError("ModelSession.target_session: the session is closed")
        return self._sessions[name]

    def close(self):
        """Close every target session (idempotent)."""
        sessions, self._sessions = self._sessions, None
        for session in (sessions or {}).values():
            session.close()

    def __enter__(self) -> "ModelSession":
        return self

    def __exit__(self, *exc):
        self.close()

    def run_graph(self, feed: Mapping[str, np.ndarray]) -> "GraphRun | None":
        """The graph run in one call of its target, when one target runs every op and its
        session can run them as one program (`TargetSession.run_graph`: the CPU target's
        compiled runner): no Python between the ops; the outputs and each op's time
        measured inside the program (`GraphRun`). None when the model cannot run so (a
        host fallback, a target without such a program)."""
        if self.closed:
            raise ValueError("ModelSession.run_graph: the session is closed")
        if len(self._sessions) != 1:
            return None
        values = check_inputs(self.compiled.graph, feed)
        return next(iter(self._sessions.values())).run_graph(values)

    def run(self, feed: Mapping[str, np.ndarray], *, progress: Progress | None = None,
            keep: bool = False,
            replayed: Mapping[str, tuple[OpRun, float]] | None = None) -> RunResult:
        """Run the model once.

        feed : graph input name -> array (checked like `run_reference`'s inputs)
        progress : called as each op starts, with (ops done, total ops, op name)
        keep : also return every intermediate tensor in `RunResult.values`
        replayed : op name -> (its `OpRun` from another session, its wall seconds there):
            these ops are not run but taken as run (`TargetSession.replay`; a parallel
            run's ops, `vdla.compiler.targets.op_parallel`)
        Raises ValueError for a bad feed or a closed session, and what a target raises
        for an op that cannot complete (the simulators' `vdla.sim.SimError`)."""
        if self.closed:
            raise ValueError("ModelSession.run: the session is closed")
        graph = self.compiled.graph
        values: dict[str, Any] = check_inputs(graph, feed)
        for name, t in graph.tensors.items():
            if t.is_constant:
                values[name] = t.data
        stats, transfers = [], []
        fetched: dict[str, np.ndarray] = {}    # held tensors read back this run
        written: set[tuple[str, str]] = set()   # (target, tensor) written this run
        ops = self.compiled.ops
        start = time.perf_counter()
        for i, op in enumerate(ops):
            if progress is not None:
                progress(i, len(ops), op.name)
            node = graph.node(op.name)
            session = self._sessions[op.target]
            args = []
            for t in node.inputs:
                if not t:
                    args.append(None)
                elif not session.holds(t):
                    args.append(self._on_host(t, values[t], op.name, fetched, transfers))
                else:
                    value = values[t]
                    if not (isinstance(value, DeviceValue) and value.session is session) \
                            and (op.target, t) not in written:
                        array = self._on_host(t, value, op.name, fetched, transfers)
                        t0 = time.perf_counter()
                        nbytes = session.put(t, array)
                        transfers.append(self._transfer(t, op.target, "to_target", op.name,
                                                        nbytes, time.perf_counter() - t0))
                        written.add((op.target, t))
                    args.append(DeviceValue(session, t))
            t0 = time.perf_counter()
            if replayed is not None and op.name in replayed:
                ran, seconds = replayed[op.name]
                ran = session.replay(op, node, ran)
            else:
                ran = session.run(op, node, args)
                seconds = time.perf_counter() - t0
            moved = session.drain_transfers()
            transfers.extend(dataclasses.replace(m, between=self._between(m.tensor, m.direction))
                             for m in moved)
            seconds -= sum(m.seconds for m in moved)    # reported as transfers instead
            for out, value in zip(node.outputs, ran.outputs):
                values[out] = (value if isinstance(value, DeviceValue) else
                               np.asarray(value).astype(DTYPES[graph.tensors[out].dtype],
                                                        copy=False))
            stats.append(OpStats(op.name, op.op, op.target, op.reason, op.schedule,
                                 seconds, ran.cycles, ran.macs, ran.bytes, dict(ran.extra),
                                 seconds if ran.device_seconds is None else ran.device_seconds,
                                 ran.device_time or WALL))
        outputs = {name: self._on_host(name, values[name], "", fetched, transfers)
                   for name in graph.outputs}
        wall = time.perf_counter() - start
        summary = {name: session.summary([s for s in stats if s.target == name])
                   for name, session in self._sessions.items()}
        if keep:   # after the timing: not a transfer of the run
            values = {name: (v.session.fetch(name) if isinstance(v, DeviceValue) else v)
                      for name, v in values.items()}
        return RunResult(outputs, tuple(stats), wall, summary, values if keep else None,
                         tuple(transfers))

    def _on_host(self, tensor: str, value, op: str, fetched: dict, transfers: list):
        """`value` as an array on the host: a held tensor is read back once per run (a
        logged `Transfer`)."""
        if not isinstance(value, DeviceValue):
            return value
        if tensor not in fetched:
            t0 = time.perf_counter()
            array = value.session.fetch(tensor)
            fetched[tensor] = array
            target = next(n for n, s in self._sessions.items() if s is value.session)
            transfers.append(self._transfer(tensor, target, "to_host", op, array.nbytes,
                                            time.perf_counter() - t0))
        return fetched[tensor]

    def _transfer(self, tensor, target, direction, op, nbytes, seconds) -> Transfer:
        return Transfer(tensor, target, direction, op, int(nbytes), seconds,
                        self._between(tensor, direction))

    def _between(self, tensor: str, direction: str) -> bool:
        """Whether moving `tensor` this way is repacking between two target ops: written
        to a target although a target op produced it, or read back although every
        reader is a target op (and it is no model output)."""
        graph, where = self.compiled.graph, self._where
        producer = graph.producer(tensor)
        if direction == "to_target":
            return producer is not None and where[producer.name] != HOST
        readers = graph.consumers(tensor)
        return (producer is not None and where[producer.name] != HOST
                and tensor not in graph.outputs and bool(readers)
                and all(where[n.name] != HOST for n in readers))
