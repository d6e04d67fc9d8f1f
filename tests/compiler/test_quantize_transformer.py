"""Quantizing transformers (`vdla.compiler.passes.quantize_transformer`): which float ops
become which integer ops, the attention mask rule, the float option, calibration with
token ids and masks, and tiny BERT, GPT and ViT models running on the reference close to
float."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vdla.compiler.ir import Graph
from vdla.compiler.passes.quantize import quantize
from vdla.compiler.reference import run_reference
from vdla.compiler.reference.integer import QuantizationError

MODES = pytest.mark.parametrize("mode", ["shift", "multiply"])
S, D, HEADS = 8, 16, 2
DH = D // HEADS


def _dense(g: Graph, rng, x: str, n_in: int, n_out: int, name: str, **attrs) -> str:
    w = g.add_constant(f"{name}.w", rng.normal(0, 1 / math.sqrt(n_in), (n_out, n_in))
                       .astype(np.float32))
    b = g.add_constant(f"{name}.b", rng.normal(0, 0.1, n_out).astype(np.float32))
    return g.add_node("dense", [x, w, b], name=name, **attrs)


def _heads(g: Graph, x: str, name: str) -> str:
    y = g.add_node("reshape", [x], shape=(1, S, HEADS, DH), name=f"{name}.split")
    return g.add_node("transpose", [y], perm=(0, 2, 1, 3), name=f"{name}.heads")


def encoder(mask: str | None = "ids", causal: bool = False, gelu_fused: bool = False,
            seed: int = 0) -> Graph:
    """One pre-norm transformer block on (1, S, D) float input ``x``: layer_norm, Q/K/V
    dense layers, the fused attention (an additive mask from an int64 ``keep`` input:
    (1 - keep) * -10000, or `mask` "soft": (1 - keep) * -0.5), the output projection, a
    residual add, an MLP with GELU, another residual and a final layer_norm."""
    rng = np.random.default_rng(seed)
    g = Graph("encoder")
    x = g.add_input("x", (1, S, D))

    def norm(t: str, name: str) -> str:
        gamma = g.add_constant(f"{name}.g", rng.normal(1, 0.2, D).astype(np.float32))
        beta = g.add_constant(f"{name}.b", rng.normal(0, 0.2, D).astype(np.float32))
        return g.add_node("layer_norm", [t, gamma, beta], name=name, epsilon=1e-5)

    h = g.add_node("reshape", [norm(x, "ln1")], shape=(S, D), name="ln1.flat")
    q, k, v = (_heads(g, _dense(g, rng, h, D, D, n), n) for n in ("q", "k", "v"))
    inputs = [q, k, v]
    if mask:
        keep = g.add_input("keep", (1, S), "int64")
        kf = g.add_node("cast", [keep], dtype="float32", name="keep.f")
        one = g.add_constant("one", np.ones(1, np.float32))
        low = g.add_constant("low", np.full(1, -10000.0 if mask == "ids" else -0.5,
                                            np.float32))
        add = g.add_node("mul", [g.add_node("sub", [one, kf], name="drop"), low], name="mask")
        inputs.append(g.add_node("reshape", [add], shape=(1, 1, 1, S), name="mask4"))
    a = g.add_node("attention", inputs, scale=1 / math.sqrt(DH), causal=causal, name="attn")
    a = g.add_node("reshape", [g.add_node("transpose", [a], perm=(0, 2, 1, 3))],
                   shape=(S, D), name="attn.flat")
    a = g.add_node("reshape", [_dense(g, rng, a, D, D, "proj")], shape=(1, S, D))
    r = g.add_node("add", [x, a], name="res1")
    m = g.add_node("reshape", [norm(r, "ln2")], shape=(S, D), name="ln2.flat")
    if gelu_fused:
        m = _dense(g, rng, m, D, 4 * D, "fc1", activation="gelu")
    else:
        m = g.add_node("gelu", [_dense(g, rng, m, D, 4 * D, "fc1")], name="act")
    m = g.add_node("reshape", [_dense(g, rng, m, 4 * D, D, "fc2")], shape=(1, S, D))
    y = norm(g.add_node("add", [r, m], name="res2"), "ln3")
    g.set_outputs([y])
    return g.validate()


def samples(g: Graph, n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        feed = {"x": rng.normal(0, 1, (1, S, D)).astype(np.float32)}
        if "keep" in g.inputs:
            keep = np.ones((1, S), np.int64)
            keep[0, S - rng.integers(0, 3):] = 0
            feed["keep"] = keep
        out.append(feed)
    return out


def relative_error(g: Graph, q: Graph, feeds) -> float:
    worst = 0.0
    for feed in feeds:
        f = run_reference(g, feed)[g.outputs[0]]
        o = run_reference(q, feed)[q.outputs[0]]
        worst = max(worst, float(np.abs(o - f).max() / np.abs(f).max()))
    return worst


@MODES
@pytest.mark.parametrize("causal", [False, True])
def test_an_encoder_block_becomes_integer_ops_and_stays_close_to_float(mode, causal):
    g = encoder(causal=causal)
    q = quantize(g, samples(g, 16, seed=1), mode)
    ops = q.count_ops()
    assert ops["qattention"] == 1 and ops["qlayer_norm"] == 3 and ops["qgelu"] == 1
    # Q, K and V share their input: one dense (`fuse_transformer`), sliced; the two
    # residual adds ride in the dense layers before them (`prepare.fuse`, through the
    # reshape to (batch, tokens, features)).
    assert ops["qdense"] == 4 and "qadd" not in ops and ops["less"] == 1
    assert sum(len(n.inputs) == 4 for n in q.nodes() if n.op == "qdense") == 2
    assert not {"attention", "layer_norm", "gelu", "softmax", "dense"} & set(ops)
    att = q.node("attn")
    assert att.attrs["causal"] is causal
    assert q.tensors[att.inputs[3]].dtype == "bool"
    if mode == "shift":         # every requantization of the attention is a shift
        assert att.attrs["qk_multiplier"] is None and att.attrs["pv_multiplier"] is None
        for n in q.nodes():
            if n.op == "qdense":
                assert n.attrs.get("multiplier") is None
                assert n.attrs.get("residual_multiplier") is None
    assert "float_ops" not in q.metadata["quantized"]
    # Max calibration on 16 samples: a test sample past a calibrated range clips (the
    # bound has room for it; the integer definitions themselves are within an LSB or
    # two: test_integer_transformer.py).
    assert relative_error(g, q, samples(g, 4, seed=9)) < 0.1


def test_padding_excluded_by_the_mask_changes_nothing_else():
    """The integer attention leaves masked keys out: changing the input at a masked
    position changes no output row of a kept query beyond the residual path's own row."""
    g = encoder()
    q = quantize(g, samples(g, 6, seed=1), "multiply")
    feed = samples(g, 1, seed=3)[0]
    feed["keep"] = np.ones((1, S), np.int64)
    feed["keep"][0, -2:] = 0
    other = {k: v.copy() for k, v in feed.items()}
    other["x"][0, -2:] += 3.0
    a, b = run_reference(q, feed)[q.outputs[0]], run_reference(q, other)[q.outputs[0]]
    np.testing.assert_array_equal(a[0, :-2], b[0, :-2])


def test_a_mask_that_is_no_exclusion_keeps_the_attention_in_float():
    g = encoder(mask="soft")
    q = quantize(g, samples(g, 4, seed=1), "multiply")
    assert q.node("attn").op == "attention"
    reason = q.metadata["quantized"]["float_ops"]["attn"]
    assert "mask" in reason and "-0.5" in reason and "neither 0 nor an exclusion" in reason
    assert q.count_ops()["qlayer_norm"] == 3            # the rest is integer


def test_integer_nonlinear_false_keeps_softmax_layer_norm_gelu_attention_in_float():
    g = encoder(gelu_fused=True)
    cal = samples(g, 4, seed=1)
    q = quantize(g, cal, "multiply", integer_nonlinear=False)
    ops = q.count_ops()
    assert ops["attention"] == 1 and ops["layer_norm"] == 3 and ops["gelu"] == 1
    assert not {"qattention", "qlayer_norm", "qgelu", "qsoftmax"} & set(ops)
    assert ops["qdense"] == 4
    assert q.metadata["quantized"]["integer_nonlinear"] is False
    assert set(q.metadata["quantized"]["float_ops"]) >= {"attn", "ln1", "ln2", "ln3"}
    assert relative_error(g, q, samples(g, 3, seed=9)) < 0.15
    with pytest.raises(QuantizationError, match="integer_nonlinear must be True or False"):
        quantize(g, cal, "multiply", integer_nonlinear="no")


def test_a_dense_with_a_fused_gelu_becomes_qdense_then_qgelu():
    g = encoder(gelu_fused=True)
    q = quantize(g, samples(g, 4, seed=1), "shift")
    (gelu,) = [n for n in q.nodes() if n.op == "qgelu"]
    assert q.producer(gelu.inputs[0]).op == "qdense"
    assert q.producer(gelu.inputs[0]).name == "fc1"
    assert relative_error(g, q, samples(g, 3, seed=9)) < 0.08


@MODES
def test_matmul_and_softmax_of_activations_become_qmatmul_and_qsoftmax(mode):
    rng = np.random.default_rng(0)
    g = Graph("mm")
    a = g.add_input("a", (2, 4, 8))
    b = g.add_input("b", (2, 8, 4))
    s = g.add_node("matmul", [a, b], name="scores")
    p = g.add_node("softmax", [s], axis=-1, name="probs")
    y = g.add_node("matmul", [p, a], name="mix")
    g.set_outputs([g.add_node("relu", [y]), g.add_node("reshape", [p], shape=(2, 16))])
    cal = [{"a": rng.normal(0, 1, (2, 4, 8)).astype(np.float32),
            "b": rng.normal(0, 0.3, (2, 8, 4)).astype(np.float32)} for _ in range(4)]
    q = quantize(g, cal, mode)
    assert [q.node(n).op for n in ("scores", "probs", "mix")] == \
        ["qmatmul", "qsoftmax", "qmatmul"]
    probs = q.node("probs")
    assert q.tensors[probs.outputs[0]].scale == 2.0 ** -probs.attrs["params"]["prob_bits"]
    if mode == "shift":
        assert q.node("scores").attrs["multiplier"] is None
    f, o = run_reference(g, cal[0]), run_reference(q, cal[0])
    for name, qname in zip(g.outputs, q.outputs):
        assert np.abs(f[name] - o[qname]).max() <= 0.06 * np.abs(f[name]).max() + 0.02
    # A softmax that is the graph's own output stays float (int8 would only lose bits).
    g2 = Graph("sm")
    x = g2.add_input("x", (2, 4))
    g2.set_outputs([g2.add_node("softmax", [x], axis=-1, name="out")])
    assert quantize(g2, {"x": np.ones((3, 2, 4), np.float32)}, mode).node("out").op == \
        "softmax"


def test_calibration_copes_with_token_ids_bool_masks_and_minus_infinity():
    """Embeddings (a constant table gathered by int64 ids) become a gather on the int8
    table, bit for bit quantize(gather(table)); a bool input and -inf values calibrate."""
    rng = np.random.default_rng(2)
    table = rng.normal(0, 1, (50, D)).astype(np.float32)
    g = Graph("embed")
    ids = g.add_input("ids", (1, S), "int64")
    keep = g.add_input("keep", (1, S), "bool")
    e = g.add_node("gather", [g.add_constant("table", table), ids], axis=0, name="emb")
    gamma = g.add_constant("g", np.ones(D, np.float32))
    h = g.add_node("layer_norm", [e, gamma], name="ln")
    inf = g.add_constant("minf", np.full(1, -np.inf, np.float32))
    zero = g.add_constant("zero", np.zeros(1, np.float32))
    bias = g.add_node("where", [keep, zero, inf], name="bias")        # 0 or -inf
    m = g.add_node("reshape", [bias], shape=(1, 1, 1, S), name="bias4")
    hh = _heads(g, g.add_node("reshape", [h], shape=(S, D)), "h")
    att = g.add_node("attention", [hh, hh, hh, m], scale=0.3, name="attn")
    g.set_outputs([att, e])
    feeds = [{"ids": rng.integers(0, 50, (1, S)), "keep": np.arange(S)[None] < S - i}
             for i in range(4)]
    q = quantize(g, feeds, "shift")
    emb = q.node("emb")
    assert emb.op == "gather" and q.tensors[emb.inputs[0]].dtype == "int8"
    assert q.node("attn").op == "qattention" and q.node("ln").op == "qlayer_norm"
    s = q.tensors[emb.outputs[0]].scale
    got = run_reference(q, feeds[1], keep=True)[emb.outputs[0]]
    want = np.clip(np.floor(table[feeds[1]["ids"]] / s + 0.5), -128, 127)
    np.testing.assert_array_equal(got, want)
    f, o = run_reference(g, feeds[2]), run_reference(q, feeds[2])
    assert np.abs(f[att] - o[q.outputs[0]]).max() < 0.1 * np.abs(f[att]).max()


@pytest.mark.parametrize("exporter", ["legacy", pytest.param("dynamo", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", ["bert", "gpt", "vit"])
def test_tiny_torch_transformers_quantized_run_close_to_float(kind, exporter, tmp_path):
    """BERT, GPT and ViT (2 layers, width 32) exported by torch's TorchScript exporter
    (and its dynamo exporter, slow: about 15 s an export): every softmax, LayerNorm and
    GELU becomes integer, and the logits stay close to the float model's on inputs other
    than the calibration samples."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("torch")
    import transformer_models as tm
    from vdla.compiler.frontend.onnx_import import from_onnx
    path, inputs, model = tm.exported(kind, exporter, tmp_path)
    g = from_onnx(onnx.load(str(path)))
    cal = [tm.example_inputs(kind, model, seed=10 + i) for i in range(4)]
    q = quantize(g, cal, "shift")
    ops = q.count_ops()
    assert ops["qattention"] == 2 and ops["qlayer_norm"] >= 4 and ops["qgelu"] == 2
    assert not {"attention", "layer_norm", "gelu", "softmax"} & set(ops)
    for feed in (inputs, tm.example_inputs(kind, model, seed=3)):
        f = run_reference(g, feed)[g.outputs[0]]
        o = run_reference(q, feed)[q.outputs[0]]
        assert np.abs(o - f).max() <= 0.08 * np.abs(f).max(), kind


@pytest.mark.parametrize("fill", [-10000.0, -np.inf])
def test_an_unfused_masked_softmax_stays_in_float(fill):
    """Scores plus an exclusion mask that the fusion pass leaves alone (the masked
    scores are also a graph output): int8 cannot hold the scores and the exclusions, so
    the add and the softmax stay in float, saying why; the matmuls are integer."""
    rng = np.random.default_rng(5)
    g = Graph("unfused")
    a = g.add_input("a", (1, 2, S, DH))
    keep = g.add_input("keep", (1, S), "bool")
    s = g.add_node("matmul", [a, g.add_node("transpose", [a], perm=(0, 1, 3, 2))],
                   name="scores")
    zero = g.add_constant("zero", np.zeros(1, np.float32))
    low = g.add_constant("low", np.full(1, fill, np.float32))
    mask = g.add_node("reshape", [g.add_node("where", [keep, zero, low])], shape=(1, 1, 1, S))
    masked = g.add_node("add", [s, mask], name="masked")
    p = g.add_node("softmax", [masked], axis=-1, name="probs")
    g.set_outputs([g.add_node("matmul", [p, a], name="mix"), masked])
    feeds = [{"a": rng.normal(0, 1, (1, 2, S, DH)).astype(np.float32),
              "keep": np.arange(S)[None] < S - i} for i in range(1, 5)]
    q = quantize(g, feeds, "shift")
    assert [q.node(n).op for n in ("scores", "masked", "probs", "mix")] == \
        ["qmatmul", "add", "softmax", "qmatmul"]
    reasons = q.metadata["quantized"]["float_ops"]
    assert "exclusion mask" in reasons["masked"] and "exclusions" in reasons["probs"]
    f, o = run_reference(g, feeds[0]), run_reference(q, feeds[0])
    mix = g.outputs[0]
    assert np.abs(f[mix] - o[q.outputs[0]]).max() < 0.05 * np.abs(f[mix]).max()


@pytest.mark.parametrize("low, integer", [(-1e9, True), (-0.5, False)])
def test_a_constant_mask_becomes_a_bool_constant_or_keeps_float(low, integer):
    rng = np.random.default_rng(6)
    g = Graph("const_mask")
    a = g.add_input("a", (1, 2, S, DH))
    m = np.zeros((1, 1, S, S), np.float32)
    m[..., ::3] = low                                   # every third key, any query
    m[..., 1, :] = 0                                    # one query sees every key
    mask = g.add_constant("mask", m)
    g.set_outputs([g.add_node("attention", [a, a, a, mask], scale=0.4, name="attn")])
    feeds = [{"a": rng.normal(0, 1, (1, 2, S, DH)).astype(np.float32)} for _ in range(4)]
    q = quantize(g, feeds, "multiply")
    att = q.node("attn")
    if integer:
        excluded = q.tensors[att.inputs[3]]
        assert att.op == "qattention" and excluded.dtype == "bool" and excluded.is_constant
        np.testing.assert_array_equal(excluded.data, m < -5000)
        f, o = run_reference(g, feeds[0]), run_reference(q, feeds[0])
        assert np.abs(f[g.outputs[0]] - o[q.outputs[0]]).max() < \
            0.05 * np.abs(f[g.outputs[0]]).max()
    else:
        assert att.op == "attention"
        assert "constant mask" in q.metadata["quantized"]["float_ops"]["attn"]


def test_an_infinity_that_an_integer_op_would_read_is_refused():
    g = Graph("inf")
    x = g.add_input("x", (1, 4))
    g.set_outputs([g.add_node("add", [x, x])])
    cal = {"x": np.array([[[1.0, -np.inf, 2.0, 0.5]]], np.float32)}
    with pytest.raises(QuantizationError, match=r"tensor 'x' has non-finite values \(inf\)"):
        quantize(g, cal, "shift")
