"""int8 matrix products on AMX tiles: the ``amx`` instruction set's ``qmatmul``,
``qdense`` and ``qconv2d`` kernels (`vdla.compiler.targets.cpu.isa`; `matmul`, `dense`
and `patches` hand them over).

    kernel = qmatmul_kernel(node, shape, schedule, sources, params, ...)   # from matmul
    kernel = qdense_kernel(shape, schedule, weights, bias, node, inputs)   # from dense
    kernel = qconv_kernel(shape, weights, bias, node, inputs)              # from patches

A convolution is the GEMM of its im2col rows (`qconv_kernel`). An int8 one that
`reads_in_place` (input channels in whole 64-byte steps, or a stem whose kernel row fits
a step) reads those rows in place from a zero-padded NHWC copy of its input, a row tile
at a time (`_taps_kernel`); any other (a patch embedding whose row does not fit, every
bf16 one) builds them straight into A's layout below. Which convolutions run here at
all is `patches.runs_as_gemm`'s choice.

Both are one GEMM, C (M x N, int32) = A (M x K, int8) times B (K x N, int8), on the tiles
`vdla_cpu.h` configures: every tile 16 rows x 64 bytes, four accumulating a block of 2 x 2
tiles of C (32 x 32 int32), two holding A's rows (16 rows x 64 k) and two B's (16 rows of
four k for 16 columns: the packed ``[K / 4][N][4]`` layout, the VNNI kernels' own, is
exactly a B tile's). ``tdpbssd`` multiplies signed bytes by signed bytes, so unlike the
vector kernels there is no ``x + 128`` and no column-sum correction.

The operands, in the scratch space or in ``params``:

- B, packed with zeros past K (to a multiple of 64) and past N: ``qmatmul`` packs every
  distinct B once per run as ``[K / 4][N16][4]`` (N16: N to a multiple of 16); ``qdense``
  packs its constant weights when the C is written, as ``[O / 32][K / 4][32][4]`` (each
  32-column block's tile rows 128 bytes apart, so a block's weights are contiguous).
- A, copied once per run into rows of K64 bytes (K to a multiple of 64), each matrix's
  rows to a multiple of 16, the copy zero past K and M. Why a copy, not smaller tile
  configurations at the edges: one configuration (16 x 64 everywhere) serves every
  block, loaded once per call and thread, and no load reads past A's end; the copy is
  M x K bytes against M x K x N multiply-adds.

A work item is one block of up to 32 x 32 outputs (OpenMP shares them; each thread
configures its own tiles first and releases them after). Its sums go from the tiles to
a 4 KiB int32 buffer on the thread's stack, and the shared vector epilogue
(`vdla.compiler.targets.cpu.epilogue`: bias, requantization, residual, clamp, store)
finishes them 16 lanes at a time, as the vector kernels do: the arithmetic after the
sums is theirs.

Without AMX hardware the kernels run on `vdla_cpu.h`'s software model of the tiles
(built with ``-DVDLA_AMX_MODEL``: `modelled`), which checks their layouts and edges bit
for bit and says nothing of their speed. On AMX hardware they run natively, and the same
tests compare them with the reference.

Linux grants a process the tile state only on request: the kernels call
``vdla_amx_ready`` (``c/runtime.c``: asked once per process) and report a refusal as an
error instead of faulting (`Kernel.checks`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.dense_schedule import DenseSchedule
from vdla.compiler.targets.cpu.epilogue import (Epilogue, Lanes, Operands, table_pointers,
                                               tables)
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import (SIGNATURE, Kernel, Params, align,
                                              param_pointers)
from vdla.compiler.targets.cpu.matmul_schedule import PARALLEL_MACS, MatmulSchedule, MatmulShape
from vdla.compiler.targets.cpu.shapes import ConvShape, DenseShape

__all__ = ["BLOCK", "MODEL_FLAG", "modelled", "pack_weights", "qconv_kernel",
           "qdense_kernel", "qmatmul_kernel", "reads_in_place", "runs_bf16"]

#: Rows and int32 columns of a block of C: 2 x 2 tiles of 16 x 16.
BLOCK = 32
#: The k of one tile step (a tile row of A: 64 bytes).
K_STEP = 64
#: The flag that builds the tile kernels on `vdla_cpu.h`'s software model.
MODEL_FLAG = "-DVDLA_AMX_MODEL"


def runs_bf16(node: Node) -> bool:
    """Whether the bf16 precision runs float `node` in bfloat16 on tiles: a convolution of
    one group, a dense layer or a batched product (the rest of the graph stays float32)."""
    return node.op in ("dense", "matmul") or (node.op == "conv2d"
                                               and int(node.attrs["groups"]) == 1)


def modelled(isa: Isa) -> Isa:
    """`isa` (``amx``) built on the software model of the tiles: the tests' way to run the
    tile kernels on a machine without AMX. Its vector code (the same C) is built as
    portable C (``-DVDLA_PORTABLE``): a machine without AMX may lack AVX-512 too, whose
    register constraints its 16-lane kernels use."""
    if not isa.tiles:
        raise ValueError(f"{isa.name} has no tile kernels to model")
    return dataclasses.replace(isa, flags=isa.flags + ("-DVDLA_PORTABLE", MODEL_FLAG))


def bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bit patterns (uint16), rounded to nearest even, a NaN a
    quiet NaN: what `vdla_cpu.h`'s ``vdla_bf16`` computes."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)


def from_bfloat16(b: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as float32."""
    return (np.asarray(b, np.uint16).astype(np.uint32) << 16).view(np.float32)


def pack_bf16(w: np.ndarray) -> np.ndarray:
    """float weights (O, K) as bfloat16 B tiles ``[O / 32][K32 / 2][32][2]`` (zeros past
    O and K): block ``ob``'s tile row ``q`` holds columns 32 ob .. 32 ob + 31, two k
    each, 128 bytes like an int8 tile row."""
    o, k = w.shape
    full = np.zeros((align(o, BLOCK), align(k, K_STEP // 2)), np.uint16)
    full[:o, :k] = bfloat16(w)
    blocks, kp = full.shape[0] // BLOCK, full.shape[1]
    return np.ascontiguousarray(full.reshape(blocks, BLOCK, kp // 2, 2).transpose(0, 2, 1, 3))


def pack_weights(w: np.ndarray) -> np.ndarray:
    """int8 weights (O, K) as B tiles ``[O / 32][K64 / 4][32][4]`` (zeros past O and K):
    block ``ob``'s tile row ``q`` holds columns 32 ob .. 32 ob + 31, four k each."""
    o, k = w.shape
    full = np.zeros((align(o, BLOCK), align(k, K_STEP)), np.int8)
    full[:o, :k] = w
    blocks, kp = full.shape[0] // BLOCK, full.shape[1]
    return np.ascontiguousarray(full.reshape(blocks, BLOCK, kp // 4, 4).transpose(0, 2, 1, 3))


# --- the C both kernels share -------------------------------------------------------------

def _copy_rows(src: str, dst: str, mats: int, m: int, k: int) -> str:
    """C (inside a parallel region): `mats` int8 matrices of `m` rows of `k` at `src`
    into `dst` as rows of K64 bytes, each matrix's rows to a multiple of 16, zero past."""
    mp, kp = align(m, 16), align(k, K_STEP)
    return f"""
        #pragma omp for schedule(static)
        for (int i = 0; i < {mats * mp}; i++) {{
            int8_t *restrict o = {dst} + (size_t)i * {kp};
            const int r = i % {mp};
            if (r < {m}) {{
                memcpy(o, {src} + ((size_t)(i / {mp}) * {m} + r) * {k}, {k});
                memset(o + {k}, 0, {kp - k});
            }} else memset(o, 0, {kp});
        }}"""


def _block(a: str, b: str, ldb: int, k: int, bf16: bool = False) -> str:
    """C: the sums of one block (``rows`` x ``cols`` of C, each at most `BLOCK`) into
    ``c``: A's rows at `a` (K64 bytes apart: `k` bytes of int8, or `k` bfloat16 with
    `bf16`), B's tile rows at `b` (`ldb` bytes apart)."""
    kp = align(2 * k if bf16 else k, K_STEP)
    fn = "vdla_amx_block_bf16" if bf16 else "vdla_amx_block"
    cases = " ".join(f"case {2 * (rt - 1) + ct - 1}: {fn}({a}, {kp}, {b}, {ldb}, "
                     f"{kp // K_STEP}, {rt}, {ct}, c); break;"
                     for rt in (1, 2) for ct in (1, 2))
    return f"switch ((rows > 16) * 2 + (cols > 16)) {{ {cases} }}"


def _finish(ep: Epilogue, ops: Operands, out: str, res: str | None = None,
            before: str = "") -> str:
    """C: the block's ``rows`` x ``cols`` sums in ``c`` finished by epilogue `ep` with
    constants `ops`, 16 lanes at a time (``u``-th vector of row ``r``; ``last`` lanes),
    stored at `out` (the residual read at `res`); `before` declares what they use."""
    lines = ep.statements(f"{ep.t}_load(c + r * 32 + 16 * u)", ops, out, res=res,
                          lanes=Lanes("first", "last"), var="t")
    body = "".join("\n                    " + line for line in lines)
    return f"""
            for (int r = 0; r < rows; r++)
                for (int u = 0; 16 * u < cols; u++) {{
                    const int last = vdla_min(16, cols - 16 * u);{before}{body}
                }}"""


#: C: the start of every tile kernel: nothing runs where the tiles are refused.
_READY = "    if (!vdla_amx_ready()) return;      /* refused: reported (c/runtime.c) */"

#: C: a thread's tiles and sums (tile kernels' parallel region, before the work items).
_TILES = """
        vdla_amx_configure();
        int32_t c[32 * 32] __attribute__((aligned(64)));"""
#: The same with float sums (bfloat16 products).
_TILES_BF16 = _TILES.replace("int32_t c", "float c")


# --- qmatmul --------------------------------------------------------------------------------

def qmatmul_kernel(node: Node, shape: MatmulShape, s: MatmulSchedule, a_ptr: str, b_ptr: str,
                   params: Params, inputs: tuple[str, ...], offsets: int, a_mats: int,
                   boff: np.ndarray, rq: int | None) -> Kernel:
    """The tile kernel of ``qmatmul`` `node`, or of a float ``matmul`` computed in
    bfloat16 (the bf16 precision: its operands rounded as they are packed and copied,
    its float sums stored as they are); `shape`, checked schedule `s`: only its team's
    knob applies. `a_ptr`, `b_ptr`: C expressions of the operands; `params` holds, at
    `offsets`, each output batch's A and B element offsets (`matmul.batch_offsets`;
    `boff` the B ones) and, for ``qmatmul``, at `rq` the multiplier, shift, out_min and
    out_max (int32); `a_mats`: A's matrices."""
    bf16 = node.op == "matmul"
    batches, m, k, n, trans = shape.batches, shape.m, shape.k, shape.n, shape.transpose_b
    size = 2 if bf16 else 1
    per = 4 // size                             # values of a 4-byte tile column
    n16, kp, mp = align(n, 16), align(k, K_STEP // size), align(m, 16)
    distinct, which = np.unique(boff, return_inverse=True)
    packs = distinct.size
    pack_off = params.add(distinct.astype(np.int64))
    which_off = params.add(which.astype(np.int32))
    panel = align(kp * n16 * size)
    rbs, cbs = -(-m // BLOCK), -(-n // BLOCK)
    work = batches * cbs * rbs
    parallel = int(s.parallel == "all" and shape.macs >= PARALLEL_MACS and work > 1)
    read = f"b[(size_t)j * {k} + q]" if trans else f"b[(size_t)q * {n} + j]"
    el, at = ("float", "uint16_t") if bf16 else ("int8_t", "int8_t")
    if bf16:
        read = f"vdla_bf16({read})"
        copy = f"""
        #pragma omp for schedule(static)
        for (int i = 0; i < {a_mats * mp}; i++) {{     /* A's rows in bfloat16 */
            uint16_t *restrict d = pa + (size_t)i * {kp};
            const int r = i % {mp};
            const float *restrict x = A + ((size_t)(i / {mp}) * {m} + r) * {k};
            for (int q = 0; q < {kp}; q++) d[q] = r < {m} && q < {k} ? vdla_bf16(x[q]) : 0;
        }}"""
        rq_ptr, lims = (), ""
        finish = f"""
            for (int r = 0; r < rows; r++)
                memcpy(y + (size_t)r * {n}, c + r * 32, (size_t)cols * 4);"""
    else:
        copy = _copy_rows("A", "pa", a_mats, m, k)
        rq_ptr = (("int32_t", "rq", rq),)
        lims = "\n        const vi16 lo = vi16_bcast(rq[2]), hi = vi16_bcast(rq[3]);"
        finish = _finish(Epilogue(16, True, rq=("rq", "rqv")),
                         Operands(bias="0u", lo="lo", hi="hi", mul="rq[0]", shf="rq[1]"),
                         f"y + (size_t)r * {n} + 16 * u")
    body = f"""
/* {"matmul in bfloat16" if bf16 else "qmatmul"} on AMX tiles: {batches} products {m}x{k} @ {k}x{n}{' (b transposed)' if trans else ''} */
void NAME{SIGNATURE} {{
{_READY}
    const {el} *restrict A = {a_ptr};
    const {el} *restrict B = {b_ptr};
    {el} *restrict Y = ({el} *)out_;
{param_pointers(("int64_t", "off", offsets), ("int64_t", "packed", pack_off),
                ("int32_t", "which", which_off), *rq_ptr)}
    {at} *restrict pa = ({at} *)(ws + {packs * panel});
    #pragma omp parallel if({parallel})
    {{
        #pragma omp for schedule(static)
        for (int t = 0; t < {packs * n16}; t++) {{
            const int pk = t / {n16}, j = t % {n16};
            const {el} *restrict b = B + packed[pk];
            {at} *restrict p = ({at} *)(ws + (size_t)pk * {panel}) + (size_t)j * {per};
            for (int q = 0; q < {kp}; q++)
                p[(size_t)(q / {per}) * {n16 * per} + q % {per}] = j < {n} && q < {k} ? {read} : 0;
        }}{copy}{_TILES_BF16 if bf16 else _TILES}{lims}
        #pragma omp for schedule(static)
        for (int w = 0; w < {work}; w++) {{
            const int bt = w / {cbs * rbs}, cb = w / {rbs} % {cbs}, rb = w % {rbs};
            const int rows = vdla_min({BLOCK}, {m} - rb * {BLOCK});
            const int cols = vdla_min({BLOCK}, {n} - cb * {BLOCK});
            const {at} *restrict a = pa + (size_t)(off[bt] / {m * k} * {mp} + rb * {BLOCK}) * {kp};
            const {at} *restrict b = ({at} *)(ws + (size_t)which[bt] * {panel}) + cb * {BLOCK * per};
            {el} *restrict y = Y + (size_t)bt * {m * n} + (size_t)rb * {BLOCK * n} + cb * {BLOCK};
            {_block("a", "b", n16 * 4, k, bf16)}{finish}
        }}
        _tile_release();
    }}
}}
"""
    shared = packs * panel + align(a_mats * mp * kp * size)
    return Kernel(body, params.blob(), inputs, shared_bytes=shared,
                  macs=batches * m * k * n, items=work if parallel else 1, checks=True)


# --- qdense, and dense at bfloat16 ------------------------------------------------------

def qdense_kernel(shape: DenseShape, s: DenseSchedule, weights: np.ndarray, bias,
                  node: Node, inputs: tuple[str, ...]) -> Kernel:
    """The tile kernel of dense layer `shape` (int8, or float32 computed in bfloat16: the
    bf16 precision; checked schedule `s`: only its team's knob applies) with `weights`
    (O, K) and `bias` (or None). At bf16 the rows are rounded to bfloat16 as they are
    copied."""
    shape = dataclasses.replace(shape, offset=False)     # signed x signed: no x + 128
    bf16 = not shape.int8
    n, k, o = shape.n, shape.k, shape.o
    size = 2 if bf16 else 1
    kp = align(k, K_STEP // size)               # values of a row
    params = Params()
    w = np.asarray(weights)
    w_off = params.add(pack_bf16(w) if bf16 else pack_weights(w))
    offsets = tables(shape, node, weights, bias, params, align(o, BLOCK))
    rbs, obs = -(-n // BLOCK), -(-o // BLOCK)
    parallel = int(s.parallel != "none")
    ep = Epilogue.of(shape, 16)
    el, at = ("float", "uint16_t") if bf16 else ("int8_t", "int8_t")
    res = f"const {el} *restrict res = (const {el} *)in[1];" if shape.residual else ""
    finish = _finish(ep, Operands.lanes(ep, "o"), "y + row + o", res="res + row + o",
                     before=f"\n                    const int o = ob * {BLOCK} + 16 * u; "
                            f"const size_t row = (size_t)(rb * {BLOCK} + r) * {o};")
    copy = _copy_rows("X", "pa", 1, n, k) if not bf16 else f"""
        #pragma omp for schedule(static)
        for (int r = 0; r < {align(n, 16)}; r++) {{     /* the rows in bfloat16 */
            uint16_t *restrict d = pa + (size_t)r * {kp};
            const float *restrict x = X + (size_t)r * {k};
            for (int q = 0; q < {kp}; q++) d[q] = r < {n} && q < {k} ? vdla_bf16(x[q]) : 0;
        }}"""
    body = f"""
/* {"bfloat16" if bf16 else "int8"} dense {shape.describe()} on AMX tiles */
void NAME{SIGNATURE} {{
{_READY}
    const {el} *restrict X = (const {el} *)in[0];
    {res}
    {el} *restrict y = ({el} *)out_;
    const {at} *restrict wp = (const {at} *)(params + {w_off});
{table_pointers(shape, offsets)}    (void)lim;
    {at} *restrict pa = ({at} *)ws;
    #pragma omp parallel if({parallel})
    {{{copy}{_TILES_BF16 if bf16 else _TILES}
        #pragma omp for collapse(2) schedule(static)
        for (int ob = 0; ob < {obs}; ob++)
        for (int rb = 0; rb < {rbs}; rb++) {{
            const int rows = vdla_min({BLOCK}, {n} - rb * {BLOCK});
            const int cols = vdla_min({BLOCK}, {o} - ob * {BLOCK});
            const {at} *restrict a = pa + (size_t)rb * {BLOCK * kp};
            const {at} *restrict b = wp + (size_t)ob * {kp * BLOCK};
            {_block("a", "b", BLOCK * 4, k, bf16)}{finish}
        }}
        _tile_release();
    }}
}}
"""
    return Kernel(body, params.blob(), inputs, align(align(n, 16) * kp * size), 0,
                  shape.macs, items=rbs * obs if parallel else 1, checks=True)


# --- qconv2d, and conv2d at bfloat16 -----------------------------------------------------

def _folds_rows(shape: ConvShape) -> bool:
    """Whether a tap row of convolution `shape` (its kernel's width of pixels, all
    channels) fits one 64-byte step of k: a few-channel stem, whose rows `_taps_kernel`
    reads a kernel row at a time. Not a 1 x 1 layer: one pixel's few channels would
    leave most of the step zero (MobileNet-v1's first pointwise layer, 32 channels, on
    the VNNI code beside its depthwise neighbour: the model 1.13x faster than folded,
    whole-graph, 15 interleaved rounds on an Intel Xeon with AMX)."""
    return shape.kw > 1 and shape.c * ((shape.kw - 1) * shape.dw + 1) <= K_STEP


def reads_in_place(shape: ConvShape) -> bool:
    """Whether int8 convolution `shape` reads its im2col rows in place (`_taps_kernel`):
    one group, and whole 64-byte steps of input channels (ResNet's body) or a stem whose
    kernel rows fit a step, its outputs whole 64-channel blocks (ResNet's 7 x 7 stem of
    3 channels; not MobileNet's of 32 outputs, half of whose `NCHW64c` block would be
    padding for its depthwise neighbour to convert away)."""
    return shape.int8 and shape.groups == 1 and (
        shape.c % K_STEP == 0 or (_folds_rows(shape) and shape.o % K_STEP == 0))


def _taps_kernel(shape: ConvShape, weights: np.ndarray, bias, node: Node,
                 inputs: tuple[str, ...]) -> Kernel:
    """`qconv_kernel` for a convolution that `reads_in_place`, its input, residual and
    output blocked by 64 channels (``NCHW64c``: a pixel's 64 channels side by side, one
    step of k; `layout`), so that these kernels hand their tensors to each other without
    a transpose. The input is first copied to a zero-padded NHWC image, 64 bytes at a
    time; a row tile of A is then 16 output pixels of one row, read from that image at
    one tap, ``stride x C`` bytes apart, so no im2col rows are written. A work item is
    32 pixels of an output row (two row tiles) by 32 output channels (half a block),
    finished straight into the output; the channels past O are zeroed.

    A stem (`_folds_rows`: too few channels for a step) reads its plain NCHW input, and a
    step is one kernel row: the 64 bytes from a window's first pixel hold its kw pixels'
    channels (the weights zero past them), so a row tile reads it at the window's start,
    ``stride x C`` bytes apart, with kh steps in all."""
    n, c, h, w, o = shape.n, shape.c, shape.h, shape.w, shape.o
    ho, wo, plane = shape.ho, shape.wo, shape.ho * shape.wo
    hp, wp = h + shape.pt + shape.pb, w + shape.pl + shape.pr
    ocb = -(-o // K_STEP)
    dense = DenseShape(n=n * plane, k=c * shape.kh * shape.kw, o=o, dtype=shape.dtype,
                       bias=shape.bias, residual=shape.residual, offset=False,
                       activation=shape.activation)
    w4 = np.asarray(weights)
    wk = w4.transpose(0, 2, 3, 1).reshape(o, dense.k)       # taps, then channels
    folded = c % K_STEP != 0          # a stem: one step a kernel row, its pixels inside
    if folded:
        steps = np.zeros((o, shape.kh, K_STEP), np.int8)
        for j in range(shape.kw):     # pixel j of a row at byte j * dw * C: the rest zero
            steps[:, :, j * shape.dw * c:j * shape.dw * c + c] = w4[:, :, :, j].transpose(
                0, 2, 1)
        taps, cb = [i * shape.dh * wp * c for i in range(shape.kh)], 1
    else:
        steps = wk
        taps = [(i * shape.dh * wp + j * shape.dw) * c
                for i in range(shape.kh) for j in range(shape.kw)]
        cb = c // K_STEP
    depth = len(taps) * cb * K_STEP
    params = Params()
    w_off = params.add(pack_weights(steps.reshape(o, depth)))
    offsets = tables(dense, node, wk, bias, params, align(o, K_STEP))
    chunks, halves = -(-wo // BLOCK), 2 * ocb
    items = n * ho * chunks
    parallel = dense.macs >= PARALLEL_MACS
    lda = shape.sw * c
    image = n * hp * wp * c
    slack = BLOCK * lda + K_STEP          # what a row tile past the last pixel reads
    ep = Epilogue.of(dense, 16)
    at = (f"(((size_t)b * {ocb} + ob / 2) * {plane} + p0 + r) * {K_STEP} + (ob % 2) * "
          f"{BLOCK}")
    finish = _finish(ep, Operands.lanes(ep, "o"), f"Y + {at} + 16 * u",
                     res=f"R + {at} + 16 * u",
                     before=f"\n                    const int o = ob * {BLOCK} + 16 * u;")
    copy = (f"""for (int ch = 0; ch < {c}; ch++) {{      /* NCHW in */
                const int8_t *restrict s = X + (((size_t)b * {c} + ch) * {h} + y) * {w};
                for (int x = 0; x < {w}; x++) d[({shape.pl} + x) * {c} + ch] = s[x];
            }}""" if folded else
            f"memcpy(d + {shape.pl * c}, X + ((size_t)b * {h} + y) * {w * c}, {w * c});"
            if cb == 1 else f"""for (int s = 0; s < {cb}; s++)
                for (int x = 0; x < {w}; x++)
                    memcpy(d + ({shape.pl} + x) * {c} + {K_STEP} * s,
                           X + ((((size_t)b * {cb} + s) * {h} + y) * {w} + x) * {K_STEP}, {K_STEP});""")
    body = f"""
/* int8 convolution {shape.describe()} on AMX tiles, {"NCHW" if folded else "NCHW64c"} in and NCHW64c out, its im2col
   rows ({n * plane} x {depth}) read in place from a padded NHWC copy: {len(taps)} {"kernel rows" if folded else "taps"} of {cb} steps */
void NAME{SIGNATURE} {{
{_READY}
    static const long off[{len(taps)}] = {{{", ".join(map(str, taps))}}};
    const int8_t *restrict X = (const int8_t *)in[0];
    {"const int8_t *restrict R = (const int8_t *)in[1];" if shape.residual else ""}
    int8_t *restrict Y = (int8_t *)out_;
    const int8_t *restrict wp = (const int8_t *)(params + {w_off});
{table_pointers(dense, offsets)}    (void)lim;
    int8_t *restrict xt = (int8_t *)ws;
    #pragma omp parallel if({int(parallel)})
    {{
        #pragma omp single nowait
        memset(xt + {image}, 0, {slack});
        #pragma omp for schedule(static)
        for (int q = 0; q < {n * hp}; q++) {{     /* the padded image, a row of channels a pixel */
            int8_t *restrict d = xt + (size_t)q * {wp * c};
            const int b = q / {hp}, y = q % {hp} - {shape.pt};
            if (y < 0 || y >= {h}) {{ memset(d, 0, {wp * c}); continue; }}
            memset(d, 0, {shape.pl * c}); memset(d + {(shape.pl + w) * c}, 0, {shape.pr * c});
            {copy}
        }}{_TILES}
        #pragma omp for collapse(2) schedule(static)
        for (int ob = 0; ob < {halves}; ob++)
        for (int mb = 0; mb < {items}; mb++) {{
            const int b = mb / {ho * chunks}, oy = mb / {chunks} % {ho};
            const int ox0 = mb % {chunks} * {BLOCK};
            const int rows = vdla_min({BLOCK}, {wo} - ox0);
            const int cols = vdla_min({BLOCK}, {o} - ob * {BLOCK});
            const size_t p0 = (size_t)oy * {wo} + ox0;     /* the block's first pixel */
            if (cols < {BLOCK})                          /* zero past O */
                for (int r = 0; r < rows; r++)
                    memset(Y + {at} + vdla_max(cols, 0), 0, {BLOCK} - vdla_max(cols, 0));
            if (cols <= 0) continue;
            const int8_t *restrict a = xt + (((size_t)b * {hp} + oy * {shape.sh}) * {wp} + (size_t)ox0 * {shape.sw}) * {c};
            const int8_t *restrict bw = wp + (size_t)ob * {depth * BLOCK};
            switch ((rows > 16) * 2 + (cols > 16)) {{ {" ".join(
                f"case {2 * (rt - 1) + ct - 1}: vdla_amx_taps_block(a, {lda}, off, {len(taps)}, "
                f"{cb}, bw, {BLOCK * 4}, {rt}, {ct}, c); break;"
                for rt in (1, 2) for ct in (1, 2))} }}{finish}
        }}
        _tile_release();
    }}
}}
"""
    return Kernel(body, params.blob(), inputs, align(image + slack), 0, dense.macs,
                  in_blocks=(0 if folded else K_STEP,) + (K_STEP,) * (len(inputs) - 1),
                  out_block=K_STEP,
                  items=items * halves if parallel else 1, checks=True)


def qconv_kernel(shape: ConvShape, weights: np.ndarray, bias, node: Node,
                 inputs: tuple[str, ...]) -> Kernel:
    """The tile kernel of convolution `shape` (one group; int8, or float32 computed in
    bfloat16: the bf16 precision) with `weights` (O, C, kh, kw) and `bias` (or None): the
    GEMM of its im2col rows; `_taps_kernel`'s where it `reads_in_place`, else NCHW in
    and out on copied rows: the input copied to one row of channels per pixel (NHWC; at
    bf16 rounded on the way), each tap of an im2col row one copy of C values, taps in
    (ky, kx) order with the channels inside (the weights' order), the rows written
    straight into A's tile layout (K64 bytes apart, zero past K and the last row); a 1 x 1
    layer of stride 1 without padding has no im2col step. The block loop and epilogue
    are `qdense_kernel`'s on (pixel, channel) rows (a residual copied to that order
    first); the rows then go back to NCHW."""
    if shape.groups != 1:
        raise ValueError(f"the tile convolution takes one group, not {shape.groups}")
    if reads_in_place(shape):
        return _taps_kernel(shape, weights, bias, node, inputs)
    bf16 = not shape.int8
    n, c, h, w, o = shape.n, shape.c, shape.h, shape.w, shape.o
    plane = shape.ho * shape.wo
    m, depth = n * plane, c * shape.kh * shape.kw
    size = 2 if bf16 else 1                     # bytes of an A and B value
    kp, mp = align(depth, K_STEP // size), align(m, 16)     # kp: values of a row
    dense = DenseShape(n=m, k=depth, o=o, dtype=shape.dtype, bias=shape.bias,
                       residual=shape.residual, offset=False,   # signed x signed
                       activation=shape.activation)
    wk = np.asarray(weights).transpose(0, 2, 3, 1).reshape(o, depth)   # taps, then channels
    params = Params()
    w_off = params.add(pack_bf16(wk) if bf16 else pack_weights(wk))
    offsets = tables(dense, node, wk, bias, params, align(o, BLOCK))
    rbs, obs = -(-m // BLOCK), -(-o // BLOCK)
    parallel = int(dense.macs >= PARALLEL_MACS)
    ep = Epilogue.of(dense, 16)
    direct = (shape.kh == shape.kw == shape.sh == shape.sw == 1
              and shape.pt == shape.pl == shape.pb == shape.pr == 0)
    el, at = ("float", "uint16_t") if bf16 else ("int8_t", "int8_t")   # NCHW's, A's
    esz = 4 if bf16 else 1
    a_bytes = align(mp * kp * size)
    x_bytes = 0 if direct else align(n * h * w * c * size)
    t_bytes = align(m * o * esz)
    pitch = kp if direct else c      # values from one pixel's channels to the next's
    read = "vdla_bf16(s[x])" if bf16 else "s[x]"
    res = ""
    if shape.residual:
        res = f"""
        #pragma omp for schedule(static)
        for (int q = 0; q < {n * o}; q++)     /* the residual to (pixel, channel) rows */
            for (int p = 0; p < {plane}; p++)
                rt[((size_t)(q / {o}) * {plane} + p) * {o} + q % {o}] = R[(size_t)q * {plane} + p];"""
    rows = "" if direct else f"""
        #pragma omp for schedule(static)
        for (int r = 0; r < {mp}; r++) {{     /* the im2col rows */
            {at} *restrict d = pa + (size_t)r * {kp};
            if (r >= {m}) {{ memset(d, 0, {kp * size}); continue; }}
            const int b = r / {plane}, oy = r % {plane} / {shape.wo}, ox = r % {shape.wo};
            for (int i = 0; i < {shape.kh}; i++) {{
                const int iy = oy * {shape.sh} - {shape.pt} + i * {shape.dh};
                for (int j = 0; j < {shape.kw}; j++, d += {c}) {{
                    const int ix = ox * {shape.sw} - {shape.pl} + j * {shape.dw};
                    if (iy < 0 || iy >= {h} || ix < 0 || ix >= {w}) memset(d, 0, {c * size});
                    else memcpy(d, xt + (((size_t)b * {h} + iy) * {w} + ix) * {c}, {c * size});
                }}
            }}
            memset(d, 0, {(kp - depth) * size});
        }}"""
    tail = (f"""
            for (int x = 0; x < {w}; x++)        /* zero past the channels */
                memset(xt + ((size_t)q * {w} + x) * {pitch} + {c}, 0, {(kp - c) * size});"""
            if direct and kp > c else "")
    pad_rows = (f"""
        #pragma omp for schedule(static)
        for (int r = {m}; r < {mp}; r++) memset(pa + (size_t)r * {kp}, 0, {kp * size});"""
                if direct and mp > m else "")
    finish = _finish(ep, Operands.lanes(ep, "o"), "yt + row + o", res="rt + row + o",
                     before=f"\n                    const int o = ob * {BLOCK} + 16 * u; "
                            f"const size_t row = (size_t)(rb * {BLOCK} + r) * {o};")
    what = "bfloat16 " if bf16 else "int8 "
    body = f"""
/* {what}convolution {shape.describe()} on AMX tiles: {m} im2col rows x {depth} @ {depth} x {o} */
void NAME{SIGNATURE} {{
{_READY}
    const {el} *restrict X = (const {el} *)in[0];
    {f"const {el} *restrict R = (const {el} *)in[1];" if shape.residual else ""}
    {el} *restrict Y = ({el} *)out_;
    const {at} *restrict wp = (const {at} *)(params + {w_off});
{table_pointers(dense, offsets)}    (void)lim;
    {at} *restrict pa = ({at} *)ws;
    {at} *restrict xt = {"pa" if direct else f"({at} *)(ws + {a_bytes})"};
    {el} *restrict yt = ({el} *)(ws + {a_bytes + x_bytes});
    {el} *restrict rt = ({el} *)(ws + {a_bytes + x_bytes + t_bytes});
    (void)rt;
    #pragma omp parallel if({parallel})
    {{
        #pragma omp for schedule(static)
        for (int q = 0; q < {n * h}; q++) {{      /* the input, one row of channels a pixel */
            const int b = q / {h}, y = q % {h};
            for (int ch = 0; ch < {c}; ch++) {{
                const {el} *restrict s = X + (((size_t)b * {c} + ch) * {h} + y) * {w};
                for (int x = 0; x < {w}; x++) xt[((size_t)q * {w} + x) * {pitch} + ch] = {read};
            }}{tail}
        }}{pad_rows}{rows}{res}{_TILES_BF16 if bf16 else _TILES}
        #pragma omp for collapse(2) schedule(static)
        for (int ob = 0; ob < {obs}; ob++)
        for (int rb = 0; rb < {rbs}; rb++) {{
            const int rows = vdla_min({BLOCK}, {m} - rb * {BLOCK});
            const int cols = vdla_min({BLOCK}, {o} - ob * {BLOCK});
            const {at} *restrict a = pa + (size_t)rb * {BLOCK * kp};
            const {at} *restrict b = wp + (size_t)ob * {kp // (4 // size) * BLOCK * (4 // size)};
            {_block("a", "b", BLOCK * 4, depth, bf16)}{finish}
        }}
        _tile_release();
        #pragma omp for schedule(static)
        for (int q = 0; q < {n * o}; q++)      /* (pixel, channel) rows back to NCHW */
            for (int p = 0; p < {plane}; p++)
                Y[(size_t)q * {plane} + p] = yt[((size_t)(q / {o}) * {plane} + p) * {o} + q % {o}];
    }}
}}
"""
    shared = a_bytes + x_bytes + t_bytes + (t_bytes if shape.residual else 0)
    return Kernel(body, params.blob(), inputs, shared, 0, dense.macs,
                  items=rbs * obs if parallel else 1, checks=True)
