"""vdla._workers: a worker dies with its parent, even a SIGKILLed one (the parent-death
signal, the fork server's workers' watcher of their owner, the portable watcher thread,
the parent that died before the worker could tell), and ignores SIGINT, which its
parent handles."""

import os
import signal
import subprocess
import sys
import time

import pytest

from process_testing import LINUX, alive, wait_for
from vdla import _workers

pytestmark = pytest.mark.skipif(not LINUX, reason="looks processes up in /proc")

#: A parent that starts one worker that would sleep for an hour, prints its pid, and
#: sleeps itself. argv: start method, and "watcher" to use the portable fallback.
PARENT = """
import multiprocessing, os, sys, time
from vdla import _workers

def sleep():
    time.sleep(3600)

def watched(parent_pid):
    _workers.die_with_parent(parent_pid, pdeathsig=False)
    sleep()

if __name__ == "__main__":
    context = multiprocessing.get_context(sys.argv[1])
    if sys.argv[2:] == ["watcher"]:
        worker = context.Process(target=watched, args=(os.getpid(),), daemon=True)
        worker.start()
    else:
        worker = _workers.start_worker(context, sleep)
    print(worker.pid, flush=True)
    time.sleep(3600)
"""


def _parent(tmp_path, *args) -> tuple[subprocess.Popen, int]:
    script = tmp_path / "parent.py"       # a file: spawn re-imports the parent's main
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE,
                              text=True)
    return parent, int(parent.stdout.readline())


@pytest.mark.parametrize("method", ["forkserver", "fork", "spawn"])
def test_a_worker_dies_when_its_parent_is_killed(tmp_path, method):
    parent, worker = _parent(tmp_path, method)
    try:
        time.sleep(0.5)             # the worker is past its start-up
        assert alive(worker)
        parent.kill()
        parent.wait()
        assert wait_for(lambda: not alive(worker), 2.0), "the worker outlived its parent"
    finally:
        parent.kill()
        parent.wait()


def test_the_portable_watcher_ends_an_orphan_too(tmp_path):
    parent, worker = _parent(tmp_path, "fork", "watcher")
    try:
        time.sleep(0.3)
        assert alive(worker)
        parent.kill()
        parent.wait()
        assert wait_for(lambda: not alive(worker), _workers.POLL_SECONDS + 2.0)
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.parametrize("pdeathsig", [True, False])
def test_a_worker_whose_parent_died_before_it_could_tell_exits_at_once(pdeathsig):
    # pid 1 is not the test's process: as if the real parent had died and the worker
    # been re-parented before it called die_with_parent.
    code = (f"from vdla._workers import die_with_parent; die_with_parent(1, "
            f"pdeathsig={pdeathsig}); print('still here')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and "still here" not in out.stdout


@pytest.mark.parametrize("method", ["forkserver", "fork"])
def test_a_worker_ignores_sigint(tmp_path, method):
    parent, worker = _parent(tmp_path, method)
    try:
        time.sleep(0.3)
        os.kill(worker, signal.SIGINT)        # what a terminal's Ctrl-C sends it too
        time.sleep(0.5)
        assert alive(worker)
    finally:
        parent.kill()
        parent.wait()
    assert wait_for(lambda: not alive(worker), 2.0)


def test_workers_start_from_the_fork_server_on_linux():
    assert _workers.worker_context().get_start_method() == "forkserver"
    with pytest.raises(ValueError, match="one of forkserver, fork, spawn, not 'bogus'"):
        _workers.start_worker(type("Context", (), {"get_start_method": lambda s: "bogus"})(),
                              print)
