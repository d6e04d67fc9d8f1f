"""Tuning records: one SQLite row per measurement.

    with Records("tune.db") as db:
        db.add(Record(target="vdla", workload=task.key, config=task.platform,
                      backend="verilator", schedule=task.schedule_to_dict(s),
                      cycles=531905, status="ok", ...))
        best = db.best(task.key, task.platform, "verilator", target="vdla")   # the fastest

SQLite is embedded (nothing to install or run) and, in WAL mode, lets any number of
processes read while one writes; every `add` is its own ``BEGIN IMMEDIATE`` transaction
and waits (up to `timeout` seconds) for another writer's lock instead of failing, so
concurrent tuners writing one file lose nothing. A row is never updated: a schedule
measured twice has two rows, and the median of its rows is its cost (`best`): for a
deterministic simulator every row is the same, for wall time the median of repeated
measurements is what resists a lucky one.

Columns: ``target`` (the target's name: ``vdla``, ...), ``workload`` (the task's key,
`TuneTask.key`), ``config`` (the platform measured on, `TuneTask.platform`: for the
accelerator `HardwareConfig.name`, which names every parameter that changes the
hardware), ``backend`` (how it was measured; for the accelerator ``verilator``: cycles of
the cycle-accurate model, ``functional``: the analytical model's estimate after a
functional run), ``schedule`` (JSON, `TuneTask.schedule_to_dict`), ``cycles`` (the
measured cost in the task's unit; NULL unless ok), ``counters`` (JSON: the target's own
figures), ``status`` (see `STATUSES`), ``error``, ``tool_version`` (vdla's version),
``created`` (Unix time), ``seconds`` (wall time of the measurement).

Schema versions: 2 added ``target``. A version-1 file (vdla's tuner before targets; all
its rows are the accelerator's) is migrated in place when opened: its rows get
``target = 'vdla'``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import time
from pathlib import Path

import vdla
from vdla._sqlite import SqliteFile

__all__ = ["OK", "STATUSES", "Record", "Records"]

OK = "ok"
#: ok; error (lowering or simulation raised); wrong (output differs from the reference);
#: timeout (the cycle budget or the wall-clock limit ran out); crash (the worker died).
STATUSES = (OK, "error", "wrong", "timeout", "crash")

_SCHEMA_VERSION = 2
_SCHEMA = """
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY,
    target TEXT NOT NULL,
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
CREATE INDEX IF NOT EXISTS measurements_task ON measurements (target, workload, config,
                                                             backend);
"""
#: Version 1 -> 2: every row of a version-1 file is the accelerator's.
_MIGRATE_1_TO_2 = """
ALTER TABLE measurements ADD COLUMN target TEXT NOT NULL DEFAULT 'vdla';
DROP INDEX IF EXISTS measurements_task;
CREATE INDEX measurements_task ON measurements (target, workload, config, backend);
"""


def _tool_version() -> str:
    return vdla.__version__


@dataclasses.dataclass(frozen=True)
class Record:
    """One measurement (a row). `schedule` and `counters` are dicts."""

    target: str
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


_COLUMNS = ("target", "workload", "config", "backend", "schedule", "cycles", "counters", "status",
            "error", "tool_version", "created", "seconds")


class Records(SqliteFile):
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
            self._connect(self.path, timeout)
            self._wal()
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, 1, _SCHEMA_VERSION):
                raise ValueError(f"records file {str(self.path)!r} has schema version "
                                 f"{version}; this vdla reads versions 1 and "
                                 f"{_SCHEMA_VERSION} (a newer vdla wrote it)")
            if version == 1:
                self._migrate_from_1()
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

    def _migrate_from_1(self):
        # Under the write lock, and only if no other process migrated it meanwhile.
        with self._transaction():
            if self._db.execute("PRAGMA user_version").fetchone()[0] == 1:
                for statement in _MIGRATE_1_TO_2.split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")

    # --- writing ------------------------------------------------------------------------

    def add(self, *records: Record) -> None:
        """Append `records` in one transaction (all or none)."""
        rows = [(r.target, r.workload, r.config, r.backend, r.schedule_json,
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
              backend: str | None = None, *, target: str | None = None,
              status: str | None = None) -> list[Record]:
        """Records matching every given field, oldest first."""
        where, args = [], []
        for column, value in (("target", target), ("workload", workload), ("config", config),
                              ("backend", backend), ("status", status)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        sql = f"SELECT {', '.join(_COLUMNS)} FROM measurements"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [self._record(row) for row in self._db.execute(sql + " ORDER BY id", args)]

    def best(self, workload: str, config: str, backend: str, *,
             target: str) -> Record | None:
        """The schedule with the lowest cost for the workload of `target` on the config,
        measured on `backend`, or None: `ranked`'s first."""
        ranked = self.ranked(workload, config, backend, target=target)
        return ranked[0] if ranked else None

    def ranked(self, workload: str, config: str, backend: str, *,
               target: str) -> list[Record]:
        """Every schedule measured ok for the workload of `target` on the config and
        `backend`, fastest first: a schedule's cost is the median of its ok rows (the
        lower median; one row: its cost), and the oldest schedule goes first among
        equals. Each is its first ok row with ``cycles`` set to that median."""
        rows = self._db.execute(
            f"SELECT {', '.join(_COLUMNS)}, id FROM measurements WHERE target = ? AND "
            "workload = ? AND config = ? AND backend = ? AND status = ? ORDER BY id",
            (target, workload, config, backend, OK)).fetchall()
        by_schedule: dict[str, list] = {}
        for row in rows:
            by_schedule.setdefault(row[_COLUMNS.index("schedule")], []).append(row)
        found = []
        for group in by_schedule.values():
            costs = sorted(r[_COLUMNS.index("cycles")] for r in group)
            found.append(((costs[(len(costs) - 1) // 2], group[0][-1]), group[0]))
        found.sort(key=lambda item: item[0])
        return [dataclasses.replace(self._record(row[:-1]), cycles=key[0])
                for key, row in found]

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
