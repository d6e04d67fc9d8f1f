"""The GPU table and the roofline estimate against hand-computed counts: MACs, bytes and
seconds of a conv, compute- and memory-bound kernels, fp16 bytes, free views, the
default precision, a target's node subset, and the errors a user meets."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from vdla.compiler import Graph, pipeline
from vdla.compiler.targets.gpu import gpus, roofline

#: A GPU with round figures, so the expected times are easy to compute by hand.
ROUND = gpus.Gpu("round", "Round numbers", int8_tops=100, fp16_tflops=50, fp32_tflops=10,
                 bandwidth_gbs=1000, source="test figures")


def conv_graph(c=16, o=32, hw=32, k=3, relu=False) -> Graph:
    """x (1, c, hw, hw) -> conv2d (o, c, k, k) with bias, same padding [-> relu]."""
    g = Graph("conv")
    x = g.add_input("x", (1, c, hw, hw))
    w = g.add_constant("w", np.zeros((o, c, k, k), np.float32))
    b = g.add_constant("b", np.zeros(o, np.float32))
    y = g.add_node("conv2d", [x, w, b], name="conv", pads=(k // 2,) * 4)
    if relu:
        y = g.add_node("relu", [y], name="relu")
    g.set_outputs([y])
    return g


class TestGpus:
    def test_every_gpu_has_positive_ordered_peaks_and_a_source(self):
        assert {"h100-sxm", "h100-pcie", "h200", "a100-sxm", "l4", "t4",
                "rtx-4090"} <= set(gpus.names())
        for gpu in gpus.GPUS.values():
            assert gpu.name == gpu.name.lower() and gpu.title.startswith("NVIDIA")
            assert gpu.peak("int8") >= gpu.peak("float16") > gpu.peak("float32") > 0
            assert gpu.bandwidth > 0 and "https://" in gpu.source

    def test_peaks_are_dense_datasheet_figures(self):
        h100 = gpus.get("h100-sxm")
        # The datasheet's 3,958 TOPS and 1,979 TFLOPS are with sparsity: halved.
        assert h100.peak("int8") == 1979e12 and h100.peak("float16") == 989.5e12
        assert h100.peak("float32") == 67e12 and h100.bandwidth == 3350e9
        assert "halved" in h100.source
        assert gpus.get("h200").peak("int8") == h100.peak("int8")
        assert gpus.get("h200").bandwidth_gbs == 4800
        assert gpus.get("a100-sxm").peak("float16") == 312e12

    def test_names_are_case_insensitive(self):
        assert gpus.get(" H100-SXM ") is gpus.get("h100-sxm")

    def test_unknown_gpu_lists_the_known_ones(self):
        with pytest.raises(ValueError, match="unknown GPU 'v100'; known GPUs: h100-sxm, "
                                             "h100-pcie, h200, a100-sxm"):
            gpus.get("v100")

    def test_unknown_precision_names_the_allowed_ones(self):
        with pytest.raises(ValueError, match="int8, float16, float32, not 'bf16'"):
            gpus.get("t4").peak("bf16")

    def test_bad_figure_names_the_field(self):
        with pytest.raises(ValueError, match="'x': bandwidth_gbs must be a positive"):
            gpus.Gpu("x", "X", 1, 1, 1, 0, "none")


class TestKernels:
    def test_conv_matches_hand_counts(self):
        est = roofline.estimate(conv_graph(), ROUND)
        assert est.precision == "float32" and [k.name for k in est.kernels] == ["conv"]
        (k,) = est.kernels
        macs = 32 * 32 * 32 * 16 * 3 * 3               # outputs x reduction
        traffic = 4 * (16 * 32 * 32 + 32 * 16 * 9 + 32 + 32 * 32 * 32)  # x, w, b, y
        assert (k.op, k.macs, k.ops, k.bytes) == ("conv2d", macs, 2 * macs, traffic)
        assert k.compute_seconds == pytest.approx(2 * macs / 10e12)
        assert k.memory_seconds == pytest.approx(traffic / 1000e9)
        assert k.seconds == max(k.compute_seconds, k.memory_seconds)
        assert k.intensity == pytest.approx(2 * macs / traffic)
        assert k.launch_seconds == roofline.LAUNCH_SECONDS
        assert est.seconds_with_launch == pytest.approx(k.seconds + roofline.LAUNCH_SECONDS)
        assert (est.macs, est.bytes) == (macs, traffic)

    def test_big_conv_is_compute_bound_and_relu_memory_bound(self):
        est = roofline.estimate(conv_graph(c=256, o=256, hw=56, relu=True), "h100-sxm",
                                "float16")
        conv, relu = est.kernels
        assert conv.bound == "compute" and conv.intensity > 989.5e12 / 3350e9  # the ridge
        assert conv.compute_seconds == pytest.approx(conv.ops / 989.5e12)
        assert relu.bound == "memory" and relu.intensity == pytest.approx(1 / 4)
        assert (relu.macs, relu.ops, relu.precision) == (0, 256 * 56 * 56, "float32")
        # Elementwise work runs on the CUDA cores, at the FP32 peak.
        assert relu.compute_seconds == pytest.approx(relu.ops / 67e12)
        assert est.compute_bound == 1

    def test_float16_halves_float_bytes(self):
        g = conv_graph(relu=True)
        full, half = (roofline.estimate(g, ROUND, p) for p in ("float32", "float16"))
        for a, b in zip(full.kernels, half.kernels):
            assert b.bytes * 2 == a.bytes and b.ops == a.ops
        assert half.kernels[0].compute_seconds * 5 == pytest.approx(
            full.kernels[0].compute_seconds)        # 50 vs 10 TFLOPS

    def test_views_cost_nothing(self):
        g = Graph("mlp")
        x = g.add_input("x", (2, 8, 4, 4))
        flat = g.add_node("flatten", [x], name="flatten")
        w = g.add_constant("w", np.zeros((10, 128), np.float32))
        y = g.add_node("dense", [flat, w], name="fc")
        g.set_outputs([g.add_node("reshape", [y], name="reshape", shape=(2, 2, 5))])
        est = roofline.estimate(g, ROUND)
        assert [k.name for k in est.kernels] == ["fc"]
        assert est.kernels[0].macs == 2 * 10 * 128
        assert roofline.estimate(g, ROUND, nodes=["flatten", "reshape"]).seconds == 0

    def test_pools_matmul_and_formula_less_ops(self):
        g = Graph("misc")
        x = g.add_input("x", (1, 4, 8, 8))
        pool = g.add_node("max_pool2d", [x], name="pool", kernel=(3, 3), strides=(2, 2))
        gap = g.add_node("global_avg_pool2d", [x], name="gap")
        soft = g.add_node("softmax", [x], name="softmax")
        lrn = g.add_node("lrn", [x], name="lrn")
        a = g.add_input("a", (2, 3, 4))
        mm = g.add_node("matmul", [a, g.add_constant("b", np.ones((4, 5), np.float32))],
                        name="mm")
        g.set_outputs([pool, gap, soft, lrn, mm])
        k = {e.name: e for e in roofline.estimate(g, ROUND).kernels}
        assert k["pool"].ops == 4 * 3 * 3 * 3 * 3          # outputs x window
        assert k["gap"].ops == 4 * 8 * 8                     # every input once
        # softmax's formula: max, subtraction, exp, sum, division per element
        assert k["softmax"].ops == roofline.SOFTMAX_OPS * 4 * 8 * 8 == 5 * 256
        assert k["softmax"].bytes == 2 * 4 * 256
        assert k["lrn"].ops == 4 * 8 * 8                     # no formula: one per output
        assert (k["mm"].macs, k["mm"].ops) == (2 * 3 * 5 * 4, 2 * 2 * 3 * 5 * 4)


class TestModels:
    @pytest.fixture(scope="class")
    def quantized(self):
        model = pipeline.load_model("small_cnn", note=None)
        return pipeline.quantize_for(model, [], mode="multiply")

    def test_quantized_graph_defaults_to_int8(self, quantized):
        est = roofline.estimate(quantized, "a100-sxm")
        assert est.precision == "int8"
        ops = {k.op for k in est.kernels}
        assert {"quantize", "qconv2d", "qdense", "dequantize"} <= ops
        assert "flatten" not in ops
        conv = next(k for k in est.kernels if k.op == "qconv2d")
        assert conv.precision == "int8"
        assert conv.compute_seconds == pytest.approx(conv.ops / 624e12)
        assert est.seconds == pytest.approx(sum(k.seconds for k in est.kernels))
        assert est.launch_seconds == pytest.approx(len(est.kernels) * 3e-6)

    def test_a_node_subset(self, quantized):
        convs = [n.name for n in quantized.nodes() if n.op == "qconv2d"]
        est = roofline.estimate(quantized, "l4", nodes=convs)
        assert [k.name for k in est.kernels] == convs

    def test_unknown_node_and_precision_name_the_allowed_ones(self, quantized):
        with pytest.raises(ValueError, match="has no node\\(s\\) 'nope'; its nodes: "
                                             "input_quantize, conv1"):
            roofline.estimate(quantized, "t4", nodes=["conv1", "nope"])
        with pytest.raises(ValueError, match="int8, float16, float32, not 'fp8'"):
            roofline.estimate(quantized, "t4", "fp8")
        with pytest.raises(ValueError, match="known GPUs: h100-sxm"):
            roofline.estimate(quantized, "tpu")


def test_no_gpu_library_is_imported():
    code = ("import sys; import vdla.compiler.targets.gpu.roofline, vdla.cli.roofline; "
            "print(sorted({'torch', 'triton'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
    assert math.isfinite(roofline.LAUNCH_SECONDS)
