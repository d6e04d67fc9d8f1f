"""The sweep store: round trips, concurrent writers, a SIGKILLed writer, wrong files."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import time

import pytest

from vdla.compiler.tuner.records import Records
from vdla.dse.store import Store, point_key


def record(key, **extra):
    return {"key": key, "params": {"block_in": 16}, "valid": True, "reason": None,
            "objectives": {"latency_ms": 1.5}, "confirmed": None, **extra}


def test_put_get_and_confirm_round_trip(tmp_path):
    with Store(tmp_path / "s.db") as store:
        store.put(record("a"))
        store.put(record("b", valid=False))
        assert store.get("a") == record("a") and store.get("zz") is None
        assert set(store.get_many(["a", "b", "c"])) == {"a", "b"} and len(store) == 2
        updated = store.put_confirmed("a", {"cycles": 10})
        assert updated["confirmed"] == {"cycles": 10} == store.get("a")["confirmed"]
        store.add_to_sweep("s1", ["a", "b"])
        store.add_to_sweep("s1", ["a"])
        assert store.sweep_keys("s1") == ["a", "b"] and store.sweep_keys("s2") == []
        assert [r["key"] for r in store.records(["b", "a", "nope"])] == ["b", "a"]
        with pytest.raises(KeyError, match="no point 'zz'"):
            store.put_confirmed("zz", {})
        with pytest.raises(ValueError, match="string 'key'"):
            store.put({"params": {}})
    # Reopened: the same records.
    with Store(tmp_path / "s.db") as store:
        assert store.get("a")["confirmed"] == {"cycles": 10}


def test_point_keys_are_canonical():
    assert point_key(a=1, b={"x": [1, 2]}) == point_key(b={"x": [1, 2]}, a=1)
    assert point_key(a=1) != point_key(a=2) and len(point_key(a=1)) == 32


def _writer(path, prefix, n):
    with Store(path) as store:
        for i in range(n):
            store.put(record(f"{prefix}{i}", blob="x" * 2000))


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "s.db"
    Store(path).close()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, p, 200)) for p in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with Store(path) as store:
        assert len(store) == 400
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_killed_writer_leaves_whole_records(tmp_path):
    path = tmp_path / "s.db"
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=_writer, args=(path, "k", 100000))
    proc.start()
    def written():   # opening the file while the writer creates it must work too
        if not path.exists():
            return 0
        with Store(path) as store:
            return len(store)

    deadline = time.monotonic() + 120
    while written() < 50 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    with Store(path) as store:
        records = store.records()
        assert len(records) >= 50
        assert all(r == record(r["key"], blob="x" * 2000) for r in records)


def test_files_that_are_not_stores_are_refused(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello " * 1000)
    with pytest.raises(ValueError, match="not a vdla sweep store"):
        Store(text)
    tuner = tmp_path / "tune.db"
    Records(tuner).close()
    with pytest.raises(ValueError, match="not a vdla sweep store"):
        Store(tuner)
    with pytest.raises(ValueError, match="does not exist"):
        Store(tmp_path / "missing" / "s.db")
    with pytest.raises(ValueError, match="is a folder"):
        Store(tmp_path)


def _open_and_put(path, barrier, queue):
    barrier.wait()
    try:
        with Store(path) as store:
            store.put(record(str(os.getpid())))
        queue.put("ok")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        queue.put(repr(exc))


def test_sweeps_creating_one_store_at_once_all_open_it(tmp_path):
    # Each opener of a new file races the others' schema and WAL switch: none may take
    # the file for a foreign one or fail on a lock.
    ctx = multiprocessing.get_context("fork")
    for trial in range(30):
        path = tmp_path / f"s{trial}.db"
        barrier, queue = ctx.Barrier(6), ctx.Queue()
        procs = [ctx.Process(target=_open_and_put, args=(path, barrier, queue))
                 for _ in range(6)]
        for p in procs:
            p.start()
        outcomes = [queue.get(timeout=60) for _ in procs]
        for p in procs:
            p.join()
        assert outcomes == ["ok"] * 6
        with Store(path) as store:
            assert len(store) == 6


def test_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "s.db"
    Store(path).close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(ValueError, match=r"not a vdla sweep store: schema version 99.*newer"):
        Store(path)
