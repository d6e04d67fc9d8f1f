"""The extensions past VTA (REQ, alu_hold) in the resource model and the sweep's space: their
terms fitted to what each adds in the calibration data, a clear error where a family
cannot price one, and a grid sweep over them with the timing and resource models."""

from __future__ import annotations

import json

import pytest

from vdla.boards.catalog import BOARDS
from vdla.config import AluOp, HardwareConfig
from vdla.dse.evaluate import Evaluator
from vdla.dse.resources import (ResourceModel, bus_pairs, calibrated_families, calibration_path,
                                extension_pairs, extension_terms, without_extensions)
from vdla.dse.spec import SweepSpec

#: The families whose calibration has configs with the extensions (the 7-series
#: and one more at least).
PRICED = [f for f in calibrated_families()
          if extension_pairs(json.loads(calibration_path(f).read_text())["points"])]
REQ = HardwareConfig().alu_ops | {AluOp.REQ}
BASE_OPS = ["MIN", "MAX", "ADD", "SHR"]


def load(family):
    return json.loads(calibration_path(family).read_text())


def test_the_terms_count_req_per_alu_lane_and_hold_once():
    none = {"req_lanes": 0.0, "alu_hold": 0.0, "lut_pairs": 0.0, "dw_window": 0.0,
            "tab_lanes": 0.0, "tab_dma": 0.0, "div_lanes": 0.0, "divp_lanes": 0.0}
    assert extension_terms(HardwareConfig()) == none
    assert extension_terms(HardwareConfig(alu_ops=REQ)) == {**none, "req_lanes": 16.0}
    both = HardwareConfig(batch=2, block_in=8, block_out=8, alu_ops=REQ, alu_hold=True,
                          acc_buff_size=64 * 1024, wgt_buff_size=64 * 1024)
    assert extension_terms(both) == {**none, "req_lanes": 16.0, "alu_hold": 1.0}
    # The depthwise window: its registers and input multiplexers, per lane and tap.
    window = HardwareConfig(block_out=32, dw_taps=3)
    assert extension_terms(window)["dw_window"] == 96.0
    assert without_extensions(window) == HardwareConfig(block_out=32)
    # 256 multiplier pairs, 220 of them DSPs: 36 built from LUTs.
    limited = HardwareConfig(block_out=32, gemm_dsp_limit=220)
    assert extension_terms(limited)["lut_pairs"] == 36.0
    assert without_extensions(limited) == HardwareConfig(block_out=32)
    # The lookup table: a copy per ALU lane, and one DMA.
    table = HardwareConfig(batch=2, block_out=8, alu_ops=HardwareConfig().alu_ops | {AluOp.TAB})
    assert (extension_terms(table)["tab_lanes"], extension_terms(table)["tab_dma"]) == (16.0, 1.0)
    assert without_extensions(table) == HardwareConfig(batch=2, block_out=8)
    # The pipelined divider: per ALU lane, besides the divide's own term it replaces.
    divp = HardwareConfig(batch=2, block_out=8, alu_ops=HardwareConfig().alu_ops | {AluOp.DIV},
                          div_pipeline=True)
    assert (extension_terms(divp)["div_lanes"], extension_terms(divp)["divp_lanes"]) == (
        16.0, 16.0)
    assert without_extensions(divp) == HardwareConfig(batch=2, block_out=8)
    plain = without_extensions(both)
    assert not plain.alu_hold and AluOp.REQ not in plain.alu_ops
    assert plain == HardwareConfig(batch=2, block_in=8, block_out=8,
                                   acc_buff_size=64 * 1024, wgt_buff_size=64 * 1024)


def test_the_seven_series_and_a_second_family_price_both_features():
    assert "zynq-7000" in PRICED and len(PRICED) >= 2
    for family in PRICED:
        model = ResourceModel.for_family(family)
        assert {"req_lanes", "alu_hold"} <= set(model.lut) and not model.unpriced(
            HardwareConfig(alu_ops=REQ, alu_hold=True))


@pytest.mark.parametrize("family", PRICED)
def test_the_features_add_logic_and_no_dsp_or_block_ram(family):
    points = load(family)["points"]
    for name, base in extension_pairs(points):
        m, b = points[name]["resources"], points[base]["resources"]
        terms = extension_terms(HardwareConfig.from_dict(points[name]["config"]))
        # A DSP limit trades DSPs for LUTs, one per LUT-built multiplier pair.
        assert b["dsp"] - m["dsp"] == terms["lut_pairs"] and m["bram"] == b["bram"], name
        assert m["lut"] > b["lut"] or not terms["lut_pairs"], name
        # REQ's clamp and muxes are LUTs; alu_hold's control state is flip-flops (its
        # LUTs are within yosys's run-to-run noise on the 7-series).
        assert m["lut"] > b["lut"] or not terms["req_lanes"], name
        assert m["lut"] > b["lut"] or not terms["tab_lanes"], name   # LUT RAM, no BRAM
        assert m["ff"] > b["ff"] or not terms["alu_hold"], name


@pytest.mark.parametrize("family", PRICED)
def test_the_extension_terms_are_fitted_to_the_differences(family):
    data = load(family)
    model = ResourceModel.fit(data)
    # The base terms are those of the configs without extensions: adding extension configs
    # to a calibration changes no prediction for a config without them.
    plain = {n: p for n, p in data["points"].items()
             if not any(extension_terms(HardwareConfig.from_dict(p["config"])).values())}
    base_model = ResourceModel.fit(dict(data, points=plain))
    for key in ("lut", "ff"):
        assert {k: v for k, v in getattr(model, key).items() if k in getattr(base_model, key)} \
            == pytest.approx(dict(getattr(base_model, key)))
    # Each measured difference is the fitted terms' within a tenth of the default
    # config's cost of both ALU extensions (a few hundred LUTs out of tens of thousands),
    # or of the difference itself where that is larger: a term fitted to two configs
    # (the depthwise window's, per lane and tap) cannot meet both exactly.
    both = HardwareConfig(alu_ops=REQ, alu_hold=True)
    scale = {k: getattr(model.predict(both), k) - getattr(model.predict(HardwareConfig()), k)
             for k in ("lut", "ff")}
    points = data["points"]
    for name, base in extension_pairs(points):
        config = HardwareConfig.from_dict(points[name]["config"])
        got = model.predict(config).to_dict()
        want = model.predict(HardwareConfig.from_dict(points[base]["config"])).to_dict()
        for key in ("lut", "ff"):
            measured = points[name]["resources"][key] - points[base]["resources"][key]
            assert abs((got[key] - want[key]) - measured) \
                <= 0.1 * max(scale[key], abs(measured)) + 2, (name, key)


def test_a_feature_config_without_its_base_is_refused():
    data = load("zynq-7000")
    name, base = extension_pairs(data["points"])[0]
    points = {n: p for n, p in data["points"].items() if n != base}
    with pytest.raises(ValueError, match=f"{name!r} .* has extensions past VTA but its config "
                                         "without them .* is not calibrated"):
        ResourceModel.fit(dict(data, points=points))


#: family -> (its boards' DRAM port, the wider bus its calibration bridges to it).
BRIDGED = {"zynq-7000": (64, 128), "zynq-ultrascale+": (128, 256)}


@pytest.mark.parametrize("family", sorted(BRIDGED))
def test_a_wider_dram_bus_is_priced_per_bit_from_its_pairs(family):
    # Each family's calibration has the wider bus (bridged to the HP port) on two cores,
    # each beside the same core on the port's width.
    port, wide_bus = BRIDGED[family]
    data = load(family)
    model = ResourceModel.fit(data)
    assert model.bus_width == port
    pairs = bus_pairs(data["points"], port)
    assert len(pairs) >= 2
    points = data["points"]
    bits = wide_bus - port
    for key in ("lut", "ff"):
        added = [points[n]["resources"][key] - points[m]["resources"][key] for n, m in pairs]
        # One term per bit, fitted by least squares through the origin: the mean here.
        assert bits * getattr(model, key)["wide_bus"] == pytest.approx(sum(added) / len(added))
    small = HardwareConfig(block_out=8, wgt_buff_size=128 * 1024, acc_buff_size=64 * 1024,
                           alu_ops=REQ, alu_hold=True, dram_bus_width=port)
    for config in (HardwareConfig(dram_bus_width=port), small):
        wide, narrow = model.predict(config.replace(dram_bus_width=wide_bus)), model.predict(config)
        assert wide.lut - narrow.lut == pytest.approx(bits * model.lut["wide_bus"], abs=1)
        # No DSP; block RAM is counted from the memories, whose write lanes the bus sets.
        assert wide.dsp == narrow.dsp


@pytest.mark.parametrize("family", sorted(BRIDGED))
def test_the_bus_term_counts_the_bits_above_every_boards_port(family):
    # The base terms are fitted on the calibration board's port, which is every board's
    # of the family: the term's bits are those above the port of whichever board.
    model = ResourceModel.for_family(family)
    boards = [b for b in BOARDS.values() if b.part.family == family]
    assert boards and {b.dram_bus_width for b in boards} == {model.bus_width}
    # The points on the wider bus pair with the same hardware on the port, also where
    # one was synthesized on another board of the family (one whose port can bridge it).
    points = load(family)["points"]
    for name, base in bus_pairs(points, model.bus_width):
        board = BOARDS[points[name].get("board", load(family)["board"])]
        assert board.part.family == family and board.bridged(
            HardwareConfig.from_dict(points[name]["config"])), name


def test_a_bus_config_without_its_counterpart_is_refused():
    data = load("zynq-7000")
    name, _ = bus_pairs(data["points"], 64)[0]
    # The wide-bus config's core no longer matches any config on the 64-bit bus.
    points = json.loads(json.dumps(data["points"]))
    points[name]["config"]["uop_buff_size"] //= 2
    with pytest.raises(ValueError, match=f"{name!r} .* has a 128-bit DRAM bus but the same "
                                         "config with the family's 64 bits .* is not "
                                         "calibrated"):
        ResourceModel.fit(dict(data, points=points))


def test_a_bus_the_calibration_has_no_pair_for_is_a_clear_error():
    # The Cyclone V calibration is all on the de10-nano's 64-bit port.
    model = ResourceModel.for_family("cyclone-v")
    assert model.unpriced(HardwareConfig()) == []
    with pytest.raises(ValueError, match=r"cannot price a 128-bit DRAM bus \(calibrated: 64 "
                                         r"bits\)"):
        model.predict(HardwareConfig(dram_bus_width=128))


def unpriced_model():
    """The 7-series' model fitted without its extension configs: it prices neither."""
    data = load("zynq-7000")
    plain = {n: p for n, p in data["points"].items()
             if not any(extension_terms(HardwareConfig.from_dict(p["config"])).values())}
    return ResourceModel.fit(dict(data, points=plain))


def test_a_feature_the_calibration_has_no_config_with_is_a_clear_error():
    model = unpriced_model()
    assert model.unpriced(HardwareConfig(alu_hold=True)) == ["alu_hold"]
    model.predict(HardwareConfig())
    with pytest.raises(ValueError, match=r"zynq-7000 resource model cannot price req_lanes, "
                                         r"alu_hold \(1x16x16.*-req-hold\): its calibration "
                                         r"has no config with it.*EXTENSION_CONFIGS.*--family "
                                         r"zynq-7000"):
        model.predict(HardwareConfig(alu_ops=REQ, alu_hold=True))


def test_a_sweep_over_a_feature_its_board_cannot_price_stops_before_any_point(monkeypatch):
    model = unpriced_model()
    monkeypatch.setattr(ResourceModel, "for_board", classmethod(lambda cls, board: model))
    spec = SweepSpec.from_dict({"board": "pynq-z1", "models": ["digits_cnn"],
                                "parameters": {"block_in": [8, 16],
                                               "alu_hold": [False, True]}})
    with pytest.raises(ValueError, match="parameter alu_hold = true on pynq-z1: the "
                                         "zynq-7000 resource model cannot price alu_hold"):
        Evaluator(spec)


def test_a_grid_sweep_over_the_features(tmp_path, capsys):
    from vdla.cli import main
    out = tmp_path / "out"
    status = main(["sweep", "--board", "pynq-z1", "--model", "digits_cnn",
                   "--param", "alu_hold=false,true",
                   "--param", f"alu_ops={'+'.join(BASE_OPS)},{'+'.join(BASE_OPS + ['REQ'])}",
                   "--search", "grid", "--jobs", "1", "--no-plots", "--out", str(out)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    points = {p["config_name"]: p for p in json.loads((out / "sweep.json").read_text())["points"]}
    default = BOARDS["pynq-z1"].config
    names = [default.name + suffix for suffix in ("", "-req", "-hold", "-req-hold")]
    assert sorted(points) == sorted(names)
    assert all(p["valid"] for p in points.values()), [p["reason"] for p in points.values()]
    model = ResourceModel.for_board(BOARDS["pynq-z1"])
    for name, point in points.items():
        config = HardwareConfig.from_dict(point["config"])
        assert point["objectives"]["lut"] == model.predict(config).lut
        assert point["objectives"]["ff"] == model.predict(config).ff
    plain, req, hold, both = (points[n]["objectives"] for n in names)
    # Each extension costs logic (REQ LUTs, alu_hold flip-flops) and saves cycles (REQ: one
    # ALU pass for the requantization; alu_hold: one micro-op a cycle); the costs add up.
    assert req["lut"] > plain["lut"] and hold["ff"] > plain["ff"]
    for key in ("lut", "ff"):
        assert abs(both[key] - (req[key] + hold[key] - plain[key])) <= 1, key   # rounding
    assert plain["dsp"] == req["dsp"] == hold["dsp"] == both["dsp"]
    assert plain["bram"] == req["bram"] == hold["bram"] == both["bram"]
    assert both["cycles"] < req["cycles"] < plain["cycles"]
    assert both["cycles"] < hold["cycles"] < plain["cycles"]


def test_a_sampled_sweep_chooses_among_the_feature_values(tmp_path, capsys):
    # Optuna's categorical choices cannot hold lists (alu_ops): the sampler picks indices.
    from vdla.cli import main
    out = tmp_path / "out"
    status = main(["sweep", "--board", "pynq-z1", "--model", "digits_cnn",
                   "--param", "alu_hold=false,true",
                   "--param", f"alu_ops={'+'.join(BASE_OPS)},{'+'.join(BASE_OPS + ['REQ'])}",
                   "--search", "tpe", "--trials", "4", "--jobs", "1", "--no-plots",
                   "--out", str(out)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    points = json.loads((out / "sweep.json").read_text())["points"]
    default = BOARDS["pynq-z1"].config.name
    assert len(points) == 4 and all(p["valid"] for p in points)
    assert {p["config_name"] for p in points} <= {default + s for s in
                                                   ("", "-req", "-hold", "-req-hold")}
    for p in points:
        config = HardwareConfig.from_dict(p["config"])
        assert p["params"]["alu_hold"] == config.alu_hold
        assert (AluOp.REQ in config.alu_ops) == ("REQ" in p["params"]["alu_ops"])
