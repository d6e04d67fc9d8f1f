"""MkDocs hook: a source tree in which mkdocstrings finds `vdla`'s subpackages.

The top-level folders (`isa/`, `sim/`, `dse/`, ...) are installed as `vdla.isa`,
`vdla.sim`, `vdla.dse` by pyproject's ``[tool.setuptools.package-dir]``; griffe, which
reads the sources for the API reference, only knows the ordinary layout (`vdla/isa/`).
When it is loaded this hook lays that layout out as symbolic links under
``build/docs-api/vdla/`` (the `paths` mkdocs.yml gives the python handler), reading the
mapping from pyproject.toml, so a package added there needs nothing here. Static
reading, rather than importing the modules, keeps the build free of their side effects.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Where the tree goes; mkdocs.yml's python handler `paths` names it.
TREE = ROOT / "build" / "docs-api"


def lay_out_tree() -> None:
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-dir"]
    links = {entry.name: entry for entry in (ROOT / package_dirs["vdla"]).iterdir()
             if entry.name != "__pycache__"}
    for package, folder in package_dirs.items():
        parts = package.split(".")
        # The subpackages one level down that live outside vdla/; deeper ones follow
        # from their parent's folder.
        if len(parts) == 2 and not (ROOT / folder).is_relative_to(ROOT / package_dirs["vdla"]):
            links[parts[1]] = ROOT / folder
    tree = TREE / "vdla"
    tree.mkdir(parents=True, exist_ok=True)
    for stale in tree.iterdir():    # a module since removed or renamed would dangle
        if stale.name not in links:
            stale.unlink(missing_ok=True)
    for name, target in links.items():
        link = tree / name
        if link.is_symlink() and Path(os.readlink(link)) == target:
            continue
        if link.is_symlink():
            link.unlink()
        try:
            link.symlink_to(target, target_is_directory=target.is_dir())
        except FileExistsError:   # another build laid the same link down meanwhile
            pass


# Laid out when MkDocs loads this hook, while it reads mkdocs.yml: the python handler
# drops the `paths` that do not exist when it starts, before any hook event runs.
lay_out_tree()
