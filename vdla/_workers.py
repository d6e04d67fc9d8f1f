"""Worker processes that never outlive the process that started them and leave Ctrl-C to
it.

    context = worker_context()                          # forkserver on Linux, else spawn
    process = start_worker(context, serve, (conn,))     # a started daemon Process

Every pool of worker processes (`vdla.execute.LocalExecutor`: sweeps, parallel runs and
the tuner's `LocalRunner`) starts its workers with `start_worker`. Only the standard
library is imported here, so any layer may use it.

**How workers start** (`worker_context`). On Linux with ``forkserver``: multiprocessing
starts one server process (a fresh interpreter, once per process, on the first worker)
that imports the vdla modules this process has imported, and forks each worker from it.
A worker is therefore never a fork of the caller: a caller that has run a multi-threaded
CPU model (OpenMP's thread pool, the BLAS's) or holds locks in other threads would hand
its worker a copy of that state without the threads, and the worker would hang in its
first parallel region (plain ``fork`` did exactly that to the tuner after ``vdla run
--target cpu``: every measurement timed out). ``spawn`` avoids that too, but each worker
is then a new interpreter that imports numpy and vdla's compiler again. Measured on a
2-core AMD EPYC: the tuner's two measurement workers are ready in about 0.1 s from the
fork server against 2 to 2.7 s with ``spawn`` (0.05 s forked); the server's own start,
once per process, takes about 1 s. A sweep's evaluators spend their first seconds
building the evaluator and compiling the first point whatever the method: a sweep of 4
to 8 points with two jobs took 4 to 6 s with workers forked from the sweep and 4 to 6 s
from the fork server. Workers live for their pool's life, so a tuner's measurement never
pays a start; a worker replaced after a crash or a timeout does, and there the fork
server's fraction of a second matters. Elsewhere (macOS, Windows) ``spawn``. Everything
a worker is given is pickled (a top-level function, a ``functools.partial`` of one), and
a script that starts workers needs the ``if __name__ == "__main__":`` guard, as
multiprocessing requires for both.

Each worker:

* **dies with the process that started it** (its *owner*). An owner that is SIGKILLed (or
  crashes) runs no clean-up, so the worker must notice on its own, or it lives on,
  holding files such as a records database open.

  - A worker that is the owner's own child (``spawn``, ``fork``), on Linux: the kernel
    sends it SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``, set first thing
    in the worker), and the worker then checks that its parent is still the owner: had
    the owner died before the ``prctl``, no signal would ever come.
    ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the worker ends, not only
    the process: a pool therefore starts its workers from the thread that uses them
    (`LocalExecutor` does, on each ``map_unordered``), and expects idle workers to die if
    that thread ends; it replaces a worker that died while idle.
  - A worker of the fork server is the server's child, not the owner's, so the kernel's
    signal cannot name the owner. The owner holds one end of a pipe per worker for the
    worker's whole life (multiprocessing's ``parent_process().sentinel``); a daemon
    thread in the worker blocks on the other end and ends the worker the moment it
    reads end-of-file, which the kernel delivers when the owner dies, however it dies.
    The fork server itself exits once the owner and all its workers have: it is never
    left behind; at a normal exit the owner stops it, and the resource tracker it
    started, and reaps both before it ends (`_stop_fork_server`). (A worker stuck in C
    code that holds the GIL notices when that call returns; the measurements'
    simulators and compiled models release it.)
  - Elsewhere (macOS, the BSDs, Windows), with ``spawn``: a daemon thread in the worker
    watches the parent and ends the worker within `POLL_SECONDS` of the parent's death:
    on POSIX it polls ``os.getppid()`` (an orphan is re-parented, so the pid changes); on
    Windows, where the recorded parent pid never changes, it waits on the parent's
    process handle (``multiprocessing.parent_process().sentinel``).
* **ignores SIGINT.** A terminal sends Ctrl-C's SIGINT to its whole foreground process
  group, workers (and the fork server) included. The owner alone decides what an
  interrupt means (keep what finished, stop the workers, exit with status 130), so a
  worker neither dies with a traceback of its own nor races the owner. SIGINT stays
  blocked in the starting thread while the worker is created, and a blocked signal stays
  blocked across fork and exec: a new worker (and a fork server started meanwhile, which
  passes its mask on to each worker it forks) never has a moment with Python's default
  handler. An owner stops a busy worker with ``Process.kill``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
import sys
import threading
import time
import weakref
from typing import Callable, Sequence

__all__ = ["POLL_SECONDS", "die_with_parent", "start_worker", "worker_context"]

#: How often the portable fallback checks that the parent is alive (seconds).
POLL_SECONDS = 0.5
#: From <linux/prctl.h>.
_PR_SET_PDEATHSIG = 1
#: Exit status of a worker that found its parent gone.
_ORPHANED = 1
#: The start methods `start_worker` takes.
_METHODS = ("forkserver", "fork", "spawn")
#: Whether `worker_context` has named the fork server's preloaded modules yet.
_preload_named = False
#: The workers started here that may still run (`_stop_fork_server` ends them at exit).
_started: "weakref.WeakSet" = weakref.WeakSet()
#: Serialises `_ensure_fork_server`'s changes to the environment.
_server_lock = threading.Lock()
#: Seconds `_stop_fork_server` waits for each process it stops.
_EXIT_WAIT = 2.0


def worker_context(preload: Sequence[str] = ()):
    """The multiprocessing context a pool starts its workers with: ``forkserver`` on
    Linux, ``spawn`` elsewhere (see the module docstring for why).

    preload : modules the fork server imports before it forks any worker (the module of
        the pool's worker function), besides the caller's script and every module of
        this package imported in this process by then: the server is started once per
        process, by the first pool, and each worker it forks starts with what it
        imported, as a forked worker did. Only the first call's count; a module that
        fails to import there is imported by each worker that needs it instead.
    """
    global _preload_named
    if not sys.platform.startswith("linux"):
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    if not _preload_named:
        atexit.register(_stop_fork_server)
        package = __name__.partition(".")[0]
        # In the order this process imported them (a package before its modules).
        ours = [name for name in list(sys.modules)
                if name == package or name.startswith(package + ".")]
        # "__main__" is multiprocessing's own default: the caller's script, which each
        # worker would otherwise import itself.
        context.set_forkserver_preload(list(dict.fromkeys(["__main__", *ours, *preload])))
        _preload_named = True
    return context


def start_worker(context, target: Callable, args: tuple = (), *, name: str | None = None):
    """Start ``target(*args)`` in a daemon process that dies with this one and ignores
    SIGINT (see the module docstring); returns the started process.

    context : a multiprocessing context (`worker_context`'s, or start method ``fork``)
    target : the worker's function; unless forked it must be importable by name
    args : its arguments (picklable unless forked)
    name : the process's name (multiprocessing's default when None)
    """
    method = context.get_start_method()
    if method not in _METHODS:
        raise ValueError(f"worker start method must be one of {', '.join(_METHODS)}, "
                         f"not {method!r}")
    if method == "forkserver":
        _ensure_fork_server()
    process = context.Process(target=_bootstrap,
                              args=(os.getpid(), method == "forkserver", target,
                                    tuple(args)),
                              name=name, daemon=True)
    with _sigint_blocked():
        process.start()
    _started.add(process)
    return process


def _ensure_fork_server() -> None:
    """Start multiprocessing's fork server, if it is not running, on this process's
    ``sys.path``. multiprocessing starts it as ``python -c``, which puts the current
    folder first on its path, and Python 3.11's server ignores the path it is sent: in a
    clone of the repository with a non-editable install, its preloading imported the
    clone's ``vdla/`` folder (a package without the subpackages pyproject maps from other
    folders), and every worker forked from it inherited that half package (``No module
    named 'vdla.compiler'``). ``PYTHONSAFEPATH`` keeps the current folder off its path,
    and ``PYTHONPATH`` gives it this process's (a ``''`` entry, the current folder, made
    absolute), the path each worker is given anyway. The variables are set in
    ``os.environ`` only while the server starts (the server inherits the environment),
    under the lock that serialises starting workers."""
    saved = {name: os.environ.get(name) for name in ("PYTHONSAFEPATH", "PYTHONPATH")}
    path = [entry or os.getcwd() for entry in sys.path if isinstance(entry, str)]
    with _server_lock:
        os.environ["PYTHONSAFEPATH"] = "1"
        os.environ["PYTHONPATH"] = os.pathsep.join(path)
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _stop_fork_server():
    """At exit, stop the fork server and the resource tracker it started, and reap both,
    so that this process ends last: they would end on their own a moment later (at
    end-of-file on the pipes it holds), but a caller that looks for this process's
    children right after it ended would still find them. The workers still running (a
    pool left open) are killed first: each holds the server's pipe open. Each wait is
    bounded: another user's forkserver processes may hold those pipes too. The server's
    and the tracker's pipes and pids are private to multiprocessing; where a Python
    keeps them elsewhere, nothing is done here."""
    for process in list(_started):
        if process.is_alive():
            process.kill()
            process.join(_EXIT_WAIT)
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    tracker = getattr(multiprocessing.resource_tracker, "_resource_tracker", None)
    for owner, fd_name, pid_name in ((server, "_forkserver_alive_fd", "_forkserver_pid"),
                                     (tracker, "_fd", "_pid")):
        fd, pid = getattr(owner, fd_name, None), getattr(owner, pid_name, None)
        if not isinstance(fd, int) or not isinstance(pid, int):
            continue
        setattr(owner, fd_name, None)
        setattr(owner, pid_name, None)
        os.close(fd)                  # its end-of-file asks the process to exit
        deadline = time.monotonic() + _EXIT_WAIT
        try:
            while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
                time.sleep(0.01)
        except ChildProcessError:     # reaped already
            pass


def _bootstrap(owner_pid: int, served: bool, target: Callable, args: tuple):
    """A worker's first steps, then its function (`served`: forked by the fork server)."""
    if served:
        _watch_owner()
    else:
        die_with_parent(owner_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        # Blocked by the owner across the fork and exec (spawn; the fork server, which
        # passes its mask on); a SIGINT that arrived meanwhile is pending and is now
        # discarded, since it is ignored.
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


def _watch_owner() -> None:
    """In a worker forked by multiprocessing's fork server: end this process the moment
    the process that asked for it (its owner) dies, or at once if it already has. The
    owner holds the write end of a pipe to this worker for the worker's life; a daemon
    thread waits for end-of-file on the read end (``parent_process().sentinel``)."""
    owner = multiprocessing.parent_process()
    if owner is None or owner.sentinel is None:
        raise RuntimeError("_watch_owner must run in a worker process that "
                           "multiprocessing started")
    sentinel = owner.sentinel
    if multiprocessing.connection.wait([sentinel], timeout=0):
        os._exit(_ORPHANED)
    threading.Thread(target=_wait_and_exit, args=(sentinel,), name="vdla-owner-watcher",
                     daemon=True).start()


def _wait_and_exit(sentinel):
    multiprocessing.connection.wait([sentinel])
    os._exit(_ORPHANED)


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
