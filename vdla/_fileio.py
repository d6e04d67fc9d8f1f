"""Small file helpers shared across vdla."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write", "sha256_file"]


def _umask() -> int:
    # The only portable way to read the umask is to set it and set it back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, data: bytes, *, mode: int | None = None) -> Path:
    """Write `data` to `path` so that readers see the old file or the new one, never half.

    The bytes go to a temporary file in the same folder, are flushed to disk, and are
    renamed over `path` (rename is atomic within a file system). `mode` (``0o600`` for a
    secret) is the new file's permissions from its first byte on; by default those a
    plain open() would give, or the mode of the file it replaces.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates the file 0600; give it the mode a plain open() would (0666 less
        # the umask), or keep the mode of the file it replaces.
        if mode is None:
            try:
                mode = path.stat().st_mode & 0o777
            except FileNotFoundError:
                mode = 0o666 & ~_umask()
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 of the file at `path`, in hex, read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
