"""Executors: in-process, local worker processes and Ray give the same records; failures
come back as clear errors (or, from `LocalExecutor.outcomes`, as outcomes, the others
going on); a task past the timeout has its worker killed; workers never outlive the
sweep, and neither does the fork server that starts them."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from process_testing import alive, children, descendants, wait_for
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
    workers = [p.process for p in executor._procs]
    start = time.monotonic()
    executor.close()                # the iteration is still open: both workers are busy
    assert time.monotonic() - start < 3
    assert not any(p.is_alive() for p in workers)
    iteration.close()


def test_bad_jobs_are_refused():
    with pytest.raises(ValueError, match="jobs must be a positive integer"):
        LocalExecutor(FACTORY, 0)


def test_outcomes_go_on_past_failures_and_time_out_a_hung_task():
    """What the tuner's `LocalRunner` measures through: every task has an outcome, a
    worker that dies or hangs is replaced, and the rest are evaluated."""
    tasks = [1, "die", "raise", "sleep", 4, 5]
    with LocalExecutor(FACTORY, 2, timeout=2.0) as executor:
        start = time.monotonic()
        got = {o.index: o for o in executor.outcomes(tasks)}
        assert time.monotonic() - start < 30
        assert {i: o.status for i, o in got.items()} == {
            0: "ok", 1: "died", 2: "error", 3: "timeout", 4: "ok", 5: "ok"}
        assert got[1].value == "exit code 3"
        assert "ArithmeticError: bad task" in got[2].value     # the worker's traceback
        assert "no result after 2 s" in got[3].value and got[3].seconds >= 2.0
        assert [got[i].value["value"] for i in (0, 4, 5)] == [2, 17, 26]
        assert results(executor, [2, 3]) == [(0, 5), (1, 10)]
    with LocalExecutor(FACTORY, 1, timeout=30, processes=True) as alone:
        assert alone.describe() == "1 local process"
        assert [o.value["built_in"] != os.getpid() for o in alone.outcomes([1])] == [True]
    with pytest.raises(ValueError, match="a timeout needs worker processes"):
        LocalExecutor(FACTORY, 1, timeout=5)
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        LocalExecutor(FACTORY, 2, timeout=0)


def _refuse(message):
    raise LookupError(message)


class ArrivesBroken:
    """A task that a worker cannot unpickle (as one whose class's module fails to import
    there)."""

    def __reduce__(self):
        return _refuse, ("cannot rebuild this task",)


def test_a_task_a_worker_cannot_unpickle_is_its_error_not_a_dead_worker():
    with LocalExecutor(FACTORY, 2) as executor:
        with pytest.raises(EvaluationError, match=r"(?s)task 1 .*LookupError: cannot "
                                                  "rebuild this task") as info:
            list(executor.map_unordered([1, ArrivesBroken(), 3]))
        assert info.value.index == 1
        assert results(executor, [2]) == [(0, 5)]


def test_an_interrupted_iteration_kills_its_busy_workers_and_the_pool_goes_on():
    with LocalExecutor(FACTORY, 2) as executor:
        outcomes = executor.outcomes([1, "sleep"])
        assert next(outcomes).index == 0
        busy = [p.process for p in executor._procs if p.job]
        start = time.monotonic()
        outcomes.close()                      # what an exception in the caller does
        assert time.monotonic() - start < 3 and not any(p.is_alive() for p in busy)
        assert results(executor, [2, 3, 4]) == [(0, 5), (1, 10), (2, 17)]


#: Runs the CPU target's model (its OpenMP team starts in this process), then the same
#: command in two workers, with a minute each; prints their outcomes.
AFTER_A_CPU_RUN = textwrap.dedent("""
    import functools
    from vdla.cli import main
    from vdla.execute import LocalExecutor

    if __name__ == "__main__":      # the workers import this script: it must not rerun
        run = ["run", "digits_cnn", "--target", "cpu"]
        assert main(run) == 0
        with LocalExecutor(functools.partial(functools.partial, main), 2,
                           timeout=60) as pool:
            got = sorted((o.index, o.status, o.value) for o in pool.outcomes([run, run]))
        print("OUTCOMES", got)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="the hang is fork's; elsewhere workers are spawned")
def test_workers_run_a_multi_threaded_model_after_their_parent_did(tmp_path):
    """A worker forked from a process whose OpenMP team had run would inherit the team's
    state without its threads and hang at its first parallel region (each task here
    then a timeout); the fork server's workers start clean. In a subprocess: the test
    runner's own process never starts an OpenMP team."""
    script = tmp_path / "after_a_cpu_run.py"
    script.write_text(AFTER_A_CPU_RUN)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "OUTCOMES [(0, 'ok', 0), (1, 'ok', 0)]" in done.stdout, done.stdout[-2000:]


#: A parent that starts two workers, prints "ready" and waits for a line on stdin (at
#: most a minute), then exits without closing its pool. (Its factory is `dict`: it must
#: be importable by name in the workers, and no task is sent.)
PARENT = textwrap.dedent("""
    import select, sys
    from vdla.execute import LocalExecutor
    if __name__ == "__main__":
        executor = LocalExecutor(dict, 2)
        executor._start()
        print("ready", flush=True)
        select.select([sys.stdin], [], [], 60)
""")


def _parent(tmp_path) -> subprocess.Popen:
    """A Python process running `PARENT` (a pool of two workers), once it says ready."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert parent.stdout.readline().strip() == "ready"
    return parent


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_a_parent_that_exits_ends_after_its_workers_and_fork_server(tmp_path):
    parent = _parent(tmp_path)
    try:
        below = descendants(parent.pid)
        assert len(below) >= 3          # the fork server, its two workers (and a tracker)
        parent.stdin.write("exit\n")
        parent.stdin.flush()
        assert parent.wait(30) == 0
        # At once, not a moment later: it stopped and reaped them before it ended.
        assert not [p for p in below if alive(p)]
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_workers_die_with_a_killed_parent_and_leave_nothing_behind(tmp_path):
    parent = _parent(tmp_path)
    try:
        below = descendants(parent.pid)
        workers = [p for p in below if p not in children(parent.pid)]
        assert len(workers) == 2    # forked by the fork server, not by the parent
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        # The workers, the fork server and its resource tracker: none outlives it.
        assert wait_for(lambda: not any(alive(p) for p in below), 5), \
            [p for p in below if alive(p)]
    finally:
        parent.kill()
        parent.wait()


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
