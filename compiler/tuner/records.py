"""Tuning records: one SQLite row per measurement.

    with Records("tune.db") as db:
        db.add(Record(workload=task.key, config=config.name, backend="verilator",
                      schedule=schedule_to_dict(s), cycles=531905, status="ok", ...))
        best = db.best(task.key, config.name)            # the fastest ok measurement

SQLite is embedded (nothing to install or run) and, in WAL mode, lets any number of
processes read while one writes; every `add` is its own ``BEGIN IMMEDIATE`` transaction
and waits (up to `timeout` seconds) for another writer's lock instead of failing, so
concurrent tuners writing one file lose nothing. A row is never updated: a schedule
measured twice has two rows (the best of them counts).

Columns: ``workload`` (the task key, `vdla.compiler.tuner.task.workload_key`),
``config`` (`HardwareConfig.name`: it names every parameter that changes the hardware),
``backend`` (``verilator``: cycles of the cycle-accurate model; ``functional``: the
analytical model's estimate after a functional run), ``schedule`` (JSON), ``cycles``
(NULL unless ok), ``counters`` (JSON: the hardware's counters), ``status`` (see
`STATUSES`), ``error``, ``tool_version`` (vdla's version), ``created`` (Unix time),
``seconds`` (wall time of the measurement).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import time
from pathlib import Path

__all__ = ["OK", "STATUSES", "Record", "Records"]

OK = "ok"
#: ok; error (lowering or simulation raised); wrong (output differs from the reference);
#: timeout (the cycle budget or the wall-clock limit ran out); crash (the worker died).
STATUSES = (OK, "error", "wrong", "timeout", "crash")

_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY,
    workload TEXT NOT NULL,
    config TEXT NOT NULL,
    backend TEXT NOT NULL,
    schedule TEXT NOT NULL,
    cycles INTEGER,
    counters TEXT NOT NULL,
    status TEXT NOT NULL,
    error TEXT NOT NULL,
    tool_version TEXT NOT NULL,
    created REAL NOT NULL,
    seconds REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS measurements_task ON measurements (workload, config, backend);
"""


def _tool_version() -> str:
    import vdla
    return vdla.__version__


@dataclasses.dataclass(frozen=True)
class Record:
    """One measurement (a row). `schedule` and `counters` are dicts."""

    workload: str
    config: str
    backend: str
    schedule: dict
    cycles: int | None
    status: str
    counters: dict = dataclasses.field(default_factory=dict)
    error: str = ""
    tool_version: str = dataclasses.field(default_factory=_tool_version)
    created: float = dataclasses.field(default_factory=time.time)
    seconds: float = 0.0

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"Record.status must be one of {', '.join(STATUSES)}, not "
                             f"{self.status!r}")
        if (self.status == OK) != (self.cycles is not None):
            raise ValueError(f"Record: an ok measurement has cycles and no other has; got "
                             f"status {self.status!r} with cycles {self.cycles!r}")

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def schedule_json(self) -> str:
        return json.dumps(self.schedule, sort_keys=True, separators=(",", ":"))


_COLUMNS = ("workload", "config", "backend", "schedule", "cycles", "counters", "status",
            "error", "tool_version", "created", "seconds")


class Records:
    """A records database (created if missing).

    path : the SQLite file
    timeout : seconds a write waits for another process's lock before it fails
    Use as a context manager, or call `close`. One object per process (SQLite
    connections do not cross `fork`); open the same path from as many processes as
    needed.
    """

    def __init__(self, path: str | os.PathLike, *, timeout: float = 60.0):
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"records path {str(self.path)!r} is a folder; give a file "
                             "(for example tune.db)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, _SCHEMA_VERSION):
                raise ValueError(f"records file {str(self.path)!r} has schema version "
                                 f"{version}; this vdla reads version {_SCHEMA_VERSION}")
            if version == 0:
                # Two processes may create the file at once: the schema is idempotent
                # and written under the write lock.
                with self._transaction():
                    for statement in _SCHEMA.split(";"):
                        if statement.strip():
                            self._db.execute(statement)
                    self._db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
        except sqlite3.DatabaseError as exc:
            raise ValueError(f"records file {str(self.path)!r} is not a vdla records "
                             f"database: {exc}") from None

    @contextlib.contextmanager
    def _transaction(self):
        self._db.execute("BEGIN IMMEDIATE")      # takes the write lock (or waits for it)
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self):
        db, self._db = getattr(self, "_db", None), None
        if db is not None:
            db.close()

    def __enter__(self) -> "Records":
        return self

    def __exit__(self, *exc):
        self.close()

    # --- writing ------------------------------------------------------------------------

    def add(self, *records: Record) -> None:
        """Append `records` in one transaction (all or none)."""
        rows = [(r.workload, r.config, r.backend, r.schedule_json,
                 None if r.cycles is None else int(r.cycles),
                 json.dumps(r.counters, sort_keys=True), r.status, r.error, r.tool_version,
                 float(r.created), float(r.seconds)) for r in records]
        with self._transaction():
            self._db.executemany(f"INSERT INTO measurements ({', '.join(_COLUMNS)}) VALUES "
                                 f"({', '.join('?' * len(_COLUMNS))})", rows)

    # --- reading ------------------------------------------------------------------------

    @staticmethod
    def _record(row) -> Record:
        data = dict(zip(_COLUMNS, row))
        data["schedule"] = json.loads(data["schedule"])
        data["counters"] = json.loads(data["counters"])
        return Record(**data)

    def query(self, workload: str | None = None, config: str | None = None,
              backend: str | None = None, *, status: str | None = None) -> list[Record]:
        """Records matching every given field, oldest first."""
        where, args = [], []
        for column, value in (("workload", workload), ("config", config),
                              ("backend", backend), ("status", status)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        sql = f"SELECT {', '.join(_COLUMNS)} FROM measurements"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [self._record(row) for row in self._db.execute(sql + " ORDER BY id", args)]

    def best(self, workload: str, config: str, backend: str = "verilator") -> Record | None:
        """The ok record with the fewest cycles for the workload on the config (the oldest
        among equals), or None."""
        row = self._db.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM measurements WHERE workload = ? AND "
            "config = ? AND backend = ? AND status = ? ORDER BY cycles, id LIMIT 1",
            (workload, config, backend, OK)).fetchone()
        return None if row is None else self._record(row)

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
