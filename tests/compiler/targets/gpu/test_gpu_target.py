"""The GPU target's Triton kernels against the references, run by Triton's interpreter
on the CPU (``device="interpreter"``: the same kernels a GPU compiles, bit for bit).

int8 results must equal the integer reference exactly: a conv grid (kernels 1-7,
strides, pads, dilation, groups and depthwise, channel counts of no particular multiple,
residual, both requantization modes), schedules drawn from the tuner's space and split-K,
dense layers, every non-GEMM op case the targets share (`op_cases`), and whole zoo
models; float32 within float32 rounding of the float reference, float16 within the
pipeline's float16 tolerance. Also: activations stay in the device's memory between
ops, the tuner's tasks, and the errors a user meets.

Skipped, with the reason, when the gpu extra (Triton, PyTorch) is not installed."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from vdla.compiler import pipeline, run_reference, targets
from vdla.compiler.targets.gpu import runtime
from vdla.compiler.targets.gpu.schedule import (GemmSchedule, ScheduleError, choose,
                                                gemm_shape, space)
from vdla.compiler.targets.model import compile_model

from gemm_graphs import assert_matches, conv_graph, dense_graph
from op_cases import CASES

# Checked without importing Triton: tests/conftest.py has set TRITON_INTERPRET first.
pytestmark = pytest.mark.skipif(not runtime.available(),
                                reason=f"the gpu extra is not installed: {runtime.INSTALL}")

#: Float ops that round once, as the reference's float64 result rounded to float32.
EXACT_FLOAT = ("quantize", "dequantize", "max_pool2d", "relu", "clip", "add", "mul", "concat",
               "flatten", "reshape")


@pytest.fixture(scope="module")
def gpu():
    return targets.get("gpu", device="interpreter")


def run_gpu(target, g, feed, schedules=None):
    compiled = compile_model(g, target, schedules=schedules)
    assert all(op.target == "gpu" for op in compiled.ops), [
        (op.name, op.reason) for op in compiled.ops if op.target != "gpu"]
    with compiled.session() as session:
        return session.run(feed).outputs


GRID = [dict(k=k, stride=s, pad=p) for k in (1, 3, 5, 7) for s in (1, 2) for p in (0, 1, 3)
        if p < k]
CONV_CASES = [dict(groups=2, c=14, o=10), dict(groups=4, c=12, o=20), dict(groups=7, c=7, o=7),
              dict(groups=24, c=24, o=24, k=3, stride=2), dict(groups=5, c=5, o=10, k=5, pad=2),
              dict(dilation=2, k=3, pad=2), dict(n=2, residual=True),
              dict(residual=True, multiply=True), dict(multiply=True, per_channel=False),
              dict(bias=False, per_channel=False), dict(nonnegative=True, out_min=0),
              dict(nonnegative=True, residual=True, c=33, o=17, k=1, pad=0)]


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_conv_grid(gpu, dtype):
    """Kernels 1-7, strides 1-2, pads 0-3 on 13 -> 10 channels of 11x10."""
    for shape in GRID:
        rng = np.random.default_rng(hash(tuple(shape.values())) % 2**32)
        g, feed = conv_graph(rng, c=13, o=10, h=11, w=10, dtype=dtype, **shape)
        assert_matches(g, run_gpu(gpu, g, feed), feed)


@pytest.mark.parametrize("dtype", ["int8", "float32"])
@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_groups_depthwise_dilation_residual_modes(gpu, case, dtype):
    rng = np.random.default_rng(7)
    g, feed = conv_graph(rng, dtype=dtype, **case)
    assert_matches(g, run_gpu(gpu, g, feed), feed)


@pytest.mark.parametrize("dtype", ["int8", "float32"])
@pytest.mark.parametrize("case", [dict(c=16, o=24, h=10, w=13),
                                  dict(c=40, o=36, h=5, w=5, k=1, pad=0, residual=True),
                                  dict(c=64, o=40, h=4, w=4, groups=2, multiply=True)], ids=str)
def test_schedules_from_the_space_and_split_k(gpu, dtype, case):
    """Schedules the tuner may pick (drawn at random) and every split-K up to 8: each
    computes the reference's output (int32 sums associate, so splitting K changes no
    int8 bit)."""
    rng = np.random.default_rng(11)
    g, feed = conv_graph(rng, dtype=dtype, **case)
    shape = gemm_shape(g.node("conv"), g, dtype)
    found = space(shape)
    assert choose(shape) in found
    picks = random.Random(3).sample(found, 4)
    block_k = 32 if dtype == "int8" else 16
    picks += [GemmSchedule(16, 16, block_k, 4, 2, split) for split in (1, 2, 4, 8)
              if split * block_k < shape.k]
    for schedule in picks:
        assert_matches(g, run_gpu(gpu, g, feed, {"conv": schedule}), feed)


@pytest.mark.parametrize("dtype", ["int8", "float32"])
@pytest.mark.parametrize("residual", [False, True])
def test_dense(gpu, dtype, residual):
    g, feed = dense_graph(np.random.default_rng(3), dtype=dtype, residual=residual, c=300)
    assert_matches(g, run_gpu(gpu, g, feed), feed)
    assert_matches(g, run_gpu(gpu, g, feed, {"fc": GemmSchedule(16, 16, 32, 2, 2, 4)}), feed)


def test_float16_conv_within_its_tolerance():
    target = targets.get("gpu", device="interpreter", float_dtype="float16")
    g, feed = conv_graph(np.random.default_rng(4), dtype="float32", residual=True, c=32, o=24)
    assert_matches(g, run_gpu(target, g, feed), feed, tolerance=pipeline.FLOAT16_TOLERANCE)


@pytest.mark.parametrize("name", list(CASES))
def test_op_matches_reference(gpu, name):
    """Every shared op case: int8, quantize, dequantize and the float ops that round once
    byte for byte; the float averages within 1e-6 of the largest output (NaN where the
    reference has 0 / 0)."""
    g, feed = CASES[name]()
    with np.errstate(invalid="ignore"):
        ref = run_reference(g, feed)[g.outputs[0]]
        out = run_gpu(gpu, g, feed)[g.outputs[0]]
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if ref.dtype != np.float32 or g.nodes()[0].op in EXACT_FLOAT:
        np.testing.assert_array_equal(out, ref)
        assert out.tobytes() == ref.tobytes()          # signed zeros too
    else:
        largest = float(np.nanmax(np.abs(ref))) if not np.isnan(ref).all() else 0.0
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-6 * largest, equal_nan=True)


@pytest.mark.parametrize("model", ["small_cnn", "digits_cnn"])
@pytest.mark.parametrize("precision", ["int8", "float32", "float16"])
def test_whole_models(model, precision):
    """Every op on the GPU; int8 bit-exact, the float precisions within their tolerance;
    the activations stay in device memory (two transfers: the input and the output)."""
    target = targets.get("gpu", device="interpreter",
                         float_dtype="float16" if precision == "float16" else "float32")
    loaded = pipeline.load_model(model, calibration=1, note=None)
    outcome = pipeline.run_model(loaded, target, precision=precision)
    assert outcome.bit_exact, outcome.mismatch
    assert all(op.target == "gpu" for op in outcome.compiled.ops)
    if precision == "int8":
        assert outcome.max_error == 0.0
    else:
        assert 0.0 < outcome.max_error < pipeline.TOLERANCES[precision]
    transfers = outcome.result.transfers
    assert [t.direction for t in transfers] == ["to_target", "to_host"]
    assert not any(t.between for t in transfers)
    summary = outcome.result.summary["gpu"]
    assert summary["mode"] == "interpreter" and "interpreter" in summary["device"]
    assert summary["macs"] == sum(op.kernel.macs for op in outcome.compiled.ops)


def test_host_ops_between_gpu_ops(tmp_path):
    """A grouped AlexNet's LRNs (tests/onnx_blocks.py) run on the host (no int8 meaning):
    the activations around them are read back and written again, each move logged; the
    rest stays on the device."""
    pytest.importorskip("torch.onnx")     # exports the model
    import onnx_blocks

    path = onnx_blocks.alexnet_grouped(tmp_path)
    outcome = pipeline.run_model(pipeline.load_model(str(path), calibration=1, note=None),
                                 targets.get("gpu", device="interpreter"))
    assert outcome.bit_exact, outcome.mismatch
    host = [op.op for op in outcome.compiled.ops if op.target == "host"]
    assert host == ["lrn", "lrn"], host
    moves = outcome.result.transfers
    assert len(moves) == 2 + 4 and not any(t.between for t in moves)


def test_roofline_per_op_when_a_gpu_is_named():
    target = targets.get("gpu", device="interpreter", gpu="a100-sxm")
    outcome = pipeline.run_model("small_cnn", target)
    estimates = [s.extra["roofline_seconds"] for s in outcome.result.ops]
    views = [bool(s.extra.get("view")) for s in outcome.result.ops]
    assert views.count(True) == 1                    # flatten: no kernel, no time
    assert all((e == 0) == view for e, view in zip(estimates, views))
    assert outcome.result.summary["gpu"]["roofline_seconds"] == pytest.approx(sum(estimates))


class TestErrors:
    def test_schedules(self, gpu):
        g, _ = conv_graph(np.random.default_rng(0), c=20, o=24)
        shape = gemm_shape(g.node("conv"), g, "int8")
        for schedule, message in [
                (GemmSchedule(24, 16, 32), "block_m 24: a power of two in \\[16, 256\\]"),
                (GemmSchedule(16, 16, 16), "block_k 16: a power of two in \\[32, 256\\] "
                                           "for a int8 GEMM"),
                (GemmSchedule(16, 16, 32, num_warps=3), "num_warps 3: one of"),
                (GemmSchedule(16, 16, 32, num_stages=0), "num_stages 0"),
                (GemmSchedule(16, 16, 32, split_k=7), "split_k 7: an integer in \\[1, 6\\]"),
                (GemmSchedule(16, 256, 32), "tile 16x256 is more than twice")]:
            with pytest.raises(ScheduleError, match=message):
                schedule.check(shape)
            with pytest.raises(ValueError, match=message):
                compile_model(g, gpu, schedules={"conv": schedule})
        with pytest.raises(TypeError, match="block_m, block_n, block_k required"):
            GemmSchedule.from_dict({"block_m": 16})

    def test_schedule_for_an_op_without_one(self, gpu):
        g, _ = conv_graph(np.random.default_rng(0), groups=8, c=8, o=8)
        with pytest.raises(ValueError, match="depthwise .* takes no GEMM schedule"):
            compile_model(g, gpu, schedules={"conv": GemmSchedule(16, 16, 32)})

    def test_options(self):
        with pytest.raises(ValueError, match="device must be one of auto, cuda, interpreter, "
                                             "not 'tpu'"):
            targets.get("gpu", device="tpu")
        with pytest.raises(ValueError, match="float_dtype must be one of float32, float16"):
            targets.get("gpu", float_dtype="bfloat16")
        with pytest.raises(ValueError, match="unknown GPU 'h900'; known GPUs: .*h100-sxm"):
            targets.get("gpu", gpu="h900")

    def test_float16_needs_a_float16_target(self):
        with pytest.raises(ValueError, match="precision float16 does not run on target 'cpu' "
                                             r"\(it runs int8, float32\)"):
            pipeline.run_model("small_cnn", targets.get("cpu"), precision="float16")

    def test_refusals_say_why(self, gpu):
        from op_cases import one_node

        rng = np.random.default_rng(0)
        for (op, inputs, attrs), reason in [
                (("lrn", [((1, 4, 2, 2), "float32")], {}), "does not run 'lrn'"),
                (("relu", [((2, 8), "int32")], {}), "relu on int32: the GPU target runs it "
                                                    "on int8 or float32"),
                (("add", [((2, 3, 4, 5, 6, 1, 2), "float32")] * 2, {}), "at most 6-D"),
                (("qadd", [((1, 5, 2, 2), "int8")] * 2, {"a_shift": (1, 2)}),
                 "a_shift \\(1, 2\\): one integer or one per channel \\(5\\)")]:
            g, _ = one_node(op, inputs, rng, **attrs)
            support = gpu.supports(g.nodes()[0], g)
            assert not support.ok
            assert re.search(reason, support.reason), support.reason
