"""The build cache's lock, as a process that has to wait sees it: a worker of the same
command waits in silence (its sibling's build line already says a build is under way),
another command's build is named with its pid. Real processes, a tiny fake build."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from vdla._buildcache import build_entry, command_pid, holder_record, waiting_message, \
    write_entry

KEY = "k" * 16
WHAT = "the model of a test config"

BUILD_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from vdla._buildcache import build_entry, write_entry
    builds, key, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    with build_entry(builds, key, log=print, waiting="x") as tmp:
        (tmp / "lib").write_bytes(b"x")
        write_entry(tmp, "lib", {})
        while not go.exists():
            time.sleep(0.02)
""")


def _build(builds: Path, go: Path, out: Path) -> None:
    """Build `KEY` in `builds` (the lock held until the file `go` exists, when it builds)
    and write what it logged, and whether it built, to `out`."""
    lines: list[str] = []
    with build_entry(builds, KEY, log=lines.append, waiting=WHAT) as tmp:
        if tmp is not None:
            (tmp / "lib").write_bytes(b"x")
            write_entry(tmp, "lib", {})
            while not go.exists():
                time.sleep(0.02)
    out.write_text(json.dumps({"log": lines, "built": tmp is not None}))


def _held_by(builds: Path, pid: int, timeout: float = 60.0) -> None:
    """Wait until the lock file of `KEY` names `pid` as its holder."""
    lock = builds / ".locks" / f"{KEY}.lock"
    deadline = time.monotonic() + timeout
    while True:
        try:
            if json.loads(lock.read_text() or "null")["pid"] == pid:
                return
        except (OSError, ValueError, TypeError, KeyError):
            pass
        assert time.monotonic() < deadline, "the builder never took the lock"
        time.sleep(0.02)


def test_a_worker_waits_for_its_sibling_in_silence(tmp_path):
    """The op-parallel runner's two workers: one builds, the other waits and says
    nothing (it printed "waiting for another process", which read as someone else)."""
    builds, go = tmp_path / "builds", tmp_path / "go"
    context = multiprocessing.get_context("fork")
    builder = context.Process(target=_build, args=(builds, go, tmp_path / "a.json"))
    builder.start()
    _held_by(builds, builder.pid)
    waiter = context.Process(target=_build, args=(builds, go, tmp_path / "b.json"))
    waiter.start()
    time.sleep(1.0)            # the waiter is blocked on the lock by now
    assert waiter.is_alive() and not (tmp_path / "b.json").exists()
    go.touch()
    for process in (builder, waiter):
        process.join(60)
        assert process.exitcode == 0
    assert json.loads((tmp_path / "a.json").read_text()) == {"log": [], "built": True}
    assert json.loads((tmp_path / "b.json").read_text()) == {"log": [], "built": False}


def test_another_commands_build_is_named_with_its_pid(tmp_path):
    builds, go = tmp_path / "builds", tmp_path / "go"
    other = subprocess.Popen([sys.executable, "-c", BUILD_SCRIPT, str(builds), KEY, str(go)])
    try:
        _held_by(builds, other.pid)
        lines: list[str] = []
        threading.Timer(0.5, go.touch).start()
        with build_entry(builds, KEY, log=lines.append, waiting=WHAT) as tmp:
            assert tmp is None          # the other command's build, once it finished
        assert lines == [f"waiting for another process (pid {other.pid}) building {WHAT} ..."]
    finally:
        go.touch()
        assert other.wait(60) == 0


def test_the_waiting_message_tells_a_sibling_from_another_command():
    assert command_pid() == holder_record()["pid"]      # pytest's process: a command
    assert waiting_message({"pid": 1, "command": command_pid()}, WHAT) is None
    assert waiting_message({"pid": 1, "command": 1}, WHAT) == \
        f"waiting for another process (pid 1) building {WHAT} ..."
    assert waiting_message(None, WHAT) == f"waiting for another process building {WHAT} ..."
