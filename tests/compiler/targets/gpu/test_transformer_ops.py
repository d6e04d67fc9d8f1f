"""The GPU target's kernels for sequence models (transformers) against the reference,
run by Triton's interpreter on the CPU: tiny shapes (the interpreter is slow).

float32 ops within float32 rounding of the float64 reference (1e-5 relative to the
output's largest value), the data-movement ops and comparisons byte for byte, int8 ops
(qmatmul, the integer softmax / LayerNorm / GELU, qattention) bit for bit; a gather's
bad index is the reference's error; refusals say why.

Skipped, with the reason, when the gpu extra (Triton, PyTorch) is not installed."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from vdla.compiler import run_reference, targets
from vdla.compiler.reference import integer_transformer as it
from vdla.compiler.reference.tolerance import mismatch
from vdla.compiler.targets.gpu import roofline, runtime
from vdla.compiler.targets.gpu.schedule import GemmSchedule, choose, gemm_shape, space
from vdla.compiler.targets.model import compile_model

from op_cases import one_node


# Checked without importing Triton: tests/conftest.py has set TRITON_INTERPRET first.
pytestmark = pytest.mark.skipif(not runtime.available(),
                                reason=f"the gpu extra is not installed: {runtime.INSTALL}")

#: Float32 kernels against the float64 reference, relative to the largest output.
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def gpu():
    return targets.get("gpu", device="interpreter")


def run_gpu(target, g, feed):
    compiled = compile_model(g, target)
    assert all(op.target == "gpu" for op in compiled.ops), [
        (op.name, op.reason) for op in compiled.ops if op.target != "gpu"]
    with compiled.session() as session:
        return session.run(feed).outputs


def check(target, g, feed, exact=False):
    """Every output of `g` on the GPU against the reference: exactly for integer and
    bool outputs (and float ones with `exact`), else within `TOLERANCE`."""
    want = run_reference(g, feed)
    got = run_gpu(target, g, feed)
    for name in g.outputs:
        w, y = want[name], got[name]
        assert y.dtype == w.dtype and y.shape == w.shape, (name, y.dtype, y.shape, w.shape)
        if w.dtype.kind == "f" and not exact:
            scale = max(float(np.nanmax(np.abs(w))), 1e-30)
            err = float(np.nanmax(np.abs(y.astype(np.float64) - w))) / scale
            assert err < TOLERANCE, (name, err)
            np.testing.assert_array_equal(np.isnan(y), np.isnan(w))
        else:
            np.testing.assert_array_equal(y, w)


def rnd(rng, shape, dtype="float32"):
    if dtype == "int8":
        return rng.integers(-128, 128, shape).astype(np.int8)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("int32", "int64"):
        return rng.integers(-50, 50, shape).astype(dtype)
    return rng.standard_normal(shape).astype(np.float32)


def graph(op, inputs, rng, **attrs):
    """One `op` node (`op_cases.one_node`) with `rnd`'s values."""
    return one_node(op, inputs, rng, fill=rnd, **attrs)


F = "float32"
ELEMENTWISE = {
    "sqrt": ("sqrt", [((2, 3, 5), F)], {}),
    "erf": ("erf", [((3, 17), F)], {}),
    "tanh": ("tanh", [((4, 9), F)], {}),
    "exp": ("exp", [((2, 2, 7), F)], {}),
    "neg": ("neg", [((5, 3), F)], {}),
    "neg_int64": ("neg", [((6,), "int64")], {}),
    "gelu": ("gelu", [((3, 33), F)], {}),
    "gelu_tanh": ("gelu", [((3, 33), F)], {"approximate": "tanh"}),
    "sub_broadcast": ("sub", [((2, 1, 4, 5), F), ((3, 1, 5), F)], {}),
    "div": ("div", [((2, 3, 4), F), ((4,), F)], {}),
    "pow_square": ("pow", [((2, 8), F), np.array(2.0, np.float32)], {}),
    "pow_cube": ("pow", [((2, 8), F), np.array([3.0], np.float32)], {}),
    "pow_any": ("pow", [((2, 8), F), ((1, 8), F)], {}),
    "add_6d": ("add", [((2, 1, 3, 1, 2, 4), F), ((3, 5, 1, 4), F)], {}),
    "mul_int64": ("mul", [((3, 4), "int64"), ((1, 4), "int64")], {}),
    "add_int32": ("add", [((2, 5), "int32"), ((2, 5), "int32")], {}),
    "equal_int64": ("equal", [((3, 4), "int64"), ((1, 4), "int64")], {}),
    "less": ("less", [((3, 4), F), ((3, 1), F)], {}),
    "greater": ("greater", [((1, 2, 3, 4, 5, 2), F), ((5, 1), F)], {}),
    "where": ("where", [((1, 1, 4, 6), "bool"), ((2, 3, 4, 6), F), ((1, 6), F)], {}),
    "where_const": ("where", [((4, 6), "bool"), np.float32([-1e4]), ((4, 6), F)], {}),
    "cast_float_int32": ("cast", [((3, 5), F)], {"dtype": "int32"}),
    "cast_int64_float": ("cast", [((3, 5), "int64")], {"dtype": "float32"}),
    "cast_to_bool": ("cast", [((3, 5), "int64")], {"dtype": "bool"}),
    "cast_bool_float": ("cast", [((3, 5), "bool")], {"dtype": "float32"}),
    "transpose": ("transpose", [((2, 3, 4, 5), F)], {"perm": (0, 2, 1, 3)}),
    "transpose_int8_reverse": ("transpose", [((3, 4, 5), "int8")], {}),
    "slice_steps": ("slice", [((4, 9, 6), F)],
                    {"starts": (1, 2), "ends": (9, 6), "axes": (1, 2), "steps": (3, 2)}),
    "slice_int64": ("slice", [((1, 16), "int64")], {"starts": (0,), "ends": (5,),
                                                    "axes": (1,), "steps": (1,)}),
    "expand": ("expand", [((1, 1, 4), F)], {"shape": (2, 3, 4)}),
    "expand_bool": ("expand", [((1, 1, 1, 5), "bool")], {"shape": (1, 2, 5, 5)}),
    "reduce_mean_last": ("reduce_mean", [((2, 3, 40), F)], {"axes": (-1,)}),
    "reduce_sum_middle": ("reduce_sum", [((2, 5, 3), F)], {"axes": (1,), "keepdims": False}),
    "reduce_max_all": ("reduce_max", [((3, 7, 2), F)], {}),
    "reduce_mean_two": ("reduce_mean", [((4, 3, 5), F)], {"axes": (0, 2)}),
    "softmax": ("softmax", [((2, 3, 37), F)], {"axis": -1}),
    "softmax_long": ("softmax", [((2, 1500), F)], {"axis": 1}),
}
#: Outputs that round once (or move data): byte for byte.
EXACT = {"neg", "neg_int64", "add_6d", "sub_broadcast", "div", "pow_square", "transpose",
         "slice_steps", "expand", "where", "where_const", "cast_int64_float",
         "cast_bool_float", "sqrt", "reduce_max_all", "cast_float_int32"}


@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise_layout_and_rows(gpu, name):
    op, inputs, attrs = ELEMENTWISE[name]
    g, feed = graph(op, inputs, np.random.default_rng(len(name)), **attrs)
    if op == "sqrt":
        feed["x0"] = np.abs(feed["x0"])
    if name == "pow_any":
        feed["x0"] = np.abs(feed["x0"]) + 0.1
    check(gpu, g, feed, exact=name in EXACT)


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm(gpu, bias):
    rng = np.random.default_rng(5)
    d = 48
    inputs = [((2, 5, d), F), rnd(rng, (d,))] + ([rnd(rng, (d,))] if bias else [])
    g, feed = graph("layer_norm", inputs, rng, epsilon=1e-5)
    feed["x0"] = feed["x0"] * 3 + 1
    check(gpu, g, feed)


MATMULS = [((2, 3, 5, 33), (2, 3, 33, 7)),         # attention-like, 4-D
           ((3, 17, 40), (40, 9)),                  # a 2-D b broadcast over a's batch
           ((1, 6, 20), (4, 20, 6))]                # a's batch broadcast


@pytest.mark.parametrize("a, b", MATMULS)
def test_matmul(gpu, a, b):
    g, feed = graph("matmul", [(a, F), (b, F)], np.random.default_rng(9))
    check(gpu, g, feed)


@pytest.mark.parametrize("a, b, transpose_b", [(a, b, False) for a, b in MATMULS]
                         + [((2, 5, 8), (2, 11, 8), True), ((3, 40), (5, 3, 16, 40), True)])
def test_qmatmul(gpu, a, b, transpose_b):
    """int32 sums, both requantization modes, a left shift; bit for bit."""
    rng = np.random.default_rng(9)
    for shift, mult in ((7, None), (14, 300), (-1, None)):
        g, feed = graph("qmatmul", [(a, "int8"), (b, "int8")], rng, transpose_b=transpose_b,
                        shift=(shift,), multiplier=mult, out_min=-120, out_max=127)
        check(gpu, g, feed)


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_matmul_schedules_and_tasks(gpu, dtype):
    """A batched matmul takes a GEMM schedule (tile, warps, stages; no split-K) from the
    tuner's space, each bit for bit (int8) or within float32 rounding; the tuner sees it
    as a task, measured (checked, then timed) on the interpreter."""
    rng = np.random.default_rng(12)
    op = "qmatmul" if dtype == "int8" else "matmul"
    attrs = {"shift": (8,), "transpose_b": True} if dtype == "int8" else {}
    b = (2, 3, 24, 40) if dtype == "int8" else (2, 3, 40, 24)
    g, feed = graph(op, [((2, 3, 20, 40), dtype), (b, dtype)], rng, **attrs)
    shape = gemm_shape(g.node("op"), g, dtype)
    assert (shape.m, shape.n, shape.k, shape.groups) == (20, 24, 40, 6)
    found = space(shape, split_k=False)
    assert all(s.split_k == 1 for s in found) and choose(shape, split_k=False) in found
    want = run_reference(g, feed)[g.outputs[0]]
    for schedule in random.Random(1).sample(found, 3):
        compiled = compile_model(g, gpu, schedules={"op": schedule})
        assert compiled.ops[0].schedule == schedule.to_dict()
        with compiled.session() as session:
            got = session.run(feed).outputs[g.outputs[0]]
        assert not mismatch(got, want, TOLERANCE), schedule
    with pytest.raises(ValueError, match="split_k 2: a batched matmul .* runs in one K slice"):
        compile_model(g, gpu, schedules={"op": GemmSchedule(16, 16, 32, split_k=2)})
    (task,) = gpu.tasks(g)
    assert task.workload["op"] == op and task.default_schedule().split_k == 1
    result = task.measure(task.default_schedule(), backend="interpreter")
    assert result.status == "ok", result


def test_matmul_constant_operand(gpu):
    rng = np.random.default_rng(2)
    g, feed = graph("qmatmul", [((2, 4, 40), "int8"), rnd(rng, (40, 24), "int8")], rng,
                    shift=(9,))
    check(gpu, g, feed)


@pytest.mark.parametrize("case", [
    dict(), dict(causal=True), dict(mask=(1, 1, 1, 6)), dict(mask=(2, 1, 4, 6), causal=True),
    dict(kv=(1, 2, 6, 8)), dict(s=1, causal=True)], ids=str)
def test_attention(gpu, case):
    rng = np.random.default_rng(3)
    b, h, s, t, d = 2, 2, case.get("s", 4), 6, 8
    inputs = [((b, h, s, d), F), (case.get("kv", (b, h, t, d)), F),
              (case.get("kv", (b, h, t, d))[:-1] + (5,), F)]
    if "mask" in case:
        inputs.append((case["mask"], F))
    g, feed = graph("attention", inputs, rng, scale=0.35, causal=case.get("causal", False))
    if "mask" in case:
        feed["x3"] = np.where(rnd(rng, case["mask"], "bool"), 0.0, -1e4).astype(np.float32)
        feed["x3"][..., 0] = 0.0                     # every row keeps a key
    check(gpu, g, feed)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_attention_long_rows_and_infinite_masks(dtype):
    """Keys over several of the kernel's tiles (an online softmax across them), queries
    over several programs, a head size of no power of two; -inf mask entries, one row
    wholly -inf (NaN, as the reference), rows whose first tile is wholly -inf."""
    target = targets.get("gpu", device="interpreter", float_dtype=dtype)
    rng = np.random.default_rng(13)
    s, t = 70, 150
    g, feed = graph("attention", [((1, 2, s, 12), F), ((1, 2, t, 12), F), ((1, 2, t, 7), F),
                                  ((1, 1, s, t), F)], rng, scale=0.29, causal=True)
    mask = np.where(rng.random((1, 1, s, t)) < 0.2, -np.inf, 0.0).astype(np.float32)
    mask[0, 0, 3] = -np.inf                                  # every key excluded: NaN
    mask[0, 0, 5:9, :70] = -np.inf                           # the first tiles excluded
    feed["x3"] = mask
    with np.errstate(invalid="ignore"):                   # the NaN row: 0 / 0
        want = run_reference(g, feed)[g.outputs[0]]
        got = run_gpu(target, g, feed)[g.outputs[0]]
    assert np.isnan(want[0, :, 3]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    err = np.abs(got[ok].astype(np.float64) - want[ok]).max() / np.abs(want[ok]).max()
    assert err < (TOLERANCE if dtype == "float32" else 1e-2), err


@pytest.mark.parametrize("axis, data, ids", [
    (0, ((30, 8), "float32"), ((1, 5), "int64")),
    (0, ((30, 8), "int8"), ((1, 5), "int32")),
    (1, ((2, 7, 3), "float32"), ((4,), "int64")),
])
def test_gather(gpu, axis, data, ids):
    rng = np.random.default_rng(4)
    table = rnd(rng, *data)
    g, feed = graph("gather", [table, ids], rng, axis=axis)
    n = table.shape[axis]
    feed["x1"] = rng.integers(-n, n, ids[0]).astype(ids[1])
    check(gpu, g, feed, exact=True)


def test_gather_computed_table_constant_ids(gpu):
    rng = np.random.default_rng(5)
    g, feed = graph("gather", [((2, 9, 4), "float32"), np.array([[8, -9], [0, 3]], np.int64)],
                    rng, axis=1)
    check(gpu, g, feed, exact=True)


def test_gather_bad_index_is_the_references_error(gpu):
    rng = np.random.default_rng(4)
    g, feed = graph("gather", [rnd(rng, (10, 4)), ((1, 6), "int64")], rng)
    compiled = compile_model(g, gpu)
    with compiled.session() as session:
        for bad in (10, -11, 2**40):
            ids = np.array([[0, 3, bad, -1, 9, 2]], np.int64)
            with pytest.raises(ValueError) as want:
                run_reference(g, {"x1": ids})
            with pytest.raises(ValueError) as got:
                session.run({"x1": ids})
            assert str(got.value) == str(want.value)
            assert re.search(rf"index {bad} in 'x1' is outside \[-10, 10\)", str(got.value))
        good = np.array([[0, 3, 9, -10, -1, 2]], np.int64)
        np.testing.assert_array_equal(session.run({"x1": good}).outputs[g.outputs[0]],
                                      run_reference(g, {"x1": good})[g.outputs[0]])


def extremes(rng, shape):
    """int8 data with rows of extremes: all -128, all 127, alternating, and random."""
    x = rnd(rng, shape, "int8")
    rows = x.reshape(-1, shape[-1])
    rows[0] = -128
    if len(rows) > 1:
        rows[1] = 127
    if len(rows) > 2:
        rows[2, ::2], rows[2, 1::2] = -128, 127
    return x


@pytest.mark.parametrize("scales", [(0.05, 0.03), (0.6, 0.9), (0.002, 0.004)])
def test_qgelu_every_int8_value(gpu, scales):
    g, feed = graph("qgelu", [((2, 128), "int8")], np.random.default_rng(0),
                    params=it.gelu_params(*scales))
    feed["x0"] = np.arange(-128, 128).astype(np.int8).reshape(2, 128)
    check(gpu, g, feed)


@pytest.mark.parametrize("shape, scale, top", [((4, 3, 37), 0.1, 0.9), ((3, 2000), 0.05, 0.2),
                                               ((5, 16), 2.0, 1.0), ((3, 1), 0.3, 1.0)])
def test_qsoftmax(gpu, shape, scale, top):
    rng = np.random.default_rng(shape[-1])
    g, feed = graph("qsoftmax", [(shape, "int8")], rng, params=it.softmax_params(scale, top))
    feed["x0"] = extremes(rng, shape)
    check(gpu, g, feed)


@pytest.mark.parametrize("d, beta, scales", [(48, True, (0.05, 0.03)), (200, False, (0.5, 0.02)),
                                             (7, True, (0.001, 0.1))])
def test_qlayer_norm(gpu, d, beta, scales):
    rng = np.random.default_rng(d)
    gamma, b, params = it.layer_norm_params(rng.standard_normal(d) + 1,
                                            rng.standard_normal(d) if beta else None, 1e-5,
                                            *scales, d)
    inputs = [((4, 3, d), "int8"), gamma] + ([b] if beta else [])
    g, feed = graph("qlayer_norm", inputs, rng, params=params)
    feed["x0"] = extremes(rng, (4, 3, d))
    feed["x0"][1, 1] = 5                                     # variance 0: epsilon alone
    check(gpu, g, feed)


@pytest.mark.parametrize("case", [
    dict(), dict(causal=True), dict(mask=(1, 1, 1, 6)), dict(mask=(2, 1, 4, 6), causal=True),
    dict(kv=(1, 2, 6, 8), mask=(4, 6)), dict(s=1, causal=True), dict(mult=True)], ids=str)
def test_qattention(gpu, case):
    """The definition's three steps bit for bit: the scores' requantization, the integer
    softmax with the mask's and the causal bound's excluded keys (a row with every key
    excluded gives zeros), the probabilities times v."""
    rng = np.random.default_rng(8)
    b, h, s, t, d = 2, 2, case.get("s", 4), 6, 8
    kv = case.get("kv", (b, h, t, d))
    inputs = [((b, h, s, d), "int8"), (kv, "int8"), (kv[:-1] + (5,), "int8")]
    if "mask" in case:
        inputs.append((case["mask"], "bool"))
    mult = case.get("mult")
    g, feed = graph("qattention", inputs, rng, causal=case.get("causal", False),
                    qk_shift=(13 if mult else 6,), qk_multiplier=90 if mult else None,
                    softmax_params=it.softmax_params(0.08, 0.7),
                    pv_shift=(7,), pv_multiplier=None, pv_out_min=-100)
    if "mask" in case:
        feed["x3"].reshape(-1, case["mask"][-1])[0] = True       # a row with no key
    check(gpu, g, feed)


def test_qattention_long_rows(gpu):
    """Keys over several of the fused kernel's tiles, queries over several programs, a
    head size of no power of two, a multiplier on both products; bit for bit."""
    rng = np.random.default_rng(14)
    s, t = 70, 150
    g, feed = graph("qattention", [((1, 2, s, 12), "int8"), ((1, 2, t, 12), "int8"),
                                   ((1, 2, t, 7), "int8"), ((1, 1, s, t), "bool")], rng,
                    causal=True, qk_shift=(12,), qk_multiplier=40,
                    softmax_params=it.softmax_params(0.05, 0.3), pv_shift=(12,),
                    pv_multiplier=30)
    feed["x3"][0, 0, 3] = True                               # a row with no key
    feed["x3"][0, 0, 5:9, :70] = True                        # the first tiles excluded
    check(gpu, g, feed)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_dense_ends_in_gelu(gpu, activation):
    rng = np.random.default_rng(6)
    g, feed = graph("dense", [((5, 24), F), rnd(rng, (16, 24)), rnd(rng, (16,))], rng,
                    activation=activation)
    check(gpu, g, feed)


def test_refusals_say_why(gpu):
    rng = np.random.default_rng(0)
    for (op, inputs, attrs), reason in [
            (("sub", [((2, 3), "int64")] * 2, {}), "sub on int64/int64: the GPU target runs "
                                                  "it on float32"),
            (("softmax", [((2, 3, 4), F)], {"axis": 1}), "softmax over axis 1 of \\(2, 3, 4\\)"
                                                        ": the GPU target normalizes the last"),
            (("matmul", [((4,), F), ((4, 3), F)], {}), "rank >= 2"),
            (("neg", [((1, 1, 1, 1, 1, 1, 2), F)], {}), "7-D tensor: the GPU target takes at "
                                                         "most 6-D"),
            (("qmatmul", [((2, 4), "int8"), ((4, 3), "int8")], {"shift": (1, 2)}),
             "shift \\(1, 2\\): one integer per tensor"),
            (("qsoftmax", [((2, 20000), "int8")], {"params": it.softmax_params(0.1, 0.5)}),
             "rows of 20000: the integer softmax holds for at most 16384"),
            (("qsoftmax", [((2, 8), "int8")], {"params": {"exp_multiplier": 5,
                                                          "prob_bits": 15}}),
             "qsoftmax constants: params\\['prob_bits'\\] = 15: an integer in \\[0, 14\\]")]:
        g, _ = graph(op, inputs, rng, **attrs)
        support = gpu.supports(g.nodes()[0], g)
        assert not support.ok
        assert re.search(reason, support.reason), support.reason


def test_roofline_counts_the_new_ops():
    rng = np.random.default_rng(0)
    g, _ = graph("attention", [((1, 2, 4, 8), F), ((1, 2, 6, 8), F), ((1, 2, 6, 5), F)], rng,
                 scale=0.5)
    k = roofline.estimate(g, "h100-sxm", "float32").kernels[0]
    assert k.macs == 2 * 4 * 6 * (8 + 5)
    assert k.ops == 2 * k.macs + roofline.SOFTMAX_OPS * 2 * 4 * 6
    assert k.bytes == 4 * (64 + 96 + 60 + 40)
    g, _ = graph("qmatmul", [((3, 5, 16), "int8"), ((16, 7), "int8")], rng)
    k = roofline.estimate(g, "h100-sxm").kernels[0]
    assert (k.macs, k.precision, k.bytes) == (3 * 5 * 7 * 16, "int8", 240 + 112 + 105)
    g, _ = graph("gather", [rnd(rng, (100, 8)), ((1, 4), "int64")], rng)
    k = roofline.estimate(g, "h100-sxm", "float32").kernels[0]
    # the rows read, not the whole table
    assert k.bytes == 2 * (4 * 8 * 4) + 8 * 4


# --- whole models: tiny ViT, BERT and GPT exported from torch.nn, imported, quantized -----

@pytest.mark.parametrize("kind, precision", [("bert", "int8"), ("gpt", "int8"), ("vit", "int8"),
                                             ("bert", "float32"), ("gpt", "float16")])
def test_tiny_transformers_whole(tmp_path, kind, precision):
    """Every op of a 2-layer model (width 32, 16 tokens or 16x16 pixels) on the GPU: int8
    bit for bit with the integer softmax, LayerNorm, GELU and attention, float32 and
    float16 (stored as float16, float32 sums) within their tolerances; the activations
    stay in device memory (one move per graph input and one for the output)."""
    pytest.importorskip("torch.onnx")     # exports the model
    import transformer_models as tm
    from vdla.compiler import pipeline
    from vdla.compiler.frontend.onnx_import import from_onnx

    path, inputs, model = tm.exported(kind, "legacy", tmp_path)
    g = from_onnx(str(path))
    calibration = {k: np.stack([tm.example_inputs(kind, model, seed=s)[k] for s in (2, 3)])
                   for k in inputs}
    loaded = pipeline.LoadedModel(kind, g, calibration, inputs, "example inputs")
    target = targets.get("gpu", device="interpreter",
                         float_dtype="float16" if precision == "float16" else "float32")
    outcome = pipeline.run_model(loaded, target, precision=precision)
    assert outcome.bit_exact, outcome.mismatch
    ops = {op.op for op in outcome.compiled.ops}
    assert all(op.target == "gpu" for op in outcome.compiled.ops), [
        (op.name, op.reason) for op in outcome.compiled.ops if op.target != "gpu"]
    if precision == "int8":
        assert outcome.max_error == 0.0
        assert {"qattention", "qlayer_norm", "qgelu", "qdense"} <= ops, ops
    else:
        bound = 1e-5 if precision == "float32" else pipeline.FLOAT16_TOLERANCE
        assert 0.0 < outcome.max_error < bound
        assert {"attention", "layer_norm", "dense", "gather"} <= ops, ops
    transfers = outcome.result.transfers
    assert len(transfers) == len(inputs) + 1 and not any(t.between for t in transfers)


@pytest.mark.slow
@pytest.mark.parametrize("name, sizes", [("bert_tiny", dict(seq_len=16)),
                                         ("gpt_mini", dict(seq_len=16, num_classes=512)),
                                         ("vit_tiny", dict(image_size=32))])
def test_zoo_transformers_int8(name, sizes):
    """The zoo's transformers (shorter sequences, smaller images) wholly on the GPU, int8
    bit for bit (about a minute each on the interpreter; the tiny models above cover the
    same ops)."""
    from vdla.compiler import pipeline
    from vdla.compiler.frontend import datasets, zoo

    g = zoo.get(name, **sizes)
    samples, feed, note = datasets.model_inputs(g, seed=0, calibration=2)
    outcome = pipeline.run_model(pipeline.LoadedModel(name, g, samples, feed, note),
                                 targets.get("gpu", device="interpreter"))
    assert outcome.bit_exact and outcome.max_error == 0.0, outcome.mismatch
    assert all(op.target == "gpu" for op in outcome.compiled.ops), [
        (op.name, op.reason) for op in outcome.compiled.ops if op.target != "gpu"]
    assert "qattention" in {op.op for op in outcome.compiled.ops}


# --- every launch compiles for a GPU (Triton's offline compiler: no GPU needed) -----------

def _compile_graphs():
    """(graph, float dtype) of every kind of launch the sequence kernels make."""
    rng = np.random.default_rng(0)
    for op, inputs, attrs in ELEMENTWISE.values():
        yield graph(op, inputs, rng, **attrs)[0], "float32"
    q, k, v = ((2, 2, 4, 8), F), ((2, 2, 6, 8), F), ((2, 2, 6, 5), F)
    floats = [graph("attention", [q, k, v, ((2, 1, 4, 6), F)], rng, scale=0.3, causal=True),
              graph("matmul", [((3, 17, 40), F), ((40, 9), F)], rng),
              graph("layer_norm", [((2, 5, 48), F), rnd(rng, (48,)), rnd(rng, (48,))], rng),
              graph("dense", [((5, 24), F), rnd(rng, (16, 24))], rng, activation="gelu_tanh"),
              graph("gather", [rnd(rng, (30, 8)), ((1, 5), "int64")], rng)]
    for (g, _), dtype in [(f, d) for f in floats for d in ("float32", "float16")]:
        yield g, dtype
    i8 = "int8"
    yield graph("qattention", [(q[0], i8), (k[0], i8), (v[0], i8), ((2, 1, 4, 6), "bool")],
                rng, causal=True, qk_shift=(6,), qk_multiplier=90, pv_shift=(7,),
                softmax_params=it.softmax_params(0.08, 0.7))[0], "float32"
    yield graph("qmatmul", [((2, 5, 8), i8), ((2, 11, 8), i8)], rng, transpose_b=True,
                shift=(7,))[0], "float32"
    yield graph("qsoftmax", [((3, 37), i8)], rng, params=it.softmax_params(0.1, 0.9))[0], \
        "float32"
    yield graph("qgelu", [((2, 128), i8)], rng, params=it.gelu_params(0.05, 0.03))[0], "float32"
    gamma, beta, params = it.layer_norm_params(np.ones(48), np.zeros(48), 1e-5, 0.05, 0.03, 48)
    yield graph("qlayer_norm", [((4, 48), i8), gamma, beta], rng, params=params)[0], "float32"


def _signature(fn, launch, node, g, kernel, float_dtype):
    """A launch's Triton signature and constexprs as the runtime would specialize it
    (pointers by the bound tensor's dtype, an int of value 1 a constexpr)."""
    from vdla.compiler.targets.gpu.launches import Ref

    short = {"float32": "fp32", "float16": "fp16", "float64": "fp64", "int8": "i8",
             "int32": "i32", "int64": "i64", "bool": "i1", "uint8": "u8"}
    sig, consts = {}, {}
    for name, a in zip(fn.arg_names, launch.args):
        if isinstance(a, Ref):
            dtype = {"in": lambda: g.tensors[node.inputs[a.key]].dtype,
                     "out": lambda: g.tensors[node.outputs[0]].dtype,
                     "const": lambda: str(np.dtype(kernel.consts[a.key].dtype)),
                     "buf": lambda: kernel.buffers[a.key][1],
                     "scratch": lambda: kernel.scratch[1],
                     "dummy": lambda: a.key}[a.kind]()
            dtype = float_dtype if dtype == "float32" and a.kind in ("in", "out") else dtype
            sig[name] = "*" + short[dtype]
        elif isinstance(a, float):
            sig[name] = "fp32"
        elif int(a) == 1:
            sig[name], consts[name] = "constexpr", 1
        else:
            sig[name] = "i32" if -2**31 <= int(a) < 2**31 else "i64"
    for key, value in launch.meta.items():
        if key not in ("num_warps", "num_stages"):
            sig[key], consts[key] = "constexpr", value
    return sig, consts


def compile_every_launch(capability: int) -> int:
    """Compile every distinct launch of `_compile_graphs` for CUDA `capability` (run in
    a process without TRITON_INTERPRET); returns how many."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from vdla.compiler.targets.gpu import kernels, sequence_kernels
    from vdla.compiler.targets.gpu.lower import lower

    done = set()
    for g, float_dtype in _compile_graphs():
        for node in g.nodes():
            kernel, _ = lower(node, g, float_dtype=float_dtype)
            for launch in kernel.launches:
                module = kernels if launch.kernel in kernels.__all__ else sequence_kernels
                fn = getattr(module, launch.kernel)
                sig, consts = _signature(fn, launch, node, g, kernel, float_dtype)
                options = {k: v for k, v in launch.meta.items()
                           if k in ("num_warps", "num_stages")}
                key = (launch.kernel, repr(sorted(sig.items())), repr(sorted(consts.items())),
                       repr(sorted(options.items())))
                if key not in done:
                    done.add(key)
                    triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts),
                                   target=GPUTarget("cuda", capability, 32), options=options)
    return len(done)


@pytest.mark.slow
@pytest.mark.parametrize("capability", [80, 90])
def test_every_launch_compiles_for_cuda(capability):
    """The interpreter runs the kernels as numpy and lets through what Triton's compiler
    refuses; this compiles each kind of launch to a cubin for an A100 (sm_80) and an
    H100 (sm_90) with Triton's own ptxas, which needs no GPU."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("triton.backends.nvidia") is None:
        pytest.skip("Triton has no CUDA backend here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    here = os.path.dirname(__file__)
    env["PYTHONPATH"] = os.pathsep.join([here, os.path.join(here, "..", "..", "..")]
                                        + [env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", "import test_transformer_ops as t; "
                               f"print(t.compile_every_launch({capability}))"],
        env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) > 40
