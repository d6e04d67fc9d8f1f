"""Running independent evaluations in parallel: local worker processes, or a Ray cluster.

A design-space sweep's evaluations, a model's ops simulated one per worker (`vdla
run --jobs`, `vdla.compiler.targets.op_parallel`) and a tuner's measurements (`vdla
tune`: `LocalRunner` on local processes; with ``--ray``, `ExecutorRunner`) all run here,
so what works on one machine works on a cluster.

    with make_executor(factory, jobs=2) as executor:         # or ray="auto"
        for index, record in executor.map_unordered(tasks):
            ...

`factory` is a picklable callable (a top-level function, or a ``functools.partial`` of
one) that each worker calls once to build its evaluator (a sweep's loads and quantizes
its models, a parallel run's opens its device session, a tuner's opens its measurement
contexts); the evaluator is then called with each task. Both executors run this same
code in their workers (`_Worker`), so the work is the same on one machine and on a
cluster:

* `LocalExecutor` (the default, no set-up), the one pool of local worker processes:
  with one job the evaluator runs in this process; with more (or ``processes=True``),
  in worker processes that talk over pipes, started by `vdla._workers.start_worker` from
  a fork server (`vdla._workers.worker_context`: never forked from this process, which
  may have run a multi-threaded model; they die with this process, fork server
  included, and leave Ctrl-C to it). Workers live until `close`, so a task pays no
  start. A worker that dies mid-task is an `EvaluationError` naming the task, not a
  hang; an exception in an evaluation comes back with the worker's traceback; with a
  ``timeout``, a task that runs past it has its worker killed. `LocalExecutor.outcomes`
  reports each of these as the task's `Outcome` and goes on with a new worker (the
  tuner's `LocalRunner` measures through it: a crash or a hang is a result there).
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

import collections
import contextlib
import multiprocessing.connection
import os
import time
import traceback
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Iterator, NamedTuple, Protocol, Sequence

from vdla._buildcache import cache_root
from vdla._workers import start_worker, worker_context

__all__ = ["EvaluationError", "Executor", "LocalExecutor", "Outcome", "RayExecutor",
           "make_executor"]

#: Seconds idle workers get to close their evaluators and exit before they are killed.
STOP_WAIT = 5.0


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

    def close(self):
        """Let the evaluator close what it holds open (a tuner's measurement contexts),
        if it has a ``close``."""
        evaluate, self.evaluate = self.evaluate, None
        if hasattr(evaluate, "close"):
            evaluate.close()


def _serve(conn, factory):
    """A worker process's loop: receive (index, task), send (index, True, value) or
    (None, False, the traceback: the owner knows which task it handed over); None, or
    the owner's end closing, ends it."""
    worker = _Worker(factory)
    try:
        while True:
            message = conn.recv_bytes()
            try:
                # Unpickled here, not by `recv`: a task that cannot be (its class's module
                # fails to import in a worker) is that task's error, not a dead worker.
                message = ForkingPickler.loads(message)
                if message is None:
                    return
                index, task = message
                conn.send((index, True, worker(task)))
            except Exception:  # noqa: BLE001 - the parent raises it, with this traceback
                conn.send((None, False, traceback.format_exc()))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return
    finally:
        worker.close()


class Outcome(NamedTuple):
    """How one task of `LocalExecutor.outcomes` ended.

    index : the task's index in the tasks mapped
    status : ``ok`` (value: the evaluation's result), ``error`` (it raised; value: the
        worker's traceback), ``died`` (its worker died; value: what is known, the exit
        code) or ``timeout`` (it ran past the executor's timeout and its worker was
        killed; value: a sentence saying so)
    value : as `status` says
    seconds : wall-clock seconds from the task's hand-over to its end
    """

    index: int
    status: str
    value: Any
    seconds: float


class _Proc:
    """A worker process, the owner's end of its pipe, and its task: (index, start time)."""

    def __init__(self, context, factory):
        self.conn, child = context.Pipe()
        self.process = start_worker(context, _serve, (child, factory), name="vdla-worker")
        child.close()
        self.job: tuple[int, float] | None = None

    def kill(self):
        self.process.kill()
        self.finish(time.monotonic() + STOP_WAIT)

    def finish(self, deadline: float):
        """Wait until `deadline` (`time.monotonic`) for the process to exit, kill it if it
        has not, and close the pipe."""
        self.process.join(max(0.0, deadline - time.monotonic()))
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class LocalExecutor:
    """Evaluations in this process (`jobs` 1) or in `jobs` worker processes: the one pool
    of local worker processes (sweeps, parallel runs, and the tuner's `LocalRunner`).

    factory : builds a worker's evaluator (see the module docstring)
    jobs : evaluations at once
    timeout : wall-clock seconds one task may run in a worker before the worker is
        killed (a ``timeout`` outcome); None: no limit
    processes : evaluate in worker processes even with one job (a timeout, or a crash
        that must not take this process down, needs one); default: only with more jobs
    Workers start on the first `map_unordered` or `outcomes`, from the thread that
    iterates (see `vdla._workers` on why), and live until `close`: a task never pays a
    worker's start, except after a worker died or was killed, which is replaced.
    """

    def __init__(self, factory: Callable, jobs: int = 1, *, timeout: float | None = None,
                 processes: bool | None = None):
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise ValueError(f"jobs must be a positive integer, not {jobs!r}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        processes = jobs > 1 if processes is None else processes
        if timeout is not None and not processes:
            raise ValueError("a timeout needs worker processes (processes=True): an "
                             "evaluation in this process cannot be stopped")
        self.factory, self.workers, self.timeout = factory, jobs, timeout
        self._local = None if processes else _Worker(factory)
        self._procs: list[_Proc] = []

    def describe(self) -> str:
        if self._local is not None:
            return "this process"
        return f"{self.workers} local process{'es' * (self.workers > 1)}"

    def _new_proc(self) -> _Proc:
        # The fork server imports the factory's module once for every worker it forks.
        func = getattr(self.factory, "func", self.factory)
        return _Proc(worker_context((__name__, getattr(func, "__module__", None) or
                                     __name__)), self.factory)

    def _start(self):
        """Fill the pool up to `workers`, replacing any that died while idle."""
        alive = []
        for proc in self._procs:
            if proc.process.is_alive():
                alive.append(proc)
            else:
                proc.finish(0)
        while len(alive) < self.workers:
            alive.append(self._new_proc())
        self._procs = alive

    def map_unordered(self, tasks: Sequence) -> Iterator[tuple[int, dict]]:
        """(index in `tasks`, record) as each evaluation finishes; the first that raises,
        dies or times out raises `EvaluationError` naming its task (the busy workers are
        killed, and the executor stays usable)."""
        tasks = list(tasks)
        if self._local is not None:
            for index, task in enumerate(tasks):
                try:
                    yield index, self._local(task)
                except Exception as exc:
                    raise EvaluationError(f"evaluating task {index} ({task!r}) failed: "
                                          f"{exc}", index) from exc
            return
        outcomes = self.outcomes(tasks)
        try:
            for outcome in outcomes:
                index = outcome.index
                if outcome.status == "ok":
                    yield index, outcome.value
                    continue
                what = f"task {index} ({tasks[index]!r})"
                message = {"error": f"evaluating {what} failed in a worker:\n{outcome.value}",
                           "died": f"the worker evaluating {what} died ({outcome.value})",
                           "timeout": f"evaluating {what}: {outcome.value}"}[outcome.status]
                raise EvaluationError(message, index)
        finally:
            outcomes.close()    # busy workers are killed, not waited for

    def outcomes(self, tasks: Sequence) -> Iterator[Outcome]:
        """An `Outcome` for every task, as each finishes, in worker processes: a task
        that raises, kills its worker or runs past `timeout` is an outcome too, its
        worker is replaced, and the others go on. If the iteration is left unfinished
        (an exception in the caller, Ctrl-C, ``close``), the workers still busy are
        killed: none may answer a later task with an earlier one's result."""
        if self._local is not None:
            raise ValueError("outcomes needs worker processes: this executor evaluates in "
                             "this process (jobs=1 without processes=True)")
        tasks = list(tasks)
        if not tasks:
            return
        self._start()
        todo = collections.deque(enumerate(tasks))
        try:
            while todo or any(p.job for p in self._procs):
                for i, proc in enumerate(self._procs):
                    if proc.job is None and todo:
                        self._procs[i] = self._send(proc, *todo.popleft())
                yield from self._collect(self._wait())
        except BaseException:
            self._kill_busy()
            raise

    def _send(self, proc: _Proc, index: int, task) -> _Proc:
        """Hand `task` to `proc`, or to a new worker in its place if it died while idle
        (no task was lost with it); returns the worker that has it."""
        for _ in range(2):
            if proc.process.is_alive():
                try:
                    proc.conn.send((index, task))
                    proc.job = (index, time.monotonic())
                    return proc
                except (BrokenPipeError, ConnectionResetError):
                    pass
            proc.kill()
            proc = self._new_proc()
        raise EvaluationError(f"no worker could be started for task {index} ({task!r}): "
                              "each died before taking it", index)

    def _wait(self) -> list[_Proc]:
        """Block until a busy worker has a result or died, or the nearest timeout;
        returns the busy workers."""
        busy = [p for p in self._procs if p.job]
        wait = None
        if self.timeout is not None:
            now = time.monotonic()
            wait = min(max(0.0, p.job[1] + self.timeout - now) for p in busy) + 0.01
        multiprocessing.connection.wait([p.conn for p in busy] +
                                        [p.process.sentinel for p in busy], timeout=wait)
        return busy

    def _collect(self, busy: list[_Proc]) -> Iterator[Outcome]:
        """The outcomes of the busy workers that have one; a worker that died or timed
        out is replaced."""
        for proc in busy:
            index, started = proc.job
            outcome, closed = None, False
            try:
                if proc.conn.poll():
                    got, ok, value = proc.conn.recv()
                    outcome = Outcome(index if got is None else got, "ok" if ok else "error",
                                      value, time.monotonic() - started)
            except (EOFError, OSError):
                closed = True      # it is exiting: its exit code follows
            if outcome is None and closed:
                proc.process.join(STOP_WAIT)
            if outcome is None and (closed or not proc.process.is_alive()):
                outcome = Outcome(index, "died", f"exit code {proc.process.exitcode}",
                                  time.monotonic() - started)
            elif outcome is None and self.timeout is not None and \
                    time.monotonic() - started > self.timeout:
                outcome = Outcome(index, "timeout", f"no result after {self.timeout:g} s "
                                  "of wall time; the worker was killed",
                                  time.monotonic() - started)
            if outcome is None:
                continue
            proc.job = None
            if outcome.status in ("died", "timeout"):
                proc.kill()
                self._procs[self._procs.index(proc)] = self._new_proc()
            yield outcome

    def _kill_busy(self):
        """Kill the workers with a task (each would answer the next task with its
        result) and drop them: `_start` refills the pool on the next iteration."""
        busy = [p for p in self._procs if p.job is not None]
        self._procs = [p for p in self._procs if p.job is None]
        for proc in busy:
            proc.process.kill()
        deadline = time.monotonic() + STOP_WAIT
        for proc in busy:
            proc.finish(deadline)

    def close(self):
        """Stop the workers: idle ones are asked to exit, all at once (each closes its
        evaluator), and killed if they have not after `STOP_WAIT` seconds; busy ones (an
        iteration left unfinished) are killed."""
        procs, self._procs = self._procs, []
        try:
            for proc in procs:
                if proc.job is not None:
                    proc.process.kill()
                    continue
                try:
                    proc.conn.send(None)
                except OSError:      # it is gone already
                    pass
        finally:
            deadline = time.monotonic() + STOP_WAIT
            for proc in procs:
                proc.finish(deadline)
        if self._local is not None:
            self._local.close()

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
