"""Graph IR core: validation errors, editing, and the float reference kernels against
independent naive (loop) implementations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vdla.compiler import Graph, GraphError, Tensor, run_reference

RNG = np.random.default_rng(99)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# --- validation ----------------------------------------------------------------------------

def test_valid_graph_and_summary():
    g = Graph("ok")
    x = g.add_input("x", (1, 2, 3, 3))
    y = g.add_node("relu", [x])
    g.set_outputs([y])
    assert g.validate() is g
    assert "relu" in g.summary() and "[1, 2, 3, 3]" in g.summary()


def test_dangling_input():
    g = Graph("d")
    g.add_tensor(Tensor("t", (1, 4)))                 # neither input, constant nor produced
    y = g.add_node("relu", ["t"], name="r")
    g.set_outputs([y])
    with pytest.raises(GraphError, match="'r'.*'t'.*dangling"):
        g.validate()


def test_input_that_is_no_tensor():
    g = Graph("m")
    y = g.add_node("relu", ["ghost"], name="r")       # no inference: the input is unknown
    g.set_outputs([y])
    with pytest.raises(GraphError, match="'r'.*'ghost'.*not a tensor"):
        g.validate()


def test_cycle():
    g = Graph("c")
    g.add_node("relu", ["b"], ["a"], name="first")
    g.add_node("relu", ["a"], ["b"], name="second")
    g.set_outputs(["a"])
    with pytest.raises(GraphError, match="cycle.*(first|second)"):
        g.validate()


def test_recorded_shape_mismatch():
    g = Graph("s")
    x = g.add_input("x", (1, 3, 4, 4))
    y = g.add_node("conv2d", [x, g.add_constant("w", rand(5, 3, 3, 3))], name="conv")
    g.set_outputs([y])
    g.tensors[y].shape = (1, 5, 4, 4)                 # really (1, 5, 2, 2)
    with pytest.raises(GraphError, match="'conv'.*recorded with shape \\(1, 5, 4, 4\\).*"
                                         "\\(1, 5, 2, 2\\)"):
        g.validate()


def test_shape_mismatch_between_inputs():
    g = Graph("s2")
    x = g.add_input("x", (1, 3, 4, 4))
    with pytest.raises(GraphError, match="'conv'.*3 channels.*expect 4"):
        g.add_node("conv2d", [x, g.add_constant("w", rand(5, 4, 3, 3))], name="conv")
    with pytest.raises(GraphError, match="bias.*must be \\(5,\\)"):
        g.add_node("conv2d", [x, g.add_constant("w2", rand(5, 3, 1, 1)),
                              g.add_constant("b", rand(4))])
    with pytest.raises(GraphError, match="do not broadcast"):
        g.add_node("add", [x, g.add_constant("c", rand(3, 2))])


def test_unknown_op_and_attribute():
    g = Graph("u")
    x = g.add_input("x", (1, 4))
    with pytest.raises(GraphError, match="unknown operator 'frobnicate'; known: .*conv2d"):
        g.add_node("frobnicate", [x])
    with pytest.raises(GraphError, match="unknown attribute.*'alpha'.*relu takes none"):
        g.add_node("relu", [x], alpha=0.1)
    with pytest.raises(GraphError, match="unknown attribute.*'stride'.*strides"):
        g.add_node("max_pool2d", [x], stride=2)


@pytest.mark.parametrize("shape", [(1, 3, 4), (3, 4), (1, 1, 3, 4, 4)])
def test_conv_needs_4d_input(shape):
    g = Graph("r")
    x = g.add_input("x", shape)
    with pytest.raises(GraphError, match=f"must be 4-D \\(N, C, H, W\\), not shape "
                                         f"{re_tuple(shape)}"):
        g.add_node("conv2d", [x, g.add_constant("w", rand(2, 3, 1, 1))])


def re_tuple(shape):
    return "\\(" + ", ".join(str(d) for d in shape) + "\\)"


def test_other_structural_errors():
    g = Graph("e")
    x = g.add_input("x", (1, 4))
    y = g.add_node("relu", [x], ["y"])
    with pytest.raises(GraphError, match="'y' is produced by both"):
        g.add_node("relu", [x], ["y"])
    with pytest.raises(GraphError, match="graph input"):
        g.add_node("relu", [y], ["x"])
    with pytest.raises(GraphError, match="dtype 'float16'"):
        Tensor("t", (1,), "float16")
    tensors = set(g.tensors)
    with pytest.raises(GraphError, match="takes 2 \\(a, b\\)"):
        g.add_node("add", [x])
    # A node that does not fit its inputs leaves the graph as it was.
    assert g.count_ops() == {"relu": 1} and set(g.tensors) == tensors
    g.set_outputs(["nothing"])
    with pytest.raises(GraphError, match="graph output 'nothing'"):
        g.validate()


def test_copy_is_independent_and_editing():
    g = Graph("copy")
    x = g.add_input("x", (1, 4))
    a = g.add_node("relu", [x])
    b = g.add_node("clip", [a], min=0.0, max=1.0)
    dead = g.add_node("relu", [x], name="dead")
    g.set_outputs([b])
    h = g.copy()
    h.node("clip").attrs["max"] = 5.0
    h.replace_uses(a, x)
    h.prune()
    assert g.node("clip").attrs["max"] == 1.0 and g.node("clip").inputs == [a]
    assert h.count_ops() == {"clip": 1} and dead not in h.tensors
    assert g.count_ops() == {"relu": 2, "clip": 1}
    assert [n.name for n in g.consumers(x)] == ["relu", "dead"]
    assert g.producer(b).name == "clip" and g.producer(x) is None


def test_run_reference_checks_inputs():
    g = Graph("i")
    x = g.add_input("x", (1, 4))
    g.set_outputs([g.add_node("relu", [x])])
    with pytest.raises(ValueError, match="missing input"):
        run_reference(g, {})
    with pytest.raises(ValueError, match="shape \\(2, 4\\).*expects \\(1, 4\\)"):
        run_reference(g, {"x": np.zeros((2, 4))})
    with pytest.raises(ValueError, match="unknown input"):
        run_reference(g, {"x": np.zeros((1, 4)), "y": 1})


# --- float kernels against naive loops -----------------------------------------------------

def run_one(op, inputs, consts=(), **attrs):
    """Run one node: `inputs` are graph inputs (arrays), `consts` constants (or None for
    an absent optional input)."""
    g = Graph(op)
    names = [g.add_input(f"in{i}", a.shape) for i, a in enumerate(inputs)]
    names += ["" if c is None else g.add_constant(f"c{i}", c) for i, c in enumerate(consts)]
    y = g.add_node(op, names, **attrs)
    g.set_outputs([y])
    g.validate()
    return run_reference(g, {f"in{i}": a for i, a in enumerate(inputs)})[y]


def naive_conv(x, w, bias, stride, pads, dil, groups):
    n, c, h, wd = x.shape
    o, ig, kh, kw = w.shape
    ho = (h + pads[0] + pads[2] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + pads[1] + pads[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    og = o // groups
    out = np.zeros((n, o, ho, wo))
    for b in range(n):
        for oc in range(o):
            g = oc // og
            for i in range(ho):
                for j in range(wo):
                    s = 0.0 if bias is None else float(bias[oc])
                    for ic in range(ig):
                        for u in range(kh):
                            for v in range(kw):
                                r = i * stride[0] - pads[0] + u * dil[0]
                                q = j * stride[1] - pads[1] + v * dil[1]
                                if 0 <= r < h and 0 <= q < wd:
                                    s += float(x[b, g * ig + ic, r, q]) * float(w[oc, ic, u, v])
                    out[b, oc, i, j] = s
    return out


@pytest.mark.parametrize("stride, pads, dil, groups", [
    ((1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((2, 1), (1, 0, 2, 1), (1, 1), 1),
    ((1, 2), (1, 1, 1, 1), (2, 1), 2),
    ((1, 1), (1, 1, 1, 1), (1, 1), 4),            # depthwise
])
def test_conv2d_kernel(stride, pads, dil, groups):
    x, w, b = rand(2, 4, 6, 5), rand(4, 4 // groups, 3, 2), rand(4)
    want = naive_conv(x, w, b, stride, pads, dil, groups)
    res = rand(*want.shape)
    g = Graph("conv")
    xi, ri = g.add_input("x", x.shape), g.add_input("r", res.shape)
    y = g.add_node("conv2d", [xi, g.add_constant("w", w), g.add_constant("b", b), ri],
                   strides=stride, pads=pads, dilations=dil, groups=groups,
                   activation="clip", clip_min=-0.5, clip_max=1.0)
    g.set_outputs([y])
    got = run_reference(g, {"x": x, "r": res})[y]
    np.testing.assert_allclose(got, np.clip(want + res, -0.5, 1.0), rtol=1e-5, atol=1e-5)


def test_dense_and_matmul_kernels():
    x, w, b = rand(3, 5), rand(4, 5), rand(4)
    g = Graph("dense")
    xi, ri = g.add_input("x", x.shape), g.add_input("r", (3, 4))
    y = g.add_node("dense", [xi, g.add_constant("w", w), g.add_constant("b", b), ri],
                   activation="relu")
    g.set_outputs([y])
    res = rand(3, 4)
    want = np.zeros((3, 4))
    for i in range(3):
        for j in range(4):
            want[i, j] = max(0.0, sum(float(x[i, k]) * float(w[j, k]) for k in range(5))
                             + b[j] + res[i, j])
    np.testing.assert_allclose(run_reference(g, {"x": x, "r": res})[y], want, rtol=1e-5,
                               atol=1e-6)
    a, c = rand(2, 3, 4), rand(4, 2)
    want = np.array([[[sum(a[i, j, k] * c[k, m] for k in range(4)) for m in range(2)]
                      for j in range(3)] for i in range(2)])
    np.testing.assert_allclose(run_one("matmul", [a, c]), want, rtol=1e-5, atol=1e-6)


def naive_pool(x, kernel, stride, pads, ceil_mode, mode, include_pad=False):
    n, c, h, w = x.shape

    def size(length, k, s, p0, p1):
        room = length + p0 + p1 - k
        out = (math.ceil(room / s) if ceil_mode else room // s) + 1
        if ceil_mode and (out - 1) * s >= length + p0:
            out -= 1
        return out

    ho, wo = size(h, kernel[0], stride[0], pads[0], pads[2]), \
        size(w, kernel[1], stride[1], pads[1], pads[3])
    out = np.zeros((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            vals, count = [], 0
            for u in range(kernel[0]):
                for v in range(kernel[1]):
                    r, q = i * stride[0] - pads[0] + u, j * stride[1] - pads[1] + v
                    inside = 0 <= r < h and 0 <= q < w
                    in_pad = -pads[0] <= r < h + pads[2] and -pads[1] <= q < w + pads[3]
                    if inside:
                        vals.append(x[:, :, r, q])
                    if inside or (include_pad and in_pad):
                        count += 1
            if mode == "max":
                out[:, :, i, j] = np.max(vals, axis=0)
            else:
                out[:, :, i, j] = np.sum(vals, axis=0) / count
    return out


@pytest.mark.parametrize("kernel, stride, pads, ceil_mode", [
    ((2, 2), (2, 2), (0, 0, 0, 0), False),
    ((3, 3), (2, 2), (1, 1, 1, 1), False),
    ((3, 2), (2, 2), (1, 0, 0, 1), True),
    ((2, 2), (3, 3), (0, 0, 0, 0), True),
])
def test_pool_kernels(kernel, stride, pads, ceil_mode):
    x = rand(2, 3, 7, 6)
    common = dict(kernel=kernel, strides=stride, pads=pads, ceil_mode=ceil_mode)
    np.testing.assert_allclose(run_one("max_pool2d", [x], **common),
                               naive_pool(x, kernel, stride, pads, ceil_mode, "max"))
    for include in (False, True):
        np.testing.assert_allclose(
            run_one("avg_pool2d", [x], count_include_pad=include, **common),
            naive_pool(x, kernel, stride, pads, ceil_mode, "avg", include), rtol=1e-5,
            atol=1e-6)


def test_elementwise_and_normalization_kernels():
    x = rand(2, 5, 3, 4)
    np.testing.assert_allclose(run_one("global_avg_pool2d", [x])[:, :, 0, 0],
                               [[x[n, c].sum() / 12 for c in range(5)] for n in range(2)],
                               rtol=1e-5, atol=1e-6)
    scale, bias, mean, var = rand(5), rand(5), rand(5), np.abs(rand(5)) + 0.1
    want = np.empty_like(x)
    for c in range(5):
        want[:, c] = (x[:, c] - mean[c]) / math.sqrt(var[c] + 1e-3) * scale[c] + bias[c]
    np.testing.assert_allclose(run_one("batch_norm", [x], [scale, bias, mean, var],
                                       epsilon=1e-3), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(run_one("relu", [x]), np.where(x > 0, x, 0))
    np.testing.assert_array_equal(run_one("clip", [x], min=-0.2), np.where(x < -0.2, -0.2, x)
                                  .astype(np.float32))
    v = rand(5, 1, 1)
    np.testing.assert_allclose(run_one("add", [x], [v]), x + v)
    np.testing.assert_allclose(run_one("mul", [x], [v]), x * v)


def test_softmax_and_lrn_kernels():
    x = rand(2, 6, 2, 3)
    e = np.exp(x.astype(np.float64))
    np.testing.assert_allclose(run_one("softmax", [x], axis=1), e / e.sum(1, keepdims=True),
                               rtol=1e-5)
    size, alpha, beta, k = 3, 1e-2, 0.75, 2.0
    want = np.empty(x.shape)
    for c in range(6):
        lo, hi = max(0, c - (size - 1) // 2), min(5, c + math.ceil((size - 1) / 2))
        sq = sum(x[:, j].astype(np.float64) ** 2 for j in range(lo, hi + 1))
        want[:, c] = x[:, c] / (k + alpha / size * sq) ** beta
    np.testing.assert_allclose(run_one("lrn", [x], size=size, alpha=alpha, beta=beta, bias=k),
                               want, rtol=1e-5, atol=1e-6)


def test_data_movement_kernels():
    x = rand(2, 3, 2, 2)
    y = rand(2, 1, 2, 2)
    got = run_one("concat", [x, y], axis=1)
    assert got.shape == (2, 4, 2, 2)
    np.testing.assert_array_equal(got[:, :3], x)
    np.testing.assert_array_equal(got[:, 3:], y)
    flat = run_one("flatten", [x])
    assert flat.shape == (2, 12) and flat[1, 5] == x[1, 1, 0, 1]
    r = run_one("reshape", [x], shape=(4, -1))
    assert r.shape == (4, 6) and r[3, 5] == x[1, 2, 1, 1]
    t = run_one("transpose", [x], perm=(0, 2, 3, 1))
    assert t.shape == (2, 2, 2, 3) and t[1, 0, 1, 2] == x[1, 2, 0, 1]
    p = run_one("pad", [x], pads=(0, 1, 0, 2, 0, 0, 1, 0), value=7.0)
    assert p.shape == (2, 4, 3, 4)
    assert (p[:, 0] == 7).all() and (p[:, :, 2] == 7).all() and (p[:, :, :, :2] == 7).all()
    np.testing.assert_array_equal(p[:, 1:, :2, 2:], x)


@pytest.mark.parametrize("a, b", [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
                                  ((2, 1, 3, 4), (5, 4, 6)), ((4,), (2, 4, 3))])
def test_matmul_shape_inference_follows_numpy(a, b):
    g = Graph("mm")
    x = g.add_input("a", a)
    y = g.add_node("matmul", [x, g.add_constant("b", np.ones(b, np.float32))])
    assert g.tensors[y].shape == np.matmul(np.zeros(a), np.zeros(b)).shape


def test_matmul_shape_mismatch_names_the_node():
    g = Graph("mm")
    x = g.add_input("a", (3, 4))
    with pytest.raises(GraphError, match=r"node 'matmul' \(matmul\): shapes \(3, 4\) and \(5, 2\)"):
        g.add_node("matmul", [x, g.add_constant("b", np.ones((5, 2), np.float32))])
