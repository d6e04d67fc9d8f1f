"""vdla back half, depthwise convolutions on the depthwise window (`HardwareConfig.dw_taps`,
`vdla.compiler.targets.vdla.dw_window`): lowered programs run on the functional simulator
and match the integer reference bit-exactly (strides 1 and 2, padding, channel counts
that are no block multiple, MobileNet-v1's shapes, schedules with one and two threads);
the timing model counts the window GEMMs' cycles exactly; the window is lowered only
where the model finds it faster, and never on a config without it."""

from __future__ import annotations

import numpy as np
import pytest

import vdla
from .test_conv2d import conv_graph
from vdla.compiler import run_reference
from vdla.compiler.targets.vdla import Conv2dSchedule, lower_conv2d, run_conv2d
from vdla.compiler.targets.vdla.common import tile_split
from vdla.compiler.targets.vdla.conv_layer import Conv2dLayer, choose_conv2d, conv2d_layer
from vdla.compiler.targets.vdla.timing import estimate_conv2d
from vdla.compiler.targets.vdla.dw_window import walk, window_weights, wgt_rows
from vdla.isa import Gemm

DW16 = vdla.HardwareConfig(dw_taps=3)
DW32 = vdla.HardwareConfig(block_out=32, wgt_buff_size=128 * 1024, acc_buff_size=128 * 1024,
                           dw_taps=3)
CONFIGS = {"1x16x16_dw3": DW16, "1x16x32_dw3": DW32}

CASES = [  # c, h, w, k, stride, pad
    (32, 9, 9, 3, 1, 1),
    (24, 9, 9, 3, 2, 1),      # channels no block multiple, stride 2
    (40, 12, 11, 3, 1, 1),    # ... and a width that is not the height
    (64, 14, 14, 3, 2, 1),
    (16, 7, 7, 3, 1, 0),      # no padding
    (48, 8, 8, 2, 1, 1),      # a kernel narrower than the window: zero taps past it
    (72, 10, 13, 3, 2, 1),
]


def dw_graph(c, h, w, k, stride, pad, seed, **attrs):
    rng = np.random.default_rng(seed)
    attrs.setdefault("shift", tuple(int(v) for v in rng.integers(6, 12, c)))
    return conv_graph(rng, c=c, o=c, h=h, w=w, k=k, stride=stride, pad=pad, groups=c,
                      out_min=-100, out_max=120, **attrs)


def window_uops(layer: Conv2dLayer, s: Conv2dSchedule) -> int:
    """The window micro-ops of `layer` tiled by clamped `s`: a walk per kernel row, output
    row and output block of every tile."""
    return layer.batch_blocks * layer.out_blocks * layer.kernel_h * layer.out_h * sum(
        n * walk(layer, tw) for tw, n in tile_split(layer.out_w, s.tile_w))


def gemm_cycles(program, config) -> int:
    """The window GEMMs' cycles by `vdla.isa.Gemm`'s rule: T·r for a pass's first
    micro-op, r for each later one."""
    r, taps = config.dw_column_rows, config.dw_taps
    return sum(i.iter_out * i.iter_in * ((i.uop_end - i.uop_bgn) + taps - 1) * r
               for i in program if isinstance(i, Gemm) and i.dw)


def check_window(g, name, feed, weights, bias, config, schedule=None):
    """Lower, run on the functional simulator, compare with the reference bit for bit;
    the layer runs on the window, with exactly its walks' micro-ops (plus the bias and
    residual GEMMs), and the model's GEMM cycles are the program's."""
    want = run_reference(g, feed)[g.outputs[0]]
    lowered = lower_conv2d(g.node(name), g, config, schedule)
    layer, s = lowered.layer, lowered.schedule
    assert layer.window
    dev = vdla.runtime.open(config, backend="functional")
    got, stats = run_conv2d(dev, lowered, feed["x"], weights, bias, feed.get("r"),
                            return_stats=True)
    np.testing.assert_array_equal(got, want)
    assert (stats["gemm_macs"] // config.macs_per_cycle
            == window_uops(layer, s) + layer.bias_uops + layer.residual_uops)
    assert estimate_conv2d(layer, s, config).gemm == gemm_cycles(lowered.program, config)
    return lowered


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("c, h, w, k, stride, pad", CASES)
def test_window_is_bit_exact(config, c, h, w, k, stride, pad):
    g, name, feed, weights, bias = dw_graph(c, h, w, k, stride, pad, seed=c + h)
    check_window(g, name, feed, weights, bias, CONFIGS[config])


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("schedule", [Conv2dSchedule(2, 3, 1, 1),
                                      Conv2dSchedule(3, 5, 1, 2, oc_nthread=2),
                                      Conv2dSchedule(2, 4, 1, 1, h_nthread=2),
                                      Conv2dSchedule(4, 9, 1, 3)],
                         ids=["small", "oc-threads", "h-threads", "wide"])
@pytest.mark.parametrize("stride", [1, 2])
def test_window_schedules(config, schedule, stride):
    """Edge tiles of every size in rows, columns and channels, one and two threads."""
    g, name, feed, weights, bias = dw_graph(72, 11, 10, 3, stride, 1, seed=5)
    check_window(g, name, feed, weights, bias, CONFIGS[config], schedule)


def test_window_with_residual_and_batch():
    config = vdla.HardwareConfig(batch=2, dw_taps=3)
    g, name, feed, weights, bias = dw_graph(48, 6, 7, 3, 1, 1, seed=9, n=3, residual=True,
                                            residual_shift=1)
    check_window(g, name, feed, weights, bias, config)
    g, name, feed, weights, bias = dw_graph(40, 6, 7, 3, 1, 1, seed=10, residual=True,
                                            residual_shift=0, bias=False)
    check_window(g, name, feed, weights, bias, DW32)


#: MobileNet-v1's depthwise layers (c, h = w, stride), 224 x 224 input.
MOBILENET = [(32, 112, 1), (64, 112, 2), (128, 56, 1), (128, 56, 2), (256, 28, 1),
             (256, 28, 2), (512, 14, 1), (512, 14, 2), (1024, 7, 1)]


@pytest.mark.parametrize("c, h, stride", MOBILENET)
def test_mobilenet_shapes_on_pynq_z1_plus_dw(c, h, stride):
    """Every MobileNet-v1 depthwise shape runs on the window on pynq-z1-plus with
    dw_taps = 3, bit-exact, and the model finds it faster than the span GEMM."""
    from vdla.shipped import load_config
    config = load_config("pynq-z1-plus").replace(dw_taps=3)
    g, name, feed, weights, bias = dw_graph(c, h, h, 3, stride, 1, seed=c, shift=(9,))
    check_window(g, name, feed, weights, bias, config)
    plain = Conv2dLayer.from_node(g.node(name), g, config.replace(dw_taps=0))
    window = Conv2dLayer.from_node(g.node(name), g, config)
    assert (estimate_conv2d(window, choose_conv2d(window, config), config).cycles
            < estimate_conv2d(plain, choose_conv2d(plain, config), config).cycles)


def test_window_weights_layout():
    """Lane n's tap t at column 2t + n % 2 of its kernel row's block, zeros elsewhere
    (and a zero row for a column stride)."""
    g, name, _, weights, _ = dw_graph(40, 8, 8, 3, 2, 1, seed=1)
    layer = Conv2dLayer.from_node(g.node(name), g, DW32)
    blocks = window_weights(weights, layer, DW32)
    assert blocks.shape == (2, wgt_rows(layer), 32, 16) and wgt_rows(layer) == 4
    want = np.zeros_like(blocks)
    for o in range(40):
        for ky in range(3):
            for t in range(3):
                want[o // 32, ky, o % 32, 2 * t + o % 2] = weights[o, 0, ky, t]
    np.testing.assert_array_equal(blocks, want)


@pytest.mark.parametrize("c, h, w, k, stride, pad", CASES + [(32, 9, 9, 3, 3, 1)])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_window_is_chosen_where_the_model_finds_it_faster(config, c, h, w, k, stride, pad):
    """The window layer when its default schedule's estimate beats the other lowering's;
    a config without the window never emits a dw GEMM."""
    cfg = CONFIGS[config]
    g, name, *_ = dw_graph(c, h, w, k, stride, pad, seed=2)
    node = g.node(name)
    chosen, _ = conv2d_layer(node, g, cfg)
    plain, _ = conv2d_layer(node, g, cfg.replace(dw_taps=0))
    assert not plain.window
    plain_cycles = estimate_conv2d(plain, choose_conv2d(plain, cfg), cfg).cycles
    import dataclasses
    window = dataclasses.replace(plain, window=True, diagonal=False,
                                 spans=((0, plain.out_blocks, 0, plain.in_blocks),))
    window_cycles = estimate_conv2d(window, choose_conv2d(window, cfg), cfg).cycles
    assert chosen.window == (window_cycles < plain_cycles)
    without = lower_conv2d(node, g, cfg.replace(dw_taps=0))
    assert not any(isinstance(i, Gemm) and i.dw for i in without.program)


def test_no_window_where_it_cannot_run():
    """A kernel wider than the window, a grouped (not depthwise) layer, a column
    dilation: the diagonal or span GEMM."""
    for kw in (5,):
        g, name, *_ = dw_graph(32, 9, 9, kw, 1, 2, seed=3)
        assert not conv2d_layer(g.node(name), g, DW16)[0].window
    rng = np.random.default_rng(4)
    g, name, *_ = conv_graph(rng, c=32, o=32, h=8, w=8, groups=2, shift=(9,))
    assert not conv2d_layer(g.node(name), g, DW16)[0].window
    g, name, *_ = conv_graph(rng, c=32, o=32, h=9, w=9, groups=32, shift=(9,), pad=2,
                             dilations=(1, 2))
    assert not conv2d_layer(g.node(name), g, DW16)[0].window
