"""`vdla compare MODEL --reference onnxruntime,openvino`: OpenVINO's columns beside
onnxruntime's (the same float and QDQ int8 files, the same threads), labelled as
references; `--onnxruntime` is `--reference onnxruntime`; unknown or uninstalled
references are clear errors."""

from __future__ import annotations

import importlib.util
import json

import pytest

from vdla.cli import main


def test_openvino_columns_beside_onnxruntimes(tmp_path, capsys):
    pytest.importorskip("openvino", reason="the openvino extra is not installed")
    pytest.importorskip("onnxruntime", reason="the openvino extra is not installed")
    chart, out = tmp_path / "c.png", tmp_path / "c.json"
    # --onnxruntime and --reference add up; the columns come in --reference's order.
    assert main(["compare", "digits_cnn", "--targets", "cpu", "--threads", "1",
                 "--reference", "openvino", "--onnxruntime", "--runs", "2",
                 "--chart", str(chart), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert ("on cpu, onnxruntime fp32, onnxruntime int8, openvino fp32, openvino int8"
            in text)
    assert "openvino fp32 (ref.)" in text and "openvino int8 (ref.)" in text
    assert "its CPU plugin" in text and "inference precision f32" in text
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(out.read_text())
    assert doc["outputs_identical"] and doc["targets"]["cpu"]["bit_exact"]
    columns = doc["targets"]
    for key in ("openvino fp32", "openvino int8"):
        column = columns[key]
        assert column["reference"] and column["bit_exact"] is None
        assert column["groups"]["conv"] > 0 and column["wall_seconds"] > 0
        assert column["total_seconds"] == pytest.approx(sum(column["groups"].values()))
        assert column["options"]["threads"] == 1
        assert column["options"]["inference_precision"] == "f32"
    # The same files as onnxruntime's columns: the exported model and its QDQ int8.
    assert columns["openvino fp32"]["options"]["variant"] == "fp32"
    assert columns["openvino int8"]["options"]["variant"] == "int8-qdq-u8"
    assert columns["onnxruntime int8"]["options"]["variant"] == "int8-qdq-u8"
    assert columns["openvino fp32"]["options"]["layer_precisions"] == {"f32": 4}  # 3 conv, 1 dense
    assert set(columns["openvino int8"]["options"]["layer_precisions"]) <= {"u8", "i8"}
    assert columns["openvino fp32"]["max_error"] < 1e-4
    assert 0 < columns["openvino int8"]["max_error"] < 0.5    # its own quantization


def test_references_are_checked(capsys, monkeypatch):
    assert main(["compare", "digits_cnn", "--targets", "cpu", "--reference", "tvm"]) == 1
    assert ("--reference: unknown reference(s) tvm; available: onnxruntime, openvino"
            in capsys.readouterr().err)
    assert main(["compare", "digits_cnn", "--targets", "cpu", "--reference", ","]) == 1
    assert "--reference: unknown reference(s) (none)" in capsys.readouterr().err
    # Without the extra, the flag says what to install (whether or not it is here).
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "openvino" else find_spec(name, *a))
    assert main(["compare", "digits_cnn", "--targets", "cpu", "--reference",
                 "onnxruntime,openvino"]) == 1
    assert ("--reference openvino: openvino is not installed (pip install "
            "'vdla[openvino]')" in capsys.readouterr().err)
