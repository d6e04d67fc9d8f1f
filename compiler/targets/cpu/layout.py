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
#: 2 threads): MobileNet-v1 int8's 32x112x112 stem output to NCHW32c took 0.023 ms (35
#: bytes a nanosecond), ResNet-18's and ResNet-50's 64x56x56 pool output 0.009 ms (45).
#: The lower is taken: a graph-level choice that doubts a conversion keeps neighbours
#: agreeing.
CONVERT_BYTES_PER_NS = 35.0


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


#: The widest tile a conversion transposes in registers: this many pixels by as many
#: channels (fewer where the block is smaller).
_TILE = 16


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
    Plain <-> blocked transposes tiles of L pixels by L channels in registers (L the
    block, at most `_TILE`; `_transpose_loops`); the work is split among the OpenMP
    team when the tensor is large; padded channels are written as zero."""
    if src == dst:
        raise ValueError(f"convert_kernel: source and destination are both {describe(src)}")
    t = _CTYPES[dtype]
    n, c, *rest = shape
    p = int(np.prod(rest, dtype=np.int64)) if rest else 1
    big = n * c * p >= 1 << 15
    pragma = "#pragma omp parallel for collapse(2) schedule(static)\n    " if big else ""
    types = ""
    if PLAIN in (src, dst):
        types, loops = _transpose_loops(t, np.dtype(dtype).itemsize, n, c, p, src or dst,
                                        to_plain=dst == PLAIN, parallel=big)
    else:
        s_cb, d_cb = -(-c // src), -(-c // dst)
        # runs of the smaller block's channels, whole in both layouts where it divides
        # the larger (the kernels' blocks are powers of two), one copy each: the
        # source's zero padding copies as it is, a run past its last block is zeroed
        run = min(src, dst) if max(src, dst) % min(src, dst) == 0 else 1

        def index(block: int, cbs: int) -> str:
            return f"(((size_t)b * {cbs} + ch / {block}) * {p} + q) * {block} + ch % {block}"

        loops = f"""{pragma}for (int b = 0; b < {n}; b++)
    for (int ch = 0; ch < {d_cb * dst}; ch += {run})
        for (size_t q = 0; q < {p}; q++) {{
            if (ch < {s_cb * src})
                memcpy(y + {index(dst, d_cb)}, x + {index(src, s_cb)}, {run} * sizeof *y);
            else memset(y + {index(dst, d_cb)}, 0, {run} * sizeof *y);
        }}"""
    body = f"""
/* {dtype} {list(shape)}: {describe(src)} -> {describe(dst)} */
{types}
void NAME{SIGNATURE} {{
    const {t} *restrict x = (const {t} *)in[0];
    {t} *restrict y = ({t} *)out_;
    (void)params; (void)ws;
    {loops}
}}
"""
    return Kernel(body, Params().blob(), ("x",), in_blocks=(src,), out_block=dst)


def _transpose(t: str, itemsize: int, lanes: int) -> str:
    """C of ``NAME_tr(r)``: the `lanes` x `lanes` tile of `t` in vectors ``r[0..lanes)``
    transposed in place, in log2(`lanes`) rounds that interleave vector i with vector
    i + lanes/2 (the low halves into vector 2i, the high halves into 2i + 1)."""
    half = lanes // 2
    lo = ", ".join(f"{j}, {j + lanes}" for j in range(half))
    hi = ", ".join(f"{j + half}, {j + half + lanes}" for j in range(half))
    rounds = []
    a, b = "r", "t"
    for _ in range(lanes.bit_length() - 1):
        rounds.append(f"""    for (int i = 0; i < {half}; i++) {{
        {b}[2 * i] = VDLA_SHUFFLE2({a}[i], {a}[i + {half}], NAME_m, {lo});
        {b}[2 * i + 1] = VDLA_SHUFFLE2({a}[i], {a}[i + {half}], NAME_m, {hi});
    }}""")
        a, b = b, a
    back = "    memcpy(r, t, sizeof t);\n" if a == "t" else ""
    return f"""typedef {t} NAME_v __attribute__((vector_size({lanes * itemsize})));
typedef int{8 * itemsize}_t NAME_m __attribute__((vector_size({lanes * itemsize})));
VDLA_INLINE void NAME_tr(NAME_v *restrict r) {{
    NAME_v t[{lanes}];
{chr(10).join(rounds)}
{back}}}
"""


def _transpose_loops(t: str, itemsize: int, n: int, c: int, p: int, block: int, *,
                     to_plain: bool, parallel: bool) -> tuple[str, str]:
    """(helper C, loops C) of a plain <-> blocked conversion of an (n, c, p-pixel) tensor
    of `t` with channel block `block` (``x`` read, ``y`` written): whole tiles of L
    pixels by L channels (L = min(block, `_TILE`)) transposed in registers (a scalar
    loop over the lanes ran at 3 bytes a nanosecond; MobileNet-v1 int8's 400 KB stem
    output took 0.13 ms), the pixels past the last whole tile one by one."""
    lanes = min(block, _TILE)
    cbs = -(-c // block)
    # (a block that is no power of two, which no kernel writes, goes one by one)
    tiles = p // lanes if lanes > 1 and not lanes & (lanes - 1) else 0
    plain = f"((size_t)b * {c} + ch) * {p} + q"
    blocked = f"(((size_t)b * {cbs} + cb) * {p} + q) * {block} + l"
    if to_plain:
        load = f"""for (int k = 0; k < {lanes}; k++)
                    memcpy(&r[k], x + (((size_t)b * {cbs} + cb) * {p} + q0 + k) * {block} + h,
                           sizeof r[k]);"""
        store = f"""for (int k = 0; k < {lanes}; k++) {{
                    const int ch = cb * {block} + h + k;
                    if (ch < {c})
                        memcpy(y + ((size_t)b * {c} + ch) * {p} + q0, &r[k], sizeof r[k]);
                }}"""
        tail = f"if (ch < {c}) y[{plain}] = x[{blocked}];"
    else:
        load = f"""for (int k = 0; k < {lanes}; k++) {{
                    const int ch = cb * {block} + h + k;
                    if (ch < {c})
                        memcpy(&r[k], x + ((size_t)b * {c} + ch) * {p} + q0, sizeof r[k]);
                    else r[k] = (NAME_v){{0}};
                }}"""
        store = f"""for (int k = 0; k < {lanes}; k++)
                    memcpy(y + (((size_t)b * {cbs} + cb) * {p} + q0 + k) * {block} + h, &r[k],
                           sizeof r[k]);"""
        tail = f"y[{blocked}] = ch < {c} ? x[{plain}] : 0;"
    pragma = "#pragma omp parallel for collapse(3) schedule(static)\n    " if parallel else ""
    whole = "" if not tiles else f"""{pragma}for (int b = 0; b < {n}; b++)
    for (int cb = 0; cb < {cbs}; cb++)
        for (int tile = 0; tile < {tiles}; tile++) {{
            const int q0 = tile * {lanes};
            for (int h = 0; h < {block}; h += {lanes}) {{
                NAME_v r[{lanes}];
                {load}
                NAME_tr(r);
                {store}
            }}
        }}
    """
    loops = whole + f"""for (int b = 0; b < {n}; b++)
    for (int cb = 0; cb < {cbs}; cb++)
        for (int q = {tiles * lanes}; q < {p}; q++)
            for (int l = 0; l < {block}; l++) {{
                const int ch = cb * {block} + l;
                {tail}
            }}"""
    return (_transpose(t, itemsize, lanes) if tiles else ""), loops
