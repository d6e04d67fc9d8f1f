"""The transformer fusions (`vdla.compiler.passes.fuse_transformer`): each pattern on
hand-built graphs in the forms torch's exporters write it, the near misses that must stay
unfused, and whole exported models (both exporters) through `prepare`. Every rewrite is
checked with run_reference before and after."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vdla.compiler import Graph, run_reference
from vdla.compiler.passes import fuse_transformer, fusion_counts, prepare

RNG = np.random.default_rng(67)


def rand(*shape, scale=1.0):
    return np.asarray(RNG.standard_normal(shape) * scale, dtype=np.float32)


def const(g: Graph, value, name="c"):
    return g.add_constant(name, np.asarray(value, dtype=np.float32))


def check(g: Graph, fused: Graph | None = None, tol=1e-5, feed=None):
    """Run `g` and its fused copy on the same random inputs; return the fused graph."""
    fused = fused or fuse_transformer(g)
    fused.validate()
    feed = feed or {n: rand(*g.tensors[n].shape) for n in g.inputs}
    want, got = run_reference(g, feed), run_reference(fused, feed)
    assert set(got) == set(want)
    for name in want:
        scale = float(np.abs(want[name]).max()) or 1.0
        err = float(np.abs(got[name].astype(np.float64) - want[name]).max()) / scale
        assert err <= tol, f"{name}: relative error {err:.3g}"
    return fused


def ops(g: Graph) -> dict[str, int]:
    return g.count_ops()


# --- layer norm --------------------------------------------------------------------------

def layer_norm_graph(square="pow", divide="div", gamma=True, beta=True, two_subs=False,
                     axis=-1, eps=1e-5, exponent=2.0, gamma_first=False):
    g = Graph("ln")
    x = g.add_input("x", (2, 5, 16))
    m = g.add_node("reduce_mean", [x], axes=(axis,), keepdims=True)
    d = g.add_node("sub", [x, m])
    d2 = g.add_node("sub", [x, m]) if two_subs else d
    sq = (g.add_node("pow", [d, const(g, exponent)]) if square == "pow"
          else g.add_node("mul", [d, d]))
    v = g.add_node("reduce_mean", [sq], axes=(axis,), keepdims=True)
    s = g.add_node("sqrt", [g.add_node("add", [v, const(g, eps)])])
    if divide == "div":
        y = g.add_node("div", [d2, s])
    else:
        y = g.add_node("mul", [d2, g.add_node("div", [const(g, 1.0), s])])
    if gamma:
        w = const(g, RNG.random(16) + 0.5, "gamma")
        y = g.add_node("mul", [w, y] if gamma_first else [y, w])
    if beta:
        y = g.add_node("add", [y, const(g, rand(16), "beta")])
    g.set_outputs([y])
    return g


@pytest.mark.parametrize("variant", [
    {}, {"square": "mul"}, {"divide": "reciprocal"}, {"two_subs": True},
    {"gamma": False, "beta": False}, {"beta": False}, {"gamma_first": True},
    {"axis": 2, "eps": 1e-12}])
def test_layer_norm_written_out_fuses(variant):
    g = layer_norm_graph(**variant)
    fused = check(g)
    assert ops(fused) == {"layer_norm": 1}
    node = fused.nodes()[0]
    assert node.attrs["epsilon"] == pytest.approx(variant.get("eps", 1e-5))
    assert len(node.inputs) == (3 if variant.get("beta", True) else 2)
    assert fusion_counts(fused) == {"layer_norm": 1}
    assert g.count_ops().get("layer_norm") is None          # the input graph is untouched


@pytest.mark.parametrize("variant", [{"axis": 1}, {"exponent": 4.0}])
def test_layer_norm_near_misses_stay(variant):
    g = layer_norm_graph(**variant)
    fused = check(g)
    assert "layer_norm" not in ops(fused)
    assert fusion_counts(fused) == {}


def test_layer_norm_with_an_intermediate_read_outside_stays():
    g = layer_norm_graph()
    variance = [n for n in g.nodes() if n.op == "reduce_mean"][1].outputs[0]
    g.set_outputs(g.outputs + [variance])
    fused = check(g)
    assert "layer_norm" not in ops(fused)


# --- GELU --------------------------------------------------------------------------------

def erf_gelu(g, x, order="legacy", inner="div"):
    z = (g.add_node("div", [x, const(g, math.sqrt(2))]) if inner == "div"
         else g.add_node("mul", [x, const(g, 1 / math.sqrt(2))]))
    a = g.add_node("add", [g.add_node("erf", [z]), const(g, 1.0)])
    return _outer(g, x, a, order)


def tanh_gelu(g, x, order="legacy", cube="mul"):
    if cube == "pow":
        c = g.add_node("pow", [x, const(g, 3.0)])
    else:
        c = g.add_node("mul", [x, g.add_node("mul", [x, x])])
    w = g.add_node("add", [x, g.add_node("mul", [const(g, 0.044715), c])])
    t = g.add_node("tanh", [g.add_node("mul", [const(g, math.sqrt(2 / math.pi)), w])])
    a = g.add_node("add", [const(g, 1.0), t])
    return _outer(g, x, a, order)


def _outer(g, x, a, order):
    half = const(g, 0.5)
    if order == "legacy":          # (x * a) * 0.5: TorchScript
        return g.add_node("mul", [g.add_node("mul", [x, a]), half])
    if order == "dynamo":          # x * (a * 0.5)
        return g.add_node("mul", [x, g.add_node("mul", [half, a])])
    return g.add_node("mul", [g.add_node("mul", [half, x]), a])     # (0.5 * x) * a


@pytest.mark.parametrize("order", ["legacy", "dynamo", "half_first"])
@pytest.mark.parametrize("form", ["erf_div", "erf_mul", "tanh_mul", "tanh_pow"])
def test_gelu_written_out_fuses(form, order):
    g = Graph("gelu")
    x = g.add_input("x", (3, 40))
    kind, how = form.split("_")
    y = (erf_gelu(g, x, order, how) if kind == "erf" else tanh_gelu(g, x, order, how))
    g.set_outputs([y])
    fused = check(g, feed={"x": rand(3, 40, scale=3.0)})
    assert ops(fused) == {"gelu": 1}
    assert fused.nodes()[0].attrs["approximate"] == ("none" if kind == "erf" else "tanh")
    assert fusion_counts(fused) == {"gelu" if kind == "erf" else "gelu_tanh": 1}


def test_gelu_with_other_constants_stays():
    g = Graph("not_gelu")
    x = g.add_input("x", (3, 8))
    z = g.add_node("div", [x, const(g, 1.5)])
    a = g.add_node("add", [g.add_node("erf", [z]), const(g, 1.0)])
    g.set_outputs([_outer(g, x, a, "legacy")])
    assert "gelu" not in ops(check(g))
    g = Graph("not_gelu_either")
    x = g.add_input("x", (3, 8))
    y = erf_gelu(g, x)
    a = [n for n in g.nodes() if n.op == "add"][0].outputs[0]
    g.set_outputs([y, a])                     # the 1 + erf(...) read outside: stays
    assert "gelu" not in ops(check(g))


# --- dense epilogues and Q/K/V -----------------------------------------------------------

def linear3d(g, x, w, b=None, name="fc"):
    """What the importer makes of a linear layer on (1, S, K): reshape, dense, reshape,
    and the bias as an add after it."""
    s, k = g.tensors[x].shape[1:]
    flat = g.add_node("reshape", [x], shape=(s, k))
    y = g.add_node("dense", [flat, const(g, w, f"{name}_w")], name=name)
    y = g.add_node("reshape", [y], shape=(1, s, w.shape[0]))
    if b is not None:
        y = g.add_node("add", [const(g, b, f"{name}_b"), y])
    return y


def test_dense_bias_and_gelu_through_reshape():
    g = Graph("mlp")
    x = g.add_input("x", (1, 6, 8))
    h = linear3d(g, x, rand(32, 8, scale=0.3), rand(32), "fc1")
    h = g.add_node("gelu", [h])
    y = linear3d(g, h, rand(8, 32, scale=0.3), rand(8), "fc2")
    g.set_outputs([g.add_node("add", [x, y])])
    fused = check(g)
    assert ops(fused) == {"reshape": 2, "dense": 2, "add": 1}
    dense = {n.name: n for n in fused.nodes() if n.op == "dense"}
    assert dense["fc1"].attrs["activation"] == "gelu" and dense["fc1"].input(2)
    assert dense["fc2"].attrs["activation"] is None and dense["fc2"].input(2)
    counts = fusion_counts(fused)
    assert counts["dense_bias"] == 2 and counts["dense_gelu"] == 1
    assert counts["reshape_chain"] == 1


def test_dense_bias_that_is_no_bias_stays():
    g = Graph("no_bias")
    x = g.add_input("x", (1, 6, 8))
    y = linear3d(g, x, rand(4, 8), None)
    g.set_outputs([g.add_node("add", [y, const(g, rand(6, 1))])])  # along the sequence
    assert "dense_bias" not in fusion_counts(check(g))


def test_transposes_of_unit_axes_become_reshapes_and_merge():
    """torch's MultiheadAttention works sequence-first: (1, S, D) -> (S, 1, D) around its
    linear layers, transposes that move only the axis of length 1."""
    g = Graph("seq_first")
    x = g.add_input("x", (1, 6, 8))
    t = g.add_node("transpose", [x], perm=(1, 0, 2))
    y = g.add_node("dense", [g.add_node("reshape", [t], shape=(6, 8)),
                             const(g, rand(8, 8), "w")], name="fc")
    y = g.add_node("transpose", [g.add_node("reshape", [y], shape=(6, 1, 8))], perm=(1, 0, 2))
    y = g.add_node("add", [y, const(g, rand(8), "b")])
    g.set_outputs([g.add_node("transpose", [y], perm=(0, 2, 1))])     # a real one: stays
    fused = check(g)
    assert ops(fused) == {"reshape": 2, "dense": 1, "transpose": 1}
    assert fused.node("fc").input(2)
    assert fusion_counts(fused)["unit_transpose"] == 2


def test_qkv_projections_merge_into_one_dense():
    g = Graph("qkv")
    x = g.add_input("x", (1, 6, 16))
    flat = g.add_node("reshape", [x], shape=(6, 16))
    outs = [g.add_node("dense", [flat, const(g, rand(16, 16), f"w{i}"),
                                 const(g, rand(16), f"b{i}")], name=n)
            for i, n in enumerate("qkv")]
    g.set_outputs([g.add_node("add", [g.add_node("mul", [outs[0], outs[1]]), outs[2]])])
    fused = check(g)
    assert ops(fused) == {"reshape": 1, "dense": 1, "slice": 3, "mul": 1, "add": 1}
    merged = next(n for n in fused.nodes() if n.op == "dense")
    assert fused.tensors[merged.inputs[1]].shape == (48, 16)
    assert fusion_counts(fused)["qkv"] == 1


# --- attention ---------------------------------------------------------------------------

def heads(g, x, h, name):
    """(1, S, D) -> (1, H, S, D/H) as the exporters write it (reshape, transpose)."""
    _, s, d = g.tensors[x].shape
    r = g.add_node("reshape", [x], shape=(1, s, h, d // h), name=f"{name}_split")
    return g.add_node("transpose", [r], perm=(0, 2, 1, 3), name=f"{name}_heads")


def attention_graph(mask=None, causal=None, scale="div", k_perm="transpose", s=6, t=6,
                    probs_out=False):
    """q @ k^T [scaled] [+ mask] [causal] -> softmax -> @ v with 2 heads of 8."""
    g = Graph("attn")
    q = heads(g, g.add_input("q_in", (1, s, 16)), 2, "q")
    kin = g.add_input("k_in", (1, t, 16))
    v = heads(g, g.add_input("v_in", (1, t, 16)), 2, "v")
    if k_perm == "transpose":        # (1, 2, t, 8) then swapped: two transposes
        kt = g.add_node("transpose", [heads(g, kin, 2, "k")], perm=(0, 1, 3, 2))
    else:                             # one transpose straight to (1, 2, 8, t): TorchScript
        r = g.add_node("reshape", [kin], shape=(1, t, 2, 8))
        kt = g.add_node("transpose", [r], perm=(0, 2, 3, 1))
    c = 1 / math.sqrt(8)
    if scale == "both":               # scaled_dot_product_attention: sqrt(c) on each side
        q = g.add_node("mul", [q, const(g, math.sqrt(c))])
        kt = g.add_node("mul", [kt, const(g, math.sqrt(c))])
    scores = g.add_node("matmul", [q, kt])
    if scale == "div":
        scores = g.add_node("div", [scores, const(g, math.sqrt(8))])
    elif scale == "mul":
        scores = g.add_node("mul", [const(g, c), scores])
    if mask == "input":
        m = g.add_input("mask", (1, 1, 1, t))
        scores = g.add_node("add", [scores, m])
    elif mask == "causal_add":        # a constant 0 / -inf causal mask
        bias = np.where(np.triu(np.ones((s, t), bool), 1 + t - s), -np.inf, 0.0)
        scores = g.add_node("add", [scores, const(g, bias, "causal_bias")])
    if causal == "where":             # masked_fill(~tril, -inf): where(cond, fill, scores)
        cond = g.add_constant("cond", np.triu(np.ones((1, 1, s, t), bool), 1 + t - s))
        scores = g.add_node("where", [cond, const(g, -np.inf), scores])
    elif causal == "where_keep":      # GPT-2: where(tril, scores, -10000)
        cond = g.add_constant("cond", ~np.triu(np.ones((s, t), bool), 1 + t - s))
        scores = g.add_node("where", [cond, scores, const(g, -1e4)])
    elif causal == "band":            # not causal: a constant exclusion of its own
        cond = g.add_constant("cond", np.eye(s, t, 2, dtype=bool))
        scores = g.add_node("where", [cond, const(g, -1e9), scores])
    p = g.add_node("softmax", [scores], axis=-1)
    y = g.add_node("matmul", [p, v])
    g.set_outputs([y] + ([p] if probs_out else []))
    return g


def attention_feed(g):
    feed = {n: rand(*g.tensors[n].shape) for n in g.inputs}
    if "mask" in feed:
        feed["mask"] = np.where(RNG.random(feed["mask"].shape) < 0.3, -1e4, 0.0) \
            .astype(np.float32)
        feed["mask"][..., 0] = 0.0
    return feed


@pytest.mark.parametrize("kwargs, causal, has_mask", [
    ({}, False, False),
    ({"scale": "mul"}, False, False),
    ({"scale": "none"}, False, False),
    ({"scale": "both"}, False, False),
    ({"k_perm": "direct"}, False, False),
    ({"mask": "input"}, False, True),
    ({"mask": "causal_add"}, True, False),
    ({"causal": "where"}, True, False),
    ({"causal": "where_keep", "mask": "input"}, True, True),
    ({"causal": "where", "s": 3, "t": 7}, True, False),
    ({"causal": "band"}, False, True),
])
def test_attention_core_fuses(kwargs, causal, has_mask):
    g = attention_graph(**kwargs)
    fused = check(g, feed=attention_feed(g))
    counts = ops(fused)
    assert counts.get("attention") == 1 and "softmax" not in counts \
        and "matmul" not in counts
    node = next(n for n in fused.nodes() if n.op == "attention")
    assert node.attrs["causal"] is causal
    assert bool(node.input(3)) is has_mask
    want = 1.0 if kwargs.get("scale") == "none" else 1 / math.sqrt(8)
    assert node.attrs["scale"] == pytest.approx(want, rel=1e-6)
    k = fused.tensors[node.inputs[1]]
    assert k.shape == (1, 2, kwargs.get("t", 6), 8)          # k, not k transposed
    assert counts.get("transpose", 0) <= 3                   # q, k and v heads only


def test_attention_whose_probabilities_are_read_stays():
    g = attention_graph(probs_out=True)
    fused = check(g)
    assert "attention" not in ops(fused) and ops(fused)["softmax"] == 1


def test_softmax_over_another_axis_is_no_attention():
    g = attention_graph()
    sm = next(n for n in g.nodes() if n.op == "softmax")
    # softmax over the query axis is no attention
    g2 = g.copy()
    g2.replace_node(type(sm)(sm.name, sm.op, sm.inputs, sm.outputs, dict(sm.attrs, axis=2)))
    assert "attention" not in ops(check(g2))


# --- exported models ---------------------------------------------------------------------

def _import(path):
    from vdla.compiler.frontend.onnx_import import from_onnx
    return from_onnx(str(path))


def _relative(got, want) -> float:
    return float(np.abs(got.astype(np.float64) - want).max()) / (float(np.abs(want).max())
                                                                  or 1.0)


def check_prepared(graph: Graph, inputs) -> Graph:
    """prepare(graph), checked against graph on `inputs` within float rounding."""
    prepared = prepare(graph)
    want, got = run_reference(graph, inputs), run_reference(prepared, inputs)
    for name in want:
        assert _relative(got[name], want[name]) <= 1e-5, name
    return prepared


def assert_fully_fused(prepared: Graph, layers: int):
    """Nothing of an attention core, a LayerNorm or a GELU is left written out; bias-only
    dense layers reading one input are merged."""
    counts = ops(prepared)
    assert counts.get("attention") == layers
    for op in ("softmax", "matmul", "erf", "pow", "sqrt", "reduce_mean", "div", "where"):
        assert op not in counts, f"{op} left unfused: {counts}"
    readers = {}
    for n in prepared.nodes():
        if n.op == "dense" and n.attrs["activation"] is None and not n.input(3):
            readers.setdefault(n.inputs[0], []).append(n.name)
    assert all(len(names) == 1 for names in readers.values()), readers


# The dynamo exporter takes 5 to 20 seconds a model: the suite runs it on the block below
# (which has the patterns the zoo's models lack); these under -m slow.
DYNAMO_SLOW = pytest.mark.slow


@pytest.mark.parametrize("kind, exporter", [
    ("vit", "legacy"), ("bert", "legacy"), ("gpt", "legacy"),
    pytest.param("gpt", "dynamo", marks=DYNAMO_SLOW),
    pytest.param("vit", "dynamo", marks=DYNAMO_SLOW),
    pytest.param("bert", "dynamo", marks=DYNAMO_SLOW)])
def test_exported_transformers_fuse(kind, exporter, tmp_path):
    from transformer_models import exported
    path, inputs, _ = exported(kind, exporter, tmp_path)
    prepared = check_prepared(_import(path), inputs)
    assert_fully_fused(prepared, layers=2)
    counts = fusion_counts(prepared)
    assert counts["attention"] == 2 and counts["dense_gelu"] == 2
    assert counts["gelu_tanh" if kind == "gpt" else "gelu"] == 2
    for node in (n for n in prepared.nodes() if n.op == "attention"):
        assert node.attrs["causal"] is (kind == "gpt")
        assert bool(node.input(3)) is (kind == "bert")      # the attention_mask input
        assert node.attrs["scale"] == pytest.approx(1 / math.sqrt(16))
    # BERT's additive mask stays a float computation, not a depthwise convolution.
    assert "conv2d" not in ops(prepared) or kind == "vit"


class _ManualBlock:
    """A pre-norm block with LayerNorm written out by hand (mean, variance, sqrt),
    separate Q, K, V projections, torch's scaled_dot_product_attention (causal) and the
    tanh GELU module: the patterns the zoo's models do not write."""

    @staticmethod
    def build():
        import torch
        import torch.nn.functional as F
        from torch import nn

        class ManualLayerNorm(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.w = nn.Parameter(1 + 0.2 * torch.randn(d))
                self.b = nn.Parameter(0.2 * torch.randn(d))

            def forward(self, x):
                m = x.mean(-1, keepdim=True)
                v = ((x - m) ** 2).mean(-1, keepdim=True)
                return (x - m) / torch.sqrt(v + 1e-5) * self.w + self.b

        class Block(nn.Module):
            def __init__(self, d=32, h=2):
                super().__init__()
                self.h, self.ln1, self.ln2 = h, ManualLayerNorm(d), ManualLayerNorm(d)
                self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
                self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"),
                                         nn.Linear(4 * d, d))

            def forward(self, x):
                b, n, d = x.shape
                y = self.ln1(x)

                def split(t):
                    return t.reshape(b, n, self.h, d // self.h).transpose(1, 2)

                a = F.scaled_dot_product_attention(split(self.q(y)), split(self.k(y)),
                                                   split(self.v(y)), is_causal=True)
                x = x + a.transpose(1, 2).reshape(b, n, d)
                return x + self.mlp(self.ln2(x))

        torch.manual_seed(0)
        return Block().eval()


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_exported_written_out_layer_norm_and_sdpa_fuse(exporter, tmp_path):
    import torch
    from transformer_models import export
    model = _ManualBlock.build()
    inputs = {"x": rand(1, 8, 32)}
    path = export(model, inputs, tmp_path / f"block_{exporter}.onnx", exporter)
    graph = _import(path)
    with torch.no_grad():
        want = model(torch.from_numpy(inputs["x"])).numpy()
    assert _relative(run_reference(graph, inputs)["logits"], want) <= 1e-5
    prepared = check_prepared(graph, inputs)
    assert_fully_fused(prepared, layers=1)
    counts = fusion_counts(prepared)
    assert counts["layer_norm"] == 2 and counts["qkv"] == 1
    assert counts["gelu_tanh"] == 1 and counts["dense_gelu"] == 1
    node = next(n for n in prepared.nodes() if n.op == "attention")
    assert node.attrs["causal"] is True and not node.input(3)
    assert node.attrs["scale"] == pytest.approx(1 / math.sqrt(16), rel=1e-6)


def test_causal_exclusion_with_fewer_keys_than_queries_stays():
    g = attention_graph(causal="where", s=7, t=3)
    fused = fuse_transformer(g)
    assert "attention" not in ops(fused)


def test_a_mask_computed_from_the_scores_stays():
    g = attention_graph(scale="none")
    sm = next(n for n in g.nodes() if n.op == "softmax")
    scores = sm.inputs[0]
    mask = g.add_node("mul", [scores, const(g, 0.5)])
    biased = g.add_node("add", [scores, mask])
    g.replace_node(type(sm)(sm.name, sm.op, [biased], sm.outputs, dict(sm.attrs)))
    fused = check(g)
    assert "attention" not in ops(fused)


def test_relu_after_a_gelu_dense_is_not_composed_into_it():
    g = Graph("gelu_relu")
    x = g.add_input("x", (4, 8))
    y = g.add_node("dense", [x, const(g, rand(16, 8), "w")], name="fc")
    g.set_outputs([g.add_node("relu", [g.add_node("gelu", [y])])])
    prepared = check(g, prepare(g))
    assert ops(prepared) == {"dense": 1, "relu": 1}
    assert prepared.node("fc").attrs["activation"] == "gelu"


def test_prepare_twice_changes_nothing_more():
    g = attention_graph(mask="input", causal="where_keep")
    once = prepare(g)
    twice = prepare(once)
    assert ops(twice) == ops(once)
    assert len(twice.metadata["fused_transformer"]) == len(once.metadata["fused_transformer"])
    check(once, twice, feed=attention_feed(g))
