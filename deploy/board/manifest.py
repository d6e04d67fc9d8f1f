"""A deploy bundle's manifest: what the bundle is and the SHA-256 of every file in it,
the carried code included. Board side (`vdla.deploy.board`): the standard library and
vdla's light core. `vdla.deploy.bundle_writer` writes it on the workstation; the runner
checks it first (`check_bundle`), so a model never runs on a mix of two deploys.

``manifest.json``: ``format`` (`FORMAT`), ``model``, ``board``, ``register_base`` (the
board's control window, where the runner opens it), ``config``, ``extensions``, ``vdla``
(the version that wrote it), ``created``, ``files`` ({path: SHA-256}, every file but
the manifest).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from vdla._fileio import sha256_file

__all__ = ["FORMAT", "MANIFEST", "BundleMismatch", "check_bundle", "file_hashes"]

#: The bundle manifest's layout version. 2: the bundle carries its board-side code and
#: the board's register base (1 needed vdla installed on the board).
FORMAT = "vdla-bundle/2"
MANIFEST = "manifest.json"


class BundleMismatch(ValueError):
    """A bundle whose files are not the ones its manifest lists."""


def file_hashes(folder: str | os.PathLike) -> dict[str, str]:
    """{path relative to `folder`: SHA-256} of every file in it but the manifest, sorted
    (Python's byte-code caches left out: the board's Python writes them beside the
    carried code, after the manifest)."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): sha256_file(p)
            for p in sorted(folder.rglob("*"))
            if p.is_file() and p.relative_to(folder).as_posix() != MANIFEST
            and "__pycache__" not in p.relative_to(folder).parts}


def check_bundle(folder: str | os.PathLike) -> dict:
    """The manifest of the bundle in `folder`, after checking every file it lists.
    BundleMismatch naming a file missing or changed, or a manifest of another format.
    Files it does not list (the bitstream, Vivado's outputs, the runner's) are left
    alone."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise BundleMismatch(f"{os.fspath(folder)}: no bundle manifest ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise BundleMismatch(f"{folder / MANIFEST}: format {manifest.get('format')!r}, not "
                             f"{FORMAT!r}: deploy again with this vdla")
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
