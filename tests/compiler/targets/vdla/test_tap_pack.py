"""Kernel columns packed into input channels (`vdla.compiler.targets.vdla.tap_pack`): the
packed convolution is the same sum (checked on the integer reference, independently of
the lowering), it applies exactly to host-written inputs with room in their blocks, and
the lowered layer runs the fewer micro-ops bit-exactly (the lowering's own grid in
test_conv2d.py covers more shapes; test_model.py whole models)."""

from __future__ import annotations

import numpy as np
import pytest

import vdla
from vdla.compiler import Graph, run_reference
from vdla.compiler.targets.vdla.conv_layer import conv2d_layer
from vdla.compiler.targets.vdla.tap_pack import pack_tap_weights, pack_taps, tap_pack_for

from .test_conv2d import check_conv

DEFAULT = vdla.HardwareConfig()


def first_conv(rng, *, c=3, o=20, h=13, w=17, k=7, stride=2, pad=3, feed_op=None,
               readers=1):
    """A qconv2d over a graph input `x` (or over `feed_op`'s output of it), read by
    `readers` convolutions; returns (graph, feed, weights, bias)."""
    g = Graph("first")
    x = g.add_input("x", (1, c, h, w), "int8")
    if feed_op:
        x = g.add_node(feed_op, [x], name="pre")
    weights = rng.integers(-128, 128, (o, c, k, k)).astype(np.int8)
    bias = rng.integers(-5000, 5000, (o,)).astype(np.int32)
    ins = [x, g.add_constant("w", weights, "int8"), g.add_constant("b", bias, "int32")]
    outs = [g.add_node("qconv2d", ins, name=f"conv{i}" if i else "conv",
                       strides=(stride, stride), pads=(pad,) * 4, shift=(9,))
            for i in range(readers)]
    g.set_outputs(outs)
    feed = {"x": rng.integers(-128, 128, (1, c, h, w)).astype(np.int8)}
    return g, feed, weights, bias


@pytest.mark.parametrize("c, k, stride, pad, w", [(3, 7, 2, 3, 17), (3, 3, 2, 1, 16),
                                                  (5, 5, 1, 2, 9), (1, 4, 3, 0, 20)])
def test_the_packed_convolution_is_the_same_sum(c, k, stride, pad, w):
    rng = np.random.default_rng(c * 100 + k)
    g, feed, weights, bias = first_conv(rng, c=c, k=k, stride=stride, pad=pad, w=w)
    tp = tap_pack_for(g.node("conv"), g, DEFAULT)
    assert tp is not None and tp.taps == min(k, 16 // c)
    # The packed convolution as a plain graph: P, W', column dilation T, no column pads.
    p = pack_taps(feed["x"], tp)
    packed = Graph("packed")
    x = packed.add_input("x", p.shape, "int8")
    y = packed.add_node("qconv2d", [x, packed.add_constant(
        "w", pack_tap_weights(weights, tp), "int8"), packed.add_constant("b", bias, "int32")],
        name="conv", strides=(stride, stride), pads=(pad, 0, pad, 0),
        dilations=(1, tp.taps), shift=(9,))
    packed.set_outputs([y])
    want = run_reference(g, feed)[g.outputs[0]]
    np.testing.assert_array_equal(run_reference(packed, {"x": p})[y], want)


def test_it_applies_to_host_written_inputs_with_room_only():
    rng = np.random.default_rng(1)
    g, *_ = first_conv(rng)
    assert tap_pack_for(g.node("conv"), g, DEFAULT).taps == 5      # 5 x 3 of 16 channels
    g, *_ = first_conv(rng, c=8)
    assert tap_pack_for(g.node("conv"), g, DEFAULT).taps == 2
    g, *_ = first_conv(rng, c=16)                                   # a full block: no room
    assert tap_pack_for(g.node("conv"), g, DEFAULT) is None
    g, *_ = first_conv(rng, k=1, pad=0)                             # one column: nothing
    assert tap_pack_for(g.node("conv"), g, DEFAULT) is None
    g, *_ = first_conv(rng, feed_op="relu")          # an accelerator op writes its input
    assert tap_pack_for(g.node("conv"), g, DEFAULT) is None
    g, *_ = first_conv(rng, readers=2)               # another op reads the plain input
    assert tap_pack_for(g.node("conv"), g, DEFAULT) is None


def test_the_lowered_layer_runs_fewer_micro_ops_bit_exactly():
    rng = np.random.default_rng(2)
    g, feed, weights, bias = first_conv(rng)
    layer, _ = conv2d_layer(g.node("conv"), g, DEFAULT)
    assert (layer.c, layer.kernel_h, layer.kernel_w, layer.dilation_w) == (15, 7, 2, 5)
    assert layer.macs == 7 * 9 * 20 * 3 * 49              # its own MACs, not the zeros
    lowered, _ = check_conv(g, "conv", feed, weights, bias)
    assert lowered.layer.gemm_uops == 7 * 9 * 2 * 7 * 2     # 14 taps, not 49
