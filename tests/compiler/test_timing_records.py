"""bench/timing_records.py: the timing model beside the recorded Verilator measurements
(the whole sets are the bench's job; here one exhaustively measured task of the few-shot
set, and the bad input)."""

from pathlib import Path

import pytest

from script_loading import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_rows_hold_every_measured_schedule_of_a_task_beside_its_estimate():
    bench = load_script(ROOT / "bench" / "timing_records.py")
    name, tasks, records = list(bench.sets())[-1]
    assert name == "vdla_fewshot_v1"
    task = tasks[0]
    rows = bench.rows_of([task], records)
    # The few-shot set measured the whole space of each reduced layer.
    assert len(rows) == len(task.space())
    assert all(k == 0 and measured > 0 and estimate == task.estimate(schedule).cycles
               for k, measured, estimate, _, schedule in rows)
    # The timing model is close on the layer it was fitted to measure: within 30% on
    # every schedule, which a wrong pairing of records and schedules would break.
    assert all(abs(estimate / measured - 1) < 0.3 for _, measured, estimate, *_ in rows)


def test_a_negative_worst_count_is_refused(capsys):
    bench = load_script(ROOT / "bench" / "timing_records.py")
    with pytest.raises(SystemExit) as exc:
        bench.main(["--worst", "-1"])
    assert exc.value.code == 2
    assert "--worst must be >= 0, not -1" in capsys.readouterr().err
