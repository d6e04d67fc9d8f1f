"""The depthwise window (`HardwareConfig.dw_taps`, `Gemm.dw`): the functional simulator's
vectorized semantics against a literal shift-register model, the validator's checks, and
the ISA's encoding of the bit."""

import collections

import numpy as np
import pytest

from vdla.config import HardwareConfig
from vdla.isa import EncodeError, Gemm, Uop, decode, encode
from vdla.sim.functional import FunctionalSimulator, dw_window
from vdla.sim.validate import ProgramValidator

CONFIGS = [HardwareConfig(dw_taps=3),
           HardwareConfig(batch=2, block_in=8, block_out=32, dw_taps=4),
           HardwareConfig(block_out=32, wgt_buff_size=128 * 1024, acc_buff_size=128 * 1024,
                          dw_taps=3)]


def shift_register(sim, insn, config):
    """acc after `insn`, one micro-op at a time, the window a list of rows shifted by a
    column per micro-op: the semantics as `vdla.isa.Gemm` words them."""
    taps, r, bi = config.dw_taps, config.dw_column_rows, config.block_in
    acc = sim.acc.astype(np.int64)
    for o in range(insn.iter_out):
        for i in range(insn.iter_in):
            window = None
            for u in range(insn.uop_bgn, insn.uop_end):
                d, s, w = (int(field[u]) + o * getattr(insn, f"{name}_factor_out")
                           + i * getattr(insn, f"{name}_factor_in")
                           for field, name in ((sim.uop_dst, "dst"), (sim.uop_src, "src"),
                                               (sim.uop_wgt, "wgt")))
                if u == insn.uop_bgn:
                    window = [sim.inp[s + q] for q in range(taps * r)]
                else:
                    window = window[r:] + [sim.inp[s + (taps - 1) * r + q] for q in range(r)]
                for b in range(config.batch):
                    for n in range(config.block_out):
                        acc[d, b, n] += sum(
                            int(sim.wgt[w, n, k])
                            * int(window[(k // 2) * r + n // bi][b, (n - n % 2) % bi + k % 2])
                            for k in range(2 * taps))
                        acc[d, b, n] += sum(int(sim.wgt[w, n, k]) * int(window[-1][b, k])
                                            for k in range(2 * taps, bi))
    return ((acc + 2**31) % 2**32 - 2**31).astype(np.int32)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("seed", range(3))
def test_vectorized_equals_shift_register(config, seed):
    rng = np.random.default_rng(seed)
    sim = FunctionalSimulator(config, np.zeros(1 << 16, np.uint8))
    sim.inp[:] = rng.integers(-128, 128, sim.inp.shape)
    sim.wgt[:] = rng.integers(-128, 128, sim.wgt.shape)
    sim.acc[:] = rng.integers(-2**31, 2**31, sim.acc.shape)
    n = 8
    sim.uop_dst[:n] = rng.integers(0, 40, n)
    # Sorted srcs mostly slide the window; random ones exercise the stateful rule.
    sim.uop_src[:n] = np.sort(rng.integers(0, 60, n)) if seed != 2 else rng.integers(0, 60, n)
    sim.uop_wgt[:n] = rng.integers(0, 20, n)
    insn = Gemm(dw=True, uop_bgn=1, uop_end=7, iter_out=3, iter_in=2, dst_factor_out=5,
                dst_factor_in=1, src_factor_out=3, src_factor_in=7, wgt_factor_in=2)
    expected = shift_register(sim, insn, config)
    sim.stats = collections.Counter()
    sim._gemm(insn)
    assert np.array_equal(sim.acc, expected)
    dst = np.unique(sim.uop_dst[1:7][:, None] + np.arange(3)[None] * 5 + np.arange(2)[:, None, None])
    assert np.array_equal(sim.out[dst], expected[dst].astype(np.int8))


def test_window_of_a_sliding_pass_is_contiguous():
    """src advancing by r per micro-op: the window is simply src + t·r + h."""
    config = CONFIGS[2]
    r, taps = config.dw_column_rows, config.dw_taps
    src = np.concatenate([10 + r * np.arange(5), 90 + r * np.arange(5)])
    rows = dw_window(src, 5, config)
    assert np.array_equal(rows, src[:, None] + np.arange(taps * r))


def test_encoding_needs_the_window():
    insn = Gemm(dw=True, uop_end=2, iter_out=1, iter_in=1)
    config = CONFIGS[0]
    assert decode(encode(insn, config), config) == insn
    with pytest.raises(EncodeError, match="dw=1 .*not implemented by config 1x16x16.*dw_taps"):
        encode(insn, HardwareConfig())
    # The default config's GEMM layout has no dw bit (VTA's layout).
    assert "dw" not in HardwareConfig().insn_field_widths()["GEMM"][0][-1]


@pytest.mark.parametrize("bad, match", [
    (dict(dw_taps=9), "out of range for block_in=16"),
    (dict(dw_taps=1), "2 to 8 taps"),
    (dict(dw_taps=-1), "non-negative integer"),
    (dict(dw_taps=True), "non-negative integer"),
    (dict(block_out=8, dw_taps=3), "multiple of block_in"),
])
def test_bad_dw_taps(bad, match):
    with pytest.raises(ValueError, match=match):
        HardwareConfig(**bad)


def test_config_name_and_extensions():
    config = CONFIGS[2]
    assert config.name.endswith("-dw3") and config.extensions == ("dw3",)
    assert (config.dw_column_rows, config.dw_window_rows) == (2, 6)
    # A pass of 5 micro-ops: the first loads 6 rows, the 4 others 2 each.
    assert config.dw_pass_cycles(5) == 6 + 4 * 2


def _validate(config, insn, uops):
    from vdla.isa import Finish, Load, MemoryType, encode_uops
    dram = np.zeros(1 << 16, np.uint8)
    raw = encode_uops(uops, config)
    dram[:len(raw)] = np.frombuffer(raw, np.uint8)
    load = Load(memory_type=MemoryType.UOP, y_size=1, x_size=len(uops), x_stride=len(uops))
    return ProgramValidator(config).validate([load, insn, Finish()], dram)


def test_validator_counts_window_cycles_and_checks_reach():
    config = CONFIGS[2]          # r = 2, T = 3
    uops = [Uop(dst=d, src=2 * d, wgt=0) for d in range(4)]
    plan = _validate(config, Gemm(dw=True, uop_end=4, iter_out=2, iter_in=1,
                                  dst_factor_out=4, src_factor_out=8), uops)
    # two passes of 4 micro-ops: 2 cycles each, 4 more to fill the window per pass
    assert plan.minimum >= 2 * (4 * 2 + 4)
    depth = config.inp_depth
    with pytest.raises(Exception, match="depthwise window"):
        _validate(config, Gemm(dw=True, uop_end=1, iter_out=1, iter_in=1),
                  [Uop(dst=0, src=depth - 3, wgt=0)])
    with pytest.raises(Exception, match="not implemented by this config"):
        _validate(HardwareConfig(), Gemm(dw=True, uop_end=1, iter_out=1, iter_in=1),
                  [Uop(dst=0, src=0, wgt=0)])
