"""The error of each integer definition of transformers' operators
(`vdla.compiler.reference.integer_transformer`) against float, in output LSBs.

Each operator is run on int8 inputs and compared with the float function of the same
inputs dequantized (so the figure is the definition's own error, not the input's
quantization), divided by the output scale the quantizer would choose: 0.5 LSB is the
error of rounding the exact result, so the excess over 0.5 is what the integer arithmetic
costs. Inputs are realistic (Gaussian activations, attention logits of a few units, a
few outlier channels) over a sweep of input scales; ``qgelu`` also covers all 256 int8
values.

    python3 scripts/integer_ops_error.py [--seed N]
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from scipy.special import erf

from vdla.compiler.reference import integer_transformer as it
from vdla.compiler.reference.integer import requantize_params


def quantize(v: np.ndarray, scale: float) -> np.ndarray:
    return np.clip(np.floor(v / scale + 0.5), -128, 127).astype(np.int8)


def row(name: str, setting: str, err: np.ndarray) -> str:
    return f"{name:<12} {setting:<34} {np.abs(err).max():>8.3f} {np.abs(err).mean():>8.3f}"


def softmax_rows(rng, seed_rows: int = 64):
    for length in (16, 128, 512):
        for spread in (1.0, 3.0, 8.0):
            z = rng.normal(0, spread, (seed_rows, length))
            scale = np.abs(z).max() / 127
            x = quantize(z, scale)
            zf = x * scale
            e = np.exp(zf - zf.max(-1, keepdims=True))
            want = e / e.sum(-1, keepdims=True)
            params = it.softmax_params(scale, want.max())
            lsb = 2.0 ** -params["prob_bits"]
            got = it.qsoftmax(x, params) * lsb
            yield row("qsoftmax", f"N={length} logits sd {spread:g} (k={params['prob_bits']})",
                      (got - np.minimum(want, 127 * lsb)) / lsb)


def layer_norm_rows(rng):
    for length in (64, 768):
        for spread, outliers in ((1.0, 0), (1.0, 4), (20.0, 4)):
            z = rng.normal(0, spread, (32, length))
            z[:, :outliers] *= 12                       # outlier channels
            s_x = np.abs(z).max() / 127
            x = quantize(z, s_x)
            zf = x * s_x
            gamma, beta = rng.normal(1, 0.2, length), rng.normal(0, 0.2, length)
            m = zf.mean(-1, keepdims=True)
            want = (zf - m) / np.sqrt(((zf - m) ** 2).mean(-1, keepdims=True) + 1e-5) \
                * gamma + beta
            s_y = np.abs(want).max() / 127
            G, B, params = it.layer_norm_params(gamma, beta, 1e-5, s_x, s_y, length)
            got = it.qlayer_norm(x, G, B, params)
            yield row("qlayer_norm", f"D={length} sd {spread:g}, {outliers} outlier ch.",
                      got - want / s_y)


def gelu_rows():
    x = np.arange(-128, 128).astype(np.int8)
    for s_x in (0.005, 0.02, 0.05, 0.1, 0.5):
        v = x * s_x
        for form, want in (("erf", v * 0.5 * (1 + erf(v / math.sqrt(2)))),
                           ("tanh", 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                           * (v + 0.044715 * v ** 3))))):
            s_y = np.abs(want).max() / 127
            got = it.qgelu(x, it.gelu_params(s_x, s_y))
            yield row("qgelu", f"{form} form, s_x {s_x:g}, all 256 inputs", got - want / s_y)


def attention_rows(rng):
    for seq, depth in ((16, 16), (128, 64)):
        q = rng.normal(0, 1, (2, 4, seq, depth))
        k = rng.normal(0, 1, (2, 4, seq, depth))
        v = rng.normal(0, 1, (2, 4, seq, depth))
        scales = [np.abs(a).max() / 127 for a in (q, k, v)]
        qi, ki, vi = (quantize(a, s) for a, s in zip((q, k, v), scales))
        qf, kf, vf = (a * s for a, s in zip((qi, ki, vi), scales))
        raw = qf @ np.swapaxes(kf, -1, -2)
        scale = 1 / math.sqrt(depth)
        e = np.exp(raw * scale - (raw * scale).max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
        want = p @ vf
        s_s = np.abs(raw).max() / 127
        s_o = np.abs(want).max() / 127
        sm = it.softmax_params(s_s * scale, p.max())
        s_p = 2.0 ** -sm["prob_bits"]
        qk_m, qk_s = _ratio(scales[0] * scales[1] / s_s)
        pv_m, pv_s = _ratio(s_p * scales[2] / s_o)
        attrs = {"qk_multiplier": qk_m, "qk_shift": (qk_s,), "qk_out_min": -128,
                 "qk_out_max": 127, "softmax_params": sm, "pv_multiplier": pv_m,
                 "pv_shift": (pv_s,), "pv_out_min": -128, "pv_out_max": 127,
                 "causal": False}
        got = it.qattention(qi, ki, vi, None, attrs)
        yield row("qattention", f"S={seq} D={depth} (k={sm['prob_bits']})", got - want / s_o)


def _ratio(r: float):
    return requantize_params(r, 128 * 128 * 128, multiply=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    t = np.arange(-30 * 65536, 1, dtype=np.int64)
    exact = 2.0 ** (t / 65536) * 65536
    rel = (it.exp2_neg(t) - exact) / exact
    print(f"exp2_neg: relative error max {np.abs(rel[exact >= 2 ** 14]).max():.2e} "
          f"(results >= 2**14; below, the floor's 1 / 65536 units dominate)")
    print(f"{'op':<12} {'inputs':<34} {'max LSB':>8} {'mean LSB':>8}")
    for rows in (softmax_rows(rng), layer_norm_rows(rng), gelu_rows(), attention_rows(rng)):
        for line in rows:
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
