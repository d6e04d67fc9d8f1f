"""``vdla tune``'s progress and summary: a number or words, never a bare dash, and the
tuned ops' total before and after tuning even where some workloads got no trials."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

from vdla.cli import main
from vdla.cli import tune as tune_cmd
from vdla.compiler.tuner.measure import MeasureResult
from vdla.compiler.tuner.tune import TuneResult


def _tune(tmp_path, capsys, *extra):
    db, report = tmp_path / "t.db", tmp_path / "t.json"
    assert main(["tune", "small_cnn", "--measure", "functional", "--records", str(db),
                 "--json", str(report), *extra]) == 0
    captured = capsys.readouterr()
    return captured.out.splitlines(), captured.err.splitlines(), json.loads(report.read_text())


def test_progress_counts_the_workloads_measured_until_the_total_is_known():
    out = io.StringIO()
    progress = tune_cmd._Progress("cycles", 5, stream=out, interval=0.0)
    progress(SimpleNamespace(name="C5"), 1, 8, None, 0)
    progress(SimpleNamespace(name="C6"), 4, 8, None, 3)
    progress(SimpleNamespace(name="C7"), 8, 8, 12_345, 5)
    assert out.getvalue().splitlines() == [
        "vdla: tuning: 1/8 trials (C5), 0 of 5 workloads measured",
        "vdla: tuning: 4/8 trials (C6), 3 of 5 workloads measured",
        "vdla: tuned: 8 trials, tuned ops 12,345 cycles"]


def test_a_budget_short_of_the_workloads_still_gives_the_total_over_those_measured(
        tmp_path, capsys):
    # small_cnn has four workloads; two trials go to the default and the first pick of one.
    out, err, doc = _tune(tmp_path, capsys, "--trials", "2", "--batch", "2")
    assert err[-1] == "vdla: tuned: 2 trials, 1 of 4 workloads measured"
    assert not any(" - cycles" in line for line in err)
    [measured] = doc["cost"]["workloads"]
    others = [w["name"] for w in doc["workloads"] if w["name"] != measured]
    assert [w["name"] for w in doc["cost"]["left_out"]] == others
    [total] = [line for line in out if line.startswith("tuned ops")]
    cost = doc["cost"]
    assert total == (f"tuned ops (each workload's cost times its nodes), over the 1 of 4 "
                     f"workloads measured: {cost['default']:,} cycles with the default "
                     f"schedules, {cost['best']:,} with the best found "
                     f"({cost['default'] / cost['best']:.3f}x); left out: "
                     f"{', '.join(others)} (no trials: --trials 2 ran out before them)")


def test_a_budget_spent_in_the_warm_up_ends_on_the_tuned_ops_cost(tmp_path, capsys):
    # Eight trials are the warm-up of four workloads (a default and a first pick each):
    # the last progress line comes from inside a warm-up batch and has the whole cost.
    out, err, doc = _tune(tmp_path, capsys, "--trials", "8", "--batch", "4")
    cost = doc["cost"]
    assert err[-1] == f"vdla: tuned: 8 trials, tuned ops {cost['best']:,} cycles"
    assert len(cost["workloads"]) == 4 and cost["left_out"] == []
    assert f"tuned ops (each workload's cost times its nodes): {cost['default']:,} cycles" \
        in out[-2]


def _result(name, trials, default_cycles, best_cycles, default_failed=False):
    task = SimpleNamespace(name=name, nodes=("a", "b"))
    history = [("default", MeasureResult("error", error="boom"))] if default_failed \
        else []
    return TuneResult(task=task, space_size=10, best="x" if best_cycles else None,
                      best_cycles=best_cycles, default="default",
                      default_cycles=default_cycles, history=tuple(history),
                      resumed=trials - len(history))


def test_the_total_names_each_workload_left_out_and_why():
    results = [_result("A", 3, 100, 80), _result("B", 0, None, None),
               _result("C", 2, None, None), _result("D", 2, None, 50, default_failed=True),
               _result("E", 1, None, 60)]
    totals = tune_cmd._totals(results, trials=8)
    assert (totals.default, totals.best, totals.counted) == (200, 160, ("A",))
    assert tune_cmd._total_line(totals, "cycles") == (
        "tuned ops (each workload's cost times its nodes), over the 1 of 5 workloads "
        "measured: 200 cycles with the default schedules, 160 with the best found (1.250x); "
        "left out: B (no trials: --trials 8 ran out before them); C (every measurement "
        "failed); D (the default schedule's measurement failed); E (the default schedule "
        "not measured)")
    none = tune_cmd._totals(results[1:2], trials=1)
    assert tune_cmd._total_line(none, "ns") == (
        "tuned ops: no total before and after tuning, no workload measured: B (no trials: "
        "--trials 1 ran out before them)")
