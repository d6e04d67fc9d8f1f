"""The CPU target's generated C against the references: int8 bit-exact against the
integer reference, float32 within float32 rounding of the float reference. A conv grid
(kernels 1-7, strides, pads, dilation, groups and depthwise, channel counts of no
particular multiple, residual, both requantization modes), schedules drawn from the
tuner's space, every instruction set this machine can run (AVX-512 VNNI where present,
AVX2, portable C), dense layers, whole zoo models, the whole-graph runner and the
stand-alone project, and the errors a user meets."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from vdla.compiler import Graph, pipeline, run_reference, targets
from vdla.compiler.targets.cpu.shapes import ConvShape
from vdla.compiler.targets.cpu.dense_schedule import DenseSchedule
from vdla.compiler.targets.cpu.schedule import (ConvSchedule, ScheduleError, choose_conv,
                                                conv_space)
from vdla.compiler.targets.model import compile_model

from gemm_graphs import FLOAT_TOLERANCE, assert_matches, conv_graph, dense_graph

def run_cpu(target, g, feed, schedules=None):
    compiled = compile_model(g, target, schedules=schedules)
    assert all(op.target == "cpu" for op in compiled.ops), [
        (op.name, op.target, op.reason) for op in compiled.ops]
    with compiled.session() as session:
        outputs = session.run(feed).outputs
        whole = session.run_graph(feed)
    assert set(whole.op_seconds) == {op.name for op in compiled.ops}
    for name, value in whole.outputs.items():   # the one-call runner computes the same
        np.testing.assert_array_equal(value, outputs[name])
    return outputs


GRID = [dict(k=k, stride=s, pad=p) for k, s, p in itertools.product((1, 3, 5, 7), (1, 2),
                                                                    (0, 1, 3)) if p < k]


@pytest.mark.parametrize("shape", GRID, ids=lambda d: "k{k}s{stride}p{pad}".format(**d))
@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_conv_grid(best, shape, dtype):
    rng = np.random.default_rng(hash(tuple(shape.values())) % 2**32)
    g, feed = conv_graph(rng, c=13, o=10, h=11, w=10, dtype=dtype, **shape)
    assert_matches(g, run_cpu(best, g, feed), feed)


CASES = [dict(groups=2, c=14, o=10), dict(groups=4, c=12, o=20), dict(groups=7, c=7, o=7),
         dict(groups=24, c=24, o=24, k=3, stride=2), dict(groups=5, c=5, o=10, k=5, pad=2),
         dict(dilation=2, k=3, pad=2), dict(n=2, residual=True),
         dict(residual=True, multiply=True), dict(multiply=True, per_channel=False),
         dict(bias=False, per_channel=False), dict(nonnegative=True, out_min=0),
         dict(nonnegative=True, residual=True, c=33, o=17, k=1, pad=0)]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_groups_depthwise_dilation_residual_modes_on_every_isa(cpu, case):
    rng = np.random.default_rng(7)
    g, feed = conv_graph(rng, **case)
    assert_matches(g, run_cpu(cpu, g, feed), feed)


@pytest.mark.parametrize("case", [dict(), dict(groups=4, c=12, o=8, residual=True),
                                  dict(groups=16, c=16, o=16, stride=2),
                                  dict(activation="relu", k=1, pad=0, n=2)], ids=str)
def test_float_conv_on_every_isa(cpu, case):
    rng = np.random.default_rng(8)
    g, feed = conv_graph(rng, dtype="float32", **case)
    assert_matches(g, run_cpu(cpu, g, feed), feed)


POINTWISE = [  # (graph, schedule knobs past vl/mr/nv) for lanes="co"
    (dict(c=37, o=40, h=7, w=7, activation="relu"), {}),                  # channel/pixel tails
    (dict(c=64, o=48, h=5, w=9, residual=True, activation="relu", n=2), dict(tile_ci=16)),
    (dict(c=20, o=33, h=12, w=11, activation="clip"), dict(tile_h=5, order="px")),
    (dict(c=9, o=16, h=3, w=3, residual=True), dict(parallel="none", unroll=2)),
]


@pytest.mark.parametrize("case, knobs", POINTWISE, ids=str)
def test_pointwise_lanes_along_channels_on_every_isa(cpu, case, knobs):
    """Float32 1x1 layers with vectors along output channels (8x8 transposed stores):
    every register tile the ISA allows, tails of pixels and channels, passes, residual,
    ReLU and clip."""
    rng = np.random.default_rng(5)
    g, feed = conv_graph(rng, dtype="float32", k=1, pad=0, **case)
    if case.get("activation") == "clip":
        g.node("conv").attrs.update(clip_min=-0.5, clip_max=0.75)
    shape = ConvShape.from_node(g.node("conv"), g)
    assert shape.pointwise
    want = run_reference(g, feed)[g.outputs[0]]
    isa = cpu.isa
    tried = 0
    for vl in isa.lanes:
        for mr, nv in ((8, 1), (8, 2), (8, 3), (16, 1)):
            width = nv * vl
            schedule = ConvSchedule(vl, mr, nv, width, knobs.get("tile_h", shape.ho),
                                    knobs.get("tile_ci", shape.c), knobs.get("order", "co"),
                                    knobs.get("unroll", 1), knobs.get("parallel", "all"),
                                    lanes="co")
            try:
                schedule.check(shape, isa)
            except ScheduleError:
                continue                   # more registers than the ISA has
            y = run_cpu(cpu, g, feed, {"conv": schedule})[g.outputs[0]]
            err = np.abs(y.astype(np.float64) - want).max() / np.abs(want).max()
            assert err < FLOAT_TOLERANCE, (schedule, err)
            tried += 1
    assert tried >= 1


def test_pointwise_knob_errors(best):
    rng = np.random.default_rng(5)
    g, _ = conv_graph(rng, dtype="float32", k=3, pad=1)
    shape = ConvShape.from_node(g.node("conv"), g)
    with pytest.raises(ScheduleError, match="lanes='co'.*1x1"):
        ConvSchedule(16, 8, 1, 16, 9, 20, lanes="co").check(shape, best.isa)
    g, _ = conv_graph(rng, dtype="float32", k=1, pad=0)
    shape = ConvShape.from_node(g.node("conv"), g)
    with pytest.raises(ScheduleError, match="mr=6 must be a multiple of 8"):
        ConvSchedule(8, 6, 1, 8, 9, 20, lanes="co").check(shape, best.isa)
    # (one vector of channels: 8 accumulators fit AVX2's 16 registers as well as AVX-512's)
    with pytest.raises(ScheduleError, match="tile_co=12 must be a multiple of nv \\* vl=8"):
        ConvSchedule(8, 8, 1, 12, 9, 20, lanes="co").check(shape, best.isa)
    with pytest.raises(ScheduleError, match="lanes='rows'"):
        ConvSchedule(8, 8, 1, 8, 9, 20, lanes="rows").check(shape, best.isa)
    # records from before the knob: lanes defaults to "px"
    old = {k: v for k, v in ConvSchedule(8, 4, 1, 8, 9, 20).to_dict().items() if k != "lanes"}
    assert ConvSchedule.from_dict(old).lanes == "px"


@pytest.mark.parametrize("dtype", ["int8", "float32"])
@pytest.mark.parametrize("case", [dict(c=16, o=24, h=10, w=13),
                                  dict(c=6, o=6, groups=6, h=12, w=9, stride=2),
                                  dict(c=40, o=36, h=5, w=5, k=1, pad=0, residual=True)],
                         ids=str)
def test_schedules_from_the_space(best, dtype, case):
    """Schedules the tuner may pick, drawn at random (both vector widths, every knob):
    each computes the reference's output."""
    rng = np.random.default_rng(11)
    g, feed = conv_graph(rng, dtype=dtype, **case)
    shape = ConvShape.from_node(g.node("conv"), g)
    space = list(conv_space(shape, best.isa))
    picks = random.Random(3).sample(space, 6)
    assert choose_conv(shape, best.isa) in space
    for schedule in picks:
        assert_matches(g, run_cpu(best, g, feed, {"conv": schedule}), feed)


@pytest.mark.parametrize("dtype", ["int8", "float32"])
@pytest.mark.parametrize("residual", [False, True])
def test_dense_on_every_isa(cpu, dtype, residual):
    g, feed = dense_graph(np.random.default_rng(3), dtype=dtype, residual=residual)
    assert_matches(g, run_cpu(cpu, g, feed), feed)


@pytest.mark.parametrize("model", ["digits_cnn", "small_cnn", "mobilenet_v1", "resnet18"])
@pytest.mark.parametrize("precision", ["int8", "float32"])
def test_zoo_models_through_the_pipeline(model, precision):
    loaded = pipeline.load_model(model, calibration=1, note=None)
    outcome = pipeline.run_model(loaded, targets.get("cpu"), precision=precision)
    assert outcome.bit_exact, outcome.mismatch
    assert all(op.target == "cpu" for op in outcome.compiled.ops), [
        (op.name, op.reason) for op in outcome.compiled.ops if op.target != "cpu"]
    if precision == "int8":
        assert outcome.max_error == 0.0
    else:
        assert 0.0 < outcome.max_error < pipeline.FLOAT_TOLERANCE
    with outcome.compiled.session() as session:
        whole = session.run_graph(loaded.feed).outputs
    for name, value in whole.items():
        np.testing.assert_array_equal(value, outcome.result.outputs[name])


def test_what_it_does_not_run_says_why(best):
    g = Graph("other")
    a = g.add_input("a", (1, 4, 3, 3), "float32")
    s = g.add_node("lrn", [a], name="lrn")
    g.set_outputs([s])
    ok, reason = best.supports(g.node("lrn"), g)
    assert not ok and "does not run 'lrn'" in reason
    rng = np.random.default_rng(0)
    g, _ = conv_graph(rng, c=4, o=4)
    g.node("conv").attrs["data_layout"] = "NCHW1n16c"
    ok, reason = best.supports(g.node("conv"), g)
    assert not ok and "plain layouts" in reason
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        targets.get("cpu", threads=0)
    with pytest.raises(ValueError, match="unknown CPU instruction set 'sse9'"):
        targets.get("cpu", isa="sse9").isa


class TestScheduleErrors:
    """A schedule that does not fit names the knob, its value and what is allowed."""

    @pytest.fixture(scope="class")
    def conv(self):
        g, _ = conv_graph(np.random.default_rng(0), c=16, o=24, h=8, w=8)
        return g

    @pytest.mark.parametrize("change, message", [
        (dict(mr=40), "schedule knob mr=40 is out of range"),
        (dict(mr=8, nv=4), "mr=8 and nv=4 need 32 accumulator"),
        (dict(tile_co=12), "tile_co=12 must be a multiple of mr=8"),
        (dict(tile_co=64), "tile_co=64 exceeds the 24 output channels"),
        (dict(tile_h=9), "tile_h=9 is out of range: it must be in [1, 8]"),
        (dict(tile_ci=6), "tile_ci=6 must be a multiple of 4"),
        (dict(vl=4), "vl=4 is not a vector width"),
        (dict(order="zz"), "order='zz'"),
        (dict(parallel="gpu"), "parallel='gpu'"),
        (dict(unroll=3), "unroll=3"),
    ])
    def test_conv(self, best, conv, change, message):
        schedule = ConvSchedule(**{**dict(vl=best.isa.lanes[0], mr=8, nv=1, tile_co=16,
                                          tile_h=2, tile_ci=16), **change})
        with pytest.raises(ScheduleError, match=message.replace("[", r"\[").replace(
                "]", r"\]").replace("(", r"\(")):
            compile_model(conv, best, schedules={"conv": schedule})

    def test_wrong_kind_and_bad_records(self, best, conv):
        with pytest.raises(TypeError, match="takes a ConvSchedule, not DenseSchedule"):
            compile_model(conv, best, schedules={"conv": DenseSchedule(16, 1)})
        with pytest.raises(ScheduleError, match="needs the fields .* not {.mr.: 1}"):
            ConvSchedule.from_dict({"mr": 1})


def test_failed_build_names_the_log(best, tmp_path, monkeypatch):
    """A C compiler that fails: the error gives the path of its log, and the cache keeps
    no entry."""
    cc = tmp_path / "broken-cc"
    # It answers the probes (its version, -march=native's macros, OpenMP) like gcc and
    # fails every real build.
    cc.write_text("#!/bin/sh\nfor a in \"$@\"; do case $a in --version) echo broken 1.0; "
                  "exit 0;; -dM|probe.c) exec gcc \"$@\";; esac; done\n"
                  "echo 'error: this compiler is broken' >&2; exit 3\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path / "cache"))
    target = targets.get("cpu", threads=1, isa="portable")
    g, _ = conv_graph(np.random.default_rng(0), c=4, o=4)
    from vdla.compiler.targets.cpu.build import BuildError
    with pytest.raises(BuildError, match="the compiler's log is .*build.log") as info:
        compile_model(g, target)
    assert info.value.log.is_file() and "this compiler is broken" in info.value.log.read_text()
    assert not [p for p in (tmp_path / "cache" / "cpu").iterdir()
                if p.name not in ("failed", ".locks")]


def test_no_compiler_says_how_to_install_one(tmp_path, monkeypatch, capsys):
    from vdla.cli import main
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert main(["run", "digits_cnn", "--target", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "not an executable C compiler" in err and "apt install gcc" in err


class TestTuning:
    @pytest.fixture(scope="class")
    def task(self, best):
        loaded = pipeline.load_model("small_cnn", calibration=1, note=None)
        tasks = best.tasks(pipeline.quantize_for(loaded, best))
        return tasks[1]

    def test_task(self, task, best):
        assert task.target == "cpu" and task.unit == "ns" and task.nonnegative
        assert f"{best.team} threads, {best.isa.name}" in task.platform
        space = task.space()
        assert task.default_schedule() in space
        result = task.measure(task.default_schedule())
        assert result.ok and result.cycles > 0 and result.counters["runs"] >= 7, result
        assert result.cycles <= result.counters["p25_ns"] <= result.counters["median_ns"] \
            <= result.counters["p75_ns"]
        assert task.schedule_from_dict(task.schedule_to_dict(space[5])) == space[5]
        assert len(task.features(space[0], task.estimate(space[0]))) == \
            len(task.features(space[1], task.estimate(space[1])))

    def test_bad_schedule_is_an_error_result(self, task):
        bad = ConvSchedule(16, 40, 1, 40, 1, 4)
        result = task.measure(bad)
        assert result.status == "error" and "schedule knob" in result.error

    def test_tune_then_compile_with_the_records(self, task, best, tmp_path):
        from vdla.compiler.tuner import InProcessRunner, Records, tune_task
        with Records(tmp_path / "r.db") as records:
            result = tune_task(task, InProcessRunner("wall"), trials=4, records=records)
            assert result.trials == 4 and result.best_cycles and result.default_cycles
            loaded = pipeline.load_model("small_cnn", calibration=1, note=None)
            outcome = pipeline.run_model(loaded, best, records=records)
        assert outcome.bit_exact and set(outcome.schedules) == set(task.nodes)
        assert outcome.schedules[task.nodes[0]] == result.best

    def test_side_by_side_times_schedules_in_turn(self, task):
        """Slots of each schedule in turn, round after round (`CpuTask.side_by_side`),
        and the base's whole measurements in turn: one row a round, one column a
        schedule, each checked against the reference first."""
        from vdla.compiler.tuner.task import TuneTask
        default = task.default_schedule()
        other = next(s for s in task.space() if s != default)
        times = task.side_by_side([default, other, default], rounds=4, slot_seconds=0.001)
        assert times.shape == (4, 3) and (times > 0).all()
        # The same kernel twice, slots apart: alike (a shared host allows no closer bound).
        assert 0.5 < np.median(times[:, 2] / times[:, 0]) < 2
        whole = TuneTask.side_by_side(task, [default, other], rounds=2)
        assert whole.shape == (2, 2) and (whole > 0).all()
        with pytest.raises(ValueError, match="rounds must be >= 1 and slot_seconds > 0"):
            task.side_by_side([default], rounds=0)
        with pytest.raises(ValueError, match="schedule knob"):
            TuneTask.side_by_side(task, [ConvSchedule(16, 40, 1, 40, 1, 4)], rounds=1)


def test_reshapes_are_views_in_the_whole_graph_runner(best):
    """A reshape (or flatten) between two kernels takes its input's buffer instead of a
    copy: of a graph input, of another view (a chain), of a tensor that lives on after
    it; a reshape that writes a graph output still copies into the caller's buffer.
    The outputs are the reference's to the bit, and the runner calls nothing for a
    view."""
    g = Graph("views")
    x = g.add_input("x", (4, 6), "float32")
    a = g.add_node("reshape", [x], name="r_in", shape=(2, 12))           # of a graph input
    b = g.add_node("add", [a, a], name="double")
    c = g.add_node("reshape", [b], name="r1", shape=(3, 8))
    d = g.add_node("flatten", [g.add_node("reshape", [c], name="r2", shape=(1, 24, 1))],
                   name="r3", axis=1)                                     # a chain
    e = g.add_node("mul", [d, d], name="square")
    f = g.add_node("add", [e, g.add_node("reshape", [b], name="r4", shape=(1, 24))],
                   name="late")                                           # b lives on
    g.add_node("reshape", [f], name="r_out", shape=(6, 4))               # a graph output
    g.outputs = [g.node("r_out").outputs[0], b]
    feed = {"x": np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)}
    compiled = compile_model(g, best)
    program = compiled.ops[0].kernel.program
    views = {s.name for s in program.steps if s.view}
    assert views == {"r_in", "r1", "r2", "r3", "r4"}
    assert "a view of" in program.runner_source()
    with compiled.session() as session:
        whole = session.run_graph(feed)
    want = run_reference(g, feed)
    for name in g.outputs:
        np.testing.assert_array_equal(whole.outputs[name], want[name])
    assert set(whole.op_seconds) == {n.name for n in g.nodes()}
