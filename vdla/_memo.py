"""A persistent memo of what a pure function answers (the vdla target's default schedule
choosers: tens of thousands of timing-model calls per model), shared across processes.

    value = remembered("schedules", "conv2d", {"layer": layer, "config": config.to_dict()},
                       compute, to_json=dataclasses.asdict, from_json=decode,
                       code=_search_conv2d)

Where: ``cache_root()/<folder>/<digest of the code>/<digest of the key>.json``, one
JSON file an answer. The key is the kind, `key` (the answer's inputs: plain data and
dataclasses, written as sorted JSON) and, through the folder, the digest of the code that
computes the answer (`vdla._keys.code_digest`): `code` names the module, function or
object whose code that is, and the digest covers its module and every project module it
imports, transitively, derived from the source rather than listed by hand, so an edited
module never answers from its old version's entries, and an edit to one the code does
not import keeps them. An entry records its key's digest and a checksum of its value;
it is written whole (`atomic_write`: a temporary file renamed into place), so
concurrent processes never see half of one, and two that compute the same answer write
the same bytes. An entry that cannot be read, fails its
checksum or is refused by `from_json` is computed again and rewritten, never used. A
cache that cannot be written (a read-only folder) only costs the computing.

The folders of other code versions are removed when a new version's folder is made
if nothing was written to them for `STALE_DAYS` days, or if `KEEP_VERSIONS` others were
written more recently: a compiled ResNet-50 is about 100 MB, and every edit of the code
makes a new version, so a developer's cache would otherwise grow by that much an edit.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import pickle
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from vdla._buildcache import cache_root
from vdla._fileio import atomic_write
from vdla._keys import code_digest

__all__ = ["KEEP_VERSIONS", "STALE_DAYS", "entry_path", "remembered", "remembered_object"]

#: Days without a write after which another code version's folder is removed.
STALE_DAYS = 30
#: Other code versions' folders kept (the most recently written), for going back and
#: forth between versions (two branches) without recomputing.
KEEP_VERSIONS = 3

#: The format of an entry; a change makes every older entry unreadable, so recomputed.
FORMAT = 1

T = TypeVar("T")


def _plain(value: Any) -> Any:
    """`value` as JSON can write it: a dataclass as its type's name and fields, an enum as
    its name, a set sorted."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__type__": type(value).__qualname__,
                **{f.name: getattr(value, f.name) for f in dataclasses.fields(value)}}
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) if isinstance(v, enum.Enum) else v for v in value)
    raise TypeError(f"cannot key a memo on {type(value).__name__}: {value!r}")


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_plain)


def entry_path(folder: str, kind: str, key: Mapping[str, Any], code: Any) -> Path:
    """The file that holds (or would hold) the answer for `kind` and `key` computed by
    `code` (`vdla._keys.code_digest`)."""
    key_digest = hashlib.sha256(_canonical({"kind": kind, "key": key}).encode()).hexdigest()
    return cache_root() / folder / code_digest(code)[:24] / f"{key_digest[:40]}.json"


def _checksum(name: str, value_text: str) -> str:
    return hashlib.sha256(f"{FORMAT}\0{name}\0{value_text}".encode()).hexdigest()


def _read(path: Path) -> Any:
    """The value stored in `path`, or raise (OSError, ValueError, KeyError, TypeError)."""
    entry = json.loads(path.read_bytes())
    value_text = _canonical(entry["value"])
    if entry["format"] != FORMAT or entry["check"] != _checksum(path.stem, value_text):
        raise ValueError(f"memo entry {path} fails its checksum")
    return entry["value"]


def _write(path: Path, value: Any) -> None:
    value_text = _canonical(value)
    entry = {"format": FORMAT, "check": _checksum(path.stem, value_text),
             "value": json.loads(value_text)}
    _store(path, (json.dumps(entry, sort_keys=True) + "\n").encode())


def _store(path: Path, data: bytes) -> None:
    """Write an entry whole; the first in a new code version's folder prunes the old."""
    fresh = not path.parent.is_dir()
    atomic_write(path, data)
    if fresh:
        _prune(path.parent)


def _prune(keep: Path) -> None:
    """Remove the folders beside `keep` (other code versions) unwritten for
    `STALE_DAYS` days, and all but the `KEEP_VERSIONS` most recently written."""
    cutoff = time.time() - STALE_DAYS * 86400
    others = []
    for other in keep.parent.iterdir():
        try:
            if other != keep and other.is_dir():
                others.append((other.stat().st_mtime, other))
        except OSError:
            pass        # removed by another process meanwhile
    others.sort(reverse=True)
    for rank, (mtime, other) in enumerate(others):
        if rank >= KEEP_VERSIONS or mtime < cutoff:
            shutil.rmtree(other, ignore_errors=True)


def remembered_object(folder: str, kind: str, key: Mapping[str, Any],
                      compute: Callable[[], T], *, check: Callable[[Any], bool],
                      code: Any) -> T:
    """As `remembered`, for an answer that is no JSON data (a quantized graph: numpy
    arrays in Python objects): stored with pickle, in ``<digest>.pickle`` beside the
    JSON entries, with a SHA-256 of the pickle's bytes in front of them. An entry whose
    checksum fails, that does not unpickle, or that `check` refuses is computed again.
    The entries are this user's own cache, written by this code: pickle is no wider a
    door than the cache's compiled libraries, which are loaded too."""
    path = entry_path(folder, kind, key, code).with_suffix(".pickle")
    try:
        blob = path.read_bytes()
        digest, body = blob[:64], blob[64:]
        if digest.decode() != hashlib.sha256(body).hexdigest():
            raise ValueError(f"memo entry {path} fails its checksum")
        value = pickle.loads(body)
        if check(value):
            return value
    except (OSError, ValueError, UnicodeDecodeError, pickle.UnpicklingError, EOFError,
            AttributeError, ImportError, TypeError):
        pass    # no entry, or one not to trust: compute it again
    value = compute()
    body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        _store(path, hashlib.sha256(body).hexdigest().encode() + body)
    except OSError:
        pass    # a cache that cannot be written: the answer is still right
    return value


def remembered(folder: str, kind: str, key: Mapping[str, Any], compute: Callable[[], T], *,
               to_json: Callable[[T], Any], from_json: Callable[[Any], T],
               code: Any) -> T:
    """`compute()`, answered from the memo when it holds `kind` and `key` for this
    version of `code`, else computed and stored (see the module docstring).

    folder : the memo's folder under `cache_root()` (``"schedules"``)
    kind : what is memoized (``"conv2d"``); part of the key
    key : everything the answer depends on besides the code: plain JSON data,
        dataclasses, enums and sets
    to_json : the answer as plain JSON data
    from_json : the answer back from it; raises ValueError, KeyError or TypeError for
        data it refuses (then the answer is computed again)
    code : what computes the answer: a module or its name (``__name__``), a function
        (``compute``'s own when it is a module's function, not a lambda), a class, an
        object (its class's module: a task reached through it), a `vdla._keys.Package`
        for code reached through objects of many kinds, or a tuple of these. The
        memo's folder is named by the digest of their modules and of every project
        module they import (`vdla._keys.code_digest`), derived once per process.
    An exception of `compute` propagates and stores nothing."""
    path = entry_path(folder, kind, key, code)
    try:
        return from_json(_read(path))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass    # no entry, or one not to trust: compute it again
    value = compute()
    try:
        _write(path, to_json(value))
    except OSError:
        pass    # a cache that cannot be written: the answer is still right
    return value
