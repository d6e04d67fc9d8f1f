"""A deploy bundle's manifest: what the bundle is and the SHA-256 of every file in it,
the carried code included. Board side (`vdla.deploy.board`): the standard library and
vdla's light core. `vdla.deploy.bundle_writer` writes it on the workstation; the runner
checks it first (`check_bundle`), so a model never runs on a mix of two deploys.

``manifest.json``: ``format`` (`FORMAT`), ``model``, ``board``, ``register_base`` (the
board's control window, where the runner opens it), ``config``, ``extensions``, ``vdla``
(the version that wrote it), ``created``, ``integrity`` (`INTEGRITY`, what the hashes
are for), ``files`` ({path: SHA-256}, every file but the manifest).

**What the hashes guard against.** Accidents: a file changed, truncated or missing
since `vdla deploy` wrote the bundle, or two deploys mixed in one folder. Not an
attacker who can write the bundle: they can rewrite the manifest with the files, and
the runner (often run as root, to reach the hardware) runs the bundle's code. Keep the
bundle where only its owner can write it.

A manifest's paths stay inside the bundle: an absolute path, a ``..``, or a path that
leads out through a symbolic link is refused before anything is read, so a manifest
cannot make the runner hash (and print a digest of) a file elsewhere on the board.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from vdla._fileio import sha256_file

__all__ = ["FORMAT", "INTEGRITY", "MANIFEST", "BundleMismatch", "check_bundle",
           "file_hashes"]

#: The bundle manifest's layout version. 2: the bundle carries its board-side code and
#: the board's register base (1 needed vdla installed on the board).
FORMAT = "vdla-bundle/2"
MANIFEST = "manifest.json"
#: What the manifest's hashes are for, written into every manifest (``integrity``) so a
#: reader of the bundle sees it too.
INTEGRITY = ("the SHA-256 of each file guards against accidents (a file changed or missing "
             "since vdla deploy wrote it, two deploys mixed), not against an attacker who "
             "can write the bundle: they can rewrite this manifest as well")


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

    folder : the bundle's folder
    BundleMismatch naming a file missing or changed, a manifest that is not a JSON
    object of this layout (its fields' types), of another format, or that names a file
    outside the bundle (`_inside`). Files it does not list (the bitstream, Vivado's
    outputs, the runner's) are left alone."""
    folder = Path(folder)
    where = folder / MANIFEST
    try:
        manifest = json.loads(where.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise BundleMismatch(f"{os.fspath(folder)}: no bundle manifest ({exc})") from None
    if not isinstance(manifest, dict):
        raise BundleMismatch(f"{where}: a JSON object is needed, not a "
                             f"{type(manifest).__name__}")
    if manifest.get("format") != FORMAT:
        raise BundleMismatch(f"{where}: format {manifest.get('format')!r}, not "
                             f"{FORMAT!r}: deploy again with this vdla")
    _check_fields(manifest, where)
    root = folder.resolve()
    for name, digest in sorted(manifest["files"].items()):
        path = _inside(root, name, where)
        if not isinstance(digest, str) or not _is_sha256(digest):
            raise BundleMismatch(f"{where}: file {name!r}: SHA-256 {digest!r} is not 64 hex "
                                 "digits")
        if not path.is_file():
            raise BundleMismatch(f"{name}: listed in the bundle's manifest but missing")
        found = sha256_file(path)
        if found != digest.lower():
            raise BundleMismatch(f"{name}: changed since `vdla deploy` wrote it (SHA-256 "
                                 f"{found[:12]}..., the manifest has {digest[:12]}...): "
                                 "deploy again")
    return manifest


#: The fields the runner reads, with their types.
_FIELDS = {"model": str, "board": str, "register_base": int, "config": str, "files": dict}
_JSON = {str: "string", int: "integer", dict: "object"}


def _check_fields(manifest: dict, where: Path) -> None:
    for field, kind in _FIELDS.items():
        value = manifest.get(field)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise BundleMismatch(f"{where}: {field!r} must be a JSON {_JSON[kind]}, not "
                                 f"{value!r:.80}")
    if manifest["register_base"] < 0:
        raise BundleMismatch(f"{where}: register_base {manifest['register_base']} is "
                             "negative")


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text)


def _inside(root: Path, name, where: Path) -> Path:
    """The file `name` of the manifest, as a path inside the bundle's folder `root`
    (resolved); BundleMismatch for a name that is not a relative path of plain parts,
    or that leads out of the bundle through a symbolic link."""
    parts = name.split("/") if isinstance(name, str) else []
    if (not parts or name.startswith("/") or "\\" in name or "\0" in name
            or any(part in ("", ".", "..") for part in parts)):
        raise BundleMismatch(f"{where}: file {name!r}: a manifest names files by their "
                             "path inside the bundle (relative, '/'-separated, no '..', "
                             "'.' or empty parts)")
    path = root.joinpath(*parts)
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as exc:      # a loop of links
        raise BundleMismatch(f"{where}: file {name!r}: {exc}") from None
    if not resolved.is_relative_to(root):
        raise BundleMismatch(f"{where}: file {name!r} leads out of the bundle (to "
                             f"{resolved}) through a symbolic link: refused")
    return resolved
