"""A target is one folder and one registry entry: a small target defined here, through the
public interface alone (quantized convolutions and dense layers by numpy im2col,
everything else refused), runs ResNet-18 through the pipeline with host fallback
bit-exactly, and has its tasks tuned by the tuner. It has a command-line option of its
own (``--chunk-rows``) and a tunable task on the tuner's one-node task base, and runs
through ``vdla run --target``, ``vdla compare`` and ``vdla tune`` with nothing outside
this file changed.

Also: the registry, the host target, and `compile_model`'s checks."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import numpy as np
import pytest

from vdla.cli import main
from vdla.compiler import pipeline, targets
from vdla.compiler.reference import run_reference
from vdla.compiler.reference.integer import requantize, wrap32
from vdla.compiler.reference.numerics import pool2d_windows
from vdla.compiler.targets import (CompiledOp, OpRun, Support, Target, TargetOption,
                                   TargetSession, compile_model)
from vdla.compiler.tuner.workload_tasks import tasks_from_workload
from vdla.compiler.tuner import LocalRunner, Records, tune_task
from vdla.compiler.tuner.task import OneNodeTask, merge_tasks, one_node_graph

NAME = "im2col"
#: Rows of the im2col matrix multiplied per step: the target's one schedule knob.
CHUNKS = (64, 256, 1024, 4096, 1 << 30)


@dataclasses.dataclass(frozen=True)
class Chunk:
    rows: int


def im2col_gemm(node, graph, x, residual, rows: int) -> np.ndarray:
    """``qconv2d``/``qdense`` as one matrix product of the input's windows (im2col) with
    the weights, `rows` output positions at a time, then the integer epilogue."""
    a = node.attrs
    w = graph.constant(node.inputs[1])
    bias = graph.constant(node.input(2)) if node.input(2) else None
    if node.op == "qdense":
        cols, out_shape = x.astype(np.float64), (x.shape[0], w.shape[0])
    else:
        win = pool2d_windows(x, w.shape[2:], a["strides"], a["pads"])   # N C Ho Wo kh kw
        n, c, ho, wo, kh, kw = win.shape
        cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * ho * wo, c * kh * kw)
        cols, out_shape = cols.astype(np.float64), (n, ho, wo, w.shape[0])
    wm = w.reshape(w.shape[0], -1).astype(np.float64).T
    # float64 products of int8 are exact, and so are sums far below 2**53.
    acc = np.concatenate([np.rint(cols[i:i + rows] @ wm) for i in range(0, len(cols), rows)])
    acc = acc.astype(np.int64).reshape(out_shape)
    if node.op == "qconv2d":
        acc = acc.transpose(0, 3, 1, 2)
    if bias is not None:
        acc = acc + bias.astype(np.int64).reshape((1, -1) + (1,) * (acc.ndim - 2))
    y = requantize(acc, a["multiplier"], a["shift"], axis=1)
    if residual is not None:
        r = requantize(residual.astype(np.int32), a["residual_multiplier"],
                       a["residual_shift"], axis=1)
        y = wrap32(y.astype(np.int64) + r)
    return np.clip(y, a["out_min"], a["out_max"]).astype(np.int8)


@dataclasses.dataclass(frozen=True, eq=False)
class Im2colTask(OneNodeTask):
    """The rows per step of one convolution, timed by wall time: the key, seed, inputs,
    reference, check and merging are the base's; compiled by the target's compile_op."""

    target = NAME
    platform = "numpy"
    measure_backends = ("wall",)
    unit = "ns"

    @property
    def workload(self) -> dict:
        g, n = self.graph, self.graph.node(self.node)
        return {"op": n.op, "x": g.tensors[n.inputs[0]].shape,
                "w": g.tensors[n.inputs[1]].shape,
                "strides": list(n.attrs.get("strides", ())),
                "pads": list(n.attrs.get("pads", ()))}

    def space(self):
        return [Chunk(r) for r in CHUNKS]

    def default_schedule(self):
        return Chunk(256)

    def features(self, schedule, estimate=None):
        return [math.log2(schedule.rows)]

    def knobs(self, schedule):
        return (CHUNKS.index(schedule.rows),)

    def schedule_to_dict(self, schedule):
        return dataclasses.asdict(schedule)

    def schedule_from_dict(self, data):
        return Chunk(**data)

    def compile(self, schedule, backend):
        return Im2colTarget().compile_op(self.graph.node(self.node), self.graph, schedule)

    def run(self, compiled, context, data, backend):
        node = self.graph.node(self.node)
        args = [data.feed.get(name) for name in node.inputs]
        return _Session(self.graph).run(compiled, node, args).outputs[0], args

    def time(self, compiled, args, context, data, backend):
        node, times = self.graph.node(self.node), []
        for _ in range(3):       # the median of three runs: wall time is noisy
            start = time.perf_counter_ns()
            _Session(self.graph).run(compiled, node, args)
            times.append(time.perf_counter_ns() - start)
        return sorted(times)[1], {}


class _Session(TargetSession):
    def __init__(self, graph):
        self.graph = graph

    def run(self, op, node, args):
        y = im2col_gemm(node, self.graph, args[0], args[3] if len(args) > 3 else None,
                        op.kernel.rows)
        w = self.graph.tensors[node.inputs[1]].shape
        macs = int(np.prod(y.shape)) * int(np.prod(w[1:]))
        return OpRun([y], macs=macs, extra={"rows_per_step": op.kernel.rows})


class Im2colTarget(Target):
    """Quantized convolutions (groups 1, no dilation) and dense layers by numpy im2col,
    `rows` output positions per step unless a schedule says otherwise."""

    name = NAME
    description = "int8 convolutions and dense layers as numpy im2col products (a test)"
    measure_backends = ("wall",)
    cli_options = (TargetOption("--chunk-rows", "im2col rows multiplied per step",
                                type=int, metavar="N", commands=("run", "compare", "tune")),)

    def __init__(self, rows: int = 256):
        self.rows = rows

    @classmethod
    def from_cli(cls, options, *, precision="int8", log=None):
        rows = options.get("chunk_rows")
        if rows is not None and rows < 1:
            raise ValueError(f"--chunk-rows must be a positive integer, not {rows}")
        return cls(256 if rows is None else rows)

    def options(self):
        return {"rows": self.rows}

    def describe_schedule(self, schedule):
        return f"{schedule['rows']} rows/step"

    def supports(self, node, graph):
        if node.op not in ("qconv2d", "qdense"):
            return Support(False, f"{node.op}: the im2col target runs qconv2d and qdense only")
        if node.attrs.get("groups", 1) != 1 or tuple(node.attrs.get("dilations", (1, 1))) \
                != (1, 1):
            return Support(False, "grouped or dilated convolution")
        if graph.constant(node.inputs[1]) is None:
            return Support(False, "computed weights")
        return Support(True, "im2col product in numpy")

    def compile_op(self, node, graph, schedule=None):
        schedule = schedule or Chunk(self.rows)
        return CompiledOp(node.name, node.op, self.name, "", dataclasses.asdict(schedule),
                          schedule)

    def open_session(self, graph, ops, device=None):
        return _Session(graph)

    def tasks(self, graph):
        return merge_tasks([(Im2colTask(node.name, one_node_graph(node, graph), node.name),
                             node) for node in graph.nodes() if self.supports(node, graph).ok])


@pytest.fixture(scope="module", autouse=True)
def registered():
    # Through the public interface alone: one registry entry.
    targets.register(NAME, Im2colTarget)
    assert NAME in targets.names()
    yield
    targets.unregister(NAME)


def test_resnet18_runs_on_the_new_target_with_host_fallback_bit_exactly():
    target = targets.get(NAME)
    model = pipeline.load_model("resnet18", calibration=1)
    outcome = pipeline.run_model(model, target)
    assert outcome.bit_exact, outcome.mismatch
    ops = outcome.result.ops
    gemm = [s for s in ops if s.op in ("qconv2d", "qdense")]
    assert len(gemm) == 21 and {s.target for s in gemm} == {NAME}
    assert {s.target for s in ops if s.op not in ("qconv2d", "qdense")} == {"host"}
    assert all(s.macs > 0 and s.extra == {"rows_per_step": 256} for s in gemm)
    host = next(s for s in ops if s.op == "max_pool2d")
    assert "runs qconv2d and qdense only" in host.reason
    # The quantization mode is the target's first (it states none: both, multiply first).
    assert outcome.quantized.metadata["quantized"]["mode"] == "multiply"


def test_the_cli_runs_the_new_target(tmp_path, capsys):
    report = tmp_path / "run.json"
    assert main(["run", "digits_cnn", "--target", NAME, "--chunk-rows", "64",
                 "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert f"(4 on {NAME}, 4 on the host)" in out and "rows per step" in out
    # Its own option reached it, and its schedules are described in its own words.
    assert "64 rows/step" in out and "256 rows/step" not in out
    assert "bit-exact vs the quantized reference: yes" in out
    data = json.loads(report.read_text())
    assert data["target"] == NAME and data["cycles"] is None
    assert data["options"] == {"rows": 64}
    assert main(["targets"]) == 0
    assert f"{NAME}: int8 convolutions" in capsys.readouterr().out
    # The option is the new target's alone, and its value is the target's to check.
    assert main(["run", "digits_cnn", "--target", "host", "--chunk-rows", "64"]) == 1
    assert f"--chunk-rows applies to --target {NAME}, not to --target host" in \
        capsys.readouterr().err
    assert main(["run", "digits_cnn", "--target", NAME, "--chunk-rows", "0"]) == 1
    assert "--chunk-rows must be a positive integer, not 0" in capsys.readouterr().err


def test_the_cli_compares_the_new_target(tmp_path, capsys):
    out = tmp_path / "compare.json"
    assert main(["compare", "digits_cnn", "--targets", f"{NAME},host", "--chunk-rows", "64",
                 "--chart", str(tmp_path / "c.png"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"on {NAME}, host" in text and "same outputs" in text
    doc = json.loads(out.read_text())
    assert doc["outputs_identical"] is True
    assert doc["targets"][NAME]["options"] == {"rows": 64}
    assert doc["targets"][NAME]["ops_on_target"] == 4
    # Its time is its wall time (it says nothing of a device of its own).
    assert doc["targets"][NAME]["time"] == "wall time on this machine"


def test_the_cli_tunes_the_new_target(tmp_path, capsys):
    records, report = tmp_path / "t.db", tmp_path / "tune.json"
    # The budget is the model's: an equal split gives each workload its whole space.
    tasks = len(pipeline.load_model("digits_cnn").graph.nodes())   # at most one a node
    assert main(["tune", "digits_cnn", "--target", NAME, "--trials", str(len(CHUNKS) * tasks),
                 "--split", "equal", "--records", str(records), "--json", str(report)]) == 0
    text = capsys.readouterr().out
    assert f"target {NAME}, platform numpy, wall measurements" in text
    assert "rows/step" in text            # the table describes schedules in its words
    doc = json.loads(report.read_text())
    assert doc["target"] == NAME and len(doc["workloads"]) >= 1
    assert all(w["trials"] == len(CHUNKS) and w["failures"] == 0 for w in doc["workloads"])
    # `vdla run --records` compiles with what it found.
    assert main(["run", "digits_cnn", "--target", NAME, "--records", str(records)]) == 0
    assert "tunable ops from the records" in capsys.readouterr().out


def test_the_tuner_tunes_a_task_of_the_new_target(tmp_path):
    target = targets.get(NAME)
    # Its key leaves the epilogue out, so ResNet-18's C5 nodes (with and without a
    # residual add) are one task, named after the workload alone.
    [task] = tasks_from_workload("C5", target)
    assert task.name == "C5" and task.target == NAME
    assert task.nodes == ("layer2.0.conv2", "layer2.1.conv1", "layer2.1.conv2")
    with Records(tmp_path / "t.db") as records, LocalRunner("wall", jobs=1) as runner:
        result = tune_task(task, runner, trials=len(CHUNKS), records=records, seed=0)
        rows = records.query(target=NAME)
    assert result.failures == 0 and result.trials == len(CHUNKS) == len(rows)
    assert result.best in task.space() and result.best_cycles > 0
    assert {r.workload for r in rows} == {task.key} and {r.config for r in rows} == {"numpy"}
    # The best record compiles a model's matching nodes with its schedule.
    model = pipeline.load_model("digits_cnn")
    quantized = pipeline.quantize_for(model, target)
    with Records(tmp_path / "t.db") as records:
        compiled, schedules = pipeline.compile_for(quantized, target, records=records,
                                                   backend="wall")
    assert schedules == {}       # C5 is not one of the digits CNN's layers


def test_a_target_option_is_checked_when_declared():
    with pytest.raises(ValueError, match="flag must look like --name, not 'threads'"):
        TargetOption("threads", "no dashes")
    with pytest.raises(ValueError, match="unknown command\\(s\\) sweep; known: run, compare"):
        TargetOption("--rows", "a command that takes no target options", commands=("sweep",))
    assert TargetOption("--chunk-rows", "ok").dest == "chunk_rows"


def test_the_registry():
    assert targets.names()[:2] == ["vdla", "host"]
    with pytest.raises(ValueError, match="unknown target 'tpu'; available: vdla, host"):
        targets.get("tpu")
    with pytest.raises(ValueError, match="target 'vdla' is registered already"):
        targets.register("vdla", Im2colTarget)
    with pytest.raises(ValueError, match="must be an identifier"):
        targets.register("no spaces", Im2colTarget)
    targets.register("broken", lambda: 3)
    try:
        with pytest.raises(TypeError, match="returned int, not a vdla.compiler.targets.Target"):
            targets.get("broken")
    finally:
        targets.unregister("broken")
    assert "broken" not in targets.names()
    with pytest.raises(KeyError, match="was not added with register"):
        targets.unregister("vdla")
    with pytest.raises(TypeError):
        targets.get("host", config=None)     # the host target takes no options


def test_the_host_target_runs_everything_on_the_reference():
    host = targets.get("host")
    model = pipeline.load_model("small_cnn", calibration=2)
    outcome = pipeline.run_model(model, host)
    assert outcome.bit_exact and {s.target for s in outcome.result.ops} == {"host"}
    assert outcome.result.cycles is None and outcome.result.summary == {"host": {}}
    assert host.tasks(outcome.quantized) == [] and not host.measure_backends


def test_compile_model_checks_its_arguments():
    model = pipeline.load_model("digits_cnn")
    target = targets.get(NAME)
    quantized = pipeline.quantize_for(model, target)
    with pytest.raises(TypeError, match="target must be a vdla.compiler.targets.Target"):
        compile_model(quantized, "im2col")
    with pytest.raises(ValueError, match=r"schedules name \['/Flatten'\].*im2col"):
        compile_model(quantized, target, schedules={"/Flatten": Chunk(64)})
    compiled = compile_model(quantized, target, schedules={"/features/features.0/Conv":
                                                           Chunk(64)})
    op = next(o for o in compiled.ops if o.name == "/features/features.0/Conv")
    assert op.schedule == {"rows": 64} and op.target == NAME
    assert compiled.partition.summary() == {NAME: 4, "host": 4}
