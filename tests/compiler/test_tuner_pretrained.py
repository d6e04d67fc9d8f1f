"""Tuning that starts from what was learned elsewhere: the shipped pretrained model, the
pretrained tuner that corrects it online, the pretrained chooser (zero-shot schedules;
``--chooser learned`` is its old name), and
the task scheduler that spends one budget on a model's tasks. Measured with the
functional backend, or replayed from records made here."""

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

import vdla
from platform_testing import FOREIGN_CPU, pretend_cpu
from script_loading import load_script
from vdla.cli import main
from vdla.compiler import pipeline, targets
from vdla.compiler.tuner.workload_tasks import tasks_from_workload
from vdla.compiler.targets.vdla import VdlaTarget
from vdla.compiler.targets.vdla.features import CONV2D
from vdla.compiler.targets.vdla.tuning import PRETRAINED
from vdla.compiler.tuner import (LocalRunner, ModelTuner, PretrainedTuner, Records,
                                 ReplayRunner, make_tuner, scheduler, tune_task, tune_tasks)
from vdla.compiler.tuner.candidates import remembered_space, space_features
from vdla.compiler.tuner.correction import SharedCorrection
from vdla.compiler.tuner.cost_model import CostModel, file_name, shipped
from vdla.compiler.tuner.pretrained_chooser import pretrained_choice, pretrained_schedules
from vdla.compiler.tuner.rows import Rows
from vdla.compiler.tuner.tune import TaskTuning

CFG = vdla.HardwareConfig()
SMALL = "14,14,16,32,3,1,1"
TINY = "7,7,16,16,1,0,1"


def task_of(spec, config=CFG, backend="functional"):
    return tasks_from_workload(spec, VdlaTarget(config, backend=backend))[0]


def vectors(task):
    space = task.space()
    return space, np.array([CONV2D.vector(task.transfer_features(s)) for s in space])


# --- the shipped model ---------------------------------------------------------------------

def test_the_accelerator_ships_a_model_of_its_feature_set():
    task = task_of(SMALL)
    model = task.pretrained()
    assert isinstance(model, CostModel) and model is task_of(TINY).pretrained()  # loaded once
    assert (PRETRAINED / file_name(CONV2D)).is_file()
    assert model.meta["features"] == CONV2D.name and model.meta["version"] == CONV2D.version
    assert model.meta["residual"] and model.meta["rows"] > 1000
    # Trained without the held-out configs, which it names.
    assert not set(model.meta["held_out"]["platforms"]) & set(model.meta["platforms"])
    _, x = vectors(task)
    assert np.isfinite(model.predict(x)).all()
    assert len(model.digest) == 16 and model.digest == CostModel.load(
        PRETRAINED / file_name(CONV2D), CONV2D).digest


def test_no_model_in_a_folder_is_none(tmp_path):
    assert shipped(tmp_path, CONV2D) is None


def test_the_cpu_ships_models_of_its_convolutions_dense_layers_and_products():
    """The CPU's convolutions have a model (trained on int8 and float32, three instruction
    sets, without ResNet-50 and MobileNet-v1 float32), and so do its dense layers and its
    batched products (trained on transformers' layers and random GEMMs, without
    BERT-base); each predicts its task's space."""
    cpu = targets.get("cpu")
    tasks = cpu.tasks(pipeline.graph_for(pipeline.load_model("small_cnn"), cpu))
    conv = next(t for t in tasks if t.conv)
    dense = next(t for t in tasks if not t.conv)
    [product] = tasks_from_workload("matmul:12,64,40,4", cpu)
    model = conv.pretrained()
    assert isinstance(model, CostModel) and model.meta["features"] == "cpu.conv2d"
    assert {"resnet50 (int8)", "mobilenet_v1 (float32)"} <= set(model.meta["held_out"]["models"])
    for task, name in ((conv, "cpu.conv2d"), (dense, "cpu.dense"), (product, "cpu.matmul")):
        model = task.pretrained()
        assert isinstance(model, CostModel) and model.meta["features"] == name
        space = task.space()
        x = np.array([task.feature_set.vector(task.transfer_features(s)) for s in space[:50]])
        assert np.isfinite(model.predict(x)).all()
        assert isinstance(make_tuner("pretrained", task, space), PretrainedTuner)
    for task in (dense, product):
        assert "bert_base (int8)" in task.pretrained().meta["held_out"]["models"]


def test_vdla_tune_says_which_model_it_starts_from_or_that_it_has_none(tmp_path, capsys,
                                                                       monkeypatch):
    """A dense workload on the CPU: the note before the run names the dense layers'
    model; with no model, the note and the summary name the model tuner, not the
    pretrained one asked for by default."""
    from vdla.compiler.targets.cpu.tuning import CpuTask

    # One thread: a measuring worker forked from a test process whose OpenMP team runs
    # (other CPU tests start one) can hang starting a team of its own.
    tune = ["tune", "--layer", "dense:64,16", "--target", "cpu", "--trials", "2",
            "--threads", "1", "--records", str(tmp_path / "r.db")]
    assert main(tune) == 0
    assert "starting from the pretrained cost model cpu.dense v3" in capsys.readouterr().err
    monkeypatch.setattr(CpuTask, "pretrained", lambda self: None)
    assert main(tune[:-1] + [str(tmp_path / "other.db")]) == 0
    captured = capsys.readouterr()
    assert "no pretrained cost model for target cpu's tasks: tuning from scratch" in \
        captured.err
    assert "model (no pretrained model) tuner" in captured.out
    with pytest.raises(ValueError, match="no pretrained cost model"):
        task = tasks_from_workload("dense:64,16", targets.get("cpu"))[0]
        PretrainedTuner(task, task.space())
    assert isinstance(make_tuner("pretrained", task, task.space()), ModelTuner)


# --- the pretrained tuner --------------------------------------------------------------------

def test_the_pretrained_tuner_proposes_the_models_best_first():
    task = task_of(SMALL)
    space, x = vectors(task)
    predicted = task.pretrained().predict(x)
    tuner = make_tuner("pretrained", task, space)
    assert isinstance(tuner, PretrainedTuner)
    first = tuner.propose(4)
    assert first == [space[i] for i in np.argsort(predicted, kind="stable")[:4]]
    assert tuner.expected_best() == pytest.approx(2.0 ** predicted.min())



def test_the_pretrained_tuner_measures_one_of_each_twin():
    """Schedules whose features are equal (tile sizes that clamp to one tiling: a 1x16x32
    core's 4x4x64 layer has 117 schedules, 78 distinct) cost the same: one of each
    group is proposed before any twin."""
    config = dataclasses.replace(CFG, block_out=32, inp_buff_size=1 << 16,
                                 acc_buff_size=1 << 16)
    task = task_of("4,4,64,64,3,1,1", config)
    space, x = vectors(task)
    distinct = len(np.unique(x, axis=0))
    assert distinct < len(space)
    tuner = PretrainedTuner(task, space)
    index = {s: i for i, s in enumerate(space)}
    many = tuner.propose(len(space))
    assert len({x[index[s]].tobytes() for s in many[:distinct]}) == distinct
    assert sorted(map(index.get, many)) == list(range(len(space)))   # twins last, all there


def test_the_pretrained_tuner_learns_what_the_model_gets_wrong():
    """Measurements that contradict the model bend its ranking: schedules told to be
    twice as slow as predicted stop being proposed."""
    task = task_of(SMALL)
    space, x = vectors(task)
    tuner = PretrainedTuner(task, space, learn_after=3)
    first = tuner.propose(6)
    index = {s: i for i, s in enumerate(space)}
    prior = tuner.found.prior            # a whole space: its rows in the space's order
    slow = [int(2.0 ** (prior[index[s]] + 1)) for s in first]
    tuner.update(first, slow)
    again = tuner.propose(6)
    assert not set(again) & set(first)
    # The correction was fitted to the residuals (+1 in log2) of what was measured.
    measured = [index[s] for s in first]
    assert np.allclose(tuner.predicted[measured] - prior[measured], 1.0, atol=0.5)
    # A failed measurement counts as slower than the slowest.
    tuner.update(again[:1], [None])
    assert tuner.propose(1) and again[0] not in tuner.propose(len(space))


def test_the_pretrained_tuner_explores_where_the_measurements_contradict_it():
    """Measurements that order the model's picks as it does keep its ranking trusted
    (nothing random); measured in the opposite order, a share of each later batch is
    drawn at random, up to a half, and a small batch draws one with that chance."""
    task = task_of(SMALL)
    space, _ = vectors(task)
    index = {s: i for i, s in enumerate(space)}
    agreed = PretrainedTuner(task, space, learn_after=99)
    first = agreed.propose(4)
    prior = agreed.found.prior
    agreed.update(first, [int(2.0 ** (prior[index[s]] + 10)) for s in first])
    assert agreed.explore_share() == 0.0
    ranked = agreed.propose(4)
    contradicted = PretrainedTuner(task, space, learn_after=99)
    assert contradicted.propose(4) == first
    contradicted.update(first, [1000 * (10 - k) for k in range(4)])    # reversed
    assert contradicted.explore_share() == PretrainedTuner.MAX_EXPLORE
    explored = contradicted.propose(4)
    assert explored[:2] == ranked[:2] and set(explored[2:]) != set(ranked[2:])
    assert PretrainedTuner(task, space, explore=0.25).explore_share() == 0.25


def test_tuners_that_share_a_correction_learn_from_each_others_measurements():
    """What one task measured bends another's ranking through the shared correction:
    told that the model's picks on one task are eight times slower than predicted, a
    second task's tuner, which measured nothing, predicts its own similar schedules
    slower too; one that shares nothing keeps the pretrained ranking."""
    task, other = task_of(SMALL), task_of("14,14,16,16,3,1,1")
    space, _ = vectors(task)
    other_space, _ = vectors(other)
    shared = SharedCorrection()
    teacher = PretrainedTuner(task, space, shared=shared)
    learner = PretrainedTuner(other, other_space, shared=shared)
    alone = PretrainedTuner(other, other_space)
    assert shared.correction(CONV2D) is None            # nothing measured yet
    first = teacher.propose(6)
    index = {s: i for i, s in enumerate(space)}
    prior = teacher.found.prior
    teacher.update(first, [int(2.0 ** (prior[index[s]] + 3)) for s in first])
    teacher.propose(1)                                 # it learns, and teaches
    assert shared.rows(CONV2D) == 6 and shared.version(CONV2D) == 1
    fix = shared.correction(CONV2D)
    assert fix is not None and shared.correction(CONV2D) is fix   # fitted once a version
    learner.expected_best()
    assert learner.common is fix and learner.fix is None   # nothing of its own measured
    shift = learner.predicted - learner.found.prior
    assert shift.max() > 1.0 and np.allclose(alone.predicted, alone.found.prior)
    # A tuner that measures again replaces what it taught, not adds to it.
    more = teacher.propose(2)
    teacher.update(more, [int(2.0 ** (prior[index[s]] + 3)) for s in more])
    teacher.propose(1)
    assert shared.rows(CONV2D) == 8 and shared.version(CONV2D) == 2


def test_a_shared_correction_refuses_bad_input():
    with pytest.raises(ValueError, match="min_rows must be a positive integer, not 0"):
        SharedCorrection(min_rows=0)
    shared = SharedCorrection()
    token = shared.join(CONV2D)
    with pytest.raises(ValueError, match=r"3 residuals with features of shape \(2, 1\)"):
        shared.teach(CONV2D, token, np.zeros((2, 1)), np.zeros(3))


def test_the_scheduler_shares_a_correction_among_pretrained_tuners_only(replayed,
                                                                        monkeypatch):
    """One run's pretrained tuners share one correction, which their measurements teach;
    ``share=False`` and the other tuners make none."""
    tasks, replay = replayed
    made = []

    class Recorded(SharedCorrection):
        def __init__(self, **options):
            super().__init__(**options)
            made.append(self)

    monkeypatch.setattr(scheduler, "SharedCorrection", Recorded)
    tuning = tune_tasks(tasks, replay, trials=9, tuner="pretrained", batch=2)
    [shared] = made
    assert tuning.trials == 9 and 3 <= shared.rows(CONV2D) <= 9 and shared.version(CONV2D)
    assert shared.correction(CONV2D) is not None
    tune_tasks(tasks, replay, trials=9, tuner="pretrained", batch=2, share=False)
    tune_tasks(tasks, replay, trials=4, tuner="random", batch=2)
    assert len(made) == 1


def test_tune_task_with_the_pretrained_tuner_measures_its_picks(tmp_path):
    task = task_of(TINY)
    with Records(tmp_path / "r.db") as db, LocalRunner("functional", jobs=1) as runner:
        result = tune_task(task, runner, trials=5, records=db, tuner="pretrained", batch=2)
    assert result.trials == 5 and result.failures == 0
    assert result.history[0][0] == task.default_schedule()
    assert result.best_cycles <= result.default_cycles


# --- the pretrained chooser ------------------------------------------------------------------

def without_veto(monkeypatch, task) -> CostModel:
    """`task`'s model with a feature set whose baseline vetoes nothing, as its model."""
    model = dataclasses.replace(task.pretrained(), feature_set=dataclasses.replace(
        CONV2D, baseline_vetoes=False))
    monkeypatch.setattr(type(task), "pretrained", lambda self: model)
    return model


def test_the_pretrained_chooser_picks_the_models_best_and_remembers_it(monkeypatch, tmp_path):
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path / "cache"))
    task = task_of(SMALL)
    # The margin alone: the timing model's veto is the next test's.
    model = without_veto(monkeypatch, task)
    space, x = vectors(task)
    predicted = model.predict(x)
    best, default = int(np.argmin(predicted)), space.index(task.default_schedule())
    gain = 2.0 ** (predicted[default] - predicted[best]) - 1.0
    assert gain > 0.001        # the model prefers another schedule, by this much
    # Past the margin, its pick; within it, the default.
    want = space[best]
    assert pretrained_choice(task, margin=gain / 2) == want
    assert pretrained_choice(task, margin=gain * 2) == space[default]

    def refuse(self, x):
        raise AssertionError("predicted again: the choice was not remembered")

    monkeypatch.setattr(CostModel, "predict", refuse)
    assert pretrained_choice(task, margin=gain / 2) == want
    # A task with no model keeps its default: no choice.
    from vdla.compiler.targets.cpu.tuning import CpuTask

    monkeypatch.setattr(CpuTask, "pretrained", lambda self: None)
    cpu = targets.get("cpu")
    dense = next(t for t in cpu.tasks(pipeline.graph_for(pipeline.load_model("small_cnn"), cpu))
                 if not t.conv)
    assert pretrained_choice(dense) is None


def test_compile_with_the_pretrained_chooser_lets_the_records_win(tmp_path):
    target = VdlaTarget(CFG, backend="functional")
    graph = pipeline.graph_for(pipeline.load_model("small_cnn"), target)
    tasks = target.tasks(graph)
    picked = pretrained_schedules(graph, target)
    assert sorted(picked) == sorted(n for t in tasks for n in t.nodes)
    # One task tuned into the records: its best wins over the pretrained pick, whichever
    # name the chooser is given (``learned``: its old name).
    with Records(tmp_path / "r.db") as db, LocalRunner("functional", jobs=1) as runner:
        tuned = tune_task(tasks[0], runner, trials=3, records=db, tuner="random", seed=3)
        for chooser in ("pretrained", "learned"):
            compiled, recorded = pipeline.compile_for(graph, target, records=db,
                                                      chooser=chooser, backend="functional")
            assert recorded == dict.fromkeys(tasks[0].nodes, tuned.best)
    with pytest.raises(ValueError, match="chooser must be one of default, pretrained, learned"):
        pipeline.compile_for(graph, target, chooser="best")


def test_run_and_compare_take_the_pretrained_chooser_by_either_name(tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "small_cnn", "--sim", "functional", "--chooser", "learned",
                 "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "from the pretrained chooser" in out and "bit-exact vs the quantized reference: yes" in out
    assert main(["compare", "small_cnn", "--targets", "vdla,host", "--chooser", "learned",
                 "--json", "c.json"]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["chooser"] == "pretrained"


# --- the task scheduler ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """Three tasks whose whole spaces are measured once (functional), then replayed."""
    folder = tmp_path_factory.mktemp("sched")
    target = VdlaTarget(CFG, backend="functional")
    tasks = [tasks_from_workload(spec, target)[0] for spec in (TINY, SMALL, "7,7,32,16,3,1,1")]
    db = Records(folder / "all.db")
    with LocalRunner("functional", jobs=2) as runner:
        for task in tasks:
            tune_task(task, runner, trials=len(task.space()), records=db, tuner="grid",
                      measure_default=False, batch=64)
    yield tasks, ReplayRunner(db, "functional")
    db.close()


def test_an_equal_split_gives_each_task_its_share(replayed):
    tasks, replay = replayed
    tuning = tune_tasks(tasks, replay, trials=10, tuner="random", split="equal", batch=2)
    assert [r.trials for r in tuning.results] == [4, 3, 3]
    assert tuning.trials == 10 and len(tuning.curve) == 10 and tuning.resumed == 0
    assert all(r.history[0][0] == r.task.default_schedule() for r in tuning.results)


def test_the_gradient_split_warms_up_every_task_then_follows_the_gain(replayed):
    tasks, replay = replayed
    tuning = tune_tasks(tasks, replay, trials=14, tuner="pretrained", batch=2)
    assert tuning.trials == 14 and len(tuning.curve) == 14
    # Warm-up: each task's default and its tuner's first pick, side by side, the task
    # with the largest predicted gain first.
    warm = [i for i, _ in tuning.trace[:6]]
    assert sorted(warm) == [0, 0, 1, 1, 2, 2] and warm[0::2] == warm[1::2]
    gains = [tuning.results[i].task.pretrained() is not None for i in warm[0::2]]
    assert all(gains)
    first = [r.history[0][0] for r in tuning.results]
    assert first == [r.task.default_schedule() for r in tuning.results]
    assert all(r.trials >= 2 and r.default_cycles is not None for r in tuning.results)
    assert tuning.cost("best") <= tuning.cost("default")
    curve = [c for c in tuning.curve if c is not None]
    assert curve == sorted(curve, reverse=True) and curve[-1] == tuning.cost("best")
    # The same, counting a task not measured yet at its default: from the defaults' cost.
    assert len(tuning.trace) == 14
    filled = tuning.default_curve()
    assert filled[0] == tuning.cost("default") and filled[-1] == tuning.cost("best")
    assert filled == sorted(filled, reverse=True)
    # Deterministic for a seed.
    again = tune_tasks(tasks, replay, trials=14, tuner="pretrained", batch=2)
    assert again.order == tuning.order and again.curve == tuning.curve


def test_the_scheduler_spends_more_where_more_is_to_gain(replayed):
    """A task whose default is far from its best gets the batches after the warm-up."""
    tasks, replay = replayed
    tuning = tune_tasks(tasks, replay, trials=len(tasks) * 2 + 8, tuner="model", batch=4)
    share = [r.trials for r in tuning.results]
    heavy = max(range(len(tasks)), key=lambda i: tuning.results[i].default_cycles
                * len(tasks[i].nodes))
    assert share[heavy] == max(share)


def test_the_scheduler_weighs_a_task_by_how_wrong_its_model_was(replayed):
    """Where the pretrained model was off on a task's measurements, the scheduler
    expects more to gain there (`Tuner.model_error`): the same measurements with a model
    off by half give the task a larger gain than with the shipped model."""
    tasks, replay = replayed
    task = tasks[1]

    class Off:
        """The shipped model, predicting every schedule 1.5 times too slow."""

        def __init__(self, model):
            self.model, self.digest = model, model.digest + "-off"

        def predict(self, x):
            return self.model.predict(x) + np.log2(1.5)

    gains = {}
    for name, model in (("shipped", task.pretrained()), ("off", Off(task.pretrained()))):
        state = TaskTuning(task, replay, trials=None, tuner="pretrained",
                           tuner_options={"model": model})
        state.step(4)
        gains[name] = (state.search.model_error(), scheduler._gain(state))
    assert gains["shipped"][0] < 0.1 and 0.25 < gains["off"][0] < 0.4     # |1/1.5 - 1|
    assert gains["off"][1] > gains["shipped"][1] > 0
    assert PretrainedTuner(task, task.space()).model_error() is None   # nothing measured


def test_the_scheduler_resumes_within_the_same_budget(replayed, tmp_path):
    tasks, replay = replayed
    with Records(tmp_path / "r.db") as db:
        first = tune_tasks(tasks, replay, trials=8, records=db, batch=2, tuner="random")
        again = tune_tasks(tasks, replay, trials=8, records=db, batch=2, tuner="random")
        more = tune_tasks(tasks, replay, trials=11, records=db, batch=2, tuner="random")
    assert first.trials == 8 and again.resumed == 8 and again.curve == ()
    assert more.resumed == 8 and len(more.curve) == 3


def test_the_scheduler_refuses_bad_arguments(replayed):
    tasks, replay = replayed
    with pytest.raises(ValueError, match="split must be one of gradient, equal, not 'fair'"):
        tune_tasks(tasks, replay, trials=4, split="fair")
    with pytest.raises(ValueError, match="trials must be a positive integer, not 0"):
        tune_tasks(tasks, replay, trials=0)
    with pytest.raises(ValueError, match="no task to tune"):
        tune_tasks([], replay, trials=4)


def test_vdla_tune_spends_the_budget_on_the_model_and_plots_it(tmp_path, capsys):
    db, report, plot = tmp_path / "t.db", tmp_path / "t.json", tmp_path / "t.png"
    assert main(["tune", "small_cnn", "--trials", "9", "--batch", "2", "--measure",
                 "functional", "--records", str(db), "--json", str(report), "--plot",
                 str(plot)]) == 0
    captured = capsys.readouterr()
    assert "starting from the pretrained cost model vdla.conv2d v1" in captured.err
    assert "gradient split" in captured.out and "tuned ops (each workload" in captured.out
    doc = json.loads(report.read_text())
    assert sum(w["trials"] for w in doc["workloads"]) == 9 and doc["split"] == "gradient"
    assert len(doc["curve"]["cost"]) == 9 and doc["cost"]["best"] <= doc["cost"]["default"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_spaces_and_features_are_computed_once_per_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path / "cache"))
    task = task_of(TINY)
    space, x = vectors(task)
    assert remembered_space(task) == space
    assert np.array_equal(space_features(task), x)

    def refuse(*args, **kwargs):
        raise AssertionError("computed again: not remembered")

    monkeypatch.setattr(type(task), "space", refuse)
    monkeypatch.setattr(type(task), "transfer_features", refuse)
    assert remembered_space(task) == space
    assert np.array_equal(space_features(task), x)
    # Another config is another entry.
    other = task_of(TINY, dataclasses.replace(CFG, acc_buff_size=CFG.acc_buff_size // 2))
    with pytest.raises(AssertionError, match="not remembered"):
        remembered_space(other)


# --- retraining (scripts/train_cost_model.py) ---------------------------------------------

@pytest.fixture
def foreign_cpu(monkeypatch):
    """Stand in for a machine whose CPU none of the committed sets names: a set trains
    the same model on any machine (`CpuTarget.from_platform` reads the set's platform
    under the CPU its manifest names, not this machine's, which the training then never
    consults: one run under a foreign name covers the machine that measured the sets)."""
    pretend_cpu(monkeypatch, FOREIGN_CPU)


def test_the_training_script_cross_validates_and_refuses_bad_folds(capsys, foreign_cpu):
    root = Path(__file__).resolve().parents[2]
    script = load_script(root / "scripts" / "train_cost_model.py")
    sets = [str(root / "bench" / "datasets" / f"cpu{n}_v3.db.manifest.json")
            for n in ("", "_f32")]
    with pytest.raises(SystemExit, match="2"):
        script.main(["--manifest", *sets, "--cv", "1"])
    assert "--cv must be at least 2 folds, not 1" in capsys.readouterr().err
    assert script.main(["--manifest", *sets, "--cv", "2", "--trees", "20"]) == 0
    out = capsys.readouterr().out
    assert "2-fold cross-validation by task" in out and "avx512vnni" in out and "pairwise" in out


def test_the_training_script_ranks_its_model_on_held_out_sets(capsys, tmp_path, foreign_cpu):
    """``--test``: the written model (to ``--out``, not the shipped folder) ranks sets
    it never saw, beside its baseline feature; a bad manifest is named."""
    sets = Path(__file__).resolve().parents[2] / "bench" / "datasets"
    script = load_script(sets.parents[1] / "scripts" / "train_cost_model.py")
    assert script.main(["--manifest", str(sets / "cpu_f32_v3.db.manifest.json"),
                        "--trees", "20", "--out", str(tmp_path),
                        "--test", str(sets / "cpu_f32_test_v3.db.manifest.json")]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "cpu.conv2d-v4.npz").is_file()
    assert re.search(r"held out \(cpu_f32_test_v3.db.manifest.json\): \d+ schedules of "
                     r"\d+ tasks\n  AMD EPYC, 1 threads, avx512vnni +pairwise 0\.\d+ "
                     r"\(baseline 0\.\d+\), top-1", out), out
    with pytest.raises(SystemExit, match="--test: "):
        script.main(["--manifest", str(sets / "cpu_f32_v3.db.manifest.json"), "--trees", "5",
                     "--out", str(tmp_path), "--test", str(sets / "cpu_avx2_sbs.db.xz")])
    with pytest.raises(SystemExit, match="--classes: the features are .*, not all of "
                                         "blocked, tiled"):
        script.main(["--manifest", str(sets / "cpu_f32_v3.db.manifest.json"), "--trees", "5",
                     "--out", str(tmp_path), "--test",
                     str(sets / "cpu_f32_test_v3.db.manifest.json"),
                     "--classes", "blocked", "tiled"])
    for bad, message in ((["--cv", "2", "--test", "x.json"], "--test ranks the model written"),
                         (["--classes", "blocked"], "--classes counts on the --test sets")):
        with pytest.raises(SystemExit, match="2"):
            script.main(["--manifest", str(sets / "cpu_f32_v3.db.manifest.json"), *bad])
        assert message in capsys.readouterr().err


def test_the_timing_model_vetoes_a_pick_it_has_slower_than_the_default(monkeypatch, tmp_path):
    """The accelerator's timing model overrules its learned correction
    (`FeatureSet.baseline_vetoes`): here the correction has its pick faster than the
    default (by more than the margin asked) and the timing model has it slower, so the
    default stays; a feature set whose baseline vetoes nothing (the CPU's) follows the
    model."""
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path / "cache"))
    task = task_of(SMALL)
    model = task.pretrained()
    space, x = vectors(task)
    predicted = model.predict(x)
    best, default = int(np.argmin(predicted)), space.index(task.default_schedule())
    gain = 2.0 ** (predicted[default] - predicted[best]) - 1.0
    own = CONV2D.baseline_of(x[[best, default]])
    assert gain > 0.001 and own[0] > own[1], "the premise: the two estimates disagree"
    assert CONV2D.baseline_vetoes
    assert pretrained_choice(task, margin=gain / 2) == space[default]
    without_veto(monkeypatch, task)
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path / "plain"))
    assert pretrained_choice(task, margin=gain / 2) == space[best]
    with pytest.raises(ValueError, match="baseline_vetoes without a baseline"):
        dataclasses.replace(CONV2D, baseline=(), baseline_vetoes=True)


def test_the_bench_replays_the_choosers_rule_on_measured_schedules():
    """bench/tuner_transfer.py's check of `pretrained_choice`'s rule on held-out records:
    the model's pick where it gains more than the margin (and the timing model agrees,
    with the veto), else the default."""
    bench = load_script(Path(vdla.__file__).parents[1] / "bench" / "tuner_transfer.py")
    # Two tasks of three schedules each; row 0 and row 3 are the defaults.
    y = np.log2([100.0, 90.0, 95.0, 100.0, 104.0, 99.0])
    predicted = np.log2([100.0, 80.0, 99.0, 100.0, 80.0, 99.0])    # 25% gains predicted
    est = np.log2([100.0, 90.0, 95.0, 100.0, 110.0, 99.0])         # the second: slower
    rows = Rows(np.zeros((6, 1)), y, np.array([0, 0, 0, 1, 1, 1]), ("f",),
                (("p", "a", "a"), ("p", "b", "b")))
    defaults = np.array([0, 3])
    followed, logs = bench.chooser_rule(predicted, est, rows, defaults, veto=False)
    assert followed == 2 and np.allclose(np.exp2(logs), [0.90, 1.04])
    followed, logs = bench.chooser_rule(predicted, est, rows, defaults, veto=True)
    assert followed == 1 and np.allclose(np.exp2(logs), [0.90, 1.0])
    # A task whose default was not measured is left out.
    followed, logs = bench.chooser_rule(predicted, est, rows, np.array([0, -1]), veto=True)
    assert followed == 1 and len(logs) == 1
