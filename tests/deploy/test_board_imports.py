"""What runs on the board imports nothing but the standard library and numpy: a bundle's
own run.py, with the code the bundle carries (lib/), run in a child process with every
other module refused (`board_child.Blocker`), and in a fresh virtual environment with
numpy alone; both against the Verilator model of the same Verilog, served to the child
over a pipe (`board_shim.serve_layers`: register accesses, cache flushes and
invalidates), and both bit-exact with ``vdla run`` on the same model, in its cycles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from board_shim import serve_layers
from bundles import copy_of
from vdla.boards import BOARDS
from vdla.compiler import pipeline
from vdla.compiler.targets.vdla import VdlaTarget
from vdla.deploy.bundle_writer import CARRIED
from vdla.sim.verilator import VerilatorSimulator

BOARD = BOARDS["pynq-z1"]
BASE = 1 << 20
DRAM = 64 << 20
CHILD = Path(__file__).with_name("board_child.py")
#: What must never load on the board's path (the workstation's tools, vdla's own heavy
#: parts).
HEAVY = ("amaranth", "sklearn", "onnx", "optuna", "torch", "cocotb", "networkx",
         "vdla.compiler", "vdla.sim", "vdla.dse", "vdla.hw", "vdla.runtime", "vdla.boards",
         "vdla.cli")


@pytest.fixture(scope="module")
def sim():
    simulator = VerilatorSimulator(BOARD.config, DRAM, log=lambda message: None)
    yield simulator
    simulator.close()


@pytest.fixture(scope="module")
def bundle(small_cnn_bundle, tmp_path_factory):
    return copy_of(small_cnn_bundle, tmp_path_factory)


@pytest.fixture(scope="module")
def vdla_run():
    """``vdla run small_cnn`` on the board's config, on the Verilator backend."""
    return pipeline.run_model("small_cnn", VdlaTarget(BOARD.config, backend="verilator")).result


def on_board(python: str, bundle: Path, sim, args: list[str], *, block: bool,
             tmp: Path, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the bundle's run.py with `args` under `python` (`board_child.py`), its layers
    served here over a pipe to `sim`'s model; (the process, its report)."""
    to_child, from_parent = os.pipe()
    to_parent, from_child = os.pipe()
    report = tmp / "report.json"
    cmd = [python, str(CHILD), str(bundle), str(to_child), str(from_child), str(report),
           *(["--block"] if block else []), "--", *args]
    proc = subprocess.Popen(cmd, pass_fds=(to_child, from_child), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=bundle,
                            env={**os.environ, "VDLA_TEST_REGION_BASE": str(BASE),
                                 **(env or {})})
    os.close(to_child)
    os.close(from_child)
    rx, tx = os.fdopen(to_parent, "rb", buffering=0), os.fdopen(from_parent, "wb", buffering=0)
    served = threading.Thread(target=serve_layers, args=(rx, tx, sim.model, BASE))
    served.start()
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        served.join(timeout=60)
        rx.close()
        tx.close()
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    assert report.is_file(), err[-3000:]
    return done, json.loads(report.read_text())


def check_run(done, report, bundle: Path, vdla_run, out: Path) -> None:
    """The run bit-exact with the bundle's example and with ``vdla run``, in its cycles,
    on the bundle's own code only."""
    assert done.returncode == 0 and report["exit"] == 0, done.stderr[-3000:]
    assert "the bundled example: bit-exact the compiler's reference" in done.stdout
    assert f"{vdla_run.cycles:,} cycles" in done.stdout.splitlines()[0]
    assert np.array_equal(np.load(out), vdla_run.values["logits"])
    lib = (bundle / "lib").resolve()
    for name, file in report["modules"].items():
        assert name in CARRIED and Path(file).resolve().is_relative_to(lib), (name, file)
    loaded = set(report["loaded"])
    assert not {m for m in loaded for h in HEAVY if m == h or m.startswith(h + ".")}


def test_the_runner_imports_the_standard_library_numpy_and_its_own_code(bundle, sim,
                                                                         vdla_run, tmp_path):
    out = tmp_path / "out.npy"
    done, report = on_board(sys.executable, bundle, sim, ["-o", str(out)], block=True,
                            tmp=tmp_path)
    check_run(done, report, bundle, vdla_run, out)
    # (``org``: the standard library's `copy` probes for Jython's module, and does
    # without it.)
    assert set(report["refused"]) <= {"org"}, "the board's path tried to import these"
    # What the runner ran: the runner, the player, the accelerator, the register map,
    # the manifest check, the ISA's encoding and relocation, the config.
    assert {"vdla.deploy.board.runner", "vdla.deploy.board.player",
            "vdla.deploy.board.hardware", "vdla.deploy.board.manifest",
            "vdla.isa.registers", "vdla.isa.encoding", "vdla.isa.relocate",
            "vdla.config"} <= set(report["modules"])


def test_the_blocker_refuses_what_is_not_carried(bundle, sim, tmp_path):
    """The control: a carried file that imports the compiler is refused on the board's
    path (a copy of the bundle, its manifest left as it was: the change is caught
    there too, once the import is allowed)."""
    copy = tmp_path / "b"
    subprocess.run(["cp", "-r", str(bundle), str(copy)], check=True)
    player = copy / "lib" / "vdla" / "deploy" / "board" / "player.py"
    player.write_text(player.read_text() + "\nimport vdla.compiler\n")
    done, report = on_board(sys.executable, copy, sim, [], block=True, tmp=tmp_path)
    assert report["exit"] != 0 and "vdla.compiler" in report["refused"], done.stderr[-3000:]


@pytest.mark.slow
def test_the_bundle_runs_in_a_fresh_venv_with_numpy_alone(bundle, sim, vdla_run, tmp_path):
    """A virtual environment without system site-packages, numpy installed from the
    registry, nothing else: the bundle's run.py runs from its folder (about 40 s, most
    of it pip)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "numpy"],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr[-3000:]
    listed = subprocess.run([python, "-m", "pip", "list", "--format", "json"],
                            capture_output=True, text=True, check=True).stdout
    assert {p["name"] for p in json.loads(listed)} <= {"numpy", "pip", "setuptools"}
    out = tmp_path / "out.npy"
    # A clean environment: nothing of this machine's Python path reaches the child.
    env = {"PYTHONPATH": "", "PYTHONNOUSERSITE": "1"}
    done, report = on_board(python, bundle, sim, ["-o", str(out)], block=False,
                            tmp=tmp_path, env=env)
    check_run(done, report, bundle, vdla_run, out)
