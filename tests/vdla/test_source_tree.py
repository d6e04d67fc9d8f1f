"""Every Python process vdla starts imports the installed vdla, wherever the user stands.

In a clone of the repository the root holds a ``vdla/`` folder without the subpackages
pyproject maps onto ``vdla.*`` from other folders (``sim/`` is ``vdla.sim``). A child
whose ``sys.path`` starts with the current folder (``python -m``, ``python -c``, Ray's
workers) imports that half package when a non-editable install is used from the clone's
root, and fails. These tests stand in a folder whose ``vdla/`` raises on import (the
worst such tree), so a child that sees it fails loudly, editable install or not: the
folder comes before any installed package on ``sys.path``. The slow test at the end
runs the README's main command itself from a clone with a non-editable install.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from vdla._tools import python_module_argv

ROOT = Path(__file__).resolve().parents[2]
SHADOW = "a source tree's vdla/ shadowed the installed package"
#: Folders whose Python may start Python children: the package's and the repository's
#: scripts (tests start their own children as they please).
SOURCE_FOLDERS = ("vdla", "isa", "hw", "sim", "runtime", "compiler", "boards", "dse",
                  "scripts", "bench", "examples")


@pytest.fixture
def source_tree(tmp_path, monkeypatch):
    """A folder holding a ``vdla/`` that raises on import, made the current folder."""
    folder = tmp_path / "clone"
    (folder / "vdla").mkdir(parents=True)
    (folder / "vdla" / "__init__.py").write_text(f"raise ImportError({SHADOW!r})\n")
    monkeypatch.chdir(folder)
    return folder


def test_a_bare_python_m_child_sees_the_source_tree(source_tree):
    """The control: without the guard, the child imports the shadowing folder."""
    proc = subprocess.run([sys.executable, "-m", "vdla", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and SHADOW in proc.stderr


def test_python_module_argv_imports_the_installed_package(source_tree):
    proc = subprocess.run(python_module_argv("vdla", "--help"), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: vdla" in proc.stdout


def test_python_module_argv_refuses_what_is_not_a_module():
    for bad in ("", "-c", None):
        with pytest.raises(ValueError, match="dotted module name"):
            python_module_argv(bad)


def test_the_profile_guided_builds_training_run_imports_the_installed_package(
        source_tree, tmp_path):
    """The training run's real call site, on a library that is not there: the child
    gets as far as loading it (the installed workload ran), not an import error."""
    from vdla.config import HardwareConfig
    from vdla.sim.verilator import training

    build = tmp_path / "build"
    build.mkdir()
    with pytest.raises(training.TrainingFailed) as info:
        training.train(Path("obj/missing-library.so"), HardwareConfig(),
                       build / "training.log")
    log = (build / "training.log").read_text()
    assert SHADOW not in log and "ModuleNotFoundError" not in log, log
    assert "missing-library.so" in str(info.value)


def test_ray_workers_import_the_installed_package(source_tree):
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'vdla[ray]'")
    from vdla.execute import make_executor

    # Ray's workers would import this module by name; it travels by value instead.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with make_executor(_where_vdla_comes_from, ray="local", jobs=1) as executor:
        [(_, origin)] = list(executor.map_unordered(["vdla.sim"]))
    assert Path(origin).is_file() and source_tree not in Path(origin).parents
    assert Path.cwd() == source_tree          # the driver is back where it stood


def _where_vdla_comes_from():
    """An evaluator factory (`vdla.execute`): the file a module name imports from."""
    import importlib

    return lambda name: {"file": importlib.import_module(name).__file__}["file"]


#: A script, run by its path, whose one worker reports the files `vdla` and `vdla.sim`
#: come from: the local pools' real call site (`vdla.execute`), whose workers come from
#: multiprocessing's fork server on Linux.
POOL_SCRIPT = """
import importlib
from vdla.execute import LocalExecutor

def where():
    return lambda name: [importlib.import_module(n).__file__ for n in ("vdla", name)]

if __name__ == "__main__":
    with LocalExecutor(where, 1, processes=True) as executor:
        [(_, files)] = list(executor.map_unordered(["vdla.sim"]))
    print(*files, sep="\\n")
"""


def test_local_pool_workers_import_the_installed_package(source_tree, tmp_path):
    """The fork server is started with ``python -c``, which puts the current folder
    first on its path. Here the folder's ``vdla/`` imports (a clone's half package, the
    case a raising one hides: the server's preloading swallows an import error, and each
    worker is given the parent's path): without the guard the server preloads it and
    every worker it forks inherits it."""
    (source_tree / "vdla" / "__init__.py").write_text("")
    script = tmp_path / "scripts" / "pool.py"   # its own folder, not the current one
    script.parent.mkdir()
    script.write_text(POOL_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = [Path(line) for line in proc.stdout.split()]
    assert len(files) == 2 and all(f.is_file() for f in files), proc.stdout
    assert not any(source_tree in f.parents for f in files), proc.stdout


def _python_children(path: Path) -> list[tuple[int, str]]:
    """(line, source) of each call in `path` whose argument list starts with
    `sys.executable` followed by ``-m`` or ``-c`` (a child that puts the current folder
    first on its ``sys.path``)."""
    source = path.read_text()
    tree = ast.parse(source, str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.List) or len(node.elts) < 2:
            continue
        first, second = node.elts[0], node.elts[1]
        if (isinstance(first, ast.Attribute) and first.attr == "executable"
                and isinstance(second, ast.Constant) and second.value in ("-m", "-c")):
            found.append((node.lineno, ast.get_source_segment(source, node)))
    return found


def test_no_python_child_is_started_with_the_current_folder_on_its_path():
    """The audit, kept: every ``[sys.executable, "-m" | "-c", ...]`` in the package and
    the repository's scripts would see a source tree; they use `python_module_argv` or
    ``-P``. (A script run by its path, ``[sys.executable, "bench/x.py"]``, has its own
    folder first on ``sys.path``, not the current one.)"""
    offenders = []
    for folder in SOURCE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            offenders += [f"{path.relative_to(ROOT)}:{line}: {text}"
                          for line, text in _python_children(path)]
    assert not offenders, "children that would import a source tree:\n" + "\n".join(
        offenders)


@pytest.mark.slow
def test_the_readme_main_command_runs_from_a_clone_with_a_non_editable_install(tmp_path):
    """The README's main command as a new user runs it: a clone, a fresh venv, ``pip
    install .`` (not editable) and ``vdla run resnet18`` in the clone's root, with an
    empty cache, so the Verilator model is built (and its training run started) from
    there. Minutes: pip installs every dependency into the venv."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    clone = tmp_path / "clone"
    subprocess.run([git, "clone", "-q", str(ROOT), str(clone)], check=True)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "."], cwd=clone, check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV",
                                                                    "PYTHON"))}
    env["VDLA_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run([str(env_dir / "bin" / "vdla"), "run", "resnet18"], cwd=clone,
                          env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "bit-exact vs the quantized reference: yes" in proc.stdout
