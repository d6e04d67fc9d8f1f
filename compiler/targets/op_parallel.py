"""A model's ops run in parallel, each in a session of its own, fed its inputs from the
reference.

A model's ops on a simulated target are separate programs, and each op's inputs are
known before it runs: the integer reference defines every tensor bit for bit. So the
ops can be simulated at once, on the cores of one machine or the nodes of a Ray
cluster (`vdla.execute`), with the cycles and outputs they have one after another:

1. the reference runs the graph and keeps every tensor;
2. each op the target lets run apart (`Target.parallel_ops`) becomes a task: its name
   and the tensors it reads (`OpTask`), handed out the longest first (`Target.op_cost`).
   A worker (`OpWorker`) opens a session of the compiled model once, and for each task
   writes the inputs where the op reads them, runs it, and sends back its `OpRun` with
   the outputs as arrays. Every session places each op at the same addresses (the vdla
   target allocates in one order), so an op's DMA bursts, and with them its cycles, are
   those of the sequential run;
3. the model then runs as usual in this process, except that those ops are not run but
   replayed (`ModelSession.run`'s ``replayed``): their outputs are written where the
   sequential run's would be, so host ops, transfers, outputs and the report come out
   of the one code path, and the outputs are checked against the reference as always.

With ``chain``, the ops are cut into as many runs of consecutive ops as there are
workers, and within one run each op reads the previous ops' outputs from its worker's
memory, as in the sequential run; only each run's first op is fed from the reference.

    with make_executor(worker_factory(compiled), jobs=2) as executor:
        replayed = run_ops(compiled, reference, executor)
    with compiled.session() as session:
        result = session.run(feed, replayed=replayed)
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Mapping

import numpy as np

from vdla.compiler.targets.base import DeviceValue, OpRun, Progress
from vdla.compiler.targets.model import CompiledModel

__all__ = ["OpTask", "OpWorker", "op_tasks", "run_ops", "worker_factory"]


@dataclasses.dataclass(frozen=True)
class OpTask:
    """Ops a worker runs in order in its session, and the tensors they read that none
    of them produces (constants excluded: the worker has the graph).

    ops : op names, one unless chained
    inputs : tensor name -> array
    """

    ops: tuple[str, ...]
    inputs: Mapping[str, np.ndarray]

    def __repr__(self) -> str:   # tasks are named in errors: the arrays would drown it
        return f"OpTask({', '.join(self.ops)})"


class OpWorker:
    """A worker's evaluator: a session of `compiled`'s primary target, opened once, that
    runs `OpTask` s. Called with a task, returns {op name: (its `OpRun` with the outputs
    as arrays, its wall seconds)}."""

    def __init__(self, compiled: CompiledModel):
        self.compiled = compiled
        target = compiled.target
        self.ops = {op.name: op for op in compiled.ops_on(target.name)}
        self.session = target.open_session(compiled.graph, list(self.ops.values()), None)

    def __call__(self, task: OpTask) -> dict[str, tuple[OpRun, float]]:
        graph, session = self.compiled.graph, self.session
        values: dict[str, Any] = dict(task.inputs)
        done = {}
        for name in task.ops:
            op, node = self.ops[name], graph.node(name)
            args = []
            for t in node.inputs:
                if not t:
                    args.append(None)
                    continue
                tensor = graph.tensors[t]
                value = tensor.data if tensor.is_constant else values[t]
                if session.holds(t):
                    if not (isinstance(value, DeviceValue) and value.session is session):
                        session.put(t, np.asarray(value))
                    value = DeviceValue(session, t)
                elif isinstance(value, DeviceValue):
                    value = session.fetch(t)
                args.append(value)
            start = time.perf_counter()
            ran = session.run(op, node, args)
            seconds = time.perf_counter() - start
            session.drain_transfers()
            values.update(zip(node.outputs, ran.outputs))
            outputs = [session.fetch(out) if isinstance(value, DeviceValue) else
                       np.asarray(value) for out, value in zip(node.outputs, ran.outputs)]
            done[name] = (dataclasses.replace(ran, outputs=outputs), seconds)
        return done


def worker_factory(compiled: CompiledModel) -> Callable[[], OpWorker]:
    """The picklable factory an executor's workers build their `OpWorker` with."""
    return functools.partial(OpWorker, compiled)


def op_tasks(compiled: CompiledModel, reference: Mapping[str, np.ndarray], *,
             chain: int = 0) -> list[OpTask]:
    """The tasks of `compiled`'s ops that run apart (`Target.parallel_ops`), fed from
    `reference` (every tensor of the graph's reference run). One op a task; with `chain`
    N > 0, N runs of consecutive ops of about equal length (in ops). The longest tasks
    come first where the target can tell (`Target.op_cost`): a worker handed a long op
    last would finish alone."""
    graph, target = compiled.graph, compiled.target
    parallel = target.parallel_ops(compiled.ops_on(target.name))
    costs = {op.name: target.op_cost(op) for op in parallel}
    ops = [op.name for op in parallel]
    if chain:
        size = -(-len(ops) // chain) if ops else 1
        groups = [tuple(ops[i:i + size]) for i in range(0, len(ops), size)]
    else:
        groups = [(name,) for name in ops]
    tasks = []
    for group in groups:
        made: set[str] = set()
        inputs = {}
        for name in group:
            node = graph.node(name)
            for t in node.inputs:
                if t and t not in made and not graph.tensors[t].is_constant:
                    inputs[t] = reference[t]
            made.update(node.outputs)
        tasks.append(OpTask(group, inputs))
    if None not in costs.values():   # stable: equal costs stay in graph order
        tasks.sort(key=lambda task: -sum(costs[name] for name in task.ops))
    return tasks


def run_ops(compiled: CompiledModel, reference: Mapping[str, np.ndarray], executor, *,
            chain: bool = False, progress: Progress | None = None
            ) -> dict[str, tuple[OpRun, float]]:
    """Run the ops of `compiled` that run apart on `executor` (`vdla.execute`, built with
    `worker_factory`), fed from `reference`; returns ``replayed`` for `ModelSession.run`.
    `progress` is called as each task finishes, with (ops done, ops, last op's name)."""
    tasks = op_tasks(compiled, reference, chain=executor.workers if chain else 0)
    total = sum(len(task.ops) for task in tasks)
    replayed: dict[str, tuple[OpRun, float]] = {}
    for _, done in executor.map_unordered(tasks):
        replayed.update(done)
        if progress is not None:
            progress(len(replayed), total, next(reversed(done)))
    return replayed
