"""Grouped and depthwise convolutions: what is particular to them on the GEMM core.

The conv family (`conv_layer`, `conv`) lowers them: a grouped convolution is one GEMM per
*span* of output blocks, and a depthwise one (``c == o == groups``, ``block_in ==
block_out``) reads one input block per output block through *diagonal* weight blocks.
This module holds what only they need:

* `group_spans`: how a grouped convolution's channels fall into the config's blocks
  (the spans, and whether the layer is diagonal);
* `grouped_weights`: the arena's weight blocks of a grouped layer (zeros outside each
  output channel's group, per span) or of a diagonal one (each channel's taps on the
  diagonal of its block);
* `depthwise_alu_cycles`: the cost of the alternative depthwise scheme on the vector
  ALU, which shows why the diagonal GEMM is the one lowered.

A plain convolution (one group) never enters this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from vdla.compiler.ir.layout import pack
from vdla.compiler.targets.vdla.common import ceil_div
from vdla.config import HardwareConfig

if TYPE_CHECKING:   # annotations only: conv_layer imports this module
    from vdla.compiler.targets.vdla.conv_layer import Conv2dLayer

__all__ = ["depthwise_alu_cycles", "group_spans", "grouped_weights"]


def group_spans(c: int, o: int, groups: int,
                config: HardwareConfig) -> tuple[tuple[tuple[int, int, int, int], ...], bool]:
    """How a convolution of `c` input and `o` output channels in `groups` groups falls
    into the config's blocks: ``(spans, diagonal)``.

    A span ``(ob, on, cb, cn)`` is a run of `on` output blocks from block `ob` whose
    channels all read input blocks `cb` .. `cb + cn - 1`: a dense GEMM over that block
    range, the weights outside the output channels' groups zero. Groups whose channels
    fill whole blocks give one span per group (a per-group GEMM, no wasted MACs); a
    block that straddles groups reads the input blocks of all of them (the zeros pad the
    GEMM, still exact). `diagonal` is the depthwise case with ``c == o == groups`` and
    ``block_in == block_out``: output block k reads input block k only, through weight
    blocks that are diagonal per kernel tap (so each GEMM micro-op does block_out useful
    MACs of block_in x block_out); it is one span whose tiles load the input block of
    each output block."""
    if groups < 1 or c % groups or o % groups:
        raise ValueError(f"groups={groups} must divide the input channels ({c}) and the "
                         f"output channels ({o})")
    bi, bo = config.block_in, config.block_out
    in_blocks, out_blocks = ceil_div(c, bi), ceil_div(o, bo)
    if groups == 1:
        return ((0, out_blocks, 0, in_blocks),), False
    if c == o == groups and bi == bo:
        return ((0, out_blocks, 0, in_blocks),), True
    cg, og = c // groups, o // groups
    ranges = []
    for ob in range(out_blocks):
        g0, g1 = ob * bo // og, (min((ob + 1) * bo, o) - 1) // og
        ranges.append((g0 * cg // bi, ceil_div((g1 + 1) * cg, bi)))
    spans = []
    for ob, (lo, hi) in enumerate(ranges):
        if spans and (spans[-1][2], spans[-1][2] + spans[-1][3]) == (lo, hi):
            first, count, _, _ = spans[-1]
            spans[-1] = (first, count + 1, lo, hi - lo)
        else:
            spans.append((ob, 1, lo, hi - lo))
    return tuple(spans), False


def grouped_weights(w: np.ndarray, layer: Conv2dLayer, config: HardwareConfig,
                    kernel_layout: str) -> np.ndarray:
    """The arena's weight blocks of grouped `layer` (a `Conv2dLayer` with groups > 1).

    w : int8 weights (O, C / groups, kh, kw)
    layer, config : the layer and the `HardwareConfig` it is lowered for
    kernel_layout : the blocked weight layout (``OIHW{block_out}o{block_in}i``)
    Returns, per span, (output blocks, input blocks, kh, kw, block_out, block_in), the
    spans one after the other; a diagonal layer's block k holds channel k's taps on its
    diagonal."""
    L, c = layer, config
    if L.diagonal:
        blocks = np.zeros((L.out_blocks, L.kernel_h, L.kernel_w, c.block_out, c.block_in),
                          np.int8)
        lanes = np.arange(c.block_out)
        taps = np.zeros((L.out_blocks * c.block_out, L.kernel_h, L.kernel_w), np.int8)
        taps[:L.o] = w[:, 0]
        blocks[:, :, :, lanes, lanes] = taps.reshape(
            L.out_blocks, c.block_out, L.kernel_h, L.kernel_w).transpose(0, 2, 3, 1)
        return blocks
    # Grouped: the dense (O, C) weights with zeros outside each output channel's group,
    # then each span's block range.
    cg, og = L.c // L.groups, L.o // L.groups
    full = np.zeros((L.o, L.c, L.kernel_h, L.kernel_w), np.int8)
    for g in range(L.groups):
        full[g * og:(g + 1) * og, g * cg:(g + 1) * cg] = w[g * og:(g + 1) * og]
    packed = pack(full, "OIHW", kernel_layout)
    return np.concatenate([packed[ob:ob + on, cb:cb + cn].reshape(-1)
                           for ob, on, cb, cn in L.spans])


def depthwise_alu_cycles(layer: Conv2dLayer) -> int:
    """Compute-module cycles of a depthwise layer done the other way, on the vector ALU
    with MUL (the alternative to diagonal weight blocks on the GEMM core, which
    `estimate_conv2d` models): the input window widened into the acc buffer through the
    GEMM core (one micro-op per input entry), then per output entry and kernel tap a
    temporary set to the tap's input (reset, vector ADD: 1 + 2 cycles), multiplied by the
    tap's per-channel weights (vector MUL: 2) and added to the sum (vector ADD: 2), then
    the same epilogue (reset, bias ADD, SHR, MAX, MIN: 6). A lower bound: no loads,
    stores or instruction overheads. The diagonal GEMM takes one micro-op per entry and
    tap, so it wins whenever this exceeds `estimate_conv2d` (by about 4x on
    MobileNet-v1's 3x3 layers), and it needs no MUL; the back half lowers depthwise
    layers to it."""
    entries = layer.batch_blocks * layer.out_blocks * layer.out_h * layer.out_w
    inputs = layer.batch_blocks * layer.in_blocks * layer.h * layer.w
    return inputs + entries * (7 * layer.kernel_h * layer.kernel_w + 6)

