"""Quantized accuracy of the trained digits CNN: the front half end to end on a real
trained model (import, passes, calibration, int8 quantization, packing) against its float
accuracy on the held-out split."""

from __future__ import annotations

import numpy as np
import pytest

import vdla
from vdla.compiler import from_onnx, quantize, run_reference, zoo
from vdla.compiler.frontend.datasets import digits_split
from vdla.compiler.passes import pack_graph

MODEL = zoo.DIGITS_MODEL


@pytest.fixture(scope="module")
def data():
    return digits_split()


@pytest.fixture(scope="module")
def batched(data):
    """The trained model with the whole test split as one batch."""
    return zoo.get("digits_cnn", batch=data[2].shape[0])


def accuracy(graph, x, y) -> float:
    (logits,) = run_reference(graph, {graph.inputs[0]: x}).values()
    return float((np.argmax(logits, axis=1) == y).mean())


def calibration(data, n=64):
    """The first `n` training images, one sample each (the graph has batch 1):
    calibration never sees the test split."""
    x_train = data[0]
    return {"input": x_train[:n, None]}


def quantized_accuracy(graph, x, y) -> float:
    hits = 0
    for image, label in zip(x, y):
        (logits,) = run_reference(graph, {"input": image[None]}).values()
        hits += int(np.argmax(logits) == label)
    return hits / len(y)


@pytest.mark.parametrize("mode", ["shift", "multiply"])
def test_quantized_accuracy_within_1_5_points_of_float(data, batched, mode):
    _, _, x_test, y_test = data
    float_acc = accuracy(batched, x_test, y_test)
    quantized = quantize(from_onnx(MODEL), calibration(data), mode)
    q_acc = quantized_accuracy(quantized, x_test, y_test)
    print(f"digits: float {float_acc:.2%}, int8 ({mode}) {q_acc:.2%}")
    assert float_acc >= 0.95
    assert q_acc >= float_acc - 0.015


def test_packing_keeps_the_quantized_digits_model_bit_exact(data):
    config = vdla.HardwareConfig()
    quantized = quantize(from_onnx(MODEL), calibration(data), "shift")
    packed = pack_graph(quantized, batch=config.batch, block_in=config.block_in,
                        block_out=config.block_out)
    x = data[2][:1]
    a = run_reference(quantized, {"input": x}, keep=True)
    b = run_reference(packed, {"input": x})
    for name in quantized.outputs:
        np.testing.assert_array_equal(a[name], b[name])
