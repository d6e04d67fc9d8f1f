"""Transformers exported by torch import into vdla: small ViT, BERT-style and GPT-style
models (tests/transformer_models.py) through both torch exporters at opsets 17 and 18,
folded and not, and torch's own attention modules, whose float reference matches
onnxruntime, as do single nodes of the new ops; token ids outside the vocabulary and the
ops vdla does not import are refused with clear errors; `vdla run`'s inputs for them (ids
inside the vocabulary, masks of ones) come without being asked."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import nn
from transformer_models import KINDS, export, exported, run_onnxruntime

from vdla.compiler.frontend.datasets import index_bound, model_inputs, random_inputs
from vdla.compiler.frontend.onnx_import import OnnxImportError, from_onnx
from vdla.compiler.ir import Graph
from vdla.compiler.reference import run_reference

#: What the imported graphs may hold: layers and the tensor ops of attention; the shape
#: computations the exporters write were all evaluated at import.
GRAPH_OPS = {"conv2d", "dense", "matmul", "add", "sub", "mul", "div", "pow", "tanh", "erf",
             "softmax", "layer_norm", "gather", "reshape", "transpose", "slice", "concat",
             "cast", "where"}


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """Max absolute error relative to the output's max magnitude."""
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


@functools.cache
def _export(kind, exporter, opset, tmp, fold=True, dynamic=False, causal=None):
    sizes = {"causal": causal} if causal else {}
    return exported(kind, exporter, tmp, opset, fold=fold, dynamic=dynamic, **sizes)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return str(tmp_path_factory.mktemp("transformers"))


#: Every kind with both exporters at their own opsets (legacy 17, dynamo 18), the legacy
#: exporter at 18 too, and the dynamo exporter at 17 (torch exports 18, then converts
#: the model down with onnx's converter) on the GPT model: its conversion of the ViT's
#: Split keeps opset 18's num_outputs attribute, which onnxruntime rejects at opset 17.
CASES = [(kind, exporter, opset) for kind in KINDS
         for exporter, opset in (("legacy", 17), ("legacy", 18), ("dynamo", 18))]
CASES.append(pytest.param("gpt", "dynamo", 17, marks=pytest.mark.slow))


@pytest.mark.parametrize("kind, exporter, opset", CASES)
def test_export_imports_and_matches_onnxruntime(kind, exporter, opset, tmp):
    path, inputs, _ = _export(kind, exporter, opset, tmp)
    want = run_onnxruntime(path, inputs)[0]
    graph = from_onnx(path)
    assert graph.inputs == list(inputs)
    for name, value in inputs.items():
        assert graph.tensors[name].dtype == str(value.dtype)
    got = run_reference(graph, inputs)[graph.outputs[0]]
    assert got.shape == want.shape
    assert rel_error(got, want) <= 1e-4
    ops = set(graph.count_ops())
    assert ops <= GRAPH_OPS, ops - GRAPH_OPS
    assert {"layer_norm", "softmax", "matmul", "dense"} <= ops
    if kind != "vit":
        assert graph.count_ops()["gather"] == 1          # the token embedding; positions fold
        gather = next(n for n in graph.nodes() if n.op == "gather")
        assert gather.inputs[1] == "input_ids"


@pytest.mark.parametrize("kind, exporter, causal", [
    ("vit", "dynamo", None),           # unoptimized: SplitToSequence / SequenceAt
    ("bert", "legacy", None),
    ("gpt", "legacy", "triu"),         # Trilu on a constant, folded
    ("gpt", "legacy", "where"),        # masked_fill: Where on the scores
])
def test_unfolded_exports_fold_their_shape_computations(kind, exporter, causal, tmp):
    # No constant folding by the exporter (legacy with a symbolic sequence axis):
    # Shape/Gather/Unsqueeze/Concat, Range, Trilu, Equal, Where chains reach the importer.
    path, inputs, _ = _export(kind, exporter, 18 if exporter == "dynamo" else 17, tmp,
                              fold=False, dynamic=exporter == "legacy", causal=causal)
    graph = from_onnx(path, input_shapes={k: v.shape for k, v in inputs.items()})
    got = run_reference(graph, inputs)[graph.outputs[0]]
    assert rel_error(got, run_onnxruntime(path, inputs)[0]) <= 1e-4
    ops = set(graph.count_ops())
    assert ops <= GRAPH_OPS, ops - GRAPH_OPS
    if causal == "where":
        assert graph.count_ops()["where"] == 2             # one per layer


@pytest.mark.parametrize("bad", [100, -101, 10 ** 6])
def test_token_ids_outside_the_vocabulary_are_refused(bad, tmp):
    path, inputs, _ = _export("gpt", "legacy", 17, tmp)
    graph = from_onnx(path)
    ids = inputs["input_ids"].copy()
    ids[0, 3] = bad
    with pytest.raises(ValueError, match=rf"index {bad} in 'input_ids' is outside "
                                         r"\[-100, 100\), the 100 entries of 'tokens.weight'"):
        run_reference(graph, {"input_ids": ids})
    # Negative ids inside the range count from the end, as in ONNX (numpy.take).
    ids[0, 3] = -1
    out = run_reference(graph, {"input_ids": ids})[graph.outputs[0]]
    assert np.isfinite(out).all()


class _Unsupported(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how
        self.norm = nn.LayerNorm((4, 8))

    def forward(self, x):
        if self.how == "layer_norm_2_axes":
            return self.norm(x)
        if self.how == "triu_of_activation":
            return torch.triu(x)
        return torch.cumsum(x, dim=-1)


_LN_2_AXES = r"LayerNormalization.*axis -2 normalizes over the axes \[1, 2\].*last axis only"


@pytest.mark.parametrize("how, exporter, pattern", [
    ("layer_norm_2_axes", "legacy", _LN_2_AXES),
    ("layer_norm_2_axes", "dynamo", _LN_2_AXES),
    ("triu_of_activation", "legacy", r"Trilu.*only on constant inputs.*'x' is computed"),
    ("cumsum", "legacy", r"CumSum.*op type 'CumSum' is not supported"),
])
def test_unsupported_ops_are_refused_clearly(how, exporter, pattern, tmp_path):
    x = np.zeros((1, 4, 8), np.float32)
    path = export(_Unsupported(how).eval(), {"x": x}, tmp_path / "m.onnx", exporter)
    with pytest.raises(OnnxImportError, match=pattern):
        from_onnx(path)


def test_gather_of_constant_indices_out_of_range_is_refused_at_import():
    from onnx import TensorProto, helper, numpy_helper
    table = numpy_helper.from_array(np.zeros((5, 3), np.float32), "table")
    ids = numpy_helper.from_array(np.array([1, 7], np.int64), "ids")
    nodes = [helper.make_node("Add", ["x", "x"], ["t"], name="twice"),
             helper.make_node("Gather", ["t", "ids"], ["y"], name="pick")]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (5, 3))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 3))],
        initializer=[table, ids]), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(OnnxImportError, match=r"'pick'.*index 7 in 'ids' is outside \[-5, 5\)"):
        from_onnx(model)


def test_model_inputs_draw_ids_inside_the_vocabulary_and_masks_of_ones(tmp):
    path, _, _ = _export("bert", "legacy", 17, tmp)
    graph = from_onnx(path)
    assert index_bound(graph, "input_ids") == (100, "tokens.weight")
    assert index_bound(graph, "attention_mask") is None
    samples, feed, note = model_inputs(graph, seed=5, calibration=3)
    assert samples["input_ids"].shape == (3, 1, 16) and feed["input_ids"].shape == (1, 16)
    for ids in (samples["input_ids"], feed["input_ids"]):
        assert ids.dtype == np.int64 and 0 <= ids.min() and ids.max() < 100
    assert len(np.unique(samples["input_ids"])) > 10          # drawn, not constant
    assert (feed["attention_mask"] == 1).all() and feed["attention_mask"].dtype == np.int64
    assert (samples["attention_mask"] == 1).all()
    assert "100 rows of 'tokens.weight'" in note and "attention_mask: all ones" in note
    again = model_inputs(graph, seed=5, calibration=3)
    assert np.array_equal(again[1]["input_ids"], feed["input_ids"])
    other = model_inputs(graph, seed=6, calibration=3)
    assert not np.array_equal(other[1]["input_ids"], feed["input_ids"])
    run_reference(graph, feed)


def test_model_inputs_of_one_float_input_are_random_inputs():
    g = Graph("one")
    x = g.add_input("x", (1, 3, 4, 4))
    g.set_outputs([g.add_node("relu", [x])])
    samples, feed, _ = model_inputs(g, seed=2, calibration=4)
    want_samples, want = random_inputs((1, 3, 4, 4), seed=2, calibration=4)
    assert np.array_equal(samples["x"], want_samples) and np.array_equal(feed["x"], want)


def test_ids_through_a_reshape_and_cast_still_find_their_table():
    g = Graph("ids")
    ids = g.add_input("ids", (1, 6), "int32")
    flat = g.add_node("reshape", [ids], shape=(6,))
    wide = g.add_node("cast", [flat], dtype="int64")
    small = g.add_constant("small", np.zeros((7, 2), np.float32))
    big = g.add_constant("big", np.zeros((50, 2), np.float32))
    g.set_outputs([g.add_node("gather", [big, wide]), g.add_node("gather", [small, flat])])
    assert index_bound(g, "ids") == (7, "small")
    _, feed, _ = model_inputs(g, seed=0, calibration=1)
    assert feed["ids"].dtype == np.int32 and feed["ids"].max() < 7


def test_pipeline_loads_a_bert_export_with_its_inputs(tmp):
    from vdla.compiler import pipeline
    path, _, _ = _export("bert", "dynamo", 18, tmp)
    model = pipeline.load_model(str(path), seed=1, calibration=2, note=None)
    assert set(model.feed) == {"input_ids", "attention_mask"}
    assert model.calibration["input_ids"].shape == (2, 1, 16)
    assert model.feed["input_ids"].max() < 100
    assert "ids drawn from the 100 rows" in model.input_note
    out = run_reference(model.graph, model.feed)[model.graph.outputs[0]]
    assert out.shape == (1, 3) and np.isfinite(out).all()


class _Sdpa(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(32, 96)

    def forward(self, x):
        q, k, v = self.qkv(x).reshape(1, 8, 3, 2, 16).permute(2, 0, 3, 1, 4)
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


class _Mha(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 2, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


def _encoder():
    layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True,
                                       activation="gelu")
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


@pytest.mark.parametrize("make", [_encoder, _Mha, _Sdpa])
def test_torch_attention_modules_import(make, tmp_path):
    # torch's own modules: nn.TransformerEncoder, nn.MultiheadAttention and
    # scaled_dot_product_attention (causal), as the TorchScript exporter writes them.
    torch.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((1, 8, 32)).astype(np.float32)
    path = export(make().eval(), {"x": x}, tmp_path / "m.onnx", "legacy")
    graph = from_onnx(path)
    got = run_reference(graph, {"x": x})[graph.outputs[0]]
    assert rel_error(got, run_onnxruntime(path, {"x": x})[0]) <= 1e-4
    assert set(graph.count_ops()) <= GRAPH_OPS


def test_pipeline_quantizes_and_runs_an_export_on_the_host(tmp):
    # What `vdla run bert.onnx --target host` does: inputs drawn by model_inputs
    # (int64 ids and mask) calibrate the quantizer and feed the run.
    from vdla.compiler import pipeline, targets
    path, _, _ = _export("bert", "legacy", 17, tmp)
    model = pipeline.load_model(str(path), seed=0, calibration=2, note=None)
    outcome = pipeline.run_model(model, targets.get("host"))
    assert outcome.bit_exact


def _one_node_model(op, inputs, consts, n_out=1, opset=18, **attrs):
    """An ONNX model of one `op` node over graph inputs {name: array} and initializers
    {name: array} (node inputs: graph inputs, then initializers; "" for an absent one)."""
    from onnx import helper, numpy_helper
    names = list(inputs) + list(consts)
    outs = [f"y{k}" for k in range(n_out)]
    graph = helper.make_graph(
        [helper.make_node(op, names, outs, name="the_node", **attrs)], "one",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outs],
        initializer=[numpy_helper.from_array(v, n) for n, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


_X = np.random.default_rng(3).standard_normal((2, 1, 6, 4)).astype(np.float32)
_I64 = lambda *v: np.array(v, np.int64)        # noqa: E731


@pytest.mark.parametrize("op, inputs, consts, n_out, attrs", [
    ("Unsqueeze", {"x": _X}, {"axes": _I64(0, -1)}, 1, {}),
    ("Squeeze", {"x": _X}, {"axes": _I64(1)}, 1, {}),
    ("Split", {"x": _X}, {}, 3, {"axis": 2, "num_outputs": 3}),
    ("Split", {"x": _X}, {"split": _I64(1, 5)}, 2, {"axis": -2}),
    ("Slice", {"x": _X}, {"s": _I64(-5, 1), "e": _I64(100, 4), "a": _I64(2, 3),
                          "st": _I64(2, 1)}, 1, {}),
    ("Expand", {"x": _X}, {"shape": _I64(3, 2, 4, 1, 1)}, 1, {}),
    ("Gather", {"x": _X}, {"i": np.array(-2, np.int64)}, 1, {"axis": 2}),
    ("Gather", {"x": _X}, {"i": _I64(3, 0, -1)}, 1, {"axis": 3}),
    ("LayerNormalization", {"x": _X}, {"s": np.full(4, 1.5, np.float32)}, 3,
     {"epsilon": 1e-3}),
    ("ReduceSum", {"x": _X}, {"axes": _I64(-1, 2)}, 1, {"keepdims": 0}),
    ("ReduceMax", {"x": _X}, {"axes": _I64(1)}, 1, {}),
    ("ReduceMean", {"x": _X}, {"axes": _I64(3)}, 1, {}),
    ("Pow", {"x": np.abs(_X)}, {"p": np.array(3, np.int64)}, 1, {}),
    ("Cast", {"x": _X * 5}, {}, 1, {"to": 7}),
    ("Gelu", {"x": _X}, {}, 1, {"approximate": "tanh"}),
])
def test_single_ops_match_onnxruntime(op, inputs, consts, n_out, attrs):
    import onnxruntime as ort
    model = _one_node_model(op, inputs, consts, n_out, opset=20 if op == "Gelu" else 18,
                            **attrs)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, inputs)
    graph = from_onnx(model)
    got = run_reference(graph, inputs)
    for name, w in zip(graph.outputs, want):
        assert got[name].shape == w.shape and got[name].dtype == w.dtype, (name, w.shape)
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-6)


def test_masks_from_computed_booleans():
    # not(ids == 0) as a mask, then Where on the scores: Equal, Not, Where on activations.
    from onnx import TensorProto, helper, numpy_helper
    import onnxruntime as ort
    nodes = [helper.make_node("Equal", ["ids", "zero"], ["pad"]),
             helper.make_node("Not", ["pad"], ["keep"]),
             helper.make_node("Where", ["keep", "x", "minus"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "mask", [helper.make_tensor_value_info("ids", TensorProto.INT64, (1, 6)),
                        helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 6))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 6))],
        initializer=[numpy_helper.from_array(np.array(0, np.int64), "zero"),
                     numpy_helper.from_array(np.array(-1e4, np.float32), "minus")]),
        opset_imports=[helper.make_opsetid("", 17)])
    feed = {"ids": np.array([[5, 0, 3, 0, 1, 2]]), "x": _X[0, 0, :2, :].repeat(2, 1)[:, :6]}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feed)[0]
    graph = from_onnx(model)
    assert graph.count_ops() == {"equal": 2, "where": 1}
    np.testing.assert_array_equal(run_reference(graph, feed)["y"], want)
