"""The three forms of the GEMM core (`vdla.hw.compute.GemmArithmetic`) are the same
machine.

The Verilator backend simulates the NATIVE form by default (its products computed by the
harness: the fastest); WIDE is the fastest in plain Verilog; boards get the PACKED form.
The models of the default config run the same random programs and the blocked GEMM
kernel, WIDE and NATIVE each against PACKED: DRAM must agree byte for byte and every
hardware counter, cycles included, must be equal. (Each form is also held to the
functional simulator on its own: the differential tests run NATIVE on several configs,
a dw window's and a 2 x 8 x 32 core's among them; the cocotb tests of the whole
accelerator run PACKED.)

Two products per DSP (`dsp_pack`) changes only the PACKED form: a small core's PACKED
model with it on and with it off runs random programs and a blocked GEMM against the
functional simulator, with the same cycles either way.
"""

import numpy as np
import pytest

import vdla
from differential import DifferentialDevice, pair_with
from program_gen import random_program
from vdla.runtime.kernels import blocked_gemm, blocked_gemm_reference

DRAM_SIZE = 1 << 24


@pytest.fixture(scope="module")
def models():
    cfg = vdla.HardwareConfig()
    opened = {}
    try:
        for arithmetic in ("packed", "wide", "native"):
            opened[arithmetic] = vdla.runtime.open(
                cfg, backend="verilator", dram_size=DRAM_SIZE, gemm_arithmetic=arithmetic,
                log=lambda message: None)
        yield opened
    finally:
        for dev in opened.values():
            dev.close()


def pair(models, form) -> DifferentialDevice:
    return DifferentialDevice(models["packed"], models[form], close_candidate=False,
                              close_reference=False)


def assert_same_counters(dev: DifferentialDevice):
    packed, wide = dev.last_stats
    packed = {k: v for k, v in packed.items() if k != "wall_seconds"}
    wide = {k: v for k, v in wide.items() if k != "wall_seconds"}
    assert packed == wide


@pytest.mark.parametrize("form", ["wide", "native"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("seed", range(8))
def test_random_programs_agree(models, seed, threads, form):
    dev = pair(models, form)
    try:
        generated = random_program(dev, np.random.default_rng([seed, threads, 7]),
                                   n_tiles=2 + seed % 5, virtual_threads=threads)
        dev.run(*dev.load_program(generated.program))
        assert_same_counters(dev)
    finally:
        dev.close()


@pytest.mark.parametrize("form", ["wide", "native"])
def test_blocked_gemm_agrees(models, form):
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, size=(64, 128), dtype=np.int8)
    b = rng.integers(-128, 128, size=(64, 128), dtype=np.int8)
    dev = pair(models, form)
    try:
        result, _, _ = blocked_gemm(dev, a, b, shift=6, virtual_threads=2)
        np.testing.assert_array_equal(result, blocked_gemm_reference(a, b, 6))
        assert_same_counters(dev)
        assert dev.last_stats[0]["gemm_active"] > 0
    finally:
        dev.close()


#: A small core for the `dsp_pack` models (32 multiplier pairs, or 64 multipliers).
PACK_CFG = vdla.HardwareConfig(block_in=8, block_out=8, uop_buff_size=4096,
                               inp_buff_size=8192, wgt_buff_size=32768, acc_buff_size=32768)


def test_dsp_pack_on_and_off_match_the_functional_simulator():
    """Whole programs on the PACKED form's Verilator model with two products per DSP and
    with one: DRAM equal to the functional simulator's, and the same cycles both ways."""
    cycles = {}
    for dsp_pack in (True, False):
        cfg = PACK_CFG.replace(dsp_pack=dsp_pack)
        model = vdla.runtime.open(cfg, backend="verilator", dram_size=DRAM_SIZE,
                                  gemm_arithmetic="packed", log=lambda message: None)
        try:
            runs = []
            for seed in range(3):
                with pair_with(model) as dev:
                    generated = random_program(dev, np.random.default_rng([seed, 70]),
                                               n_tiles=3 + seed, virtual_threads=2)
                    dev.run(*dev.load_program(generated.program))
                    runs.append(dev.last_stats[1]["cycles"])
            with pair_with(model) as dev:
                rng = np.random.default_rng(70)
                a = rng.integers(-128, 128, size=(32, 64), dtype=np.int8)
                b = rng.integers(-128, 128, size=(32, 64), dtype=np.int8)
                result, _, _ = blocked_gemm(dev, a, b, shift=6, virtual_threads=2)
                np.testing.assert_array_equal(result, blocked_gemm_reference(a, b, 6))
                runs.append(dev.last_stats[1]["cycles"])
            cycles[dsp_pack] = runs
        finally:
            model.close()
    assert cycles[True] == cycles[False]


def test_unknown_form_is_a_clear_error():
    with pytest.raises(ValueError, match="GEMM arithmetic must be one of 'packed', 'wide', "
                                         "'native', not 'fast'"):
        vdla.runtime.open(vdla.HardwareConfig(), backend="verilator", gemm_arithmetic="fast",
                          log=lambda message: None)
