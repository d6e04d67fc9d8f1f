"""What vdla's build caches share (the Verilator models, the CPU target's C libraries):
entries keyed by a content hash, built once across processes, never loaded half-made.

    with build_entry(builds, key, log=log, waiting="...") as tmp:
        if tmp is None:                 # a valid entry exists (maybe after waiting)
            return cached()
        ...build into tmp...; write_entry(tmp, library_name, info)
    # the entry is now builds/key, renamed into place whole

An entry is a folder ``builds/<key>/`` holding the library and ``entry.json`` with the
library's size and SHA-256; an entry whose library does not match is rebuilt, never
loaded. A build holds an exclusive lock on ``builds/.locks/<key>.lock`` (released by the
kernel when its process dies), works in a private temporary folder and renames it into
place (atomic). A build killed half-way leaves only a temporary folder, which the next
build of the key removes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator

from vdla._fileio import sha256_file

__all__ = ["CACHE_ENV", "build_entry", "cache_root", "sha256_file", "valid_entry",
           "write_entry"]

#: The environment variable that moves every cache of vdla.
CACHE_ENV = "VDLA_CACHE"


def cache_root() -> Path:
    """The folder of vdla's caches (the Verilator models, the CPU target's libraries,
    resource estimates): ``$VDLA_CACHE``, else ``$XDG_CACHE_HOME/vdla``, else
    ``~/.cache/vdla``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "vdla"


def valid_entry(folder: Path) -> bool:
    """Whether `folder` is a complete build whose library matches its recorded hash."""
    try:
        entry = json.loads((folder / "entry.json").read_text())
        library = folder / entry["library"]
        return (library.stat().st_size == entry["size"]
                and sha256_file(library) == entry["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def write_entry(folder: Path, library: str, info: dict) -> None:
    """Write ``entry.json`` for the finished build in `folder`: `info` plus the
    library's name, size and SHA-256."""
    path = folder / library
    info = {**info, "library": library, "size": path.stat().st_size,
            "sha256": sha256_file(path)}
    (folder / "entry.json").write_text(json.dumps(info, indent=2) + "\n")


@contextlib.contextmanager
def build_entry(builds: Path, key: str, *, log: Callable[[str], None],
                waiting: str) -> Iterator[Path | None]:
    """Yield None when ``builds/key`` is a valid entry (at once, or once another process
    building it finishes), else a fresh temporary folder to build into, which becomes
    the entry when the block ends normally (and is removed when it raises).

    log : receives the waiting and rebuilding messages
    waiting : what is being built, for the message while another process builds it
    """
    entry = builds / key
    if valid_entry(entry):
        yield None
        return
    locks = builds / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{key}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another process building {waiting} ...")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if valid_entry(entry):          # built by the process we waited for
            yield None
            return
        # Whatever is left for this key is from a build that died (we hold the lock).
        for stale in builds.glob(f".tmp-{key}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if entry.exists():
            log(f"cache entry {entry} is incomplete or corrupt; rebuilding it")
            shutil.rmtree(entry)
        tmp = builds / f".tmp-{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            yield tmp
            os.rename(tmp, entry)          # atomic: readers see no entry or a whole one
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
