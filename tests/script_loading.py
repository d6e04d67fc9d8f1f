"""Load a script of the repository (bench/, scripts/, examples/) as a module, by path:
they are not packages, and each test loads a fresh copy."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path) -> ModuleType:
    """The script at `path` as a module named after its file. It is registered in
    `sys.modules` while it runs, as dataclasses look their module up there."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
