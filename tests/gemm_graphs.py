"""One-layer graphs the targets' tests share: a convolution and a dense layer, int8 or
float32, with their feeds; and the check of a target's output against the reference."""

from __future__ import annotations

import numpy as np

from vdla.compiler import Graph, run_reference

__all__ = ["FLOAT_TOLERANCE", "assert_matches", "conv_graph", "dense_graph"]

#: How far a float32 GEMM of these sizes may be from the float64 reference, relative.
FLOAT_TOLERANCE = 1e-5


def assert_matches(g, got, feed, tolerance=FLOAT_TOLERANCE):
    """`got` (outputs by name) is the reference's output of `g` on `feed`: int8 bit for
    bit, float within `tolerance` relative to its largest value; dtype and shape too."""
    want = run_reference(g, feed)[g.outputs[0]]
    y = got[g.outputs[0]]
    assert y.dtype == want.dtype and y.shape == want.shape
    if want.dtype == np.float32:
        err = np.abs(y.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30)
        assert err < tolerance, err
    else:
        np.testing.assert_array_equal(y, want)


def conv_graph(rng, *, n=1, c=20, h=9, w=9, o=24, k=3, stride=1, pad=1, dilation=1,
               groups=1, residual=False, bias=True, multiply=False, per_channel=True,
               dtype="int8", activation=None, out_min=-100, nonnegative=False):
    """A one-conv graph and its feed. int8: ``qconv2d`` with random requantization;
    float32: ``conv2d`` with `activation`. `nonnegative`: the input comes from a ReLU
    (an int8 ``relu`` node in front), which the target reads without an offset."""
    g = Graph("conv")
    float_ = dtype == "float32"
    x = g.add_input("x", (n, c, h, w), dtype)
    feed = {"x": rng.standard_normal((n, c, h, w)).astype(np.float32) if float_
            else rng.integers(-128, 128, (n, c, h, w)).astype(np.int8)}
    if nonnegative:
        x = g.add_node("relu", [x], name="relu")
    wshape = (o, c // groups, k, k)
    weights = (rng.standard_normal(wshape).astype(np.float32) if float_
               else rng.integers(-128, 128, wshape).astype(np.int8))
    inputs = [x, g.add_constant("w", weights, dtype)]
    if bias:
        inputs.append(g.add_constant("b", rng.standard_normal(o).astype(np.float32), dtype)
                      if float_ else g.add_constant(
                          "b", rng.integers(-5000, 5000, (o,)).astype(np.int32), "int32"))
    else:
        inputs.append("")
    span = dilation * (k - 1) + 1
    ho, wo = (h + 2 * pad - span) // stride + 1, (w + 2 * pad - span) // stride + 1
    attrs = {}
    if float_:
        attrs["activation"] = activation
    else:
        attrs["shift"] = (tuple(int(s) for s in rng.integers(-2, 16, o)) if per_channel
                          else (9,))
        if multiply:
            attrs["multiplier"] = (tuple(int(m) for m in rng.integers(1, 32768, o))
                                   if per_channel else (1234,))
            attrs["shift"] = tuple(s + 12 for s in attrs["shift"])
        attrs.update(out_min=out_min, out_max=127)
    if residual:
        inputs.append(g.add_input("r", (n, o, ho, wo), dtype))
        feed["r"] = (rng.standard_normal((n, o, ho, wo)).astype(np.float32) if float_
                     else rng.integers(-128, 128, (n, o, ho, wo)).astype(np.int8))
        if not float_:
            attrs.update(residual_shift=1, residual_multiplier=(77,) if multiply else None)
    y = g.add_node("qconv2d" if not float_ else "conv2d", inputs, name="conv",
                   strides=(stride, stride), pads=(pad,) * 4,
                   dilations=(dilation, dilation), groups=groups, **attrs)
    g.set_outputs([y])
    return g, feed


def dense_graph(rng, *, dtype="int8", residual=False, n=3, c=37, o=11):
    """A one-dense graph and its feed: ``qdense`` with a per-tensor multiplier and shift,
    or ``dense`` with ReLU; `residual` adds a computed residual input."""
    g = Graph("dense")
    float_ = dtype == "float32"
    x = g.add_input("x", (n, c), dtype)
    w = (rng.standard_normal((o, c)).astype(np.float32) if float_
         else rng.integers(-128, 128, (o, c)).astype(np.int8))
    b = (g.add_constant("b", rng.standard_normal(o).astype(np.float32), dtype) if float_
         else g.add_constant("b", rng.integers(-9000, 9000, (o,)).astype(np.int32), "int32"))
    inputs = [x, g.add_constant("w", w, dtype), b]
    feed = {"x": rng.standard_normal((n, c)).astype(np.float32) if float_
            else rng.integers(-128, 128, (n, c)).astype(np.int8)}
    if residual:
        inputs.append(g.add_input("r", (n, o), dtype))
        feed["r"] = (rng.standard_normal((n, o)).astype(np.float32) if float_
                     else rng.integers(-128, 128, (n, o)).astype(np.int8))
    attrs = {"activation": "relu"} if float_ else {"shift": (8,), "residual_shift": 0,
                                                   "multiplier": (3001,)}
    y = g.add_node("dense" if float_ else "qdense", inputs, name="fc", **attrs)
    g.set_outputs([y])
    return g, feed
