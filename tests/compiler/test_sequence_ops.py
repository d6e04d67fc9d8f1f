"""The graph IR's operators of sequence models (`vdla.compiler.ir.ops_sequence`): shape and
dtype inference, the errors for inputs that do not fit, and the float reference kernels
(`vdla.compiler.reference.kernels_sequence`) against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vdla.compiler.ir import Graph, GraphError
from vdla.compiler.reference import run_reference

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
Y = RNG.standard_normal((4, 5)).astype(np.float32)


def one_op(op, inputs, consts=None, order=None, **attrs):
    """A graph of one `op` node over graph inputs ``{name: (shape, dtype)}`` and
    constants ``{name: array}`` (in the order given, inputs first, unless `order` lists
    the names); returns (graph, out)."""
    g = Graph(op)
    names = [g.add_input(n, s, d) for n, (s, d) in inputs.items()]
    names += [g.add_constant(n, v) for n, v in (consts or {}).items()]
    out = g.add_node(op, order or names, **attrs)
    g.set_outputs([out])
    return g.validate(), out


def run_one(op, feed, consts=None, order=None, **attrs):
    g, out = one_op(op, {n: (v.shape, "bool" if v.dtype == bool else str(v.dtype))
                         for n, v in feed.items()}, consts, order, **attrs)
    return run_reference(g, feed)[out], g.tensors[out]


T = torch.from_numpy


@pytest.mark.parametrize("op, fn", [("sub", torch.sub), ("div", torch.div),
                                    ("pow", lambda a, b: torch.pow(a.abs(), b))])
def test_binary(op, fn):
    a = np.abs(X) + 0.5 if op == "pow" else X
    got, t = run_one(op, {"a": a, "b": Y})
    np.testing.assert_allclose(got, fn(T(a), T(Y)).numpy(), rtol=1e-5)
    assert t.shape == X.shape and t.dtype == "float32"


@pytest.mark.parametrize("op, fn", [("sqrt", torch.sqrt), ("erf", torch.erf),
                                    ("tanh", torch.tanh), ("exp", torch.exp),
                                    ("neg", torch.neg)])
def test_unary(op, fn):
    x = np.abs(X) if op == "sqrt" else X
    got, _ = run_one(op, {"x": x})
    np.testing.assert_allclose(got, fn(T(x)).numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("op, fn", [("reduce_mean", np.mean), ("reduce_sum", np.sum),
                                    ("reduce_max", np.max)])
@pytest.mark.parametrize("axes, keepdims", [((-1, 1), True), ((), False), ((2,), False)])
def test_reductions(op, fn, axes, keepdims):
    got, t = run_one(op, {"x": X}, axes=axes, keepdims=keepdims)
    want = fn(X.astype(np.float64), axis=tuple(a % 4 for a in axes) or None,
              keepdims=keepdims)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert t.shape == want.shape


def test_layer_norm_and_gelu_match_torch():
    scale, bias = RNG.standard_normal(5).astype(np.float32), RNG.standard_normal(5)
    got, _ = run_one("layer_norm", {"x": X}, {"s": scale, "b": bias.astype(np.float32)},
                     epsilon=1e-6)
    want = torch.nn.functional.layer_norm(T(X), (5,), T(scale), T(bias.astype(np.float32)),
                                          eps=1e-6)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
    for approximate in ("none", "tanh"):
        got, _ = run_one("gelu", {"x": X * 3}, approximate=approximate)
        want = torch.nn.functional.gelu(T(X * 3), approximate=approximate)
        np.testing.assert_allclose(got, want.numpy(), atol=1e-6)


def test_dense_with_gelu_activation():
    w = RNG.standard_normal((6, 5)).astype(np.float32)
    got, _ = run_one("dense", {"x": Y}, {"w": w}, activation="gelu_tanh")
    want = torch.nn.functional.gelu(T(Y) @ T(w).T, approximate="tanh")
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
    with pytest.raises(GraphError, match="activation 'gelu' is not one of"):
        one_op("conv2d", {"x": ((1, 5, 4, 4), "float32")},
               {"w": np.ones((6, 5, 1, 1), np.float32)}, activation="gelu")


def test_gather_takes_rows_and_refuses_ids_out_of_range():
    table = RNG.standard_normal((10, 6)).astype(np.float32)
    ids = np.array([[0, 9, -1, 3]])
    got, t = run_one("gather", {"ids": ids}, {"table": table}, ["table", "ids"])
    np.testing.assert_array_equal(got, table[ids])
    assert t.shape == (1, 4, 6)
    g, out = one_op("gather", {"ids": ((1, 4), "int64")}, {"table": table}, ["table", "ids"])
    with pytest.raises(ValueError, match=r"index 10 in 'ids' is outside \[-10, 10\), the 10 "
                                         r"entries of 'table' along axis 0"):
        run_reference(g, {"ids": np.array([[0, 10, 1, 2]])})
    with pytest.raises(GraphError, match=r"index -11 in 'i' is outside \[-10, 10\)"):
        one_op("gather", {"x": ((10, 6), "float32")}, {"i": np.array([1, -11])})
    with pytest.raises(GraphError, match="indices 'i' are float32; they must be int32 or int64"):
        one_op("gather", {"x": ((10, 6), "float32")}, {"i": np.array([1.0], np.float32)})
    # int8 tables gather as they are (the quantized embedding).
    got, t = run_one("gather", {"ids": np.array([2, 0], np.int32)},
                     {"table": np.arange(12, dtype=np.int8).reshape(6, 2)}, ["table", "ids"])
    assert t.dtype == "int8" and got.tolist() == [[4, 5], [0, 1]]


def test_slice_expand_where_cast_compare():
    got, t = run_one("slice", {"x": X}, starts=(1, 0), ends=(3, 5), axes=(1, 3), steps=(1, 2))
    np.testing.assert_array_equal(got, X[:, 1:3, :, 0:5:2])
    with pytest.raises(GraphError, match=r"start 2, end 2, step 1 select nothing on axis 1"):
        one_op("slice", {"x": ((2, 3), "float32")}, starts=(2,), ends=(2,), axes=(1,),
               steps=(1,))
    z = RNG.standard_normal((1, 4, 1)).astype(np.float32)
    got, t = run_one("expand", {"x": z}, shape=(3, 1, 5))
    assert t.shape == (3, 4, 5) and np.array_equal(got, np.broadcast_to(z, (3, 4, 5)))
    c = RNG.random((4, 5)) > 0.5
    got, t = run_one("where", {"c": c, "a": X, "b": Y})
    np.testing.assert_array_equal(got, np.where(c, X, Y))
    with pytest.raises(GraphError, match="condition 'c' is float32; it must be bool"):
        one_op("where", {"c": ((4, 5), "float32"), "a": (X.shape, "float32"),
                         "b": ((4, 5), "float32")})
    got, t = run_one("cast", {"x": X * 3}, dtype="int64")
    np.testing.assert_array_equal(got, np.trunc(X * 3).astype(np.int64))
    for op, fn in (("equal", np.equal), ("less", np.less), ("greater", np.greater)):
        got, t = run_one(op, {"a": X, "b": Y})
        assert t.dtype == "bool" and np.array_equal(got, fn(X, Y))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_torch(causal):
    q = RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)
    k = RNG.standard_normal((1, 2, 5, 4)).astype(np.float32)
    v = RNG.standard_normal((1, 2, 5, 6)).astype(np.float32)
    mask = np.where(RNG.random((1, 1, 1, 5)) > 0.3, 0, -1e9).astype(np.float32)
    got, t = run_one("attention", {"q": q, "k": k, "v": v, "m": mask}, scale=0.5,
                     causal=causal)
    bias = T(mask)
    if causal:     # key t is visible to query s when t <= s + (T - S)
        bias = bias + torch.where(torch.ones(3, 5, dtype=torch.bool).tril(diagonal=2),
                                  0.0, float("-inf"))
    want = torch.nn.functional.scaled_dot_product_attention(T(q), T(k), T(v), attn_mask=bias,
                                                            scale=0.5)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
    assert t.shape == (1, 2, 3, 6)


@pytest.mark.parametrize("inputs, attrs, pattern", [
    ({"q": (1, 2, 3, 4), "k": (1, 2, 5, 3), "v": (1, 2, 5, 6)}, {}, "do not fit"),
    ({"q": (1, 2, 3, 4), "k": (1, 2, 5, 4), "v": (1, 2, 5, 6), "m": (1, 1, 4, 5)}, {},
     r"mask 'm' of shape \(1, 1, 4, 5\) does not broadcast"),
    ({"q": (1, 2, 6, 4), "k": (1, 2, 5, 4), "v": (1, 2, 5, 6)}, {"causal": True},
     "at least as many keys"),
])
def test_attention_shape_errors(inputs, attrs, pattern):
    with pytest.raises(GraphError, match=pattern):
        one_op("attention", {n: (s, "float32") for n, s in inputs.items()}, **attrs)


@pytest.mark.parametrize("op, inputs, attrs, shape", [
    ("qmatmul", {"a": (2, 3, 4), "b": (2, 5, 4)}, {"transpose_b": True}, (2, 3, 5)),
    ("qmatmul", {"a": (2, 3, 4), "b": (4, 5)}, {}, (2, 3, 5)),
    ("qsoftmax", {"x": (2, 3)}, {}, (2, 3)),
    ("qgelu", {"x": (2, 3)}, {}, (2, 3)),
    ("qlayer_norm", {"x": (2, 3)}, {"params": {"shift": 3}}, (2, 3)),
    ("qattention", {"q": (1, 2, 3, 4), "k": (1, 2, 5, 4), "v": (1, 2, 5, 6)},
     {"causal": True}, (1, 2, 3, 6)),
])
def test_integer_ops_infer_int8_shapes(op, inputs, attrs, shape):
    g, out = one_op(op, {n: (s, "int8") for n, s in inputs.items()}, **attrs)
    assert g.tensors[out].shape == shape and g.tensors[out].dtype == "int8"
    with pytest.raises(GraphError, match="must be int8"):
        one_op(op, {n: (s, "float32") for n, s in inputs.items()}, **attrs)


def test_bool_tensors():
    g = Graph("b")
    c = g.add_constant("c", np.array([True, False]))
    assert g.tensors[c].dtype == "bool"
    x = g.add_input("m", (2,), "bool")
    g.set_outputs([g.add_node("cast", [x], dtype="float32")])
    out = run_reference(g, {"m": np.array([True, False])})
    assert out[g.outputs[0]].tolist() == [1.0, 0.0]


def test_every_reference_kernel_pickles():
    """A compiled model holds its host ops' kernels and is pickled into the compile
    cache: no kernel may be a closure (the comparisons, reductions and unary functions
    made per op were, and a BERT with a mask could not be cached)."""
    import pickle

    from vdla.compiler.reference.registry import KERNELS

    for op, fn in KERNELS.items():
        assert pickle.loads(pickle.dumps(fn)) is not None, op


def _masked_softmax(x_shape, mask=None, mask_dtype="bool", **attrs):
    g = Graph("sm")
    x = g.add_input("x", x_shape, "int8")
    inputs = [x] + ([g.add_input("m", mask, mask_dtype)] if mask is not None else [])
    out = g.add_node("qsoftmax", inputs, params={"exp_multiplier": 4096, "prob_bits": 7},
                     **attrs)
    g.set_outputs([out])
    return g.validate(), out


@pytest.mark.parametrize("x, mask, dtype, attrs, pattern", [
    ((3, 4), (1, 4), "float32", {},
     r"mask 'm' is float32; it must be bool \(True: excluded\) or int8"),
    ((3, 4), (2, 4), "bool", {}, r"mask 'm' of shape \(2, 4\) does not broadcast"),
    ((4,), None, "bool", {"causal": True}, r"causal needs rows of queries and keys"),
    ((2, 3, 4), (1, 4), "bool", {"axis": 0}, r"normalizes its last axis \(-1\) or, on rank >= 2"),
])
def test_masked_qsoftmax_refuses_what_it_cannot_mean(x, mask, dtype, attrs, pattern):
    with pytest.raises(GraphError, match=pattern):
        _masked_softmax(x, mask, dtype, **attrs)


def test_masked_qsoftmax_is_qattentions_softmax():
    """The mask and causal flag leave out what qattention's softmax leaves out."""
    from vdla.compiler.reference import integer_transformer as it

    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (5, 6)).astype(np.int8)
    mask = np.array([[False, False, False, False, True, True]])
    g, out = _masked_softmax((5, 6), (1, 6), causal=True)
    got = run_reference(g, {"x": x, "m": mask})[out]
    excluded = mask | it.causal_exclusion(5, 6)
    want = it.qsoftmax(x, {"exp_multiplier": 4096, "prob_bits": 7}, excluded)
    np.testing.assert_array_equal(got, want)
    assert np.all(got[excluded] == 0)
