"""HardwareConfig: VTA's defaults, derived values, names, validation and JSON.

Expected numbers are written out by hand from docs/config.md, docs/isa.md and VTA's
``vta_config.json``; none is computed with the code under test.
"""

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest

from vdla import AluOp, HardwareConfig

DEFAULT_NAME = "1x16x16_i8w8a32_15_15_18_17"

#: VTA's pynq ``vta_config.json`` (HW_VER 0.0.2), the default design.
VTA_PYNQ = {"TARGET": "pynq", "HW_VER": "0.0.2", "LOG_INP_WIDTH": 3, "LOG_WGT_WIDTH": 3,
            "LOG_ACC_WIDTH": 5, "LOG_BATCH": 0, "LOG_BLOCK": 4, "LOG_UOP_BUFF_SIZE": 15,
            "LOG_INP_BUFF_SIZE": 15, "LOG_WGT_BUFF_SIZE": 18, "LOG_ACC_BUFF_SIZE": 17}


def names(field, value):
    """A regex matching a message that names `field` and then the bad `value`."""
    return (rf"\b{re.escape(field)}\b.*(?<![\w.]){re.escape(repr(value))}(?![\w.])")


# --- defaults -------------------------------------------------------------------------


def test_defaults_are_vtas_default():
    cfg = HardwareConfig()
    assert (cfg.batch, cfg.block_in, cfg.block_out) == (1, 16, 16)
    assert (cfg.inp_width, cfg.wgt_width, cfg.acc_width) == (8, 8, 32)
    assert cfg.uop_buff_size == 32768
    assert cfg.inp_buff_size == 32768
    assert cfg.wgt_buff_size == 262144
    assert cfg.acc_buff_size == 131072
    assert cfg.alu_ops == {AluOp.MIN, AluOp.MAX, AluOp.ADD, AluOp.SHR}
    assert AluOp.MUL not in cfg.alu_ops


def test_default_derived_values():
    cfg = HardwareConfig()
    assert cfg.uop_depth == 8192
    assert cfg.inp_depth == 2048
    assert cfg.wgt_depth == 1024
    assert cfg.acc_depth == 2048
    assert cfg.out_depth == 2048
    assert (cfg.log_uop_depth, cfg.log_inp_depth, cfg.log_wgt_depth, cfg.log_acc_depth) == (
        13, 11, 10, 11)
    assert (cfg.inp_elem_bytes, cfg.wgt_elem_bytes, cfg.acc_elem_bytes, cfg.out_elem_bytes) == (
        16, 256, 64, 16)
    assert cfg.out_width == 8
    assert cfg.out_buff_size == 32768  # acc depth x 16 lanes x 8 bits
    assert (cfg.uop_bits, cfg.uop_bytes) == (32, 4)
    assert (cfg.uop_dst_bits, cfg.uop_src_bits, cfg.uop_wgt_bits) == (11, 11, 10)
    assert cfg.macs_per_cycle == 256
    assert cfg.name == DEFAULT_NAME


def test_derived_dict_matches_properties():
    derived = HardwareConfig(clock_mhz=200).derived()
    assert derived["name"] == DEFAULT_NAME
    assert derived["uop_depth"] == 8192 and derived["out_depth"] == 2048
    assert derived["uop_fields"] == {"dst": 11, "src": 11, "wgt": 10}
    # TVM paper: VTA on PYNQ, 16x16 int8 GEMM at 200 MHz, 102.4 GOPS peak.
    assert derived["peak_gops"] == pytest.approx(102.4)


def test_frozen():
    cfg = HardwareConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.batch = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.alu_ops = frozenset(AluOp)
    assert cfg.batch == 1


def test_keyword_only():
    with pytest.raises(TypeError):
        HardwareConfig(2)


def test_equal_and_hashable():
    a = HardwareConfig(alu_ops=["min", "MAX", AluOp.ADD, "shr"])
    b = HardwareConfig()
    assert a == b and hash(a) == hash(b)
    assert isinstance(a.alu_ops, frozenset)
    assert {a: 1}[b] == 1
    assert HardwareConfig(batch=2) != b


def test_replace_validates():
    cfg = HardwareConfig().replace(batch=2)
    assert cfg.batch == 2 and cfg.block_in == 16
    with pytest.raises(ValueError, match=names("batch", 3)):
        HardwareConfig().replace(batch=3)


# --- non-default configs ---------------------------------------------------------------

NON_DEFAULT = [
    pytest.param(
        dict(batch=2, block_in=32, block_out=32),
        dict(name="2x32x32_i8w8a32_15_15_18_17", inp_elem_bytes=64, wgt_elem_bytes=1024,
             acc_elem_bytes=256, out_elem_bytes=64, uop_bits=32, uop_depth=8192,
             inp_depth=512, wgt_depth=256, acc_depth=512, out_depth=512, out_buff_size=32768,
             uop_fields={"dst": 9, "src": 9, "wgt": 8}, macs_per_cycle=2048),
        id="batch2-block32"),
    pytest.param(
        dict(uop_buff_size=4096, inp_buff_size=8192, wgt_buff_size=16384, acc_buff_size=16384),
        dict(name="1x16x16_i8w8a32_12_13_14_14", inp_elem_bytes=16, wgt_elem_bytes=256,
             acc_elem_bytes=64, out_elem_bytes=16, uop_bits=32, uop_depth=1024,
             inp_depth=512, wgt_depth=64, acc_depth=256, out_depth=256, out_buff_size=4096,
             uop_fields={"dst": 8, "src": 9, "wgt": 6}, macs_per_cycle=256),
        id="small-buffers"),
    pytest.param(
        dict(block_in=32, block_out=16),
        dict(name="1x32x16_i8w8a32_15_15_18_17", inp_elem_bytes=32, wgt_elem_bytes=512,
             acc_elem_bytes=64, out_elem_bytes=16, uop_bits=32, uop_depth=8192,
             inp_depth=1024, wgt_depth=512, acc_depth=2048, out_depth=2048,
             out_buff_size=32768, uop_fields={"dst": 11, "src": 11, "wgt": 9},
             macs_per_cycle=512),
        id="block-in32-out16"),
    pytest.param(
        # dst 11 + src 11 + wgt 11 = 33 bits: micro-ops are stored as 64-bit words.
        dict(inp_buff_size=16384, wgt_buff_size=524288),
        dict(name="1x16x16_i8w8a32_15_14_19_17", inp_elem_bytes=16, wgt_elem_bytes=256,
             acc_elem_bytes=64, out_elem_bytes=16, uop_bits=64, uop_depth=4096,
             inp_depth=1024, wgt_depth=2048, acc_depth=2048, out_depth=2048,
             out_buff_size=32768, uop_fields={"dst": 11, "src": 11, "wgt": 11},
             macs_per_cycle=256),
        id="64-bit-uops"),
    pytest.param(
        dict(alu_ops=["MIN", "MAX", "ADD", "SHR", "MUL"], cmd_queue_depth=64,
             token_queue_depth=16, dram_bus_width=128, clock_mhz=250),
        dict(name=DEFAULT_NAME + "-mul-cq64-tq16-bus128", uop_depth=8192, acc_depth=2048,
             macs_per_cycle=256, peak_gops=128.0),
        id="mul-queues-bus"),
]


@pytest.mark.parametrize("kwargs, expected", NON_DEFAULT)
def test_non_default_configs(kwargs, expected):
    derived = HardwareConfig(**kwargs).derived()
    assert {key: derived[key] for key in expected} == expected


def test_mul_config_has_all_ops():
    cfg = HardwareConfig(alu_ops=["MIN", "MAX", "ADD", "SHR", "mul"])
    assert cfg.alu_ops == frozenset(AluOp) - {AluOp.REQ, AluOp.TAB, AluOp.DIV}
    assert cfg.name.endswith("-mul")


def test_extensions_past_vta_are_named_and_listed():
    """Each extension is off by default, a suffix of the name, listed in `extensions` and
    the derived values, and kept by JSON."""
    assert HardwareConfig().extensions == ()
    cfg = HardwareConfig(alu_ops=["MIN", "MAX", "ADD", "SHR", "MUL", "REQ"], alu_hold=True)
    assert cfg.name == DEFAULT_NAME + "-mul-req-hold"
    assert cfg.extensions == ("req", "hold") and cfg.derived()["extensions"] == ["req", "hold"]
    assert HardwareConfig.from_json(cfg.to_json()) == cfg
    assert HardwareConfig.from_json(cfg.to_json()).name == cfg.name


@pytest.mark.parametrize("value", [-1, 2.5, "220", True, None])
def test_dsp_limit_must_be_a_non_negative_integer(value):
    with pytest.raises(ValueError, match=r"gemm_dsp_limit must be a non-negative integer"):
        HardwareConfig(gemm_dsp_limit=value)


def test_a_dsp_limit_past_the_core_is_no_limit():
    assert HardwareConfig(gemm_dsp_limit=128) == HardwareConfig()      # 128 pairs: all DSPs
    limited = HardwareConfig(gemm_dsp_limit=100)
    assert limited.gemm_lut_multipliers == 28 and limited.name.endswith("-dsp100")


@pytest.mark.parametrize("value", [1, "yes", None])
def test_extension_flags_must_be_booleans(value):
    with pytest.raises(ValueError, match=r"alu_hold must be true or false, not"):
        HardwareConfig(alu_hold=value)


def test_clock_is_not_part_of_the_name():
    assert HardwareConfig(clock_mhz=333.3).name == DEFAULT_NAME


def test_the_platform_fields_are_not_the_hardware():
    # The clock and the DRAM's bandwidth: not in the name, reset by hardware().
    fast = HardwareConfig(clock_mhz=150, dram_bytes_per_cycle=12.5, block_out=32)
    assert fast.name == HardwareConfig(block_out=32).name
    assert fast.hardware() == HardwareConfig(block_out=32) != fast
    assert HardwareConfig.from_dict(fast.to_dict()) == fast
    assert HardwareConfig().dram_bytes_per_cycle == 8.0


def test_default_instruction_field_widths():
    # docs/isa.md's layout table, widths only: GEMM's first 64-bit word uses 63 bits, its second 64.
    widths = HardwareConfig().insn_field_widths()
    gemm_a, gemm_b = widths["GEMM"]
    assert dict(gemm_a) == {"opcode": 3, "pop_prev": 1, "pop_next": 1, "push_prev": 1,
                            "push_next": 1, "reset_reg": 1, "uop_bgn": 13, "uop_end": 14,
                            "iter_out": 14, "iter_in": 14}
    assert gemm_b == [("dst_factor_out", 11), ("dst_factor_in", 11), ("src_factor_out", 11),
                      ("src_factor_in", 11), ("wgt_factor_out", 10), ("wgt_factor_in", 10)]
    alu_b = widths["ALU"][1]
    assert alu_b[-3:] == [("alu_opcode", 3), ("use_imm", 1), ("imm", 16)]
    assert widths["FINISH"][1] == []


# --- bad values -------------------------------------------------------------------------

BAD_VALUES = {
    "batch": [0, -1, 3, 6, 128, "1", 1.0, True, None],
    "block_in": [0, -16, 24, 512, "16", 16.0, True],
    "block_out": [0, -16, 12, 512, "16", 16.0, True],
    "inp_width": [0, 4, 16, -8, "8", 8.0, True],
    "wgt_width": [0, 4, 16, "8", 8.0],
    "acc_width": [0, 8, 16, 64, "32", 32.0],
    # 4 bytes hold one 32-bit micro-op; 2**17 bytes would be 32768 micro-ops whose
    # uop_bgn/uop_end widths no longer fit the GEMM instruction.
    "uop_buff_size": [0, -1, 3000, 4, 1 << 17, 1 << 27, "32768", 32768.0, True],
    # 16 bytes is one element; 2**21 bytes is 131072 elements (more than sram_base
    # addresses); 2**16 bytes makes GEMM need 130 bits.
    "inp_buff_size": [0, -32768, 1000, 16, 1 << 21, 1 << 16, "32768", 32768.0],
    # 256 bytes is one element; 2**25 bytes too deep; 2**20 bytes makes GEMM need 132 bits.
    "wgt_buff_size": [0, 100, 256, 1 << 25, 1 << 20, "262144", 262144.0],
    # 64 bytes is one element; 2**23 bytes too deep; 256 KiB makes GEMM need 130 bits.
    "acc_buff_size": [0, -1, 100, 64, 1 << 23, 256 * 1024, "131072", 131072.0, True],
    "cmd_queue_depth": [0, 1, -5, 65537, "512", 512.0, True],
    "token_queue_depth": [0, 1, -1, 1 << 20, "512", 512.0, None],
    "dram_bus_width": [0, 16, 48, 2048, -64, "64", 64.0, True],
    "clock_mhz": [0, -100, float("nan"), float("inf"), "100", True, None],
    # eighths of a byte, 0.125 to 1024
    "dram_bytes_per_cycle": [0, 0.1, 12.3, 2048, -8, "8", True, None, float("nan")],
}


@pytest.mark.parametrize("field", sorted(BAD_VALUES))
def test_bad_values_name_field_and_value(field):
    for value in BAD_VALUES[field]:
        with pytest.raises(ValueError, match=names(field, value)):
            HardwareConfig(**{field: value})


@pytest.mark.parametrize("value, fragment", [
    ("MUL", "'MUL'"),                                   # a string, not a collection
    (4, "4"),                                           # not a collection
    (None, "None"),
    (["MIN", "MAX", "ADD", "SHR", "XOR"], "'XOR'"),      # unknown operation
    (["MIN", "MAX", "ADD", "SHR", 4], "4"),              # a bare number is not an op
    (["MIN", "MAX", "ADD"], "missing SHR"),              # required op left out
    (["MUL"], "missing ADD, MAX, MIN, SHR"),
    ([], "missing ADD, MAX, MIN, SHR"),
])
def test_bad_alu_ops(value, fragment):
    with pytest.raises(ValueError, match=r"\balu_ops\b.*" + re.escape(fragment)):
        HardwareConfig(alu_ops=value)


def test_layout_too_wide_message():
    with pytest.raises(ValueError, match=r"GEMM instruction needs 130 bits.*more than 128"):
        HardwareConfig(acc_buff_size=256 * 1024)
    with pytest.raises(ValueError, match=r"ALU instruction needs 132 bits"):
        # The GEMM fits (126 bits) with 16 KiB of inp, but the ALU's acc-wide src
        # factors do not: 4 x 12 + 20 = 68 bits in its second word.
        HardwareConfig(inp_buff_size=16384, wgt_buff_size=131072, acc_buff_size=256 * 1024,
                       uop_buff_size=16384)


# --- JSON -------------------------------------------------------------------------------

CUSTOM = dict(batch=2, block_in=32, block_out=32, uop_buff_size=16384,
              alu_ops=["MIN", "MAX", "ADD", "SHR", "MUL"], cmd_queue_depth=64,
              token_queue_depth=8, dram_bus_width=128, clock_mhz=187.5)


@pytest.mark.parametrize("kwargs", [{}, CUSTOM], ids=["default", "custom"])
def test_json_text_round_trip(kwargs):
    cfg = HardwareConfig(**kwargs)
    text = cfg.to_json()
    assert HardwareConfig.from_json(text) == cfg
    data = json.loads(text)
    assert data["alu_ops"] == sorted(op.name for op in cfg.alu_ops)
    assert data["batch"] == kwargs.get("batch", 1)
    assert data["clock_mhz"] == kwargs.get("clock_mhz", 100.0)
    assert HardwareConfig.from_dict(data) == cfg


@pytest.mark.parametrize("as_path", [str, Path], ids=["str", "Path"])
def test_json_file_round_trip(tmp_path, as_path):
    cfg = HardwareConfig(**CUSTOM)
    target = tmp_path / "sub" / "cfg.json"
    text = cfg.to_json(as_path(target))
    assert target.read_text() == text
    assert HardwareConfig.from_json(as_path(target)) == cfg
    # Atomic write: no temporary file left next to the result.
    assert sorted(os.listdir(target.parent)) == ["cfg.json"]
    # Overwriting keeps a single, complete file.
    HardwareConfig().to_json(target)
    assert HardwareConfig.from_json(target) == HardwareConfig()
    assert sorted(os.listdir(target.parent)) == ["cfg.json"]


def test_json_path_whose_name_starts_with_brace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    HardwareConfig(batch=2).to_json(Path("{x}.json"))
    assert HardwareConfig.from_json(Path("{x}.json")).batch == 2


def test_vta_config_equals_default(tmp_path):
    assert HardwareConfig.from_dict(VTA_PYNQ) == HardwareConfig()
    path = tmp_path / "vta_config.json"
    path.write_text(json.dumps(VTA_PYNQ, indent=2))
    cfg = HardwareConfig.from_json(path)
    assert cfg == HardwareConfig()
    assert cfg.name == DEFAULT_NAME
    assert HardwareConfig.from_json(json.dumps(VTA_PYNQ)) == HardwareConfig()


def test_vta_config_non_default():
    data = dict(VTA_PYNQ, TARGET="sim", LOG_BATCH=1, LOG_BLOCK=5, LOG_UOP_BUFF_SIZE=14)
    cfg = HardwareConfig.from_dict(data)
    assert (cfg.batch, cfg.block_in, cfg.block_out, cfg.uop_buff_size) == (2, 32, 32, 16384)
    assert cfg.name == "2x32x32_i8w8a32_14_15_18_17"


def test_vta_config_old_format():
    # VTA 0.0.1's vta_config.json: separate block sizes, clock and out-width keys.
    data = {"TARGET": "pynq", "HW_FREQ": 100, "HW_CLK_TARGET": 8, "HW_VER": "0.0.1",
            "LOG_INP_WIDTH": 3, "LOG_WGT_WIDTH": 3, "LOG_ACC_WIDTH": 5, "LOG_OUT_WIDTH": 3,
            "LOG_BATCH": 0, "LOG_BLOCK_IN": 5, "LOG_BLOCK_OUT": 4, "LOG_UOP_BUFF_SIZE": 15,
            "LOG_INP_BUFF_SIZE": 15, "LOG_WGT_BUFF_SIZE": 18, "LOG_ACC_BUFF_SIZE": 17,
            "LOG_OUT_BUFF_SIZE": 15}
    cfg = HardwareConfig.from_dict(data)
    assert (cfg.block_in, cfg.block_out, cfg.clock_mhz) == (32, 16, 100)
    # A specific LOG_BLOCK_IN wins over LOG_BLOCK, whichever comes first.
    both = {"LOG_BLOCK_IN": 5, "LOG_BLOCK": 4}
    assert HardwareConfig.from_dict(both).block_in == 32
    assert HardwareConfig.from_dict(dict(reversed(both.items()))).block_in == 32
    assert HardwareConfig.from_dict(both).block_out == 16


@pytest.mark.parametrize("data, pattern", [
    ({"batch": 1, "bogus": 2}, r"unknown hardware config key\(s\) 'bogus'"),
    ({"Batch": 1}, r"'Batch'"),
    (dict(VTA_PYNQ, LOG_FOO=3), r"unknown VTA config key 'LOG_FOO'"),
    (dict(VTA_PYNQ, batch=1), r"unknown VTA config key 'batch'"),
    ({"LOG_BATCH": -1}, r"LOG_BATCH.*integer from 0 to 31.*-1"),
    ({"LOG_BLOCK": "4"}, r"LOG_BLOCK.*'4'"),
    ({"LOG_BLOCK": 4.0}, r"LOG_BLOCK.*4\.0"),
    ({"LOG_BATCH": 7}, names("batch", 128)),
    ({"LOG_INP_WIDTH": 4}, names("inp_width", 16)),
    ({"batch": 3}, names("batch", 3)),
    ({"alu_ops": "MUL"}, r"alu_ops.*'MUL'"),
])
def test_from_dict_errors(data, pattern):
    with pytest.raises(ValueError, match=pattern):
        HardwareConfig.from_dict(data)
    with pytest.raises(ValueError, match=r"hardware config JSON: .*" + pattern):
        HardwareConfig.from_json(json.dumps(data))


def test_from_json_errors(tmp_path):
    missing = tmp_path / "missing.json"
    with pytest.raises(ValueError, match=rf"cannot read hardware config '{re.escape(str(missing))}'"):
        HardwareConfig.from_json(missing)
    with pytest.raises(ValueError, match=r"cannot read hardware config .*: No such file"):
        HardwareConfig.from_json(str(missing))
    with pytest.raises(ValueError, match=r"cannot read hardware config"):
        HardwareConfig.from_json(tmp_path)  # a folder
    bad = tmp_path / "bad.json"
    bad.write_text('{"batch": 1,,}')
    with pytest.raises(ValueError, match=rf"hardware config '{re.escape(str(bad))}' is not valid JSON"):
        HardwareConfig.from_json(bad)
    with pytest.raises(ValueError, match=r"hardware config JSON is not valid JSON"):
        HardwareConfig.from_json('{"batch": }')
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"must be a JSON object, not list"):
        HardwareConfig.from_json(listing)
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"block_in": 24}')
    with pytest.raises(ValueError, match=rf"'{re.escape(str(wrong))}'.*" + names("block_in", 24)):
        HardwareConfig.from_json(wrong)
    with pytest.raises(ValueError, match=r"must be a JSON object, not list"):
        HardwareConfig.from_dict([("batch", 1)])
    with pytest.raises(ValueError, match=r"unknown hardware config key\(s\) 1, 'bogus'"):
        HardwareConfig.from_dict({1: 16, "bogus": 2, "batch": 1})
