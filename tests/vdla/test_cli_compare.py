"""`vdla compare MODEL`: one quantized model on every target, outputs checked, time per op
group in a table, JSON and a chart."""

from __future__ import annotations

import json

import pytest

from vdla.cli import main


def test_digits_on_every_target(tmp_path, capsys):
    chart, out = tmp_path / "c.png", tmp_path / "c.json"
    assert main(["compare", "digits_cnn", "--targets", "vdla,cpu,gpu,host", "--chart",
                 str(chart), "--json", str(out), "--threads", "1"]) == 0
    text = capsys.readouterr().out
    assert "on vdla, cpu, gpu, gpu est., host" in text and "bit-exact" in text
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 10_000
    doc = json.loads(out.read_text())
    assert set(doc["targets"]) == {"vdla", "cpu", "gpu", "gpu est.", "host"}
    for name, result in doc["targets"].items():
        assert result["bit_exact"], (name, result["mismatch"])
        assert result["groups"]["conv"] > 0
        assert abs(sum(result["groups"].values()) - result["total_seconds"]) < 1e-9
    from vdla.compiler.targets.cpu.isa import detect
    assert doc["targets"]["cpu"]["options"] == {"threads": 1, "isa": detect().name}


def test_the_default_targets_leave_out_the_gpu_interpreter(tmp_path, capsys):
    """Without --targets: the accelerator, the CPU and the host; the GPU target only where
    it runs on a CUDA GPU, with a note saying why it is not there otherwise."""
    pytest.importorskip("triton", reason="the gpu extra is not installed")
    from vdla.compiler.targets.gpu import runtime

    out = tmp_path / "c.json"
    assert main(["compare", "digits_cnn", "--chart", str(tmp_path / "c.png"), "--json",
                 str(out), "--threads", "1"]) == 0
    captured = capsys.readouterr()
    targets = set(json.loads(out.read_text())["targets"])
    if runtime.auto_mode() == "cuda":
        assert targets == {"vdla", "cpu", "gpu", "gpu est.", "host"}
    else:
        assert targets == {"vdla", "cpu", "host"}
        assert "note: no gpu column (no CUDA GPU here; Triton's interpreter" in captured.err
        assert "name gpu in --targets to add it" in captured.err
    # Named, the interpreter's column joins (test_digits_on_every_target runs it).


def test_unknown_targets_and_bad_threads_are_clear_errors(tmp_path, capsys):
    assert main(["compare", "digits_cnn", "--targets", "cpu,tpu"]) == 1
    assert "unknown target(s) tpu" in capsys.readouterr().err
    assert main(["compare", "digits_cnn", "--threads", "0"]) == 1
    assert "--threads must be a positive integer" in capsys.readouterr().err
    assert main(["compare", "digits_cnn", "--calibration", "0"]) == 1
    assert "--calibration must be a positive integer" in capsys.readouterr().err
    assert main(["compare", "digits_cnn", "--seed", "-1"]) == 1
    assert "--seed must be a non-negative integer" in capsys.readouterr().err
    assert main(["compare", "nosuch"]) == 1
    assert "unknown model 'nosuch'" in capsys.readouterr().err


def test_board_times_the_accelerator_at_its_clock(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert main(["compare", "digits_cnn", "--board", "pynq-z1", "--targets", "vdla,cpu",
                 "--chart", str(tmp_path / "c.png"), "--json", str(out),
                 "--threads", "1"]) == 0
    text = capsys.readouterr().out
    assert "cycles at 100 MHz (pynq-z1)" in text and "same outputs" in text
    # The ops that fell back to the host, and why, under the table (once only in JSON).
    assert text.count("ops on the host in the ") == 1    # not the cpu's: it runs them all
    doc = json.loads(out.read_text())
    host_ops = doc["targets"]["vdla"]["ops_on_host"]
    assert sorted(host_ops.values()) == ["float -> int conversion runs on the host",
                                         "int -> float conversion runs on the host"]
    assert "ops on the host in the vdla column:\n" + "".join(
        f"  {op}: {reason}\n" for op, reason in host_ops.items()) in text
    assert doc["targets"]["cpu"]["ops_on_host"] == {}
    assert doc["board"] == "pynq-z1" and doc["outputs_identical"] is True
    assert main(["compare", "digits_cnn", "--board", "pynq-z1", "--targets", "cpu"]) == 1
    assert "--board applies to --target vdla, not to --target cpu" in capsys.readouterr().err


def test_onnxruntime_reference_columns(tmp_path, capsys, monkeypatch):
    """onnxruntime float32 and its own QDQ int8 as columns beside the targets': timed per
    op group, labelled as references, never counted as bit-exact or mismatching."""
    chart, out = tmp_path / "c.png", tmp_path / "c.json"
    assert main(["compare", "digits_cnn", "--targets", "cpu", "--threads", "1",
                 "--onnxruntime", "--runs", "2", "--chart", str(chart),
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "onnxruntime fp32 (ref.)" in text and "onnxruntime int8 (ref.)" in text
    assert "a reference implementation whose numerics differ from vdla's" in text
    doc = json.loads(out.read_text())
    assert doc["outputs_identical"] and doc["targets"]["cpu"]["bit_exact"]
    for key in ("onnxruntime fp32", "onnxruntime int8"):
        column = doc["targets"][key]
        assert column["reference"] and column["bit_exact"] is None
        assert column["groups"]["conv"] > 0 and column["wall_seconds"] > 0
        assert column["options"]["threads"] == 1
    assert doc["targets"]["onnxruntime fp32"]["max_error"] < 1e-4
    assert doc["targets"]["onnxruntime int8"]["max_error"] > 0     # its own quantization
    # --runs is checked; without onnxruntime the flag says what to install.
    assert main(["compare", "digits_cnn", "--targets", "cpu", "--onnxruntime",
                 "--runs", "0"]) == 1
    assert "--runs must be a positive integer" in capsys.readouterr().err
    from vdla.compiler import baseline
    monkeypatch.setattr(baseline.importlib.util, "find_spec", lambda name: None)
    assert main(["compare", "digits_cnn", "--targets", "cpu", "--onnxruntime"]) == 1
    assert "pip install 'vdla[onnxruntime]'" in capsys.readouterr().err
