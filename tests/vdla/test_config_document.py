"""HardwareConfig reads the document ``vdla config show --json`` writes: the parameters
define the config, the derived values and instruction layouts are checked against it
(a mismatch is a ValueError naming the field, the file's value and the parameters')."""

import json
import re

import pytest

from vdla import HardwareConfig
from vdla.isa import layouts_for

CUSTOM = dict(batch=2, block_in=32, block_out=32, uop_buff_size=16384,
              alu_ops=["MIN", "MAX", "ADD", "SHR", "MUL"], cmd_queue_depth=64,
              token_queue_depth=8, dram_bus_width=128, clock_mhz=187.5)
#: A config whose GEMM/ALU first group needs more than 64 bits (uop depth 65536), so
#: the second group does not start at bit 64.
WIDE_UOP = dict(uop_buff_size=1 << 18, acc_buff_size=1 << 13, inp_buff_size=1 << 12,
                wgt_buff_size=1 << 14)


def document(cfg: HardwareConfig) -> dict:
    """What `vdla config show --json` prints, built from `vdla.isa` (independently of
    the config's own check)."""
    return json.loads(json.dumps({
        "parameters": cfg.to_dict(), "derived": cfg.derived(),
        "insn_layouts": {k: layout.bit_ranges() for k, layout in layouts_for(cfg).items()}}))


@pytest.mark.parametrize("kwargs", [{}, CUSTOM, WIDE_UOP], ids=["default", "custom", "wide-uop"])
def test_show_document_round_trips(kwargs):
    cfg = HardwareConfig(**kwargs)
    doc = document(cfg)
    assert HardwareConfig.from_dict(doc) == cfg
    assert HardwareConfig.from_json(json.dumps(doc)) == cfg
    # The parameters alone, or with only some derived values, are enough.
    assert HardwareConfig.from_dict({"parameters": doc["parameters"]}) == cfg
    partial = {"parameters": doc["parameters"], "derived": {"acc_depth": cfg.acc_depth}}
    assert HardwareConfig.from_dict(partial) == cfg


def test_wide_uop_config_moves_the_second_group():
    gemm = document(HardwareConfig(**WIDE_UOP))["insn_layouts"]["GEMM"]
    assert gemm["iter_in"] == "68:55" and gemm["dst_factor_out"] == "75:69"


def test_plain_and_vta_dicts_still_load():
    assert HardwareConfig.from_dict({"batch": 2}).batch == 2
    assert HardwareConfig.from_dict({"LOG_BATCH": 1}).batch == 2


def expect_error(doc, pattern):
    with pytest.raises(ValueError, match=pattern):
        HardwareConfig.from_dict(doc)
    with pytest.raises(ValueError, match=r"hardware config JSON: .*" + pattern):
        HardwareConfig.from_json(json.dumps(doc))


def test_a_tampered_derived_value_names_the_field_and_both_values():
    doc = document(HardwareConfig())
    doc["derived"]["acc_depth"] = 1024
    expect_error(doc, re.escape("derived.acc_depth is 1024 in the file, but the parameters "
                                "give 2048"))


def test_a_parameter_changed_alone_is_caught_by_its_derived_values():
    doc = document(HardwareConfig())
    doc["parameters"]["clock_mhz"] = 200.0
    expect_error(doc, re.escape("derived.peak_gops is 51.2 in the file, but the parameters "
                                "give 102.4") + r".*delete 'derived' and 'insn_layouts'")
    doc = document(HardwareConfig())
    doc["parameters"]["acc_buff_size"] = 1 << 16
    expect_error(doc, r"derived\.name is '1x16x16_i8w8a32_15_15_18_17' in the file, but the "
                      r"parameters give '1x16x16_i8w8a32_15_15_18_16'")


def test_a_nested_derived_value_and_a_layout_are_checked():
    doc = document(HardwareConfig())
    doc["derived"]["uop_fields"]["src"] = 12
    expect_error(doc, re.escape("derived.uop_fields.src is 12 in the file, but the "
                                "parameters give 11"))
    doc = document(HardwareConfig())
    doc["insn_layouts"]["GEMM"]["uop_bgn"] = "21:8"
    expect_error(doc, re.escape("insn_layouts.GEMM.uop_bgn is '21:8' in the file, but the "
                                "parameters give '20:8'"))
    doc = document(HardwareConfig())
    doc["derived"]["acc_depth"] = "2048"      # the right number, as a string
    expect_error(doc, re.escape("derived.acc_depth is '2048' in the file"))


@pytest.mark.parametrize("change, pattern", [
    (lambda d: d.update(version=2), r"unknown key\(s\) 'version' next to 'parameters'.*"
                                    r"parameters, derived, insn_layouts"),
    (lambda d: d.update(parameters=[1]), r"'parameters' must be a JSON object.*not list"),
    (lambda d: d["parameters"].update(bogus=1), r"unknown hardware config key\(s\) 'bogus'"),
    (lambda d: d["parameters"].update(batch=3), r"HardwareConfig\.batch.*not 3"),
    (lambda d: d["derived"].update(bogus=1),
     r"derived has unknown field\(s\) 'bogus'; known: name"),
    (lambda d: d["insn_layouts"].update(NOP={}), r"insn_layouts has unknown field\(s\) 'NOP'"),
    (lambda d: d["insn_layouts"]["ALU"].update(spare="127"),
     r"insn_layouts\.ALU has unknown field\(s\) 'spare'"),
    (lambda d: d.update(derived=7), r"derived must be a JSON object, not 7"),
])
def test_document_errors(change, pattern):
    doc = document(HardwareConfig())
    change(doc)
    expect_error(doc, pattern)
