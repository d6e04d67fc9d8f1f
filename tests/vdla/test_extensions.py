"""The hardware extensions' registry (`vdla.extensions`): each extension declared once and
read by the config, the encoder, the validator, the device's check, the resource model,
the cost-model inputs and the docs; and how far an extension spreads through the files
(scripts/extension_footprint.py), held at its measured value."""

from __future__ import annotations

import ast
import dataclasses
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from vdla.compiler.targets.vdla.features import CONV2D
from vdla.config import EXTENSION_FLAGS, HardwareConfig
from vdla.dse.resources import TERM_EXTENSIONS, extension_terms, without_extensions
from vdla.extensions import (EXTENSIONS, by_field, by_key, insn_bits, lacking_extensions,
                             markdown_table)
from vdla.isa import Finish, Gemm, Load, MemoryType, Uop, encode, encode_uops
from vdla.isa.encoding import EncodeError
from vdla.sim.validate import ProgramValidator

from script_loading import load_script

ROOT = Path(__file__).resolve().parents[2]

#: The most code files (outside tests/) that may name the depthwise window's field or its
#: derived properties: measured when the registry came (18 before it: the generic code
#: named it too). What remains implements it (hw/, sim/, the compiler's lowering, the
#: resource model, its calibration configs) or declares it (vdla/config.py,
#: vdla/extensions.py).
DW_CODE_FILES = 13


def _with(ext, config=None):
    """A config with `ext` on at its example value (over `config`, default the default;
    the depthwise window and the DSP limit need a core they fit)."""
    base = config or HardwareConfig(block_out=32)
    return base.replace(**ext.with_(base))


def test_every_extension_is_a_config_field_off_by_default():
    fields = {f.name: f for f in dataclasses.fields(HardwareConfig)}
    default = HardwareConfig()
    assert [e.key for e in EXTENSIONS] == ["req", "tab", "div", "divp", "hold", "dw", "dsp"]
    for ext in EXTENSIONS:
        assert ext.field in fields, ext.key
        assert not ext.present(default) and ext.short(default) is None
        assert ext.identifiers[0] == ext.field or ext.kind == "alu_op"
        assert by_key(ext.key) is ext
    assert default.extensions == ()
    assert by_field("dw_taps").key == "dw" and by_field("batch") is None
    with pytest.raises(ValueError, match="unknown hardware extension 'nope'; known: req"):
        by_key("nope")


def test_each_extension_is_a_name_suffix_and_listed():
    plain = HardwareConfig(block_out=32)
    for ext in EXTENSIONS:
        config = _with(ext)
        short = ext.short(config)
        # The pipelined divider comes with the divide it pipelines (`Extension.requires`).
        required = (by_key(ext.requires).short(config),) if ext.requires else ()
        assert config.extensions == required + (short,)
        assert config.name == "-".join((plain.name,) + required + (short,))
        assert config.replace(**ext.without(config)) == plain.replace(
            **(by_key(ext.requires).with_(plain) if ext.requires else {}))
    # All of them, in the registry's order, after MUL's suffix.
    every = plain.replace(alu_ops={"MIN", "MAX", "ADD", "SHR", "MUL", "REQ", "TAB", "DIV"},
                          div_pipeline=True, alu_hold=True, dw_taps=3, gemm_dsp_limit=220)
    assert every.name == plain.name + "-mul-req-tab-div-divp-hold-dw3-dsp220"
    assert every.extensions == ("req", "tab", "div", "divp", "hold", "dw3", "dsp220")
    # The pipelined divider changes only cycles: programs do not depend on it.
    assert every.program_extensions == ("req", "tab", "div", "hold", "dw3")
    # Removing the divide removes its pipeline too.
    assert every.replace(**by_key("div").without(every)).extensions == (
        "req", "tab", "hold", "dw3", "dsp220")


def test_the_flag_extensions():
    assert EXTENSION_FLAGS == {"div_pipeline": "divp", "alu_hold": "hold"}


@pytest.mark.parametrize("field, value, message", [
    ("alu_hold", 1, r"HardwareConfig.alu_hold must be true or false, not 1"),
    ("div_pipeline", 1, r"HardwareConfig.div_pipeline must be true or false, not 1"),
    ("div_pipeline", True, r"HardwareConfig.div_pipeline=True needs DIV in alu_ops \(it "
                           r"pipelines the DIV engine\); alu_ops are ADD, MAX, MIN, SHR"),
    ("dw_taps", -1, r"dw_taps must be a non-negative integer \(0: no depthwise window\)"),
    ("dw_taps", 9, r"dw_taps=9 is out of range for block_in=16: .* 2 to 8 taps"),
    ("gemm_dsp_limit", "220", r"gemm_dsp_limit must be a non-negative integer \(0: no "
                              r"limit\), not '220'"),
])
def test_each_extension_validates_its_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        HardwareConfig(**{field: value})


def test_the_instruction_bits_come_from_the_registry():
    dw = by_key("dw")
    assert [(e.key, b.field, b.width) for e, b in insn_bits("GEMM")] == [("dw", "dw", 1)]
    assert insn_bits("ALU") == ()
    default_gemm = HardwareConfig().insn_field_widths()["GEMM"][0]
    window_gemm = _with(dw).insn_field_widths()["GEMM"][0]
    assert window_gemm == default_gemm + [("dw", 1)]


def test_the_encoder_and_the_validator_refuse_a_bit_the_config_lacks():
    config = HardwareConfig()
    gemm = Gemm(dw=True, uop_bgn=0, uop_end=1, iter_out=1, iter_in=1)
    with pytest.raises(EncodeError, match=r"GEMM field dw=1 \(the depthwise window\) is not "
                                          r"implemented by config .* \(it needs dw_taps > 0\)"):
        encode(gemm, config)
    dram = np.zeros(1 << 16, np.uint8)
    raw = encode_uops([Uop(dst=0, src=0, wgt=0)], config)
    dram[:len(raw)] = np.frombuffer(raw, np.uint8)
    load = Load(memory_type=MemoryType.UOP, y_size=1, x_size=1, x_stride=1)
    with pytest.raises(Exception, match=r"GEMM dw \(the depthwise window\) is not implemented "
                                        r"by this config \(it needs dw_taps > 0\)"):
        ProgramValidator(config).validate([load, gemm, Finish()], dram)


def test_the_device_names_the_extensions_a_program_needs():
    plain = HardwareConfig(block_out=32)
    every = plain.replace(alu_ops={"MIN", "MAX", "ADD", "SHR", "REQ"}, alu_hold=True,
                          dw_taps=3, gemm_dsp_limit=220)
    assert lacking_extensions(every, plain) == [
        ("req", "the ALU's REQ"), ("hold", "alu_hold"),
        ("dw3", "the depthwise window, dw_taps=3")]     # the DSP limit: synthesis only
    assert lacking_extensions(plain, every) == []
    assert lacking_extensions(every, every.replace(dw_taps=4)) == [
        ("dw3", "the depthwise window, dw_taps=3")]


def test_an_older_show_document_with_features_still_loads():
    """``vdla config show --json`` wrote ``derived.features`` (the extensions a program may
    depend on) before the rename; it is read, checked, and a wrong one refused."""
    config = HardwareConfig(block_out=32, alu_hold=True, dw_taps=3, gemm_dsp_limit=220)
    derived = {k: v for k, v in config.derived().items() if k != "extensions"}
    old = {"parameters": config.to_dict(), "derived": {**derived, "features": ["hold", "dw3"]}}
    assert HardwareConfig.from_dict(old) == config
    new = {"parameters": config.to_dict(), "derived": config.derived()}
    assert HardwareConfig.from_dict(new) == config
    old["derived"]["features"] = ["hold"]
    with pytest.raises(ValueError, match=r"derived.features is \['hold'\] in the file, but the "
                                         r"parameters give \['hold', 'dw3'\]"):
        HardwareConfig.from_dict(old)


def test_the_resource_model_prices_every_extension():
    assert sorted({key for key, _ in TERM_EXTENSIONS.values()}) == sorted(
        e.key for e in EXTENSIONS)
    assert list(TERM_EXTENSIONS) == list(extension_terms(HardwareConfig()))
    for term, (key, _) in TERM_EXTENSIONS.items():
        config = _with(by_key(key))
        assert extension_terms(config)[term] > 0, term
        assert without_extensions(config) == HardwareConfig(block_out=32)


def test_the_cost_model_inputs_come_from_the_registry():
    """The accelerator's feature set takes each extension's declared input, unchanged in
    name and order (a trained model checks the names' fingerprint)."""
    inputs = [e.cost_input[0] for e in EXTENSIONS if e.cost_input]
    assert inputs == ["alu_hold", "dw_taps", "dsp_limited"]
    names = list(CONV2D.names)
    start = names.index(inputs[0])
    assert names[start:start + len(inputs)] == inputs
    config = _with(by_key("dsp"), _with(by_key("dw")))
    assert [by_key(k).cost_value(config) for k in ("hold", "dw", "dsp")] == [0.0, 3.0, 1.0]


def test_the_docs_table_is_the_registry():
    page = (ROOT / "docs" / "hardware.md").read_text()
    table = markdown_table()
    assert table in page, "docs/hardware.md's extensions table differs from " \
                          "vdla.extensions.markdown_table(): paste it in"
    assert "### Adding a hardware extension" in page


def test_the_registry_imports_only_the_standard_library():
    """vdla.config imports it, and vdla.config must stay light."""
    tree = ast.parse((ROOT / "vdla" / "extensions.py").read_text())
    modules = {alias.name.split(".")[0] for node in ast.walk(tree)
               if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module}
    assert modules <= set(sys.stdlib_module_names) | {"__future__"}, modules


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="counts the files of a git checkout")
def test_the_depthwise_window_spreads_no_further():
    script = load_script(ROOT / "scripts" / "extension_footprint.py")
    found = script.footprint(ROOT)
    assert set(found) == {e.key for e in EXTENSIONS}
    code = found["dw"]["code"]
    assert len(code) <= DW_CODE_FILES, (
        f"{len(code)} code files name the depthwise window, more than {DW_CODE_FILES}: "
        "read the registry (vdla.extensions) instead of naming dw_taps in generic code; "
        f"files: {code}")
    assert "vdla/config.py" in code and not any(p.startswith("tests/") for p in code)
    # The table and --json forms.
    names = script.extension_names()
    assert re.match(r"extension\s+code\s+docs\s+data\s+total", script.table(found, names))
