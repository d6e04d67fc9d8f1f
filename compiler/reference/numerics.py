"""Numerics the reference kernels share (and that the model builder and the
quantizer reuse): padding, windows, convolution sums and average-pool sums in numpy."""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.ops import conv_output_size
from vdla.compiler.ir.tensor import Node

__all__ = ["activation", "avg_pool_sums", "conv2d_accumulate", "pad_nchw", "pool2d_windows"]


def pad_nchw(x: np.ndarray, pads, value=0) -> np.ndarray:
    top, left, bottom, right = pads
    if not any(pads):
        return x
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=value)


def pool2d_windows(x: np.ndarray, kernel, strides, pads, dilations=(1, 1), *,
                   ceil_mode=False, value=0) -> np.ndarray:
    """A read-only (N, C, Ho, Wo, kH, kW) view of the windows of the padded NCHW `x`.
    With `ceil_mode`, the input is padded further at the end (with `value`) so the last
    partial window exists."""
    n, c, h, w = x.shape
    kh, kw = kernel
    sh, sw = strides
    dh, dw = dilations
    ho = conv_output_size(h, kh, sh, pads[0], pads[2], dh, ceil_mode)
    wo = conv_output_size(w, kw, sw, pads[1], pads[3], dw, ceil_mode)
    need_h = (ho - 1) * sh + dh * (kh - 1) + 1
    need_w = (wo - 1) * sw + dw * (kw - 1) + 1
    extra_b = max(0, need_h - (h + pads[0] + pads[2]))
    extra_r = max(0, need_w - (w + pads[1] + pads[3]))
    xp = pad_nchw(x, (pads[0], pads[1], pads[2] + extra_b, pads[3] + extra_r), value)
    s = xp.strides
    return np.lib.stride_tricks.as_strided(
        xp, (n, c, ho, wo, kh, kw), (s[0], s[1], s[2] * sh, s[3] * sw, s[2] * dh, s[3] * dw),
        writeable=False)


def conv2d_accumulate(x: np.ndarray, w: np.ndarray, strides, pads, dilations, groups: int,
                      *, exact_int: bool = False, dtype=np.float64) -> np.ndarray:
    """conv2d of NCHW `x` with OIHW `w`, without bias, computed in `dtype` (float64 by
    default; the graph builder asks for float32 to build deep models fast). With
    `exact_int`, int64 sums of integer products (computed through float64 BLAS, exact
    while every sum stays below 2**53, far beyond int8 x int8 over any real layer)."""
    work = np.float64 if exact_int else dtype
    n, c, h, wd = x.shape
    o, ig, kh, kw = w.shape
    cols = pool2d_windows(x.astype(work, copy=False), (kh, kw), strides, pads, dilations)
    _, _, ho, wo, _, _ = cols.shape
    wf = w.astype(work, copy=False)
    if ig == 1 and groups == c == o:
        # Depthwise: one multiply-add per tap over all channels beats per-channel products.
        out = np.zeros((n, c, ho, wo), dtype=work)
        for i in range(kh):
            for j in range(kw):
                out += cols[..., i, j] * wf[None, :, 0, i, j, None, None]
    else:
        og = o // groups
        out = np.empty((n, o, ho, wo), dtype=work)
        for g in range(groups):
            part = cols[:, g * ig:(g + 1) * ig]                   # N, ig, Ho, Wo, kh, kw
            mat = part.transpose(0, 2, 3, 1, 4, 5).reshape(n * ho * wo, ig * kh * kw)
            res = mat @ wf[g * og:(g + 1) * og].reshape(og, -1).T  # N*Ho*Wo, og
            out[:, g * og:(g + 1) * og] = res.reshape(n, ho, wo, og).transpose(0, 3, 1, 2)
    if exact_int:
        return np.rint(out).astype(np.int64)
    return out


def activation(node: Node, y: np.ndarray) -> np.ndarray:
    act = node.attrs.get("activation")
    if act == "relu":
        return np.maximum(y, 0)
    if act == "clip":
        lo, hi = node.attrs.get("clip_min"), node.attrs.get("clip_max")
        return np.clip(y, -np.inf if lo is None else lo, np.inf if hi is None else hi)
    return y



def avg_pool_sums(node, x):
    """Window sums and element counts of an average pool (the count excludes padding
    unless count_include_pad; the ceil_mode overhang never counts)."""
    a = node.attrs
    xf = x.astype(np.float64) if x.dtype.kind == "f" else x.astype(np.int64)
    sums = pool2d_windows(xf, a["kernel"], a["strides"], a["pads"],
                          ceil_mode=a["ceil_mode"]).sum(axis=(4, 5))
    ones = np.ones((1, 1) + x.shape[2:], dtype=np.int64)
    if a["count_include_pad"]:
        h, w = x.shape[2:]
        p = a["pads"]
        ones = np.ones((1, 1, h + p[0] + p[2], w + p[1] + p[3]), dtype=np.int64)
        counts = pool2d_windows(ones, a["kernel"], a["strides"], (0, 0, 0, 0),
                                ceil_mode=a["ceil_mode"]).sum(axis=(4, 5))
        counts = counts[:, :, :sums.shape[2], :sums.shape[3]]
    else:
        counts = pool2d_windows(ones, a["kernel"], a["strides"], a["pads"],
                                ceil_mode=a["ceil_mode"]).sum(axis=(4, 5))
    return sums, counts
