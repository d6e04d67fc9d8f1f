"""The tuner's runner and loop under interruption, and progress per measurement.

LocalRunner's workers die with a SIGKILLed parent and are killed, not waited for, when
the parent is interrupted in the middle of long measurements; an interrupted `measure`
leaves the runner usable (no stale result answers a later input); `measure` reports
each result as it finishes; `tune_task` reports progress after every measurement and
keeps the finished measurements of an interrupted batch."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import vdla
from process_testing import LINUX, alive, children, descendants, interruptible, wait_for
from vdla.compiler.targets.vdla import VdlaTarget
from vdla.compiler.tuner.workload_tasks import tasks_from_workload
from vdla.compiler.tuner import (LocalRunner, MeasureInput, MeasureResult, Records,
                                 ReplayRunner, tune_task)

TARGET = VdlaTarget(vdla.HardwareConfig())
#: A small workload: a functional measurement takes milliseconds.
TINY = "7,7,16,16,1,0,1"

#: A parent process whose two workers hang in their measurement. It prints "measuring"
#: once it has sent them their inputs; an interrupt ends it with "interrupted". (The
#: measurement comes from a module: workers get it pickled, by name.)
HANGING_PARENT = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})   # tuner_faults
import vdla
from vdla.compiler.targets.vdla import VdlaTarget
from vdla.compiler.tuner.workload_tasks import tasks_from_workload
from vdla.compiler.tuner import LocalRunner, MeasureInput
from tuner_faults import hanging_measure

task = tasks_from_workload({TINY!r}, VdlaTarget(vdla.HardwareConfig()))[0]
try:
    with LocalRunner("functional", jobs=2, measure=hanging_measure) as runner:
        print("measuring", flush=True)
        runner.measure([MeasureInput(task, s) for s in task.space()[:2]])
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def _task():
    return tasks_from_workload(TINY, TARGET)[0]


def _hanging_parent():
    """(the parent process, its two workers' pids), the workers measuring. The workers
    are the fork server's children (`vdla._workers`), not the parent's."""
    parent = subprocess.Popen([sys.executable, "-c", HANGING_PARENT], stdout=subprocess.PIPE,
                              text=True, preexec_fn=interruptible)
    assert parent.stdout.readline().strip() == "measuring"

    def workers():
        return descendants(parent.pid) - children(parent.pid)

    assert wait_for(lambda: len(workers()) == 2, 30)
    time.sleep(1.0)       # the inputs are sent, once the workers have imported the task's
    return parent, workers()


@pytest.mark.skipif(not LINUX, reason="looks processes up in /proc")
def test_workers_die_with_a_killed_parent_even_mid_measurement():
    parent, workers = _hanging_parent()
    try:
        parent.kill()
        parent.wait()
        assert wait_for(lambda: not any(alive(w) for w in workers), 3.0), \
            "workers outlived their SIGKILLed parent"
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.skipif(not LINUX, reason="looks processes up in /proc")
def test_an_interrupted_parent_kills_busy_workers_at_once():
    # SIGINT to the parent alone (the terminal's goes to the workers too, and they ignore
    # it): the runner must kill the hanging workers, not wait for them to say goodbye.
    parent, workers = _hanging_parent()
    try:
        start = time.monotonic()
        parent.send_signal(signal.SIGINT)
        assert parent.wait(30) == 130
        assert time.monotonic() - start < 3.0
        assert parent.stdout.read().strip() == "interrupted"
        assert not any(alive(w) for w in workers)
    finally:
        parent.kill()
        parent.wait()


# --- in-process: results as they finish, interruption -------------------------------------

def tagged(task, schedule, context, *, data, backend):
    """A measurement whose cost names its schedule (its position in the space + 1); the
    space's second schedule takes a second."""
    index = task.space().index(schedule)
    if index == 1:
        time.sleep(1.0)
    return MeasureResult("ok", cycles=index + 1)


def test_measure_reports_each_result_as_it_finishes():
    task = _task()
    space = task.space()
    seen = []
    with LocalRunner("functional", jobs=2, measure=tagged) as runner:
        results = runner.measure([MeasureInput(task, s) for s in space[:4]],
                                 on_result=lambda i, r: seen.append((i, r.cycles)))
    assert [r.cycles for r in results] == [1, 2, 3, 4]
    # The slow second input finishes last; every index is reported once.
    assert sorted(seen) == [(0, 1), (1, 2), (2, 3), (3, 4)] and seen[-1] == (1, 2)


def test_an_interrupted_measure_leaves_the_runner_usable():
    task = _task()
    space = task.space()

    def interrupt(index, result):
        raise KeyboardInterrupt

    with LocalRunner("functional", jobs=2, measure=tagged) as runner:
        # Input 0 finishes first, and the interrupt comes while input 1 is measured.
        with pytest.raises(KeyboardInterrupt):
            runner.measure([MeasureInput(task, s) for s in space[:2]], on_result=interrupt)
        # The worker that was measuring input 1 must not answer the next input with it.
        again = runner.measure([MeasureInput(task, s) for s in space[2:6]])
    assert [r.cycles for r in again] == [3, 4, 5, 6]


def test_progress_moves_with_every_measurement():
    task = _task()
    counts = []
    with LocalRunner("functional", jobs=2) as runner:
        result = tune_task(task, runner, trials=12, batch=6, seed=0,
                           progress=lambda t, done, total, best: counts.append(done))
    assert result.trials == 12
    assert counts == list(range(13))     # 0 before the first, then every count


class _PlainRunner:
    """A runner that knows nothing of ``on_result``."""

    def __init__(self, runner):
        self.runner, self.backend = runner, runner.backend

    def measure(self, inputs):
        return self.runner.measure(inputs)


def test_progress_moves_with_every_measurement_of_a_runner_without_the_hook(tmp_path):
    task = _task()
    counts, bests = [], []
    with Records(tmp_path / "t.db") as db:
        with LocalRunner("functional", jobs=2) as runner:
            tune_task(task, _PlainRunner(runner), trials=8, batch=4, records=db,
                      progress=lambda t, done, total, best: (counts.append(done),
                                                             bests.append(best)))
        assert counts == list(range(9))
        assert bests[-1] == min(r.cycles for r in db.query() if r.ok)
        # A replayed search reports every measurement too.
        replayed = []
        tune_task(task, ReplayRunner(db, "functional"), trials=8, batch=4,
                  progress=lambda t, done, total, best: replayed.append(done))
    assert replayed == list(range(9))


def test_an_interrupted_batch_keeps_the_measurements_that_finished(tmp_path):
    task = _task()

    def stop_at_three(t, done, total, best):
        if done == 3:
            raise KeyboardInterrupt

    with Records(tmp_path / "t.db") as db, LocalRunner("functional", jobs=2) as runner:
        with pytest.raises(KeyboardInterrupt):
            tune_task(task, runner, trials=16, batch=8, records=db, progress=stop_at_three)
        assert len(db) == 3
        # The next run resumes from them.
        assert tune_task(task, runner, trials=5, batch=8, records=db).resumed == 3
