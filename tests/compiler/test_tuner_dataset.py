"""Training sets for learned cost models (`vdla.compiler.tuner.dataset`,
`vdla.compiler.training_sets`, ``vdla dataset``), measured here with the functional
backend (the same loop as Verilator's, in seconds)."""

import json
from pathlib import Path

import numpy as np
import pytest

import vdla
from vdla.cli import main
from vdla.compiler import targets, training_sets
from vdla.compiler.targets.vdla.platforms import CONFIG_SPACE, sample_configs
from vdla.compiler.tuner import InProcessRunner, PretrainedTuner, Records
from vdla.compiler.targets.vdla.features import CONV2D
from vdla.compiler.tuner.cost_model import CostModel
from vdla.compiler.tuner.dataset import DatasetPlan, generate, measure_again, random_shapes
from vdla.compiler.tuner.features import FeatureSet
from vdla.compiler.tuner.rows import pairwise_accuracy, top1_ratio, training_rows
from vdla.compiler.tuner.workload_tasks import reduced_spec, reduced_tasks, tasks_from_workload
from vdla.compiler.frontend.workloads import parse_workload
from platform_testing import FOREIGN_CPU, pretend_cpu

SHAPES = ("14,14,16,32,3,1,1", "7,7,16,16,1,0,1")


def test_configs_are_drawn_distinct_valid_and_seeded():
    drawn = sample_configs(6, seed=1)
    assert len({c.name for c in drawn}) == 6
    assert [c.name for c in drawn] == [c.name for c in sample_configs(6, seed=1)]
    assert [c.name for c in drawn] != [c.name for c in sample_configs(6, seed=2)]
    for c in drawn:
        assert c.block_in in CONFIG_SPACE["block_in"] and c.alu_hold in (False, True)
    base = vdla.HardwareConfig(alu_ops=("ADD", "MAX", "MIN", "SHR", "MUL"))
    assert all("MUL" in {op.name for op in c.alu_ops}
               for c in sample_configs(3, seed=0, base=base))   # the base's other fields
    with pytest.raises(ValueError, match=r"\['clock'\] are not HardwareConfig fields"):
        sample_configs(1, space={"clock": (100,)})
    with pytest.raises(ValueError, match="holds 2 valid configs, fewer than the 3"):
        sample_configs(3, space={"alu_hold": (False, True)})


def test_random_shapes_are_seeded_valid_workloads():
    shapes = random_shapes(12, seed=4)
    assert len(set(shapes)) == 12 and shapes == random_shapes(12, seed=4)
    for spec in shapes:
        parse_workload(spec)   # raises for a bad one


def test_random_grouped_shapes_are_depthwise_and_grouped_workloads():
    shapes = random_shapes(10, seed=4, grouped=True)
    assert len(set(shapes)) == 10 and shapes == random_shapes(10, seed=4, grouped=True)
    workloads = [parse_workload(spec)[1] for spec in shapes]
    depthwise = [w for w in workloads if w.groups == w.cin == w.cout]
    assert len(depthwise) == 5 and all(w.k == 3 for w in depthwise)
    others = [w for w in workloads if w not in depthwise]
    assert all(w.groups in (2, 4, 8) and w.cin % (16 * w.groups) == 0
               and w.cout % (16 * w.groups) == 0 for w in others)
    assert all(w.spec() == spec for w, spec in zip(workloads, shapes))
    # Their own stream: the plain draws are what they were.
    assert random_shapes(5, seed=4) == random_shapes(12, seed=4)[:5]
    # Both targets tune them: the CPU and the accelerator run grouped convolutions.
    [task] = tasks_from_workload(shapes[0], targets.get("vdla"))
    assert '"groups":' in task.key and task.space()


def test_random_dense_shapes_are_fully_connected_workloads_both_targets_measure(tmp_path):
    """``--dense-shapes``: fully connected layers, seeded, in their own stream; parsed
    back, refused when malformed; the accelerator's tasks (conv2d features: a dense
    layer is its GEMM) and the CPU's (its dense features) measured into a set."""
    from vdla.compiler.frontend.workloads import DenseWorkload

    shapes = random_shapes(8, seed=3, dense=True)
    assert len(set(shapes)) == 8 and shapes == random_shapes(8, seed=3, dense=True)
    workloads = [parse_workload(spec)[1] for spec in shapes]
    assert all(isinstance(w, DenseWorkload) and w.spec() == spec
               for w, spec in zip(workloads, shapes))
    assert all(64 <= w.cin <= 4096 and w.cin % 64 == 0 and 10 <= w.cout <= 1024
               and w.batch in (1, 4, 8) for w in workloads)
    assert parse_workload("Dense:512,1000") == ("dense:512,1000", DenseWorkload(512, 1000))
    assert DenseWorkload(64, 10, 4).macs == 64 * 10 * 4
    for bad, message in (("dense:512", "dense:IN,OUT"), ("dense:a,b", "dense:IN,OUT"),
                         ("dense:0,10", "must be >= 1")):
        with pytest.raises(ValueError, match=message):
            parse_workload(bad)
    vdla_platform = targets.get("vdla", backend="functional").platforms(1, seed=0)[0]
    cpu = targets.get("cpu", threads=1).platforms(1)[0]
    [on_vdla] = tasks_from_workload("dense:256,64,4", vdla_platform)
    [on_cpu] = tasks_from_workload("dense:256,64,4", cpu)
    [float_cpu] = tasks_from_workload("dense:256,64,4", cpu, precision="float32")
    assert on_vdla.feature_set.name == "vdla.conv2d" and '"dense":true' in on_vdla.key
    assert on_cpu.feature_set.name == float_cpu.feature_set.name == "cpu.dense"
    assert '"dtype":"float32"' in float_cpu.key and '"activation":"relu"' in float_cpu.key
    plan = training_sets.dataset_plan([vdla_platform], shapes=["dense:256,64,4"], per_task=3)
    with Records(tmp_path / "vdla.db") as db:
        generate(plan, db, backend="functional")
        assert len(training_rows(plan.tasks, db, "functional")) == 3
    # The CPU's in this process (see the float32 set below).
    plan = training_sets.dataset_plan([cpu], shapes=["dense:256,64,4"], per_task=3,
                                 precision="float32")
    with Records(tmp_path / "cpu.db") as db:
        manifest = generate(plan, db, backend="wall")
        assert manifest.failed == 0
        assert len(training_rows(plan.tasks, db, "wall")) == 3


def test_random_token_and_matmul_shapes_are_the_cpu_gemm_workloads(tmp_path):
    """``--token-shapes`` (dense layers of many rows) and ``--matmul-shapes`` (batched
    products of two activations): seeded, each in its own stream, bounded in work,
    parsed back; the CPU's tasks of each read their own feature set, a product's set is
    measured into rows, and the accelerator, which runs no products, leaves them out."""
    from vdla.compiler.frontend.workloads import DenseWorkload, MatmulWorkload
    from vdla.compiler.tuner.dataset import HEADS, MAX_DRAWN_MACS, PRODUCT_ROWS, TOKENS

    tokens = random_shapes(10, seed=3, tokens=True)
    products = random_shapes(10, seed=3, matmul=True)
    assert tokens == random_shapes(10, seed=3, tokens=True) and len(set(tokens)) == 10
    assert random_shapes(4, seed=3, dense=True) == random_shapes(8, seed=3, dense=True)[:4]
    for spec in tokens:
        w = parse_workload(spec)[1]
        assert isinstance(w, DenseWorkload) and w.batch in TOKENS and w.spec() == spec
        assert w.cin % 64 == 0 and w.cout % 64 == 0 and w.macs <= MAX_DRAWN_MACS["tokens"]
    for spec in products:
        w = parse_workload(spec)[1]
        assert isinstance(w, MatmulWorkload) and w.spec() == spec
        assert w.m in PRODUCT_ROWS and w.batch in HEADS and w.macs <= MAX_DRAWN_MACS["matmul"]
    assert parse_workload("Matmul:5,7,9") == ("matmul:5,7,9", MatmulWorkload(5, 7, 9))
    for bad in ("matmul:5,7", "matmul:a,b,c"):
        with pytest.raises(ValueError, match="matmul:M,K,N"):
            parse_workload(bad)
    cpu = targets.get("cpu", threads=1).platforms(1)[0]
    [on_cpu] = tasks_from_workload("dense:128,64,50", cpu)
    [product] = tasks_from_workload("matmul:5,24,20,2", cpu)
    [floats] = tasks_from_workload("matmul:5,24,20,2", cpu, precision="float32")
    assert on_cpu.feature_set.name == "cpu.dense" and on_cpu.feature_set.version == 3
    assert product.feature_set.name == floats.feature_set.name == "cpu.matmul"
    assert '"op":"matmul"' in product.key and '"dtype":"float32"' in floats.key
    plan = training_sets.dataset_plan([targets.get("vdla", backend="functional")],
                                      shapes=["matmul:5,24,20,2", "dense:256,64,4"],
                                      per_task=2)
    assert len(plan.tasks) == 1
    plan = training_sets.dataset_plan([cpu], shapes=["matmul:5,24,20,2"], per_task=3)
    with Records(tmp_path / "cpu.db") as db:
        assert generate(plan, db, backend="wall").failed == 0
        assert len(training_rows(plan.tasks, db, "wall")) == 3


def test_random_transposed_products_are_what_the_accelerator_tunes(tmp_path):
    """``--matmul-t-shapes``: single products a @ b^T (``matmul_t:M,K,N``), whole blocks
    deep and wide, seeded in their own stream and parsed back. The accelerator tunes each
    (b's rows its weight blocks); a product it cannot run (b not transposed, or not
    whole blocks of a 32-lane config) is left out once, with the reason and the count of
    platforms."""
    from vdla.compiler.frontend.workloads import MatmulWorkload, workload_graph
    from vdla.compiler.tuner.dataset import BLOCKED_TOKENS, PRODUCT_ROWS

    products = random_shapes(10, seed=3, matmul_t=True)
    assert products == random_shapes(10, seed=3, matmul_t=True) and len(set(products)) == 10
    assert not set(products) & set(random_shapes(10, seed=3, matmul=True))
    for spec in products:
        w = parse_workload(spec)[1]
        assert w.transpose_b and w.batch == 1 and w.spec() == spec
        assert w.m in PRODUCT_ROWS and w.k in BLOCKED_TOKENS and w.n in BLOCKED_TOKENS
    assert parse_workload("MATMUL_T:4,32,48,2") == ("matmul_t:4,32,48,2",
                                                    MatmulWorkload(4, 32, 48, 2, True))
    with pytest.raises(ValueError, match="matmul_t:M,K,N"):
        parse_workload("matmul_t:4,32")
    cpu = targets.get("cpu", threads=1).platforms(1)[0]
    with pytest.raises(ValueError, match="a float32 product is matmul:M,K,N"):
        tasks_from_workload("matmul_t:4,32,48", cpu, precision="float32")
    graph, feed = workload_graph(parse_workload("matmul_t:4,32,48")[1])
    assert feed["b"].shape == (1, 48, 32) and graph.node("matmul").attrs["transpose_b"]
    accel = targets.get("vdla", backend="functional")
    [task] = tasks_from_workload("matmul_t:20,32,48", accel)
    assert task.name == "matmul_t:20,32,48" and '"streamed":true' in task.key.replace(" ", "")
    with pytest.raises(ValueError, match="a @ b needs b transposed"):
        tasks_from_workload("matmul:20,32,48", accel)
    wide = targets.get("vdla", backend="functional",
                       config=vdla.HardwareConfig(block_in=32, block_out=32))
    logged = []
    plan = training_sets.dataset_plan([accel, wide, wide], shapes=["matmul_t:20,48,32",
                                                                  "matmul_t:20,32,32"],
                                      per_task=2, log=logged.append)
    assert len(plan.tasks) == 4
    with Records(tmp_path / "products.db") as db:     # measured as a (1, M, K) graph
        assert generate(plan, db, backend="functional").failed == 0
    assert logged == ["left out matmul_t:20,48,32: target 'vdla' has no tunable task for "
                      "workload 'matmul_t:20,48,32': " + logged[0].split("': ", 1)[1]]
    assert logged[0].endswith("(2 platforms)") and "48 columns" in logged[0]


def test_a_grouped_workload_is_parsed_and_checked():
    name, w = parse_workload("14,14,64,128,3,1,2,4")
    assert w.groups == 4 and w.macs == 7 * 7 * 128 * 16 * 9 and w.spec() == name
    assert parse_workload("7,7,16,32,3,1,1")[1].groups == 1
    with pytest.raises(ValueError, match="4 groups do not divide 18 input"):
        parse_workload("14,14,18,128,3,1,2,4")
    with pytest.raises(ValueError, match="groups must be >= 1"):
        parse_workload("14,14,16,16,3,1,1,0")
    with pytest.raises(ValueError, match="7 or 8 integers"):
        parse_workload("14,14,16,16,3,1,1,1,1")


def test_a_plan_refuses_what_it_cannot_measure():
    target = targets.get("vdla")
    [task] = tasks_from_workload(SHAPES[0], target)
    with pytest.raises(ValueError, match="per_task must be a positive integer"):
        DatasetPlan(tasks=[task], platforms={}, per_task=0)
    with pytest.raises(ValueError, match=r"both measured and held out: \['resnet18'\]"):
        DatasetPlan(tasks=[task], platforms={}, models=("resnet18",),
                    held_out_models=("resnet18",))
    with pytest.raises(ValueError, match="tasks on held-out platforms"):
        DatasetPlan(tasks=[task], platforms={}, held_out_platforms=(task.platform,))
    with pytest.raises(ValueError, match="tasks to measure"):
        DatasetPlan(tasks=[], platforms={})
    with pytest.raises(ValueError, match="rounds must be a positive integer, not 0"):
        DatasetPlan(tasks=[task], platforms={}, rounds=0)
    with pytest.raises(ValueError, match="side_by_side must be a non-negative integer"):
        DatasetPlan(tasks=[task], platforms={}, side_by_side=-1)
    # Verilator counts the same cycles every time: nothing to compare side by side.
    with pytest.raises(ValueError, match="target 'vdla' measures the same cost every time"):
        DatasetPlan(tasks=[task], platforms={}, side_by_side=3)
    with pytest.raises(ValueError, match="has no platforms to draw"):
        targets.get("host").platforms(2)


def test_generate_measures_every_platform_resumes_and_holds_out(tmp_path):
    drawn = targets.get("vdla", backend="functional").platforms(3, seed=0)
    left_out = []
    plan = training_sets.dataset_plan(drawn[:2], held_out=drawn[2:], shapes=SHAPES, per_task=3,
                                 held_out_models=("mobilenet_v1",), log=left_out.append)
    assert len(plan.tasks) == 4 and not left_out
    seen = []
    with Records(tmp_path / "set.db") as db:
        kept = []
        first = generate(plan, db, backend="functional", jobs=2,
                         progress=lambda *a: seen.append(a),
                         checkpoint=lambda m: kept.append((m.total, m.complete)))
        resumed = []
        again = generate(plan, db, backend="functional", jobs=2,
                         checkpoint=lambda m: resumed.append(m.total))
        rows = db.query()
    platforms = [t.config.name for t in drawn]
    assert sorted(first.counts) == sorted(platforms[:2])
    assert all(len(c) == 2 and set(c.values()) == {3} for c in first.counts.values())
    assert first.measured == first.total == 12 == len(rows) and first.failed == 0
    assert {r.config for r in rows} == set(platforms[:2])
    assert again.measured == 0 and again.total == 12          # resumed: nothing new
    assert resumed[0] == 12   # its first manifest already counts what the records hold
    assert first.held_out == {"models": ["mobilenet_v1"], "platforms": [platforms[2]]}
    assert first.platforms[platforms[2]]["hardware"]["block_in"] == drawn[2].config.block_in
    assert [a[2:] for a in seen] == [(i, 4) for i in range(1, 5)]
    assert kept == [(3, False), (6, False), (9, False), (12, True)]
    first.write(tmp_path / "m.json")
    written = json.loads((tmp_path / "m.json").read_text())
    assert written["total"] == 12 and written["backend"] == "functional"
    assert written["tools"]["vdla"] == vdla.__version__ and written["created"]
    # A Verilator-measured platform says which tools measured it.
    assert set(targets.get("vdla").platform_params()["tools"]) == {"verilator", "compiler"}


def _rows_of(path) -> list:
    """(platform, workload, schedule, cost, status) of every row of the records at
    `path`, in a fixed order: what a training set holds apart from when and how fast."""
    with Records(path) as db:
        return sorted((r.config, r.workload, r.schedule_json, r.cycles, r.status)
                      for r in db.query())


def test_parallel_jobs_measure_the_same_set_as_one(tmp_path):
    """`jobs` 2 (two worker processes, each a task at a time) measures the schedules one
    job measures, with the same costs and the same manifest; the records are written by
    this process only, and each task's rows stay in the order it measured them."""
    drawn = targets.get("vdla", backend="functional").platforms(2, seed=5)
    plan = training_sets.dataset_plan(drawn, shapes=SHAPES + ("28,28,16,16,3,1,2",),
                                      per_task=3, picked=1, rounds=2)
    manifests, seen = {}, {}
    for jobs in (1, 2):
        progress = seen[jobs] = []
        with Records(tmp_path / f"{jobs}.db") as db:
            manifests[jobs] = generate(plan, db, backend="functional", jobs=jobs,
                                       progress=lambda *a, into=progress: into.append(a))
            order = {task.key: [r.schedule_json for r in db.query(task.key, task.platform)]
                     for task in plan.tasks[:1]}
        manifests[jobs].write(tmp_path / f"{jobs}.json")
    one, two = (json.loads((tmp_path / f"{j}.json").read_text()) for j in (1, 2))
    for varying in ("created", "seconds", "records"):
        one.pop(varying), two.pop(varying)
    assert one == two and one["complete"] and one["failed"] == 0
    assert one["measured"] == one["total"] * 2 == 2 * len(plan.tasks) * 4
    assert _rows_of(tmp_path / "1.db") == _rows_of(tmp_path / "2.db")
    # Every task reported once a pass (two passes: the draw, round 2), in any order.
    assert sorted(a[1] for a in seen[2]) == sorted(a[1] for a in seen[1])
    assert [a[2:] for a in seen[2]] == [(i, len(plan.tasks)) for i in range(1, 7)] * 2
    with Records(tmp_path / "1.db") as db:
        task = plan.tasks[0]
        assert [r.schedule_json for r in db.query(task.key, task.platform)] == \
            order[task.key]


def test_a_set_measured_on_ray_holds_the_local_rows(tmp_path):
    """``--ray local``: the same executor as `vdla sweep --ray`; the same rows as local
    processes, the records written here."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'vdla[ray]'")
    drawn = targets.get("vdla", backend="functional").platforms(1, seed=6)
    plan = training_sets.dataset_plan(drawn, shapes=SHAPES, per_task=3)
    for where in ({"jobs": 2}, {"jobs": 2, "ray": "local"}):
        with Records(tmp_path / f"{len(where)}.db") as db:
            said = []
            generate(plan, db, backend="functional", log=said.append, **where)
            assert ("Ray" in said[0]) == ("ray" in where)
    assert _rows_of(tmp_path / "1.db") == _rows_of(tmp_path / "2.db") != []


def test_vdla_dataset_ray_without_a_cluster_is_a_clear_error(tmp_path, monkeypatch, capsys):
    """--ray auto with no cluster running: one line naming the option, before the
    records file is written (the executor starts before the records open)."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'vdla[ray]'")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["dataset", "--records", "x.db", "--shapes", "1", "--per-task", "1",
                 "--measure", "functional", "--ray", "auto"]) == 1
    assert "--ray auto: no Ray cluster found" in capsys.readouterr().err
    assert not (tmp_path / "x.db").exists()


def test_picked_schedules_come_after_the_random_ones(tmp_path):
    """`picked`: the pretrained tuner's choices, measured after the random draw of the
    same task (never one twice), and the model that chose them named in the manifest."""
    drawn = targets.get("vdla", backend="functional").platforms(1, seed=4)
    plan = training_sets.dataset_plan(drawn, shapes=SHAPES[:1], per_task=3, picked=2)
    with Records(tmp_path / "set.db") as db:
        manifest = generate(plan, db, backend="functional")
        rows = db.query()
    task = plan.tasks[0]
    assert manifest.total == manifest.measured == 5 == len(rows) == len(
        {r.schedule_json for r in rows})
    assert manifest.picked == 2 and manifest.picked_by == [task.pretrained().digest]
    # The two picked are the model's best-ranked among what the draw left.
    tuner = PretrainedTuner(task, task.space())
    first = [task.schedule_from_dict(r.schedule) for r in rows[:3]]
    tuner.update(first, [r.cycles for r in rows[:3]])
    assert [task.schedule_from_dict(r.schedule) for r in rows[3:]] == tuner.propose(2)
    with pytest.raises(ValueError, match="picked must be a non-negative integer, not -1"):
        training_sets.dataset_plan(drawn, shapes=SHAPES[:1], picked=-1)


def test_vdla_dataset_writes_records_and_a_manifest(tmp_path, capsys):
    db = tmp_path / "set.db"
    assert main(["dataset", "--records", str(db), "--platforms", "2", "--held-out-platforms",
                 "1", "--shapes", "2", "--per-task", "2", "--measure", "functional",
                 "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "training set: 8 measurements on 2 platforms" in out and "held out" in out
    manifest = json.loads((tmp_path / "set.db.manifest.json").read_text())
    assert manifest["total"] == 8 and len(manifest["held_out"]["platforms"]) == 1
    assert main(["dataset", "--records", str(db), "--shapes", "0"]) == 1
    assert "nothing to measure" in capsys.readouterr().err
    assert main(["dataset", "--records", str(db), "--target", "host", "--shapes", "1"]) == 1
    assert "no tunable ops" in capsys.readouterr().err
    for flag, value, message in (("--per-task", "0", "--per-task must be at least 1, not 0"),
                                 ("--jobs", "0", "--jobs must be at least 1, not 0"),
                                 ("--held-out-platforms", "-1",
                                  "--held-out-platforms must be at least 0, not -1"),
                                 ("--platforms", "0", "--platforms must be at least 1, not 0"),
                                 ("--picked", "-1", "--picked must be at least 0, not -1"),
                                 ("--small-shapes", "-2",
                                  "--small-shapes must be at least 0, not -2"),
                                 ("--grouped-shapes", "-1",
                                  "--grouped-shapes must be at least 0, not -1"),
                                 ("--dense-shapes", "-1",
                                  "--dense-shapes must be at least 0, not -1"),
                                 ("--token-shapes", "-1",
                                  "--token-shapes must be at least 0, not -1"),
                                 ("--matmul-shapes", "-1",
                                  "--matmul-shapes must be at least 0, not -1"),
                                 ("--matmul-t-shapes", "-1",
                                  "--matmul-t-shapes must be at least 0, not -1"),
                                 ("--rounds", "0", "--rounds must be at least 1, not 0"),
                                 ("--side-by-side", "-1",
                                  "--side-by-side must be at least 0, not -1")):
        assert main(["dataset", "--records", str(db), flag, value]) == 1
        assert message in capsys.readouterr().err
    # A float32 set on a target that runs no floats: refused, nothing written.
    assert main(["dataset", "--records", str(tmp_path / "f.db"), "--precision", "float32",
                 "--shapes", "2"]) == 1
    assert "has no tunable float32 op" in capsys.readouterr().err
    assert not (tmp_path / "f.db").exists()
    # More platforms than the target has: its own error, before anything is measured.
    assert main(["dataset", "--records", str(tmp_path / "cpu.db"), "--target", "cpu",
                 "--platforms", "9", "--shapes", "1"]) == 1
    assert "instruction sets" in capsys.readouterr().err and not (tmp_path / "cpu.db").exists()


# --- rows and figures for learned models (vdla.compiler.tuner.rows) -----------------------

def test_ranking_figures_compare_schedules_of_one_task_only():
    y = np.array([1.0, 2.0, 3.0, 10.0, 20.0])
    groups = np.array([0, 0, 0, 1, 1])
    assert pairwise_accuracy(y, y, groups) == 1.0
    assert pairwise_accuracy(-y, y, groups) == 0.0
    # Across groups the order is free: only within-task pairs count.
    assert pairwise_accuracy(np.array([30.0, 31.0, 32.0, 0.0, 1.0]), y, groups) == 1.0
    assert pairwise_accuracy(np.zeros(5), y, groups) == 0.5         # ties count half
    assert top1_ratio(y, y, groups) == 1.0
    # Picks the 2nd of task 0 (2 over 1 in log2: 2x) and the best of task 1.
    assert top1_ratio(np.array([5.0, 0.0, 9.0, 0.0, 1.0]), y, groups) == pytest.approx(2 ** -0.5)
    with pytest.raises(ValueError, match="no pair"):
        pairwise_accuracy(np.zeros(2), np.ones(2), np.zeros(2, dtype=int))


def measured_rows(folder, *, seed: int, per_task: int):
    """The functional training set of SHAPES on two drawn configs: (its plan, its rows,
    its records file)."""
    drawn = targets.get("vdla", backend="functional").platforms(2, seed=seed)
    plan = training_sets.dataset_plan(drawn, shapes=SHAPES, per_task=per_task)
    with Records(folder / "set.db") as db:
        generate(plan, db, backend="functional", jobs=2)
        return plan, training_rows(plan.tasks, db, "functional"), folder / "set.db"


def test_training_rows_join_records_to_features(tmp_path):
    plan, rows, path = measured_rows(tmp_path, seed=0, per_task=4)
    with Records(path) as db:
        assert len(training_rows(plan.tasks, db, "verilator")) == 0   # another backend
    assert rows.x.shape == (16, len(CONV2D.names)) and rows.feature_names == CONV2D.names
    assert len(rows.tasks) == 4 and sorted(set(rows.groups.tolist())) == [0, 1, 2, 3]
    assert np.isfinite(rows.x).all() and (rows.y > 0).all()
    # The functional backend's cost is the timing model's: it ranks itself perfectly.
    est = (rows.x[:, CONV2D.names.index("log_est_over_ideal")]
           + rows.x[:, CONV2D.names.index("log_ideal_cycles")])
    assert top1_ratio(est, rows.y, rows.groups) == 1.0
    with Records(path) as db, pytest.raises(ValueError, match="one feature set"):
        training_rows([object()], db, "functional")


def test_a_cost_model_predicts_as_its_learner_and_round_trips(tmp_path):
    from sklearn.ensemble import GradientBoostingRegressor

    _, rows, _ = measured_rows(tmp_path, seed=1, per_task=6)
    model = CostModel.fit(rows, CONV2D, trees=30, depth=3, seed=0, meta={"note": "t"})
    learner = GradientBoostingRegressor(n_estimators=30, max_depth=3, learning_rate=0.1,
                                        random_state=0).fit(rows.x, rows.y)
    assert np.allclose(model.predict(rows.x), learner.predict(rows.x))
    model.save(tmp_path / "m.npz")
    loaded = CostModel.load(tmp_path / "m.npz", CONV2D)
    assert np.array_equal(loaded.predict(rows.x), model.predict(rows.x))
    assert loaded.meta["note"] == "t" and loaded.meta["rows"] == len(rows)
    # Correcting the timing model: its estimate plus trees fitted to its error.
    fixed = CostModel.fit(rows, CONV2D, trees=30, depth=3, seed=0, residual=True)
    prior = CONV2D.baseline_of(rows.x)
    error = GradientBoostingRegressor(n_estimators=30, max_depth=3, learning_rate=0.1,
                                      random_state=0).fit(rows.x, rows.y - prior)
    assert np.allclose(fixed.predict(rows.x), prior + error.predict(rows.x))
    fixed.save(tmp_path / "r.npz")
    assert np.array_equal(CostModel.load(tmp_path / "r.npz", CONV2D).predict(rows.x),
                          fixed.predict(rows.x))
    with pytest.raises(ValueError, match="no baseline to correct"):
        CostModel.fit(rows, FeatureSet("vdla.conv2d", 1, CONV2D.features), residual=True)
    other = FeatureSet("vdla.conv2d", 2, CONV2D.features)
    with pytest.raises(ValueError, match="version 1, this vdla's 2"):
        CostModel.load(tmp_path / "m.npz", other)


def test_a_manifest_gives_back_its_plan(tmp_path):
    drawn = targets.get("vdla", backend="functional").platforms(3, seed=2)
    plan = training_sets.dataset_plan(drawn[:2], held_out=drawn[2:], shapes=SHAPES, per_task=2)
    with Records(tmp_path / "set.db") as db:
        generate(plan, db, backend="functional", jobs=2).write(tmp_path / "m.json")
    again, held = training_sets.plan_from_manifest(json.loads((tmp_path / "m.json").read_text()))
    assert [(t.platform, t.key) for t in again.tasks] == [(t.platform, t.key) for t in plan.tasks]
    assert [t.config.name for t in held] == [drawn[2].config.name]
    assert held[0].backend == "functional"
    with pytest.raises(ValueError, match="has no platforms to rebuild"):
        type(targets.get("host")).from_platform({})


def test_unseen_platforms_are_the_default_the_held_out_and_the_next_drawn():
    """What a set never trained on, for the few-shot and zero-shot figures: the
    default platform, the held-out ones (in the manifest's order) and the next of the
    set's own draw; a default the set trained on is refused."""
    root = Path(vdla.__file__).resolve().parents[1]
    manifest = json.loads((root / "bench" / "datasets" / "vdla_v1.db.manifest.json")
                          .read_text())
    unseen = training_sets.unseen_platforms(manifest)
    names = [t.config.name for t in unseen]
    held = manifest["held_out"]["platforms"]
    assert names[0] == vdla.HardwareConfig().name and names[1:3] == held
    assert len(names) == 5 and not set(names) & (set(manifest["platforms"]) - set(held))
    drawn = [t.config.name for t in targets.get("vdla").platforms(
        len(manifest["platforms"]) + 2, seed=manifest["seed"])]
    assert names[3:] == [n for n in drawn if n not in manifest["platforms"]]
    # The reduced layers on one of them: ResNet-18's C2-C11, a quarter of the side.
    tasks = reduced_tasks(unseen[1])
    assert [t.name for t in tasks] == [f"C{i}/r" for i in range(2, 12)]
    assert reduced_spec("C5") == "7,7,64,64,3,1,1"
    default = targets.get("vdla")
    trained = {"target": "vdla", "seed": 0, "held_out": {"platforms": [], "models": []},
               "platforms": {default.config.name: default.platform_params()}}
    with pytest.raises(ValueError, match="were trained on: they are not unseen"):
        training_sets.unseen_platforms(trained)


def test_the_cpu_platforms_are_the_instruction_sets_this_machine_runs():
    from vdla.compiler.targets.cpu import isa as cpu_isa
    from vdla.compiler.targets.cpu.build import machine_features

    cpu = targets.get("cpu")
    runs = [n for n, isa in cpu_isa.ISAS.items() if isa.runs_on(machine_features())]
    drawn = cpu.platforms(len(runs))
    assert [t.options()["isa"] for t in drawn] == runs and runs[-1] == "portable"
    again = type(cpu).from_platform(drawn[-1].platform_params())
    assert again.options() == drawn[-1].options()
    with pytest.raises(ValueError, match=f"runs {len(runs)} instruction sets"):
        cpu.platforms(len(runs) + 1)


def test_a_cpu_platform_of_another_machine_reads_its_records_and_measures_nothing(
        monkeypatch):
    """A training set's platform is the machine that measured it (its manifest names the
    CPU): re-made on another CPU, with an instruction set this one may lack, its tasks
    name that machine's records and refuse to measure here."""
    pretend_cpu(monkeypatch, FOREIGN_CPU)
    recorded = {"threads": 1, "isa": "avx512vnni", "cpu": "AMD EPYC"}
    target = type(targets.get("cpu")).from_platform(recorded)
    assert target.platform_params() == recorded
    [task] = tasks_from_workload("7,7,16,16,1,0,1", target)
    assert task.platform == "AMD EPYC, 1 threads, avx512vnni"
    # a platform that names no machine model gets the nominal one's costs (memo keys name them)
    assert task.platform_key() == {**recorded, "machine": task.costs.key()}
    assert task.costs.source == "nominal"
    with pytest.raises(ValueError, match="'AMD EPYC' .* is not measured on this one, "
                                         r"'Intel\(R\) Xeon"):
        task.compile(task.default_schedule(), "wall")
    [own] = tasks_from_workload("7,7,16,16,1,0,1",
                                         targets.get("cpu", threads=1, isa="portable"))
    assert own.platform == f"{FOREIGN_CPU}, 1 threads, portable"
    with pytest.raises(ValueError, match="needs the CPU's name and its isa"):
        type(target)(cpu="AMD EPYC")


def test_a_narrower_cpu_target_draws_its_platforms_from_its_own_down():
    """A target made for a narrower instruction set (`vdla dataset --isa avx2`) starts at
    its own: the widest is not measured behind the user's back."""
    from vdla.compiler.targets.cpu import isa as cpu_isa
    from vdla.compiler.targets.cpu.build import machine_features

    runs = [n for n, isa in cpu_isa.ISAS.items() if isa.runs_on(machine_features())]
    if len(runs) < 2:
        pytest.skip(f"this machine's compiler offers only {runs[0]}: no instruction set "
                    "narrower than its best")
    narrower = targets.get("cpu", isa=runs[1]).platforms(len(runs) - 1)
    assert [t.options()["isa"] for t in narrower] == runs[1:]
    with pytest.raises(ValueError, match=f"from {runs[1]} down"):
        targets.get("cpu", isa=runs[1]).platforms(len(runs))


def test_a_float32_cpu_set_measures_the_models_float_layers(tmp_path):
    """`--precision float32`: the models' float layers, measured by wall time, their
    precision in the manifest and back in the plan; random shapes (int8) refused."""
    cpu = targets.get("cpu").platforms(1)[0]
    with pytest.raises(ValueError, match="C5 is ResNet-18's int8 layer"):
        tasks_from_workload("C5", cpu, precision="float32")
    with pytest.raises(ValueError, match="no tunable float32 op among the models and shapes"):
        training_sets.dataset_plan([cpu], shapes=["C5"], precision="float32")
    plan = training_sets.dataset_plan([cpu], models=["small_cnn"], per_task=2, precision="float32",
                                 rounds=2)
    # A random shape at float32: a float convolution with the ReLU fused, as a model's.
    [shape] = training_sets.dataset_plan([cpu], shapes=["7,7,32,32,3,1,1,32"],
                                    precision="float32").tasks
    assert '"dtype":"float32"' in shape.key and '"activation":"relu"' in shape.key
    assert '"groups":32' in shape.key
    assert plan.tasks and all('"dtype":"float32"' in t.key for t in plan.tasks)
    # In this process: a worker forked from a test process whose OpenMP team is running
    # (other CPU tests start one) can hang starting its own.
    with Records(tmp_path / "set.db") as db:
        generate(plan, db, backend="wall").write(tmp_path / "m.json")
        # Two rounds: every schedule measured twice, the second pass after the first.
        records = db.query()
        schedules = {(r.workload, json.dumps(r.schedule, sort_keys=True)) for r in records}
        assert len(records) == 2 * len(schedules) == 2 * 2 * len(plan.tasks)
        assert [r.workload for r in records[:len(schedules)]] == \
            [r.workload for r in records[len(schedules):]]
        # Nothing more to measure for the same rounds.
        assert measure_again(plan.tasks[0], InProcessRunner("wall"), db, 2) == []
    manifest = json.loads((tmp_path / "m.json").read_text())
    assert manifest["precision"] == "float32" and manifest["rounds"] == 2
    assert manifest["measured"] == 16 and manifest["complete"]
    assert sum(map(len, manifest["counts"].values())) == len(plan.tasks)
    again, _ = training_sets.plan_from_manifest(manifest)
    assert [t.key for t in again.tasks] == [t.key for t in plan.tasks]
    with pytest.raises(SystemExit, match="2"):
        main(["dataset", "small_cnn", "--target", "cpu", "--platforms", "1",
              "--precision", "float16", "--records", str(tmp_path / "x.db")])


def test_a_cpu_set_measured_side_by_side_takes_each_rounds_figures(tmp_path):
    """`--side-by-side R`: after their own measurements, each workload's schedules are
    measured in turn R rounds, each figure a row naming its round; a row's cost is the
    median of its figures; a resumed run adds nothing; the manifest and the plan keep R."""
    from vdla.compiler.tuner.dataset import SIDE_BY_SIDE, measure_side_by_side

    cpu = targets.get("cpu", threads=1).platforms(1)[0]
    plan = training_sets.dataset_plan([cpu], shapes=["7,7,16,16,3,1,1"], per_task=3,
                                 side_by_side=4)
    [task] = plan.tasks
    with Records(tmp_path / "set.db") as db:
        # In this process, as the float32 set above.
        manifest = generate(plan, db, backend="wall")
        records = db.query()
        own = [r for r in records if SIDE_BY_SIDE not in r.counters]
        slots = [r for r in records if SIDE_BY_SIDE in r.counters]
        assert len(own) == 3 and len(slots) == 4 * 3 and manifest.measured == 3 + 12
        # Round by round, every schedule once, in the same order.
        assert [r.counters[SIDE_BY_SIDE] for r in slots] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
        assert [r.schedule for r in slots[:3]] == [r.schedule for r in slots[3:6]]
        assert {json.dumps(r.schedule, sort_keys=True) for r in slots} == \
            {json.dumps(r.schedule, sort_keys=True) for r in own}
        assert all(r.ok and r.cycles > 0 and r.backend == "wall" for r in slots)
        assert measure_side_by_side(task, "wall", db, 4) == []
        rows = training_rows(plan.tasks, db, "wall")
        by_schedule = {}
        for r in records:
            by_schedule.setdefault(json.dumps(r.schedule, sort_keys=True), []).append(r.cycles)
        assert sorted(rows.y) == sorted(np.log2(np.median(c)) for c in by_schedule.values())
    manifest.write(tmp_path / "m.json")
    written = json.loads((tmp_path / "m.json").read_text())
    assert written["side_by_side"] == 4 and written["complete"]
    again, _ = training_sets.plan_from_manifest(written)
    assert again.side_by_side == 4


def test_a_compressed_training_set_is_unpacked_once_into_the_cache(tmp_path, monkeypatch):
    import lzma
    from vdla.compiler.tuner.dataset import local_records

    monkeypatch.setenv("VDLA_CACHE", str(tmp_path / "cache"))
    plan, rows, path = measured_rows(tmp_path, seed=3, per_task=2)
    with Records(path) as db:     # all measured already: nothing is measured again
        manifest = generate(plan, db, backend="functional")
        assert manifest.measured == 0 and manifest.complete
        manifest.write(tmp_path / "m.json")
    (tmp_path / "set.db.xz").write_bytes(lzma.compress(path.read_bytes()))
    path.unlink()
    again, manifest = training_sets.training_set(tmp_path / "m.json")
    assert np.array_equal(again.x, rows.x) and np.array_equal(again.y, rows.y)
    unpacked = local_records(path)
    assert unpacked.parent == tmp_path / "cache" / "datasets" and unpacked.is_file()
    assert local_records(path) == unpacked
    with pytest.raises(FileNotFoundError, match="no records at"):
        local_records(tmp_path / "none.db")
    with pytest.raises(ValueError, match="are neither there nor beside it"):
        (tmp_path / "set.db.xz").unlink()
        training_sets.training_set(tmp_path / "m.json")
