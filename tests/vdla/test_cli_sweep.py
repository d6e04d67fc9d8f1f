"""`vdla sweep`: a small grid and a sampled sweep on the digits CNN over pynq-z1, the
reports, resuming from the store, the best config as `--config`, and bad input."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from vdla.cli import main
from vdla.config import HardwareConfig
from vdla.dse.evaluate import Evaluator
from vdla.dse.spec import SweepSpec

SPEC = """
board = "pynq-z1"

[[models]]
name = "digits_cnn"

[parameters]
block_in = [8, 16]
block_out = [8, 16]
acc_buff_size = ["32K", "128K"]
"""


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "digits.toml"
    path.write_text(SPEC)
    return path


def sweep(capsys, *args):
    status = main(["sweep", *map(str, args)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return status, captured.out, captured.err


def test_a_grid_sweep_reports_resumes_and_writes_the_best_config(tmp_path, capsys, spec_file):
    out = tmp_path / "out"
    best = tmp_path / "best.json"
    status, stdout, err = sweep(capsys, spec_file, "--out", out, "--jobs", "2",
                                "--best", best, "--json", tmp_path / "s.json")
    assert status == 0, err
    assert "8 points (0 from the store)" in stdout and "on the Pareto front" in stdout
    assert "latency ms" in stdout                       # the front's table
    assert "grid search over 8 points" in err and "2 local processes" in err
    for name in ("front.md", "sweep.json", "sweep.png", "sweep.svg", "report.html"):
        assert (out / name).stat().st_size > 0, name
    doc = json.loads((tmp_path / "s.json").read_text())
    points = {p["key"]: p for p in doc["points"]}
    assert len(points) == 8 and set(doc["front"]) <= set(points)
    valid = [p for p in points.values() if p["valid"]]
    invalid = [p for p in points.values() if not p["valid"]]
    # A 1x8x8 core with the board's 32K inp buffer needs a GEMM instruction wider than
    # 128 bits: invalid, with the reason. Every other block shape keeps every op on the
    # accelerator (activations stay in DRAM whether block_in or block_out is the wider).
    assert invalid and all(p["reason"] for p in invalid)
    assert all("bits" in p["reason"] for p in invalid)
    assert {(p["params"]["block_in"], p["params"]["block_out"]) for p in valid} == {
        (8, 16), (16, 8), (16, 16)}
    for p in valid:
        o = p["objectives"]
        assert o["cycles"] > 0 and o["lut"] > 0 and o["dsp"] > 0 and o["bram"] > 0
        assert o["accelerator_ms"] == pytest.approx(o["cycles"] / (100e3))   # 100 MHz
        # the host's quantize and dequantize are in the latency too
        assert o["host_ms"] > 0
        assert o["latency_ms"] == pytest.approx(o["accelerator_ms"] + o["host_ms"])
    # The best config is a config file the other commands take.
    config = HardwareConfig.from_json(best)
    front = [points[k] for k in doc["front"]]
    assert config.name == min(front, key=lambda p: p["objectives"]["latency_ms"])["config_name"]
    assert main(["run", "digits_cnn", "--sim", "functional", "--config", str(best)]) == 0
    capsys.readouterr()
    # A second run answers every point from the store.
    status, stdout, _ = sweep(capsys, spec_file, "--out", out, "--no-plots")
    assert status == 0 and "8 points (8 from the store)" in stdout


@pytest.mark.parametrize("search", ["nsga2", "tpe"])
def test_cli_flags_make_a_sampled_sweep_without_a_file(tmp_path, capsys, search):
    status, stdout, err = sweep(capsys, "--board", "pynq-z1", "--model", "digits_cnn:2",
                                "--param", "block_in=8,16", "--param", "block_out=8..16",
                                "--param", "inp_buff_size=8K,16K,32K", "--search", search,
                                "--trials", "6", "--jobs", "1", "--out", tmp_path / "o",
                                "--objectives", "latency_ms,lut,gemm_utilization",
                                "--no-plots")
    assert status == 0, err
    assert f"{search} search over 6 trials of 12 points" in err
    assert "6 points" in stdout


# Slow (a minute or two on two cores: Ray's actors each import vdla and load the models):
# tests/dse/test_execute.py::test_ray_executor_gives_the_same_records runs the executor
# the sweep uses on a local Ray instance against the local one, and the local sweep tests
# here run the same evaluator and the same command line.
@pytest.mark.slow
def test_the_same_sweep_runs_on_ray(tmp_path, capsys, spec_file):
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'vdla[ray]'")
    local, ray = tmp_path / "local", tmp_path / "ray"
    assert sweep(capsys, spec_file, "--out", local, "--no-plots", "--jobs", "1")[0] == 0
    status, stdout, err = sweep(capsys, spec_file, "--out", ray, "--no-plots", "--ray", "local",
                                "--jobs", "2")
    assert status == 0, err
    assert "2 Ray actors on a local Ray instance" in err
    assert "8 points (0 from the store)" in stdout

    def points(folder):
        doc = json.loads((folder / "sweep.json").read_text())
        return {p["key"]: {k: v for k, v in p.items() if k != "seconds"} for p in doc["points"]}

    assert points(local) == points(ray)


def test_evaluation_matches_the_timing_and_resource_models():
    spec = SweepSpec.from_dict({"board": "pynq-z1", "models": [{"name": "digits_cnn", "weight": 3}],
                                "parameters": {"block_in": [16]}})
    evaluator = Evaluator(spec, calibration=1)
    record = evaluator({"block_in": 16})
    config = HardwareConfig.from_dict(record["config"])
    assert config == evaluator.board.config
    from vdla.compiler import pipeline, targets
    target = targets.get("vdla", config=config, dram=evaluator.board.dram_timing())
    model = pipeline.load_model("digits_cnn", calibration=1, note=None)
    cycles = sum(o.cycles or 0 for o in target.estimate(pipeline.quantize_for(model, target)))
    assert record["models"]["digits_cnn"]["cycles"] == cycles
    assert record["objectives"]["cycles"] == 3 * cycles
    assert record["objectives"]["dsp"] == 128 and record["fits"] is True
    # The same point has the same key; another config has another.
    assert evaluator.design({"block_in": 16}).key == record["key"]
    assert evaluator.design({"block_in": 8}).key != record["key"]


@pytest.mark.parametrize("args, message", [
    ([], "without a SPEC file, give --board, --model, --param"),
    (["--board", "pynq-z1", "--model", "digits_cnn", "--param", "block_inn=8"],
     "unknown sweep parameter(s) 'block_inn'"),
    (["--board", "pynq-z1", "--model", "digits_cnn", "--param", "block_in=8", "--jobs", "0"],
     "--jobs must be at least 1"),
    (["nope.toml"], "does not exist"),
    (["--board", "pynq-z1", "--model", "nosuch", "--param", "block_in=8"],
     "unknown model 'nosuch'"),
    (["--board", "pynq-z1", "--model", "digits_cnn:0", "--param", "block_in=8"],
     "weight must be a positive number"),
    (["--board", "pynq-z1", "--model", "digits_cnn", "--param", "block_in=8", "--trials", "0"],
     "trials must be a positive integer"),
    (["--board", "pynq-z1", "--model", "digits_cnn", "--param", "block_in=8", "--tune", "-1"],
     "tune must be a non-negative integer"),
    (["--board", "pynq-z1", "--model", "digits_cnn", "--param", "block_in=8",
      "--objectives", "speed"], "speed"),
    (["--board", "pynq-z1", "--model", "digits_cnn", "--param", "block_in=8",
      "--max-latency-ms", "-1"], "max_latency_ms must be a positive number"),
    (["--board", "pynq-z1", "--model", "digits_cnn", "--param", "block_in=8",
      "--confirm", "-1"], "--confirm must be 0 or more"),
    (["--board", "nosuchboard", "--model", "digits_cnn", "--param", "block_in=8"],
     "nosuchboard"),
])
def test_bad_input_is_a_clear_error(tmp_path, capsys, args, message):
    status, _, err = sweep(capsys, *args, "--out", tmp_path / "o")
    assert status == 1 and message in err


def test_tune_measures_each_points_convolutions_and_keeps_the_records(tmp_path, capsys):
    import sqlite3
    args = ["--board", "pynq-z1", "--model", "digits_cnn", "--param", "block_in=16",
            "--param", "acc_buff_size=64K,128K", "--no-plots"]
    status, plain, _ = sweep(capsys, *args, "--out", tmp_path / "plain")
    assert status == 0
    status, tuned, err = sweep(capsys, *args, "--out", tmp_path / "tuned", "--tune", "3")
    assert status == 0, err
    with sqlite3.connect(tmp_path / "tuned" / "tune.db") as db:
        rows = db.execute("SELECT backend, status FROM measurements").fetchall()
    # digits_cnn: 3 convolutions and a dense layer, 3 trials each, on both configs (their
    # acc buffers differ, so their platforms differ).
    assert len(rows) == 2 * 4 * 3 and {r for r in rows} == {("functional", "ok")}
    doc = {p["config_name"]: p for p in json.loads(
        (tmp_path / "tuned" / "sweep.json").read_text())["points"]}
    base = {p["config_name"]: p for p in json.loads(
        (tmp_path / "plain" / "sweep.json").read_text())["points"]}
    for name, point in doc.items():
        # The default schedule is measured first, so tuning is never slower.
        assert point["objectives"]["cycles"] <= base[name]["objectives"]["cycles"]
        assert point["key"] != base[name]["key"]


@pytest.mark.parametrize("spec_name, models, expected", [
    (None, ["small_cnn"], "sweep-small_cnn-pynq-z1"),
    (None, ["small_cnn", "nets/My Net.onnx"], "sweep-small_cnn+My_Net-pynq-z1"),
    ("sweep", ["small_cnn"], "sweep-small_cnn-pynq-z1"),            # sweep.toml
    ("sweep_resnet18_pynq", ["resnet18"], "sweep-resnet18_pynq-pynq-z1"),
    ("sweep-small", ["small_cnn"], "sweep-small-pynq-z1"),
    ("small-pynq-z1", ["small_cnn"], "sweep-small-pynq-z1"),
])
def test_the_default_output_folder_names_the_spec_or_models_and_the_board(
        spec_name, models, expected):
    from vdla.cli.sweep import _default_out
    data = {"board": "pynq-z1", "models": models, "parameters": {"block_in": [16]}}
    spec = SweepSpec.from_dict(data, **({"name": spec_name} if spec_name else {}))
    assert str(_default_out(spec)) == expected


def test_without_out_the_folder_is_named_after_the_models_and_board(tmp_path, capsys,
                                                                    monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, stdout, err = sweep(capsys, "--board", "pynq-z1", "--model", "small_cnn",
                                "--param", "block_in=16", "--no-plots", "--jobs", "1")
    assert status == 0, err
    assert [p.name for p in tmp_path.iterdir()] == ["sweep-small_cnn-pynq-z1"]
    assert "wrote sweep-small_cnn-pynq-z1/front.md" in stdout
    assert "sweep small_cnn-pynq-z1: 1 model(s)" in err            # not "sweep sweep"


@pytest.mark.parametrize("params", [
    ["block_in=16"],                                   # one point
    ["block_in=16", "acc_buff_size=128K"],             # nothing varies
    ["acc_buff_size=64K,128K"],                        # one swept parameter
])
def test_a_sweep_of_one_point_or_one_parameter_reports_plots_and_writes_best(
        tmp_path, capsys, params):
    out, best = tmp_path / "o", tmp_path / "best.json"
    status, stdout, err = sweep(capsys, "--board", "pynq-z1", "--model", "small_cnn",
                                *(a for p in params for a in ("--param", p)), "--jobs", "1",
                                "--out", out, "--best", best)
    assert status == 0, err
    for name in ("front.md", "sweep.json", "sweep.png", "sweep.svg", "report.html"):
        assert (out / name).stat().st_size > 0, name
    assert HardwareConfig.from_json(best).block_in == 16
    # The table shows the parameters asked for even when none of them varies.
    header = next(line for line in stdout.splitlines() if line.startswith("config"))
    for p in params:
        assert p.partition("=")[0] in header


@pytest.mark.parametrize("param, message", [
    ("alu_ops=MIN", "alu_ops = \"MIN\": HardwareConfig.alu_ops must be a collection of ALU "
                    "operation names (MIN, MAX, ADD, SHR, MUL, REQ, TAB, DIV), not 'MIN'"),
    ("acc_buff_size=-32K", "acc_buff_size = -32768: HardwareConfig.acc_buff_size must be a "
                           "power of two from 1 to 67108864, not -32768"),
])
def test_a_bad_value_is_refused_before_anything_is_evaluated(tmp_path, capsys, param,
                                                             message):
    status, stdout, err = sweep(capsys, "--board", "pynq-z1", "--model", "small_cnn",
                                "--param", "block_in=8,16", "--param", param,
                                "--out", tmp_path / "o")
    assert status == 1 and message in err, err
    assert "evaluating" not in err and not (tmp_path / "o").exists()


def test_a_misspelt_op_in_a_spec_file_is_refused(tmp_path, capsys):
    path = tmp_path / "ops.toml"
    path.write_text(SPEC + 'alu_ops = [["MIN", "MAX", "ADD", "SHR"], '
                    '["MIN", "MAX", "ADD", "SHR", "MULT"]]\n')
    status, _, err = sweep(capsys, path, "--out", tmp_path / "o")
    assert status == 1 and "alu_ops has unknown operation 'MULT'" in err, err
    assert not (tmp_path / "o").exists()


def test_progress_says_no_eta_until_points_are_evaluated(tmp_path, capsys):
    from vdla.cli.sweep import _duration
    assert _duration(0.2) == "1s" and _duration(59.5) == "1m00s" and _duration(61) == "1m01s"
    args = ["--board", "pynq-z1", "--model", "small_cnn", "--param", "block_in=8,16",
            "--param", "acc_buff_size=16K,32K,64K,128K", "--out", tmp_path / "o",
            "--no-plots", "--jobs", "2"]
    status, _, err = sweep(capsys, *args)
    assert status == 0, err
    lines = [line for line in err.splitlines() if "sweep [" in line]
    assert "ETA" not in lines[0] and not any("ETA 0s" in line for line in lines)
    # Answered from the store, points take no time: no rate to extrapolate from.
    status, stdout, err = sweep(capsys, *args)
    assert status == 0 and "8 points (8 from the store)" in stdout
    assert "ETA" not in err


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sweep_small_cnn.toml"


def test_the_example_spec_has_a_front_and_a_best_config(tmp_path, capsys):
    out, best = tmp_path / "o", tmp_path / "best.json"
    status, stdout, err = sweep(capsys, EXAMPLE, "--out", out, "--best", best, "--no-plots")
    assert status == 0, err
    assert "16 points (0 from the store)" in stdout and "no point on the front" not in stdout
    spec = SweepSpec.from_toml(EXAMPLE)
    config = HardwareConfig.from_json(best)
    doc = json.loads((out / "sweep.json").read_text())
    chosen = next(p for p in doc["points"] if p["config_name"] == config.name)
    assert chosen["key"] in doc["front"] and chosen["fits"]
    assert chosen["objectives"]["latency_ms"] <= spec.max_latency_ms
    # A bound no point meets: every report is still written, and --best says which
    # bound removed every point and how fast the fastest one is.
    empty = tmp_path / "empty"
    status, stdout, err = sweep(capsys, EXAMPLE, "--out", empty, "--store", out / "sweep.db",
                                "--max-latency-ms", "0.3", "--best", tmp_path / "none.json",
                                "--json", tmp_path / "s.json")
    assert status == 1
    why = re.search(r"no point meets max_latency_ms = 0.3; the fastest valid point that fits "
                    r"the part, (\S+), takes ([\d.]+) ms", err)
    assert why and why.group(1) == config.name, err
    assert float(why.group(2)) == pytest.approx(chosen["objectives"]["latency_ms"], rel=1e-2)
    assert "no point on the front: no point meets max_latency_ms = 0.3" in stdout
    for name in ("front.md", "sweep.json", "sweep.png", "sweep.svg", "report.html"):
        assert (empty / name).stat().st_size > 0, name
    assert json.loads((tmp_path / "s.json").read_text())["front"] == []
    assert not (tmp_path / "none.json").exists()
    # Every output went through a temporary file renamed into place; none is left over.
    assert not [p for p in (*out.iterdir(), *empty.iterdir(), *tmp_path.iterdir())
                if p.name.endswith(".tmp")]


def test_an_empty_front_names_the_constraint_that_emptied_it():
    from vdla.cli.sweep import _why_no_front
    spec = SweepSpec.from_toml(EXAMPLE)

    def point(name, latency, lut):
        return {"valid": True, "config_name": name, "objectives": {"latency_ms": latency},
                "utilization": {"lut": lut, "ff": 0.1, "dsp": 0.5, "bram": 0.2}}

    invalid = {"valid": False, "reason": "x"}
    assert "none of the 2 point(s) is valid" in _why_no_front([invalid, invalid], spec, "p")
    over = [point("a", 0.5, 1.3), point("b", 0.4, 1.1)]
    assert _why_no_front(over, spec, "xc7z020") == (
        "no valid point fits xc7z020 (constraint fits = true); the smallest, b, needs 110% "
        "of its LUT")
    slow = [point("a", 1.5, 0.9), point("b", 1.2, 1.1)]
    assert "the fastest valid point that fits the part, a, takes 1.5 ms" in _why_no_front(
        slow, spec, "p")
    assert "the fastest valid point, b, takes 1.2 ms" in _why_no_front(
        slow, spec.replace(fits=False), "p")


@pytest.mark.parametrize("flag", ["--best", "--json", "--store"])
def test_an_output_file_in_a_missing_folder_is_refused_before_the_sweep(tmp_path, capsys,
                                                                         flag):
    """Refused once the command line has parsed (`output_file`), a bad value (exit 1),
    before any evaluation."""
    target = tmp_path / "nope" / "f.json"
    args = ["--board", "pynq-z1", "--model", "small_cnn", "--param", "block_in=16",
            "--out", tmp_path / "o", flag]
    status, _, err = sweep(capsys, *args, target)
    assert status == 1
    assert err.startswith(f"vdla: error: {flag}: cannot write {str(target)!r}: "
                          f"{str(tmp_path / 'nope')!r} does not exist")
    assert "evaluating" not in err and not (tmp_path / "o").exists()
    assert not (tmp_path / "nope").exists()
    # A folder where a file is wanted.
    status, _, err = sweep(capsys, *args, tmp_path)
    assert status == 1 and f"vdla: error: {flag}: {str(tmp_path)!r} is a folder" in err


def test_an_out_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "o").write_text("")
    status, _, err = sweep(capsys, "--board", "pynq-z1", "--model", "small_cnn",
                           "--param", "block_in=16", "--out", tmp_path / "o")
    assert status == 1 and f"--out {tmp_path / 'o'} is a file, not a folder" in err


def test_confirm_with_an_empty_front_confirms_nothing(tmp_path, capsys):
    status, stdout, err = sweep(capsys, "--board", "pynq-z1", "--model", "small_cnn",
                                "--param", "block_in=16", "--max-latency-ms", "0.01",
                                "--confirm", "2", "--no-plots", "--out", tmp_path / "o")
    assert status == 0, err
    assert "no point on the front: no point meets max_latency_ms = 0.01" in stdout
    assert "no point to confirm" in err


def test_a_sweep_without_a_valid_point_still_writes_every_report(tmp_path, capsys):
    out = tmp_path / "o"
    status, stdout, err = sweep(capsys, "--board", "pynq-z1", "--model", "small_cnn",
                                "--param", "block_out=8", "--out", out, "--jobs", "1")
    assert status == 0, err
    assert "no point on the front: none of the 1 point(s) is valid" in stdout
    for name in ("front.md", "sweep.json", "sweep.png", "sweep.svg", "report.html"):
        assert (out / name).stat().st_size > 0, name
    reason = json.loads((out / "sweep.json").read_text())["points"][0]["reason"]
    assert html.escape(reason) in (out / "report.html").read_text()
