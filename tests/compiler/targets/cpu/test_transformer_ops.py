"""The CPU target's kernels of sequence models (transformers) against the reference, on
one-node graphs of tiny shapes, on every instruction set this machine runs (avx512vnni
where the machine has it, avx2, portable): batched float matmul (3-D, 4-D, broadcast
batch axes, odd sizes), softmax, layer_norm, gelu (erf and tanh), the fused attention
(mask, causal, broadcast mask), dense layers of many rows (the row-tiled GEMM, with GELU
and residual; int8 on AVX2 through each of its reductions: the sign trick, int16 pairs,
x + 128 in nibbles, on random operands and on extreme ones over up to 4096 products whose
exact sums the output shows), the layout and elementwise ops (transpose, slice, expand, where, cast,
comparisons, sub/div/pow, add/mul with any broadcast, unary math, reductions), gather
(with negative indices); and int8: qmatmul (transpose_b, broadcast batches, odd K, both
requantization modes, fewer and more than 4 rows, -128 x -128 over 4098 products), qsoftmax, qlayer_norm, qgelu and qattention (mask, causal),
which must match the integer definitions bit for bit. Float results are checked within
1e-5 of the largest reference value (the data movement and once-rounded ops exactly).

Every case of one ISA is built into one library (one compile, cached by content hash).
Then: a bad gather index is a clear error from the op-by-op session and the whole-graph
runner, never an out-of-bounds read; and a tiny GPT runs whole on the target, float32
within tolerance and int8 bit-exactly."""

from __future__ import annotations

import numpy as np
import pytest

from vdla.compiler import Graph, run_reference
from vdla.compiler.ir.tensor import DTYPES
from vdla.compiler.reference.integer_transformer import (gelu_params, layer_norm_params,
                                                         softmax_params)
from vdla.compiler.targets.cpu.build import machine_features
from vdla.compiler.targets.cpu.isa import get as get_isa
from vdla.compiler.targets.cpu.library import build_kernels, call, load
from vdla.compiler.targets.cpu.lower import node_kernel

from op_cases import one_node

from .test_cpu_ops import ISAS  # the instruction sets this machine's compiler offers

THREADS = 2
TOLERANCE = 1e-5

CASES: dict = {}


def case(name: str, exact: bool = False):
    def register(fn):
        CASES[name] = (fn, exact)
        return fn
    return register


def _data(rng, shape, dtype):
    if dtype == "int8":
        return rng.integers(-128, 128, shape).astype(np.int8)
    if dtype == "bool":
        return rng.random(shape) < 0.3
    if dtype in ("int64", "int32"):
        return rng.integers(-5, 5, shape).astype(dtype)
    return rng.standard_normal(shape).astype(np.float32)


def graph(op, inputs, seed=0, **attrs):
    """One `op` node (`op_cases.one_node`) with `_data`'s values, seeded."""
    return one_node(op, inputs, np.random.default_rng(seed), fill=_data, **attrs)


F = "float32"
R = np.random.default_rng(7)

# --- float -------------------------------------------------------------------------------

for i, (a, b) in enumerate([((5, 7), (7, 9)), ((2, 3, 13, 17), (2, 3, 17, 21)),
                            ((1, 3, 6, 8), (2, 1, 8, 16)), ((3, 10, 33), (33, 40)),
                            ((2, 9, 16), (16, 3))]):
    case(f"matmul{i}")(lambda a=a, b=b: graph("matmul", [(a, F), (b, F)]))
case("matmul_const_b")(lambda: graph("matmul", [((2, 7, 12), F),
                                                 R.standard_normal((12, 10)).astype(F)]))
for shape in [(3, 5), (2, 3, 37), (1, 2, 9, 64)]:
    case(f"softmax{shape}")(lambda s=shape: graph("softmax", [(s, F)], axis=-1))
    case(f"layer_norm{shape}")(lambda s=shape: graph(
        "layer_norm", [(s, F), R.standard_normal(s[-1]).astype(F),
                       R.standard_normal(s[-1]).astype(F)], epsilon=1e-3))
    for approximate in ("none", "tanh"):
        case(f"gelu_{approximate}{shape}")(lambda s=shape, a=approximate: graph(
            "gelu", [(s, F)], approximate=a))
case("layer_norm_no_bias")(lambda: graph("layer_norm", [((4, 20), F),
                                                        R.standard_normal(20).astype(F)]))
ATTENTION = [  # (B, H, S, T, D, Dv, mask shape, causal)
    (1, 2, 5, 5, 8, 8, None, False), (2, 3, 7, 9, 13, 11, (2, 1, 1, 9), False),
    (1, 2, 16, 16, 16, 16, None, True), (1, 2, 6, 10, 8, 17, (1, 1, 6, 10), True),
    # blocks of query rows with a partial last one; Dv of two, one and part of a vector
    (1, 3, 13, 21, 24, 40, (1, 1, 13, 21), True), (2, 2, 20, 37, 16, 28, None, False)]
for i, (b, h, s, t, d, dv, mask, causal) in enumerate(ATTENTION):
    def make_attention(b=b, h=h, s=s, t=t, d=d, dv=dv, mask=mask, causal=causal):
        ins = [((b, h, s, d), F), ((b, h, t, d), F), ((b, h, t, dv), F)]
        if mask:
            m = np.where(np.random.default_rng(1).random(mask) < 0.3, -1e4, 0.0)
            ins.append(m.astype(F))
        return graph("attention", ins, scale=d ** -0.5, causal=causal)
    case(f"attention{i}")(make_attention)

    def make_qattention(b=b, h=h, s=s, t=t, d=d, dv=dv, mask=mask, causal=causal):
        ins = [((b, h, s, d), "int8"), ((b, h, t, d), "int8"), ((b, h, t, dv), "int8")]
        if mask:
            ins.append((mask, "bool"))
        return graph("qattention", ins, causal=causal, qk_shift=(9,), qk_out_min=-128,
                     qk_out_max=127, softmax_params=softmax_params(0.05, 0.5),
                     pv_multiplier=300, pv_shift=(14,), pv_out_min=-120, pv_out_max=127)
    case(f"qattention{i}", exact=True)(make_qattention)

for n, k, o in [(7, 37, 11), (32, 30, 50)]:
    w, bias = R.standard_normal((o, k)).astype(F), R.standard_normal(o).astype(F)
    for act in (None, "gelu", "gelu_tanh"):
        case(f"dense{n}x{k}x{o}_{act}")(lambda n=n, k=k, w=w, bias=bias, act=act: graph(
            "dense", [((n, k), F), w, bias], activation=act))
    case(f"dense{n}x{k}x{o}_residual")(lambda n=n, k=k, o=o, w=w, bias=bias: graph(
        "dense", [((n, k), F), w, bias, ((n, o), F)]))
    wq = R.integers(-128, 128, (o, k)).astype(np.int8)
    bq = R.integers(-9000, 9000, o).astype(np.int32)
    case(f"qdense{n}x{k}x{o}", exact=True)(lambda n=n, k=k, wq=wq, bq=bq: graph(
        "qdense", [((n, k), "int8"), wq, bq], multiplier=(3001,), shift=(20,)))
    case(f"qdense{n}x{k}x{o}_residual", exact=True)(lambda n=n, k=k, o=o, wq=wq, bq=bq: graph(
        "qdense", [((n, k), "int8"), wq, bq, ((n, o), "int8")], shift=(8,),
        residual_shift=0))

# Panels of weights past `dense._PREFETCH_MIN` bytes on every vector width: each row
# block's call prefetches its share of the next panel (test_large_panels_prefetch).
_W700 = R.standard_normal((130, 700)).astype(F)
case("dense20x700x130_residual")(lambda: graph(
    "dense", [((20, 700), F), _W700, R.standard_normal(130).astype(F), ((20, 130), F)]))

# The quantizer's weights ([-127, 127]): on AVX2 the sign trick (`dense.int8_path`); the
# ones above hold -128 and take the int16 ("wide") and nibble ("offset") paths.
for n, k, o in [(1, 37, 11), (3, 8, 9), (7, 37, 11), (32, 30, 50), (13, 66, 17),
                (20, 2100, 70)]:
    wq = R.integers(-127, 128, (o, k)).astype(np.int8)
    bq = R.integers(-9000, 9000, o).astype(np.int32)
    case(f"qdense_sign{n}x{k}x{o}", exact=True)(lambda n=n, k=k, wq=wq, bq=bq: graph(
        "qdense", [((n, k), "int8"), wq, bq], multiplier=(3001,), shift=(20,)))
    case(f"qdense_sign{n}x{k}x{o}_residual", exact=True)(
        lambda n=n, k=k, o=o, wq=wq, bq=bq: graph(
            "qdense", [((n, k), "int8"), wq, bq, ((n, o), "int8")], shift=(8,),
            residual_shift=0, out_min=-100, out_max=90))

_EXTREME_X = {  # one row of activations over k, repeated on every row
    "neg128": lambda k: np.full(k, -128),
    "alternating": lambda k: np.where(np.arange(k) % 2, 127, -128),
    "mixed": lambda k: np.random.default_rng(k).choice([-128, -127, -1, 0, 1, 127], k)}


def _extreme_weights(o, k):
    """Columns of +127, of -127, alternating, random +-127 and random in [-127, 127]."""
    rng = np.random.default_rng(o + k)
    cols = [np.full(k, 127), np.full(k, -127), np.where(np.arange(k) % 2, -127, 127)]
    cols += [rng.choice([-127, 127], k) for _ in range(o - 5)]
    cols += [rng.integers(-127, 128, k) for _ in range(2)]
    return np.stack(cols).astype(np.int8)


def extreme_dense(pattern, k, n=7, o=19):
    """int8 dense of extreme operands (every pair sum of vpmaddubsw at its bound,
    +-2 * 128 * 127) over up to 4096 products, its int32 sums made visible: the bias
    cancels each output's exact sum to a small target and the shift is 0, so an error
    of one in any accumulator changes the output."""
    x = _EXTREME_X[pattern](k).astype(np.int64)
    w = _extreme_weights(o, k)
    target = np.random.default_rng(1).integers(-100, 100, o)
    bias = (target - w.astype(np.int64) @ x).astype(np.int32)
    g, _ = graph("qdense", [((n, k), "int8"), w, bias], shift=(0,))
    return g, {"x0": np.tile(x.astype(np.int8), (n, 1))}


for pattern in _EXTREME_X:
    for k in (4096, 4093, 768):
        case(f"qdense_extreme_{pattern}_k{k}", exact=True)(
            lambda p=pattern, k=k: extreme_dense(p, k))

# layout and elementwise ops: exact (data movement, float values rounded once)
EXACT = {
    "transpose": lambda: graph("transpose", [((2, 5, 3, 4), F)], perm=(0, 2, 1, 3)),
    "transpose_int8": lambda: graph("transpose", [((2, 5, 3, 4), "int8")], perm=(3, 1, 0, 2)),
    "transpose_reversed": lambda: graph("transpose", [((2, 5, 3), F)]),
    "slice_steps": lambda: graph("slice", [((3, 10, 7), F)], starts=(1, 2), ends=(9, 7),
                                 axes=(1, 2), steps=(2, 3)),
    "slice_int8": lambda: graph("slice", [((6, 24), "int8")], starts=(8,), ends=(16,),
                                axes=(1,), steps=(1,)),
    "expand": lambda: graph("expand", [((1, 1, 5), F)], shape=(2, 3, 5)),
    "expand_rank": lambda: graph("expand", [((3, 1), "int64")], shape=(2, 3, 4)),
    "where": lambda: graph("where", [((1, 1, 4, 4), "bool"), ((2, 3, 4, 4), F),
                                     np.array([-1e9], F)]),
    "cast_float_int64": lambda: graph("cast", [((3, 7), F)], dtype="int64"),
    "cast_int64_float": lambda: graph("cast", [((3, 7), "int64")], dtype="float32"),
    "cast_int64_bool": lambda: graph("cast", [((3, 7), "int64")], dtype="bool"),
    "cast_bool_float": lambda: graph("cast", [((3, 7), "bool")], dtype="float32"),
    "equal": lambda: graph("equal", [((3, 7), "int64"), ((1, 7), "int64")]),
    "less": lambda: graph("less", [((3, 7), F), ((3, 1), F)]),
    "greater": lambda: graph("greater", [((3, 7), F), np.array([0.1], F)]),
    "sub": lambda: graph("sub", [((2, 3, 7), F), ((3, 1), F)]),
    "div": lambda: graph("div", [((2, 3, 7), F), (np.abs(R.standard_normal(7)) + 1).astype(F)]),
    "pow2": lambda: graph("pow", [((2, 3, 7), F), np.array([2.0], F)]),
    "neg": lambda: graph("neg", [((2, 3, 7), F)]),
    "neg_int8": lambda: graph("neg", [((2, 3, 7), "int8")]),
    "add_broadcast": lambda: graph("add", [((1, 1, 1, 9), F), ((2, 3, 9, 9), F)]),
    "mul_broadcast": lambda: graph("mul", [((2, 3, 9, 9), F), ((2, 1, 9, 1), F)]),
    "reduce_max": lambda: graph("reduce_max", [((2, 3, 37), F)], axes=(1,)),
    "gather": lambda: graph("gather", [R.standard_normal((50, 16)).astype(F),
                                       np.array([[0, 3, -1, 49, -50, 7, 7]], np.int64)]),
    "gather_ids": lambda: graph("gather", [R.standard_normal((50, 16)).astype(F),
                                           ((1, 9), "int64")]),
    "gather_int8_axis1": lambda: graph("gather", [((4, 10, 3), "int8"),
                                                  np.array([9, 0, -3, 2, 2], np.int32)],
                                       axis=1),
}
for name, make in EXACT.items():
    case(name, exact=True)(make)
case("pow")(lambda: graph("pow", [np.abs(R.standard_normal((2, 3, 7))).astype(F),
                                  ((1,), F)]))
for op in ("erf", "tanh", "exp"):
    case(op)(lambda op=op: graph(op, [((3, 37), F)]))


@case("sqrt")
def _sqrt():
    g, feed = graph("sqrt", [((3, 37), F)])
    return g, {name: np.abs(x) for name, x in feed.items()}

case("reduce_mean")(lambda: graph("reduce_mean", [((2, 3, 37), F)], axes=(-1,)))
case("reduce_sum")(lambda: graph("reduce_sum", [((2, 3, 37), F)], axes=(0, 2),
                                 keepdims=False))
case("reduce_all")(lambda: graph("reduce_mean", [((2, 3, 37), F)], axes=()))

# --- int8 -----------------------------------------------------------------------------------

QMATMUL = [  # (a, b, transpose_b, multiplier, shift)
    ((5, 7), (7, 9), False, None, (6,)), ((2, 3, 13, 17), (2, 3, 21, 17), True, 3001, (17,)),
    ((1, 3, 6, 8), (2, 1, 8, 16), False, None, (7,)), ((3, 10, 33), (33, 40), False, 77, (12,)),
    ((2, 9, 5), (5, 3), False, None, (-2,)), ((1, 2, 24, 16), (1, 2, 24, 16), True, None, (8,)),
    # fewer than 4 rows: AVX2 keeps x + 128 in nibbles (4 or more: int16 pairs)
    ((2, 3, 3, 10), (2, 3, 10, 7), False, None, (6,)), ((1, 2, 1, 9), (1, 2, 5, 9), True, 55, (9,))]
for i, (a, b, tb, m, s) in enumerate(QMATMUL):
    case(f"qmatmul{i}", exact=True)(lambda a=a, b=b, tb=tb, m=m, s=s: graph(
        "qmatmul", [(a, "int8"), (b, "int8")], transpose_b=tb, multiplier=m, shift=s,
        out_min=-100, out_max=120))


def extreme_qmatmul(transpose_b, k=4098, m=5, n=19):
    """qmatmul of two activations at their extremes over 4098 products: A all -128, B's
    columns (-128, -128, 127, 127, 1, 1) repeated (pairs of products of 2 * 16384 and
    2 * -16256) plus a small target t on the last entry, so each exact sum is -128 * t
    and the output (shift 7) is -t."""
    target = np.random.default_rng(2).integers(-50, 51, n)
    b = np.tile(np.array([-128, -128, 127, 127, 1, 1]), k // 6)[:, None].repeat(n, 1)
    b[-1] += target
    b = b.astype(np.int8)
    g, _ = graph("qmatmul", [((1, m, k), "int8"), ((1, n, k) if transpose_b else (k, n), "int8")],
                 transpose_b=transpose_b, multiplier=None, shift=(7,), out_min=-128,
                 out_max=127)
    return g, {"x0": np.full((1, m, k), -128, np.int8),
               "x1": b.T[None].copy() if transpose_b else b}


for tb in (False, True):
    for rows in (5, 3):
        case(f"qmatmul_extreme_t{int(tb)}_m{rows}", exact=True)(
            lambda tb=tb, rows=rows: extreme_qmatmul(tb, m=rows))
for shape in [(3, 5), (2, 3, 37), (2, 64, 128)]:
    for scale in (0.02, 0.5):
        case(f"qsoftmax{shape}_{scale}", exact=True)(lambda s=shape, c=scale: graph(
            "qsoftmax", [(s, "int8")], params=softmax_params(c, 0.6)))
    d = shape[-1]
    gamma, beta, p = layer_norm_params(R.standard_normal(d), R.standard_normal(d) * 0.3,
                                       1e-5, 0.05, 0.04, d)
    case(f"qlayer_norm{shape}", exact=True)(lambda s=shape, g=gamma, b=beta, p=p: graph(
        "qlayer_norm", [(s, "int8"), g, b], params=p))
    case(f"qgelu{shape}", exact=True)(lambda s=shape: graph(
        "qgelu", [(s, "int8")], params=gelu_params(0.05, 0.03)))
# A gamma 1e4 times smaller than its beta: the largest shift (21), B near its clamp; and
# rows of 4096 (c = 6: G below 2**11, z below 2**18).
_GS, _BS, _PS = layer_norm_params(R.standard_normal(40) * 1e-4, R.standard_normal(40) * 1.5,
                                  1e-5, 0.05, 0.04, 40)
case("qlayer_norm_small_gamma", exact=True)(lambda: graph(
    "qlayer_norm", [((6, 40), "int8"), _GS, _BS], params=_PS))
_GL, _BL, _PL = layer_norm_params(R.standard_normal(4096) * 3, R.standard_normal(4096),
                                  1e-5, 0.05, 0.04, 4096)
case("qlayer_norm_4096", exact=True)(lambda: graph(
    "qlayer_norm", [((3, 4096), "int8"), _GL, _BL], params=_PL))
def extreme_layer_norm(d=768, epsilon=1e-12):
    """qlayer_norm's extreme rows: constant (no variance: epsilon alone, M clipped),
    alternating -128 and 127 (the largest variance), one value off the rest (the
    largest |x - mean| / sd), and random; a tiny epsilon and a large gamma ratio."""
    gamma, beta, p = layer_norm_params(R.standard_normal(d) * 40, R.standard_normal(d),
                                       epsilon, 1e-3, 0.01, d)
    g, _ = graph("qlayer_norm", [((4, d), "int8"), gamma, beta], params=p)
    x = np.stack([np.full(d, -128), np.tile([-128, 127], d // 2),
                  np.r_[127, np.full(d - 1, -128)],
                  np.random.default_rng(3).integers(-128, 128, d)]).astype(np.int8)
    return g, {"x0": x}


for d in (2, 768):
    case(f"qlayer_norm_extreme_{d}", exact=True)(lambda d=d: extreme_layer_norm(d))
case("qlayer_norm_no_beta", exact=True)(lambda: graph(
    "qlayer_norm", [((4, 33), "int8"), layer_norm_params(np.ones(33), None, 1e-5, 0.1,
                                                         0.05, 33)[0]],
    params=layer_norm_params(np.ones(33), None, 1e-5, 0.1, 0.05, 33)[2]))


# --- running ------------------------------------------------------------------------------

_GRAPHS: dict = {}
_LIBRARIES: dict = {}


def graph_of(name):
    if name not in _GRAPHS:
        g, feed = CASES[name][0]()
        _GRAPHS[name] = (g, feed, run_reference(g, feed)[g.outputs[0]])
    return _GRAPHS[name]


def library(isa_name):
    """Every case's kernel for `isa_name` in one library."""
    if isa_name not in _LIBRARIES:
        isa = get_isa(isa_name)
        kernels = {name: node_kernel(graph_of(name)[0].nodes()[0], graph_of(name)[0], isa,
                                     threads=THREADS)[0] for name in CASES}
        lib = load(build_kernels(list(kernels.values()), isa, name="test_transformer_ops"))
        _LIBRARIES[isa_name] = (lib, kernels)
    return _LIBRARIES[isa_name]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("isa_name", ISAS)
def test_kernel_matches_reference(isa_name, name):
    g, feed, want = graph_of(name)
    lib, kernels = library(isa_name)
    lib.vdla_set_threads(THREADS)
    kernel = kernels[name]
    t = g.tensors[g.outputs[0]]
    out = np.full(t.shape, 99, DTYPES[t.dtype])
    call(lib, kernel, [feed[n] for n in kernel.inputs], out, threads=THREADS)
    assert out.dtype == want.dtype and out.shape == want.shape
    if CASES[name][1] or want.dtype.kind != "f":
        np.testing.assert_array_equal(out, want)
    else:
        err = np.abs(out.astype(np.float64) - want).max() / np.abs(want).max()
        assert err < TOLERANCE, f"{name}: relative error {err:.3g}"


def test_every_op_of_the_spec_is_supported():
    from vdla.compiler.targets.cpu import ops
    for op in ("matmul", "softmax", "layer_norm", "gelu", "attention", "gather", "slice",
               "expand", "where", "cast", "transpose", "sub", "div", "pow", "sqrt", "erf",
               "tanh", "exp", "neg", "reduce_mean", "reduce_sum", "reduce_max", "equal",
               "less", "greater", "qmatmul", "qsoftmax", "qlayer_norm", "qgelu",
               "qattention"):
        assert op in ops.OPS, op


def test_refusals_say_why(best):
    g, _ = graph("softmax", [((3, 5, 7), F)], axis=1)
    reason = best.supports(g.nodes()[0], g).reason
    assert "last axis" in reason and "axis 1" in reason
    g, _ = graph("reduce_sum", [((3, 7), "int64")], axes=(1,))
    assert "float32" in best.supports(g.nodes()[0], g).reason
    g, _ = graph("qmatmul", [((3, 7), "int8"), ((7, 4), "int8")], shift=(3, 4))
    assert "per tensor" in best.supports(g.nodes()[0], g).reason


_PATH_CASES = ["qdense_sign1x37x11", "qdense_sign3x8x9_residual", "qdense_sign7x37x11",
               "qdense_sign13x66x17", "qdense_sign32x30x50_residual",
               "qdense_extreme_mixed_k4093", "qdense_extreme_neg128_k4096",
               "qdense_sign20x2100x70"]


@pytest.mark.parametrize("isa_name", [p for p in ISAS if not get_isa(p.values[0]).tiles])
def test_large_panels_prefetch(isa_name):
    """The cases of many rows and large panels prefetch the next panel (their outputs
    are checked by test_kernel_matches_reference); a panel of a few KiB does not."""
    _, kernels = library(isa_name)
    for name in ("dense20x700x130_residual", "qdense_sign20x2100x70"):
        assert "__builtin_prefetch(pf + (size_t)c *" in kernels[name].body, name
    assert "__builtin_prefetch" not in kernels["dense32x30x50_None"].body


@pytest.mark.skipif(not get_isa("avx2").runs_on(machine_features()),
                    reason="this machine's compiler does not offer avx2")
def test_every_avx2_int8_dense_path_is_exact():
    """Each AVX2 int8 dense reduction forced on every case (the default picks one by
    rows): "sign" (|x| times w with x's sign), "wide" (int16 pairs) and "offset" (x + 128
    in nibbles), bit for bit the reference, on random and extreme operands."""
    from vdla.compiler.targets.cpu.dense import AVX2_INT8, dense_kernel
    from vdla.compiler.targets.cpu.dense_schedule import choose_dense
    from vdla.compiler.targets.cpu.shapes import DenseShape
    isa = get_isa("avx2")
    kernels = {}
    for name in _PATH_CASES:
        g = graph_of(name)[0]
        node = g.nodes()[0]
        shape = DenseShape.from_node(node, g)
        w, bias = g.constant(node.inputs[1]), g.constant(node.inputs[2])
        inputs = tuple(t for t in node.inputs if t and not g.tensors[t].is_constant)
        for path in AVX2_INT8:
            kernels[name, path] = dense_kernel(shape, choose_dense(shape, isa), w, bias,
                                               node, isa, inputs, avx2_int8=path)
            assert f"int8 {path} */" in kernels[name, path].body
    lib = load(build_kernels(list(kernels.values()), isa, name="test_avx2_int8_paths"))
    lib.vdla_set_threads(THREADS)
    for (name, path), kernel in kernels.items():
        g, feed, want = graph_of(name)
        out = np.full(want.shape, 99, np.int8)
        call(lib, kernel, [feed[n] for n in kernel.inputs], out, threads=THREADS)
        np.testing.assert_array_equal(out, want, err_msg=f"{name}, {path}")


def test_int8_dense_path_choice():
    """The sign trick runs where it is exact (no -128 weight) and faster (few rows);
    forcing it on a -128 weight is an error naming the value."""
    from vdla.compiler.targets.cpu.dense import SIGN_ROWS_MAX, int8_path
    from vdla.compiler.targets.cpu.shapes import DenseShape
    avx2 = get_isa("avx2")
    signed = np.array([[-127, 127]], np.int8)
    full = np.array([[-128, 127]], np.int8)
    for n in (1, 4, SIGN_ROWS_MAX):
        assert int8_path(DenseShape(n=n, k=2, o=1), avx2, signed) == "sign"
    assert int8_path(DenseShape(n=SIGN_ROWS_MAX + 1, k=2, o=1), avx2, signed) == "wide"
    assert int8_path(DenseShape(n=3, k=2, o=1), avx2, full) == "offset"
    assert int8_path(DenseShape(n=4, k=2, o=1), avx2, full) == "wide"
    assert int8_path(DenseShape(n=4, k=2, o=1, offset=False), avx2, signed) == "plain"
    for name in ("portable", "avx512vnni"):
        assert int8_path(DenseShape(n=4, k=2, o=1), get_isa(name), signed) == "offset"
    with pytest.raises(ValueError, match=r"weights in \[-127, 127\]; this layer's weights "
                                         "hold -128"):
        int8_path(DenseShape(n=4, k=2, o=1), avx2, full, "sign")
    with pytest.raises(ValueError, match="avx2_int8='vnni': allowed"):
        int8_path(DenseShape(n=4, k=2, o=1), avx2, signed, "vnni")


def test_quantized_weights_are_never_minus_128():
    """The sign trick's premise (`dense.signed_weights`): the quantizer writes int8
    weights in [-127, 127], even for weights at their channel's negative extreme."""
    from vdla.compiler.passes import quantize
    from vdla.compiler.targets.cpu.dense import signed_weights
    g = Graph("fc")
    x = g.add_input("x", (4, 16), F)
    w = R.standard_normal((8, 16)).astype(F)
    w[:, 3] = -np.abs(w).max(axis=1) * 1.0001       # each row's largest is negative
    g.set_outputs([g.add_node("dense", [x, g.add_constant("w", w)], name="fc")])
    for mode in ("shift", "multiply"):
        q = quantize(g, [{"x": R.standard_normal((4, 16)).astype(F)}], mode)
        weights = [q.constant(n.inputs[1]) for n in q.nodes() if n.op == "qdense"]
        assert weights and all(signed_weights(wq) for wq in weights)
        if mode == "multiply":      # (shift mode rounds the scales up to powers of two)
            assert min(int(wq.min()) for wq in weights) == -127


# --- through the target ---------------------------------------------------------------------

def test_bad_gather_index_is_an_error_not_a_read(best):
    from vdla.compiler.targets.model import compile_model
    g = Graph("bad")
    table = g.add_constant("table", R.standard_normal((50, 4)).astype(F))
    ids = g.add_input("ids", (1, 3), "int64")
    g.set_outputs([g.add_node("gather", [table, ids], name="emb")])
    compiled = compile_model(g, best)
    assert compiled.ops[0].target == "cpu"
    want = ("node 'emb' (gather): index 50 in 'ids' is outside [-50, 50), the 50 entries of "
            "'table' along axis 0")
    with pytest.raises(ValueError) as reference:
        run_reference(g, {"ids": np.array([[1, 50, 2]])})
    assert str(reference.value) == want
    with compiled.session() as session:
        for run in (session.run, session.run_graph):
            with pytest.raises(ValueError) as e:
                run({"ids": np.array([[1, 50, 2]])})
            assert str(e.value) == want
            with pytest.raises(ValueError, match="index -51 in 'ids'"):
                run({"ids": np.array([[-51, 0, 2]])})
            good = {"ids": np.array([[1, -50, 49]])}      # after an error: fine again
            np.testing.assert_array_equal(run(good).outputs[g.outputs[0]],
                                          run_reference(g, good)[g.outputs[0]])


@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_tiny_gpt_runs_whole_on_the_cpu(best, precision):
    """A 4-layer causal decoder (the zoo's gpt_mini at 8 tokens and a vocabulary of 64)
    prepared, fused and (int8) quantized: every node on the CPU target, the whole-graph
    runner's output equal to the op-by-op one, and to the reference (int8 bit for bit)."""
    from vdla.compiler.frontend import zoo
    from vdla.compiler.passes import prepare, quantize
    from vdla.compiler.targets.model import compile_model
    g = zoo.get("gpt_mini", seq_len=8, num_classes=64)
    rng = np.random.default_rng(0)

    def feed():
        return {"input_ids": rng.integers(0, 64, (1, 8)).astype(np.int64)}

    x = feed()
    g = prepare(g) if precision == "float32" else quantize(g, [feed(), feed()], "shift")
    compiled = compile_model(g, best)
    assert [op.name for op in compiled.ops if op.target != "cpu"] == []
    ops = {node.op for node in g.nodes()}
    assert ("qattention" if precision == "int8" else "attention") in ops
    want = run_reference(g, x)[g.outputs[0]]
    with compiled.session() as session:
        whole = session.run_graph(x).outputs[g.outputs[0]]
        one_by_one = session.run(x).outputs[g.outputs[0]]
    np.testing.assert_array_equal(whole, one_by_one)
    if precision == "int8":
        np.testing.assert_array_equal(whole, want)
    else:
        assert np.abs(whole - want).max() / np.abs(want).max() < 1e-4


@pytest.mark.parametrize("dtype", ["int8", "float32"])
@pytest.mark.parametrize("case", [dict(n=1, c=3, h=32, w=32, o=24, k=8, stride=8, pad=0),
                                  dict(n=2, c=3, h=18, w=20, o=10, k=4, stride=4, pad=0),
                                  dict(n=1, c=5, h=12, w=12, o=9, k=3, stride=3, pad=0,
                                       nonnegative=True)], ids=str)
def test_patch_embedding_is_one_gemm(cpu, dtype, case):
    """A convolution whose kernel is its stride (a ViT's stem) runs as patches gathered
    into rows, the dense layers' GEMM and a transpose (`patches`), without a schedule:
    exact in int8 (odd image sizes: the last rows and columns unused), within float
    tolerance, and the same in the whole-graph runner."""
    from gemm_graphs import assert_matches, conv_graph
    from vdla.compiler.targets.model import compile_model
    g, feed = conv_graph(np.random.default_rng(3), dtype=dtype,
                         **({"activation": "relu"} if dtype == "float32" else {}), **case)
    compiled = compile_model(g, cpu)
    assert compiled.ops[-1].target == "cpu" and compiled.ops[-1].schedule is None
    with compiled.session() as session:
        out = session.run(feed).outputs
        whole = session.run_graph(feed).outputs
    np.testing.assert_array_equal(out[g.outputs[0]], whole[g.outputs[0]])
    assert_matches(g, out, feed)
