"""The CPU target's elementwise ops compiled to C: qadd, add, mul, relu, clip,
quantize and dequantize (see `vdla.compiler.targets.cpu.ops`)."""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference.integer import (INT8_MAX, INT8_MIN, requantize)
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params
from vdla.compiler.targets.cpu.opbase import (PARALLEL_MIN, CTYPES, RQ_HELPER,
                                             Sources, dtype_refusal, indent,
                                             is_per_channel, kernel, parallel_nest,
                                             rq_refusal, rq_tables, size)

__all__ = ["binary_kernel", "binary_refusal", "quantize_kernel", "unary_kernel", "unary_refusal"]


# --- elementwise ---------------------------------------------------------------------------

def _view(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """The (N, C, P) view of an output of `shape` (rank < 2: (1, 1, all))."""
    if len(shape) < 2:
        return 1, 1, size(shape)
    return shape[0], shape[1], size(shape[2:])


def _broadcast(shape: tuple[int, ...], out: tuple[int, ...]) -> tuple[str, int, int]:
    """How an operand of `shape` spreads over an output of `out` (numpy broadcasting),
    as (kind, sn, sc): ``full`` (one value per output element), ``sample`` (one value
    per element of a sample, repeated over the batch: shape (1, C, ...)), ``scalar``, or
    ``plane`` (constant over the (N, C, P) view's P: its value at (n, c) is element
    ``n * sn + c * sc``). Raises ValueError for any other broadcast."""
    padded = (1,) * (len(out) - len(shape)) + tuple(shape)
    if padded == tuple(out):
        return "full", 0, 0
    if size(shape) == 1:
        return "scalar", 0, 0
    if len(out) >= 2 and padded[0] == 1 and padded[1:] == tuple(out[1:]):
        return "sample", 0, 0
    if len(out) >= 2 and all(d == 1 for d in padded[2:]):
        return "plane", (padded[1] if padded[0] > 1 else 0), (1 if padded[1] > 1 else 0)
    axes = [k for k, (d, o) in enumerate(zip(padded, out)) if d != o]
    raise ValueError(f"shape {tuple(shape)} broadcasts over {tuple(out)} along axes {axes}; "
                     "the CPU target broadcasts an operand only as a scalar, over the batch "
                     "(shape (1, C, ...)) or as one value per batch and/or channel (shape "
                     "(N or 1, C or 1, 1, ...))")


def binary_refusal(node: Node, graph: Graph) -> str | None:
    """add/mul (float32) and qadd (int8): the operands' broadcast and, for qadd, the
    requantization parameters and bounds."""
    allowed = ("int8",) if node.op == "qadd" else ("float32",)
    bad = dtype_refusal(node, graph, allowed)
    if bad:
        return bad
    out = graph.tensors[node.outputs[0]].shape
    shapes = [graph.tensors[t].shape for t in node.inputs]
    kinds = []
    for name, shape in zip(node.inputs, shapes):
        try:
            kinds.append(_broadcast(shape, out))
        except ValueError as e:
            return f"{node.op} node {node.name!r}: operand {name!r} of {e}"
    if all(kind != "full" for kind, _, _ in kinds):
        return (f"{node.op} node {node.name!r}: operand shapes {shapes[0]} and {shapes[1]} "
                f"both broadcast to {out}; the CPU target needs one operand of the output's "
                "shape")
    if node.op != "qadd":
        return None
    a = node.attrs
    lo, hi = int(a["out_min"]), int(a["out_max"])
    if not INT8_MIN <= lo <= hi <= INT8_MAX:
        return (f"qadd node {node.name!r}: out_min {lo} and out_max {hi} must satisfy "
                "-128 <= out_min <= out_max <= 127")
    for side, name, shape in zip("ab", node.inputs, shapes):
        m, s = a[f"{side}_multiplier"], a[f"{side}_shift"]
        bad = rq_refusal(node, m, s, shape)
        if bad:
            return bad
        if is_per_channel(m, s) and len(shape) != len(out):
            return (f"qadd node {node.name!r}: operand {name!r} of shape {shape} has "
                    f"per-channel parameters along its axis 1, which is not the output's "
                    f"channel axis ({out}); the CPU target needs the output's rank")
    return None


def binary_kernel(node: Node, graph: Graph) -> Kernel:
    """``add``/``mul`` (float32) and ``qadd`` (int8) over the (N, C, P) view."""
    out = graph.tensors[node.outputs[0]].shape
    quant = node.op == "qadd"
    a = node.attrs
    spreads = [_broadcast(graph.tensors[t].shape, out) for t in node.inputs]
    per_channel_params = quant and any(
        is_per_channel(a[f"{v}_multiplier"], a[f"{v}_shift"]) for v in "ab")
    n, c, p = _view(out)
    if not per_channel_params and all(kind in ("full", "scalar") for kind, _, _ in spreads):
        n, c, p = 1, 1, size(out)          # nothing depends on the channel: one run
    params = Params()
    sources = Sources(graph, params)
    decls, pointers, values = [], [], []
    for v, name, (kind, sn, sc) in zip("ab", node.inputs, spreads):
        index = {"full": "base + j", "sample": f"(size_t)c * {p} + j"}.get(kind,
                                                                           f"n * {sn} + c * {sc}")
        elem = f"{v}[{index}]"
        const = graph.constant(name)
        if not quant:
            pointers.append(f"const float *restrict {v} = {sources.pointer(name, 'float')};")
            value = elem
        elif const is not None:
            # A constant operand is requantized here, by the reference's own function.
            pre = requantize(const.astype(np.int32), a[f"{v}_multiplier"], a[f"{v}_shift"],
                             axis=1)
            pointers.append(f"const int32_t *restrict {v} = "
                            f"{sources.pointer(name, 'int32_t', pre)};")
            value = elem
        else:
            pointers.append(f"const int8_t *restrict {v} = {sources.pointer(name, 'int8_t')};")
            off = params.add(rq_tables(a[f"{v}_multiplier"], a[f"{v}_shift"], c))
            pointers.append(f"const uint32_t *restrict {v}q = (const uint32_t *)(params + "
                            f"{off});")
            decls.append(f"const uint32_t {v}m = {v}q[c], {v}l = {v}q[{c} + c], "
                         f"{v}r = {v}q[{2 * c} + c], {v}s = {v}q[{3 * c} + c]; (void){v}m;")
            # without a multiplier the literal 1 lets the compiler drop the multiply
            mul = "1u" if a[f"{v}_multiplier"] is None else f"{v}m"
            value = f"NAME_rq((int32_t){elem}, {mul}, {v}l, {v}r, {v}s)"
        if kind in ("full", "sample"):
            values.append(value)
        else:
            # constant over P: loaded (and requantized) once per (n, c)
            decls.append(f"const {'int32_t' if quant else 'float'} {v}v = {value};")
            values.append(f"{v}v")
    if quant:
        off = params.add(np.array([a["out_min"], a["out_max"]], np.int32))
        pointers.append(f"const int32_t lo = *(const int32_t *)(params + {off}), "
                        f"hi = *(const int32_t *)(params + {off + 4});")
        stmt = (f"{{ const int32_t v = (int32_t)((uint32_t)({values[0]}) + "
                f"(uint32_t)({values[1]})); "
                "y[base + j] = (int8_t)(v < lo ? lo : v > hi ? hi : v); }")
        t_out, helper = "int8_t", RQ_HELPER
    else:
        op = "+" if node.op == "add" else "*"
        stmt = f"y[base + j] = {values[0]} {op} {values[1]};"
        t_out, helper = "float", ""
    body = f"""{helper}
/* {node.op} {tuple(graph.tensors[t].shape for t in node.inputs)} -> {out} */
void NAME{SIGNATURE} {{
    {indent(chr(10).join(pointers), 4)}
    {t_out} *restrict y = ({t_out} *)out_;
    (void)ws;
    {indent(parallel_nest(n, c, p, decls, stmt), 4)}
}}
"""
    return kernel(body, params, sources)


def unary_refusal(node: Node, graph: Graph) -> str | None:
    x = graph.tensors[node.inputs[0]].dtype
    if node.op == "relu":
        return dtype_refusal(node, graph, ("int8", "float32"))
    if node.op == "clip":
        return dtype_refusal(node, graph, ("float32",))
    if node.op == "quantize":
        if node.attrs["dtype"] != "int8":
            return (f"quantize node {node.name!r} to {node.attrs['dtype']!r}: the CPU target "
                    "quantizes to 'int8'")
        if x != "float32":
            return f"quantize node {node.name!r} of {x} data: the CPU target takes float32"
        return None
    if x not in ("int8", "int32"):
        return f"dequantize node {node.name!r} of {x} data: the CPU target takes int8 or int32"
    return None


def unary_kernel(node: Node, graph: Graph) -> Kernel:
    """``relu``, ``clip``, ``dequantize``: one flat loop."""
    params = Params()
    sources = Sources(graph, params)
    t_in = CTYPES[graph.tensors[node.inputs[0]].dtype]
    t_out = CTYPES[graph.tensors[node.outputs[0]].dtype]
    x = sources.pointer(node.inputs[0], t_in)
    total = size(graph.tensors[node.outputs[0]].shape)
    consts = ""
    a = node.attrs
    if node.op == "relu":
        # as numpy's maximum(x, 0): +0.0 for -0.0, NaN passed through
        stmt = "y[base + j] = x[base + j] <= 0 ? 0 : x[base + j];"
    elif node.op == "clip":
        lines = ["float v = x[base + j];"]
        for key, cmp in (("min", "<"), ("max", ">")):
            if a[key] is not None:
                off = params.add(np.array([a[key]], np.float32))
                consts += f"const float {key}v = *(const float *)(params + {off});\n"
                lines.append(f"v = v {cmp} {key}v ? {key}v : v;")
        stmt = "{ " + " ".join(lines + ["y[base + j] = v;"]) + " }"
    else:
        off = params.add(np.array([float(a["scale"])], np.float64))
        consts = f"const double scale = *(const double *)(params + {off});\n"
        stmt = "y[base + j] = (float)((double)x[base + j] * scale);"
    body = f"""
/* {node.op} {t_in} -> {t_out}, {total} elements */
void NAME{SIGNATURE} {{
    const {t_in} *restrict x = {x};
    {t_out} *restrict y = ({t_out} *)out_;
    {indent(consts, 4)}(void)ws;
    {indent(parallel_nest(1, 1, total, [], stmt), 4)}
}}
"""
    return kernel(body, params, sources)


#: Eight quantized values at a time. With AVX2, in intrinsics: four doubles a vector,
#: clamped, floored (`vroundpd`) and converted. Otherwise in GCC vector extensions, the
#: floor spelled out (truncate, then subtract one where that rounded up), since gcc does
#: not vectorize floor() under the default -ftrapping-math, nor the scalar
#: clamp-then-floor (its jump threading leaves branches). (On AVX2 the vector-extension
#: form came out as scalar compares inside the OpenMP loop: ResNet's 3x224x224 input took
#: 212 us in the whole-graph runner at 2 threads, 47 us in intrinsics.) Clamping first is
#: exact (floor commutes with clamping to the integers -128 and 127) and keeps the
#: conversion in int32's range. A NaN has no defined result, as in the reference (numpy's
#: cast of NaN to int8).
_QUANTIZE_HELPER = """
#if defined(VDLA_X86) && defined(__AVX2__)
VDLA_INLINE __m128i NAME_q4(__m128 x, __m256d scale) {
    const __m256d v = _mm256_add_pd(_mm256_div_pd(_mm256_cvtps_pd(x), scale),
                                    _mm256_set1_pd(0.5));
    const __m256d c = _mm256_min_pd(_mm256_max_pd(v, _mm256_set1_pd(-128.0)),
                                    _mm256_set1_pd(127.0));
    return _mm256_cvtpd_epi32(_mm256_floor_pd(c));
}
VDLA_INLINE vi8 NAME_q8(vf8 x, double scale) {
    const __m256d s = _mm256_set1_pd(scale);
    const __m256 xf = (__m256)x;
    return (vi8)_mm256_set_m128i(NAME_q4(_mm256_extractf128_ps(xf, 1), s),
                                 NAME_q4(_mm256_castps256_ps128(xf), s));
}
#else
typedef double NAME_vd __attribute__((vector_size(64)));
typedef int64_t NAME_vl __attribute__((vector_size(64)));
static inline vi8 NAME_q8(vf8 x, double scale) {
    const NAME_vd lo = {VDLA_REP8(-128.0)}, hi = {VDLA_REP8(127.0)}, one = {VDLA_REP8(1.0)};
    NAME_vd v = __builtin_convertvector(x, NAME_vd) / scale + 0.5;
    NAME_vl m = v < lo;
    v = (NAME_vd)(((NAME_vl)v & ~m) | ((NAME_vl)lo & m));
    m = v > hi;
    v = (NAME_vd)(((NAME_vl)v & ~m) | ((NAME_vl)hi & m));
    const NAME_vd t = __builtin_convertvector(__builtin_convertvector(v, vi8), NAME_vd);
    return __builtin_convertvector(t - (NAME_vd)((NAME_vl)one & (t > v)), vi8);
}
#endif
"""


def quantize_kernel(node: Node, graph: Graph) -> Kernel:
    """``quantize`` float32 -> int8: ``clip(floor(double(x) / scale + 0.5), -128, 127)``
    exactly as the reference computes it (a double division and an add, which no
    contraction fuses; no reciprocal), eight values at a time, then the scalar rest."""
    params = Params()
    sources = Sources(graph, params)
    x = sources.pointer(node.inputs[0], "float")
    total = size(graph.tensors[node.outputs[0]].shape)
    off = params.add(np.array([float(node.attrs["scale"])], np.float64))
    pragma = "#pragma omp parallel for schedule(static)" if total >= PARALLEL_MIN else ""
    body = f"""{_QUANTIZE_HELPER}
/* quantize float -> int8_t, {total} elements */
void NAME{SIGNATURE} {{
    const float *restrict x = {x};
    int8_t *restrict y = (int8_t *)out_;
    const double scale = *(const double *)(params + {off});
    (void)ws;
    {pragma}
    for (size_t b = 0; b < {total // 8}; b++)
        vi8_store_s8(y + b * 8, NAME_q8(vf8_load(x + b * 8), scale));
    for (size_t j = {total // 8 * 8}; j < {total}; j++) {{
        const double v = floor((double)x[j] / scale + 0.5);
        y[j] = (int8_t)(int32_t)(v < {INT8_MIN}.0 ? {INT8_MIN}.0
                                 : v > {INT8_MAX}.0 ? {INT8_MAX}.0 : v);
    }}
}}
"""
    return kernel(body, params, sources)


