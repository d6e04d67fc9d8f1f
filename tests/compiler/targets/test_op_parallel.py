"""A model's ops run in parallel (`vdla.compiler.targets.op_parallel`, `vdla run --jobs`):
the same cycles, outputs and report as the sequential run, on the Verilator model, on
local worker processes, chained, and on a local Ray instance."""

import dataclasses

import numpy as np
import pytest

import vdla
from vdla.compiler import pipeline
from vdla.compiler.targets import op_parallel
from vdla.compiler.targets.vdla.target import VdlaTarget
from vdla.execute import EvaluationError, make_executor

TARGET = VdlaTarget(vdla.HardwareConfig(), backend="verilator")

#: The zoo models the default run covers; the rest are in the slow test (the same code
#: path, ten times the simulated cycles).
QUICK = ["small_cnn", "digits_cnn", "mobilenet_v1", "resnet18"]
SLOW = ["resnet34", "resnet50"]


def same_run(sequential, parallel):
    """The two outcomes agree on every op's cycles, bytes and figures, on every tensor,
    and on the totals; both are bit-exact."""
    assert sequential.bit_exact and parallel.bit_exact
    assert parallel.parallel is not None and sequential.parallel is None

    def stats(outcome):
        return [(s.name, s.op, s.target, s.cycles, s.macs, s.bytes, dict(s.extra))
                for s in outcome.result.ops]

    assert stats(sequential) == stats(parallel)
    assert sequential.result.cycles == parallel.result.cycles
    assert sequential.result.summary == parallel.result.summary
    for name, value in sequential.result.values.items():
        assert np.array_equal(value, parallel.result.values[name]), name


def check_model(name, **options):
    model = pipeline.load_model(name)
    same_run(pipeline.run_model(model, TARGET), pipeline.run_model(model, TARGET, **options))


@pytest.mark.parametrize("name", QUICK)
def test_parallel_run_equals_the_sequential_run(name):
    check_model(name, jobs=2)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_parallel_run_equals_the_sequential_run_on_the_large_models(name):
    check_model(name, jobs=2)


def test_chained_runs_feed_each_op_from_the_one_before():
    model = pipeline.load_model("small_cnn")
    compiled, _ = pipeline.compile_for(pipeline.graph_for(model, TARGET), TARGET)
    reference = pipeline.run_reference(compiled.graph, model.feed, keep=True)
    tasks = op_parallel.op_tasks(compiled, reference, chain=2)
    ops = [op.name for op in TARGET.parallel_ops(compiled.ops_on(TARGET.name))]
    tasks.sort(key=lambda task: ops.index(task.ops[0]))   # (handed out longest first)
    assert [name for task in tasks for name in task.ops] == ops and len(tasks) == 2
    second = tasks[1]
    first_node = compiled.graph.node(second.ops[0])
    # Only what the chain's first op reads (and no op of the chain makes) comes in.
    made = {out for name in second.ops for out in compiled.graph.node(name).outputs}
    assert set(first_node.inputs) & set(second.inputs)
    assert not made & set(second.inputs)
    check_model("small_cnn", jobs=2, chain=True)


class _NoCosts(VdlaTarget):
    def op_cost(self, op):
        return None


def test_tasks_go_out_longest_first():
    """By the timing model's cycles for each op's schedule (`Target.op_cost`): ResNet-18's
    conv1 first, its global pool last; a target that cannot tell keeps graph order."""
    model = pipeline.load_model("resnet18")
    compiled, _ = pipeline.compile_for(pipeline.graph_for(model, TARGET), TARGET)
    reference = pipeline.run_reference(compiled.graph, model.feed, keep=True)
    ops = {op.name: op for op in TARGET.parallel_ops(compiled.ops_on(TARGET.name))}
    tasks = op_parallel.op_tasks(compiled, reference)
    costs = [TARGET.op_cost(ops[task.ops[0]]) for task in tasks]
    assert all(isinstance(c, int) and c > 0 for c in costs)
    assert costs == sorted(costs, reverse=True) and len(tasks) == len(ops)
    assert tasks[0].ops == ("conv1",) and tasks[-1].ops == ("avgpool",)
    unordered = dataclasses.replace(compiled, target=_NoCosts(TARGET.config,
                                                              backend="verilator"))
    assert [t.ops[0] for t in op_parallel.op_tasks(unordered, reference)] == list(ops)


def test_views_and_host_ops_stay_in_the_model_run():
    """Only ops with programs run apart; a view (flatten) and the host's quantize and
    dequantize run in the replaying session as always."""
    model = pipeline.load_model("resnet18")
    compiled, _ = pipeline.compile_for(pipeline.graph_for(model, TARGET), TARGET)
    apart = {op.name for op in TARGET.parallel_ops(compiled.ops_on(TARGET.name))}
    assert "flatten" not in apart and "layer1.0.conv1" in apart
    assert not apart & {op.name for op in compiled.ops_on("host")}


def test_ops_on_a_local_ray_instance():
    pytest.importorskip("ray")
    check_model("small_cnn", ray="local", jobs=2)


def test_a_task_that_fails_names_its_ops():
    """A worker's error comes back naming the task's ops, not its input arrays."""
    model = pipeline.load_model("small_cnn")
    compiled, _ = pipeline.compile_for(pipeline.graph_for(model, TARGET), TARGET)
    reference = pipeline.run_reference(compiled.graph, model.feed, keep=True)
    task = op_parallel.op_tasks(compiled, reference)[0]
    broken = op_parallel.OpTask(task.ops, {})     # its input missing
    with make_executor(op_parallel.worker_factory(compiled), jobs=2) as executor:
        with pytest.raises(EvaluationError, match=rf"task 0 \(OpTask\({task.ops[0]}\)\) "
                                                  "failed in a worker"):
            op_parallel.run_ops(compiled, reference, _Tasks(executor, [broken]))


class _Tasks:
    """An executor that is given `tasks` instead of the ones it is asked to run."""

    def __init__(self, executor, tasks):
        self.executor, self.tasks, self.workers = executor, tasks, executor.workers

    def map_unordered(self, _):
        return self.executor.map_unordered(self.tasks)
