"""``vdla deploy`` and its bundle's runner: the bundle written, its Vivado script parsed,
the runner run against the Verilator model of the same Verilog through the board
runtime (`board_shim`, the DMA region at 1 MiB so that the programs move to bus
addresses as on a board), bit-exact in the Verilator backend's cycles; tampered files,
mismatched bitstreams and models the board cannot run alone refused."""

import dataclasses
import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from board_shim import VerilatorMemory, VerilatorMmio
from bundles import copy_of
from vdla.boards import BOARDS
from vdla.cli import main as vdla_main
from vdla.compiler import pipeline
from vdla.compiler.targets.host import HOST
from vdla.compiler.targets.vdla import VdlaTarget
from vdla.compiler.targets.vdla.export import host_ends
from vdla.deploy.board.hardware import RegisterLog
from vdla.deploy.board.player import BundleError, DeviceScript, run_exported
from vdla.deploy.board.runner import main as run_bundle
from vdla.deploy.board_device import BoardDevice
from vdla.deploy.bundle_writer import BUNDLE_INSTALL
from vdla.runtime import open as open_device
from vdla.sim.verilator import VerilatorSimulator

BOARD = BOARDS["pynq-z1"]
BASE = 1 << 20
DRAM = 64 << 20


@pytest.fixture(scope="module")
def sim():
    simulator = VerilatorSimulator(BOARD.config, DRAM, log=lambda message: None)
    yield simulator
    simulator.close()


def shim(sim):
    """`run.py`'s device opener, over the Verilator model."""
    def opener(config, manifest, size, timeout):
        assert config == sim.config and size <= DRAM - BASE
        return BoardDevice(config, mmio=RegisterLog(VerilatorMmio(sim.model)),
                           memory=VerilatorMemory(sim.model, base=BASE), timeout=timeout)
    return opener


@pytest.fixture(scope="module")
def bundle(small_cnn_bundle, tmp_path_factory):
    return copy_of(small_cnn_bundle, tmp_path_factory)


def test_the_bundle_holds_the_project_the_model_and_a_manifest(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["board"] == "pynq-z1" and manifest["model"] == "small_cnn"
    assert manifest["config"] == BOARD.config.name
    files = set(manifest["files"])
    assert {"run.py", "README.md", "model/model.json", "model/model.npz",
            "lib/vdla/deploy/board/runner.py", "lib/vdla/isa/encoding.py",
            "model/example.npz", "project/manifest.json", "project/build_vivado.tcl",
            "project/vdla_accelerator.v"} <= files
    script = DeviceScript.load(bundle / "model")
    assert script.config == BOARD.config
    assert [s["op"] for s in script.steps if s["do"] == "run"] == [
        "conv1", "pool1", "conv2", "pool2", "conv3", "pool3", "logits"]


def test_the_bundles_readme_asks_for_numpy_alone(bundle):
    """The bundle carries its code: the board needs numpy, not vdla."""
    text = (bundle / "README.md").read_text()
    assert BUNDLE_INSTALL in " ".join(text.split())
    assert "pip3 install numpy" in text and not re.search(r"pip3? install[^`]*vdla", text)


@pytest.mark.skipif(shutil.which("tclsh") is None, reason="no tclsh")
def test_the_bundled_vivado_script_parses_under_tclsh(bundle):
    check = ("set f [open [lindex $argv 0]]; set t [read $f]; close $f; "
             "puts [info complete $t]; puts [llength [split $t \\n]]")
    out = subprocess.run(["tclsh", "/dev/stdin", str(bundle / "project" / "build_vivado.tcl")],
                         input=check, capture_output=True, text=True, check=True).stdout
    complete, lines = out.split()
    assert complete == "1" and int(lines) > 20
    text = (bundle / "project" / "build_vivado.tcl").read_text()
    assert "write_bitstream" in text and ".hwh" in text


def test_the_runner_on_the_shim_is_bit_exact_in_the_verilator_cycles(bundle, sim, capsys):
    assert run_bundle([], bundle=bundle, open_device=shim(sim)) == 0
    out = capsys.readouterr().out
    assert "the bundled example: bit-exact the compiler's reference" in out
    reference = pipeline.run_model("small_cnn", VdlaTarget(BOARD.config, backend="verilator"))
    assert f"{reference.result.cycles:,} cycles" in out.splitlines()[0]


def test_an_image_and_an_output_file(bundle, sim, tmp_path, capsys):
    image = tmp_path / "image.npy"
    feed = np.load(bundle / "model" / "example.npz")["input"]
    np.save(image, feed)
    out = tmp_path / "out.npy"
    assert run_bundle([str(image), "-o", str(out), "--top", "3"], bundle=bundle,
                      open_device=shim(sim)) == 0
    assert np.array_equal(np.load(out), np.load(bundle / "model" / "example.npz")["logits"])
    assert "top 3" in capsys.readouterr().out
    np.save(image, feed[:, :1])
    assert run_bundle([str(image)], bundle=bundle, open_device=shim(sim)) == 1
    assert "input 'input' must have shape" in capsys.readouterr().err


def test_a_changed_file_is_refused(bundle, tmp_path, capsys):
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    with open(copy / "model" / "model.npz", "ab") as f:
        f.write(b"\0")
    assert run_bundle([], bundle=copy, open_device=None) == 1
    assert "model/model.npz: changed since `vdla deploy` wrote it" in capsys.readouterr().err


@pytest.mark.parametrize("change, says", [
    ({"block_in": 32, "block_out": 32}, "block_in (bitstream 32, model 16)"),
    ({"alu_hold": True}, "the bitstream has extension(s) hold"),
])
def test_a_mismatched_bitstream_is_refused(bundle, tmp_path, capsys, change, says):
    """The bitstream's manifest (--manifest: one built for another config) against the
    model's config: refused before the board is opened, naming the difference."""
    other = dataclasses.replace(BOARD.config, **change)
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"config": other.to_dict()}))

    def never(*args):
        raise AssertionError("opened the board")
    assert run_bundle(["--manifest", str(manifest)], bundle=bundle, open_device=never) == 1
    err = capsys.readouterr().err
    assert says in err and "build the bitstream for the model's config" in err


def test_a_model_that_needs_a_feature_the_bitstream_lacks(tmp_path, capsys):
    """A model compiled for a config with the ALU's hold, against the board's own
    bitstream (the project's manifest, without it)."""
    held = dataclasses.replace(BOARD.config, alu_hold=True)
    config = tmp_path / "held.json"
    config.write_text(json.dumps(held.to_dict()))
    out = tmp_path / "b"
    assert vdla_main(["deploy", "small_cnn", "--board", "pynq-z1", "--config", str(config),
                      "-o", str(out)]) == 0
    capsys.readouterr()
    manifest = tmp_path / "bitstream.json"
    manifest.write_text(json.dumps({"config": BOARD.config.to_dict()}))
    assert run_bundle(["--manifest", str(manifest)], bundle=out, open_device=None) == 1
    assert "the model needs extension(s) hold (alu_hold), which the bitstream lacks" in \
        capsys.readouterr().err


def test_deploy_refuses_bad_requests(tmp_path, capsys):
    assert vdla_main(["deploy", "small_cnn", "--board", "nosuch", "-o",
                      str(tmp_path / "x")]) == 1
    assert "unknown board 'nosuch'; known boards: pynq-z1" in capsys.readouterr().err
    assert vdla_main(["deploy", "small_cnn", "--board", "pynq-z1", "--calibration", "0",
                      "-o", str(tmp_path / "x")]) == 1
    assert "--calibration must be a positive integer" in capsys.readouterr().err
    assert vdla_main(["deploy", "small_cnn", "--board", "de10-nano", "-o",
                      str(tmp_path / "x")]) == 1
    assert "runs on a Zynq's Linux; deploy to pynq-z1, pynq-z2" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("")
    assert vdla_main(["deploy", "small_cnn", "--board", "pynq-z1", "-o",
                      str(tmp_path / "full")]) == 1
    assert "is not an empty folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]   # nothing left aside


@pytest.mark.parametrize("argv, says", [
    (["--timeout", "0"], "--timeout must be a positive number of seconds, not 0.0"),
    (["--top", "0"], "--top must be a positive integer, not 0"),
])
def test_the_runner_refuses_bad_options(bundle, capsys, argv, says):
    with pytest.raises(SystemExit) as exit_:
        run_bundle(argv, bundle=bundle, open_device=None)
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_the_runner_names_a_missing_manifest_or_example(bundle, tmp_path, capsys):
    assert run_bundle(["--manifest", str(tmp_path / "none.json")], bundle=bundle,
                      open_device=None) == 1
    assert "bitstream manifest" in capsys.readouterr().err
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["files"]["model/example.npz"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    (copy / "model" / "example.npz").unlink()
    assert run_bundle([], bundle=copy, open_device=None) == 1
    assert "no image given and the bundle has no example" in capsys.readouterr().err


def test_a_host_op_between_accelerator_ops_is_refused():
    target = VdlaTarget(BOARD.config, backend="functional")
    graph = pipeline.graph_for(pipeline.load_model("small_cnn"), target)
    compiled, _ = pipeline.compile_for(graph, target)
    assert [e["from"] for e in host_ends(compiled)[0]] == ["input"]
    moved = dataclasses.replace(compiled, ops=tuple(
        dataclasses.replace(op, target=HOST, reason="a test's fallback")
        if op.name == "pool2" else op for op in compiled.ops))
    with pytest.raises(ValueError, match="max_pool2d node 'pool2' runs on the host"):
        host_ends(moved)


def test_the_script_checks_what_it_is_given(bundle):
    script = DeviceScript.load(bundle / "model")
    with open_device(script.config, backend="functional") as dev:
        with pytest.raises(BundleError, match="must be int8 of shape"):
            script.play(dev, {"input_q": np.zeros((1, 3, 8, 8), np.int8)})
        with pytest.raises(BundleError, match="int8 inputs are"):
            script.play(dev, {})
        dev.alloc(4096)         # the allocator no longer where the recording started
        with pytest.raises(BundleError, match="its allocator differs"):
            run_exported(script, dev, dict(np.load(bundle / "model" / "example.npz")))
    other = dataclasses.replace(script.config, block_in=32, block_out=32)
    with open_device(other, backend="functional") as dev:
        with pytest.raises(BundleError, match="compiled for config"):
            script.play(dev, {})


@pytest.mark.parametrize("model", ["resnet18", "mobilenet_v1"])
def test_zoo_models_exported_play_on_the_shim(model, sim, tmp_path):
    """The exported script of a whole model through the board runtime on the shim:
    bit-exact, in the cycles of ``vdla run --sim verilator`` (about 20 s each)."""
    target = VdlaTarget(BOARD.config, backend="verilator")
    loaded = pipeline.load_model(model)
    graph = pipeline.graph_for(loaded, target)
    compiled, _ = pipeline.compile_for(graph, target)
    folder = target.export(compiled, tmp_path / model)
    dev = shim(sim)(BOARD.config, None, DRAM - BASE, 30.0)
    outputs, runs = run_exported(folder, dev, loaded.feed)
    reference = pipeline.reference_of(graph, loaded.feed)
    for name in graph.outputs:
        assert np.array_equal(outputs[name], reference[name])
    verilator = pipeline.run_model(loaded, target)
    assert sum(r["cycles"] for r in runs) == verilator.result.cycles


def test_vdla_compile_writes_the_accelerators_device_script(tmp_path, capsys):
    """The accelerator's stand-alone form through ``vdla compile``: a device script that
    plays bit-exactly on a fresh simulator."""
    out = tmp_path / "p"
    assert vdla_main(["compile", "digits_cnn", "--target", "vdla", "-o", str(out),
                      "--check"]) == 0
    text = capsys.readouterr().out
    assert "example.npz, model.json, model.npz" in text and "it was played back" in text
    example = dict(np.load(out / "example.npz"))
    script = DeviceScript.load(out)
    with open_device(script.config, backend="functional") as dev:
        outputs, runs = run_exported(script, dev, {t["from"]: example[t["from"]]
                                                   for t in script.inputs})
    assert runs and all(np.array_equal(v, example[k]) for k, v in outputs.items())
