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

from collections.abc import Callable

import numpy as np

from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params

__all__ = ["CONVERT_BYTES_PER_NS", "PLAIN", "block_shape", "blocked_bytes", "conversion_ns",
           "convert_kernel", "describe",
           "from_blocked", "kernel_inputs", "kernel_output", "to_blocked"]

#: The plain layout's block.
PLAIN = 0

_CTYPES = {"float32": "float", "int8": "int8_t", "uint8": "uint8_t", "int32": "int32_t"}


#: What a conversion moves per nanosecond, its reads and writes together (bytes), for
#: `conversion_ns`. Measured in whole-graph runs on the 2-core EPYC (bench/cpu_layers.py,
#: 2 threads): MobileNet-v1 int8's 32x112x112 stem output to NCHW32c took 0.089 ms (9
#: bytes a nanosecond), ResNet-50 int8's 64x56x56 pool output 0.056 ms (7). The lower
#: is taken: a graph-level choice that doubts a conversion keeps neighbours agreeing.
CONVERT_BYTES_PER_NS = 7.0


def conversion_ns(shape, itemsize: int, src: int, dst: int) -> float:
    """About how long converting an (N, C, ...) tensor of `itemsize`-byte elements from
    layout `src` to `dst` takes, in nanoseconds (`CONVERT_BYTES_PER_NS`)."""
    return (blocked_bytes(shape, itemsize, src) + blocked_bytes(shape, itemsize, dst)) \
        / CONVERT_BYTES_PER_NS


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


def from_blocked(x: np.ndarray, channels: int) -> np.ndarray:
    """The plain (N, `channels`, ...) tensor of blocked array `x` (N, CB, ..., c)."""
    n, cb, *rest, c = x.shape
    plain = np.moveaxis(x, -1, 2).reshape(n, cb * c, *rest)
    return np.ascontiguousarray(plain[:, :channels])


#: Pixels a conversion moves per channel at a time: a tile of this many pixels by one
#: channel block is transposed in L1 (reads and writes each run along memory).
_TILE = 64


def kernel_inputs(kernel: Kernel, arrays) -> list[np.ndarray]:
    """Plain `arrays` (``kernel.inputs``' values, in order) in the layouts `kernel`
    reads: how the op-by-op session and the tuner call a kernel from numpy."""
    return [to_blocked(np.asarray(a), kernel.in_block(k)) for k, a in enumerate(arrays)]


def kernel_output(kernel: Kernel, shape, dtype
                  ) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """The array `kernel` writes a (`shape`, `dtype`) output into, and the function that
    turns it back into the plain tensor."""
    raw = np.empty(block_shape(shape, kernel.out_block), dtype)
    if kernel.out_block == PLAIN:
        return raw, lambda out: out
    return raw, lambda out: from_blocked(out, shape[1])


def convert_kernel(shape, dtype: str, src: int, dst: int) -> Kernel:
    """A C kernel that copies an (N, C, ...) tensor of `dtype` from layout `src` to
    layout `dst` (blocks; one of them plain, or both blocked with different blocks).
    Plain <-> blocked runs over (image, channel block, tile of `_TILE` pixels), each
    tile transposed through L1; the work is split among the OpenMP team when the tensor
    is large; padded channels are written as zero."""
    if src == dst:
        raise ValueError(f"convert_kernel: source and destination are both {describe(src)}")
    t = _CTYPES[dtype]
    n, c, *rest = shape
    p = int(np.prod(rest, dtype=np.int64)) if rest else 1
    big = n * c * p >= 1 << 15
    pragma = "#pragma omp parallel for collapse(2) schedule(static)\n    " if big else ""
    if PLAIN in (src, dst):
        block = src or dst
        cbs = -(-c // block)
        plain = f"x[((size_t)b * {c} + ch) * {p} + q]"
        blocked = f"y[(((size_t)b * {cbs} + cb) * {p} + q) * {block} + l]"
        if dst == PLAIN:
            plain, blocked = (f"y[((size_t)b * {c} + ch) * {p} + q]",
                              f"x[(((size_t)b * {cbs} + cb) * {p} + q) * {block} + l]")
            move = f"if (ch < {c}) for (int q = q0; q < q1; q++) {plain} = {blocked};"
        else:
            move = (f"if (ch < {c}) for (int q = q0; q < q1; q++) {blocked} = {plain};\n"
                    f"            else for (int q = q0; q < q1; q++) {blocked} = 0;")
        loops = f"""{pragma}for (int b = 0; b < {n}; b++)
    for (int cb = 0; cb < {cbs}; cb++)
        for (int q0 = 0; q0 < {p}; q0 += {_TILE}) {{
            const int q1 = q0 + {_TILE} < {p} ? q0 + {_TILE} : {p};
            for (int l = 0; l < {block}; l++) {{
                const int ch = cb * {block} + l;
                {move}
            }}
        }}"""
    else:
        s_cb, d_cb = -(-c // src), -(-c // dst)

        def index(block: int, cbs: int) -> str:
            return f"(((size_t)b * {cbs} + ch / {block}) * {p} + q) * {block} + ch % {block}"

        loops = f"""{pragma}for (int b = 0; b < {n}; b++)
    for (int ch = 0; ch < {d_cb * dst}; ch++)
        for (size_t q = 0; q < {p}; q++)
            y[{index(dst, d_cb)}] = ch < {c} ? x[{index(src, s_cb)}] : 0;"""
    body = f"""
/* {dtype} {list(shape)}: {describe(src)} -> {describe(dst)} */
void NAME{SIGNATURE} {{
    const {t} *restrict x = (const {t} *)in[0];
    {t} *restrict y = ({t} *)out_;
    (void)params; (void)ws;
    {loops}
}}
"""
    return Kernel(body, Params().blob(), ("x",), in_blocks=(src,), out_block=dst)
