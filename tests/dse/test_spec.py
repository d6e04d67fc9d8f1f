"""Sweep specs: the TOML format, CLI parameters, and clear errors for bad input."""

from __future__ import annotations

import dataclasses

import pytest

from vdla.config import HardwareConfig
from vdla.dse.spec import (DEFAULT_OBJECTIVES, GRID_LIMIT, ModelSpec, SweepSpec, parse_param,
                           parse_value, show_value)

SPEC = """
board = "pynq-z1"
search = "grid"

[[models]]
name = "resnet18"
weight = 2.0

[[models]]
name = "digits_cnn"

[parameters]
block_in = [8, 16]
block_out = { min = 8, max = 32 }
acc_buff_size = ["32K", "64K"]
alu_ops = [["MIN", "MAX", "ADD", "SHR"], ["MIN", "MAX", "ADD", "SHR", "MUL"]]

[constraints]
max_latency_ms = 40.0
"""


def write(tmp_path, text, name="s.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_spec_file_reads_with_ranges_sizes_and_lists(tmp_path):
    spec = SweepSpec.from_toml(write(tmp_path, SPEC))
    assert spec.name == "s" and spec.board == "pynq-z1" and spec.method == "grid"
    assert [(m.name, m.weight) for m in spec.models] == [("resnet18", 2.0), ("digits_cnn", 1.0)]
    assert spec.parameters["block_out"] == (8, 16, 32)
    assert spec.parameters["acc_buff_size"] == (32768, 65536)
    assert spec.objectives == DEFAULT_OBJECTIVES and spec.fits and spec.max_latency_ms == 40.0
    points = spec.points()
    assert len(points) == spec.grid_size == 2 * 3 * 2 * 2
    # Every point's values are what HardwareConfig takes (some combinations are invalid
    # designs, which a sweep keeps with their reason, but no value has the wrong form).
    made = 0
    for p in points:
        try:
            HardwareConfig.from_dict({**HardwareConfig().to_dict(), **p})
            made += 1
        except ValueError as exc:
            assert "instruction needs" in str(exc)
    assert made
    assert spec.key == SweepSpec.from_toml(write(tmp_path, SPEC, "t.toml")).replace(
        name="s").key


def test_every_config_field_is_a_parameter_with_no_list_to_keep():
    # A field added to HardwareConfig later is sweepable: the spec reads the dataclass.
    for field in dataclasses.fields(HardwareConfig):
        spec = SweepSpec.from_dict({"board": "pynq-z1", "models": ["resnet18"],
                                    "parameters": {field.name: [getattr(HardwareConfig(),
                                                                        field.name)]}})
        assert field.name in spec.parameters


@pytest.mark.parametrize("text, message", [
    ("board = 'x'\nmodels = ['resnet18']\n[parameters]\nblock_inn = [8]", "unknown sweep parameter"),
    ("models = ['resnet18']\n[parameters]\nblock_in = [8]", "names its board"),
    ("board = 'x'\n[parameters]\nblock_in = [8]", "at least one model"),
    ("board = 'x'\nmodels = ['resnet18']", "at least one parameter"),
    ("board = 'x'\nmodels = ['resnet18']\n[parameters]\nblock_in = []", "has no values"),
    ("board = 'x'\nmodels = ['resnet18']\nobjectives = ['speed']\n[parameters]\nblock_in = [8]",
     "speed"),
    ("board = 'x'\nmodels = ['resnet18']\nsearch = 'anneal'\n[parameters]\nblock_in = [8]",
     "unknown search 'anneal'"),
    ("board = 'x'\nmodels = ['resnet18']\ntrials = 0\n[parameters]\nblock_in = [8]",
     "trials must be a positive integer"),
    ("board = 'x'\n[[models]]\nname = 'a'\nweight = -1\n[parameters]\nblock_in = [8]",
     "weight must be a positive number"),
    ("board = 'x'\nmodels = ['resnet18']\n[parameters]\nblock_in = {min = 32, max = 8}",
     "min <= max"),
    ("board = 'x'\nmodels = ['resnet18']\ncolour = 1\n[parameters]\nblock_in = [8]",
     "unknown key(s) 'colour'"),
    ("board = 'x'\nmodels = ['resnet18']\n[constraints]\nfit = true\n[parameters]\nblock_in = [8]",
     "unknown constraint(s) 'fit' (did you mean 'fits'?); [constraints] may hold fits, "
     "max_utilization, max_latency_ms"),
    ("board = = 'x'", "not valid TOML"),
])
def test_bad_specs_are_refused_naming_the_file_and_the_problem(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as info:
        SweepSpec.from_toml(path)
    assert message in str(info.value) and str(path) in str(info.value)


BASE = "board = 'x'\nmodels = ['resnet18']\n"


@pytest.mark.parametrize("text, message", [
    (BASE + "[constraints]\nfits = true\nmax_latncy_ms = 1.0\n[parameters]\nblock_in = [8]",
     "sweep spec {path}: unknown constraint(s) 'max_latncy_ms' (did you mean "
     "'max_latency_ms'?); [constraints] may hold fits, max_utilization, max_latency_ms"),
    (BASE + "[constraints]\nmax_utilization = 1.5\n[parameters]\nblock_in = [8]",
     "max_utilization must be a number above 0 and at most 1 (a share of each resource of "
     "the part), not 1.5"),
    (BASE + "[constraints]\nmax_utilization = 0\n[parameters]\nblock_in = [8]",
     "max_utilization must be a number above 0 and at most 1"),
    (BASE + "[constraints]\nfits = 'no'\n[parameters]\nblock_in = [8]",
     "constraint fits must be true or false, not 'no'"),
    (BASE + "serch = 'grid'\n[parameters]\nblock_in = [8]",
     "unknown key(s) 'serch' (did you mean 'search'?); a sweep spec has board, search,"),
    (BASE + "search = 'nsg2'\n[parameters]\nblock_in = [8]",
     "unknown search 'nsg2' (did you mean 'nsga2'?); known: auto, grid, nsga2, tpe"),
    ("board = 'x'\n[[models]]\nname = 'resnet18'\nwieght = 2\n[parameters]\nblock_in = [8]",
     "model 'resnet18': unknown key(s) 'wieght' (did you mean 'weight'?); a model has name, "
     "weight"),
    ("board = 'x'\n[[models]]\nweight = 2\n[parameters]\nblock_in = [8]",
     "a model in [[models]] has no name"),
    ("board = 'x'\nmodels = [3]\n[parameters]\nblock_in = [8]",
     "a model is a name (a zoo model or an .onnx path) or a table {name = ..., weight = ...}, "
     "not 3"),
    (BASE + "[parameters]\nblok_in = [8]",
     "unknown sweep parameter(s) 'blok_in' (did you mean 'block_in'?); the parameters are "),
    (BASE + "[parameters]\nblock_in = {min = 8, mx = 32}",
     "parameter 'block_in': unknown key(s) 'mx' (did you mean 'max'?) in its range; a range "
     "is {min, max} (powers of two) or {min, max, step}"),
    (BASE + "[parameters]\nblock_in = {min = 8}",
     "parameter 'block_in': its range lacks max;"),
])
def test_a_misspelt_key_is_named_with_its_close_match_not_its_table(tmp_path, text, message):
    """Each section of a spec names the key it does not know (and the one it is close
    to), never by printing the table it was written in."""
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as info:
        SweepSpec.from_toml(path)
    assert message.replace("{path}", str(path)) in str(info.value)
    assert "{" not in str(info.value).replace("{min, max", "").replace("{name = ", "")


def test_missing_spec_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        SweepSpec.from_toml(tmp_path / "nope.toml")


def test_cli_params_and_values():
    assert parse_param("block_in=8,16") == ("block_in", [8, 16])
    assert parse_param("acc_buff_size=32K..128K") == ("acc_buff_size", [32768, 65536, 131072])
    assert parse_value("1M") == 1 << 20 and parse_value("true") is True
    assert parse_value("100.5") == 100.5
    with pytest.raises(ValueError, match="NAME=V1,V2"):
        parse_param("block_in")


BASE_OPS = ["MIN", "MAX", "ADD", "SHR"]


def test_cli_booleans_and_lists_of_names():
    assert parse_param("alu_hold=false,true") == ("alu_hold", [False, True])
    assert parse_param("alu_hold= False , TRUE") == ("alu_hold", [False, True])
    # Commas separate values, so a list value joins its names with "+".
    assert parse_param("alu_ops=MIN+MAX+ADD+SHR,MIN+MAX+ADD+SHR+REQ") == (
        "alu_ops", [BASE_OPS, BASE_OPS + ["REQ"]])
    assert parse_param("clock_mhz=+100,150") == ("clock_mhz", [100, 150])   # a sign


def test_a_spec_file_sweeps_the_features_past_vta(tmp_path):
    spec = SweepSpec.from_toml(write(tmp_path, """
board = "pynq-z1"
models = ["digits_cnn"]
[parameters]
alu_hold = [false, true]
alu_ops = [["MIN", "MAX", "ADD", "SHR"], ["MIN", "MAX", "ADD", "SHR", "REQ"]]
"""))
    assert spec.parameters["alu_hold"] == (False, True)
    spec.check_values(HardwareConfig())
    names = [HardwareConfig.from_dict({**HardwareConfig().to_dict(), **p}).name
             for p in spec.points()]
    default = HardwareConfig().name
    assert names == [default, f"{default}-req", f"{default}-hold", f"{default}-req-hold"]


def test_the_pipelined_divider_is_a_dimension():
    """``--param div_pipeline=false,true`` with DIV swept too: the pipeline without DIV is
    an invalid point (saying why), not a refused value."""
    name, values = parse_param("div_pipeline=false,true")
    assert (name, values) == ("div_pipeline", [False, True])
    spec = spec_of(div_pipeline=values, alu_ops=[BASE_OPS, BASE_OPS + ["DIV"]])
    spec.check_values(HardwareConfig())
    default, made, refused = HardwareConfig().name, [], []
    for point in spec.points():
        try:
            made.append(HardwareConfig.from_dict({**HardwareConfig().to_dict(), **point}).name)
        except ValueError as exc:
            refused.append(str(exc))
    assert made == [default, f"{default}-div", f"{default}-div-divp"]
    assert refused == ["HardwareConfig.div_pipeline=True needs DIV in alu_ops (it pipelines "
                       "the DIV engine); alu_ops are ADD, MAX, MIN, SHR"]


@pytest.mark.parametrize("value", ["yes", "1", "ture", "0"])
def test_a_value_that_is_no_boolean_is_refused_naming_it(value):
    name, values = parse_param(f"alu_hold=false,{value}")
    with pytest.raises(ValueError) as info:
        spec_of(**{name: values}).check_values(HardwareConfig())
    shown = show_value(parse_value(value))
    assert (f"alu_hold = {shown}: HardwareConfig.alu_hold must be true or false, not "
            f"{parse_value(value)!r}") in str(info.value)


def test_auto_search_is_the_grid_until_it_is_large():
    small = SweepSpec.from_dict({"board": "b", "models": ["m"],
                                 "parameters": {"block_in": [8, 16]}})
    assert small.method == "grid"
    big = small.replace(parameters={"inp_buff_size": tuple(range(GRID_LIMIT + 1))})
    assert big.method == "nsga2" and big.replace(search="tpe").method == "tpe"


def spec_of(**parameters):
    return SweepSpec.from_dict({"board": "pynq-z1", "models": ["small_cnn"],
                                "parameters": parameters})


@pytest.mark.parametrize("parameters, message", [
    ({"alu_ops": [["MIN", "MAX", "ADD", "SHR"], ["MIN", "MAX", "ADD", "SHR", "MULT"]],
      "block_in": [8, 16]},
     'alu_ops = ["MIN", "MAX", "ADD", "SHR", "MULT"]: HardwareConfig.alu_ops has unknown '
     "operation 'MULT'; known: MIN, MAX, ADD, SHR, MUL"),
    ({"acc_buff_size": ["-32K"]},
     "acc_buff_size = -32768: HardwareConfig.acc_buff_size must be a power of two from 1 "
     "to 67108864, not -32768"),
    ({"block_in": [16, 24]}, "block_in = 24: HardwareConfig.block_in must be a power of two"),
    ({"inp_width": [8, 4]}, "inp_width = 4: HardwareConfig.inp_width must be one of (8,)"),
])
def test_a_value_no_config_takes_is_refused_naming_it_and_what_is_allowed(parameters,
                                                                           message):
    with pytest.raises(ValueError) as info:
        spec_of(**parameters).check_values(HardwareConfig())
    assert "1 parameter value(s) make no HardwareConfig" in str(info.value)
    assert message in str(info.value)


def test_every_bad_value_is_named_and_good_ones_are_not():
    with pytest.raises(ValueError) as info:
        spec_of(alu_ops=[["MIN", "MAX", "ADD", "SHR", "MULT"]], block_in=[8, 16, 3],
                clock_mhz=[100, 0]).check_values()
    text = str(info.value)
    assert text.startswith("3 parameter value(s)")
    assert "alu_ops = " in text and "block_in = 3:" in text and "clock_mhz = 0:" in text
    # The misspelt op (in every point) does not make the good values look bad.
    assert "block_in = 8" not in text and "block_in = 16" not in text


def test_values_that_do_not_fit_together_are_left_to_the_points():
    # A 64K inp buffer with 16-wide blocks needs a 130-bit GEMM instruction: no config
    # with the base's blocks, but with block_in 32 it is one. Joint invalidity is each
    # point's reason, whether or not a swept value makes it fit.
    spec_of(inp_buff_size=["32K", "64K"], block_in=[16, 32]).check_values()
    spec_of(inp_buff_size=["32K", "64K"], block_in=[16]).check_values()
    spec_of(block_in=[8, 16]).check_values()              # 8 overflows with a 128K acc
    spec_of(acc_buff_size=["64", "32K"]).check_values()   # one element of 64 bytes


def test_hardware_config_names_the_field_first_when_the_value_itself_is_wrong():
    # What check_values tells a bad value from values that do not fit together by.
    for field in dataclasses.fields(HardwareConfig):
        with pytest.raises(ValueError) as info:
            HardwareConfig.from_dict({**HardwareConfig().to_dict(), field.name: "x"})
        assert str(info.value).startswith(f"HardwareConfig.{field.name} "), str(info.value)


def test_max_utilization_keeps_a_share_of_the_part_free():
    """With fits, a point over `max_utilization` of any resource violates the
    constraints by how far it is over; the default (1) is the part itself, and the
    spec's key changes only when the share is set."""
    from vdla.dse.search import violation

    base = SweepSpec(board="pynq-z1", models=(ModelSpec("resnet18"),),
                     parameters={"block_in": (8,)})
    tight = base.replace(max_utilization=0.95)
    record = {"utilization": {"lut": 0.5, "ff": 0.2, "dsp": 0.4, "bram": 0.97},
              "objectives": {"latency_ms": 1.0}}
    assert violation(record, base) == pytest.approx(-0.03)
    assert violation(record, tight) == pytest.approx(0.02)
    assert violation(record, tight.replace(fits=False)) == -1.0
    assert "max_utilization" not in base.to_dict()["constraints"]
    assert tight.to_dict()["constraints"]["max_utilization"] == 0.95
    assert base.key != tight.key
