"""What running onnx's own backend test cases found (tests/compiler/test_onnx_conformance.py),
pinned as unit tests: models older than opset 7 are upgraded with onnx's version converter
(with a warning, and recorded in the graph's metadata) or refused naming their opset; and
a pool whose last ceil_mode window would start in the end padding drops that window, as
ONNX defines the output size."""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vdla.compiler import run_reference
from vdla.compiler.frontend.onnx_import import MIN_OPSET, OnnxImportError, from_onnx

RNG = np.random.default_rng(7)


def _model(nodes, opset, *, inits=(), x=(1, 3, 4, 4), y=None):
    inits = dict(inits)
    # IR version 3 lists every initializer among the graph's inputs too (the converter
    # reads an initializer that is not an input as undefined).
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)] + [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape) for n, v in inits.items()]
    graph = helper.make_graph(
        nodes, "old", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, y)],
        initializer=[numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 3          # what exporters of opsets 1-6 wrote
    return model


def _legacy_bias_model(opset=6):
    """Conv, then Add-6 of a per-channel bias with its legacy broadcast=1, axis=1 (opset 7
    replaced both attributes with numpy broadcasting), then Relu."""
    w = (RNG.standard_normal((3, 3, 3, 3)) * 0.3).astype(np.float32)
    b = RNG.standard_normal(3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "b"], ["s"], broadcast=1, axis=1),
             helper.make_node("Relu", ["s"], ["y"])]
    return _model(nodes, opset, inits={"w": w, "b": b}), w, b


def test_an_opset_6_model_is_upgraded_with_a_warning_and_runs():
    model, w, b = _legacy_bias_model()
    with pytest.warns(UserWarning, match=r"'the given ModelProto': upgraded from opset 6 to "
                                         r"7 with onnx's version converter"):
        graph = from_onnx(model)
    assert graph.metadata["onnx"]["opset"] == MIN_OPSET == 7
    assert graph.metadata["onnx"]["upgraded_from"] == 6
    # The caller's model is left as it was.
    assert model.opset_import[0].version == 6
    x = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
    got = run_reference(graph, {"x": x})[graph.outputs[0]]
    # The same layer by hand: the bias is added per channel (axis 1), as broadcast=1 says.
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))).astype(np.float64)
    conv = np.einsum("nchwij,ocij->nohw", np.lib.stride_tricks.sliding_window_view(
        xp, (3, 3), axis=(2, 3)), w.astype(np.float64))
    want = np.maximum(conv + b.reshape(1, 3, 1, 1), 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op, axis, b_shape", [
    ("Add", 1, (3,)), ("Mul", 2, (4,)), ("Add", 1, (3, 4)), ("Mul", 0, (1, 3)),
    ("Add", 3, (4,)), ("Mul", 2, (4, 4))])
def test_legacy_broadcasts_align_b_at_their_axis(op, axis, b_shape):
    # Opset-6 broadcasting: B's dimensions line up with A's from `axis` on.
    b = RNG.standard_normal(b_shape).astype(np.float32)
    model = _model([helper.make_node(op, ["x", "b"], ["y"], broadcast=1, axis=axis)], 6,
                   inits={"b": b})
    with pytest.warns(UserWarning, match="upgraded from opset 6 to 7"):
        graph = from_onnx(model)
    x = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
    aligned = b.reshape(b_shape + (1,) * (4 - axis - len(b_shape)))
    want = x + aligned if op == "Add" else x * aligned
    got = run_reference(graph, {"x": x})[graph.outputs[0]]
    assert got.shape == (1, 3, 4, 4)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_current_model_is_not_upgraded_and_warns_nothing():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], 13)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph = from_onnx(model)
    assert graph.metadata["onnx"]["upgraded_from"] is None
    assert graph.metadata["onnx"]["opset"] == 13


def test_a_model_the_converter_cannot_upgrade_is_refused_naming_opset_and_reason():
    # Upsample-1 needs width_scale and height_scale; the converter cannot upgrade it.
    model = _model([helper.make_node("Upsample", ["x"], ["y"], scales=[1.0, 1.0, 2.0, 2.0])], 6)
    with pytest.raises(OnnxImportError) as info:
        from_onnx(model)
    message = str(info.value)
    assert ("'the given ModelProto' uses opset 6; vdla imports opset 7 and later (tested up "
            "to 21), and upgrades opsets 1 to 6 with onnx's version converter, which cannot "
            "upgrade this model: Upsample in opset 1 needs to have width_scale and "
            "height_scale attributes") == message
    # The C++ location and assertion text of the converter's message are gone.
    assert "Assertion" not in message and ".h:" not in message


@pytest.mark.parametrize("opset", [0, -3])
def test_an_opset_that_is_no_onnx_opset_is_refused_without_converting(opset):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], opset)
    with pytest.raises(OnnxImportError, match=rf"uses opset {opset}; vdla imports opset 7 and "
                                              rf"later .*; opset {opset} is not an ONNX opset"):
        from_onnx(model)


def test_a_converter_error_on_a_broken_model_is_a_refusal():
    # The converter raises its own ConvertError (not a RuntimeError) for an input no node
    # produces: it must still end in an OnnxImportError (found by tests/fuzz).
    model = _model([helper.make_node("Add", ["x", "missing"], ["y"])], 5)
    with pytest.raises(OnnxImportError, match=r"uses opset 5; .*cannot upgrade this model: "
                                              r"Input missing is undefined"):
        from_onnx(model)


# --- pooling: ceil_mode's last window -----------------------------------------------------

@pytest.mark.parametrize("op, count_include_pad", [("AveragePool", 1), ("AveragePool", 0),
                                                   ("MaxPool", None)])
def test_a_ceil_mode_window_starting_in_the_end_padding_is_dropped(op, count_include_pad):
    """onnx's test_averagepool_2d_ceil_last_window_starts_on_pad: 2x2 input, pads 1, a 3x3
    window with stride 3. ceil((2 + 2 - 3) / 3) + 1 = 2 windows per axis, but the second
    starts at padded index 3, past the input and its begin pad (1 + 2 = 3): ONNX drops
    it, so the output is 1x1, the mean (or max) of the first window alone."""
    attrs = dict(kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1)
    if count_include_pad is not None:
        attrs["count_include_pad"] = count_include_pad
    model = _model([helper.make_node(op, ["x"], ["y"], **attrs)], 19, x=(1, 3, 2, 2))
    model.ir_version = 9
    x = RNG.random((1, 3, 2, 2)).astype(np.float32)
    graph = from_onnx(model)
    got = run_reference(graph, {"x": x})[graph.outputs[0]]
    assert got.shape == (1, 3, 1, 1)
    if op == "MaxPool":
        want = x.max(axis=(2, 3), keepdims=True)
    else:
        # The first window covers the whole input and 5 padded cells of its 9.
        want = x.sum(axis=(2, 3), keepdims=True) / (9 if count_include_pad else 4)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-6)
