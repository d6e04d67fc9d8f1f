"""The sweep's durable results store: one SQLite row per evaluated design point.

    with Store("sweep.db") as store:
        store.put(record)                   # a point's record (`vdla.dse.evaluate`)
        store.get_many(keys)                # {key: record} of those it holds
        store.put_confirmed(key, confirmed) # Verilator and yosys figures of a point

A record is keyed by `point_key` of what decides its figures (the config, the board,
the models, the versions of the models of time and resources), so any sweep that meets
the same point again takes it from the store: a killed sweep resumes without redoing
finished points, and overlapping sweeps share work. Like the tuner's records
(`vdla.compiler.tuner.records`), the file is in WAL mode, every write is one
``BEGIN IMMEDIATE`` transaction that waits for another writer's lock rather than
failing, and a row is written whole or not at all, so concurrent sweeps on one file
lose nothing and a SIGKILL leaves only whole rows.

A sweep lists its points under its spec's key (`add_to_sweep`), so reports can show
exactly one sweep's points from a shared store. One `Store` per process (SQLite
connections do not cross ``fork``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from vdla._sqlite import SqliteFile

__all__ = ["Store", "point_key"]

#: ``PRAGMA application_id`` of a sweep store ("vdsw"), so that another SQLite file (the
#: tuner's records, say) is refused rather than misread.
APPLICATION_ID = 0x76647377
_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS points (
    key TEXT PRIMARY KEY,
    record TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS sweep_points (
    sweep TEXT NOT NULL,
    key TEXT NOT NULL,
    PRIMARY KEY (sweep, key)
);
"""


def point_key(**parts: Any) -> str:
    """The key of a design point: a hash of the canonical JSON of `parts`."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Store(SqliteFile):
    """A sweep store (created if missing).

    path : the SQLite file (its folder must exist)
    timeout : seconds a write waits for another process's lock before it fails
    """

    def __init__(self, path: str | os.PathLike, *, timeout: float = 60.0):
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"sweep store {str(self.path)!r} is a folder; give a file "
                             "(for example sweep.db)")
        if not self.path.parent.is_dir():
            raise ValueError(f"sweep store {str(self.path)!r}: folder "
                             f"{str(self.path.parent)!r} does not exist")
        try:
            self._connect(self.path, timeout)
            if self._header() == 0:
                self._wal()
                # Several sweeps may create one store at once: the schema is written under
                # the write lock, by the first of them (the others find it written).
                with self._transaction():
                    if self._header() == 0:
                        for statement in _SCHEMA.split(";"):
                            if statement.strip():
                                self._db.execute(statement)
                        self._db.execute(f"PRAGMA application_id={APPLICATION_ID}")
                        self._db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
            else:
                self._wal()
        except sqlite3.OperationalError as exc:   # locked past the timeout, I/O, permissions
            self.close()
            raise ValueError(f"cannot open sweep store {str(self.path)!r}: {exc}") from None
        except (sqlite3.DatabaseError, ValueError) as exc:
            self.close()
            raise ValueError(f"{str(self.path)!r} is not a vdla sweep store: {exc}") from None

    def _header(self) -> int:
        """The file's schema version (0: a new, empty file); raises ValueError for a file
        that is not a sweep store or one a newer vdla wrote."""
        # One read transaction: a consistent view even while another process writes the
        # schema (separate statements could each see a different side of its commit).
        in_transaction = self._db.in_transaction
        if not in_transaction:
            self._db.execute("BEGIN")
        try:
            app, version, tables = (self._db.execute(sql).fetchone()[0] for sql in (
                "PRAGMA application_id", "PRAGMA user_version",
                "SELECT count(*) FROM sqlite_master"))
        finally:
            if not in_transaction and self._db.in_transaction:
                self._db.execute("ROLLBACK")   # only read
        if (app, version) == (0, 0):
            if tables:
                raise ValueError("it holds tables but is not a sweep store")
            return 0
        if app != APPLICATION_ID:
            raise ValueError(f"its application id is {app:#x}, not a sweep store's")
        if version > _SCHEMA_VERSION:
            raise ValueError(f"schema version {version}; this vdla reads up to "
                             f"{_SCHEMA_VERSION} (a newer vdla wrote it)")
        return version

    def __len__(self) -> int:
        return self._db.execute("SELECT count(*) FROM points").fetchone()[0]

    # --- writing ------------------------------------------------------------------------

    def put(self, record: Mapping) -> None:
        """Write (or replace) `record` under ``record["key"]``, whole or not at all."""
        key = record.get("key")
        if not isinstance(key, str) or not key:
            raise ValueError(f"a sweep record needs a string 'key', not {key!r}")
        text = json.dumps(record, sort_keys=True)
        with self._transaction():
            self._db.execute("INSERT OR REPLACE INTO points (key, record, created) "
                             "VALUES (?, ?, ?)", (key, text, time.time()))

    def put_confirmed(self, key: str, confirmed: Mapping) -> dict:
        """Set the ``confirmed`` field of the record under `key` (read, change and write
        in one transaction); returns the updated record."""
        with self._transaction():
            row = self._db.execute("SELECT record FROM points WHERE key = ?", (key,)).fetchone()
            if row is None:
                raise KeyError(f"no point {key!r} in sweep store {str(self.path)!r}")
            record = json.loads(row[0])
            record["confirmed"] = dict(confirmed)
            self._db.execute("UPDATE points SET record = ? WHERE key = ?",
                             (json.dumps(record, sort_keys=True), key))
        return record

    def add_to_sweep(self, sweep: str, keys: Iterable[str]) -> None:
        """List `keys` among sweep `sweep`'s points."""
        rows = [(sweep, k) for k in keys]
        if rows:
            with self._transaction():
                self._db.executemany("INSERT OR IGNORE INTO sweep_points (sweep, key) "
                                     "VALUES (?, ?)", rows)

    # --- reading ------------------------------------------------------------------------

    def get(self, key: str) -> dict | None:
        row = self._db.execute("SELECT record FROM points WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def get_many(self, keys: Iterable[str]) -> dict[str, dict]:
        """{key: record} for the `keys` the store holds."""
        keys, found = list(dict.fromkeys(keys)), {}
        for i in range(0, len(keys), 500):  # SQLite's limit on bound parameters
            chunk = keys[i:i + 500]
            rows = self._db.execute(
                f"SELECT key, record FROM points WHERE key IN ({','.join('?' * len(chunk))})",
                chunk)
            found.update((k, json.loads(r)) for k, r in rows)
        return found

    def sweep_keys(self, sweep: str) -> list[str]:
        return [k for (k,) in self._db.execute(
            "SELECT key FROM sweep_points WHERE sweep = ? ORDER BY key", (sweep,))]

    def records(self, keys: Iterable[str] | None = None) -> list[dict]:
        """The records of `keys` (in that order, those it holds), or every record."""
        if keys is None:
            return [json.loads(r) for (r,) in
                    self._db.execute("SELECT record FROM points ORDER BY created, key")]
        found = self.get_many(keys)
        return [found[k] for k in dict.fromkeys(keys) if k in found]
