"""The tuner: tasks and their keys, the SQLite records (round trip, concurrent writers),
measurements in worker processes (crashes, errors and hangs do not stop a search),
resuming without re-measuring, determinism (parallel = serial), the search strategies,
and `vdla tune` / `vdla run --records`."""

import dataclasses
import json
import multiprocessing
import pickle
import sqlite3

import numpy as np
import pytest

import vdla
from vdla.cli import main
from vdla.compiler import passes, pipeline, quantize, zoo
from vdla.compiler.frontend.workloads import RESNET18, parse_workload, workload_graph
from vdla.compiler.targets.vdla import Conv2dSchedule, VdlaTarget
from vdla.compiler.tuner import (ExecutorRunner, LocalRunner, MeasureInput, ModelTuner,
                                 Record, Records, ReplayRunner, best_schedules, make_tuner,
                                 tune_task)
from vdla.compiler.tuner.workload_tasks import tasks_from_workload
from vdla.compiler.tuner.records import OK

CFG = vdla.HardwareConfig()
TARGET = VdlaTarget(CFG)


def task_from_workload(spec, config=CFG):
    """The task of `spec` on `config` (a named workload's first)."""
    return tasks_from_workload(spec, VdlaTarget(config))[0]
#: Small workloads: a whole space measures in seconds on Verilator.
SMALL = "14,14,16,32,3,1,1"
TINY = "7,7,16,16,1,0,1"


@pytest.fixture(scope="module")
def verilator_runner():
    with LocalRunner("verilator", jobs=2) as runner:
        yield runner


def record(**changes) -> Record:
    base = dict(target="vdla", workload="w", config=CFG.name, backend="verilator",
                schedule={"tile_h": 1}, cycles=100, status=OK, counters={"cycles": 100},
                seconds=0.5)
    return Record(**{**base, **changes})


# --- tasks ---------------------------------------------------------------------------------

def test_task_of_a_workload_has_a_stable_key_and_space():
    spec = "28,28,128,128,3,1,1"
    task, again = (tasks_from_workload(spec, VdlaTarget(CFG)) for _ in range(2))
    assert len(task) == 1 and task[0].key == again[0].key and task[0].name == spec
    task = task[0]
    workload = json.loads(task.key)
    assert workload["c"] == 128 and workload["kernel_h"] == 3 and workload["op"] == "qconv2d"
    # The synthetic graph's epilogue: a per-tensor shift, the ReLU clamp; its bias is the
    # bias GEMM's.
    assert workload["epilogue"] == ["SHR:imm"] and workload["bias_gemm"]
    assert not workload["has_residual"]
    space = task.space()
    assert len(space) == len(set(space)) > 1000
    assert task.default_schedule() in space
    assert all(s.fits(task.layer, CFG) for s in space[::50])
    # A different config is a different space (and, by config name, different records).
    small = dataclasses.replace(CFG, acc_buff_size=16 * 1024)
    assert len(task_from_workload(spec, small).space()) < len(space)
    # Tasks travel to worker processes.
    copy = pickle.loads(pickle.dumps(task))
    assert copy.key == task.key and copy.space() == space


def test_a_named_workload_is_the_models_own_layers_epilogue_included():
    # The tasks `vdla run resnet18` (default seed and calibration) looks records up for.
    quantized = pipeline.quantize_for(pipeline.load_model("resnet18"), TARGET)
    model = {t.key: t for t in TARGET.tasks(quantized)}
    c8 = tasks_from_workload("c8", TARGET)
    assert [(t.name, t.nodes) for t in c8] == [
        ("C8", ("layer3.0.conv2", "layer3.1.conv1")), ("C8+residual", ("layer3.1.conv2",))]
    assert [t.key in model for t in c8] == [True, True]
    assert [t.workload["has_residual"] for t in c8] == [False, True]
    # Every name is found, and the names cover every convolution task of the model.
    named = [t for name in RESNET18 for t in tasks_from_workload(name, TARGET)]
    assert {t.key for t in named} == {k for k, t in model.items() if not t.layer.dense}
    assert tasks_from_workload("C4", TARGET)[0].name == "C4+residual"   # the fused shortcut
    # Tasks the suffix does not tell apart are numbered.

    class PerNode:                     # a target whose every node is a task of its own
        name, requant_modes = "per-node", TARGET.requant_modes

        def tasks(self, graph):
            return [dataclasses.replace(t, nodes=(n,)) for t in TARGET.tasks(graph)
                    for n in t.nodes]

    assert [t.name for t in tasks_from_workload("C8", PerNode())] == [
        "C8", "C8#2", "C8+residual"]
    # A synthetic workload of C8's shape has an epilogue of its own, so another key.
    assert task_from_workload("14,14,256,256,3,1,1").key not in model
    # A config the layer does not fit has no task for it.
    tiny = dataclasses.replace(CFG, acc_buff_size=1024, inp_buff_size=1024,
                               wgt_buff_size=2048)
    with pytest.raises(ValueError, match="no tunable task for workload C1 .*ResNet-18"):
        tasks_from_workload("C1", VdlaTarget(tiny))


def test_tasks_of_a_model_are_its_distinct_convolutions():
    graph = zoo.get("resnet18")
    q = quantize(passes.prepare(graph), {graph.inputs[0]: _normal((1,) + graph.tensors[
        graph.inputs[0]].shape[1:])}, "shift")
    tasks = TARGET.tasks(q)
    convs = [n for n in q.nodes() if n.op in ("qconv2d", "qdense")]
    assert len({t.key for t in tasks}) == len(tasks) < len(convs)
    assert {t.node for t in tasks} <= {n.name for n in convs}
    residual = [t for t in tasks if t.workload["has_residual"]]
    assert residual and all(len(t.graph.inputs) == 2 for t in residual)
    assert any("(+" in t.name for t in tasks)     # shared by several nodes


def _normal(shape):
    return np.random.default_rng(0).standard_normal(shape).astype("float32")


# --- records -------------------------------------------------------------------------------

def test_records_round_trip_and_best(tmp_path):
    path = tmp_path / "sub" / "tune.db"
    rows = [record(cycles=300, schedule={"tile_h": 3}),
            record(cycles=None, status="crash", counters={}, error="died",
                   schedule={"tile_h": 9}),
            record(cycles=200, schedule={"tile_h": 2}),
            record(cycles=150, backend="functional", counters={"gemm": 1}),
            record(cycles=100, workload="other")]
    with Records(path) as db:
        db.add(*rows[:2])
        db.add(*rows[2:])
        assert len(db) == 5
    with Records(path) as db:      # reopened: everything as written
        assert db.query() == rows
        assert db.query("w", CFG.name, "verilator") == rows[:3]
        assert db.query(status="crash") == [rows[1]]
        assert db.best("w", CFG.name, "verilator", target="vdla") == rows[2]
        assert db.best("w", CFG.name, "functional", target="vdla") == rows[3]
        assert db.best("w", "another-config", "verilator", target="vdla") is None
        assert db.best("w", CFG.name, "verilator", target="cpu") is None
        assert db.query(target="cpu") == []
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_records_rank_schedules_by_their_median(tmp_path):
    """`Records.ranked`: every schedule once, fastest first by the lower median of its
    ok rows, the oldest first among equals; `best` is its first."""
    rows = [record(cycles=300, schedule={"tile_h": 3}), record(cycles=100, schedule={"tile_h": 3}),
            record(cycles=500, schedule={"tile_h": 3}),          # median 300
            record(cycles=250, schedule={"tile_h": 2}),
            record(cycles=None, status="crash", counters={}, error="died",
                   schedule={"tile_h": 1}),
            record(cycles=250, schedule={"tile_h": 4})]          # ties with tile_h 2
    with Records(tmp_path / "r.db") as db:
        db.add(*rows)
        ranked = db.ranked("w", CFG.name, "verilator", target="vdla")
        assert [(r.schedule["tile_h"], r.cycles) for r in ranked] == [(2, 250), (4, 250),
                                                                       (3, 300)]
        assert db.best("w", CFG.name, "verilator", target="vdla") == ranked[0]
        assert db.ranked("w", CFG.name, "functional", target="vdla") == []


def test_records_reject_bad_rows_and_files(tmp_path):
    with pytest.raises(ValueError, match="status must be one of"):
        record(status="great")
    with pytest.raises(ValueError, match="an ok measurement has cycles"):
        record(cycles=None)
    with pytest.raises(ValueError, match="an ok measurement has cycles"):
        record(status="error", cycles=5)
    bad = tmp_path / "not.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ValueError, match="not a vdla records database"):
        Records(bad)
    with pytest.raises(ValueError, match="is a folder"):
        Records(tmp_path)


def test_unreadable_records_are_reported_not_skipped_silently(tmp_path):
    """A record whose schedule the task cannot read (another version's fields) is left
    out with one warning giving the count and the first reason, wherever records are
    read: resuming a search, and picking the best schedules for a model."""
    from vdla.compiler.tuner.tune import UnreadableRecords

    task = task_from_workload(TINY)
    good = task.default_schedule()
    rows = [Record(target="vdla", workload=task.key, config=task.platform,
                   backend="functional", schedule=schedule, cycles=cycles, status="ok")
            for schedule, cycles in ((task.schedule_to_dict(good), 900),
                                     ({"tile_h": 1}, 800), ({"tile_rows": 2}, 700))]
    with Records(tmp_path / "t.db") as db:
        db.add(*rows)
        with pytest.warns(UnreadableRecords, match=r"2 record\(s\) of task .* cannot read "
                                                   r"and were left out; the first: .*tile_h"):
            result = tune_task(task, ReplayRunner(db, "functional"), trials=1, records=db)
        assert result.resumed == 1 and result.best == good
        graph = workload_graph(parse_workload(TINY)[1])[0]
        with pytest.warns(UnreadableRecords, match=r"2 record\(s\)"):
            # the two fastest records are unreadable: the node gets the fastest it reads
            assert best_schedules(db, graph, TARGET, "functional") == {"conv": (good, 900)}


def test_a_version_1_records_file_is_migrated(tmp_path):
    """Records written before targets existed (schema 1, no target column) keep working:
    opening the file adds the column, every old row being the accelerator's."""
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE measurements (id INTEGER PRIMARY KEY, workload TEXT NOT NULL,
            config TEXT NOT NULL, backend TEXT NOT NULL, schedule TEXT NOT NULL,
            cycles INTEGER, counters TEXT NOT NULL, status TEXT NOT NULL,
            error TEXT NOT NULL, tool_version TEXT NOT NULL, created REAL NOT NULL,
            seconds REAL NOT NULL);
        CREATE INDEX measurements_task ON measurements (workload, config, backend);
        PRAGMA user_version=1;""")
    db.execute("INSERT INTO measurements (workload, config, backend, schedule, cycles, "
               "counters, status, error, tool_version, created, seconds) VALUES "
               "('w', ?, 'verilator', '{\"tile_h\": 1}', 100, '{}', 'ok', '', '0.1', 0, 1)",
               (CFG.name,))
    db.commit()
    db.close()
    with Records(path) as records:
        (row,) = records.query()
        assert row.target == "vdla" and row.cycles == 100
        assert records.best("w", CFG.name, "verilator", target="vdla") == row
        records.add(record(cycles=50))
        assert len(records) == 2
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 2
    path.write_bytes(b"")
    newer = sqlite3.connect(tmp_path / "newer.db")
    newer.execute("PRAGMA user_version=7")
    newer.commit()
    newer.close()
    with pytest.raises(ValueError, match="schema version 7; this vdla reads versions 1 and 2"):
        Records(tmp_path / "newer.db")


def _write_rows(path, worker, count):
    with Records(path) as db:
        for i in range(count):
            db.add(record(workload=f"w{worker}", schedule={"i": i}, cycles=i + 1))


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "shared.db"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_rows, args=(path, w, 60)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with Records(path) as db:
        assert len(db) == 240
        for w in range(4):
            assert sorted(r.schedule["i"] for r in db.query(f"w{w}")) == list(range(60))


# --- measuring -----------------------------------------------------------------------------

def test_measurements_are_real_and_checked(verilator_runner):
    task = task_from_workload(TINY, CFG)
    space = task.space()
    results = verilator_runner.measure([MeasureInput(task, s) for s in space[:4]])
    assert all(r.ok and r.cycles == r.counters["cycles"] > 0 for r in results)
    assert all(r.counters["gemm_active"] > 0 for r in results)
    # The functional fast mode runs the program too, and reports the analytical cycles.
    with LocalRunner("functional") as fast:
        quick = fast.measure([MeasureInput(task, s) for s in space[:4]])
    assert [r.cycles for r in quick] == [task.estimate(s).cycles for s in space[:4]]
    # Within the model's accuracy of the cycle-accurate figures.
    assert all(abs(q.cycles / r.cycles - 1) < 0.2 for q, r in zip(quick, results))
    # A schedule that does not fit fails as a result, not as an exception.
    bad = verilator_runner.measure([MeasureInput(task_from_workload("C11", CFG),
                                                 Conv2dSchedule(7, 7, 32, 32))])[0]
    assert bad.status == "error" and "does not fit" in bad.error


def test_a_run_past_its_cycle_budget_is_a_timeout():
    from vdla.compiler.targets.vdla.tuning import cycle_budget

    task = task_from_workload(TINY, CFG)
    schedule = task.default_schedule()
    with vdla.runtime.open(CFG, backend="verilator") as dev:
        ok = task.measure(schedule, dev)
        late = dataclasses.replace(task, max_cycles=ok.cycles // 2).measure(schedule, dev)
        again = task.measure(schedule, dev)     # the device is still usable
    assert ok.ok and ok.cycles < cycle_budget(task, schedule) // 10
    assert late.status == "timeout" and late.cycles is None
    assert "did not finish within" in late.error
    assert again.cycles == ok.cycles


def test_a_crashing_measurement_does_not_stop_the_search(tmp_path):
    from tuner_faults import faulty_measure

    task = task_from_workload(TINY, CFG)
    space = task.space()
    with Records(tmp_path / "t.db") as db, \
            LocalRunner("verilator", jobs=2, timeout=8, measure=faulty_measure) as runner:
        result = tune_task(task, runner, trials=len(space), records=db, tuner="grid",
                           measure_default=False, batch=8)
        rows = db.query()
    by_status = {}
    for s, r in result.history:
        by_status.setdefault(r.status, []).append(s)
    assert result.trials == len(space) == len(rows)
    assert {(s.tile_h, s.tile_w) for s in by_status["crash"]} == {(1, 1)}
    assert {(s.tile_h, s.tile_w) for s in by_status["error"]} == {(2, 2)}
    assert [(s.tile_h, s.tile_w, s.h_nthread) for s in by_status["timeout"]] == [(1, 2, 1)]
    assert "injected failure" in next(r.error for r in rows if r.status == "error")
    assert "died" in next(r.error for r in rows if r.status == "crash")
    # Every other schedule was measured, after the crashes and the hang.
    assert len(by_status[OK]) == len(space) - result.failures > 20
    assert result.best_cycles == min(r.cycles for r in rows if r.ok)


class _Counting:
    """A runner that remembers what it was asked to measure."""

    def __init__(self, runner):
        self.runner, self.backend, self.asked = runner, runner.backend, []

    def measure(self, inputs):
        self.asked += [i.schedule for i in inputs]
        return self.runner.measure(inputs)


def test_a_resumed_run_does_not_measure_again(tmp_path, verilator_runner):
    task = task_from_workload(SMALL, CFG)
    path = tmp_path / "resume.db"
    first = _Counting(verilator_runner)
    with Records(path) as db:
        one = tune_task(task, first, trials=10, records=db, batch=4, seed=3)
    assert one.trials == len(first.asked) == 10 and one.resumed == 0
    second = _Counting(verilator_runner)
    with Records(path) as db:
        two = tune_task(task, second, trials=24, records=db, batch=4, seed=3)
        assert len(db) == 24
    assert two.resumed == 10 and len(second.asked) == 14
    assert not set(second.asked) & set(first.asked)
    assert two.best_cycles <= one.best_cycles
    # Nothing left to do: a third run measures nothing.
    third = _Counting(verilator_runner)
    with Records(path) as db:
        assert tune_task(task, third, trials=24, records=db).best == two.best
    assert third.asked == []


def test_parallel_and_serial_runs_find_the_same_best(verilator_runner):
    task = task_from_workload(SMALL, CFG)
    with LocalRunner("verilator", jobs=1) as serial:
        one = tune_task(task, serial, trials=20, batch=5, seed=11)
    two = tune_task(task, verilator_runner, trials=20, batch=5, seed=11)
    assert [s for s, _ in one.history] == [s for s, _ in two.history]
    assert [r.cycles for _, r in one.history] == [r.cycles for _, r in two.history]
    assert (one.best, one.best_cycles) == (two.best, two.best_cycles)
    assert one.default == task.default_schedule() == one.history[0][0]


# --- search --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def measured_space(tmp_path_factory, verilator_runner):
    """A whole space measured once on Verilator, for replayed searches."""
    task = task_from_workload(SMALL, CFG)
    path = tmp_path_factory.mktemp("space") / "space.db"
    with Records(path) as db:
        full = tune_task(task, verilator_runner, trials=len(task.space()), records=db,
                         tuner="grid", measure_default=False, batch=32)
    assert full.failures == 0
    return task, path, full.best_cycles


def test_the_model_tuner_beats_random_search(measured_space):
    task, path, best = measured_space
    space = task.space()
    budget = len(space) // 10

    def first_within(result):
        return next((i + 1 for i, (_, r) in enumerate(result.history)
                     if r.cycles <= 1.05 * best), None)

    with Records(path) as db:
        replay = ReplayRunner(db, "verilator")
        model = [first_within(tune_task(task, replay, trials=budget, seed=seed,
                                        measure_default=False)) for seed in range(3)]
        rand = [first_within(tune_task(task, replay, trials=len(space), tuner="random",
                                       seed=seed, measure_default=False, batch=64))
                for seed in range(10)]
    assert all(m is not None for m in model), model
    assert sum(model) / len(model) < sum(rand) / len(rand)


def test_searches_are_deterministic_for_a_seed(measured_space):
    task, path, _ = measured_space
    with Records(path) as db:
        replay = ReplayRunner(db, "verilator")
        for tuner in ("model", "random", "grid"):
            runs = [[s for s, _ in tune_task(task, replay, trials=24, tuner=tuner, seed=5,
                                             batch=6).history] for _ in range(2)]
            assert runs[0] == runs[1] and len(set(runs[0])) == 24
        other = tune_task(task, replay, trials=24, tuner="random", seed=6, batch=6)
    assert [s for s, _ in other.history] != runs[0]


def test_the_model_tuner_learns_without_the_timing_model(measured_space):
    task, path, best = measured_space
    with Records(path) as db:
        result = tune_task(task, ReplayRunner(db, "verilator"), trials=40, seed=0, measure_default=False,
                           tuner_options={"use_estimate": False})
    tuner = ModelTuner(task, task.space(), use_estimate=False)
    assert tuner.features.shape[1] < ModelTuner(task, task.space()).features.shape[1]
    # Its later rounds (after the first, random, batch) beat its first round.
    cycles = [r.cycles for _, r in result.history]
    assert min(cycles[8:]) < min(cycles[:8])


def test_the_model_tuner_keeps_a_spaces_features(monkeypatch, tmp_path):
    """The from-scratch tuner runs the timing model on every schedule once; a later
    tuner of the same task reads the rows back (the on-disk cache), equal."""
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path))
    task = task_from_workload("14,14,16,32,3,1,1")
    first = ModelTuner(task, task.space())

    def refuse(self, *args):
        raise AssertionError("computed again")

    monkeypatch.setattr(type(task), "features", refuse)
    again = ModelTuner(task, task.space())
    assert np.array_equal(again.features, first.features)
    assert np.array_equal(again.estimates, first.estimates)
    with pytest.raises(AssertionError, match="computed again"):    # another key: computed
        ModelTuner(task, task.space(), use_estimate=False)


def test_bad_arguments_are_refused():
    task = task_from_workload(TINY, CFG)
    with pytest.raises(ValueError,
                       match="unknown tuner .best.; available: pretrained, model, random"):
        make_tuner("best", task, task.space())
    with pytest.raises(ValueError, match="trials must be a positive integer, not 0"):
        tune_task(task, None, trials=0)
    with LocalRunner("fpga") as runner, pytest.raises(
            ValueError, match="unknown measurement backend 'fpga' for task .* of target "
                              "'vdla'; available: verilator, functional"):
        runner.measure([MeasureInput(task, task.default_schedule())])
    with pytest.raises(ValueError, match="jobs must be a positive integer"):
        LocalRunner("verilator", jobs=0)
    with pytest.raises(ValueError, match="neither a ResNet-18 workload name"):
        task_from_workload("C99", CFG)


# --- the command line ----------------------------------------------------------------------

def test_vdla_tune_then_run_with_the_records(tmp_path, capsys):
    db, report = tmp_path / "digits.db", tmp_path / "tune.json"
    assert main(["tune", "digits_cnn", "--trials", "40", "--split", "equal", "--records",
                 str(db), "--jobs", "2", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "tuned digits_cnn: 4 workload(s)" in out and "speedup" in out
    tuned = json.loads(report.read_text())
    assert len(tuned["workloads"]) == 4
    for w in tuned["workloads"]:
        assert w["trials"] == 10 and w["failures"] == 0
        assert w["best"]["cycles"] <= w["default"]["cycles"]

    run_report = tmp_path / "run.json"
    assert main(["run", "digits_cnn", "--records", str(db), "--json", str(run_report)]) == 0
    out = capsys.readouterr().out
    assert "schedules: 4 of 4 tunable ops from the records" in out
    ran = json.loads(run_report.read_text())
    assert ran["bit_exact"] is True and len(ran["tuned_ops"]) == 4
    from vdla.compiler import pipeline
    q = pipeline.quantize_for(pipeline.load_model("digits_cnn"), TARGET)
    with Records(db) as records:
        best = best_schedules(records, q, TARGET)
    ops = {op["name"]: op for op in ran["ops"]}
    for name, (schedule, cycles) in best.items():
        assert ops[name]["schedule"] == dataclasses.asdict(schedule)
        assert ops[name]["cycles"] == cycles         # the run measures what was recorded
    # Where tuning paid off, the run used the faster non-default schedule (the default
    # chooser may already pick the best of 10 trials on every one of these small layers).
    for w in tuned["workloads"]:
        if w["best"]["cycles"] < w["default"]["cycles"]:
            assert w["best"]["schedule"] != w["default"]["schedule"]

    # A second tune resumes: no new measurements.
    assert main(["tune", "digits_cnn", "--trials", "40", "--records", str(db)]) == 0
    assert "0 measurements" in capsys.readouterr().out


def test_vdla_tune_a_layer_with_the_fast_mode(tmp_path, capsys):
    assert main(["tune", "--layer", TINY, "--layer", "C11", "--trials", "9", "--split",
                 "equal", "--measure", "functional", "--records", str(tmp_path / "f.db")]) == 0
    out = capsys.readouterr().out
    assert "3 workload(s)" in out and "functional measurements" in out
    assert "1x512x7x7 -> 512, k3x3 s1 +residual" in out and "C11+residual" in out
    with Records(tmp_path / "f.db") as db:
        assert {r.backend for r in db.query()} == {"functional"} and len(db) == 9


def test_a_tuned_named_layer_serves_the_model(tmp_path, capsys):
    """`vdla tune --layer C8` then `vdla run resnet18 --records`: the run compiles C8's
    three nodes (two with a ReLU, one with a residual add) with the records' schedules.
    Verilator measurements, because `vdla run` takes the cycle-accurate records; two
    trials split equally (the default schedule each) keep it short."""
    db, report = tmp_path / "c8.db", tmp_path / "run.json"
    assert main(["tune", "--layer", "C8", "--trials", "2", "--split", "equal", "--records",
                 str(db)]) == 0
    assert "2 workload(s)" in capsys.readouterr().out
    assert main(["run", "resnet18", "--sim", "functional", "--records", str(db),
                 "--json", str(report)]) == 0
    assert "schedules: 3 of 21 tunable ops from the records" in capsys.readouterr().out
    ran = json.loads(report.read_text())
    assert ran["bit_exact"] is True
    assert sorted(ran["tuned_ops"]) == ["layer3.0.conv2", "layer3.1.conv1", "layer3.1.conv2"]


@pytest.mark.parametrize("args, message", [
    (["tune", "--trials", "3", "--records", "x.db"], "needs a MODEL or --layer SPEC"),
    (["tune", "digits_cnn", "--layer", "C5", "--trials", "3", "--records", "x.db"],
     "needs a MODEL or --layer SPEC"),
    (["tune", "--layer", "C5", "--trials", "0", "--records", "x.db"],
     "--trials must be a positive integer, not 0"),
    (["tune", "--layer", "C5", "--trials", "2", "--jobs", "0", "--records", "x.db"],
     "--jobs must be a positive integer"),
    (["tune", "--layer", "C5", "--trials", "2", "--batch", "0", "--records", "x.db"],
     "--batch must be a positive integer, not 0"),
    (["tune", "--layer", "C5", "--trials", "2", "--timeout", "0", "--records", "x.db"],
     "--timeout must be a positive number of seconds"),
    (["tune", "--layer", "C5", "--trials", "2", "--seed", "-1", "--records", "x.db"],
     "--seed must be a non-negative integer"),
    (["tune", "digits_cnn", "--trials", "2", "--calibration", "0", "--records", "x.db"],
     "--calibration must be a positive integer"),
    (["tune", "--layer", "1,2,3", "--trials", "2", "--records", "x.db"],
     "neither a ResNet-18 workload name"),
    (["tune", "nosuchmodel", "--trials", "2", "--records", "x.db"], "unknown model"),
    (["run", "digits_cnn", "--records", "missing.db"],
     "records file 'missing.db' does not exist"),
    (["tune", "--layer", "C5", "--trials", "2", "--measure", "wall", "--records", "x.db"],
     "--measure 'wall' is not one of target 'vdla''s measurement backends: verilator, "
     "functional"),
    (["tune", "--layer", "C5", "--trials", "2", "--target", "host", "--records", "x.db"],
     "target 'host' has no tunable ops"),
    (["tune", "--layer", "C5", "--trials", "2", "--target", "npu", "--records", "x.db"],
     "unknown target 'npu'"),
])
def test_cli_errors(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.db").exists() and not (tmp_path / "missing.db").exists()


def test_cli_records_that_is_a_folder_is_refused(tmp_path, monkeypatch, capsys):
    """--records names a file tune writes: `output_file` refuses a folder before any
    work (a bad value, exit 1, like every output-file option)."""
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "--layer", "C5", "--trials", "2", "--records", "."]) == 1
    assert capsys.readouterr().err.startswith("vdla: error: --records: '.' is a folder")


def test_the_executor_runner_measures_as_the_local_runner(tmp_path):
    """`ExecutorRunner` (the executors of `vdla.execute`: what `vdla tune --ray` uses)
    finds what `LocalRunner` finds, schedule for schedule; a worker that dies is a crash
    result, a measurement that raises an error result, and the others go on."""
    from tuner_faults import dying_measure

    task = task_from_workload(TINY, CFG)
    space = task.space()
    with LocalRunner("functional", jobs=1, measure=dying_measure) as local:
        want = tune_task(task, local, trials=len(space), tuner="grid",
                         measure_default=False, batch=8)
    with ExecutorRunner("functional", jobs=2, measure=dying_measure) as runner:
        assert runner.describe() == "2 local processes"
        got = tune_task(task, runner, trials=len(space), tuner="grid",
                        measure_default=False, batch=8)
        again = runner.measure([MeasureInput(task, space[0])])   # still usable
    assert [(s, r.status, r.cycles) for s, r in got.history] == \
        [(s, r.status, r.cycles) for s, r in want.history]
    statuses = {r.status for _, r in got.history}
    assert statuses == {OK, "crash", "error"}
    assert "died" in next(r.error for _, r in got.history if r.status == "crash")
    assert (got.best, got.best_cycles) == (want.best, want.best_cycles)
    assert len(again) == 1
    with pytest.raises(ValueError, match="jobs must be a positive integer"):
        ExecutorRunner("functional", jobs=0)


def test_vdla_tune_on_ray_gives_the_local_records(tmp_path, capsys):
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'vdla[ray]'")
    rows = {}
    for where in ([], ["--ray", "local"]):
        db = tmp_path / f"{len(rows)}.db"
        assert main(["tune", "--layer", TINY, "--trials", "6", "--measure", "functional",
                     "--jobs", "2", "--records", str(db), *where]) == 0
        out = capsys.readouterr().out
        assert ("Ray actors on a local Ray instance" in out) == bool(where)
        with Records(db) as records:
            rows[len(rows)] = sorted((json.dumps(r.schedule, sort_keys=True), r.cycles)
                                     for r in records.query())
    assert rows[0] == rows[1] and len(rows[0]) == 6


def test_vdla_tune_ray_without_a_cluster_is_a_clear_error(tmp_path, monkeypatch, capsys):
    """--ray auto with no cluster running: one line naming the option, before any
    records file is written."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'vdla[ray]'")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["tune", "--layer", TINY, "--trials", "2", "--measure", "functional",
                 "--records", "x.db", "--ray", "auto"]) == 1
    assert "--ray auto: no Ray cluster found" in capsys.readouterr().err
    assert not (tmp_path / "x.db").exists()
