"""scripts/calibrate_resources.py's configs against the calibration files they made: every
calibrated family's file holds its configs, each extension config is its base with
extensions, a bus its calibration board cannot take runs on a board of the family that
bridges it, and the model prices every confirmation point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from script_loading import load_script
from vdla.boards.catalog import BOARDS
from vdla.config import HardwareConfig
from vdla.dse.resources import (ResourceModel, calibrated_families, calibration_path,
                                extension_pairs, without_extensions)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "calibrate_resources.py"


@pytest.fixture(scope="module")
def script():
    return load_script(SCRIPT)


def load(family):
    return json.loads(calibration_path(family).read_text())


@pytest.mark.parametrize("family", calibrated_families())
def test_each_calibrated_file_holds_exactly_its_familys_configs(script, family):
    points = load(family)["points"]
    board = BOARDS[script.FAMILY_BOARDS[family]]
    assert set(points) == set(script.FAMILY_CONFIGS[family])
    for name, kwargs in script.FAMILY_CONFIGS[family].items():
        # As hardware: the board sets the platform fields (clock, DRAM bandwidth).
        want = HardwareConfig(**{"dram_bus_width": board.dram_bus_width, **kwargs})
        assert HardwareConfig.from_dict(points[name]["config"]).hardware() == \
            want.hardware(), name


@pytest.mark.parametrize("family", sorted(
    f for f in calibrated_families() if f in {"zynq-7000", "zynq-ultrascale+"}))
def test_each_extension_config_is_its_base_with_extensions(script, family):
    # Its pair in the fit (the same hardware without extensions) is the base it names.
    extensions = script.EXTENSION_CONFIGS[family]
    pairs = dict(extension_pairs(load(family)["points"]))
    for name, (base, fields) in extensions.items():
        assert base in script.FAMILY_CONFIGS[family] and name in script.FAMILY_CONFIGS[family]
        assert pairs.get(name, base) == base, name
        config = HardwareConfig(**{**script.FAMILY_CONFIGS[family][base], **fields})
        assert (name in pairs) == (without_extensions(config) != config), name


def test_a_bus_the_calibration_boards_port_cannot_take_runs_where_it_is_bridged(script):
    ultra96, zcu104 = BOARDS["ultra96-v2"], BOARDS["zcu104"]
    narrow = HardwareConfig(dram_bus_width=128)
    assert script.calibration_board(ultra96, narrow) is ultra96
    # The Ultra96-V2's port has no clock of its own: the ZCU104's 128-bit port bridges
    # the 256-bit bus, on the same family's flow.
    wide = narrow.replace(dram_bus_width=256)
    with pytest.raises(ValueError, match="takes 128 bits"):
        ultra96.apply(wide)
    assert script.calibration_board(ultra96, wide) is zcu104
    # No Cyclone V board bridges a wider bus.
    with pytest.raises(ValueError, match="no cyclone-v board .* takes .* 128-bit bus"):
        script.calibration_board(BOARDS["de10-nano"], HardwareConfig(dram_bus_width=128))


@pytest.mark.parametrize("family", calibrated_families())
def test_the_model_prices_every_confirmation_point(script, family):
    model = ResourceModel.for_family(family)
    for name, (board_name, fields) in script.CONFIRM[family].items():
        board = BOARDS[board_name]
        config = board.apply(HardwareConfig.from_dict({**board.config.to_dict(), **fields}))
        assert model.unpriced(config) == [], name
        assert not model.predict(config).overflows(board.part.capacity), name
