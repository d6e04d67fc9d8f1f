"""`vdla run MODEL`: compile a zoo or ONNX model for a target, run it (the accelerator on
the functional and Verilator backends, or the host), check it bit-exactly against the
quantized reference, print the per-op table, write the JSON report; and its errors."""

import json
import re

import pytest

import vdla
from vdla import cli
from vdla.cli import main
from vdla.cli.target_args import DEFAULT_TARGET, make_target
from vdla.compiler import pipeline, zoo

from onnx_testing import dynamic_batch_model

CFG = vdla.HardwareConfig()
#: Every op's fields in the JSON report, whatever the target (`OpStats`).
OP_KEYS = {"name", "op", "target", "reason", "schedule", "wall_seconds", "cycles", "macs",
           "bytes", "extra", "device_seconds", "device_time"}
REPORT_KEYS = {"model", "target", "options", "board", "input", "batch", "quantization",
               "bit_exact", "mismatch", "cycles", "seconds_at_clock", "gemm_utilization",
               "quantize_seconds", "compile_seconds", "wall_seconds", "summary", "records",
               "tuned_ops", "ops", "precision", "max_error", "whole_graph_seconds",
               "whole_graph_op_seconds", "whole_graph_layout_seconds", "host", "transfers", "end_to_end_seconds",
               "device_seconds", "device_time", "ops_on_target", "parallel",
               "simulate_seconds"}


def run_json(tmp_path, capsys, *args: str) -> tuple[dict, str]:
    """`vdla run ... --json`; returns (the JSON report, stdout)."""
    out = tmp_path / "report" / "out.json"
    out.parent.mkdir(exist_ok=True)     # an output file's folder must exist
    assert main(["run", *args, "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return json.loads(out.read_text()), captured.out


def test_digits_on_functional_writes_the_report(tmp_path, capsys):
    report, out = run_json(tmp_path, capsys, "digits_cnn", "--sim", "functional")
    assert set(report) == REPORT_KEYS
    assert report["model"] == "digits_cnn" and report["target"] == "vdla"
    assert report["options"]["backend"] == "functional"
    assert report["options"]["config"] == CFG.name and report["bit_exact"] is True
    assert report["cycles"] is None and report["seconds_at_clock"] is None
    assert report["quantization"] == "shift" and report["summary"]["vdla"]["cycles"] is None
    ops = report["ops"]
    assert all(set(op) == OP_KEYS for op in ops)
    assert [op["target"] for op in ops] == [
        "host", "vdla", "vdla", "vdla", "vdla", "vdla", "vdla", "host"]
    vdla_ops = [op for op in ops if op["target"] == "vdla"]
    # The flatten is a view of its input's DRAM buffer: no program, nothing moved.
    assert [op["op"] for op in vdla_ops if op["schedule"] is None] == ["flatten"]
    assert all(op["bytes"] > 0 and op["schedule"]["tile_h"] >= 1 for op in vdla_ops
               if op["op"] != "flatten")
    assert all(op["cycles"] is None for op in ops if op["op"] != "flatten")
    # The host moved the quantized image in and the logits out, nothing between ops.
    host = report["host"]
    assert host["ops"] == 2 and host["transfers"] == 2 and host["between_transfers"] == 0
    assert [(t["direction"], t["between"]) for t in report["transfers"]] == [
        ("to_target", False), ("to_host", False)]
    assert report["transfers"][0]["bytes"] == 64 * 16   # 8x8 pixels, one channel block
    assert report["end_to_end_seconds"] is None
    assert "between vdla ops: no host work" in out and report["ops_on_target"] == 6
    # Each op that fell back to the host, with its reason, under the table (it was only
    # in the JSON).
    footnote = out[out.index("ops on the host (why):"):].splitlines()[1:3]
    assert [line.split(None, 1) for line in footnote] == [
        [op["name"], op["reason"]] for op in ops if op["target"] == "host"]

    lines = out.splitlines()
    assert lines[0].startswith("digits_cnn: 8 ops (6 on vdla, 2 on the host)")
    assert "functional backend" in lines[0] and "test image 0" in lines[0]
    assert lines[1].split()[:4] == ["op", "kind", "on", "schedule"]
    conv = next(line for line in lines if "/features/features.0/Conv" in line).split()
    assert conv[1:3] == ["qconv2d", "vdla"] and conv[3].startswith("h")
    quant = next(line for line in lines if "input_quantize" in line).split()
    # schedule, cycles, wall ms, GOP/s (none: the host's quantize does no MACs), ...
    assert quant[1:5] == ["quantize", "host", "-", "-"] and float(quant[5]) >= 0
    assert quant[6:] == ["-", "-", "-"]
    pool = next(line for line in lines if "MaxPool" in line).split()
    assert pool[1:3] == ["max_pool2d", "vdla"] and pool[5] == "c1" and pool[9] == "-"
    # A simulated op's wall time is the simulator's: no GOP/s for it.
    # The schedule is a few tokens (h8 w8 ci1 co1, then oc2 or ht2 with two threads).
    last = max(i for i, token in enumerate(conv)
               if re.fullmatch(r"(h|w|ci|co|oc|ht)\d+", token))
    assert conv[last + 3] == "-"
    assert "bit-exact vs the quantized reference: yes" in out
    assert "total cycles: -" in out
    # No cycles, so no whole-model utilization; the useful MACs are still counted.
    assert report["gemm_utilization"] is None and report["batch"] == 1
    assert report["summary"]["vdla"]["macs"] == sum(op["macs"] for op in vdla_ops)
    assert "GEMM utilization: - (the functional backend counts no cycles)" in out


def test_digits_on_verilator(tmp_path, capsys):
    report, out = run_json(tmp_path, capsys, "digits_cnn", "--sim", "verilator", "--seed", "7")
    assert report["options"]["backend"] == "verilator" and report["bit_exact"] is True
    cycles = [op["cycles"] for op in report["ops"]
              if op["target"] == "vdla" and op["op"] != "flatten"]
    assert len(cycles) == 5 and all(c > 0 for c in cycles)
    assert report["cycles"] == sum(cycles)
    assert report["seconds_at_clock"] == pytest.approx(report["cycles"] / (CFG.clock_mhz * 1e6))
    for op in report["ops"]:
        if op["target"] == "vdla":   # a pool does no useful MACs: no GEMM utilization
            util = op["extra"]["gemm_utilization"]
            assert util is None if op["op"] in ("max_pool2d", "flatten") else 0 < util <= 1
    assert "test image 7" in out
    assert f"total cycles: {report['cycles']:,} = " in out and "at 100 MHz" in out
    # End to end: the accelerator's time at its clock plus the host's.
    assert report["end_to_end_seconds"] == pytest.approx(
        report["seconds_at_clock"] + report["host"]["seconds"])
    assert "end to end: " in out
    # The whole model's GEMM utilization: useful MACs over the accelerator's cycles (all
    # its ops, pools included; host ops excluded) times the peak MACs per cycle.
    macs = sum(op["macs"] for op in report["ops"] if op["target"] == "vdla")
    util = macs / (report["cycles"] * CFG.batch * CFG.block_in * CFG.block_out)
    assert report["gemm_utilization"] == pytest.approx(util) and 0 < util < 1
    assert report["summary"]["vdla"]["gemm_utilization"] == report["gemm_utilization"]
    assert (f"GEMM utilization: {util:.1%} = {macs:,} useful MACs / ({report['cycles']:,} "
            f"cycles x 256 MACs/cycle); the cycles of the ops on vdla only, host ops "
            f"excluded") in out


def test_onnx_path(tmp_path, capsys):
    path = tmp_path / "small.onnx"
    assert main(["export", "small_cnn", "-o", str(path)]) == 0
    capsys.readouterr()
    report, out = run_json(tmp_path, capsys, str(path), "--sim", "functional",
                           "--calibration", "2")
    assert report["model"] == str(path) and report["bit_exact"] is True
    assert {op["op"] for op in report["ops"] if op["target"] == "vdla"} == {
        "qconv2d", "max_pool2d", "qavg_pool2d", "flatten", "qdense"}


def test_a_dynamic_batch_is_noted_and_set_by_batch(tmp_path, capsys):
    """An ONNX model with a symbolic batch runs with batch 1 and says so on stderr;
    --batch N sets it (and the note says so); a fixed batch is not overridden."""
    path = dynamic_batch_model(tmp_path / "dyn.onnx")
    out = tmp_path / "r.json"
    assert main(["run", path, "--sim", "functional", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ("vdla: input 'x' has a dynamic batch dimension 'N'; using batch 1 "
                            "(vdla run --batch sets it)\n")
    one = json.loads(out.read_text())
    assert one["batch"] == 1 and one["bit_exact"] is True

    assert main(["run", path, "--sim", "functional", "--batch", "3", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err == "vdla: input 'x' has a dynamic batch dimension 'N'; using batch 3\n"
    three = json.loads(out.read_text())
    assert three["batch"] == 3 and three["bit_exact"] is True and "batch 3" in three["input"]
    conv = [op["macs"] for op in three["ops"] if op["op"] == "qconv2d"]
    assert conv == [3 * op["macs"] for op in one["ops"] if op["op"] == "qconv2d"]
    assert "standard-normal input, seed 0, batch 3" in captured.out

    fixed = dynamic_batch_model(tmp_path / "fixed.onnx", fixed_batch=1)
    err = error_of(capsys, fixed, "--sim", "functional", "--batch", "2")
    assert "graph input 'x' of" in err and "has a fixed batch of 1" in err
    assert main(["run", fixed, "--sim", "functional"]) == 0
    assert capsys.readouterr().err == ""                 # nothing dynamic, nothing noted


def test_batch_builds_a_zoo_model_with_it(tmp_path, capsys):
    report, out = run_json(tmp_path, capsys, "digits_cnn", "--sim", "functional", "--batch", "2",
                           "--seed", "3")
    assert report["batch"] == 2 and report["bit_exact"] is True
    assert "2 test images of the digits split from image 3 (labels " in out


def test_a_target_that_runs_no_op_says_so(tmp_path, capsys):
    """float32 on the accelerator (int8 only): every op falls back to the host. The run
    printed "between vdla ops: no host work (activations stay in vdla's memory...)" as if
    vdla had run them; now a warning says it ran none and why. Exit status 0: the model
    ran, on the host, and matched the float reference."""
    path = tmp_path / "r.json"
    assert main(["run", "small_cnn", "--sim", "functional", "--precision", "float32",
                 "--json", str(path)]) == 0
    out, err = capsys.readouterr()
    report = json.loads(path.read_text())
    assert "Traceback" not in err
    assert report["bit_exact"] is True and report["ops_on_target"] == 0
    assert ("vdla: warning: vdla ran no op: every op fell back to the host (float conv2d: "
            "the accelerator computes on int8 data only; and ") in err
    assert "--precision int8 (the default) runs the quantized graph" in err
    assert "between vdla ops" not in out and "total cycles" not in out
    assert "ops on the host (why):" in out
    assert "conv1    float conv2d: the accelerator computes on int8 data only" in out


def test_the_host_target_reports_the_same_keys(tmp_path, capsys):
    """`--target host`: the whole model on the reference kernels; its JSON report has
    exactly the keys of the accelerator's, per op too."""
    host, out = run_json(tmp_path, capsys, "digits_cnn", "--target", "host")
    accel, _ = run_json(tmp_path, capsys, "digits_cnn", "--sim", "functional")
    assert set(host) == set(accel) == REPORT_KEYS
    assert all(set(op) == OP_KEYS for op in host["ops"] + accel["ops"])
    assert host["target"] == "host" and host["bit_exact"] is True and host["cycles"] is None
    assert host["gemm_utilization"] is None and "GEMM utilization" not in out
    assert host["options"] == {} and host["quantization"] == "multiply"
    assert {op["target"] for op in host["ops"]} == {"host"}
    assert "8 ops (all on the host), target host" in out


def test_default_target_and_backend():
    args = cli.build_parser().parse_args(["run", "resnet18"])
    assert args.target == DEFAULT_TARGET == "vdla"
    assert args.sim is None
    target = make_target(args.target, args, "run")
    assert target.options()["backend"] == "verilator" and target.board is None
    assert (args.seed, args.calibration, args.json, args.config) == (0, 4, None, None)
    assert args.batch is None


def error_of(capsys, *args: str) -> str:
    assert main(["run", *args]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("vdla: error: ") and "Traceback" not in captured.err
    return captured.err


def test_ops_in_parallel_give_the_sequential_report(tmp_path, capsys):
    """--jobs 2 simulates the ops in two worker processes: the same per-op cycles, bytes
    and totals as --jobs 1, and the report says where they ran."""
    one, _ = run_json(tmp_path, capsys, "digits_cnn", "--sim", "verilator", "--jobs", "1")
    two, out = run_json(tmp_path, capsys, "digits_cnn", "--sim", "verilator", "--jobs", "2")
    assert one["parallel"] is None and two["parallel"] == "2 local processes"
    assert re.search(r"s wall \(ops on 2 local processes: \d+\.\d\d s\)", out)
    assert 0 < two["simulate_seconds"] <= two["wall_seconds"]
    for key in ("cycles", "gemm_utilization", "bit_exact", "summary"):
        assert one[key] == two[key], key
    assert ([(op["name"], op["cycles"], op["bytes"]) for op in one["ops"]]
            == [(op["name"], op["cycles"], op["bytes"]) for op in two["ops"]])


def test_errors(tmp_path, capsys):
    err = error_of(capsys, "resnet19", "--sim", "functional")
    assert "unknown model 'resnet19'" in err
    assert all(name in err for name in zoo.names())
    missing = tmp_path / "nope.onnx"
    err = error_of(capsys, str(missing), "--sim", "functional")
    assert f"ONNX file '{missing}' does not exist" in err
    assert "--calibration must be a positive integer, not 0" in error_of(
        capsys, "digits_cnn", "--sim", "functional", "--calibration", "0")
    assert "--seed must be a non-negative integer, not -1" in error_of(
        capsys, "digits_cnn", "--sim", "functional", "--seed", "-1")
    assert "cannot read" in error_of(capsys, "digits_cnn", "--config", str(tmp_path / "c.json"))
    assert "--batch must be a positive integer, not 0" in error_of(
        capsys, "digits_cnn", "--sim", "functional", "--batch", "0")
    assert "--jobs must be a positive integer, not 0" in error_of(
        capsys, "digits_cnn", "--jobs", "0")
    assert "--chain cuts the ops among several workers: give --jobs N > 1 or --ray" in error_of(
        capsys, "digits_cnn", "--jobs", "1", "--chain")
    pytest.importorskip("ray")
    assert "--ray auto: no Ray cluster found" in error_of(capsys, "digits_cnn", "--ray", "auto")
    assert "unknown target 'gpu0'; available: vdla, host" in error_of(
        capsys, "digits_cnn", "--target", "gpu0")
    assert "--sim, --board apply to --target vdla, not to --target host" in error_of(
        capsys, "digits_cnn", "--target", "host", "--sim", "functional", "--board", "pynq-z1")


def test_a_mismatch_names_the_output_and_the_first_differing_op():
    """The bit-exactness check itself, on the reference's own values with one changed."""
    import numpy as np

    from vdla.compiler import passes, quantize, run_reference
    from vdla.compiler.frontend.datasets import digits_split

    x_train, _, x_test, _ = digits_split()
    graph = quantize(passes.prepare(zoo.get("digits_cnn")), {"input": x_train[:4, None]}, "shift")
    values = run_reference(graph, {"input": x_test[:1]}, keep=True)
    assert pipeline.check(dict(values), values, graph) == (True, "")
    changed = dict(values)
    conv = graph.node("/features/features.7/Conv").outputs[0]
    changed[conv] = values[conv].copy()
    changed[conv].flat[0] ^= 1
    logits = graph.outputs[0]
    changed[logits] = values[logits] + np.float32(1)
    ok, detail = pipeline.check(changed, values, graph)
    assert not ok
    assert f"output {logits!r}: 10 of 10 values differ" in detail
    assert "first differing op: '/features/features.7/Conv' (qconv2d)" in detail
