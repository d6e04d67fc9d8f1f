"""The integer definitions of transformers' operators
(`vdla.compiler.reference.integer_transformer`): each against float within its stated
error, every intermediate inside its stated type on extreme inputs (checked with Python's
unbounded integers as a shadow), the tables targets may use, and clear errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.special import erf
from script_loading import load_script

from vdla.compiler.ir import Graph, GraphError
from vdla.compiler.reference import run_reference
from vdla.compiler.reference import integer_transformer as it
from vdla.compiler.reference.integer import QuantizationError, requantize

INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)


def fits(value: int, bounds, what: str):
    assert bounds[0] <= value <= bounds[1], f"{what} = {value} leaves its type {bounds}"
    return value


# --- shadows: the definitions in Python integers, every step checked against its type --

def shadow_exp2_neg(t: int) -> int:
    fits(t, INT64, "t")
    q = t >> 16
    f = t - (q << 16)
    assert 0 <= f < 65536
    c1, c2, c3 = it.EXP2_POLY
    h = c3
    for c in (c2, c1, 1 << 30):
        h = c + fits(h * f, INT64, "h * f") // 65536    # >> 16 on Python ints is floor too
        fits(h, INT64, "h")
    assert (1 << 30) <= h < (1 << 31)
    return h >> min(14 - q, 31)


def shadow_softmax_row(x: list[int], c: int, k: int) -> list[int]:
    m = max(x)
    e = []
    for v in x:
        t = fits((v - m) * c, INT32, "t")
        e.append(fits(shadow_exp2_neg(t), INT32, "e"))
    s = fits(sum(e), INT32, "sum")
    return [min(127, fits(fits(ei << k, INT32, "e << k") + (s >> 1), INT32, "numerator") // s)
            for ei in e]


def shadow_layer_norm_row(x: list[int], G: list[int], B: list[int], params: dict):
    eps, r = params["eps"], params["shift"]
    n = len(x)
    c = 0
    while 4 ** c < n - 1:
        c += 1
    k, z_shift = 30 - c, 18 - c
    s = fits(sum(x), INT32, "S")
    q = fits(sum(v * v for v in x), INT32, "Q")
    w = fits(n * q - s * s + eps, (1, (1 << 47) - 1), "w")
    assert w - eps <= it.LN_VARIANCE_BOUND * n * n
    e = (30 - w.bit_length()) // 2
    assert -9 <= e <= 14
    wn = w << (2 * e) if e >= 0 else w >> (-2 * e)
    assert (1 << 28) <= wn < (1 << 30)
    sd = math.isqrt(wn)
    m = fits(min((n << (k + e)) // sd, (1 << 31) - 1), INT32, "M")
    o = fits((1 << (z_shift - 1)) - fits(s * m, INT64, "S * M") // n, INT64, "O")
    out = []
    for xi, g, b in zip(x, G, B):
        assert abs(g) < 1 << (17 - c)
        z = fits(xi * m + o, INT32, "P") >> z_shift
        y = fits(fits(z * g, INT32, "z * G") + b + (1 << (r - 1)), INT32, "z * G + B") >> r
        out.append(max(-128, min(127, y)))
    return out


def shadow_gelu(x: int, p: dict) -> int:
    ax = abs(x)
    t = fits(ax * fits(p["a"] + ax * ax * p["b"], INT64, "a + ax^2 b"), INT64, "T") \
        >> p["q_shift"]
    e = shadow_exp2_neg(-t)
    sp = ((1 << 31) + ((65536 + e) >> 1)) // (65536 + e)
    sig = sp if x >= 0 else (1 << 15) - sp
    y = fits(fits(x * sig * p["multiplier"], INT64, "x sig M") + (1 << (p["shift"] - 1)),
             INT64, "y") >> p["shift"]
    return max(-128, min(127, y))


# --- the shared steps ------------------------------------------------------------------------

def test_exp2_neg_is_within_its_stated_error_and_matches_the_shadow():
    t = np.arange(-40 * 65536, 1, 37, dtype=np.int64)
    e = it.exp2_neg(t)
    want = 2.0 ** (t / 65536.0) * 65536.0
    assert it.exp2_neg(0) == 65536
    # Rounded down, with the cubic's relative error 8.6e-5.
    assert np.all(e <= want * (1 + 9e-5) + 1e-9)
    assert np.all(e >= want * (1 - 9e-5) - 1)
    assert np.all(np.diff(e) >= 0)                   # monotonic in t
    for v in (0, -1, -65535, -65536, -65537, -255 * (1 << 23), -(1 << 62)):
        assert int(it.exp2_neg(v)) == shadow_exp2_neg(v), v
    with pytest.raises(QuantizationError, match="t must be <= 0"):
        it.exp2_neg(1)


def test_isqrt_is_the_exact_floor_square_root():
    rng = np.random.default_rng(0)
    n = np.concatenate([rng.integers(0, 1 << 62, 2000), np.arange(0, 1000),
                        [(1 << 62) - 1, (1 << 31) ** 2 - 1, 4 ** 30, 4 ** 30 - 1]])
    r = it.isqrt(n)
    assert [int(v) for v in r] == [math.isqrt(int(v)) for v in n]
    with pytest.raises(QuantizationError, match=r"\[0, 2\*\*62\)"):
        it.isqrt(-1)


# --- qsoftmax --------------------------------------------------------------------------------

def float_softmax(z, axis=-1):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("scale", [0.004, 0.03, 0.1, 0.5, 2.0])
@pytest.mark.parametrize("length", [1, 7, 128])
def test_qsoftmax_is_within_one_output_lsb_of_float(scale, length):
    rng = np.random.default_rng(length)
    x = rng.integers(-128, 128, (32, length)).astype(np.int8)
    want = float_softmax(x * scale)
    params = it.softmax_params(scale, want.max())
    got = it.qsoftmax(x, params)
    lsb = 2.0 ** -params["prob_bits"]
    assert got.dtype == np.int8 and got.min() >= 0
    assert np.abs(got * lsb - np.minimum(want, 127 * lsb)).max() <= 0.75 * lsb
    # The output scale holds the largest probability (bar the clip at 127 when it is 1).
    assert want.max() <= 127.5 * lsb or params["prob_bits"] == 7


@pytest.mark.parametrize("row", ["all_min", "all_max", "one_max", "alternate", "random"])
def test_qsoftmax_never_overflows_on_extreme_long_rows(row):
    n = 4096
    x = {"all_min": np.full(n, -128), "all_max": np.full(n, 127),
         "one_max": np.r_[127, np.full(n - 1, -128)],
         "alternate": np.tile([-128, 127], n // 2),
         "random": np.random.default_rng(1).integers(-128, 128, n)}[row].astype(np.int8)
    for c, k in ((1, it.MAX_PROB_BITS), (it.MAX_EXP_MULTIPLIER, it.MAX_PROB_BITS),
                 (6000, 7)):
        params = {"exp_multiplier": c, "prob_bits": k}
        got = it.qsoftmax(x[None], params)[0]
        assert got.tolist() == shadow_softmax_row(x.tolist(), c, k)


def test_qsoftmax_rows_at_the_stated_longest_stay_in_int32():
    x = np.full((1, it.MAX_SOFTMAX_LENGTH), 5, np.int8)      # the largest possible sum
    params = {"exp_multiplier": 1000, "prob_bits": it.MAX_PROB_BITS}
    assert it.qsoftmax(x, params)[0, :3].tolist() == \
        shadow_softmax_row(x[0].tolist(), 1000, it.MAX_PROB_BITS)[:3]
    with pytest.raises(QuantizationError, match="1 to 16384"):
        it.qsoftmax(np.zeros((1, it.MAX_SOFTMAX_LENGTH + 1), np.int8), params)


def test_qsoftmax_exclusion_and_the_exp_table():
    x = np.array([[10, 20, 30, 40], [1, 2, 3, 4]], np.int8)
    params = {"exp_multiplier": 3000, "prob_bits": 7}
    excluded = np.array([[False, False, True, True], [True, True, True, True]])
    got = it.qsoftmax(x, params, excluded)
    alone = it.qsoftmax(x[:1, :2], params)
    assert got[0, :2].tolist() == alone[0].tolist() and got[0, 2:].tolist() == [0, 0]
    assert got[1].tolist() == [0, 0, 0, 0]             # every key excluded: zeros
    g = Graph("t")
    g.add_input("x", (2, 4), "int8")
    g.set_outputs([g.add_node("qsoftmax", ["x"], params=params)])
    table = it.exp_table(g.node("qsoftmax"))
    assert table.dtype == np.int32 and table.shape == (256,) and table[255] == 65536
    d = np.arange(-255, 1)
    assert table.tolist() == it.exp2_neg(d * 3000).tolist()
    assert run_reference(g, {"x": x})["qsoftmax_out"].tolist() == \
        it.qsoftmax(x, params).tolist()


# --- qlayer_norm -----------------------------------------------------------------------------

def float_layer_norm(z, gamma, beta, eps):
    m = z.mean(-1, keepdims=True)
    return (z - m) / np.sqrt(((z - m) ** 2).mean(-1, keepdims=True) + eps) * gamma + beta


@pytest.mark.parametrize("length", [8, 64, 768])
@pytest.mark.parametrize("scale", [0.003, 0.05, 0.4])
def test_qlayer_norm_is_within_one_output_lsb_of_float(length, scale):
    rng = np.random.default_rng(length)
    x = np.clip(rng.normal(0, 40, (16, length)), -128, 127).astype(np.int8)
    gamma, beta = rng.normal(1, 0.3, length), rng.normal(0, 0.5, length)
    want = float_layer_norm(x * scale, gamma, beta, 1e-5)
    s_y = np.abs(want).max() / 127
    G, B, params = it.layer_norm_params(gamma, beta, 1e-5, scale, s_y, length)
    got = it.qlayer_norm(x, G, B, params)
    assert np.abs(got - want / s_y).max() <= 0.6


@pytest.mark.parametrize("row", ["constant", "alternate", "one_off", "random"])
@pytest.mark.parametrize("length", [2, 4096])
def test_qlayer_norm_never_overflows_on_extreme_rows(row, length):
    rng = np.random.default_rng(2)
    x = {"constant": np.full(length, -128), "alternate": np.tile([-128, 127], length // 2),
         "one_off": np.r_[127, np.full(length - 1, -128)],
         "random": rng.integers(-128, 128, length)}[row].astype(np.int8)
    for gamma_peak, s_x, s_y, eps in ((1.0, 0.05, 0.05, 1e-5), (50.0, 1e-4, 0.01, 1e-12),
                                      (1e-6, 1.0, 10.0, 1.0)):
        gamma = rng.uniform(-gamma_peak, gamma_peak, length)
        beta = rng.normal(0, 3, length)
        G, B, params = it.layer_norm_params(gamma, beta, eps, s_x, s_y, length)
        got = it.qlayer_norm(x[None], G, B, params)[0]
        assert got.tolist() == shadow_layer_norm_row(x.tolist(), G.tolist(), B.tolist(),
                                                     params)
    if row == "constant":            # no variance: the output is beta, quantized
        G, B, params = it.layer_norm_params(np.ones(length), np.full(length, 0.5), 1e-5,
                                            0.05, 0.01, length)
        assert set(it.qlayer_norm(x[None], G, B, params)[0].tolist()) == {50}


def test_qlayer_norm_rejects_bad_params():
    x = np.zeros((1, 4), np.int8)
    G, B = np.ones(4, np.int32), np.zeros(4, np.int32)
    with pytest.raises(QuantizationError, match=r"params\['eps'\] = 0 is outside"):
        it.qlayer_norm(x, G, B, {"eps": 0, "shift": 20})
    with pytest.raises(QuantizationError, match="holding 'shift'"):
        it.qlayer_norm(x, G, B, {"eps": 1})
    with pytest.raises(QuantizationError, match="need 4 values"):
        it.qlayer_norm(x, G[:3], B, {"eps": 1, "shift": 20})
    with pytest.raises(QuantizationError, match=r"params\['eps'\] = 140737488355329 is"):
        it.qlayer_norm(x, G, B, {"eps": (1 << 47) + 1, "shift": 20})
    with pytest.raises(QuantizationError, match=r"gamma must be in \(-2\*\*16, 2\*\*16\) "
                                                "for rows of 4"):
        it.qlayer_norm(x, G << 16, B, {"eps": 1, "shift": 20})
    with pytest.raises(QuantizationError, match="rows of 65537 entries"):
        it.layer_norm_shifts(65537)


def test_layer_norm_shifts_keep_every_product_inside_int32():
    """c is the least with 4**c >= D - 1: sqrt(D - 1) <= 2**c, the bound of |x - mean| /
    sd that leaves (x - mean) * M and z * G inside int32."""
    for d, c in ((1, 0), (2, 0), (3, 1), (5, 1), (6, 2), (17, 2), (18, 3), (768, 5),
                 (1025, 5), (1026, 6), (65536, 8)):
        sh = it.layer_norm_shifts(d)
        assert sh["c"] == c and math.sqrt(max(d - 1, 0)) <= 2 ** c, d
        assert sh["k"] == 30 - c and sh["z_shift"] == 18 - c and sh["gamma_bits"] == 17 - c


# --- qgelu -----------------------------------------------------------------------------------

def float_gelu(v):
    return v * 0.5 * (1 + erf(v / math.sqrt(2)))


@pytest.mark.parametrize("scale", [0.002, 0.02, 0.05, 0.2, 1.0])
def test_qgelu_is_within_one_output_lsb_of_float_erf_gelu(scale):
    x = np.arange(-128, 128).astype(np.int8)
    want = float_gelu(x * scale)
    s_y = np.abs(want).max() / 127
    params = it.gelu_params(scale, s_y)
    got = it.qgelu(x, params)
    assert np.abs(got - want / s_y).max() <= 0.6
    assert [int(v) for v in got] == [shadow_gelu(int(v), params) for v in x]
    g = Graph("t")
    g.add_input("x", (256,), "int8")
    g.set_outputs([g.add_node("qgelu", ["x"], params=params)])
    table = it.gelu_table(g.node("qgelu"))
    assert table.dtype == np.int8 and table.tolist() == got.tolist()
    assert run_reference(g, {"x": x})["qgelu_out"].tolist() == got.tolist()


def test_qgelu_params_refuse_unusable_scales():
    with pytest.raises(QuantizationError, match="input scale"):
        it.gelu_params(0.0, 0.1)
    with pytest.raises(QuantizationError, match="128 \\(a \\+ 16384 b\\)"):
        it.qgelu(np.zeros(2, np.int8), {"a": 1 << 60, "b": 1, "q_shift": 0,
                                        "multiplier": 1, "shift": 1})


# --- qmatmul and qattention ------------------------------------------------------------------

def test_qmatmul_is_the_exact_product_requantized():
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (2, 3, 5, 16)).astype(np.int8)
    b = rng.integers(-128, 128, (1, 3, 16, 4)).astype(np.int8)
    acc = np.einsum("bhik,xhkj->bhij", a.astype(np.int64), b.astype(np.int64))
    want = np.clip(requantize(acc, 300, 17), -100, 127)
    got = it.qmatmul(a, b, 300, (17,), -100, 127)
    assert got.tolist() == want.tolist()
    bt = np.swapaxes(b, -1, -2).copy()
    assert it.qmatmul(a, bt, 300, (17,), -100, 127, transpose_b=True).tolist() == \
        want.tolist()
    # The extreme product: K = 4096 of -128 * -128 needs no wrap.
    big = np.full((1, 4096), -128, np.int8)
    assert int(it.qmatmul(big, big.T.copy(), None, (26,))[0, 0]) == 1


def test_qattention_is_its_composition_with_mask_and_causal_exclusion():
    rng = np.random.default_rng(4)
    q = rng.integers(-128, 128, (1, 2, 5, 8)).astype(np.int8)
    k = rng.integers(-128, 128, (1, 2, 6, 8)).astype(np.int8)
    v = rng.integers(-128, 128, (1, 2, 6, 3)).astype(np.int8)
    mask = np.zeros((1, 1, 1, 6), bool)
    mask[..., 0] = True
    attrs = {"qk_multiplier": None, "qk_shift": (10,), "qk_out_min": -128,
             "qk_out_max": 127, "softmax_params": {"exp_multiplier": 900, "prob_bits": 7},
             "pv_multiplier": None, "pv_shift": (7,), "pv_out_min": -128, "pv_out_max": 127,
             "causal": True}
    got = it.qattention(q, k, v, mask, attrs)
    s = it.qmatmul(q, k, None, (10,), transpose_b=True)
    causal = np.arange(6)[None, :] > np.arange(5)[:, None] + 1
    p = it.qsoftmax(s, attrs["softmax_params"], mask | causal)
    assert got.tolist() == it.qmatmul(p, v, None, (7,)).tolist()
    # Through a graph and the reference kernel.
    g = Graph("t")
    for name, arr in (("q", q), ("k", k), ("v", v)):
        g.add_input(name, arr.shape, "int8")
    g.add_input("m", mask.shape, "bool")
    g.set_outputs([g.add_node("qattention", ["q", "k", "v", "m"], **attrs)])
    out = run_reference(g, {"q": q, "k": k, "v": v, "m": mask})["qattention_out"]
    assert out.tolist() == got.tolist()
    assert it.exp_table(g.node("qattention")).tolist() == \
        it.exp2_neg(np.arange(-255, 1) * 900).tolist()
    # The exclusion mask must be bool.
    g2 = Graph("t2")
    for name, arr in (("q", q), ("k", k), ("v", v)):
        g2.add_input(name, arr.shape, "int8")
    g2.add_input("m", mask.shape, "float32")
    g2.set_outputs([g2.add_node("qattention", ["q", "k", "v", "m"], infer=False, **attrs)])
    g2.tensors["qattention_out"].shape, g2.tensors["qattention_out"].dtype = got.shape, "int8"
    with pytest.raises(GraphError, match="mask must be bool"):
        run_reference(g2, {"q": q, "k": k, "v": v, "m": mask.astype(np.float32)})


def test_the_error_script_measures_every_definition_within_its_stated_error(capsys):
    """scripts/integer_ops_error.py (the docstring's "Measured error") runs, and what it
    prints holds: the elementwise definitions within 0.75 LSB, the attention within 8."""
    script = load_script(Path(__file__).resolve().parents[2] / "scripts" /
                         "integer_ops_error.py")
    assert script.main([]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith("q")]
    bound = {"qsoftmax": 0.75, "qlayer_norm": 0.75, "qgelu": 0.75, "qattention": 8.0}
    seen = set()
    for row in rows:
        assert float(row[-2]) <= bound[row[0]], row
        seen.add(row[0])
    assert seen == set(bound)


@pytest.mark.parametrize("causal", [False, True])
def test_qsoftmax_down_the_rows_is_the_transposes_softmax(causal):
    """axis -2: keys run down the rows (a transposed score matrix); the result is the
    last-axis softmax of the transpose, transposed back, causal in that orientation."""
    rng = np.random.default_rng(11)
    x = rng.integers(-128, 128, (24, 16)).astype(np.int8)
    mask = rng.random((24, 1)) < 0.2
    params = it.softmax_params(0.1, 0.5)
    down, across = Graph("down"), Graph("across")
    down.add_input("x", (24, 16), "int8")
    down.add_input("m", (24, 1), "bool")
    down.set_outputs([down.add_node("qsoftmax", ["x", "m"], axis=-2, causal=causal,
                                    params=params)])
    across.add_input("x", (16, 24), "int8")
    across.add_input("m", (1, 24), "bool")
    across.set_outputs([across.add_node("qsoftmax", ["x", "m"], causal=causal,
                                        params=params)])
    got = run_reference(down.validate(), {"x": x, "m": mask})[down.outputs[0]]
    want = run_reference(across.validate(), {"x": np.ascontiguousarray(x.T),
                                             "m": np.ascontiguousarray(mask.T)})
    np.testing.assert_array_equal(got, want[across.outputs[0]].T)
    bad = Graph("bad")
    bad.add_input("x", (2, 24, 16), "int8")
    with pytest.raises(GraphError, match=r"axis 0: a qsoftmax normalizes its last axis "
                                         r"\(-1\) or, on rank >= 2, the one before it"):
        bad.add_node("qsoftmax", ["x"], axis=0, params=params)
