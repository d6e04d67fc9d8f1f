"""What vdla's SQLite files share (the tuner's records, the sweeps' store): a connection
in WAL mode, and write transactions that wait for another process's lock.

In WAL mode any number of processes read while one writes. Every write is one
``BEGIN IMMEDIATE`` transaction, which takes the write lock up front (waiting up to the
connection's timeout for another writer) and is committed whole or rolled back, so
concurrent writers lose nothing and a SIGKILL leaves only whole transactions.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time

__all__ = ["SqliteFile"]


class SqliteFile:
    """Base of a class that owns one SQLite connection (`_db`): opening, `_transaction`,
    `close` and the context manager. One object per process (connections do not cross
    ``fork``)."""

    _db: sqlite3.Connection | None = None
    _timeout: float = 60.0

    def _connect(self, path: str | os.PathLike, timeout: float) -> sqlite3.Connection:
        self._timeout = timeout
        self._db = sqlite3.connect(path, timeout=timeout, isolation_level=None)
        return self._db

    def _wal(self) -> None:
        # Turning a new file to WAL fails at once with "database is locked", without the
        # busy timeout, while another process does the same: retry until the timeout.
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        self._db.execute("PRAGMA synchronous=NORMAL")

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
        db, self._db = self._db, None
        if db is not None:
            db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
