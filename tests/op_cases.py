"""One-node graphs of the non-GEMM ops and their feeds, which every target's tests run
against the reference: pools (odd sizes, kernels 1-3, strides, pads, ceil mode,
count_include_pad, windows wholly in the padding, batch 2), global pools, qadd (both
requantization modes, per-tensor and per-channel, shifts from -31 to 31, the quantizer's
constant (1,) operand, broadcast operands), float add/mul with broadcasting, relu, clip,
quantize (ties, saturation, infinities), dequantize, concat on every axis, flatten and
reshape. `CASES` maps a case's name to a function making its (graph, feed)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from vdla.compiler import Graph

__all__ = ["CASES", "S", "data", "one_node", "qadd"]

# --- cases: (graph, feed) builders -------------------------------------------------------

CASES: dict[str, Callable[[], tuple[Graph, dict]]] = {}


def case(name: str):
    def register(fn):
        CASES[name] = fn
        return fn
    return register


def data(rng, shape, dtype):
    if dtype == "int8":
        return rng.integers(-128, 128, shape).astype(np.int8)
    if dtype == "int32":
        return rng.integers(-2**31, 2**31, shape, dtype=np.int64).astype(np.int32)
    return rng.standard_normal(shape).astype(np.float32)


def one_node(op, inputs, rng, *, fill=data, **attrs):
    """A graph of one `op` node; `inputs` lists (shape, dtype) for graph inputs or an
    array for a constant; `fill(rng, shape, dtype)` makes an input's values (default
    `data`). Returns (graph, feed)."""
    g = Graph(op)
    names, feed = [], {}
    for i, spec in enumerate(inputs):
        if isinstance(spec, np.ndarray):
            names.append(g.add_constant(f"k{i}", spec, str(spec.dtype)))
        else:
            shape, dtype = spec
            names.append(g.add_input(f"x{i}", shape, dtype))
            feed[names[-1]] = fill(rng, shape, dtype)
    g.set_outputs([g.add_node(op, names, name="op", **attrs)])
    return g, feed


POOLS = [  # (shape, kernel, strides, pads, ceil_mode)
    ((1, 3, 7, 9), (3, 3), (1, 1), (1, 1, 1, 1), False),
    ((2, 5, 11, 10), (3, 3), (2, 2), (1, 1, 1, 1), True),
    ((1, 4, 13, 13), (2, 2), (2, 2), (0, 0, 0, 0), True),
    ((2, 3, 8, 7), (1, 1), (1, 1), (0, 0, 0, 0), False),
    ((1, 3, 9, 8), (1, 1), (2, 3), (0, 0, 0, 0), True),
    ((1, 2, 9, 11), (2, 3), (1, 2), (0, 1, 1, 0), True),
    ((1, 2, 5, 6), (3, 3), (3, 3), (1, 2, 2, 1), True),
    ((1, 2, 10, 10), (3, 2), (2, 2), (0, 0, 0, 0), False),     # last rows/columns unused
    ((1, 16, 56, 56), (3, 3), (2, 2), (1, 1, 1, 1), False),    # big: OpenMP
    ((1, 2, 1, 2), (1, 1), (5, 5), (0, 3, 0, 0), False),       # columns wholly in padding
]


def pool_id(p):
    shape, k, s, pads, ceil = p
    return (f"{'x'.join(map(str, shape))}_k{k[0]}{k[1]}_s{s[0]}{s[1]}_p{''.join(map(str, pads))}"
            + ("_ceil" if ceil else ""))


for _i, _p in enumerate(POOLS):
    _shape, _k, _s, _pads, _ceil = _p
    for _dt in ("int8", "float32"):
        case(f"max_pool2d_{_dt}_{pool_id(_p)}")(
            lambda p=_p, dt=_dt, i=_i: one_node(
                "max_pool2d", [(p[0], dt)], np.random.default_rng(i), kernel=p[1],
                strides=p[2], pads=p[3], ceil_mode=p[4]))
    for _incl in (False, True):
        case(f"avg_pool2d_{pool_id(_p)}_incl{int(_incl)}")(
            lambda p=_p, incl=_incl, i=_i: one_node(
                "avg_pool2d", [(p[0], "float32")], np.random.default_rng(i), kernel=p[1],
                strides=p[2], pads=p[3], ceil_mode=p[4], count_include_pad=incl))

# windows wholly in the padding: max of nothing is the dtype's minimum
for _dt in ("int8", "float32"):
    case(f"max_pool2d_{_dt}_window_in_padding")(
        lambda dt=_dt: one_node("max_pool2d", [((1, 2, 4, 5), dt)], np.random.default_rng(5),
                                kernel=(2, 2), strides=(1, 1), pads=(2, 2, 2, 2)))

# qavg_pool2d: (pool, multiplier, shift); per-channel when a tuple of C values
QAVG = [
    (POOLS[0], None, 3), (POOLS[1], None, (0, 1, 2, 3, 4)), (POOLS[2], 77, 12),
    (POOLS[5], (3, 32767), (31, 20)), (POOLS[6], None, (-5, 0)), (POOLS[3], 1, 0),
    (POOLS[8], (1234,) * 16, tuple(range(10, 26))),
    ((((1, 2, 4, 5), (2, 2), (1, 1), (2, 2, 2, 2), False)), 300, 9),
]
for _i, (_p, _m, _sh) in enumerate(QAVG):
    case(f"qavg_pool2d_{pool_id(_p)}_m{_m is not None}_{_i}")(
        lambda p=_p, m=_m, sh=_sh, i=_i: one_node(
            "qavg_pool2d", [(p[0], "int8")], np.random.default_rng(100 + i), kernel=p[1],
            strides=p[2], pads=p[3], ceil_mode=p[4], multiplier=m, shift=sh))

for _shape in ((2, 5, 7, 7), (1, 3, 1, 1), (1, 3, 13, 17), (1, 64, 56, 56)):
    _sid = "x".join(map(str, _shape))
    case(f"global_avg_pool2d_{_sid}")(
        lambda s=_shape: one_node("global_avg_pool2d", [(s, "float32")],
                                  np.random.default_rng(7)))
    case(f"qglobal_avg_pool2d_{_sid}_shift")(
        lambda s=_shape: one_node("qglobal_avg_pool2d", [(s, "int8")],
                                  np.random.default_rng(8), shift=(6,)))
    case(f"qglobal_avg_pool2d_{_sid}_per_channel")(
        lambda s=_shape: one_node(
            "qglobal_avg_pool2d", [(s, "int8")], np.random.default_rng(9),
            multiplier=tuple(range(100, 100 + 97 * s[1], 97)),
            shift=tuple(int(v) for v in np.linspace(-31, 31, s[1]).round())))


# --- qadd ----------------------------------------------------------------------------------

def qadd(a, b, seed=0, **attrs):
    return one_node("qadd", [a, b], np.random.default_rng(seed), **attrs)


S = (2, 5, 6, 7)
C5 = (1, 5, 1, 1)
case("qadd_same_shift_only")(lambda: qadd((S, "int8"), (S, "int8"), a_shift=1, b_shift=0))
case("qadd_same_multiplier_clamped")(lambda: qadd(
    (S, "int8"), (S, "int8"), a_multiplier=1234, a_shift=12, b_multiplier=30000, b_shift=16,
    out_min=-100, out_max=90))
case("qadd_per_channel_shifts_-31_to_31")(lambda: qadd(
    (S, "int8"), (S, "int8"), a_multiplier=(1, 2, 32767, 500, 77), a_shift=(-31, -3, 0, 5, 31),
    b_shift=(31, 7, -1, 0, 20), out_min=0))
case("qadd_constant_zero_operand")(lambda: qadd(
    (S, "int8"), np.zeros(1, np.int8), a_multiplier=19661, a_shift=15, out_min=0))
case("qadd_constant_scalar_per_channel_a")(lambda: qadd(
    (S, "int8"), np.array([37], np.int8), a_multiplier=(9, 8, 7, 6, 5), a_shift=(3, 2, 1, 0, -1),
    b_multiplier=300, b_shift=4))
case("qadd_constant_first_per_channel")(lambda: qadd(
    np.arange(-2, 3, dtype=np.int8).reshape(C5) * 50, (S, "int8"),
    a_multiplier=(100, 200, 300, 400, 500), a_shift=(8, 8, 9, 9, 10), b_shift=1))
case("qadd_constant_full")(lambda: qadd(
    np.random.default_rng(3).integers(-128, 128, S).astype(np.int8), (S, "int8"),
    a_shift=-2, b_multiplier=5, b_shift=3))
case("qadd_computed_per_channel_operand")(lambda: qadd(
    (S, "int8"), (C5, "int8"), a_shift=2, b_multiplier=(1, 2, 3, 4, 5), b_shift=(0, 1, 2, 3, 4)))
case("qadd_computed_per_channel_operand_first")(lambda: qadd(
    (C5, "int8"), (S, "int8"), a_shift=-1, b_shift=(1, 2, 3, 4, 5)))
case("qadd_computed_scalar_operand")(lambda: qadd((S, "int8"), ((1,), "int8"), a_shift=0,
                                                  b_multiplier=3, b_shift=1))
case("qadd_sample_operand_over_batch")(lambda: qadd(
    (S, "int8"), (S[1:], "int8"), a_multiplier=(1, 2, 3, 4, 5), a_shift=(1, 2, 3, 4, 5),
    b_shift=-2))
case("qadd_sample_constant_first")(lambda: qadd(
    np.random.default_rng(4).integers(-128, 128, (1,) + S[1:]).astype(np.int8), (S, "int8"),
    a_shift=(1, 2, 3, 4, 5), b_shift=2))
case("qadd_computed_batch_channel_operand")(lambda: qadd((S, "int8"), ((2, 5, 1, 1), "int8"),
                                                         b_shift=(1, 1, 2, 2, 3)))
case("qadd_2d_per_channel")(lambda: qadd(
    ((4, 37), "int8"), ((4, 37), "int8"), a_multiplier=tuple(range(1, 38)),
    a_shift=tuple(range(-18, 19)), b_shift=3))
case("qadd_2d_channel_operand")(lambda: qadd(((4, 37), "int8"), ((37,), "int8"), a_shift=1))
case("qadd_1d")(lambda: qadd(((300,), "int8"), ((300,), "int8"), b_multiplier=3, b_shift=2))
case("qadd_big")(lambda: qadd(((1, 64, 56, 56), "int8"), ((1, 64, 56, 56), "int8"),
                              a_multiplier=tuple(range(1000, 1064)), a_shift=(13,) * 64,
                              b_shift=1, out_min=0))
case("qadd_big_per_tensor")(lambda: qadd(((1, 64, 56, 56), "int8"), ((1, 64, 56, 56), "int8"),
                                         a_shift=1, b_shift=1))


# --- float elementwise ----------------------------------------------------------------------

def fconst(shape, seed=11):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


F = (2, 3, 5, 7)
for _op in ("add", "mul"):
    for _name, _a, _b in [
        ("same", (F, "float32"), (F, "float32")),
        ("constant_scalar", (F, "float32"), fconst((1,))),
        ("computed_scalar_first", ((1,), "float32"), (F, "float32")),
        ("constant_channel", (F, "float32"), fconst((1, 3, 1, 1))),
        ("computed_channel_3d", (F, "float32"), ((3, 1, 1), "float32")),
        ("constant_channel_first", fconst((3, 1, 1)), (F, "float32")),
        ("batch_channel", (F, "float32"), ((2, 3, 1, 1), "float32")),
        ("sample_over_batch", (F, "float32"), ((3, 5, 7), "float32")),
        ("constant_full", fconst(F), (F, "float32")),
        ("2d_bias", ((4, 37), "float32"), fconst((37,))),
        ("big_channel", ((1, 64, 56, 56), "float32"), ((1, 64, 1, 1), "float32")),
        ("big_same", ((1, 64, 56, 56), "float32"), ((1, 64, 56, 56), "float32")),
    ]:
        case(f"{_op}_{_name}")(lambda op=_op, a=_a, b=_b: one_node(
            op, [a, b], np.random.default_rng(12)))


for _dt in ("int8", "float32"):
    for _shape in ((2, 3, 5, 7), (1, 64, 56, 56)):
        case(f"relu_{_dt}_{'x'.join(map(str, _shape))}")(
            lambda dt=_dt, s=_shape: one_node("relu", [(s, dt)], np.random.default_rng(13)))
case("relu_float32_specials")(lambda: (one_node("relu", [((2, 8), "float32")],
                                                np.random.default_rng(0))[0], {
    "x0": np.array([[-0.0, 0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-45, -1e-45]] * 2,
                   np.float32)}))
for _lo, _hi in ((0.0, 6.0), (-0.5, None), (None, 0.25), (None, None), (0.1, 0.1)):
    case(f"clip_{_lo}_{_hi}")(lambda lo=_lo, hi=_hi: one_node(
        "clip", [((3, 4, 5, 6), "float32")], np.random.default_rng(14), min=lo, max=hi))
case("clip_big")(lambda: one_node("clip", [((1, 64, 56, 56), "float32")],
                                  np.random.default_rng(15), min=0.0, max=6.0))


def quantize_case(scale, values):
    g, _ = one_node("quantize", [(values.shape, "float32")], np.random.default_rng(0),
                    scale=scale)
    return g, {"x0": values}


def _ties(scale):
    # x / scale is exactly k + 0.5 (scale a power of two), or as near as float32 gets
    k = np.arange(-140, 140, dtype=np.float64)
    return ((k + 0.5) * scale).astype(np.float32)


case("quantize_ties_pow2")(lambda: quantize_case(0.25, _ties(0.25)))
case("quantize_ties_near")(lambda: quantize_case(0.1, np.concatenate([
    _ties(0.1), np.nextafter(_ties(0.1), np.float32(np.inf)),
    np.nextafter(_ties(0.1), np.float32(-np.inf))])))
case("quantize_random_and_extremes")(lambda: quantize_case(0.0371, np.concatenate([
    (np.random.default_rng(16).standard_normal(100_000) * 3).astype(np.float32),
    np.array([0.0, -0.0, 1e30, -1e30, np.inf, -np.inf, 4.7115, -4.7305], np.float32)])))
case("quantize_4d")(lambda: quantize_case(
    0.02, (np.random.default_rng(17).standard_normal((2, 3, 9, 11)) * 2).astype(np.float32)))


def dequantize_case(dtype, scale, shape):
    return one_node("dequantize", [(shape, dtype)], np.random.default_rng(18), scale=scale)


case("dequantize_int8")(lambda: dequantize_case("int8", 0.0123, (2, 3, 11, 13)))
case("dequantize_int8_big")(lambda: dequantize_case("int8", 0.7, (1, 64, 56, 56)))
case("dequantize_int32")(lambda: dequantize_case("int32", 1.3e-5, (5, 77)))


# --- copies --------------------------------------------------------------------------------

for _dt in ("int8", "float32"):
    for _axis in (0, 1, 2, 3, -1):
        shapes = []
        for _j in range(2 + (_axis % 2)):
            s = [2, 3, 4, 5]
            s[_axis] = 1 + _j
            shapes.append(tuple(s))
        case(f"concat_{_dt}_axis{_axis}_{len(shapes)}")(
            lambda dt=_dt, axis=_axis, shapes=tuple(shapes): one_node(
                "concat", [(s, dt) for s in shapes], np.random.default_rng(19), axis=axis))
    case(f"concat_{_dt}_with_constant")(lambda dt=_dt: one_node(
        "concat", [((1, 3, 4, 4), dt), data(np.random.default_rng(20), (1, 2, 4, 4), dt),
                   ((1, 5, 4, 4), dt)], np.random.default_rng(21), axis=1))
    case(f"concat_{_dt}_big")(lambda dt=_dt: one_node(
        "concat", [((1, 64, 56, 56), dt), ((1, 64, 56, 56), dt)], np.random.default_rng(22),
        axis=1))
    case(f"flatten_{_dt}")(lambda dt=_dt: one_node("flatten", [((2, 3, 4, 5), dt)],
                                                   np.random.default_rng(23), axis=1))
    case(f"reshape_{_dt}_big")(lambda dt=_dt: one_node(
        "reshape", [((1, 64, 56, 56), dt)], np.random.default_rng(24), shape=(64, -1)))
