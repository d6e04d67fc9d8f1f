"""Processes for the tests of killed and interrupted commands (Linux: /proc and a pty).

`children`, `descendants`, `alive` and `wait_for` look processes up in /proc (psutil is
not a dependency). `Command` runs ``python -m vdla ...`` as a user at a terminal does:
stderr on a pseudo-terminal (so progress lines update in place) and its own process
group, which `Command.signal_group` signals as a whole, as a terminal's Ctrl-C does."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

LINUX = sys.platform.startswith("linux")
_ESCAPE = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of process `pid`, or None if there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()    # the name, in parentheses, may hold spaces
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    """Process `pid` exists and has not exited (a zombie has: it waits to be reaped)."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def children(pid: int) -> set[int]:
    """The live child processes of `pid`."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[1] == pid and stat[0] != "Z":
                found.add(int(entry))
    return found


def descendants(pid: int) -> set[int]:
    """The live processes below `pid`, at any depth (a pool's fork server and the
    workers it forked, which are the server's children, not the pool's)."""
    found, todo = set(), [pid]
    while todo:
        below = children(todo.pop())
        found |= below
        todo.extend(below)
    return found


def wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    """Poll `condition` until it holds (True) or `seconds` pass (False)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def interruptible() -> None:
    """A `preexec_fn` that gives the child the default SIGINT disposition. A shell without
    job control starts background commands with SIGINT ignored (POSIX), and an ignored
    signal stays ignored across exec, so a test suite run as ``pytest ... &`` would
    otherwise start children that Python never gives a KeyboardInterrupt: the Ctrl-C
    tests would then measure the harness, not vdla."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def visible_lines(raw: bytes) -> list[str]:
    """The non-empty lines a terminal shows for `raw`: of each line, the text after its
    last carriage return, without escape sequences."""
    lines = []
    for line in raw.split(b"\n"):
        text = _ESCAPE.sub(b"", line.rstrip(b"\r").split(b"\r")[-1]).decode().strip()
        if text:
            lines.append(text)
    return lines


class Command:
    """``python -m vdla ARGS`` in `cwd`, stderr on a pseudo-terminal, stdout to a file,
    in a process group of its own. Use as a context manager: on exit, whatever is left of
    the group is killed."""

    def __init__(self, args: list[str], cwd: Path):
        self.master, slave = pty.openpty()
        self._stdout = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, "-m", "vdla", *args], cwd=cwd,
                                        stdin=subprocess.DEVNULL, stdout=self._stdout,
                                        stderr=slave, start_new_session=True,
                                        preexec_fn=interruptible)
        os.close(slave)
        self.stderr = b""        # all read so far
        self._eof = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self, timeout: float) -> bytes | None:
        """What stderr has within `timeout` seconds (b"": nothing yet); None at its end."""
        if self._eof:
            return None
        ready, _, _ = select.select([self.master], [], [], max(timeout, 0.0))
        if not ready:
            return b""
        try:
            chunk = os.read(self.master, 65536)
        except OSError:        # EIO: every writer has closed it (Linux)
            chunk = b""
        self._eof = not chunk
        self.stderr += chunk
        return None if self._eof else chunk

    def read_until(self, pattern: bytes, seconds: float) -> bool:
        """Read stderr until regular expression `pattern` matches it (True), it ends or
        `seconds` pass (False)."""
        deadline = time.monotonic() + seconds
        while not re.search(pattern, self.stderr):
            if time.monotonic() > deadline or self._read(deadline - time.monotonic()) is None:
                return bool(re.search(pattern, self.stderr))
        return True

    def signal_group(self, signum: int):
        """Send `signum` to the whole process group, as a terminal sends Ctrl-C's SIGINT."""
        os.killpg(self.pid, signum)

    def wait(self, seconds: float) -> int:
        """The exit status, once the process has exited (within `seconds`) and the rest of
        its stderr has been read."""
        code = self.process.wait(seconds)
        while self._read(0.5):     # until it ends, or is quiet (a worker may hold it)
            pass
        return code

    def stdout(self) -> str:
        self._stdout.seek(0)
        return self._stdout.read().decode()

    def __enter__(self) -> "Command":
        return self

    def __exit__(self, *exc):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        os.close(self.master)
        self._stdout.close()
