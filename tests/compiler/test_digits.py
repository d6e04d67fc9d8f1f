"""The digits data split and the committed trained model: it loads through the zoo, its
float reference accuracy on the test split is what training recorded, and the reference
agrees with onnxruntime on the committed file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vdla.compiler import run_reference, zoo
from vdla.compiler.frontend.datasets import digits_split

ROOT = Path(__file__).resolve().parents[2]
MODEL = zoo.DIGITS_MODEL
RECORD = MODEL.with_suffix(".json")


@pytest.fixture(scope="module")
def split():
    return digits_split()


@pytest.fixture(scope="module")
def record():
    return json.loads(RECORD.read_text())


def test_split_shapes_and_values(split):
    x_train, y_train, x_test, y_test = split
    assert x_train.shape == (1347, 1, 8, 8) and x_test.shape == (450, 1, 8, 8)
    assert y_train.shape == (1347,) and y_test.shape == (450,)
    assert x_train.dtype == x_test.dtype == np.float32
    assert y_train.dtype == y_test.dtype == np.int64
    for x in (x_train, x_test):
        assert x.min() == 0.0 and x.max() == 1.0
        # Pixels were integers 0..16, divided by 16.
        np.testing.assert_array_equal(x * 16, np.rint(x * 16))
    # Stratified: every class has 25% (+- one image) of its images in the test split.
    train_counts, test_counts = np.bincount(y_train), np.bincount(y_test)
    assert len(test_counts) == 10
    assert np.all(np.abs(test_counts - 0.25 * (train_counts + test_counts)) <= 1)


def test_split_is_deterministic(split):
    again = digits_split()
    for a, b in zip(split, again):
        np.testing.assert_array_equal(a, b)


def test_committed_files(record):
    assert MODEL.stat().st_size < 1 << 20 and RECORD.is_file()
    onnx = pytest.importorskip("onnx")
    proto = onnx.load(MODEL)
    assert proto.ir_version <= 13                         # onnxruntime 1.31 reads <= 13
    assert [i.name for i in proto.graph.input] == ["input"]
    assert [o.name for o in proto.graph.output] == ["logits"]
    dims = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 1, 8, 8]
    for key in ("split", "seed", "epochs", "torch_version", "test_accuracy_torch",
                "test_accuracy_onnxruntime"):
        assert key in record, key
    assert record["split"]["test_size"] == 0.25 and record["split"]["random_state"] == 0


def test_zoo_loads_the_trained_model():
    g = zoo.get("digits_cnn")
    g.validate()
    assert g.name == "digits_cnn"
    assert g.inputs == ["input"] and g.outputs == ["logits"]
    assert g.tensors["input"].shape == (1, 1, 8, 8)
    assert g.tensors["logits"].shape == (1, 10)
    assert g.count_ops()["conv2d"] == 3 and g.count_ops()["dense"] == 1


def test_reference_accuracy_is_the_recorded_one(split, record):
    _, _, x_test, y_test = split
    g = zoo.get("digits_cnn", batch=len(x_test))          # the whole test split at once
    assert g.tensors["logits"].shape == (450, 10)
    logits = run_reference(g, {"input": x_test})["logits"]
    accuracy = float((logits.argmax(axis=1) == y_test).mean())
    assert accuracy >= 0.95
    assert abs(accuracy - record["test_accuracy_torch"]) * 100 <= 0.5
    assert abs(accuracy - record["test_accuracy_onnxruntime"]) * 100 <= 0.5


def test_batched_graph_equals_single_images(split):
    _, _, x_test, _ = split
    batched = run_reference(zoo.get("digits_cnn", batch=5), {"input": x_test[:5]})["logits"]
    single = zoo.get("digits_cnn")
    for i in range(5):
        one = run_reference(single, {"input": x_test[i:i + 1]})["logits"]
        np.testing.assert_allclose(batched[i:i + 1], one, rtol=1e-6, atol=1e-6)


def test_reference_matches_onnxruntime(split):
    ort = pytest.importorskip("onnxruntime")
    _, _, x_test, _ = split
    sess = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    g = zoo.get("digits_cnn")
    for i in (0, 17, 123, 449):
        x = x_test[i:i + 1]
        want = sess.run(["logits"], {"input": x})[0]
        got = run_reference(g, {"input": x})["logits"]
        assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


def test_training_script_writes_a_model(tmp_path):
    # Two epochs into a temporary folder: the script runs end to end and its record is
    # consistent with the model it wrote (the committed model took 30 epochs).
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_digits.py"), "--epochs", "2",
         "--min-accuracy", "0", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rec = json.loads((tmp_path / "digits_cnn.json").read_text())
    assert rec["epochs"] == 2 and rec["seed"] == 0
    assert abs(rec["test_accuracy_torch"] - rec["test_accuracy_onnxruntime"]) <= 0.005
    from vdla.compiler import from_onnx
    g = from_onnx(tmp_path / "digits_cnn.onnx")
    assert g.tensors["logits"].shape == (1, 10)
