"""Networks vdla did not write (tests/onnx_blocks.py: Inception-v1, DenseNet, a grouped
AlexNet, exported by torch) import, compute what onnxruntime computes, and quantize,
with the front half's int8 forms where they apply: a depthwise convolution for a BN
after a concat, max pools after LRN on int8, a 7x7 global pool with an int8 multiplier."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import onnx_blocks  # noqa: E402
from vdla.compiler import from_onnx, quantize, run_reference  # noqa: E402
from vdla.compiler.passes import prepare, quantize_error  # noqa: E402

NAMES = list(onnx_blocks.BLOCKS)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("blocks")
    return {name: build(folder) for name, build in onnx_blocks.BLOCKS.items()}


def inputs(shape, seed, n=None):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape if n is None else (n,) + shape).astype(np.float32)


@pytest.mark.parametrize("name", NAMES)
def test_block_imports_and_matches_onnxruntime(name, paths):
    path = paths[name]
    assert path.name == f"{name}.onnx"
    graph = from_onnx(str(path))
    assert graph.inputs == ["input"] and graph.outputs == ["logits"]
    shape = onnx_blocks.INPUT_SHAPES[name]
    assert graph.tensors["input"].shape == shape
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for seed in (1, 2):
        x = inputs(shape, seed)
        want = session.run(None, {"input": x})[0]
        got = run_reference(graph, {"input": x})["logits"]
        assert got.shape == want.shape == (1, 10)
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    # The prepared graph computes the same (BN folded, depthwise convs, fusion).
    prepared = prepare(graph)
    got = run_reference(prepared, {"input": x})["logits"]
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_the_blocks_are_deterministic(tmp_path, paths):
    for name, build in onnx_blocks.BLOCKS.items():
        again = build(tmp_path / name)
        assert again.read_bytes() == paths[name].read_bytes(), name


def quantized(paths, name, mode="shift"):
    graph = prepare(from_onnx(str(paths[name])))
    samples = {"input": inputs(onnx_blocks.INPUT_SHAPES[name], 3, n=4)}
    return graph, quantize(graph, samples, mode)


@pytest.mark.parametrize("mode", ["shift", "multiply"])
@pytest.mark.parametrize("name", NAMES)
def test_block_quantizes(name, mode, paths):
    graph, q = quantized(paths, name, mode)
    assert q.metadata["quantized"]["mode"] == mode
    ops = q.count_ops()
    convs = graph.count_ops().get("conv2d", 0) + graph.count_ops().get("dense", 0)
    assert ops.get("qconv2d", 0) + ops.get("qdense", 0) == convs
    test = {"input": inputs(onnx_blocks.INPUT_SHAPES[name], 4, n=3)}
    err = quantize_error(graph, q, test)["logits"]
    assert err["relative"] < 0.1, err
    # Only the graph input is quantized and only the output dequantized, but for LRN.
    lrn = ops.get("lrn", 0)
    assert ops["quantize"] == 1 + lrn and ops["dequantize"] == 1 + lrn


def test_inception_branches_concat_in_int8_and_its_7x7_pool_has_a_multiplier(paths):
    _, q = quantized(paths, "inception_block")
    concats = [n for n in q.nodes() if n.op == "concat"]
    assert [q.tensors[n.outputs[0]].shape[1] for n in concats] == [96, 140]
    assert all(q.tensors[n.outputs[0]].dtype == "int8" for n in concats)
    pools = [n for n in q.nodes() if n.op == "max_pool2d"]
    assert len(pools) == 4 and all(q.tensors[n.outputs[0]].dtype == "int8" for n in pools)
    assert any(n.attrs["ceil_mode"] for n in pools)
    (gap,) = [n for n in q.nodes() if n.op == "qglobal_avg_pool2d"]
    assert q.tensors[gap.inputs[0]].shape[2:] == (7, 7)
    assert 1 <= gap.attrs["multiplier"] <= 127


def test_densenet_batch_norms_after_concats_are_int8_depthwise_convs(paths):
    graph, q = quantized(paths, "densenet_block")
    records = graph.metadata["folded_batch_norm"]
    depthwise = [r["into"] for r in records if r["how"] == "depthwise_conv"]
    # torch's exporter folded each BN that follows a convolution; left are the first BN
    # of each dense layer (after the stem conv the concat also reads, or after a
    # concat), the transition's and the final one: nothing to fold them into.
    assert len(depthwise) == len(records) == 5
    for name in depthwise:
        node = q.node(name)
        channels = q.tensors[node.inputs[0]].shape[1]
        assert node.op == "qconv2d" and node.attrs["groups"] == channels
        assert q.tensors[node.inputs[1]].shape == (channels, 1, 1, 1)
        assert node.attrs["out_min"] == 0               # the ReLU fused into it
    assert "avg_pool2d" not in q.count_ops() and "qavg_pool2d" in q.count_ops()


def test_alexnet_pools_after_lrn_run_on_int8(paths):
    _, q = quantized(paths, "alexnet_grouped")
    groups = sorted(n.attrs["groups"] for n in q.nodes() if n.op == "qconv2d")
    assert groups == [1, 2, 2, 2, 4]
    for lrn in [n for n in q.nodes() if n.op == "lrn"]:
        (quant,) = q.consumers(lrn.outputs[0])
        assert quant.op == "quantize"
        (pool,) = q.consumers(quant.outputs[0])
        assert pool.op == "max_pool2d" and q.tensors[pool.outputs[0]].dtype == "int8"
