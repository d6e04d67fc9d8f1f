"""Patch embeddings (a ViT's stem) and int8 stems compiled to C as one GEMM of many rows.

    if runs_as_gemm(shape, isa):               # a ConvShape
        kernel = patches_kernel(shape, node, graph, isa, inputs)

A convolution whose kernel equals its stride, with no padding, dilation or groups (the
16 x 16, stride-16 stem of a ViT), reads every input pixel once: its im2col matrix is a
permutation of the input, one row per patch. The kernel gathers the patches into the
scratch space (rows of C x kh x kw values in the weights' (c, i, j) order; a tap in the
padding is 0, the value int8's symmetric quantization and float32 pad with),
multiplies them by the weights with the dense layers' row-tiled GEMM
(`dense.dense_kernel`, its C under the name ``NAME_gemm``: bias, per-channel
requantization, activation, the same epilogue as the convolution's), then transposes
the (patches, O) result into the NCHW output. The general convolution kernel writes
every one of the kernel's taps out, which for 16 x 16 taps is thousands of lines of C
(minutes of gcc) and a register tile built for 3 x 3 windows.

A CNN's int8 stem (a 7 x 7 or 3 x 3 kernel over 3 channels, stride 2, padded:
overlapping windows, so the im2col rows repeat pixels) runs as a GEMM too where the
input may be negative and the instruction set has no VNNI (`runs_as_gemm`), in its own
kernel (`vdla.compiler.targets.cpu.stem`: int16 rows gathered a few at a time, the
output blocked). The direct kernel then reads the input as ``x + 128`` split in
nibbles, ten vector instructions per four products of a lane, while int16 pairs
multiply with ``vpmaddwd``, exact for any byte. Measured on an AMD EPYC (AVX2 only, 2
threads, 15 interleaved rounds): ResNet-18 int8's whole graph ran in 16.7 ms with its
7 x 7 stem as this module's GEMM against 18.9 ms with the direct kernel (1.22x, the
median of the rounds' ratios; the direct stem alone had taken 6.3 ms against
onnxruntime's 1.8 ms), and the stem's own kernel gained 1.065x more.

On an instruction set with AMX tiles an int8 convolution of one group whose rows the
tile kernel reads in place (`amx.reads_in_place`: channels in whole 64-byte steps, or a
stem whose kernel row fits one) is a GEMM of its im2col rows on the tiles
(`amx.qconv_kernel`): a tile multiplies 16 x 64 bytes by 64 x 16 in one instruction,
1,024 int8 products a cycle against VNNI's 128 on 512 bits. The others stay on the VNNI
code: measured on an Intel Xeon with AMX, ResNet's 3-channel stem took 1.9 ms on copied
rows against 0.8 ms there (before it was read in place), and MobileNet-v1 int8 ran 1.13x
faster whole-graph with its 32-channel 1 x 1 layer there than folded into a step.
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu import amx
from vdla.compiler.targets.cpu.dense import dense_kernel
from vdla.compiler.targets.cpu.dense_schedule import choose_dense
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params, align
from vdla.compiler.targets.cpu.machine import NOMINAL, MachineCosts
from vdla.compiler.targets.cpu.schedule import blocked_fits
from vdla.compiler.targets.cpu.shapes import ConvShape, DenseShape
from vdla.compiler.targets.cpu.stem import stem_kernel

__all__ = ["is_patches", "patches_kernel", "runs_as_gemm"]


def is_patches(shape: ConvShape) -> bool:
    """Whether the convolution of `shape` is a patch embedding (module docstring): a
    kernel of at least 2 x 2 equal to its stride, no padding, dilation, groups or
    residual."""
    return (shape.kh == shape.sh and shape.kw == shape.sw and shape.kh * shape.kw >= 4
            and shape.groups == 1 and shape.dh == shape.dw == 1 and not shape.residual
            and shape.pt == shape.pl == shape.pb == shape.pr == 0)


def runs_as_gemm(shape: ConvShape, isa: Isa) -> bool:
    """Whether the default kernel of convolution `shape` on `isa` is this module's GEMM:
    a patch embedding (`is_patches`), an int8 convolution on tiles whose im2col rows the
    tile kernel reads in place (`amx.reads_in_place`; others run the VNNI code, faster
    there than copied rows), or an int8 stem (one group, too few input channels for the
    blocked layout, `schedule.blocked_fits`; at least 2 x 2 taps, no residual)
    whose input may be negative on an instruction set without VNNI (module docstring)."""
    if is_patches(shape) or (isa.tiles and amx.reads_in_place(shape)):
        return True
    return (shape.int8 and shape.offset and isa.vector_int8 in ("maddubs", "portable")
            and shape.groups == 1 and not blocked_fits(shape, isa)
            and shape.kh * shape.kw >= 4 and not shape.residual)


def patches_kernel(shape: ConvShape, node: Node, graph: Graph, isa: Isa,
                   inputs: tuple[str, ...], costs: MachineCosts = NOMINAL) -> Kernel:
    """The kernel of convolution `shape` as one GEMM (`runs_as_gemm`); `costs`: the
    machine its GEMM's default schedule is chosen for (`choose_dense`)."""
    if isa.tiles and shape.int8:
        w = np.asarray(graph.constant(node.inputs[1]))
        bias = graph.constant(node.input(2)) if node.input(2) else None
        return amx.qconv_kernel(shape, w, bias, node, inputs)
    if shape.int8 and not is_patches(shape):
        return stem_kernel(shape, node, graph, isa, inputs)
    ho, wo = shape.ho, shape.wo
    rows, depth = shape.n * ho * wo, shape.c * shape.kh * shape.kw
    dense = DenseShape(n=rows, k=depth, o=shape.o, dtype=shape.dtype, bias=shape.bias,
                       residual=False, offset=shape.offset, activation=shape.activation)
    w = np.asarray(graph.constant(node.inputs[1])).reshape(shape.o, depth)
    bias = graph.constant(node.input(2)) if node.input(2) else None
    gemm = dense_kernel(dense, choose_dense(dense, isa, costs), w, bias, node, isa, inputs)
    params = Params()
    g_off = params.add(gemm.params)
    elem = "int8_t" if shape.int8 else "float"
    size = 1 if shape.int8 else 4
    g_ws = align(gemm.shared_bytes)
    p_bytes = align(rows * depth * size)
    y_bytes = align(rows * shape.o * size)
    plane = ho * wo
    body = gemm.body.replace("NAME", "NAME_gemm") + f"""
/* convolution {shape.n}x{shape.c}x{shape.h}x{shape.w} -> {shape.o}, {shape.kh}x{shape.kw} s{shape.sh}
   as one GEMM of its im2col rows: {rows} x {depth} @ {depth} x {shape.o} */
void NAME{SIGNATURE} {{
    const {elem} *restrict X = (const {elem} *)in[0];
    {elem} *restrict Y = ({elem} *)out_;
    {elem} *restrict P = ({elem} *)(ws + {g_ws});
    {elem} *restrict T = ({elem} *)(ws + {g_ws + p_bytes});
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < {rows}; r++) {{
        const int n = r / {plane}, oy = r % {plane} / {wo}, ox = r % {wo};
        const int ix0 = ox * {shape.sw} - {shape.pl};
        for (int c = 0; c < {shape.c}; c++)
            for (int i = 0; i < {shape.kh}; i++) {{
                {elem} *restrict dst = P + (size_t)r * {depth} + (c * {shape.kh} + i) * {shape.kw};
                const int iy = oy * {shape.sh} - {shape.pt} + i * {shape.dh};
                if (iy < 0 || iy >= {shape.h}) {{
                    memset(dst, 0, {shape.kw * size});
                    continue;
                }}
                const {elem} *src = X + (((size_t)n * {shape.c} + c) * {shape.h} + iy) * {shape.w};
                if ({int(shape.dw == 1)} && ix0 >= 0 && ix0 + {shape.kw} <= {shape.w}) {{
                    memcpy(dst, src + ix0, {shape.kw * size});
                    continue;
                }}
                for (int j = 0; j < {shape.kw}; j++) {{
                    const int ix = ix0 + j * {shape.dw};
                    dst[j] = ix >= 0 && ix < {shape.w} ? src[ix] : 0;
                }}
            }}
    }}
    const void *gin[1] = {{P}};
    NAME_gemm(gin, T, params + {g_off}, ws);
    #pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < {shape.n}; n++)
        for (int o = 0; o < {shape.o}; o++)
            for (int p = 0; p < {plane}; p++)
                Y[((size_t)n * {shape.o} + o) * {plane} + p] = T[((size_t)n * {plane} + p) * {shape.o} + o];
}}
"""
    return Kernel(body, params.blob(), inputs, shared_bytes=g_ws + p_bytes + y_bytes,
                  macs=gemm.macs, items=gemm.items, checks=gemm.checks)
