"""bench/cpu_layers.py and bench/cpu_scaling.py end to end on a small model, one short
round each: every convolution is matched to an onnxruntime kernel, and every layer's work
items are counted and projected; bench/cpu_fusion.py on MobileNet-v1's fused pairs;
bench/cpu_dense.py's prefetch on and off on BERT-tiny; bench/cpu_bf16.py's error and
speed on the digits CNN; and the benches' bad arguments."""

from __future__ import annotations

import argparse

import json
from pathlib import Path

import pytest

from script_loading import load_script

BENCH = Path(__file__).resolve().parents[4] / "bench"

pytest.importorskip("onnxruntime")


def _vector_isa() -> str:
    """The best instruction set here without tiles: the layer and knob benches look at
    blocked convolutions, and on tiles many int8 ones are tile GEMMs instead."""
    from vdla.compiler.targets.cpu.build import machine_features
    from vdla.compiler.targets.cpu.isa import ISAS
    return next(n for n, i in ISAS.items() if not i.tiles and i.runs_on(machine_features()))


VECTOR_ISA = _vector_isa()


def test_layers_bench_matches_every_convolution(tmp_path, capsys):
    bench = load_script(BENCH / "cpu_layers.py")
    assert bench.main(["--models", "small_cnn", "--rounds", "1", "--runs", "2", "--pause", "0",
                       "--threads", "1", "--all", "--out", str(tmp_path),
                       "--isa", VECTOR_ISA]) == 0
    out = capsys.readouterr().out
    assert "small_cnn float32" in out and "small_cnn int8" in out
    results = json.loads((tmp_path / "cpu_layers.json").read_text())["results"]
    assert [r["precision"] for r in results] == ["float32", "int8"]
    with pytest.raises(SystemExit):
        bench.main(["--isa", "sse2", "--out", str(tmp_path)])
    assert "--isa: invalid choice: 'sse2'" in capsys.readouterr().err
    for r in results:
        assert r["layers"] and r["convs"] == len(r["layers"])
        for layer in r["layers"]:
            # onnxruntime's fused kernels, named after the last node they absorbed, are
            # matched back to the convolution that starts each chain.
            assert layer["ort_us"] > 0 and layer["before_us"] > 0 and layer["after_us"] > 0
        assert r["before_ms"] > 0 and r["after_ms"] > 0 and r["conversions"] >= 0


def test_scaling_bench_counts_work_items(tmp_path, capsys):
    bench = load_script(BENCH / "cpu_scaling.py")
    assert bench.main(["--models", "small_cnn", "--precisions", "int8", "--rounds", "1",
                       "--runs", "2", "--pause", "0", "--project", "4",
                       "--out", str(tmp_path)]) == 0
    assert "1 -> 2 threads" in capsys.readouterr().out
    (r,) = json.loads((tmp_path / "cpu_scaling.json").read_text())["results"]
    assert set(r["ms"]) == {"vdla@1", "vdla@2", "ort@1", "ort@2"}
    p = r["projection"]
    assert p["threads"] == 4 and p["layers"]
    # A model this small may lose to its teams' starts: the bound says so, below 1.
    assert 0 < p["speedup_with_teams"] <= p["speedup_bound"] <= 4
    for layer in p["layers"]:
        assert layer["items"] >= 1 and 0 < layer["efficiency"] <= 1
        assert layer["per_thread"] == -(-layer["items"] // 4)


def test_fusion_bench_times_mobilenets_and_resnets_pairs(capsys):
    bench = load_script(BENCH / "cpu_fusion.py")
    assert bench.main(["--rounds", "1", "--runs", "2", "--pause", "0"]) == 0
    out = capsys.readouterr().out
    assert "mobilenet_v1 float32" in out and "outputs identical" in out
    assert "features.0.dw.conv + features.0.pw.conv" in out
    assert "mobilenet_v1 int8: no pair fuses" in out
    assert "conv1 + maxpool" in out and "resnet18 int8: no pair fuses" in out


def test_dense_bench_times_the_prefetch_both_ways_and_compares_the_bytes(capsys):
    bench = load_script(BENCH / "cpu_dense.py")
    assert bench.main(["--models", "bert_tiny", "--precisions", "float32", "int8",
                       "--rounds", "2", "--runs", "1"]) == 0
    out = capsys.readouterr().out
    for precision in ("float32", "int8"):
        line = next(row for row in out.splitlines() if row.startswith(f"bert_tiny  {precision}"))
        assert "dense layers: off" in line and "x (quartiles" in line
    from vdla.compiler.targets.cpu import dense
    assert dense.PREFETCH_NEXT_PANEL        # put back after each compile


def test_bf16_bench_reports_the_error_and_where_it_can_the_speed(capsys):
    """bench/cpu_bf16.py on the digits CNN: its error against float32 (natively or on the
    tiles' software model), and with --speed the time against float32 where the machine
    runs AMX-BF16, else a clear refusal."""
    from vdla.compiler.targets.cpu.build import machine_features
    bench = load_script(BENCH / "cpu_bf16.py")
    assert bench.main(["--models", "digits_cnn", "--inputs", "1"]) == 0
    out = capsys.readouterr().out
    assert "bf16 kernels on" in out and next(
        row for row in out.splitlines() if row.startswith("digits_cnn"))
    argv = ["--models", "digits_cnn", "--inputs", "1", "--speed", "2", "--runs", "1"]
    if machine_features().amx_bf16:
        assert bench.main(argv) == 0
        assert "bf16 speed" in capsys.readouterr().out
    else:
        with pytest.raises(SystemExit):
            bench.main(argv)
        assert "this machine has no AMX-BF16" in capsys.readouterr().err


@pytest.mark.parametrize("script, argv, message", [
    ("cpu_layers.py", ["--models", "nosuch"], "unknown model 'nosuch'"),
    ("cpu_scaling.py", ["--models", "nosuch"], "unknown model 'nosuch'"),
    ("cpu_scaling.py", ["--project", "0"], "--threads and --project must be positive"),
    ("cpu.py", ["--models", "nosuch"], "unknown model 'nosuch'"),
    ("cpu.py", ["--isa", "mmx"], "invalid choice: 'mmx'"),
    ("cpu_fusion.py", ["--models", "nosuch"], "unknown model 'nosuch'"),
    ("cpu_fusion.py", ["--rounds", "0"], "--rounds must be at least 1, not 0"),
    ("cpu_fusion.py", ["--precisions", "float16"], "invalid choice: 'float16'"),
    ("cpu_dense.py", ["--models", "nosuch"], "unknown model 'nosuch'"),
    ("cpu_dense.py", ["--rounds", "1"], "--rounds must be at least 2 (the ratios' quartiles), "
                                        "not 1"),
    ("cpu_dense.py", ["--runs", "0"], "--runs must be at least 1, not 0"),
    ("cpu_bf16.py", ["--speed", "-1"], "--speed must be 0 or more and --runs at least 1, not "
                                       "-1 and 5"),
    ("cpu_bf16.py", ["--runs", "0"], "--speed must be 0 or more and --runs at least 1, not 0 "
                                     "and 0"),
])
def test_bad_arguments_name_the_value(script, argv, message, capsys):
    bench = load_script(BENCH / script)
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert message in capsys.readouterr().err


def test_knobs_bench_changes_the_blocked_convolutions_and_checks_them(capsys):
    bench = load_script(BENCH / "cpu_knobs.py")
    assert bench.main(["--set", "unroll=2", "--models", "small_cnn", "--rounds", "2",
                       "--threads", "1", "--isa", VECTOR_ISA]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("machine: ") and "--set unroll=2" in lines[0]
    rows = [line for line in lines[1:] if line.startswith("small_cnn")]
    assert len(rows) == 2 and all(" speed " in row and "x (quartiles" in row for row in rows)
    assert all(int(row.split()[2]) > 0 for row in rows)     # some nodes were changed
    with pytest.raises(SystemExit):
        bench.main(["--set", "unroll=2", "--isa", "sse2"])
    assert "--isa: invalid choice: 'sse2'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="knob=value pairs of vl, mr"):
        bench.parse_knobs("wide=2")
    assert bench.parse_knobs("mr=6,order=px") == {"mr": 6, "order": "px"}
    assert bench.parse_kernel("3x3") == (3, 3)
    with pytest.raises(argparse.ArgumentTypeError, match="KHxKW"):
        bench.parse_kernel("3")
    from vdla.compiler import pipeline, targets
    target = targets.get("cpu", threads=1, isa=VECTOR_ISA)
    graph = pipeline.graph_for(pipeline.load_model("small_cnn"), target, precision="int8")
    every, _ = bench.changed_schedules(graph, target, {"unroll": 2})
    three, _ = bench.changed_schedules(graph, target, {"unroll": 2}, kernel=(3, 3))
    none, _ = bench.changed_schedules(graph, target, {"unroll": 2}, kernel=(9, 9))
    assert set(three) <= set(every) and three and not none


def test_adaptation_bench_leaves_an_instruction_set_out(tmp_path):
    """bench/tuner_model.py's CPU part: the pretrained strategies' models, trained as
    shipped without one instruction set's rows, are the ones the remade tasks read."""
    bench = load_script(BENCH / "tuner_model.py")
    from vdla.compiler import pipeline
    from vdla.compiler.targets.cpu.target import CpuTarget

    target = CpuTarget(threads=1, isa="portable")
    tasks = target.tasks(pipeline.graph_for(pipeline.load_model("small_cnn"), target,
                                            precision="float32"))
    tasks = [t for t in tasks if not t.conv]       # the dense model: quick to train
    remade, said = bench.left_out(tasks, "avx2", tmp_path, required=True)
    assert said.startswith("cpu.dense on") and all(t.models == tmp_path for t in remade)
    shipped, model = tasks[0].pretrained(), remade[0].pretrained()
    assert model.meta["left_out"] == "avx2" and model.digest != shipped.digest
    # Fewer rows: the shipped model's metadata counts all of them.
    assert model.meta["rows"] < shipped.meta["rows"]
    with pytest.raises(SystemExit, match="no 'amx' platform"):
        bench.left_out(tasks, "amx", tmp_path, required=True)
    assert bench.left_out(tasks, "amx", tmp_path, required=False)[1].endswith("(no amx rows)")
    # The pretrained strategies' records are their models': another model, another file.
    assert bench.pretrained_digest(tasks) == bench.pretrained_digest(list(tasks))
    assert bench.pretrained_digest(remade) != bench.pretrained_digest(tasks)


def test_adaptation_bench_runs_the_unshared_tuner_only_when_named(tmp_path, monkeypatch):
    """bench/tuner_model.py's ablation, the pretrained tuner without the shared
    correction, is not a default strategy, and it reaches `tune_tasks` as share=False."""
    bench = load_script(BENCH / "tuner_model.py")
    assert "unshared + scheduler" not in bench.DEFAULT_STRATEGIES
    assert "pretrained + scheduler" in bench.DEFAULT_STRATEGIES
    seen = []
    monkeypatch.setattr(bench, "tune_tasks", lambda *a, **kw: seen.append(kw["share"]))

    class Runner:
        backend = "wall"

    for name in ("pretrained + scheduler", "unshared + scheduler"):
        tuner, split, _, share = bench.STRATEGIES[name]
        bench.tune([], Runner(), tmp_path / f"{len(seen)}.db", trials=1, tuner=tuner,
                   split=split, batch=1, share=share)
    assert seen == [True, False]
