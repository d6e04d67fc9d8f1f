"""The zoo's transformers: they build and validate with the architectures' parameter
counts and structure, run to sane activations, the written-out attention means what the
fused `attention` op means, onnxruntime agrees with the float reference on their ONNX
export, and the trained vit_digits keeps its accuracy in float and in int8."""

from __future__ import annotations

import numpy as np
import pytest

from vdla.compiler import run_reference, zoo
from vdla.compiler.frontend import zoo_transformers
from vdla.compiler.frontend.builder import GraphBuilder
from vdla.compiler.frontend.zoo_transformers import TRANSFORMERS, parameter_count

#: Short sequences and small images keep the fast tests fast.
SMALL = {"bert_tiny": dict(seq_len=16), "bert_base": dict(seq_len=8),
         "gpt_mini": dict(seq_len=16, num_classes=1024), "vit_tiny": dict(image_size=32),
         "vit_digits": {}}


def feeds(graph, seed=0, pad=0):
    """Token ids within the vocabulary (of the gather the ids feed), a mask of ones with
    `pad` padded positions at the end, standard-normal pixels."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in graph.inputs:
        t = graph.tensors[name]
        if t.dtype == "float32":
            out[name] = rng.standard_normal(t.shape).astype(np.float32)
        elif name == "input_ids":
            rows = next(graph.tensors[n.inputs[0]].shape[0] for n in graph.nodes()
                        if n.op == "gather" and n.inputs[1] == name)
            out[name] = rng.integers(0, rows, t.shape).astype(np.int64)
        else:
            mask = np.ones(t.shape, np.int64)
            if pad:
                mask[:, -pad:] = 0
            out[name] = mask
    return out


def close(got, want, rtol=1e-4):
    assert got.shape == want.shape
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
    assert err <= rtol, err


def test_names_and_inputs():
    assert set(TRANSFORMERS) <= set(zoo.names())
    assert zoo.names()[-5:] == ["vit_tiny", "bert_base", "bert_tiny", "gpt_mini", "vit_digits"]
    bert = zoo.get("bert_tiny")
    assert bert.inputs == ["input_ids", "attention_mask"] and bert.outputs == ["logits"]
    assert [bert.tensors[n].shape for n in bert.inputs] == [(1, 128), (1, 128)]
    assert {bert.tensors[n].dtype for n in bert.inputs} == {"int64"}
    assert bert.tensors["logits"].shape == (1, 2)
    gpt = zoo.get("gpt_mini")
    assert gpt.inputs == ["input_ids"] and gpt.tensors["input_ids"].shape == (1, 64)
    assert gpt.tensors["logits"].shape == (1, 64, 8192)
    vit = zoo.get("vit_digits")
    assert vit.inputs == ["input"] and vit.tensors["input"].shape == (1, 1, 8, 8)
    assert vit.tensors["logits"].shape == (1, 10)


def test_vit_tiny_is_deit_tiny():
    assert zoo.get("vit_tiny").tensors["input"].shape == (1, 3, 224, 224)
    g = zoo.get("vit_tiny", image_size=32)          # 4 patches instead of 196: faster
    assert g.tensors["logits"].shape == (1, 1000)
    # timm's deit_tiny_patch16_224 has 5,717,416, 197 x 192 of them position embeddings.
    assert parameter_count(g) == 5_717_416 - (197 - 5) * 192
    counts = g.count_ops()
    # 12 blocks of q, k, v, proj, fc1, fc2 linears; 2 norms each, and the final one.
    assert counts["dense"] == 12 * 6 + 1 and counts["layer_norm"] == 25
    assert counts["gelu"] == 12 and counts["softmax"] == 12 and counts["matmul"] == 24
    assert g.tensors["pos_embed"].shape == (1, 5, 192)
    assert g.tensors["blocks.11.mlp.fc1.weight"].shape == (768, 192)


def _bert_parameters(width, depth, ffn, vocab, seq, classes):
    layer = 4 * (width * width + width) + 2 * width * ffn + ffn + width + 4 * width
    return (vocab * width + seq * width + 2 * width + depth * layer
            + width * width + width + classes * width + classes)


def test_bert_tiny_and_gpt_mini_structure():
    bert = zoo.get("bert_tiny")
    assert parameter_count(bert) == _bert_parameters(128, 2, 512, 30522, 128, 2)
    counts = bert.count_ops()
    assert counts["gather"] == 1 and counts["layer_norm"] == 1 + 2 * 2
    assert counts["softmax"] == 2 and counts["tanh"] == 1
    gpt = zoo.get("gpt_mini", **SMALL["gpt_mini"])
    counts = gpt.count_ops()
    assert counts["dense"] == 4 * 6 + 1 and counts["layer_norm"] == 4 * 2 + 1
    assert {n.attrs["approximate"] for n in gpt.nodes() if n.op == "gelu"} == {"tanh"}
    # The LM head is tied to the token embedding.
    np.testing.assert_array_equal(gpt.tensors["lm_head.weight"].data,
                                  gpt.tensors["wte.weight"].data)
    # The causal mask: 0 on and below the diagonal, -inf above.
    mask = gpt.tensors["h.0.attn.causal_mask"].data[0, 0]
    assert np.all(np.isneginf(mask[np.triu_indices(16, 1)]))
    assert np.all(mask[np.tril_indices(16)] == 0)


@pytest.mark.slow
def test_bert_base_parameters():
    g = zoo.get("bert_base")
    assert g.tensors["input_ids"].shape == (1, 128)
    # transformers' BertModel (109,482,240) without the position rows past 128 and the
    # token type table, plus the 768 -> 2 classifier.
    assert parameter_count(g) == _bert_parameters(768, 12, 3072, 30522, 128, 2)
    assert parameter_count(g) == 109_482_240 - 384 * 768 - 2 * 768 + 768 * 2 + 2


@pytest.mark.parametrize("name", ["bert_tiny", "gpt_mini", "vit_tiny"])
def test_models_run_to_sane_activations(name):
    g = zoo.get(name, batch=2, **SMALL[name])
    x = feeds(g, 1)
    values = run_reference(g, x, keep=True)
    logits = values["logits"]
    assert np.all(np.isfinite(logits))
    assert not np.allclose(logits[0], logits[1], atol=1e-4 * np.abs(logits).max())
    for node in g.nodes():
        v = values[node.outputs[0]]
        if node.name.endswith(".causal"):         # -inf above the diagonal, by design
            v = v[..., np.tril_indices(v.shape[-1])[0], np.tril_indices(v.shape[-1])[1]]
        assert np.all(np.isfinite(v)), node.name
        if node.op == "layer_norm":               # gamma 1, beta 0: unit rows
            assert np.allclose(v.std(axis=-1), 1, atol=1e-2), node.name
        if node.op == "softmax":
            assert np.allclose(v.sum(axis=-1), 1, atol=1e-5), node.name
    # One sample of a batch of two is the same as a batch of one.
    one = zoo.get(name, **SMALL[name])
    close(run_reference(one, {k: v[1:] for k, v in x.items()})["logits"], logits[1:], 1e-5)


def test_bert_attention_mask_masks():
    """Padding changes nothing of the first token's result but what the mask admits:
    padded positions' ids do not matter."""
    g = zoo.get("bert_tiny", **SMALL["bert_tiny"])
    x = feeds(g, 2, pad=5)
    y = feeds(g, 3, pad=5)
    y["input_ids"][:, :-5] = x["input_ids"][:, :-5]
    assert not np.array_equal(x["input_ids"], y["input_ids"])
    close(run_reference(g, y)["logits"], run_reference(g, x)["logits"], 1e-5)
    unmasked = dict(y, attention_mask=np.ones_like(y["attention_mask"]))
    assert not np.allclose(run_reference(g, unmasked)["logits"],
                           run_reference(g, x)["logits"], rtol=0, atol=1e-7)


def test_gpt_mini_is_causal():
    """A token's logits depend on the tokens before it, never on those after."""
    g = zoo.get("gpt_mini", **SMALL["gpt_mini"])
    x = feeds(g, 4)
    y = {"input_ids": x["input_ids"].copy()}
    y["input_ids"][0, 10:] = (y["input_ids"][0, 10:] + 1) % 1024
    a, b = run_reference(g, x)["logits"], run_reference(g, y)["logits"]
    close(b[:, :10], a[:, :10], 1e-6)
    assert not np.allclose(b[:, 10:], a[:, 10:])


@pytest.mark.parametrize("causal, mask", [(False, False), (False, True), (True, False)])
def test_written_out_attention_means_the_fused_op(causal, mask):
    outs = []
    for fused in (False, True):
        b = GraphBuilder("attn", seed=3, calibration_batch=2)
        x = b.input("x", (2, 6, 16))
        m = b.constant("m", np.where(np.arange(6) < 4, 0.0, -1e4).astype(np.float32)
                       [None, None, None]) if mask else None
        q, k, v = (b.linear(x, 16, std=0.3, name=n) for n in "qkv")
        y = b.attention_heads(q, k, v, 4, mask=m, causal=causal, fused=fused, name="attn")
        g = b.build([y])
        assert ("attention" in g.count_ops()) == fused
        outs.append(run_reference(g, {"x": np.random.default_rng(5).standard_normal(
            (2, 6, 16)).astype(np.float32)})[y])
    close(outs[1], outs[0], 1e-5)


@pytest.mark.parametrize("build, match", [
    (lambda b, x: b.linear(x, 8, weight=np.zeros((8, 5)), name="l"),
     r"linear 'l': weight has shape \(8, 5\), not \(8, 16\)"),
    (lambda b, x: b.transpose(x, (1, 0, 2)), r"perm \(1, 0, 2\) must keep the batch axis"),
    (lambda b, x: b.attention_heads(x, x, x, 3, name="a"),
     r"attention 'a': width 16 is not divisible by 3 heads"),
    (lambda b, x: b.attention_heads(x, x, x, 2, scale_op="pow", name="a"),
     r"scale_op must be 'mul' or 'div', not 'pow'"),
    (lambda b, x: b.input("ids", (1, 4), dtype="int8"), r"dtype must be float32, int64 or "
                                                         r"int32, not 'int8'"),
    (lambda b, x: b.input("ids", (1, 4), high=10), r"only integer inputs take it"),
    (lambda b, x: b.constant("x", np.zeros(3)), r"name 'x' is already used"),
])
def test_builder_refuses_bad_transformer_layers(build, match):
    from vdla.compiler.ir.tensor import GraphError

    b = GraphBuilder("bad", seed=0, calibration_batch=1)
    x = b.input("x", (1, 4, 16))
    with pytest.raises(GraphError, match=match):
        build(b, x)


@pytest.mark.parametrize("kind", ["vit", "bert", "gpt"])
def test_eager_builder_values_are_the_reference_results(kind):
    """With eager=True the builder runs each layer as it adds it: its values of the
    logits on the calibration batch are what run_reference computes, sample by sample."""
    small = {"vit": (zoo_transformers._vit, zoo_transformers.ViTConfig(
                 width=16, depth=1, heads=2, mlp=32, patch=2, image_size=4, channels=1,
                 num_classes=3), 4),
             "bert": (zoo_transformers._bert, zoo_transformers.BertConfig(
                 width=16, depth=1, heads=2, ffn=32, vocab=50, seq_len=6), 6),
             "gpt": (zoo_transformers._gpt, zoo_transformers.GPTConfig(
                 width=16, depth=1, heads=2, vocab=50, seq_len=6), 6)}
    make, config, size = small[kind]
    b = GraphBuilder(kind, seed=1, calibration_batch=2)
    out = make(b, config, 2 if kind == "vit" else 1, size, 3 if kind != "gpt" else 50)
    inputs = list(b.graph.inputs)
    samples = {name: b.calibration_value(name) for name in inputs}
    want = b.calibration_value(out)
    g = b.build([out])
    for i in range(2):
        x = {name: v[i:i + 1] for name, v in samples.items()}
        if kind == "vit":       # batch 2 (the class token expanded): both images at once
            x = {name: np.concatenate([v[i:i + 1]] * 2) for name, v in samples.items()}
        got = run_reference(g, x)["logits"][:1]
        close(got, want[i:i + 1], 1e-5)


@pytest.mark.parametrize("name, layers", [("bert_tiny", 2), ("gpt_mini", 4),
                                          ("vit_digits", 2)])
def test_prepare_fuses_the_written_out_layers(name, layers):
    """The zoo builds what an import has; prepare's fusion makes each attention core one
    `attention` node (causal for gpt_mini, BERT's mask as its input) and each GELU the
    activation of the dense before it, with the same results."""
    from vdla.compiler.passes import prepare

    g = zoo.get(name, **SMALL[name])
    p = prepare(g)
    counts = p.count_ops()
    assert counts["attention"] == layers
    assert not {"softmax", "matmul", "gelu"} & set(counts), counts
    attention = [n for n in p.nodes() if n.op == "attention"]
    assert all(bool(n.attrs["causal"]) == (name == "gpt_mini") for n in attention)
    assert all(bool(n.input(3)) == name.startswith("bert") for n in attention)
    assert sum(n.attrs["activation"] in ("gelu", "gelu_tanh") for n in p.nodes()
               if n.op == "dense") == layers
    x = feeds(g, 1, pad=3)
    close(run_reference(p, x)["logits"], run_reference(g, x)["logits"], 1e-5)


def test_seeds_and_sequence_prefix():
    a = zoo.get("gpt_mini", seq_len=8, num_classes=256)
    b = zoo.get("gpt_mini", seq_len=16, num_classes=256)
    c = zoo.get("gpt_mini", seq_len=8, num_classes=256, seed=1)
    np.testing.assert_array_equal(a.tensors["wte.weight"].data, b.tensors["wte.weight"].data)
    # The position embeddings of the first 8 positions do not depend on the length.
    np.testing.assert_array_equal(a.tensors["wpe"].data, b.tensors["wpe"].data[:8])
    assert not np.array_equal(a.tensors["wte.weight"].data, c.tensors["wte.weight"].data)


@pytest.mark.parametrize("name, kwargs, match", [
    ("bert_tiny", dict(image_size=32), r"bert_tiny: image_size is for image models"),
    ("bert_tiny", dict(seq_len=513), r"seq_len must be an int in \[1, 512\]"),
    ("gpt_mini", dict(seq_len=0), r"gpt_mini: seq_len must be an int in \[1, 1024\]"),
    ("gpt_mini", dict(num_classes=0), r"num_classes must be an int >= 1 \(gpt_mini: the "
                                      r"vocabulary\)"),
    ("vit_tiny", dict(image_size=40), r"multiple of the patch size 16"),
    ("vit_tiny", dict(seq_len=16), r"vit_tiny: seq_len is for text models"),
    ("resnet18", dict(seq_len=16), r"resnet18: seq_len is for text models"),
    ("vit_digits", dict(image_size=16), r"vit_digits: image_size is fixed at 8"),
    ("vit_digits", dict(num_classes=3), r"vit_digits: num_classes is fixed at 10"),
])
def test_bad_options(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        zoo.get(name, **kwargs)


def test_token_ids_outside_the_vocabulary_are_refused():
    g = zoo.get("bert_tiny", **SMALL["bert_tiny"])
    x = feeds(g)
    x["input_ids"][0, 3] = 30522
    with pytest.raises(ValueError, match=r"index 30522 in 'input_ids' is outside "
                                         r"\[-30522, 30522\)"):
        run_reference(g, x)


# --- ONNX: onnxruntime agrees with the float reference ----------------------------------

def check_onnxruntime(graph, opset, seed=0, pad=0, round_trip=True):
    """onnxruntime on the exported model agrees with the float reference, and so does
    the model imported back. Returns the ONNX operator types written."""
    ort = pytest.importorskip("onnxruntime")
    from vdla.compiler import from_onnx, to_onnx

    model = to_onnx(graph, opset=opset)
    x = feeds(graph, seed, pad)
    want = run_reference(graph, x)["logits"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = sess.run(["logits"], x)
    close(got, want)
    if round_trip:
        back = from_onnx(model)
        assert back.inputs == graph.inputs and back.outputs == ["logits"]
        close(run_reference(back, x)["logits"], want, 1e-5)
    return {n.op_type for n in model.graph.node}


@pytest.mark.parametrize("name, opset", [("bert_tiny", 13), ("bert_tiny", 17),
                                         ("gpt_mini", 18), ("gpt_mini", 20),
                                         ("vit_digits", 17)])
def test_onnx_export_matches_onnxruntime(name, opset):
    # gpt_mini at opset 18 with its whole vocabulary, at 20 with a smaller one.
    g = zoo.get(name, **(dict(seq_len=16) if opset == 18 else SMALL[name]))
    ops = check_onnxruntime(g, opset, pad=3 if name.startswith("bert") else 0)
    # LayerNormalization from opset 17, Gelu from opset 20; written out before.
    assert ("LayerNormalization" in ops) == (opset >= 17)
    assert ("Gelu" in ops) == (opset >= 20)
    assert ("Erf" in ops) == (opset < 20 and name != "gpt_mini")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vit_tiny", "bert_base", "gpt_mini"])
@pytest.mark.parametrize("opset", [17, 20])
def test_full_size_onnx_export_matches_onnxruntime(name, opset):
    check_onnxruntime(zoo.get(name), opset, pad=7 if name.startswith("bert") else 0,
                      round_trip=False)


def test_vdla_export_writes_a_transformer(tmp_path, capsys):
    onnx = pytest.importorskip("onnx")
    from vdla.cli import main

    out = tmp_path / "bert_tiny.onnx"
    assert main(["export", "bert_tiny", "-o", str(out), "--opset", "17"]) == 0
    model = onnx.load(out)
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    assert "bert_tiny, " in capsys.readouterr().out


# --- the trained vit_digits: float accuracy as recorded, int8 within a point of it -------

@pytest.fixture(scope="module")
def digits():
    from vdla.compiler.frontend.datasets import digits_split
    return digits_split()


def _accuracy(graph, x, y) -> float:
    return float((run_reference(graph, {"input": x})["logits"].argmax(1) == y).mean())


def test_vit_digits_float_accuracy_is_the_recorded_one(digits):
    _, _, x_test, y_test = digits
    record = zoo_transformers.training_record()
    acc = _accuracy(zoo.get("vit_digits", batch=len(x_test)), x_test, y_test)
    print(f"vit_digits: float {acc:.2%}")
    assert acc == pytest.approx(record["test_accuracy_vdla_float"], abs=1.5 / len(y_test))
    assert acc >= 0.97
    assert record["split"]["n_test"] == len(y_test)


@pytest.mark.parametrize("mode", ["shift", "multiply"])
def test_vit_digits_int8_within_1_point_of_float(digits, mode):
    """Integer-only softmax, LayerNorm and GELU keep the trained model's accuracy: the
    whole test split as one batch, calibrated on training images only."""
    from vdla.compiler import quantize

    x_train, _, x_test, y_test = digits
    graph = zoo.get("vit_digits", batch=len(x_test))
    float_acc = _accuracy(graph, x_test, y_test)
    quantized = quantize(graph, {"input": x_train[None, :len(x_test)]}, mode)
    ops = quantized.count_ops()
    # Every softmax, LayerNorm and GELU is integer: none is left in float.
    assert not {"softmax", "layer_norm", "gelu", "attention"} & set(ops), ops
    assert ops.get("qattention", 0) + ops.get("qsoftmax", 0) == 2
    assert ops["qlayer_norm"] == 5 and ops.get("qgelu", 0) + sum(
        n.attrs.get("activation") in ("gelu", "gelu_tanh") for n in quantized.nodes()
        if n.op == "qdense") == 2
    q_acc = _accuracy(quantized, x_test, y_test)
    print(f"vit_digits: float {float_acc:.2%}, int8 ({mode}) {q_acc:.2%}")
    assert q_acc >= float_acc - 0.01


def test_prepared_transformers_export_too():
    """`vdla compare --onnxruntime` exports the prepared graph: fused attention (mask,
    causal) and dense layers ending in GELU are written out for onnxruntime."""
    from vdla.compiler.passes import prepare

    for name, opset in (("bert_tiny", 9), ("gpt_mini", 13), ("vit_digits", 20)):
        g = prepare(zoo.get(name, **SMALL[name]))
        assert "attention" in g.count_ops()
        check_onnxruntime(g, opset, pad=3 if name.startswith("bert") else 0)


def _op_graph(op: str, **attrs):
    """One `op` node on float inputs of shape (2, 3, 4) (bool for where's condition)."""
    from vdla.compiler import Graph

    g = Graph(op)
    rng = np.random.default_rng(1)
    if op == "where":
        inputs = [g.add_constant("c", rng.random((3, 4)) > 0.5, "bool"),
                  g.add_input("a", (2, 3, 4)), g.add_input("b", (1, 3, 4))]
    elif op in ("sub", "div", "pow", "equal", "less", "greater"):
        inputs = [g.add_input("a", (2, 3, 4)), g.add_constant("b", rng.random(4) + 0.5)]
    else:
        inputs = [g.add_input("a", (2, 3, 4) if op != "expand" else (1, 3, 1))]
    y = g.add_node(op, inputs, **attrs)
    if op in ("equal", "less", "greater"):
        y = g.add_node("cast", [y], dtype="float32")
    g.set_outputs([y])
    return g


@pytest.mark.parametrize("op, attrs", [
    ("sub", {}), ("div", {}), ("pow", {}), ("sqrt", {}), ("erf", {}), ("tanh", {}),
    ("exp", {}), ("neg", {}), ("where", {}), ("less", {}), ("greater", {}), ("equal", {}),
    ("reduce_mean", dict(axes=(-1,))), ("reduce_sum", dict(axes=(0, 2), keepdims=False)),
    ("reduce_max", dict(axes=())), ("gelu", dict(approximate="tanh")),
    ("slice", dict(starts=(1,), ends=(3,), axes=(1,), steps=(1,))),
    ("slice", dict(starts=(0, 1), ends=(4, 3), axes=(2, 1), steps=(2, 1))),
    ("expand", dict(shape=(2, 3, 4))), ("cast", dict(dtype="int32")),
])
@pytest.mark.parametrize("opset", [11, 13, 18, 20])
def test_sequence_ops_export(op, attrs, opset):
    ort = pytest.importorskip("onnxruntime")
    from vdla.compiler import from_onnx, to_onnx

    g = _op_graph(op, **attrs)
    x = {n: (np.abs(np.random.default_rng(2).standard_normal(g.tensors[n].shape)) + 0.1)
         .astype(np.float32) for n in g.inputs}
    want = run_reference(g, x)[g.outputs[0]]
    model = to_onnx(g, opset=opset)
    (got,) = ort.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, x)
    close(got.astype(np.float64), want.astype(np.float64))
    close(run_reference(from_onnx(model), x)[g.outputs[0]].astype(np.float64),
          want.astype(np.float64), 1e-6)


def test_export_refuses_what_an_old_opset_lacks():
    from vdla.compiler.frontend.onnx_export import OnnxExportError, to_onnx

    with pytest.raises(OnnxExportError, match=r"node 'erf' \(erf\): Erf needs opset 9 or "
                                              r"later; exporting at opset 8"):
        to_onnx(_op_graph("erf"), opset=8)
    with pytest.raises(OnnxExportError, match=r"Equal needs opset 11"):
        to_onnx(_op_graph("equal"), opset=10)
