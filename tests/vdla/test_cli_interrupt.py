"""Interrupted and killed commands: Ctrl-C ends `vdla run` and `vdla tune` with one line
saying what was kept, exit status 130, no traceback, no partial output and no worker
left; a SIGKILLed `vdla tune` takes its workers with it and leaves its records intact.
Also `main`'s interrupt line in-process, the tune progress in a log, and the light
``import vdla.cli`` that keeps a Ctrl-C during start-up inside `main`.

The commands run as at a terminal (`process_testing.Command`): stderr on a pty, the
SIGINT sent to the whole process group."""

import io
import json
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from process_testing import LINUX, Command, alive, children, descendants, visible_lines, wait_for
from vdla.cli import main
from vdla.cli import tune as tune_cmd
from vdla.cli.common import on_interrupt
from vdla.compiler.tuner import Records

linux_only = pytest.mark.skipif(not LINUX, reason="a pty and /proc")

#: A layer whose functional measurements take about half a second each.
LAYER = "56,56,64,64,3,1,1"
#: One whose measurements take many seconds.
SLOW_LAYER = "224,224,64,64,3,1,1"


def _intact(db) -> list:
    """The rows of records file `db`, after SQLite's integrity check."""
    connection = sqlite3.connect(db)
    try:
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        connection.close()
    with Records(db) as records:
        return records.query()


def _after_interrupt(command: Command, seconds: float = 30) -> tuple[int, list[str], float]:
    """Send the terminal's SIGINT; (exit status, stderr lines shown after it, seconds to
    exit)."""
    mark, start = len(command.stderr), time.monotonic()
    command.signal_group(signal.SIGINT)
    code = command.wait(seconds)
    return code, visible_lines(command.stderr[mark:]), time.monotonic() - start


def _workers(pid: int) -> set[int]:
    """The pool's workers below `pid`: the fork server's children (`vdla._workers`), one
    level below the fork server and multiprocessing's resource tracker."""
    return descendants(pid) - children(pid)


@linux_only
def test_ctrl_c_ends_vdla_tune_with_what_was_kept(tmp_path):
    db = tmp_path / "t.db"
    args = ["tune", "--layer", LAYER, "--trials", "200", "--jobs", "2", "--measure",
            "functional", "--records", str(db), "--json", "out.json"]
    with Command(args, tmp_path) as tune:
        # The progress line moves per measurement: wait for the third.
        assert tune.read_until(rb"\] 3/200 trials", 180), tune.stderr.decode()
        workers = _workers(tune.pid)
        assert len(workers) == 2
        code, lines, seconds = _after_interrupt(tune)
    assert code == 130 and seconds < 10
    assert b"Traceback" not in tune.stderr
    assert len(lines) == 1, lines
    kept = re.fullmatch(rf"vdla: interrupted: (\d+) of 200 measurements kept in "
                        rf"{re.escape(str(db))}", lines[0])
    assert kept, lines[0]
    # Nothing half-written: no JSON, no temporary file (and the records file closed).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.db"]
    rows = _intact(db)
    assert len(rows) == int(kept.group(1)) >= 3
    assert wait_for(lambda: not any(alive(w) for w in workers), 5)


@linux_only
def test_ctrl_c_ends_vdla_run_with_one_line(tmp_path):
    # Interrupted while its ops run on the Verilator model in worker processes (a warm
    # run compiles from the cache, without a progress line of its own).
    args = ["run", "resnet18", "--jobs", "2", "--json", "out.json"]
    with Command(args, tmp_path) as run:
        assert run.read_until(rb"running on vdla \[", 180), run.stderr.decode()
        helpers = descendants(run.pid)
        code, lines, _ = _after_interrupt(run)
        stdout = run.stdout()
    assert wait_for(lambda: not any(alive(p) for p in helpers), 5)
    assert code == 130
    assert b"Traceback" not in run.stderr
    assert lines == ["vdla: interrupted: vdla run resnet18 stopped; no partial output written"]
    assert stdout == "" and list(tmp_path.iterdir()) == []


@linux_only
def test_a_killed_vdla_tune_takes_its_workers_along(tmp_path):
    db = tmp_path / "t.db"
    assert main(["tune", "--layer", "28,28,16,16,3,1,1", "--trials", "8", "--measure",
                 "functional", "--records", str(db)]) == 0
    args = ["tune", "--layer", SLOW_LAYER, "--trials", "40", "--jobs", "2", "--measure",
            "functional", "--records", str(db)]
    with Command(args, tmp_path) as tune:
        assert wait_for(lambda: len(_workers(tune.pid)) == 2, 120), tune.stderr.decode()
        workers = _workers(tune.pid)
        time.sleep(0.5)          # measuring now: each measurement takes seconds
        tune.process.kill()
        tune.process.wait()
        assert wait_for(lambda: not any(alive(w) for w in workers), 3.0), \
            "the workers outlived vdla tune"
    rows = _intact(db)
    assert len(rows) >= 8 and all(r.workload and r.schedule for r in rows)


def test_main_prints_one_line_for_an_interrupt(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("vdla.cli.config.run", interrupted)
    assert main(["config", "show"]) == 130
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("vdla: interrupted: vdla config show stopped; no partial "
                            "output written\n")


def test_a_command_says_what_an_interrupt_keeps(monkeypatch, capsys):
    done = []

    def counting(args):
        on_interrupt(args, lambda: f"{len(done)} of 3 steps done")
        done.append(1)
        raise KeyboardInterrupt

    monkeypatch.setattr("vdla.cli.config.run", counting)
    assert main(["config", "show"]) == 130
    assert capsys.readouterr().err == "vdla: interrupted: 1 of 3 steps done\n"

    def faulty_note(args):
        on_interrupt(args, lambda: 1 / 0)
        raise KeyboardInterrupt

    monkeypatch.setattr("vdla.cli.config.run", faulty_note)
    assert main(["config", "show"]) == 130
    assert capsys.readouterr().err.startswith("vdla: interrupted: vdla config show stopped")


class _Task:
    name, unit = "C5", "cycles"


def test_tune_progress_in_a_log_prints_now_and_then():
    out, now = io.StringIO(), [0.0]
    progress = tune_cmd._Progress("cycles", stream=out, interval=10.0, clock=lambda: now[0])
    assert progress.interrupted(0, "t.db") == ("vdla tune stopped before measuring; nothing "
                                               "added to t.db")
    for done in range(6, 47):       # 6 trials in the records; a measurement every 3 s
        now[0] += 3.0
        progress(_Task(), done, 46, None if done < 8 else 10_000 - done)
    lines = out.getvalue().splitlines()
    # Every 10 s (4 measurements), then the budget's end.
    assert lines[0] == "vdla: tuning: 9/46 trials (C5), tuned ops 9,991 cycles"
    assert lines[1].startswith("vdla: tuning: 13/46 trials (C5)")
    assert lines[-1] == "vdla: tuned: 46 trials, tuned ops 9,954 cycles"
    assert len(lines) == 11
    assert progress.interrupted(3, "t.db") == "3 of 40 measurements kept in t.db"


def test_importing_the_command_line_loads_no_numpy():
    # Ctrl-C during start-up is handled by main, which imports the commands: what comes
    # before it is only `import vdla.cli`, so it must be quick.
    code = "import sys, vdla.cli; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


@linux_only
def test_ctrl_c_ends_vdla_sweep_and_a_second_run_resumes(tmp_path):
    args = ["sweep", "--board", "pynq-z1", "--model", "digits_cnn", "--param",
            "block_in=8,16", "--param", "acc_buff_size=16K,32K,64K,128K", "--param",
            "inp_buff_size=8K,16K,32K,64K", "--out", "out", "--no-plots"]
    with Command(args, tmp_path) as sweep:
        # The progress line (a terminal's) moves per point: wait for the third.
        assert sweep.read_until(rb"sweep \[3/32\]", 180), sweep.stderr.decode()
        workers = descendants(sweep.pid)
        code, lines, seconds = _after_interrupt(sweep)
    assert code == 130 and seconds < 10
    assert b"Traceback" not in sweep.stderr
    assert len(lines) == 1, lines
    kept = re.fullmatch(r"vdla: interrupted: sweep stopped after (\d+) point\(s\); every "
                        r"finished point is kept in out/sweep.db \(run again to resume\)",
                        lines[0])
    assert kept, lines[0]
    assert wait_for(lambda: not any(alive(w) for w in workers), 5)
    assert not (tmp_path / "out" / "sweep.json").exists()     # no report of half a sweep
    assert main(["sweep", *args[1:-3], "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    doc = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert len(doc["points"]) == 32 and doc["meta"]["reused"] >= int(kept.group(1)) >= 3
