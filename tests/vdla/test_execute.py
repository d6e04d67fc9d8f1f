"""Executors: in-process, local worker processes and Ray give the same records; failures
come back as clear errors; workers never outlive the sweep."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from process_testing import alive, children, wait_for
from vdla.execute import EvaluationError, LocalExecutor, make_executor


def square_evaluator(offset):
    pid = os.getpid()  # built once per worker: every record of a worker carries its pid

    def evaluate(task):
        if task == "raise":
            raise ArithmeticError("bad task")
        if task == "die":
            os._exit(3)
        if task == "sleep":
            time.sleep(60)
        return {"key": str(task), "value": task * task + offset, "built_in": pid}
    return evaluate


FACTORY = functools.partial(square_evaluator, 1)


def results(executor, tasks):
    return sorted((i, r["value"]) for i, r in executor.map_unordered(tasks))


def test_in_process_and_worker_processes_give_the_same_records():
    tasks = list(range(20))
    with LocalExecutor(FACTORY, 1) as one, LocalExecutor(FACTORY, 2) as two:
        assert results(one, tasks) == results(two, tasks) == [(i, i * i + 1) for i in tasks]
        pids = {r["built_in"] for _, r in two.map_unordered(tasks)}
        assert len(pids) <= 2 and os.getpid() not in pids   # one evaluator per worker
        assert results(two, []) == []
        assert "2 local processes" == two.describe()


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failing_evaluation_is_an_error_with_the_traceback(jobs):
    with LocalExecutor(FACTORY, jobs) as executor:
        with pytest.raises(EvaluationError, match="task 2") as info:
            list(executor.map_unordered([1, 2, "raise"]))
        assert info.value.index == 2
        assert "ArithmeticError" in str(info.value) or isinstance(
            info.value.__cause__, ArithmeticError)
        assert results(executor, [3]) == [(0, 10)]      # still usable


def test_a_dying_worker_is_an_error_not_a_hang():
    with LocalExecutor(FACTORY, 2) as executor:
        with pytest.raises(EvaluationError, match=r"task 1 \('die'\) died \(exit code 3\)") \
                as info:
            list(executor.map_unordered([1, "die", 3]))
        assert info.value.index == 1
        assert results(executor, [2, 3]) == [(0, 5), (1, 10)]  # a new worker replaces it


def test_closing_kills_the_workers_of_an_unfinished_iteration():
    executor = LocalExecutor(FACTORY, 2)
    iteration = executor.map_unordered([1, "sleep", "sleep"])
    index, record = next(iteration)
    assert (index, record["value"]) == (0, 2)
    workers = [p for p, _ in executor._procs]
    start = time.monotonic()
    executor.close()                # the iteration is still open: both workers are busy
    assert time.monotonic() - start < 3
    assert not any(p.is_alive() for p in workers)
    iteration.close()


def test_bad_jobs_are_refused():
    with pytest.raises(ValueError, match="jobs must be a positive integer"):
        LocalExecutor(FACTORY, 0)


PARENT = textwrap.dedent("""
    import time
    from vdla.execute import LocalExecutor
    def factory():
        return lambda task: {"key": str(task)}
    executor = LocalExecutor(factory, 2)
    executor._start()
    print("ready", flush=True)
    time.sleep(60)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_workers_die_with_a_killed_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        workers = children(parent.pid)
        assert len(workers) == 2
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert wait_for(lambda: not any(alive(w) for w in workers), 5)
    finally:
        parent.kill()


def test_ray_executor_gives_the_same_records():
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'vdla[ray]'")
    # Ray's workers import a task's functions by module name; this test module is not
    # importable there, so it travels by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    tasks = list(range(8))
    with LocalExecutor(FACTORY, 2) as local:
        expected = results(local, tasks)
    with make_executor(FACTORY, ray="local", jobs=2) as executor:
        assert "Ray" in executor.describe() and executor.workers == 2
        assert results(executor, tasks) == expected
        with pytest.raises(EvaluationError, match="task 1"):
            list(executor.map_unordered([0, "raise"]))
        # A dying actor is an error naming its task; Ray restarts it, so the next tasks
        # do not go to a dead actor.
        with pytest.raises(EvaluationError, match="task 1") as info:
            list(executor.map_unordered([1, "die", 3]))
        assert info.value.index == 1
        assert results(executor, [2, 3, 4, 5]) == [(0, 5), (1, 10), (2, 17), (3, 26)]
