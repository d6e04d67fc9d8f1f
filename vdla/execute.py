"""Running independent evaluations in parallel: local worker processes, or a Ray cluster.

A design-space sweep's evaluations, a model's ops simulated one per worker (`vdla
run --jobs`, `vdla.compiler.targets.op_parallel`) and a tuner's measurements on Ray
(`vdla tune --ray`, `ExecutorRunner`) all run here, so what works on one machine works
on a cluster.

    with make_executor(factory, jobs=2) as executor:         # or ray="auto"
        for index, record in executor.map_unordered(tasks):
            ...

`factory` is a picklable callable (a top-level function, or a ``functools.partial`` of
one) that each worker calls once to build its evaluator (a sweep's loads and quantizes
its models, a parallel run's opens its device session, a tuner's opens its measurement
contexts); the evaluator is then called with each task. Both executors run this same
code in their workers (`_Worker`), so the work is the same on one machine and on a
cluster:

* `LocalExecutor` (the default, no set-up): with one job the evaluator runs in this
  process; with more, in worker processes started by `vdla._workers.start_worker` (they
  die with this process and leave Ctrl-C to it) that talk over pipes. A worker that dies
  mid-task is an `EvaluationError` naming the task, not a hang; an exception in an
  evaluation comes back with the worker's traceback.
* `RayExecutor` (``--ray auto|local|ADDRESS``): one Ray actor per CPU of the cluster
  (or `jobs`), each building its evaluator once; tasks go to idle actors and results are
  yielded as they finish. An actor whose process dies is an `EvaluationError` naming
  the task, and a new actor takes its place for the tasks after. Ray is an optional
  extra: ``pip install 'vdla[ray]'``. Ray puts the driver's current folder first on
  every worker's ``sys.path`` and starts a local instance's workers in it; the driver
  stands in a folder of vdla's cache while it connects (`_outside_source_trees`), so a
  user in a clone of the repository does not have its half of the package shadow the
  installed one in the workers.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import traceback
from typing import Any, Callable, Iterator, Protocol, Sequence

from vdla._buildcache import cache_root
from vdla._workers import start_worker

__all__ = ["EvaluationError", "Executor", "LocalExecutor", "RayExecutor", "make_executor"]


class EvaluationError(RuntimeError):
    """An evaluation raised, or its worker died; the message names the task, and
    ``index`` is its index in the tasks mapped (None where unknown)."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


class Executor(Protocol):
    """What a sweep or a parallel run needs of an executor (`LocalExecutor`,
    `RayExecutor`)."""

    #: evaluations that run at once
    workers: int

    def map_unordered(self, tasks: Sequence) -> Iterator[tuple[int, dict]]:
        """(index in `tasks`, record) as each evaluation finishes; an evaluation that
        raises, or whose worker dies, raises `EvaluationError`."""

    def describe(self) -> str:
        """Where evaluations run, for the log (``2 local processes``)."""

    def close(self) -> None:
        """Stop the workers (those still busy are killed)."""

    def __enter__(self) -> "Executor": ...

    def __exit__(self, *exc) -> None: ...


class _Worker:
    """What runs in a worker: the evaluator, built on the first task."""

    def __init__(self, factory: Callable[[], Callable[[Any], dict]]):
        self.factory, self.evaluate = factory, None

    def __call__(self, task):
        if self.evaluate is None:
            self.evaluate = self.factory()
        return self.evaluate(task)


def _serve(conn, factory):
    worker = _Worker(factory)
    try:
        while True:
            message = conn.recv()
            if message is None:
                return
            index, task = message
            try:
                conn.send((index, True, worker(task)))
            except Exception:  # noqa: BLE001 - the parent raises it, with this traceback
                conn.send((index, False, traceback.format_exc()))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return


class LocalExecutor:
    """Evaluations in this process (`jobs` 1) or in `jobs` worker processes."""

    def __init__(self, factory: Callable, jobs: int = 1):
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise ValueError(f"jobs must be a positive integer, not {jobs!r}")
        self.factory, self.workers = factory, jobs
        self._local = _Worker(factory) if jobs == 1 else None
        self._procs: list[tuple[Any, Any]] = []   # (process, connection)
        self._busy: dict[Any, tuple[Any, int]] = {}  # connection -> (process, task index)

    def describe(self) -> str:
        return "this process" if self.workers == 1 else f"{self.workers} local processes"

    def _start(self):
        # Started from the thread that uses them (see vdla._workers on PR_SET_PDEATHSIG).
        context = multiprocessing.get_context("fork")
        alive = []
        for process, conn in self._procs:
            if process.is_alive():
                alive.append((process, conn))
            else:                           # killed or died: replaced below
                process.join()
                conn.close()
        while len(alive) < self.workers:
            parent, child = context.Pipe()
            process = start_worker(context, _serve, (child, self.factory),
                                   name="vdla-worker")
            child.close()
            alive.append((process, parent))
        self._procs = alive

    def map_unordered(self, tasks: Sequence) -> Iterator[tuple[int, dict]]:
        """(index in `tasks`, record) as each evaluation finishes."""
        tasks = list(tasks)
        if self._local is not None:
            for index, task in enumerate(tasks):
                try:
                    yield index, self._local(task)
                except Exception as exc:
                    raise EvaluationError(f"evaluating task {index} ({task!r}) failed: "
                                          f"{exc}", index) from exc
            return
        if not tasks:
            return
        self._start()
        todo = list(enumerate(tasks))[::-1]
        busy = self._busy = {}

        def send(process, conn):
            index, task = todo.pop()
            busy[conn] = (process, index)
            try:
                conn.send((index, task))
            except (BrokenPipeError, ConnectionResetError):   # it died while idle
                process.join(1)
                raise EvaluationError(f"the worker for task {index} ({task!r}) died "
                                      f"(exit code {process.exitcode})", index) from None

        try:
            for process, conn in self._procs:
                if todo:
                    send(process, conn)
            while busy:
                sentinels = {p.sentinel: c for c, (p, _) in busy.items()}
                ready = multiprocessing.connection.wait(list(busy) + list(sentinels))
                for item in ready:
                    conn = item if item in busy else sentinels.get(item)
                    if conn not in busy:
                        continue
                    process, index = busy[conn]
                    try:
                        got, ok, value = conn.recv()
                    except (EOFError, OSError):
                        process.join(1)
                        raise EvaluationError(
                            f"the worker evaluating task {index} ({tasks[index]!r}) died "
                            f"(exit code {process.exitcode})", index) from None
                    del busy[conn]
                    if not ok:
                        raise EvaluationError(f"evaluating task {got} ({tasks[got]!r}) "
                                              f"failed in a worker:\n{value}", got)
                    if todo:
                        send(process, conn)
                    yield got, value
        except BaseException:
            # Interrupted, failed or abandoned: busy workers are killed, not waited for.
            self._kill_busy()
            raise

    def _kill_busy(self):
        busy, self._busy = self._busy, {}
        for process, _ in busy.values():
            process.kill()
            process.join()

    def close(self):
        """Stop the workers: idle ones exit, busy ones (an iteration left unfinished)
        are killed."""
        self._kill_busy()
        procs, self._procs = self._procs, []
        for process, conn in procs:
            try:
                conn.send(None)
            except OSError:
                pass
        for process, conn in procs:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()
            conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@contextlib.contextmanager
def _outside_source_trees():
    """Stand in an empty folder of vdla's cache (``ray/``) for the block, then go back.

    `ray.init` adds the driver's current folder to its workers' ``sys.path``, ahead of
    site-packages, and a local instance's workers start in it. In a clone of this
    repository that folder holds a ``vdla/`` without the subpackages pyproject maps from
    other folders, so the workers of a non-editable install would fail to import
    ``vdla.dse`` or ``vdla.sim``. The folder is kept (a local instance's workers keep it
    as their working folder)."""
    folder = cache_root() / "ray"
    folder.mkdir(parents=True, exist_ok=True)
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


class RayExecutor:
    """Evaluations on Ray actors.

    address : ``auto`` (a running cluster), ``local`` (start an instance on this machine
        with its CPUs) or a cluster address (``host:port``, ``ray://host:port``)
    jobs : actors to start (default: the cluster's CPUs)
    """

    def __init__(self, factory: Callable, address: str, *, jobs: int | None = None):
        try:
            import ray  # heavy (and optional): only --ray needs it
        except ImportError:
            raise ValueError("--ray needs Ray: pip install 'vdla[ray]'") from None
        self._ray, self.address = ray, address
        with _outside_source_trees():
            if address == "local":
                ray.init(num_cpus=jobs or os.cpu_count(), include_dashboard=False,
                         log_to_driver=False)
            else:
                try:
                    ray.init(address=address, log_to_driver=False)
                except ConnectionError as exc:   # Ray's words name its CLI's --address
                    raise ValueError(f"--ray {address}: no Ray cluster found ({exc}); "
                                     "start one with 'ray start --head', or use --ray "
                                     "local") from None
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = jobs or cpus
        self._actor_class, self._factory = ray.remote(num_cpus=1)(_Worker), factory
        self._actors = [self._actor_class.remote(factory) for _ in range(self.workers)]
        self._cpus = cpus

    def describe(self) -> str:
        where = "a local Ray instance" if self.address == "local" else \
            f"the Ray cluster at {self.address}"
        return f"{self.workers} Ray actors on {where} ({self._cpus} CPUs)"

    def map_unordered(self, tasks: Sequence) -> Iterator[tuple[int, dict]]:
        ray, tasks = self._ray, list(tasks)
        todo = list(enumerate(tasks))[::-1]
        pending = {}                                  # object ref -> (actor, index)
        idle = list(self._actors)
        try:
            while todo or pending:
                while todo and idle:
                    actor = idle.pop()
                    index, task = todo.pop()
                    pending[actor.__call__.remote(task)] = (actor, index)
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    actor, index = pending.pop(ref)
                    try:
                        record = ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - Ray wraps the worker's error
                        if isinstance(exc, ray.exceptions.RayActorError):
                            self._replace(actor)     # its process died: a new actor
                        raise EvaluationError(f"evaluating task {index} ({tasks[index]!r}) "
                                              f"failed on Ray:\n{exc}", index) from None
                    idle.append(actor)
                    yield index, record
        except BaseException:
            # Actor tasks cannot be force-cancelled; ray.shutdown in `close` ends them.
            for ref in pending:
                try:
                    ray.cancel(ref)
                except Exception:  # noqa: BLE001 - already finished or gone
                    pass
            raise

    def _replace(self, actor):
        """A new actor in place of `actor`, whose process died (a crashing evaluation):
        later tasks must not go to it. (Ray's own restart would answer them with "the
        actor is restarting" for a while.)"""
        try:
            self._ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - gone already
            pass
        self._actors[self._actors.index(actor)] = self._actor_class.remote(self._factory)

    def close(self):
        if self._ray.is_initialized():
            self._ray.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def make_executor(factory: Callable, *, jobs: int = 1, ray: str | None = None) -> Executor:
    """`RayExecutor` when `ray` names a cluster, else `LocalExecutor` with `jobs`."""
    if ray:
        # A local instance gets `jobs` CPUs; a cluster's actors are one per its CPUs.
        return RayExecutor(factory, ray, jobs=jobs if ray == "local" else None)
    return LocalExecutor(factory, jobs)
