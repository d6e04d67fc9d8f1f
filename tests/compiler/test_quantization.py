"""int8 quantization: the integer kernels against naive loop implementations, and the
`quantize` pass on small fused graphs in both requantization modes (shift only, and
multiply, which a target runs when it has a multiplier: the accelerator's ALU MUL)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import vdla
from vdla.compiler import Graph, GraphError, quantize, run_reference
from vdla.compiler.passes import QuantizationError, quantize_error
from vdla.compiler.passes.quantize import _Quantizer

SHIFT, MULTIPLY = "shift", "multiply"
MODES = pytest.mark.parametrize("mode", [SHIFT, MULTIPLY], ids=["shift", "multiply"])
INTEGER_OPS = {"quantize", "qconv2d", "qdense", "qadd", "qavg_pool2d", "qglobal_avg_pool2d"}


# --- an independent scalar model of the integer arithmetic ----------------------------------

def wrap(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def rq(acc: int, multiplier, shift) -> int:
    a = wrap(acc)
    if multiplier is not None:
        a = wrap(a * multiplier)
    return wrap(a + (1 << (shift - 1))) >> shift if shift > 0 else wrap(a << -shift)


def pick(param, c):
    """Channel c's value of a per-tensor or per-channel attribute."""
    if param is None or isinstance(param, int):
        return param
    return int(param[c]) if len(param) > 1 else int(param[0])


def naive_qconv2d(x, w, bias, residual, a):
    n, c, h, wd = x.shape
    o, ig, kh, kw = w.shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = a["strides"], a["dilations"], a["pads"]
    og = o // a["groups"]
    ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, ho, wo), np.int8)
    for b in range(n):
        for oc in range(o):
            g = oc // og
            for oy in range(ho):
                for ox in range(wo):
                    acc = int(bias[oc]) if bias is not None else 0
                    for ic in range(ig):
                        for ky in range(kh):
                            for kx in range(kw):
                                iy, ix = oy * sh - pt + ky * dh, ox * sw - pl + kx * dw
                                if 0 <= iy < h and 0 <= ix < wd:
                                    acc += int(x[b, g * ig + ic, iy, ix]) * int(w[oc, ic, ky, kx])
                    y = rq(acc, pick(a["multiplier"], oc), pick(a["shift"], oc))
                    if residual is not None:
                        y = wrap(y + rq(int(residual[b, oc, oy, ox]), a["residual_multiplier"],
                                        a["residual_shift"]))
                    out[b, oc, oy, ox] = min(max(y, a["out_min"]), a["out_max"])
    return out


def naive_qdense(x, w, bias, residual, a):
    n, k = x.shape
    out = np.zeros((n, w.shape[0]), np.int8)
    for b in range(n):
        for o in range(w.shape[0]):
            acc = sum(int(x[b, i]) * int(w[o, i]) for i in range(k))
            acc += int(bias[o]) if bias is not None else 0
            y = rq(acc, pick(a["multiplier"], o), pick(a["shift"], o))
            if residual is not None:
                y = wrap(y + rq(int(residual[b, o]), a["residual_multiplier"], a["residual_shift"]))
            out[b, o] = min(max(y, a["out_min"]), a["out_max"])
    return out


def int8(rng, shape):
    return rng.integers(-128, 128, size=shape, dtype=np.int8)


REQUANT_DEFAULTS = dict(multiplier=None, shift=(0,), residual_multiplier=None, residual_shift=0,
                        out_min=-128, out_max=127)

CONV_CASES = {
    "plain": dict(c=3, o=4, k=3, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1,
                  shift=(9, 10, 11, 12)),
    "stride2-pad-multiplier": dict(c=4, o=4, k=3, strides=(2, 2), pads=(1, 1, 1, 1),
                                   dilations=(1, 1), groups=1, multiplier=(1000, 3, 32767, 77),
                                   shift=(20, 9, 24, 15)),
    "asymmetric-pad-dilation-groups": dict(c=4, o=6, k=2, strides=(1, 2), pads=(0, 1, 2, 1),
                                           dilations=(2, 1), groups=2, shift=8),
    "depthwise": dict(c=4, o=4, k=3, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1),
                      groups=4, multiplier=5, shift=10),
    "residual-relu": dict(c=3, o=4, k=1, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1),
                          groups=1, shift=(7, 8, 9, 10), residual=True, residual_multiplier=3000,
                          residual_shift=12, out_min=0),
    "clip-bounds-no-bias": dict(c=2, o=2, k=3, strides=(1, 1), pads=(1, 0, 1, 0),
                                dilations=(1, 1), groups=1, shift=11, bias=False, out_min=-20,
                                out_max=50, residual=True, residual_shift=-1),
}


@pytest.mark.parametrize("case", CONV_CASES.values(), ids=CONV_CASES.keys())
def test_qconv2d_matches_a_naive_loop(case):
    rng = np.random.default_rng(len(str(case)))
    case = dict(case)
    c, o, k = case.pop("c"), case.pop("o"), case.pop("k")
    with_bias, with_residual = case.pop("bias", True), case.pop("residual", False)
    attrs = {**REQUANT_DEFAULTS, **case}
    x = int8(rng, (2, c, 6, 5))
    w = int8(rng, (o, c // attrs["groups"], k, k))
    bias = rng.integers(-5000, 5000, size=o).astype(np.int32) if with_bias else None
    g = Graph("qconv")
    inputs = [g.add_input("x", x.shape, "int8"), g.add_constant("w", w, "int8"),
              g.add_constant("b", bias, "int32") if with_bias else ""]
    feed = {"x": x}
    if with_residual:
        shape = naive_qconv2d(x, w, bias, None, {**attrs, "residual_multiplier": None}).shape
        feed["r"] = int8(rng, shape)
        inputs.append(g.add_input("r", shape, "int8"))
    g.set_outputs([g.add_node("qconv2d", inputs, **attrs)])
    g.validate()
    (got,) = run_reference(g, feed).values()
    expected = naive_qconv2d(x, w, bias, feed.get("r"), attrs)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, expected)
    assert len(np.unique(got)) > 5                  # not all clipped


@pytest.mark.parametrize("attrs, residual", [
    (dict(shift=(10, 11, 9, 12, 10)), False),
    (dict(multiplier=(100, 2000, 32767, 1, 9), shift=(16, 18, 22, 2, 14), out_min=0), False),
    (dict(multiplier=1234, shift=17, residual_multiplier=7, residual_shift=3, out_min=-50,
          out_max=60), True),
], ids=["shift", "multiplier-relu", "residual-clip"])
def test_qdense_matches_a_naive_loop(attrs, residual):
    rng = np.random.default_rng(5)
    attrs = {**REQUANT_DEFAULTS, **attrs}
    x, w = int8(rng, (3, 20)), int8(rng, (5, 20))
    bias = rng.integers(-20000, 20000, size=5).astype(np.int32)
    g = Graph("qdense")
    inputs = [g.add_input("x", x.shape, "int8"), g.add_constant("w", w, "int8"),
              g.add_constant("b", bias, "int32")]
    feed = {"x": x}
    if residual:
        feed["r"] = int8(rng, (3, 5))
        inputs.append(g.add_input("r", (3, 5), "int8"))
    g.set_outputs([g.add_node("qdense", inputs, **attrs)])
    (got,) = run_reference(g.validate(), feed).values()
    np.testing.assert_array_equal(got, naive_qdense(x, w, bias, feed.get("r"), attrs))


def test_qadd_matches_the_scalar_model():
    rng = np.random.default_rng(2)
    a, b = int8(rng, (1, 3, 4, 4)), int8(rng, (1, 3, 4, 4))
    attrs = dict(a_multiplier=20000, a_shift=15, b_multiplier=None, b_shift=-1, out_min=-100,
                 out_max=90)
    g = Graph("qadd")
    g.set_outputs([g.add_node("qadd", [g.add_input("a", a.shape, "int8"),
                                       g.add_input("b", b.shape, "int8")], **attrs)])
    (got,) = run_reference(g, {"a": a, "b": b}).values()
    expected = [min(max(wrap(rq(int(p), 20000, 15) + rq(int(q), None, -1)), -100), 90)
                for p, q in zip(a.ravel(), b.ravel())]
    np.testing.assert_array_equal(got.ravel(), expected)
    assert got.dtype == np.int8


@pytest.mark.parametrize("pool", [
    dict(kernel=(2, 2), strides=(2, 2), pads=(0, 0, 0, 0), count_include_pad=False),
    dict(kernel=(3, 3), strides=(1, 2), pads=(1, 1, 1, 1), count_include_pad=True),
], ids=["plain", "padded"])
def test_qavg_pool2d_sums_windows_then_requantizes(pool):
    rng = np.random.default_rng(4)
    x = int8(rng, (1, 2, 6, 6))
    attrs = dict(pool, multiplier=7282, shift=16)                 # about 1/9
    g = Graph("qpool")
    g.set_outputs([g.add_node("qavg_pool2d", [g.add_input("x", x.shape, "int8")], **attrs)])
    (got,) = run_reference(g, {"x": x}).values()
    (kh, kw), (sh, sw), (pt, pl, _, _) = pool["kernel"], pool["strides"], pool["pads"]
    for c in range(2):
        for oy in range(got.shape[2]):
            for ox in range(got.shape[3]):
                s = sum(int(x[0, c, oy * sh - pt + i, ox * sw - pl + j])
                        for i in range(kh) for j in range(kw)
                        if 0 <= oy * sh - pt + i < 6 and 0 <= ox * sw - pl + j < 6)
                assert got[0, c, oy, ox] == min(max(rq(s, 7282, 16), -128), 127)


def test_qglobal_avg_pool2d():
    rng = np.random.default_rng(6)
    x = int8(rng, (2, 3, 4, 4))
    g = Graph("qgpool")
    g.set_outputs([g.add_node("qglobal_avg_pool2d", [g.add_input("x", x.shape, "int8")],
                              shift=4)])
    (got,) = run_reference(g, {"x": x}).values()
    sums = x.astype(np.int64).sum(axis=(2, 3), keepdims=True)
    np.testing.assert_array_equal(got, np.floor(sums / 16 + 0.5).astype(np.int8))


def test_quantize_rounds_half_up_and_saturates_and_dequantize_scales():
    g = Graph("qdq")
    x = g.add_input("x", (8,))
    q = g.add_node("quantize", [x], scale=0.5)
    g.set_outputs([q, g.add_node("dequantize", [q], scale=0.5)])
    values = np.array([0.24, 0.25, -0.25, -0.26, 100.0, -100.0, 63.5, -64.2], np.float32)
    got_q, got_dq = run_reference(g, {"x": values}).values()
    np.testing.assert_array_equal(got_q, [0, 1, 0, -1, 127, -128, 127, -128])
    assert got_q.dtype == np.int8 and got_dq.dtype == np.float32
    np.testing.assert_array_equal(got_dq, got_q.astype(np.float32) * 0.5)


def test_float_kernels_keep_int8_and_max_pool_pads_with_the_minimum():
    rng = np.random.default_rng(8)
    x = -np.abs(int8(rng, (1, 2, 4, 4))) - 1                      # all negative
    g = Graph("int8 ops")
    xi = g.add_input("x", x.shape, "int8")
    m = g.add_node("max_pool2d", [xi], kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1))
    r = g.add_node("relu", [xi])
    f = g.add_node("flatten", [m])
    cat = g.add_node("concat", [m, r], axis=1)
    g.set_outputs([m, r, f, cat])
    got_m, got_r, got_f, got_cat = run_reference(g.validate(), {"x": x}).values()
    padded = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-999)
    expected = np.array([[[[padded[0, c, i:i + 3, j:j + 3].max() for j in range(4)]
                           for i in range(4)] for c in range(2)]])
    np.testing.assert_array_equal(got_m, expected)
    assert got_m.max() < 0 and got_m.dtype == np.int8
    assert not got_r.any() and got_r.dtype == np.int8
    assert got_f.dtype == np.int8 and got_cat.dtype == np.int8


def test_integer_kernels_reject_float_operands_and_bad_bounds():
    g = Graph("bad")
    x = g.add_input("x", (1, 4))
    g.set_outputs([g.add_node("qdense", [x, g.add_constant("w", np.ones((2, 4), np.int8))],
                              shift=1)])
    with pytest.raises(GraphError,
                       match=r"node 'qdense' \(qdense\): input must be int8, not float32"):
        run_reference(g, {"x": np.ones((1, 4), np.float32)})
    g = Graph("bad bounds")
    x = g.add_input("x", (1, 4), "int8")
    g.set_outputs([g.add_node("qdense", [x, g.add_constant("w", np.ones((2, 4), np.int8))],
                              shift=1, out_min=10, out_max=5)])
    with pytest.raises(GraphError, match="out_min 10 and out_max 5"):
        run_reference(g, {"x": np.ones((1, 4), np.int8)})
    g = Graph("bad shift")
    x = g.add_input("x", (1, 4), "int8")
    g.set_outputs([g.add_node("qdense", [x, g.add_constant("w", np.ones((2, 4), np.int8))],
                              shift=(1, 2, 3))])
    with pytest.raises(GraphError, match=r"node 'qdense'.*shift has 3 values but axis 1"):
        run_reference(g, {"x": np.ones((1, 4), np.int8)})


# --- the quantize pass ---------------------------------------------------------------------

class Builder:
    """Fused float graphs with seeded He-normal weights."""

    def __init__(self, name, shape, seed=0):
        self.rng = np.random.default_rng(seed)
        self.g = Graph(name)
        self.x = self.g.add_input("x", shape)

    def conv(self, x, o, k=3, stride=1, pad=1, groups=1, act="relu", residual="", gain=1.0,
             **attrs):
        c = self.g.tensors[x].shape[1]
        fan_in = c // groups * k * k
        w = self.rng.normal(0, gain * math.sqrt(2 / fan_in), (o, c // groups, k, k))
        b = self.rng.normal(0, 0.1, o)
        inputs = [x, self.g.add_constant("w", w.astype(np.float32)),
                  self.g.add_constant("b", b.astype(np.float32))]
        if residual:
            inputs.append(residual)
        return self.g.add_node("conv2d", inputs, strides=(stride, stride),
                               pads=(pad,) * 4, groups=groups, activation=act, **attrs)

    def dense(self, x, o, act=None):
        k = self.g.tensors[x].shape[1]
        w = self.rng.normal(0, math.sqrt(2 / k), (o, k)).astype(np.float32)
        b = self.rng.normal(0, 0.1, o).astype(np.float32)
        return self.g.add_node("dense", [x, self.g.add_constant("w", w),
                                         self.g.add_constant("b", b)], activation=act)

    def build(self, *outputs):
        self.g.set_outputs(outputs)
        return self.g.validate()

    def samples(self, n, seed):
        shape = self.g.tensors[self.x].shape
        return {"x": np.random.default_rng(seed).normal(size=(n,) + shape).astype(np.float32)}


def conv_relu():
    b = Builder("conv_relu", (1, 3, 8, 8))
    return b, b.build(b.conv(b.x, 8))


def conv_chain():
    b = Builder("conv_chain", (1, 3, 8, 8), seed=1)
    y = b.conv(b.x, 8, stride=2)
    y = b.conv(y, 8, act="clip", clip_min=0.0, clip_max=6.0)
    y = b.conv(y, 8, groups=8)                                   # depthwise
    return b, b.build(b.conv(y, 4, k=1, pad=0, act=None))


def residual_block():
    b = Builder("residual", (1, 4, 8, 8), seed=2)
    a = b.conv(b.x, 8)
    y = b.conv(a, 8)
    y = b.conv(y, 8, residual=a, gain=0.5)                      # relu(conv + bias + a)
    # An add of two pooled branches cannot be fused into a conv: a qadd.
    p = b.g.add_node("max_pool2d", [y], kernel=(2, 2), strides=(2, 2))
    q = b.g.add_node("max_pool2d", [b.conv(y, 8, act=None)], kernel=(2, 2), strides=(2, 2))
    s = b.g.add_node("relu", [b.g.add_node("add", [p, q])])
    return b, b.build(b.conv(s, 4, act=None))


def dense_softmax():
    b = Builder("mlp", (1, 16), seed=3)
    y = b.dense(b.dense(b.x, 32, act="relu"), 10)
    return b, b.build(b.g.add_node("softmax", [y], axis=1))


def pools():
    b = Builder("pools", (1, 3, 16, 16), seed=4)
    y = b.conv(b.x, 8)
    y = b.g.add_node("max_pool2d", [y], kernel=(2, 2), strides=(2, 2))
    y = b.g.add_node("avg_pool2d", [b.conv(y, 8)], kernel=(2, 2), strides=(2, 2))
    y = b.g.add_node("global_avg_pool2d", [b.conv(y, 8)])        # 4x4: count 16
    y = b.dense(b.g.add_node("flatten", [y]), 5)
    return b, b.build(b.g.add_node("softmax", [y], axis=1))


GRAPHS = {f.__name__: f for f in (conv_relu, conv_chain, residual_block, dense_softmax, pools)}


def is_pow2(scale) -> bool:
    return all(math.frexp(float(s))[0] == 0.5 for s in np.atleast_1d(scale))


def check_integer_tensors(q: Graph, values: dict):
    """Integer ops read and write int8 (bias int32) tensors that carry their scale."""
    for node in q.nodes():
        if node.op not in INTEGER_OPS:
            continue
        out = q.tensors[node.outputs[0]]
        assert out.dtype == "int8" and values[out.name].dtype == np.int8, node.name
        assert out.scale is not None and np.all(np.asarray(out.scale) > 0), node.name
        for i, name in enumerate(node.inputs):
            if not name or node.op == "quantize":
                continue
            t = q.tensors[name]
            want = "int32" if node.op in ("qconv2d", "qdense") and i == 2 else "int8"
            assert t.dtype == want and values[name].dtype == np.dtype(want), (node.name, name)
            assert t.scale is not None, (node.name, name)
    for name in q.outputs:
        assert q.tensors[name].dtype == "float32"


def requant_attrs(q: Graph):
    for node in q.nodes():
        for key in ("multiplier", "residual_multiplier", "a_multiplier", "b_multiplier"):
            if key in node.attrs and node.op in INTEGER_OPS:
                yield node, key, node.attrs[key]


@pytest.mark.parametrize("make", GRAPHS.values(), ids=GRAPHS.keys())
@MODES
def test_quantized_graphs_are_close_to_float(make, mode):
    b, g = make()
    q = quantize(g, b.samples(16, seed=10), mode)
    assert q.metadata["quantized"] == {"mode": mode, "per_channel": True}
    assert q.inputs == g.inputs and q.outputs == g.outputs
    ops = q.count_ops()
    assert ops.get("qconv2d", 0) + ops.get("qdense", 0) == \
        g.count_ops().get("conv2d", 0) + g.count_ops().get("dense", 0)
    assert not {"conv2d", "dense"} & set(ops)
    test = b.samples(8, seed=11)
    for name, err in quantize_error(g, q, test).items():
        assert err["relative"] < 0.05, (name, err)
    check_integer_tensors(q, run_reference(q, {"x": test["x"][0]}, keep=True))
    scales = [t.scale for t in q.tensors.values() if t.scale is not None]
    scales += [n.attrs["scale"] for n in q.nodes() if n.op in ("quantize", "dequantize")]
    multipliers = [v for _, _, v in requant_attrs(q) if v is not None]
    if mode == SHIFT:
        assert all(is_pow2(s) for s in scales)
        assert not multipliers
    else:
        assert not all(is_pow2(s) for s in scales)
        assert multipliers and all(1 <= m <= 32767 for v in multipliers
                                   for m in np.atleast_1d(v))


@MODES
def test_the_pass_output_is_the_kernel_arithmetic(mode):
    """The quantized conv's int8 output equals the naive loop applied to its quantized
    input, weights, bias and attributes, and the input is quantize()'s rounding."""
    b, g = conv_relu()
    q = quantize(g, b.samples(8, seed=1), mode)
    (qnode,) = [n for n in q.nodes() if n.op == "qconv2d"]
    x = b.samples(1, seed=2)["x"][0]
    values = run_reference(q, {"x": x}, keep=True)
    xq = values[qnode.inputs[0]]
    s_x = q.tensors[qnode.inputs[0]].scale
    np.testing.assert_array_equal(xq, np.clip(np.floor(x / s_x + 0.5), -128, 127))
    w, bias = (q.tensors[n].data for n in qnode.inputs[1:3])
    np.testing.assert_array_equal(values[qnode.outputs[0]],
                                  naive_qconv2d(xq, w, bias, None, qnode.attrs))
    assert qnode.attrs["out_min"] == 0 and qnode.attrs["out_max"] == 127      # the ReLU


@MODES
def test_weight_scales_per_channel_or_per_tensor(mode):
    b = Builder("channels", (1, 3, 6, 6), seed=5)
    y = b.conv(b.x, 4, act=None)
    g = b.build(y)
    w = g.tensors["w"].data.copy()
    w[2:] *= 0.01                                     # two channels of much smaller weights
    g.tensors["w"].data = w
    cal = b.samples(8, seed=3)
    per_channel = quantize(g, cal, mode)
    per_tensor = quantize(g, cal, mode, per_channel=False)
    assert per_channel.metadata["quantized"]["per_channel"] is True
    assert per_tensor.metadata["quantized"]["per_channel"] is False
    (wc,) = [t for t in per_channel.tensors.values() if t.is_constant and t.dtype == "int8"
             and t.data.ndim == 4]
    (wt,) = [t for t in per_tensor.tensors.values() if t.is_constant and t.dtype == "int8"
             and t.data.ndim == 4]
    assert np.shape(wc.scale) == (4,) and np.ndim(wt.scale) == 0
    # Per channel, every channel uses its int8 range; per tensor, the small ones do not.
    assert np.abs(wc.data.reshape(4, -1)).max(axis=1).min() >= 64
    assert np.abs(wt.data[2:]).max() <= 2
    err_c = np.abs(wc.data * np.reshape(wc.scale, (4, 1, 1, 1)) - w)[2:].max()
    err_t = np.abs(wt.data * wt.scale - w)[2:].max()
    assert err_c < err_t / 20
    (node,) = [n for n in per_tensor.nodes() if n.op == "qconv2d"]
    assert isinstance(node.attrs["shift"], int)
    assert node.attrs["multiplier"] is None or isinstance(node.attrs["multiplier"], int)
    (node,) = [n for n in per_channel.nodes() if n.op == "qconv2d"]
    assert len(node.attrs["shift"]) == 4
    for q in (per_channel, per_tensor):
        assert quantize_error(g, q, b.samples(4, seed=4))[y]["relative"] < 0.05


@MODES
def test_concat_inputs_share_one_scale(mode):
    b = Builder("concat", (1, 3, 8, 8), seed=6)
    small = b.conv(b.x, 4, gain=0.1)
    pooled = b.g.add_node("max_pool2d", [small], kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1))
    big = b.conv(b.x, 4, gain=3.0)
    cat = b.g.add_node("concat", [pooled, big], axis=1)
    g = b.build(b.conv(cat, 4, act=None))
    q = quantize(g, b.samples(12, seed=5), mode)
    (concat,) = [n for n in q.nodes() if n.op == "concat"]
    s = q.tensors[concat.outputs[0]].scale
    # The conv feeding only the concat is produced at the concat's scale; the pooled
    # branch keeps its conv's smaller scale and is rescaled by a qadd with zero.
    producers = [q.producer(t) for t in concat.inputs]
    assert [p.op for p in producers] == ["qadd", "qconv2d"]
    assert all(q.tensors[t].scale == s for t in concat.inputs)
    rescale = producers[0]
    assert q.producer(rescale.inputs[0]).op == "max_pool2d"
    assert q.tensors[rescale.inputs[0]].scale < s
    assert not q.tensors[rescale.inputs[1]].data.any()
    for err in quantize_error(g, q, b.samples(6, seed=6)).values():
        assert err["relative"] < 0.05


@MODES
def test_standalone_clip_and_ops_without_integer_form(mode):
    b = Builder("mixed", (1, 3, 9, 9), seed=7)
    y = b.g.add_node("max_pool2d", [b.conv(b.x, 6, act=None)], kernel=(3, 3), strides=(1, 1))
    y = b.g.add_node("clip", [y], min=-0.5, max=0.75)
    y = b.g.add_node("lrn", [b.conv(y, 6)], size=3)                      # float only
    y = b.g.add_node("avg_pool2d", [b.conv(y, 6)], kernel=(3, 3), strides=(1, 1))  # count 9
    y = b.g.add_node("avg_pool2d", [y], kernel=(2, 2), strides=(1, 1), pads=(1, 1, 1, 1))
    g = b.build(b.conv(y, 4, act=None))
    q = quantize(g, b.samples(12, seed=8), mode)
    ops = [n.op for n in q.nodes()]
    # clip: a qadd with a zero operand whose bounds are the clip's at the input's scale.
    (clip,) = [n for n in q.nodes() if n.op == "qadd"]
    s = q.tensors[clip.inputs[0]].scale
    assert clip.attrs["out_min"] == max(-128, math.floor(-0.5 / s + 0.5))
    assert clip.attrs["out_max"] == min(127, math.floor(0.75 / s + 0.5))
    # lrn runs in float between a dequantize and a quantize.
    (lrn,) = [n for n in q.nodes() if n.op == "lrn"]
    assert q.producer(lrn.inputs[0]).op == "dequantize"
    assert {c.op for c in q.consumers(lrn.outputs[0])} == {"quantize"}
    # A pool whose windows have different counts (padding, count_include_pad False) has no
    # integer form; a count of 9 has one with a multiplier (in shift mode an int8 one).
    assert ops.count("avg_pool2d") == 1 and ops.count("qavg_pool2d") == 1
    (pool,) = [n for n in q.nodes() if n.op == "qavg_pool2d"]
    assert 1 <= pool.attrs["multiplier"] <= (127 if mode == SHIFT else 32767)
    for err in quantize_error(g, q, b.samples(6, seed=9)).values():
        assert err["relative"] < 0.05


# --- quantizing early: float ops that commute with quantize run on int8 ---------------------

def early_graph():
    """Float ops (LRN, softmax) followed by ops that commute with quantize:
    lrn -> max_pool (3x3/2, pads, ceil) -> relu -> clip -> conv (a chain);
    lrn -> max_pool (3x3/1) -> concat with a conv (an inception branch) -> conv;
    lrn -> max_pool -> a conv and a softmax (a float reader: stays float);
    softmax -> max_pool -> graph output (stays float)."""
    b = Builder("early", (1, 4, 11, 11), seed=12)
    g = b.g
    y = g.add_node("lrn", [b.conv(b.x, 8, act=None)], size=3, name="lrn")
    p = g.add_node("max_pool2d", [y], kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1),
                   ceil_mode=True, name="pool_chain")
    p = g.add_node("relu", [p], name="relu_chain")
    p = g.add_node("clip", [p], min=0.1, max=0.7, name="clip_chain")
    chain = b.conv(p, 6, act=None)
    branch = g.add_node("max_pool2d", [y], kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1),
                        name="pool_branch")
    cat = g.add_node("concat", [b.conv(y, 4), branch], axis=1, name="cat")
    merged = b.conv(cat, 6, act=None)
    shared = g.add_node("max_pool2d", [y], kernel=(2, 2), strides=(2, 2), name="pool_shared")
    soft = g.add_node("softmax", [shared], axis=1, name="soft")
    used = b.conv(shared, 6, act=None)
    last = g.add_node("max_pool2d", [soft], kernel=(2, 2), strides=(2, 2), name="pool_out")
    return b, b.build(chain, merged, used, last)


def quantize_late(g, samples, mode):
    """`quantize` as it was before quantizing early: every float op stays float."""
    original = _Quantizer.pull_into_int8
    _Quantizer.pull_into_int8 = lambda self: None
    try:
        return quantize(g, samples, mode)
    finally:
        _Quantizer.pull_into_int8 = original


@MODES
def test_commuting_ops_on_float_data_run_on_int8_bit_exactly(mode):
    b, g = early_graph()
    cal = b.samples(8, seed=13)
    q, late = quantize(g, cal, mode), quantize_late(g, cal, mode)
    dtype = {n.name: q.tensors[n.outputs[0]].dtype for n in q.nodes()}
    # The chain and the branch run on int8, their input quantized once before them.
    for name in ("pool_chain", "relu_chain", "pool_branch"):
        assert dtype[name] == "int8", name
    assert q.node("clip_chain").op == "qadd" and dtype["clip_chain"] == "int8"
    assert q.producer(q.node("pool_chain").inputs[0]).op == "quantize"
    assert q.producer(q.node("pool_branch").inputs[0]).op == "quantize"
    # The branch is quantized straight at the concat's scale: no rescale before it.
    assert q.node("cat").inputs[1] == q.node("pool_branch").outputs[0]
    assert q.tensors[q.node("pool_branch").outputs[0]].scale == \
        q.tensors[q.node("cat").outputs[0]].scale
    # A float reader (softmax) or a graph output keeps the pool in float.
    assert dtype["pool_shared"] == "float32" and dtype["pool_out"] == "float32"
    assert late.count_ops()["max_pool2d"] == 4 and \
        all(late.tensors[n.outputs[0]].dtype == "float32" for n in late.nodes()
            if n.op in ("max_pool2d", "relu", "clip"))
    assert q.count_ops().get("quantize", 0) <= late.count_ops()["quantize"]
    # Bit for bit what pooling in float then quantizing gave, on every output and on
    # the int8 values the convs read.
    for seed in range(4):
        x = b.samples(1, seed=20 + seed)["x"][0] * (1 + seed)     # some values clip
        got, want = run_reference(q, {"x": x}, keep=True), run_reference(late, {"x": x},
                                                                          keep=True)
        for name in g.outputs:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        clipped = q.node("clip_chain").outputs[0]
        (late_q,) = [n.outputs[0] for n in late.consumers(clipped) if n.op == "quantize"]
        np.testing.assert_array_equal(got[clipped], want[late_q])
        (late_b,) = [n.outputs[0] for n in late.consumers(q.node("pool_branch").outputs[0])
                     if n.op == "quantize"]
        np.testing.assert_array_equal(got[q.node("pool_branch").outputs[0]], want[late_b])
    check_integer_tensors(q, run_reference(q, {"x": b.samples(1, seed=30)["x"][0]},
                                           keep=True))


def quantize_with_float_pools(g, samples):
    """Shift-mode `quantize` as it was before average pools took multipliers: a pool
    whose count is no power of two runs in float."""
    original = _Quantizer.classify

    def classify(self, node):
        if node.op in ("avg_pool2d", "global_avg_pool2d"):
            count = self.constant_count(node)
            if count is None or count & (count - 1):
                return "float"
        return original(self, node)

    _Quantizer.classify = classify
    try:
        return quantize(g, samples, SHIFT)
    finally:
        _Quantizer.classify = original


@pytest.mark.parametrize("hw, kernel", [((7, 7), None), ((6, 5), None), ((9, 9), (3, 3))],
                         ids=["global_49", "global_30", "avg_3x3"])
def test_shift_mode_average_pools_take_an_int8_multiplier(hw, kernel):
    b = Builder("gap", (1, 3) + hw, seed=14)
    y = b.conv(b.x, 16)
    if kernel is None:
        y = b.g.add_node("global_avg_pool2d", [y])
        count = hw[0] * hw[1]
    else:
        y = b.g.add_node("avg_pool2d", [y], kernel=kernel, strides=(3, 3))
        count = kernel[0] * kernel[1]
    g = b.build(b.dense(b.g.add_node("flatten", [y]), 10))
    cal, test = b.samples(8, seed=15), b.samples(8, seed=16)
    q = quantize(g, cal, SHIFT)
    assert not {"avg_pool2d", "global_avg_pool2d", "dequantize"} & \
        {n.op for n in q.nodes() if n.outputs[0] not in q.outputs}
    (pool,) = [n for n in q.nodes() if n.op in ("qavg_pool2d", "qglobal_avg_pool2d")]
    m, shift = pool.attrs["multiplier"], pool.attrs["shift"]
    assert isinstance(m, int) and 1 <= m <= 127 and -31 <= shift <= 31
    ratio = q.tensors[pool.inputs[0]].scale / (count * q.tensors[pool.outputs[0]].scale)
    assert m == math.floor(ratio * 2.0 ** shift + 0.5)             # the rounded ratio
    assert math.floor(ratio * 2.0 ** (shift + 1) + 0.5) > 127      # the largest shift
    assert m >= 64                                                 # 7 significant bits
    # Every other requantization is still a pure shift.
    assert [n.name for n, _, v in requant_attrs(q) if v is not None] == [pool.name]
    # The 7-bit multiplier costs little against pooling in float, as shift mode did.
    err = quantize_error(g, q, test)
    before = quantize_error(g, quantize_with_float_pools(g, cal), test)
    for name in g.outputs:
        assert err[name]["relative"] < 0.1
        assert err[name]["relative"] <= 1.5 * before[name]["relative"] + 0.005


def test_calibration_forms_and_percentile():
    b, g = conv_relu()
    stacked = b.samples(6, seed=1)
    q1 = quantize(g, stacked, MULTIPLY)
    q2 = quantize(g, {"x": stacked["x"][:, 0]}, MULTIPLY)      # batch axis as sample axis
    q3 = quantize(g, [{"x": s} for s in stacked["x"]], MULTIPLY)
    scales = [{n: t.scale for n, t in q.tensors.items() if not t.is_constant} for q in (q1, q2, q3)]
    assert scales[0] == scales[1] == scales[2]
    q4 = quantize(g, stacked, MULTIPLY, percentile=99.0)
    (quant1,) = [n for n in q1.nodes() if n.op == "quantize"]
    (quant4,) = [n for n in q4.nodes() if n.op == "quantize"]
    assert quant4.attrs["scale"] < quant1.attrs["scale"]
    assert quant1.attrs["scale"] == pytest.approx(np.abs(stacked["x"]).max() / 127)


def test_the_float_graph_is_not_modified():
    b, g = residual_block()
    before = g.summary()
    weights = {n: t.data.copy() for n, t in g.tensors.items() if t.is_constant}
    quantize(g, b.samples(4, seed=1), SHIFT)
    assert g.summary() == before and "quantized" not in g.metadata
    assert all(t.scale is None for t in g.tensors.values())
    for name, data in weights.items():
        np.testing.assert_array_equal(g.tensors[name].data, data)


@pytest.mark.parametrize("data, match", [
    ({}, r"calibration_inputs is empty; give at least one sample of x \(1, 3, 8, 8\)"),
    ([], r"calibration_inputs is empty"),
    ({"x": np.zeros((0, 1, 3, 8, 8))}, r"holds 0 samples"),
    ({"x": np.zeros((4, 3, 9, 9))}, r"calibration_inputs\['x'\] has shape \(4, 3, 9, 9\); "
                                    r"expected samples stacked on a leading axis, \(N,\) \+ "
                                    r"\(1, 3, 8, 8\)"),
    ({"x": np.zeros((2, 1, 3, 8, 8)), "y": np.zeros(3)}, r"unknown input\(s\) \['y'\]"),
    ({"y": np.zeros(3)}, r"missing input\(s\) \['x'\]"),
    ([{"x": np.zeros((1, 3, 8, 8))}, {"x": np.zeros((3, 8, 8))}],
     r"calibration_inputs\[1\]\['x'\] has shape \(3, 8, 8\); the graph input is \(1, 3, 8, 8\)"),
    ([np.zeros((1, 3, 8, 8))], r"calibration_inputs\[0\] must be a dict"),
    (np.zeros((2, 1, 3, 8, 8)), r"must be a dict of input name -> stacked samples"),
    ({"x": np.full((1, 1, 3, 8, 8), np.nan)}, r"tensor 'x' has non-finite values"),
])
def test_bad_calibration_data_is_rejected(data, match):
    _, g = conv_relu()
    with pytest.raises(QuantizationError, match=match):
        quantize(g, data, SHIFT)


def test_bad_arguments_are_rejected():
    b, g = conv_relu()
    cal = b.samples(2, seed=0)
    for p in (0, 101, "99", True):
        with pytest.raises(QuantizationError, match="percentile must be a number in"):
            quantize(g, cal, SHIFT, percentile=p)
    with pytest.raises(QuantizationError, match=r"mode must be one of shift, multiply, not "
                                                 r"\{'alu_ops'"):
        quantize(g, cal, {"alu_ops": ["MUL"]})
    # The front half no longer takes a hardware config: the error says what to pass.
    with pytest.raises(QuantizationError, match=r"requant_modes\[0\]"):
        quantize(g, cal, vdla.HardwareConfig())
    q = quantize(g, cal, SHIFT)
    with pytest.raises(QuantizationError, match="is quantized already"):
        quantize(q, cal, SHIFT)


def test_quantize_error_takes_one_input_dict_or_samples():
    b = Builder("batched", (2, 16), seed=9)
    g = b.build(b.dense(b.x, 4))
    rng = np.random.default_rng(1)
    q = quantize(g, {"x": rng.normal(size=(2, 16)).astype(np.float32)}, SHIFT)  # one sample
    x = rng.normal(size=(2, 16)).astype(np.float32)
    (name,) = g.outputs
    err = quantize_error(g, q, {"x": x})[name]
    f = run_reference(g, {"x": x})[name]
    got = run_reference(q, {"x": x})[name]
    assert err["max_abs"] == pytest.approx(float(np.abs(f - got).max()))
    assert err["range"] == pytest.approx(float(f.max() - f.min()))
    assert err["relative"] == pytest.approx(err["max_abs"] / err["range"])
    both = quantize_error(g, q, [{"x": x}, {"x": 2 * x}])[name]
    assert both["range"] > err["range"] and both["max_abs"] >= err["max_abs"]
