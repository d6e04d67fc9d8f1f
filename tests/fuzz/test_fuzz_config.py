"""Fuzzing `HardwareConfig.from_dict` / `from_json` with random config dictionaries:
vdla's own keys, VTA's ``vta_config.json`` keys, and the document ``vdla config show
--json`` writes. Each ends in a ValueError that names what is wrong, or in a valid config:
one that round-trips through its own JSON (and its show document), reads the same from
JSON text as from the dictionary, and lays out every instruction and micro-op within
their bits.

The values mix the interesting valid ones (powers of two around each field's range, the
widths the hardware implements, ALU op names in any case) with junk (None, booleans,
strings, NaN, huge integers, lists, objects), so Hypothesis reaches both outcomes
often; the inputs are derandomized (the same on every run).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, strategies as st

from fuzzing import count, fuzz_settings
from vdla.config import HardwareConfig
from vdla.isa import layouts_for, uop_layout

TARGET = "HardwareConfig"
#: Configs per test: about 1 ms each.
EXAMPLES = 500
FIELDS = [f.name for f in dataclasses.fields(HardwareConfig)]

JUNK = st.one_of(st.none(), st.booleans(), st.text(max_size=6), st.floats(),
                 st.integers(-(1 << 70), 1 << 70), st.lists(st.integers(-2, 2), max_size=3),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _pow2(low: int, high: int):
    return st.integers(low, high).map(lambda e: 1 << e)


VALUES = {
    "batch": _pow2(0, 7), "block_in": _pow2(0, 9), "block_out": _pow2(0, 9),
    "inp_width": st.sampled_from([8, 4, 16]), "wgt_width": st.sampled_from([8, 4]),
    "acc_width": st.sampled_from([32, 16, 64]),
    "uop_buff_size": _pow2(0, 27), "inp_buff_size": _pow2(0, 27),
    "wgt_buff_size": _pow2(0, 27), "acc_buff_size": _pow2(0, 27),
    "cmd_queue_depth": st.integers(0, 70000), "token_queue_depth": st.integers(0, 70000),
    "dram_bus_width": _pow2(3, 11),
    "alu_ops": st.lists(st.sampled_from(["MIN", "MAX", "ADD", "SHR", "MUL", "REQ", "min",
                                         "Mul", "req", "XOR", "TAB", "div", ""]), max_size=7),
    "alu_hold": st.one_of(st.booleans(), st.integers(0, 1)),
    "div_pipeline": st.one_of(st.booleans(), st.integers(0, 1)),
    "gemm_dsp_limit": st.one_of(st.integers(-2, 1 << 10), st.booleans()),
    "dsp_pack": st.one_of(st.booleans(), st.integers(0, 1)),
    "dw_taps": st.one_of(st.sampled_from([0, 0, 2, 3, 4, 8]), st.integers(-1, 20), st.booleans()),
    "clock_mhz": st.one_of(st.floats(), st.integers(-5, 1 << 1100)),
    # eighths of a byte mostly, and any float
    "dram_bytes_per_cycle": st.one_of(st.integers(0, 8200).map(lambda e: e / 8), st.floats(),
                                      st.integers(-5, 2000)),
}
#: VTA's keys: log2 of each size.
VTA_KEYS = ("LOG_INP_WIDTH", "LOG_WGT_WIDTH", "LOG_ACC_WIDTH", "LOG_BATCH", "LOG_BLOCK",
            "LOG_BLOCK_IN", "LOG_BLOCK_OUT", "LOG_UOP_BUFF_SIZE", "LOG_INP_BUFF_SIZE",
            "LOG_WGT_BUFF_SIZE", "LOG_ACC_BUFF_SIZE")
VTA_IGNORED = ("TARGET", "HW_VER", "HW_CLK_TARGET", "LOG_OUT_WIDTH", "LOG_OUT_BUFF_SIZE")


def _maybe_junk(strategy):
    # Mostly the field's own kind of value, sometimes junk.
    return st.one_of(strategy, strategy, strategy, JUNK)


def _vdla_dicts():
    keys = {name: _maybe_junk(VALUES[name]) for name in FIELDS}
    unknown = st.dictionaries(st.sampled_from(["bogus", "Batch", "LOG", "derived", ""]),
                              JUNK, max_size=1)
    return st.tuples(st.fixed_dictionaries({}, optional=keys),
                     st.one_of(st.just({}), st.just({}), unknown)).map(
        lambda parts: {**parts[0], **parts[1]})


def _vta_dicts():
    keys = {k: _maybe_junk(st.integers(-1, 32)) for k in VTA_KEYS if k != "LOG_BATCH"}
    keys.update({k: JUNK for k in VTA_IGNORED})
    keys["HW_FREQ"] = _maybe_junk(st.integers(1, 500))
    keys["LOG_BOGUS"] = JUNK
    return st.fixed_dictionaries({"LOG_BATCH": _maybe_junk(st.integers(-1, 8))},
                                 optional=keys)


@st.composite
def _show_documents(draw):
    """`vdla config show --json` documents: the parameters, and derived values and
    layouts that are right, edited, junk or absent."""
    params = draw(st.one_of(_vdla_dicts(), JUNK))
    doc = {"parameters": params}
    try:
        config = HardwareConfig.from_dict(params)
    except ValueError:
        config = None
    for key in ("derived", "insn_layouts"):
        kind = draw(st.sampled_from(["right", "edited", "junk", "absent"]))
        if kind == "absent":
            continue
        if kind == "junk" or config is None:
            doc[key] = draw(JUNK)
            continue
        value = show_document(config)[key]
        if kind == "edited":
            field = draw(st.sampled_from(sorted(value)))
            value[field] = draw(st.one_of(JUNK, st.just(value[field])))
        doc[key] = value
    if draw(st.booleans()):
        doc.update(draw(st.dictionaries(st.sampled_from(["name", "extra"]), JUNK,
                                        max_size=1)))
    return doc


def show_document(config: HardwareConfig) -> dict:
    """What ``vdla config show --json`` writes for `config`."""
    return {"parameters": config.to_dict(), "derived": config.derived(),
            "insn_layouts": {kind: layout.bit_ranges()
                             for kind, layout in layouts_for(config).items()}}


def _keys(data) -> set[str]:
    keys = set(data) if isinstance(data, dict) else set()
    params = data.get("parameters") if isinstance(data, dict) else None
    return keys | (set(params) if isinstance(params, dict) else set())


def check_config(data: dict) -> HardwareConfig | None:
    """Feed `data` to `HardwareConfig.from_dict` (counted) and check the outcome; the
    config, or None after a clear error. Any other exception fails the test."""
    count(TARGET)
    try:
        config = HardwareConfig.from_dict(data)
    except ValueError as exc:
        message = str(exc)
        # It names a parameter (HardwareConfig.<field>, or the sizes that do not fit) or
        # a key of the input.
        assert "HardwareConfig" in message or any(
            repr(key) in message or (key and key in message) for key in _keys(data)), message
        # The JSON text of the same dictionary is refused too.
        try:
            HardwareConfig.from_json(json.dumps(data))
        except ValueError:
            return None
        raise AssertionError(f"from_json accepts what from_dict refuses: {data!r}")
    assert HardwareConfig.from_json(json.dumps(data)) == config
    # Valid: it round-trips through its own JSON and its show document...
    again = HardwareConfig.from_json(config.to_json())
    assert again == config and again.name == config.name
    assert HardwareConfig.from_dict(json.loads(json.dumps(show_document(config)))) == config
    # ...and every instruction's fields fit its 128 bits without overlapping.
    for kind, layout in layouts_for(config).items():
        used = 0
        for name, (lsb, width) in layout.fields.items():
            mask = ((1 << width) - 1) << lsb
            assert width >= 1 and lsb + width <= 128 and not used & mask, (kind, name)
            used |= mask
    uop = uop_layout(config)
    assert sum(width for _, width in uop.values()) <= config.uop_bits in (32, 64)
    assert (1 << uop["dst"][1]) >= config.acc_depth and (1 << uop["wgt"][1]) >= config.wgt_depth
    assert (1 << uop["src"][1]) >= max(config.inp_depth, config.acc_depth)
    return config


@fuzz_settings(examples=EXAMPLES)
@given(_vdla_dicts())
def test_vdla_keys(data):
    check_config(data)


@fuzz_settings(examples=EXAMPLES // 2)
@given(_vta_dicts())
def test_vta_keys(data):
    check_config(data)


@fuzz_settings(examples=EXAMPLES // 2)
@given(_show_documents())
def test_show_documents(data):
    check_config(data)


def test_the_fuzzers_reach_both_outcomes():
    """The strategies are not all junk: a sample of each has valid configs and errors."""
    for strategy in (_vdla_dicts(), _vta_dicts(), _show_documents()):
        outcomes = set()

        @fuzz_settings(examples=60)
        @given(strategy)
        def sample(data):
            try:
                HardwareConfig.from_dict(data)
                outcomes.add("valid")
            except ValueError:
                outcomes.add("error")

        sample()
        assert outcomes == {"valid", "error"}, strategy


def test_what_fuzzing_found_is_a_clear_error():
    # An int clock past the floats raised OverflowError in math.isfinite.
    with pytest.raises(ValueError, match=r"HardwareConfig.clock_mhz must be a positive number"
                                         r" \(at most 1.8e\+308\), not 1000000000"):
        HardwareConfig.from_json('{"clock_mhz": 1' + "0" * 400 + "}")
    # One that fits a float is a clock (its derived figures are floats).
    assert check_config({"clock_mhz": 10 ** 300}).derived()["peak_gops"] > 0
