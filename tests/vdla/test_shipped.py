"""Shipped configs: the files, what ``--config`` means on every command (a path that
exists, else a shipped name, else an error naming both), and ``vdla config list``.

The expected names and figures are written out by hand (the issue's numbers), never
computed with the code under test."""

import argparse
import dataclasses
import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest

import vdla
from vdla import AluOp, HardwareConfig
from vdla.boards import get as get_board
from vdla.cli import build_parser, main
from vdla.cli.common import board_config
from vdla.cli.target_args import make_target
from vdla.shipped import SHIPPED_DIR, load_config, resolve_config, shipped, shipped_names

ROOT = Path(__file__).resolve().parents[2]
PLUS_NAME = "1x16x32_i8w8a32_15_15_17_17-req-hold-dw3-dsp220-bus128"
VTA_PLUS_NAME = "1x16x16_i8w8a32_15_15_18_17-req-hold"
EXTENSION_OPS = {AluOp.MIN, AluOp.MAX, AluOp.ADD, AluOp.SHR, AluOp.REQ}


def test_pynq_z1_plus_is_the_16x32_core_with_the_extensions():
    entry = shipped("pynq-z1-plus")
    assert entry.config.name == PLUS_NAME
    assert entry.config.extensions == ("req", "hold", "dw3", "dsp220")
    assert entry.config == HardwareConfig(block_out=32, wgt_buff_size=128 * 1024,
                                          alu_ops=EXTENSION_OPS, alu_hold=True,
                                          gemm_dsp_limit=220, dw_taps=3, dram_bus_width=128,
                                          dram_bytes_per_cycle=12)
    assert entry.config.gemm_lut_multipliers == 36
    assert entry.board == "pynq-z1" and entry.fits is True
    # Its 128-bit bus is bridged to HP0 at 150 MHz: the bandwidth it states is the board's.
    assert get_board("pynq-z1").apply(entry.config) == entry.config
    # vdla estimate of this config: every DSP48 of the xc7z020, 96% of its LUTs.
    assert entry.figures["resources"]["dsp"] == {"used": 220, "of": 220}
    assert entry.figures["resources"]["lut"] == {"used": 50993, "of": 53200}
    runs = {run["model"]: run for run in entry.figures["runs"]}
    # The goals: ResNet-18 <= 7.6 M cycles, MobileNet-v1 <= 2.8 M, bit-exact
    # (bench/model_layers.py --config pynq-z1-plus measures them).
    assert runs["resnet18"]["cycles"] <= 7_600_000 and runs["resnet18"]["bit_exact"]
    assert runs["mobilenet_v1"]["cycles"] <= 2_800_000 and runs["mobilenet_v1"]["bit_exact"]


def test_vta_plus_is_the_default_sizes_with_req_and_hold():
    entry = shipped("vta-plus")
    assert entry.config.name == VTA_PLUS_NAME
    assert entry.config == HardwareConfig().replace(alu_ops=EXTENSION_OPS, alu_hold=True)
    # vdla estimate of this config: the default's DSP and block RAM, more LUTs.
    assert entry.figures["resources"]["bram"] == {"used": 126.5, "of": 140}
    assert entry.figures["resources"]["dsp"] == {"used": 128, "of": 220}
    assert entry.figures["resources"]["lut"] == {"used": 22502, "of": 53200}
    runs = {run["model"]: run for run in entry.figures["runs"]}
    assert set(runs) == {"resnet18", "resnet50", "mobilenet_v1"}
    assert all(run["backend"] == "verilator" and run["bit_exact"] for run in runs.values())


def test_pynq_z1_transformers_is_vta_plus_with_the_table_and_the_pipelined_divider():
    entry = shipped("pynq-z1-transformers")
    assert entry.config == shipped("vta-plus").config.replace(
        alu_ops=EXTENSION_OPS | {AluOp.TAB, AluOp.DIV}, div_pipeline=True)
    assert entry.config.extensions == ("req", "tab", "div", "divp", "hold")
    assert entry.board == "pynq-z1" and entry.fits is True
    # vdla estimate of this config: vta-plus's DSP and block RAM, 11,596 LUTs more.
    assert entry.figures["resources"]["lut"] == {"used": 34098, "of": 53200}
    assert entry.figures["resources"]["bram"] == {"used": 126.5, "of": 140}
    runs = {run["model"]: run for run in entry.figures["runs"]}
    assert set(runs) == {"bert_tiny", "gpt_mini", "vit_tiny"}
    assert all(run["backend"] == "verilator" and run["bit_exact"] for run in runs.values())


@pytest.mark.parametrize("name", shipped_names())
def test_every_shipped_config_fits_its_board_as_recorded(name):
    """Each file's board exists, takes the config (its DRAM bus), and the recorded
    resources are that board's capacity and within it when the file says it fits."""
    entry = shipped(name)
    assert entry.description.strip() and entry.path == SHIPPED_DIR / f"{name}.json"
    board = get_board(entry.board)
    # The platform it states (clock, DRAM bandwidth) is the board's.
    assert board.apply(entry.config) == entry.config
    capacity = dataclasses.asdict(board.part.capacity)
    resources = {k: v for k, v in entry.figures["resources"].items() if k != "source"}
    assert resources and {k: v["of"] for k, v in resources.items()} == \
        {k: capacity[k] for k in resources}
    assert entry.fits == all(v["used"] <= v["of"] for v in resources.values())


def test_the_shipped_files_are_package_data():
    """A non-editable install ships every file of vdla/configs (pyproject's package-data)."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = setup["package-data"]["vdla"]
    packaged = {p for pattern in patterns for p in (ROOT / "vdla").glob(pattern)}
    assert sorted(SHIPPED_DIR.glob("*.json")) and set(SHIPPED_DIR.iterdir()) <= packaged


def test_a_path_that_exists_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config("pynq-z1-plus").name == PLUS_NAME
    Path("pynq-z1-plus").write_text(json.dumps({"batch": 2}))
    resolved = resolve_config("pynq-z1-plus")
    assert resolved.config.batch == 2 and resolved.shipped is None
    assert load_config(None) == HardwareConfig()


def test_neither_a_file_nor_a_shipped_name_is_an_error_naming_both(tmp_path):
    with pytest.raises(ValueError) as exc:
        load_config("pynq-z1plus")
    message = str(exc.value)
    assert message.startswith("cannot read hardware config 'pynq-z1plus': no such file, "
                              "and no shipped config has that name (shipped: ")
    assert "pynq-z1-plus" in message and "did you mean 'pynq-z1-plus'?" in message
    with pytest.raises(ValueError, match="no such file.*shipped: .*pynq-z1-plus"):
        load_config(str(tmp_path / "missing.json"))


def test_a_shipped_document_given_by_path_is_read(tmp_path):
    copy = tmp_path / "mine.json"
    shutil.copy(SHIPPED_DIR / "pynq-z1-plus.json", copy)
    resolved = resolve_config(str(copy))
    assert resolved.config.name == PLUS_NAME and resolved.shipped is None
    own = resolve_config(SHIPPED_DIR / "pynq-z1-plus.json")
    assert own.shipped is not None and own.shipped.name == "pynq-z1-plus"


def test_from_dict_still_refuses_the_wrapper_document():
    """The figures stay out of HardwareConfig: its own reader does not take the wrapper."""
    document = json.loads((SHIPPED_DIR / "pynq-z1-plus.json").read_text())
    with pytest.raises(ValueError, match="unknown hardware config key.*'board'"):
        HardwareConfig.from_dict(document)


@pytest.mark.parametrize("change, expected", [
    ({"notes": "x"}, r"unknown key\(s\) 'notes'; a shipped config's document has config"),
    ({"description": None}, "description must be a non-empty string, not None"),
    ({"board": 7}, "board must be a board's name or null, not 7"),
    ({"config": {"block_in": 12}}, "config: HardwareConfig.block_in must be a power of two"),
    ({"figures": {"fits": "yes"}}, "figures.fits must be true, false or null, not 'yes'"),
    ({"figures": {"resources": {"bram": 126.5}}},
     r"figures.resources.bram must be \{\"used\": number, \"of\": number\}, not 126.5"),
    ({"figures": {"runs": [{"model": "resnet18"}]}},
     r"figures.runs\[0\] needs a 'model' name and a number of 'cycles'"),
])
def test_a_bad_document_is_refused_naming_the_key(tmp_path, change, expected):
    document = json.loads((SHIPPED_DIR / "pynq-z1-plus.json").read_text()) | change
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=expected) as exc:
        load_config(str(path))
    assert str(path) in str(exc.value)


def test_missing_description_is_refused(tmp_path):
    path = tmp_path / "bare.json"
    path.write_text(json.dumps({"config": {}}))
    with pytest.raises(ValueError, match="lacks 'description'"):
        load_config(str(path))


# --- the command line -------------------------------------------------------------------


def _config_options(parser: argparse.ArgumentParser, path=()):
    """(command path, the --config action) of every (sub)command that takes --config."""
    for action in parser._actions:
        if "--config" in action.option_strings:
            yield path, action
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _config_options(sub, (*path, name))


def test_every_config_option_says_it_takes_a_shipped_name():
    found = dict(_config_options(build_parser()))
    assert {("config", "show"), ("asm",), ("verilog",), ("estimate",), ("run",),
            ("compare",), ("tune",), ("targets",)} <= set(found)
    vague = [" ".join(path) for path, action in found.items()
             if "name of a config shipped with vdla" not in action.help]
    assert not vague, f"--config of {vague} does not say it takes a shipped name"


def test_commands_take_a_shipped_name():
    """The three loaders (plain, with a board, the vdla target's) all resolve it."""
    assert board_config("pynq-z1", "pynq-z1-plus")[1].name == PLUS_NAME
    target = make_target("vdla", argparse.Namespace(config="pynq-z1-plus", sim="functional"),
                         "run")
    assert target.config.name == PLUS_NAME


def test_asm_with_a_shipped_config_assembles_req(tmp_path, capsys):
    src, out = tmp_path / "p.s", tmp_path / "p.bin"
    src.write_text("ALU REQ use_imm imm=0x0304 uop_bgn=0 uop_end=1 iter_out=1 iter_in=1\n"
                   "FINISH\n")
    assert main(["asm", str(src), "-o", str(out)]) == 1     # the default ALU has no REQ
    assert "REQ" in capsys.readouterr().err and not out.exists()
    assert main(["asm", str(src), "-o", str(out), "--config", "pynq-z1-plus"]) == 0
    assert out.stat().st_size == 2 * 16


def test_config_list_wide_gives_a_row_per_config_and_json(capsys):
    assert main(["config", "list", "--wide"]) == 0
    text = capsys.readouterr().out
    header, row = text.splitlines()[:2]
    assert header.split() == ["name", "config", "extensions", "board", "fits", "figures"]
    assert row.split()[:6] == ["pynq-z1-plus", PLUS_NAME, "req,", "hold,", "dw3,", "dsp220"]
    assert "yes: LUT 50,993/53,200, FF 7,767/106,400, DSP 220/220, BRAM 119/140" in row
    cycles = shipped("pynq-z1-plus").figures["runs"][0]["cycles"]
    assert f"resnet18 {cycles:,} cycles (verilator, bit-exact, commit " in row
    # Every recorded figure of every config in its one row, unbroken.
    for name in shipped_names():
        entry = shipped(name)
        [row] = [line for line in text.splitlines() if line.startswith(f"{name} ")]
        for run in entry.figures["runs"]:
            baseline = (f", {run['baseline']['cycles']:,} on {run['baseline']['config']}"
                        if "baseline" in run else "")
            assert (f"{run['model']} {run['cycles']:,} cycles (verilator, bit-exact, commit "
                    f"{run['commit']}{baseline})") in row
        assert f"\n{name}: {entry.description}\n" in text
        assert f"  resources: {entry.figures['resources']['source']}\n" in text
    assert main(["config", "list", "--json"]) == 0
    (entry,) = [e for e in json.loads(capsys.readouterr().out) if e["name"] == "pynq-z1-plus"]
    assert entry["config_name"] == PLUS_NAME and entry["extensions"] == ["req", "hold", "dw3", "dsp220"]
    assert entry["board"] == "pynq-z1" and entry["fits"] is True
    assert entry["figures"]["runs"][0]["cycles"] == cycles
    assert HardwareConfig.from_dict(entry["config"]).name == PLUS_NAME


def test_config_list_fits_an_80_column_terminal(capsys):
    """The table's rows were about 400 characters; by default each config is a block of
    lines within 80 columns, wrapped, with the same figures and their commits."""
    assert main(["config", "list"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert lines[0] == f"pynq-z1-plus: {PLUS_NAME}"
    assert f"vta-plus: {VTA_PLUS_NAME}" in lines
    assert "  extensions  req, hold, dw3, dsp220" in lines and "  board       pynq-z1" in lines
    words = " ".join(text.split())        # the text as one line, its wrapping undone
    for name in shipped_names():
        entry = shipped(name)
        assert " ".join(entry.description.split()) in words
        assert " ".join(entry.figures["resources"]["source"].split()) in words
        for run in entry.figures["runs"]:
            baseline = (f", {run['baseline']['cycles']:,} on {run['baseline']['config']}"
                        if "baseline" in run else "")
            assert (f"{run['model']} {run['cycles']:,} cycles (verilator, bit-exact, commit "
                    f"{run['commit']}{baseline})") in words
    assert "yes: LUT 50,993/53,200, FF 7,767/106,400, DSP 220/220, BRAM 119/140" in words
    assert lines[-1].endswith("`--wide` prints a row per config.")


# --- the recorded figures are today's ------------------------------------------------------

#: The figures of `bench/model_layers.py` (scripts/docs_figures.py runs it at the commit the
#: documentation describes): the default config's, and each shipped config's.
MODEL_LAYERS = {None: "model_layers.txt", "vta-plus": "model_layers_vta_plus.txt",
                "pynq-z1-plus": "model_layers_pynq_z1_plus.txt",
                "pynq-z1-transformers": "model_layers_pynq_z1_transformers.txt",
                "zcu104-plus": "model_layers_zcu104_plus.txt"}


def _model_layers(name):
    """(commit, {model: (config name, cycles, bit-exact)}) of a model_layers figure."""
    text = (ROOT / "docs" / "figures" / MODEL_LAYERS[name]).read_text()
    commit = re.search(r"# commit (\w+),", text.splitlines()[0]).group(1)
    runs = {}
    for m in re.finditer(r"^(\w+): Verilator, config (\S+?)(?: \([^)]*\))?, "
                         r"(bit-exact|NOT bit-exact)$(?s:.*?)^  total: ([\d,]+) cycles",
                         text, re.MULTILINE):
        runs[m.group(1)] = (m.group(2), int(m.group(4).replace(",", "")),
                            m.group(3) == "bit-exact")
    return commit, runs


@pytest.mark.parametrize("name", shipped_names())
def test_the_recorded_runs_are_the_documented_measurements(name):
    """Each shipped config's runs are the cycles bench/model_layers.py measured for the
    documentation, at the commit the file names, and so is each baseline (the default
    config's cycles, where a run has one; a run on a board, measured with its DRAM model,
    has none: the default config is not that board's). The files had
    kept an older commit's figures after the documentation's were measured again (8,929,286
    where `vdla run resnet18` gives 8,927,958): comparing the two is cheap; a run on
    Verilator is not (see the slow test below)."""
    entry = shipped(name)
    commit, measured = _model_layers(name)
    baseline_commit, baseline = _model_layers(None)
    for run in entry.figures["runs"]:
        model = run["model"]
        assert (entry.config.name, run["cycles"], run["bit_exact"]) == measured[model]
        assert run["commit"] == commit
        if "baseline" in run:
            base = run["baseline"]
            assert (base["config"], base["cycles"]) == baseline[model][:2]
            assert baseline_commit == commit


@pytest.mark.slow
@pytest.mark.parametrize("name, model", [(name, run["model"]) for name in shipped_names()
                                         for run in shipped(name).figures["runs"]])
def test_the_recorded_runs_are_what_vdla_run_measures(tmp_path, capsys, name, model):
    """The same on Verilator, now (a minute to build each config's model the first time,
    up to half a minute a run): what catches a change of the hardware or the compiler
    that moved the cycles without the figures being measured again."""
    run = next(r for r in shipped(name).figures["runs"] if r["model"] == model)
    board = ["--board", run["board"]] if "board" in run else []
    for config, cycles, where in ((name, run["cycles"], board),
                                  (None, run.get("baseline", {}).get("cycles"), [])):
        if cycles is None:
            continue
        report = tmp_path / f"{config}.json"
        assert main(["run", model, "--json", str(report)] + where
                    + (["--config", config] if config else [])) == 0
        capsys.readouterr()
        document = json.loads(report.read_text())
        assert document["bit_exact"] and document["cycles"] == cycles


def test_config_show_a_shipped_name(capsys):
    assert main(["config", "show", "--config", "pynq-z1-plus"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"config {PLUS_NAME}"
    assert lines[1].startswith("shipped as pynq-z1-plus for pynq-z1: ")
    assert main(["config", "show", "--config", "pynq-z1-plus", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["derived"]["extensions"] == ["req", "hold", "dw3", "dsp220"]
    assert vdla.HardwareConfig.from_dict(document).name == PLUS_NAME
    assert main(["config", "show", "--config", "no-such-config"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vdla: error: cannot read hardware config 'no-such-config'")
    assert "pynq-z1-plus" in err and len(err.splitlines()) == 1
