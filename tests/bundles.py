"""Deploy bundles for the tests: a module's own copy of the session's `small_cnn_bundle`
(tests/conftest.py), which no test may change."""

from __future__ import annotations

import shutil
from pathlib import Path


def copy_of(bundle: Path, tmp_path_factory) -> Path:
    """A copy of `bundle` for the caller to use and change: running a bundle's run.py
    writes into it (Python's bytecode cache)."""
    out = tmp_path_factory.mktemp("bundle") / bundle.name
    shutil.copytree(bundle, out, symlinks=True)
    return out
