"""The resource model and the sweep with two int8 products per DSP and with one
(`HardwareConfig.dsp_pack`): DSPs counted from the single product's cells, the LUTs
packing costs fitted to unpacked calibration configs against the same configs packed
(`vdla.dse.resources.pack_pairs`), refused where a family has no unpacked config, and
``dsp_pack`` a sweep dimension."""

from __future__ import annotations

import json

import pytest

from vdla import HardwareConfig
from vdla.boards import get as get_board
from vdla.dse.resources import (ResourceModel, calibration_path, pack_pairs, unpacked_pairs)
from vdla.dse.spec import SweepSpec

#: The families calibrated with unpacked configs (scripts/calibrate_resources.py's
#: UNPACKED_CONFIGS) and their DSP cell.
PACKED_FAMILIES = {"zynq-ultrascale+": "DSP48E2", "zynq-7000": "DSP48E1"}
#: A 1x8x8 core (32 product pairs) with buffers its instructions can address.
SMALL = HardwareConfig(block_in=8, block_out=8, wgt_buff_size=64 * 1024,
                       acc_buff_size=32 * 1024)


@pytest.mark.parametrize("family, cell", sorted(PACKED_FAMILIES.items()))
def test_one_product_per_dsp_is_priced(family, cell):
    """One DSP48 per product unpacked, one per pair packed; packing costs LUTs (the
    fitted term is a saving per unpacked pair), and every unpacked calibration config is
    fitted within the model's error."""
    model = ResourceModel.for_family(family)
    assert model.dsp_cells.gemm == model.dsp_cells.single == {cell: 1}
    assert model.lut["unpacked_pairs"] < 0
    config = SMALL.replace(dram_bus_width=model.bus_width)
    packed, unpacked = model.predict(config), model.predict(config.replace(dsp_pack=False))
    assert (packed.dsp, unpacked.dsp) == (32, 64)
    assert unpacked.lut < packed.lut
    data = json.loads(calibration_path(family).read_text())
    pairs = pack_pairs(data["points"])
    assert pairs
    for name, base in pairs:
        assert data["points"][base]["resources"]["dsp"] < data["points"][name]["resources"]["dsp"]
        assert abs(model.fit_errors[name]["lut"]) < 0.05, name


def test_a_dsp_limit_counts_single_products_when_unpacked():
    model = ResourceModel.for_family("zynq-7000")
    config = SMALL.replace(dsp_pack=False, gemm_dsp_limit=48)
    assert config.gemm_lut_products == 16 and unpacked_pairs(config) == 24
    assert model.predict(config).dsp == 48


def test_a_family_without_unpacked_configs_refuses_them():
    model = ResourceModel.for_family("cyclone-v")
    assert model.dsp_cells.single is None
    with pytest.raises(ValueError, match=r"cannot price one product per DSP \(dsp_pack off\)"):
        model.predict(SMALL.replace(dsp_pack=False))


def test_an_unpacked_calibration_config_needs_its_packed_one():
    config = SMALL.replace(dsp_pack=False)
    points = {"lonely": {"config": config.to_dict()}}
    with pytest.raises(ValueError, match=r"'lonely' .* has one product per DSP but the same "
                                         r"config packed .* is not calibrated"):
        pack_pairs(points)


def test_dsp_pack_is_a_sweep_dimension():
    spec = SweepSpec.from_dict({"board": "zcu104", "models": [{"name": "resnet18"}],
                                "parameters": {"dsp_pack": ["true", "false"],
                                               "block_out": [32, 64]}})
    points = spec.points()
    assert sorted((p["dsp_pack"], p["block_out"]) for p in points) == [
        (False, 32), (False, 64), (True, 32), (True, 64)]
    board = get_board("zcu104")
    model = ResourceModel.for_board(board)
    dsp = {p["dsp_pack"]: model.predict(board.apply(board.config.replace(
        block_out=64, dsp_pack=p["dsp_pack"]))).dsp for p in points if p["block_out"] == 64}
    # The 2,048-MAC core fits the xczu7ev's 1,728 DSPs only packed.
    assert dsp == {True: 1024, False: 2048}
    assert dsp[True] <= board.part.capacity.dsp < dsp[False]
