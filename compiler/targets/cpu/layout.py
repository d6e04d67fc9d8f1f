"""Activation layouts of the CPU target: plain NCHW, or blocked ``NCHW{c}c``.

A blocked tensor of channel block ``c`` holds an (N, C, H, W) tensor as
(N, ceil(C / c), H, W, c): the ``c`` channels of one pixel side by side, the channels
past C zero. A kernel that keeps vectors along output channels then loads and stores a
pixel's channels as one vector, and reads a pixel's input channels as consecutive
bytes (int8: four to a 32-bit word, which is what VNNI's ``vpdpbusd`` multiplies), with
no repacking of its input: onnxruntime's NCHWc kernels and TVM's NCHW[x]c schedules
keep activations this way from layer to layer.

    layout.block_shape((1, 64, 56, 56), 16)     # (1, 4, 56, 56, 16)
    xb = layout.to_blocked(x, 16)               # numpy, for the session and the tuner
    x = layout.from_blocked(xb, 64)
    kernel = layout.convert_kernel((1, 64, 56, 56), "float32", 0, 16)   # C, for programs

A kernel says which layout each of its inputs must be in and which its output is in
(`Kernel.in_blocks`, `Kernel.out_block`: 0 is plain); `vdla.compiler.targets.cpu.program`
places a conversion wherever a producer's layout is not its consumer's.
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params

__all__ = ["PLAIN", "block_shape", "blocked_bytes", "convert_kernel", "describe",
           "from_blocked", "to_blocked"]

#: The plain layout's block.
PLAIN = 0

_CTYPES = {"float32": "float", "int8": "int8_t", "uint8": "uint8_t", "int32": "int32_t"}


def describe(block: int) -> str:
    return "NCHW" if block == PLAIN else f"NCHW{block}c"


def block_shape(shape, block: int) -> tuple[int, ...]:
    """The array shape of an (N, C, ...) tensor in layout `block` (0: its own)."""
    if block == PLAIN:
        return tuple(shape)
    n, c, *rest = shape
    return (n, -(-c // block), *rest, block)


def blocked_bytes(shape, itemsize: int, block: int) -> int:
    return int(np.prod(block_shape(shape, block), dtype=np.int64)) * itemsize


def to_blocked(x: np.ndarray, block: int) -> np.ndarray:
    """`x` (N, C, ...) in layout `block`; padded channels are zero."""
    if block == PLAIN:
        return np.ascontiguousarray(x)
    n, c, *rest = x.shape
    cb = -(-c // block)
    padded = np.zeros((n, cb * block, *rest), x.dtype)
    padded[:, :c] = x
    moved = padded.reshape(n, cb, block, *rest)
    return np.ascontiguousarray(np.moveaxis(moved, 2, -1))


def from_blocked(x: np.ndarray, channels: int, block: int | None = None) -> np.ndarray:
    """The plain (N, `channels`, ...) tensor of blocked array `x` (N, CB, ..., c)."""
    if block == PLAIN:
        return np.ascontiguousarray(x)
    n, cb, *rest, c = x.shape
    plain = np.moveaxis(x, -1, 2).reshape(n, cb * c, *rest)
    return np.ascontiguousarray(plain[:, :channels])


def convert_kernel(shape, dtype: str, src: int, dst: int) -> Kernel:
    """A C kernel that copies an (N, C, ...) tensor of `dtype` from layout `src` to
    layout `dst` (blocks; one of them plain, or both blocked with different blocks).
    Work runs over (image, channel block) pairs, split among the OpenMP team when the
    tensor is large; padded channels are written as zero."""
    if src == dst:
        raise ValueError(f"convert_kernel: source and destination are both {describe(src)}")
    t = _CTYPES[dtype]
    n, c, *rest = shape
    p = int(np.prod(rest, dtype=np.int64)) if rest else 1
    big = n * c * p >= 1 << 15
    pragma = "#pragma omp parallel for collapse(2) schedule(static)\n    " if big else ""
    # Element (b, ch, q) sits at in_index in the source and out_index in the destination.

    def index(block: int, cbs: int) -> str:
        if block == PLAIN:
            return f"((size_t)b * {c} + ch) * {p} + q"
        return (f"(((size_t)b * {cbs} + ch / {block}) * {p} + q) * {block} + ch % {block}")

    s_cb, d_cb = -(-c // src) if src else c, -(-c // dst) if dst else c
    pad = ""
    if dst != PLAIN and c % dst:
        # The padded channels of the last block, zeroed so a consumer's sums stay finite.
        pad = f"""
    for (int b = 0; b < {n}; b++)
        for (size_t q = 0; q < {p}; q++)
            for (int ch = {c}; ch < {d_cb * dst}; ch++) y[{index(dst, d_cb)}] = 0;"""
    body = f"""
/* {dtype} {list(shape)}: {describe(src)} -> {describe(dst)} */
void NAME{SIGNATURE} {{
    const {t} *restrict x = (const {t} *)in[0];
    {t} *restrict y = ({t} *)out_;
    (void)params; (void)ws;
    {pragma}for (int b = 0; b < {n}; b++)
    for (int ch = 0; ch < {c}; ch++)
        for (size_t q = 0; q < {p}; q++) y[{index(dst, d_cb)}] = x[{index(src, s_cb)}];{pad}
}}
"""
    return Kernel(body, Params().blob(), ("x",), in_blocks=(src,), out_block=dst)
