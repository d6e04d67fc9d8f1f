"""onnxruntime as the reference for transformers (`vdla.compiler.baseline`): its fast
paths for a BERT-style model exported by torch (as exported, after its transformer
optimizer, its static QDQ and its dynamic int8), each of which runs on int64 token ids
and masks; the faster of each precision; its kernels grouped as `vdla compare` groups
ops; which of its model types a vdla graph is; clear errors for bad arguments."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import onnx
import pytest

from vdla.compiler import Graph, baseline

tm = pytest.importorskip("transformer_models")   # tests/transformer_models.py (torch)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny BERT-style encoder exported by torch's TorchScript exporter, two
    calibration samples, and onnxruntime's variants of it."""
    tmp = tmp_path_factory.mktemp("ort-bert")
    path, inputs, model = tm.exported("bert", "legacy", tmp)
    other = tm.example_inputs("bert", model, seed=2)
    calibration = {k: np.stack([inputs[k], other[k]]) for k in inputs}
    found = baseline.variants(path, types.SimpleNamespace(calibration=calibration),
                              tmp / "ort", kind="bert")
    return path, inputs, tm.torch_outputs(model, inputs), found


def _ops(path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


def test_variants_are_onnxruntimes_fast_paths_and_run_on_token_ids(bert):
    path, inputs, want, found = bert
    by_key = {v.key: v for v in found}
    assert list(by_key) == ["fp32", "fp32-opt", "int8-qdq-u8", "int8-dynamic"]
    assert [by_key[k].precision for k in by_key] == ["float32", "float32", "int8", "int8"]
    assert by_key["fp32"].path == path
    # The optimizer fused its contrib ops (LayerNorm with the residual, GELU); the
    # quantizers wrote their own kinds of int8.
    assert {"SkipLayerNormalization", "Gelu"} <= _ops(by_key["fp32-opt"].path)
    assert "Erf" not in _ops(by_key["fp32-opt"].path)
    assert "QuantizeLinear" in _ops(by_key["int8-qdq-u8"].path)
    assert _ops(by_key["int8-dynamic"].path) & {"DynamicQuantizeMatMul", "MatMulInteger"}
    # Token ids given as int32 are cast to the int64 the model declares.
    feed = {k: v.astype(np.int32) for k, v in inputs.items()}
    scale = np.abs(want).max()
    for v in found:
        run = baseline.profile(v.path, 1, feed, runs=1)
        error = np.abs(run.outputs[0] - want).max() / scale
        if v.precision == "float32":
            assert error < 1e-4, v.key
        else:                      # its own quantization: close, never equal
            assert 0 < error < 1.0, v.key
        # Every kernel of every path falls in one of the comparison's groups.
        assert set(run.group_seconds) - {"other"} and "other" not in run.group_seconds, \
            (v.key, {n: op for n, op in run.node_ops.items() if op not in baseline.OP_GROUPS})
        assert run.group_seconds["dense"] > 0 and run.group_seconds["norm"] > 0


def test_fastest_names_the_faster_of_each_precision(bert):
    path, inputs, want, found = bert
    best = baseline.fastest(found, 1, inputs, runs=2, rounds=2)
    assert set(best) == {"float32", "int8"}
    for precision, (variant, times) in best.items():
        assert variant.precision == precision
        assert set(times) == {v.key for v in found if v.precision == precision}
        assert times[variant.key] == min(times.values()) > 0


def test_a_variant_onnxruntime_refuses_is_left_out_with_the_reason(tmp_path, bert,
                                                                    monkeypatch):
    """A tool that writes a file onnxruntime's runtime does not load (as its gpt2
    optimizer does on some exports): the variant is left out, its file removed."""
    path, inputs, want, found = bert
    calibration = {k: v[None] for k, v in inputs.items()}
    said = []
    monkeypatch.setattr(baseline, "quantize_dynamic_int8",
                        lambda source, out: Path(out).write_bytes(b"not a model"))
    got = baseline.variants(path, types.SimpleNamespace(calibration=calibration), tmp_path,
                            kind="bert", log=said.append)
    assert [v.key for v in got] == ["fp32", "fp32-opt", "int8-qdq-u8"]
    assert any(m.startswith("onnxruntime: no int8-dynamic (") for m in said), said
    # Nothing of it is left (each way is written under a partial name, renamed once it
    # runs), nor of the steps before.
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        f"{path.stem}-{key}.onnx" for key in ("fp32-opt", "int8-qdq-u8")]
    # The ones built are kept and taken again, not rebuilt; only the precisions asked
    # for are listed.
    said.clear()
    again = baseline.variants(path, types.SimpleNamespace(calibration=calibration), tmp_path,
                              precisions=("int8",), log=said.append)
    assert [v.key for v in again] == ["int8-qdq-u8"] and said == []


def _graph(kind: str) -> Graph:
    """A one-block vdla graph of `kind`: ids -> embedding (bert, gpt2) or pixels
    (vit), then LayerNorm and a (causal for gpt2) attention."""
    g = Graph(kind)
    rng = np.random.default_rng(0)
    if kind == "vit":
        x = g.add_input("pixels", (1, 4, 8))
    else:
        ids = g.add_input("input_ids", (1, 4), "int64")
        x = g.add_node("gather", [g.add_constant("table", rng.standard_normal((16, 8))), ids])
    x = g.add_node("layer_norm", [x, g.add_constant("gamma", np.ones(8)),
                                  g.add_constant("beta", np.zeros(8))])
    q = g.add_node("reshape", [x], shape=(1, 4, 2, 4))
    q = g.add_node("transpose", [q], perm=(0, 2, 1, 3))
    y = g.add_node("attention", [q, q, q], scale=0.5, causal=kind == "gpt2")
    g.set_outputs([y])
    return g


def test_transformer_kind_and_shape_of_vdla_graphs():
    for kind in baseline.TRANSFORMER_KINDS:
        g = _graph(kind)
        assert baseline.transformer_kind(g) == kind
        assert baseline.transformer_shape(g) == (2, 8)      # heads, heads * head size
    cnn = Graph("cnn")
    x = cnn.add_input("x", (1, 8))
    cnn.set_outputs([cnn.add_node("relu", [x])])
    assert baseline.transformer_kind(cnn) is None
    assert baseline.transformer_shape(cnn) == (0, 0)


@pytest.mark.parametrize("call, message", [
    (lambda p, x: baseline.feed_for({"a": np.float32, "b": np.int64}, {"a": x}),
     r"the model's inputs are \['a', 'b'\]; the feed lacks \['b'\]"),
    (lambda p, x: baseline.feed_for({"a": np.float32}, [x, x]),
     r"the model takes 1 inputs \(\['a'\]\), not 2"),
    (lambda p, x: baseline.optimize_transformer(p, p.with_name("o.onnx"), "t5"),
     "kind must be one of bert, gpt2, vit, not 't5'"),
    (lambda p, x: baseline.optimize_transformer(p, p.with_name("o.onnx"), "bert", heads=-1),
     "heads must be a non-negative integer, not -1"),
    (lambda p, x: baseline.variants(p, None, p.parent, precisions=("float16",)),
     r"precisions must be float32 and/or int8, not \['float16'\]"),
    (lambda p, x: baseline.fastest([], 1, {}, runs=0), "runs must be a positive integer, not 0"),
    (lambda p, x: baseline.fastest([], 1, {}, rounds=True),
     "rounds must be a positive integer, not True"),
])
def test_bad_arguments_name_the_value(bert, call, message):
    path, inputs, want, found = bert
    with pytest.raises(ValueError, match=message):
        call(path, np.zeros(2))


def test_vdla_exports_in_the_exporters_forms_get_onnxruntimes_attention(tmp_path):
    """vdla's export of the zoo's bert_tiny (linear layers on 2-D views, the mask
    reshaped) rewritten into torch's forms computes the same, and onnxruntime's
    optimizer then fuses its attention, which it does not on the export as it is."""
    from vdla.compiler.frontend import zoo
    from vdla.compiler.frontend.onnx_export import save_onnx

    graph = zoo.get("bert_tiny", seq_len=16)
    fp32 = save_onnx(graph, tmp_path / "bert.onnx", opset=17)
    rewritten = tmp_path / "bert-ef.onnx"
    assert baseline.exporter_form(fp32, rewritten) == {"linear": 12, "mask": 1}
    gemms = [[n.op_type for n in onnx.load(str(f)).graph.node].count("Gemm")
             for f in (fp32, rewritten)]
    assert gemms[0] - gemms[1] == 12        # the pooler's and the classifier's stay 2-D
    fused = baseline.optimize_transformer(rewritten, tmp_path / "opt.onnx", "bert")
    assert fused["Attention"] == 2
    assert "Attention" not in baseline.optimize_transformer(fp32, tmp_path / "o.onnx", "bert")
    rng = np.random.default_rng(0)
    feed = {"input_ids": rng.integers(0, 1000, (1, 16)), "attention_mask": np.ones((1, 16))}
    feed["attention_mask"][0, -4:] = 0
    want = baseline.profile(fp32, 1, feed, runs=1).outputs[0]
    for path in (rewritten, tmp_path / "opt.onnx"):
        got = baseline.profile(path, 1, feed, runs=1).outputs[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_static_qdq_of_a_causal_decoder_keeps_its_infinite_mask_in_float(tmp_path):
    """The causal mask's -inf (an added constant) would give its int8 range a NaN
    scale: the Add that reads it and the softmax after stay float, and onnxruntime's
    int8 stays close to the float model."""
    from vdla.compiler.frontend import zoo
    from vdla.compiler.frontend.onnx_export import save_onnx

    fp32 = save_onnx(zoo.get("gpt_mini", seq_len=8, num_classes=512), tmp_path / "gpt.onnx",
                     opset=17)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 512, (3, 1, 8))
    int8 = baseline.quantize_qdq(fp32, types.SimpleNamespace(calibration={"input_ids": ids}),
                                 tmp_path / "gpt-u8.onnx")
    nodes = onnx.load(str(int8)).graph.node
    producer = {o: n.op_type for n in nodes for o in n.output}
    softmaxes = [n for n in nodes if n.op_type == "Softmax"]
    # One per block, reading the float Add, not a DequantizeLinear.
    assert [producer[n.input[0]] for n in softmaxes] == ["Add"] * 4
    want = baseline.profile(fp32, 1, [ids[0]], runs=1).outputs[0]
    got = baseline.profile(int8, 1, [ids[0]], runs=1).outputs[0]
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() < 0.5 * np.abs(want).max()
    # Its gpt2 optimizer writes a model its runtime refuses on this export (then its
    # bert optimizer's takes its place): either way there is an optimized float way.
    found = baseline.variants(fp32, types.SimpleNamespace(calibration={"input_ids": ids}),
                              tmp_path / "ort", kind="gpt2", heads=4, hidden=256,
                              precisions=("float32",))
    assert [v.key for v in found] == ["fp32", "fp32-opt"]
    got = baseline.profile(found[1].path, 1, [ids[0]], runs=1).outputs[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_the_cpu_transformers_bench_runs(tmp_path, capsys):
    """bench/cpu_transformers.py end to end on a tiny BERT-style ONNX file, one short
    round: vdla's CPU target (exact) beside onnxruntime's ways, the nodes counted by
    where they ran, the report written."""
    import json

    from script_loading import load_script

    path, inputs, model = tm.exported("bert", "legacy", tmp_path)
    bench = load_script(Path(__file__).resolve().parents[2] / "bench" / "cpu_transformers.py")
    out = tmp_path / "out"
    assert bench.main(["--models", str(path), "--threads", "1", "--runs", "1", "--rounds",
                       "1", "--pause", "0", "--calibration", "2", "--ops", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("machine: ") and "Speed against onnxruntime" in text
    doc = json.loads((out / "cpu_transformers.json").read_text())
    rows = {r["precision"]: r for r in doc["speed"]}
    assert set(rows) == {"float32", "int8"} and doc["threads"] == 1
    assert set(rows["float32"]["ort"]) == {"fp32", "fp32-opt"}
    assert set(rows["int8"]["ort"]) == {"int8-qdq-u8", "int8-dynamic"}
    for r in rows.values():
        assert r["ok"] and r["model"] == path.stem and r["kind"] == "bert"
        assert r["vdla_ms"] > 0 and r["ort_ms"] == min(r["ort"].values())
        assert sum(r["where"].values()) == r["nodes"] > 0
        assert f"vdla: {r['nodes']} nodes: " in text
        # --ops: the time by op type inside the runner, every node counted once
        profile = doc["ops"][f"{path.stem} {r['precision']}"]
        assert sum(p["nodes"] for p in profile) == r["nodes"]
        assert all(p["ms"] >= 0 for p in profile) and sum(p["ms"] for p in profile) > 0
        assert f"{path.stem} {r['precision']}: vdla's time by op type" in text
