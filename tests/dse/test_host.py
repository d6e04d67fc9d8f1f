"""The sweep's host time model (`vdla.dse.host`): its kinds and work counts, its fit, its
refusal of a malformed calibration file, and a sweep that prices the host's ops, so a
config whose ALU table (TAB) moves the GELU onto the accelerator adds cycles and still
ranks faster."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from vdla.compiler.ir.tensor import Node
from vdla.dse.evaluate import Evaluator
from vdla.dse.host import HOST_CALIBRATION, KINDS, HostModel, kind_of, work_of

ROOT = Path(__file__).resolve().parents[2]
BASE = ["MIN", "MAX", "ADD", "SHR"]


def _calibrate_script():
    spec = importlib.util.spec_from_file_location("calibrate_host",
                                                  ROOT / "scripts" / "calibrate_host.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flat(per_op: float = 0.0, per_unit: float = 0.0) -> dict:
    return {k: {"per_op": per_op, "per_unit": {w: per_unit for w in work}}
            for k, work in KINDS.items()}


# --- kinds and work -----------------------------------------------------------------------

def test_kinds_and_work_counts():
    assert kind_of("qsoftmax") == "qsoftmax"
    assert kind_of("qsoftmax", masked=True, causal=True) == "qsoftmax_masked"
    assert kind_of("qsoftmax", causal=True) == "qsoftmax_causal"
    assert kind_of("qdense") == kind_of("qconv2d") == "gemm"
    assert kind_of("transpose") == "layout"
    assert kind_of("tanh") == kind_of("some_new_op") == "elementwise"   # never free
    # softmax and LayerNorm walk their input; a gather its output rows.
    assert work_of("qsoftmax", [(128, 512), (1, 512)], (128, 512)) == {"elements": 65536}
    assert work_of("gather", [(30522, 128), (1, 16)], (1, 16, 128)) == {"elements": 2048}
    assert work_of("qattention", [(1, 2, 8, 4), (1, 2, 16, 4), (1, 2, 16, 4)],
                   (1, 2, 8, 4)) == {"macs": 2 * 8 * 16 * 8, "scores": 2 * 8 * 16}
    assert work_of("qdense", [(10, 64), (32, 64), (32,)], (10, 32)) == {"macs": 10 * 32 * 64}
    assert work_of("qconv2d", [(1, 8, 6, 6), (16, 4, 3, 3)], (1, 16, 4, 4)) == {
        "macs": 16 * 16 * 4 * 9}


def test_a_masked_causal_softmax_costs_the_dearer_of_both():
    coefficients = _flat(per_op=1.0)
    coefficients["qsoftmax_causal"]["per_op"] = 3.0
    model = HostModel(coefficients, {"cpu": "test CPU"})

    class G:
        tensors = {n: type("T", (), {"shape": (4, 4)})() for n in ("x", "m", "y")}

    node = Node("s", "qsoftmax", ["x", "m"], ["y"], {"causal": True})
    assert model.op_seconds(node, G) == 3.0
    assert model.op_seconds(Node("s", "qsoftmax", ["x", "m"], ["y"], {}), G) == 1.0


# --- the fit ------------------------------------------------------------------------------

def test_the_fit_recovers_a_linear_cost():
    fit = _calibrate_script().fit
    samples = [{"work": {"elements": n}, "seconds": 5e-6 + 2e-9 * n}
               for n in (100, 1_000, 10_000, 100_000)]
    result = fit("qgelu", samples)
    assert result["per_op"] == pytest.approx(5e-6, rel=1e-6)
    assert result["per_unit"]["elements"] == pytest.approx(2e-9, rel=1e-6)
    assert result["worst_error"] < 1e-6
    two = [{"work": {"macs": m, "scores": s}, "seconds": 1e-5 + 1e-9 * m + 3e-8 * s}
           for m, s in ((1e5, 1e3), (1e6, 1e3), (1e6, 1e5), (1e7, 1e4))]
    result = fit("qattention", two)
    assert result["per_unit"] == pytest.approx({"macs": 1e-9, "scores": 3e-8}, rel=1e-6)


def test_the_committed_calibration_is_this_models_and_says_whose_host():
    data = json.loads(HOST_CALIBRATION.read_text())
    model = HostModel.load()
    assert model.cpu == data["machine"]["cpu"] and model.cpu.strip()
    assert data["machine"]["numpy_simd"] and data["numpy"] and data["command"]
    for kind, k in data["kinds"].items():
        assert k["samples"], kind
        errors = [abs(model.predict(kind, s["work"]) - s["seconds"]) / s["seconds"]
                  for s in k["samples"]]
        assert max(errors) == pytest.approx(k["worst_error"], rel=1e-6), kind
    # The kinds a transformer leaves on the host cost time, and more for more work.
    for kind in ("qsoftmax", "qlayer_norm", "qgelu", "gather", "quantize", "dequantize"):
        assert model.predict(kind, {"elements": 2 ** 16}) > \
            model.predict(kind, {"elements": 2 ** 10}) > 0, kind


# --- a malformed calibration --------------------------------------------------------------

def _refusal(tmp_path, edit) -> str:
    data = json.loads(HOST_CALIBRATION.read_text())
    edit(data)
    path = tmp_path / "host.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as info:
        HostModel.load(path)
    assert str(path) in str(info.value)
    return str(info.value)


def test_a_malformed_calibration_is_refused_naming_what_is_wrong(tmp_path):
    def negative(d):
        d["kinds"]["qgelu"]["per_unit"]["elements"] = -1e-9

    assert ("kinds.qgelu.per_unit.elements must be a finite number of seconds >= 0, "
            "not -1e-09") in _refusal(tmp_path, negative)

    def missing(d):
        del d["kinds"]["gather"]

    message = _refusal(tmp_path, missing)
    assert "kinds lacks gather" in message and "qsoftmax_masked" in message

    def wrong_work(d):
        d["kinds"]["qattention"]["per_unit"] = {"elements": 1e-9}

    message = _refusal(tmp_path, wrong_work)
    assert "kinds.qattention.per_unit must be an object of macs, scores" in message
    assert "{'elements': 1e-09}" in message

    def text(d):
        d["kinds"]["layout"]["per_op"] = "1us"

    assert "kinds.layout.per_op must be a finite number of seconds >= 0, not '1us'" \
        in _refusal(tmp_path, text)

    def unknown(d):
        d["kinds"]["softmax"] = copy.deepcopy(d["kinds"]["qsoftmax"])

    assert "unknown kind(s) 'softmax'" in _refusal(tmp_path, unknown)

    def no_cpu(d):
        d["machine"]["cpu"] = ""

    assert "machine.cpu must name the CPU" in _refusal(tmp_path, no_cpu)

    def old_format(d):
        d["format"] = 0

    assert "format must be 1, not 0" in _refusal(tmp_path, old_format)

    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a readable JSON file"):
        HostModel.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="no such file .*calibrate_host.py"):
        HostModel.load(tmp_path / "missing.json")


# --- a sweep that prices the host ---------------------------------------------------------

def _spec(model: str) -> dict:
    return {"board": "pynq-z1", "search": "grid", "objectives": ["latency_ms", "lut"],
            "models": [{"name": model}],
            "parameters": {"alu_ops": [BASE, BASE + ["TAB"]]}}


def test_the_alu_table_adds_cycles_and_takes_more_host_time_away():
    evaluator = Evaluator(_spec("bert_tiny"))
    plain, tab = (evaluator({"alu_ops": ops}) for ops in (BASE, BASE + ["TAB"]))
    assert plain["valid"] and tab["valid"]
    p, t = plain["objectives"], tab["objectives"]
    # qgelu on the accelerator: its cycles added, its host time gone, faster overall.
    assert t["cycles"] > p["cycles"] and t["accelerator_ms"] > p["accelerator_ms"]
    assert t["host_ms"] < p["host_ms"]
    assert t["latency_ms"] < p["latency_ms"]
    for o in (p, t):
        assert o["latency_ms"] == pytest.approx(o["accelerator_ms"] + o["host_ms"])
        assert o["accelerator_ms"] == o["cycles"] / 100e3     # pynq-z1's 100 MHz
    m = tab["models"]["bert_tiny"]
    assert m["latency_ms"] == pytest.approx(m["accelerator_ms"] + m["host_ms"])
    assert tab["host_model"]["cpu"] == HostModel.load().cpu
    assert plain["key"] != tab["key"]


def test_every_host_op_is_priced_by_the_model_given():
    # One millisecond an op, whatever it is: host_ms counts the host's ops.
    model = HostModel(_flat(per_op=1e-3), {"cpu": "a test host"})
    evaluator = Evaluator(_spec("bert_tiny"), host_model=model)
    record = evaluator({"alu_ops": BASE})
    m = record["models"]["bert_tiny"]
    assert record["objectives"]["host_ms"] == pytest.approx(m["ops"] - m["ops_on_vdla"])
    assert record["host_model"]["cpu"] == "a test host"
    # Another host model is another store key: records of one are not the other's.
    assert record["key"] != Evaluator(_spec("bert_tiny"))({"alu_ops": BASE})["key"]


def test_a_cnn_pays_its_quantize_and_dequantize():
    spec = {**_spec("small_cnn"), "parameters": {"block_in": [16]}}
    record = Evaluator(spec)({"block_in": 16})
    o = record["objectives"]
    assert record["valid"] and 0 < o["host_ms"] < 0.1 * o["accelerator_ms"]
    assert np.isclose(o["latency_ms"], o["accelerator_ms"] + o["host_ms"])
