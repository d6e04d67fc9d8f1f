"""Kernel taps packed into input channels (`vdla.compiler.targets.vdla.tap_pack`): columns,
or every tap (im2col). Each packed convolution is the same sum (checked on the integer
reference, independently of the lowering), packing applies exactly to host-written
inputs, the timing model picks among the options, and the lowered layer runs the fewer
micro-ops bit-exactly (the lowering's own grid in test_conv2d.py covers more shapes;
test_model.py whole models)."""

from __future__ import annotations

import numpy as np
import pytest

import vdla
from vdla.compiler import Graph, run_reference
from vdla.compiler.targets.vdla.conv_layer import conv2d_layer
from vdla.compiler.targets.vdla.timing import estimate_conv2d
from vdla.compiler.targets.vdla.tap_pack import pack_tap_weights, pack_taps, tap_packs

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


@pytest.mark.parametrize("c, k, stride, pad, w, modes", [
    (3, 7, 2, 3, 17, [False]), (3, 3, 2, 1, 16, [False, True]), (5, 5, 1, 2, 9, [False]),
    (1, 4, 3, 0, 20, [False, True]), (2, 7, 4, 3, 30, [False, True])])
def test_the_packed_convolution_is_the_same_sum(c, k, stride, pad, w, modes):
    rng = np.random.default_rng(c * 100 + k)
    g, feed, weights, bias = first_conv(rng, c=c, k=k, stride=stride, pad=pad, w=w)
    packs = tap_packs(g.node("conv"), g, DEFAULT)
    # im2col only where its input is no larger than the channel-padded image
    assert [tp.im2col for tp in packs] == modes
    assert packs[0].taps == min(k, 16 // c)
    want = run_reference(g, feed)[g.outputs[0]]
    for tp in packs:
        # The packed convolution as a plain graph: P, W', and a column dilation T and no
        # column pads, or (im2col) a 1x1 convolution.
        p = pack_taps(feed["x"], tp)
        assert p.shape == tp.packed_shape(1, feed["x"].shape[2])
        packed = Graph("packed")
        x = packed.add_input("x", p.shape, "int8")
        conv = (dict(strides=(1, 1), pads=(0,) * 4) if tp.im2col else
                dict(strides=(stride, stride), pads=(pad, 0, pad, 0), dilations=(1, tp.taps)))
        y = packed.add_node("qconv2d", [x, packed.add_constant(
            "w", pack_tap_weights(weights, tp), "int8"), packed.add_constant(
            "b", bias, "int32")], name="conv", shift=(9,), **conv)
        packed.set_outputs([y])
        np.testing.assert_array_equal(run_reference(packed, {"x": p})[y], want)


def test_it_applies_to_host_written_inputs_with_fewer_micro_ops_only():
    rng = np.random.default_rng(1)

    def packs(g):
        return [(tp.im2col, tp.taps) for tp in tap_packs(g.node("conv"), g, DEFAULT)]

    g, *_ = first_conv(rng)
    assert packs(g) == [(False, 5)]      # 5 x 3 of 16 channels (im2col: 2.4x the image)
    g, *_ = first_conv(rng, k=3, pad=1)
    assert packs(g) == [(False, 3), (True, 0)]   # stride 2: P is half the padded image
    g, *_ = first_conv(rng, c=8)
    assert packs(g) == [(False, 2)]
    g, *_ = first_conv(rng, c=16)                     # full blocks: no room, 49 either way
    assert packs(g) == []
    g, *_ = first_conv(rng, k=1, pad=0)               # one tap: nothing to pack
    assert packs(g) == []
    g, *_ = first_conv(rng, feed_op="relu")           # an accelerator op writes its input
    assert packs(g) == []
    g, *_ = first_conv(rng, readers=2)                # another op reads the plain input
    assert packs(g) == []


def packed_graph(feed, weights, bias, tp, stride, pad):
    """The packed convolution as a graph of its own: (graph, feed, weights)."""
    p = pack_taps(feed["x"], tp)
    g = Graph("packed")
    x = g.add_input("x", p.shape, "int8")
    w = pack_tap_weights(weights, tp)
    conv = (dict(strides=(1, 1), pads=(0,) * 4) if tp.im2col else
            dict(strides=(stride, stride), pads=(pad, 0, pad, 0), dilations=(1, tp.taps)))
    y = g.add_node("qconv2d", [x, g.add_constant("w", w, "int8"),
                               g.add_constant("b", bias, "int32")], name="conv", shift=(9,),
                   **conv)
    g.set_outputs([y])
    return g, {"x": p}, w


def test_the_timing_model_picks_and_the_lowered_layers_run_bit_exactly():
    rng = np.random.default_rng(2)
    g, feed, weights, bias = first_conv(rng, k=3, pad=1)
    layer, _ = conv2d_layer(g.node("conv"), g, DEFAULT)
    assert layer.macs == 7 * 9 * 20 * 3 * 9               # its own MACs, not the zeros
    lowered, _ = check_conv(g, "conv", feed, weights, bias)
    # Each packing, lowered as a layer of its own: the micro-ops it promises, bit-exact;
    # the model's pick is the faster by its estimate.
    cycles = {}
    for tp in tap_packs(g.node("conv"), g, DEFAULT):
        pg, pfeed, pweights = packed_graph(feed, weights, bias, tp, 2, 1)
        packed, _ = check_conv(pg, "conv", pfeed, pweights, bias)
        uops = 2 if tp.im2col else 3                        # per output entry, not 9
        assert packed.layer.gemm_uops == 7 * 9 * 2 * uops
        cycles[tp.im2col] = estimate_conv2d(packed.layer, packed.schedule, DEFAULT).cycles
    assert layer.packed.im2col == (cycles[True] < cycles[False])
