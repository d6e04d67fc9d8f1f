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

The lock file names its holder (`holder_record`: its pid and the pid of the command it
works for), so that a process that has to wait can say whom it waits for. A command's
own worker processes wait for each other in silence: the op-parallel runner's two
workers both need the model, one builds it and says so ("building the Verilator model
..."), and the other's "waiting for another process" read as if someone else were
building. Only a genuinely other command is reported, with its pid.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import multiprocessing
import os
import shutil
import time
from pathlib import Path
from typing import Callable, Iterator

from vdla._fileio import sha256_file

__all__ = ["CACHE_ENV", "build_entry", "cache_root", "command_pid", "holder_record",
           "sha256_file", "valid_entry", "write_entry"]

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


def command_pid() -> int:
    """The pid of the command this process works for: its parent's when it is a
    multiprocessing worker (the workers of a parallel run, a sweep or the tuner are the
    command's children, started by `vdla._workers.start_worker`), else its own. Two
    commands started from one shell are two commands (the shell is no multiprocessing
    parent), where the parent pids alone would make them siblings."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None else os.getpid()


def holder_record() -> dict:
    """What a build writes into its key's lock file once it holds the lock: its pid and
    its `command_pid`."""
    return {"pid": os.getpid(), "command": command_pid()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:             # another user's process: alive
        return True
    return True


def _holder(lock, tries: int = 20, pause: float = 0.05) -> dict | None:
    """The record of the process that holds `lock` (an open lock file), or None when it
    cannot be told. A holder writes its record just after it takes the lock, so an empty
    file, or the record of a process that has died (the previous holder's), is read
    again a few times, `pause` seconds apart."""
    for attempt in range(tries):
        try:
            lock.seek(0)
            record = json.loads(lock.read() or "null")
            if (isinstance(record, dict) and isinstance(record.get("pid"), int)
                    and isinstance(record.get("command"), int) and _alive(record["pid"])):
                return record
        except (OSError, ValueError):
            pass
        if attempt + 1 < tries:
            time.sleep(pause)
    return None


def waiting_message(holder: dict | None, waiting: str) -> str | None:
    """The line a process logs while `holder` (its `holder_record`, None when unknown)
    builds `waiting`: None when the holder works for the same command, whose own build
    line already said that the model is being built and how long it takes (a second
    line, "waiting for another process", read as if someone else were building); else
    who builds it."""
    if holder is None:
        return f"waiting for another process building {waiting} ..."
    if holder["command"] == command_pid():
        return None
    return f"waiting for another process (pid {holder['pid']}) building {waiting} ..."


@contextlib.contextmanager
def build_entry(builds: Path, key: str, *, log: Callable[[str], None],
                waiting: str) -> Iterator[Path | None]:
    """Yield None when ``builds/key`` is a valid entry (at once, or once another process
    building it finishes), else a fresh temporary folder to build into, which becomes
    the entry when the block ends normally (and is removed when it raises).

    log : receives the waiting and rebuilding messages
    waiting : what is being built, for the message while another command's process
        builds it (a worker of the same command waits without one: `waiting_message`)
    """
    entry = builds / key
    if valid_entry(entry):
        yield None
        return
    locks = builds / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    # Opened without truncating: the holder's record is what a waiter reads.
    fd = os.open(locks / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    with os.fdopen(fd, "r+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            message = waiting_message(_holder(lock), waiting)
            if message is not None:
                log(message)
            fcntl.flock(lock, fcntl.LOCK_EX)
        lock.seek(0)
        lock.truncate()
        lock.write(json.dumps(holder_record()))
        lock.flush()
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
