"""Worker processes that never outlive their parent and leave Ctrl-C to it.

    context = multiprocessing.get_context("fork")
    process = start_worker(context, serve, (conn,))     # a started daemon Process

Any pool of worker processes (the tuner's `LocalRunner`; design-space sweeps and CPU
measurements later) starts its workers with `start_worker`. Only the standard library is
imported here, so any layer may use it. Each worker:

* **dies with its parent.** A parent that is SIGKILLed (or crashes) runs no clean-up, so
  the worker must notice on its own, or it lives on, holding files such as a records
  database open. On Linux the kernel sends the worker SIGKILL when its parent dies
  (``prctl(PR_SET_PDEATHSIG)``, set first thing in the worker), and the worker then
  checks that its parent is still the process that started it: had the parent died
  before the ``prctl``, no signal would ever come. Elsewhere (macOS, the BSDs, Windows) a
  daemon thread in the worker watches the parent and ends the worker within
  `POLL_SECONDS` of the parent's death: on POSIX it polls ``os.getppid()`` (an orphan is
  re-parented, so the pid changes); on Windows, where the recorded parent pid never
  changes, it waits on the parent's process handle
  (``multiprocessing.parent_process().sentinel``).

  ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the worker ends, not only the
  process. A pool must therefore start its workers from the thread that uses them, and
  expect idle workers to die if that thread ends: `LocalRunner` starts them from the
  thread that calls ``measure`` (the main thread in ``vdla tune``), which waits for them
  there, and it replaces a worker that died while idle.
* **ignores SIGINT.** A terminal sends Ctrl-C's SIGINT to its whole foreground process
  group, workers included. The parent alone decides what an interrupt means (keep what
  finished, stop the workers, exit with status 130), so a worker neither dies with a
  traceback of its own nor races the parent. SIGINT stays blocked in the starting thread
  while the worker is created, so there is no moment when a new worker still has Python's
  default handler. A parent stops a busy worker with ``Process.kill``.

Start methods ``fork`` and ``spawn`` are supported. ``forkserver`` is refused: its
workers are the fork server's children, not the pool's, so neither check could work.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from typing import Callable

__all__ = ["POLL_SECONDS", "die_with_parent", "start_worker"]

#: How often the portable fallback checks that the parent is alive (seconds).
POLL_SECONDS = 0.5
#: From <linux/prctl.h>.
_PR_SET_PDEATHSIG = 1
#: Exit status of a worker that found its parent gone.
_ORPHANED = 1


def start_worker(context, target: Callable, args: tuple = (), *, name: str | None = None):
    """Start ``target(*args)`` in a daemon process that dies with this one and ignores
    SIGINT (see the module docstring); returns the started process.

    context : a multiprocessing context with start method ``fork`` or ``spawn``
    target : the worker's function; with ``spawn`` it must be importable by name
    args : its arguments (picklable with ``spawn``)
    name : the process's name (multiprocessing's default when None)
    """
    method = context.get_start_method()
    if method not in ("fork", "spawn"):
        raise ValueError(f"worker start method must be 'fork' or 'spawn', not {method!r}: a "
                         "worker must be this process's own child to die with it")
    process = context.Process(target=_bootstrap, args=(os.getpid(), target, tuple(args)),
                              name=name, daemon=True)
    with _sigint_blocked():
        process.start()
    return process


def _bootstrap(parent_pid: int, target: Callable, args: tuple):
    """A worker's first steps, then its function."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        # Blocked by the parent across the fork (and, with spawn, across exec); a SIGINT
        # that arrived meanwhile is pending and is now discarded, since it is ignored.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    target(*args)


@contextlib.contextmanager
def _sigint_blocked():
    """Block SIGINT in this thread (its signal mask is what a forked child inherits)."""
    if not hasattr(signal, "pthread_sigmask"):   # Windows: no signal masks, no fork
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        # A SIGINT that came meanwhile is delivered here, as KeyboardInterrupt.
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def die_with_parent(parent_pid: int, *, pdeathsig: bool = True) -> str:
    """Make this process end when its parent, process `parent_pid`, does (see the module
    docstring); it ends at once if the parent is already gone. Call it first thing in a
    child. Returns the mechanism used: ``"pdeathsig"`` or ``"watcher"``.

    parent_pid : the pid of the process that started this one (``os.getpid()`` there)
    pdeathsig : use the Linux parent-death signal where available (False: always the
        portable watcher thread; for tests)
    """
    if pdeathsig and sys.platform.startswith("linux") and _set_parent_death_signal():
        if os.getppid() != parent_pid:    # the parent died before prctl: no signal comes
            os._exit(_ORPHANED)
        return "pdeathsig"
    gone = _parent_gone_check(parent_pid)
    if gone():
        os._exit(_ORPHANED)
    threading.Thread(target=_watch, args=(gone,), name="vdla-parent-watcher",
                     daemon=True).start()
    return "watcher"


def _set_parent_death_signal() -> bool:
    """prctl(PR_SET_PDEATHSIG, SIGKILL) through the C library already loaded; False if
    that fails (then the watcher thread is used)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        # prctl is variadic: pass the unsigned longs the kernel reads, not C ints.
        return libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL),
                          ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0
    except (OSError, AttributeError):
        return False


def _parent_gone_check(parent_pid: int) -> Callable[[], bool]:
    """A function that says, without blocking, whether the parent has died."""
    parent = multiprocessing.parent_process()
    if os.name == "nt" and parent is not None:
        # Windows keeps the recorded parent pid after the parent dies; its process
        # handle is signalled instead.
        return lambda: bool(multiprocessing.connection.wait([parent.sentinel], timeout=0))
    return lambda: os.getppid() != parent_pid


def _watch(gone: Callable[[], bool]):
    while not gone():
        time.sleep(POLL_SECONDS)
    os._exit(_ORPHANED)
