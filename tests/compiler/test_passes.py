"""Structural passes, one by one: graphs before and after, numerics with run_reference."""

from __future__ import annotations

import numpy as np
import pytest

from vdla.compiler import Graph, GraphError, run_reference
from vdla.compiler.passes import fold_batch_norm, fold_constants, fuse, infer_shapes, prepare

RNG = np.random.default_rng(1234)


def rand(*shape, scale=0.5):
    return np.asarray(RNG.standard_normal(shape) * scale, dtype=np.float32)


def feed(g: Graph):
    return {n: rand(*g.tensors[n].shape, scale=1.0) for n in g.inputs}


def assert_same_outputs(before: Graph, after: Graph, inputs=None, tol=1e-5):
    inputs = inputs or feed(before)
    want, got = run_reference(before, inputs), run_reference(after, inputs)
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=tol, atol=tol, err_msg=name)


def bn_params(g: Graph, c: int, name="bn"):
    return [g.add_constant(f"{name}_scale", RNG.random(c) + 0.5),
            g.add_constant(f"{name}_bias", RNG.standard_normal(c)),
            g.add_constant(f"{name}_mean", RNG.standard_normal(c)),
            g.add_constant(f"{name}_var", RNG.random(c) + 0.2)]


# --- infer_shapes ------------------------------------------------------------------------

def test_infer_shapes_fills_every_tensor_and_copies():
    g = Graph("s")
    x = g.add_input("x", (2, 3, 9, 9))
    y = g.add_node("conv2d", [x, g.add_constant("w", rand(8, 3, 3, 3))], infer=False,
                   strides=(2, 2), pads=(1, 1, 1, 1))
    z = g.add_node("max_pool2d", [y], infer=False, kernel=(2, 2), strides=(2, 2))
    f = g.add_node("flatten", [z], infer=False)
    g.set_outputs([f])
    assert g.tensors[f].shape is None
    out = infer_shapes(g)
    assert out.tensors[y].shape == (2, 8, 5, 5)
    assert out.tensors[z].shape == (2, 8, 2, 2)
    assert out.tensors[f].shape == (2, 32)
    assert g.tensors[f].shape is None                 # the input graph is untouched


def test_infer_shapes_names_the_node():
    g = Graph("bad")
    x = g.add_input("x", (1, 3, 4, 4))
    g.add_node("conv2d", [x, g.add_constant("w", rand(8, 4, 3, 3))], infer=False,
               name="conv_a")
    with pytest.raises(GraphError, match="conv_a.*3 channels"):
        infer_shapes(g)


def test_infer_shapes_needs_input_shapes():
    g = Graph("noshape")
    g.add_input("x", (1, 2))
    g.tensors["x"].shape = None
    with pytest.raises(GraphError, match="graph input 'x' has no shape"):
        infer_shapes(g)


# --- fold_constants ----------------------------------------------------------------------

def test_fold_constants_evaluates_constant_subgraphs():
    g = Graph("c")
    x = g.add_input("x", (1, 4, 3, 3))
    w_oihw = rand(8, 4, 1, 1)
    # Weights stored as HWIO and transposed in the graph, as some importers leave them.
    w = g.add_node("transpose", [g.add_constant("w_hwio", w_oihw.transpose(2, 3, 1, 0))],
                   perm=(3, 2, 0, 1))
    two = g.add_node("mul", [g.add_constant("b", rand(8)), g.add_constant("two", 2.0)])
    y = g.add_node("conv2d", [x, w, two])
    g.set_outputs([y])
    out = fold_constants(g)
    assert g.count_ops() == {"transpose": 1, "mul": 1, "conv2d": 1}
    assert out.count_ops() == {"conv2d": 1}
    conv = out.nodes()[0]
    np.testing.assert_array_equal(out.tensors[conv.inputs[1]].data, w_oihw)
    assert sorted(out.metadata["folded_constants"]) == ["mul", "transpose"]
    assert "w_hwio" not in out.tensors                # unused constants are pruned
    assert_same_outputs(g, out)


def test_fold_constants_removes_noops_but_not_outputs():
    g = Graph("n")
    x = g.add_input("x", (2, 6))
    a = g.add_node("reshape", [x], shape=(2, 6))
    b = g.add_node("transpose", [a], perm=(0, 1))
    c = g.add_node("pad", [b], pads=(0, 0, 0, 0))
    d = g.add_node("add", [c, g.add_constant("zero", np.zeros(6, np.float32))])
    e = g.add_node("relu", [d])
    f = g.add_node("clip", [e])                       # unbounded: a no-op, but an output
    r = g.add_node("reshape", [f], shape=(3, 4))      # a real reshape stays
    g.set_outputs([f, r])
    out = fold_constants(g)
    assert out.count_ops() == {"relu": 1, "clip": 1, "reshape": 1}
    assert out.node("relu").inputs == ["x"]
    assert sorted(out.metadata["removed_noops"]) == ["add", "pad", "reshape", "transpose"]
    assert out.outputs == g.outputs
    assert_same_outputs(g, out)


def test_fold_constants_keeps_adds_that_broadcast():
    g = Graph("b")
    x = g.add_input("x", (1, 6))
    y = g.add_node("add", [x, g.add_constant("zeros", np.zeros((3, 6), np.float32))])
    g.set_outputs([y])
    assert fold_constants(g).count_ops() == {"add": 1}


# --- fold_batch_norm ---------------------------------------------------------------------

@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("kind", ["conv", "dense"])
def test_fold_batch_norm_into_weights(kind, with_bias):
    g = Graph("bn")
    if kind == "conv":
        x = g.add_input("x", (2, 3, 5, 5))
        w = g.add_constant("w", rand(6, 3, 3, 3))
        attrs = dict(pads=(1, 1, 1, 1))
    else:
        x = g.add_input("x", (2, 7))
        w = g.add_constant("w", rand(6, 7))
        attrs = {}
    inputs = [x, w] + ([g.add_constant("b", rand(6))] if with_bias else [])
    y = g.add_node("conv2d" if kind == "conv" else "dense", inputs, **attrs)
    z = g.add_node("batch_norm", [y] + bn_params(g, 6), epsilon=1e-3)
    g.set_outputs([z])
    out = fold_batch_norm(g)
    assert "batch_norm" in g.count_ops()
    assert out.count_ops() == {("conv2d" if kind == "conv" else "dense"): 1}
    node = out.nodes()[0]
    assert node.outputs == [z] and node.input(2)      # a bias is created when absent
    assert out.tensors[node.inputs[1]].data.shape == g.tensors[w].data.shape
    assert out.metadata["folded_batch_norm"] == [{"node": "batch_norm", "into": node.name,
                                                   "how": "weights"}]
    assert_same_outputs(g, out)


def old_mul_add(g: Graph, bn: str) -> Graph:
    """`g` with batch_norm node `bn` replaced as fold_batch_norm used to replace it:
    ``x * inv + (beta - mean * inv)`` with float32 per-channel constants: the float
    semantics its depthwise convolution must keep."""
    out = infer_shapes(g)
    node = out.node(bn)
    scale, beta, mean, var = (out.tensors[i].data.astype(np.float64) for i in node.inputs[1:])
    inv = scale / np.sqrt(var + node.attrs["epsilon"])
    shape = (1, -1) + (1,) * (len(out.tensors[node.inputs[0]].shape) - 2)
    out.remove_node(bn)
    a = out.add_constant("old_scale", inv.reshape(shape).astype(np.float32))
    c = out.add_constant("old_shift", (beta - mean * inv).reshape(shape).astype(np.float32))
    m = out.add_node("mul", [node.inputs[0], a])
    out.add_node("add", [m, c], node.outputs)
    return out


@pytest.mark.parametrize("case", ["graph_input", "after_add", "two_consumers", "after_relu",
                                  "after_concat"])
def test_fold_batch_norm_fallback_is_a_depthwise_conv(case):
    g = Graph("bn2")
    x = g.add_input("x", (1, 4, 3, 3))
    outputs = []
    if case == "graph_input":
        src = x
    elif case == "after_concat":
        a = g.add_node("conv2d", [x, g.add_constant("wa", rand(3, 4, 1, 1))])
        b = g.add_node("conv2d", [x, g.add_constant("wb", rand(1, 4, 1, 1))])
        src = g.add_node("concat", [a, b], axis=1)
    else:
        y = g.add_node("conv2d", [x, g.add_constant("w", rand(4, 4, 1, 1))],
                       activation="relu" if case == "after_relu" else None)
        if case == "after_add":
            src = g.add_node("add", [y, x])
        else:
            src = y
        if case == "two_consumers":
            outputs.append(g.add_node("relu", [y]))
    z = g.add_node("batch_norm", [src] + bn_params(g, 4), epsilon=1e-3)
    g.set_outputs([z] + outputs)
    out = fold_batch_norm(g)
    ops = out.count_ops()
    assert "batch_norm" not in ops and "mul" not in ops
    (record,) = out.metadata["folded_batch_norm"]
    assert record == {"node": "batch_norm", "into": "batch_norm", "how": "depthwise_conv"}
    dw = out.node(record["into"])
    assert dw.op == "conv2d" and dw.attrs["groups"] == 4 and dw.outputs == [z]
    assert dw.inputs[0] == src
    assert out.tensors[dw.inputs[1]].shape == (4, 1, 1, 1)
    assert out.tensors[dw.inputs[2]].shape == (4,)
    assert out.outputs == g.outputs
    assert_same_outputs(g, out)
    assert_same_outputs(old_mul_add(g, "batch_norm"), out)   # what mul + add computed


def test_fold_batch_norm_on_other_ranks_is_mul_add():
    # BatchNorm1d on a dense output another node reads: no NCHW activation to convolve.
    g = Graph("bn1d")
    x = g.add_input("x", (2, 7))
    y = g.add_node("dense", [x, g.add_constant("w", rand(4, 7))])
    z = g.add_node("batch_norm", [y] + bn_params(g, 4))
    g.set_outputs([z, g.add_node("relu", [y])])
    out = fold_batch_norm(g)
    assert out.count_ops() == {"dense": 1, "mul": 1, "add": 1, "relu": 1}
    assert out.metadata["folded_batch_norm"] == [{"node": "batch_norm", "into": None,
                                                   "how": "mul_add"}]
    assert_same_outputs(g, out)


def dense_layer_graph():
    """DenseNet-style: two convs concatenated, then BN -> ReLU -> conv1x1; the concat is
    also a graph output (as the next dense layer would read it)."""
    g = Graph("dense_layer")
    x = g.add_input("x", (1, 3, 6, 6))
    a = g.add_node("conv2d", [x, g.add_constant("wa", rand(12, 3, 3, 3))], pads=(1, 1, 1, 1),
                   activation="relu")
    b = g.add_node("conv2d", [x, g.add_constant("wb", rand(20, 3, 3, 3))], pads=(1, 1, 1, 1),
                   activation="relu")
    cat = g.add_node("concat", [a, b], axis=1)
    y = g.add_node("relu", [g.add_node("batch_norm", [cat] + bn_params(g, 32), name="bn")])
    z = g.add_node("conv2d", [y, g.add_constant("wc", rand(8, 32, 1, 1))])
    g.set_outputs([z, cat])
    return g


def test_prepare_fuses_the_relu_after_a_batch_norm_on_a_concat():
    g = dense_layer_graph()
    out = prepare(g)
    assert out.count_ops() == {"conv2d": 4, "concat": 1}
    dw = out.node("bn")
    assert dw.op == "conv2d" and dw.attrs["groups"] == 32
    assert dw.attrs["activation"] == "relu"
    assert {"node": "bn", "op": "conv2d", "absorbed": "relu", "absorbed_op": "relu",
            "as": "activation", "activation": "relu", "clip_min": None,
            "clip_max": None} in out.metadata["fused"]
    assert out.metadata["folded_batch_norm"] == [{"node": "bn", "into": "bn",
                                                   "how": "depthwise_conv"}]
    assert_same_outputs(g, out, tol=1e-4)


def test_onnx_batch_norm_after_concat_becomes_a_depthwise_conv(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from vdla.compiler.frontend.onnx_import import from_onnx

    rng = np.random.default_rng(3)

    def init(name, *shape, low=None):
        value = rng.random(shape) + 0.5 if low else rng.standard_normal(shape) * 0.3
        return numpy_helper.from_array(value.astype(np.float32), name)

    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1]),
         helper.make_node("Conv", ["x", "wb"], ["b"], kernel_shape=[1, 1]),
         helper.make_node("Concat", ["a", "b"], ["cat"], axis=1),
         helper.make_node("BatchNormalization", ["cat", "s", "t", "m", "v"], ["bn"],
                          epsilon=1e-5),
         helper.make_node("Relu", ["bn"], ["r"]),
         helper.make_node("Conv", ["r", "wc"], ["y"], kernel_shape=[1, 1])], "bn_concat",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 8, 8])],
        initializer=[init("wa", 12, 3, 3, 3), init("wb", 20, 3, 1, 1),
                     init("s", 32, low=True), init("t", 32), init("m", 32),
                     init("v", 32, low=True), init("wc", 5, 32, 1, 1)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "bn_concat.onnx"
    onnx.save(model, str(path))
    g = from_onnx(str(path))
    assert "batch_norm" in g.count_ops()
    out = prepare(g)
    assert out.count_ops() == {"conv2d": 4, "concat": 1}
    (record,) = out.metadata["folded_batch_norm"]
    assert record["how"] == "depthwise_conv"
    dw = out.node(record["into"])
    assert dw.attrs["groups"] == 32 and dw.attrs["activation"] == "relu"
    assert_same_outputs(g, out, tol=1e-4)


# --- fold_channel_affine -----------------------------------------------------------------

def affine_graph(src: str, tail):
    """x (1, 4, 3, 3) -> `src` ("input", "conv", "concat") -> tail ops (op, constant or
    None for another activation)."""
    g = Graph("affine")
    x = g.add_input("x", (1, 4, 3, 3))
    if src == "conv":
        y = g.add_node("conv2d", [x, g.add_constant("w", rand(4, 4, 3, 3))], pads=(1, 1, 1, 1))
    elif src == "concat":
        a = g.add_node("conv2d", [x, g.add_constant("wa", rand(2, 4, 1, 1))], activation="relu")
        b = g.add_node("conv2d", [x, g.add_constant("wb", rand(2, 4, 1, 1))])
        y = g.add_node("concat", [a, b], axis=1)
    else:
        y = x
    for op, const in tail:
        y = g.add_node(op, [y, x if const is None else g.add_constant(f"{op}_c", const)])
    g.set_outputs([y])
    return g


@pytest.mark.parametrize("src", ["input", "concat"])
@pytest.mark.parametrize("tail", [
    [("mul", rand(1, 4, 1, 1)), ("add", rand(4, 1, 1))],
    [("mul", rand(4, 1, 1))],
    [("mul", np.float32(0.5))],
    [("add", rand(1, 4, 1, 1))],
], ids=["mul_add", "mul", "mul_scalar", "add"])
def test_fold_channel_affine_makes_a_depthwise_conv(src, tail):
    g = affine_graph(src, tail)
    out = prepare(g)
    (record,) = out.metadata["folded_channel_affine"]
    assert record["how"] == "depthwise_conv"
    assert record["nodes"] == [n.name for n in g.nodes() if n.op in ("mul", "add")]
    dw = out.node(record["into"])
    assert dw.op == "conv2d" and dw.attrs["groups"] == 4
    assert not {"mul", "add"} & set(out.count_ops())
    assert_same_outputs(g, out, tol=1e-5)


def test_fold_channel_affine_into_the_conv_before_it():
    g = affine_graph("conv", [("mul", rand(1, 4, 1, 1)), ("add", rand(1, 4, 1, 1))])
    out = prepare(g)
    assert out.count_ops() == {"conv2d": 1}
    assert out.metadata["folded_channel_affine"] == [
        {"nodes": ["mul", "add"], "into": "conv2d", "how": "weights"}]
    assert out.node("conv2d").attrs["groups"] == 1
    assert_same_outputs(g, out, tol=1e-5)
    # An add alone after a conv is fuse's: it becomes the bias, not a depthwise conv.
    g = affine_graph("conv", [("add", rand(1, 4, 1, 1))])
    out = prepare(g)
    assert out.count_ops() == {"conv2d": 1}
    assert out.metadata["folded_channel_affine"] == []
    assert [f["as"] for f in out.metadata["fused"]] == ["bias"]


@pytest.mark.parametrize("tail", [
    [("mul", None)],                       # two activations
    [("mul", rand(3))],                    # (3,) broadcasts along W, not C
    [("add", rand(1, 4, 3, 3))],           # not per channel
])
def test_fold_channel_affine_leaves_other_products(tail):
    g = affine_graph("input", tail)
    out = prepare(g)
    assert out.count_ops() == g.count_ops()
    assert out.metadata["folded_channel_affine"] == []


# --- fuse --------------------------------------------------------------------------------

def conv_chain(tail, out_shape_c=6):
    """x -> conv2d (no bias) -> tail ops (a list of (op, extra inputs, attrs))."""
    g = Graph("f")
    x = g.add_input("x", (1, 3, 4, 4))
    y = g.add_node("conv2d", [x, g.add_constant("w", rand(out_shape_c, 3, 3, 3))],
                   pads=(1, 1, 1, 1))
    for op, extra, attrs in tail:
        y = g.add_node(op, [y] + [g.add_constant(f"{op}_c", v) if isinstance(v, np.ndarray)
                                  else v for v in extra], **attrs)
    g.set_outputs([y])
    return g


@pytest.mark.parametrize("shape", [(1, 6, 1, 1), (6, 1, 1), (1,), ()])
def test_fuse_constant_add_into_bias(shape):
    g = conv_chain([("add", [rand(*shape)], {}), ("add", [rand(1, 6, 1, 1)], {})])
    out = fuse(g)
    assert out.count_ops() == {"conv2d": 1}
    conv = out.nodes()[0]
    assert out.tensors[conv.inputs[2]].shape == (6,)
    assert [f["as"] for f in out.metadata["fused"]] == ["bias", "bias"]
    assert_same_outputs(g, out)


def test_fuse_does_not_take_adds_that_are_not_per_channel():
    # A (6,) vector on an NCHW output broadcasts along W (here W == 6), not along C.
    g = Graph("w")
    x = g.add_input("x", (1, 3, 6, 6))
    y = g.add_node("conv2d", [x, g.add_constant("w", rand(6, 3, 3, 3))], pads=(1, 1, 1, 1))
    z = g.add_node("add", [y, g.add_constant("v", rand(6))])
    g.set_outputs([z])
    assert fuse(g).count_ops() == {"conv2d": 1, "add": 1}


def test_fuse_dense_bias_residual_relu():
    g = Graph("d")
    x = g.add_input("x", (2, 5))
    r = g.add_input("r", (2, 4))
    y = g.add_node("dense", [x, g.add_constant("w", rand(4, 5)), g.add_constant("b", rand(4))])
    y = g.add_node("add", [g.add_constant("c", rand(4)), y])
    y = g.add_node("add", [r, y])
    y = g.add_node("relu", [y])
    g.set_outputs([y])
    out = fuse(g)
    assert out.count_ops() == {"dense": 1}
    dense = out.nodes()[0]
    assert dense.inputs[3] == "r" and dense.attrs["activation"] == "relu"
    assert [f["as"] for f in out.metadata["fused"]] == ["bias", "residual", "activation"]
    assert_same_outputs(g, out)


@pytest.mark.parametrize("shared", [False, True])
def test_fuse_residual_through_a_transformers_reshape(shared):
    """A transformer's dense runs on (tokens, features) between reshapes of its (batch,
    tokens, features) activations: the residual add after the reshape rides in the
    dense, its other operand reshaped (a view); not when the reshaped output has another
    reader."""
    g = Graph("t")
    x = g.add_input("x", (1, 6, 5))
    flat = g.add_node("reshape", [x], shape=(6, 5))
    y = g.add_node("dense", [flat, g.add_constant("w", rand(5, 5)), g.add_constant("b", rand(5))])
    y3 = g.add_node("reshape", [y], shape=(1, 6, 5))
    z = g.add_node("add", [x, y3])
    g.set_outputs([z, y3] if shared else [z])
    out = fuse(g)
    if shared:
        assert out.count_ops() == {"reshape": 2, "dense": 1, "add": 1}
    else:
        assert out.count_ops() == {"reshape": 3, "dense": 1}
        dense = out.node(out.producer(out.producer(z).inputs[0]).name)
        assert dense.op == "dense" and out.producer(dense.inputs[3]).inputs == ["x"]
        assert out.tensors[dense.inputs[3]].shape == (6, 5)
        assert [f["as"] for f in out.metadata["fused"]] == ["residual"]
    assert_same_outputs(g, out)


@pytest.mark.parametrize("chain, want", [
    ([("relu", {})], ("relu", None, None)),
    ([("clip", {"min": -1.0, "max": 0.5}), ("relu", {})], ("clip", 0.0, 0.5)),
    ([("relu", {}), ("clip", {"min": -1.0, "max": 6.0})], ("clip", 0.0, 6.0)),
    ([("clip", {"min": None, "max": 3.0}), ("clip", {"min": 1.0, "max": 2.0})],
     ("clip", 1.0, 2.0)),
    ([("clip", {"min": 0.0, "max": None}), ("relu", {})], ("relu", None, None)),
    ([("clip", {"min": -3.0, "max": -1.0}), ("relu", {})], ("clip", 0.0, 0.0)),
])
def test_fuse_activations_compose(chain, want):
    g = conv_chain([(op, [], attrs) for op, attrs in chain])
    out = fuse(g)
    assert out.count_ops() == {"conv2d": 1}
    a = out.nodes()[0].attrs
    assert (a["activation"], a["clip_min"], a["clip_max"]) == want
    assert_same_outputs(g, out)


def test_fuse_bias_only_before_activation():
    g = conv_chain([("relu", [], {}), ("add", [rand(1, 6, 1, 1)], {})])
    out = fuse(g)
    assert out.count_ops() == {"conv2d": 1, "add": 1}
    assert out.node("conv2d").attrs["activation"] == "relu"
    assert_same_outputs(g, out)


def test_fuse_negative_two_consumers_and_graph_output():
    g = Graph("neg")
    x = g.add_input("x", (1, 3, 4, 4))
    y = g.add_node("conv2d", [x, g.add_constant("w", rand(6, 3, 1, 1))])
    a = g.add_node("relu", [y])
    b = g.add_node("clip", [y], min=0.0, max=1.0)    # second consumer of y
    z = g.add_node("conv2d", [a, g.add_constant("w2", rand(6, 6, 1, 1))])
    r = g.add_node("relu", [z])
    g.set_outputs([b, r, z])                          # z is a graph output
    out = fuse(g)
    assert out.count_ops() == g.count_ops()
    assert out.metadata["fused"] == []
    assert all(n.attrs.get("activation") is None for n in out.nodes() if n.op == "conv2d")


def resnet_block(shortcut_first: bool):
    """x -> conv_a -> relu -> conv_b ; shortcut x -> conv_s ; add(conv_b, conv_s) -> relu.
    `shortcut_first`: conv_s is added (and so ordered) before conv_a."""
    g = Graph("res")
    x = g.add_input("x", (1, 4, 4, 4))

    def shortcut():
        return g.add_node("conv2d", [x, g.add_constant("ws", rand(8, 4, 1, 1))],
                          name="conv_s")

    s = shortcut() if shortcut_first else None
    a = g.add_node("conv2d", [x, g.add_constant("wa", rand(8, 4, 3, 3))], name="conv_a",
                   pads=(1, 1, 1, 1))
    a = g.add_node("relu", [a])
    b = g.add_node("conv2d", [a, g.add_constant("wb", rand(8, 8, 3, 3))], name="conv_b",
                   pads=(1, 1, 1, 1))
    s = s or shortcut()
    y = g.add_node("relu", [g.add_node("add", [b, s])])
    g.set_outputs([y])
    return g, b, s


@pytest.mark.parametrize("shortcut_first", [True, False])
def test_fuse_residual_prefers_earlier_operand(shortcut_first):
    g, main, shortcut = resnet_block(shortcut_first)
    order = [n.name for n in g.nodes()]
    assert (order.index("conv_s") < order.index("conv_b")) == shortcut_first
    out = fuse(g)
    assert out.count_ops() == {"conv2d": 3}
    # The conv that comes later in topological order takes the add (and then the relu):
    # its residual operand is then ready before it starts.
    taker, other = ("conv_b", shortcut) if shortcut_first else ("conv_s", main)
    node = out.node(taker)
    assert node.input(3) == other and node.attrs["activation"] == "relu"
    assert out.node("conv_b" if taker == "conv_s" else "conv_s").attrs["activation"] is None
    out.validate()
    assert_same_outputs(g, out)


def test_fuse_residual_never_creates_a_cycle():
    # add(conv(x), f(conv(x))): the other operand depends on the conv's output, so the
    # conv cannot read it (it has two consumers as well; a second pass must not fuse).
    g = Graph("cyc")
    x = g.add_input("x", (1, 2, 3, 3))
    y = g.add_node("conv2d", [x, g.add_constant("w", rand(2, 2, 1, 1))])
    z = g.add_node("conv2d", [y, g.add_constant("w2", rand(2, 2, 1, 1))])
    s = g.add_node("add", [z, y])
    g.set_outputs([s])
    out = fuse(g)
    # conv z takes y as its residual (y is computed earlier); conv y must not take z.
    assert out.count_ops() == {"conv2d": 2}
    assert out.node("conv2d_0").input(3) == y
    out.validate()
    assert_same_outputs(g, out)


# --- prepare -----------------------------------------------------------------------------

def test_prepare_pipeline():
    g = Graph("p")
    x = g.add_input("x", (1, 3, 6, 6))
    w = g.add_node("reshape", [g.add_constant("wflat", rand(8 * 3 * 9))], shape=(8, 3, 3, 3))
    y = g.add_node("conv2d", [x, w], pads=(1, 1, 1, 1))
    y = g.add_node("batch_norm", [y] + bn_params(g, 8))
    y = g.add_node("relu", [y])
    s = g.add_node("conv2d", [x, g.add_constant("ws", rand(8, 3, 1, 1))])
    s = g.add_node("batch_norm", [s] + bn_params(g, 8, "bn2"))
    y = g.add_node("clip", [g.add_node("add", [s, y])], min=0.0, max=6.0)
    p = g.add_node("global_avg_pool2d", [y])
    f = g.add_node("flatten", [p])
    d = g.add_node("dense", [f, g.add_constant("wd", rand(5, 8))])
    g.set_outputs([d])
    out = prepare(g)
    assert out.count_ops() == {"conv2d": 2, "global_avg_pool2d": 1, "flatten": 1, "dense": 1}
    assert_same_outputs(g, out, tol=1e-4)
    assert len(out.metadata["folded_batch_norm"]) == 2
    assert {f["as"] for f in out.metadata["fused"]} == {"activation", "residual"}
