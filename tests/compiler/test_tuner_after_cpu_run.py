"""The tuner measures in a process that has already run a multi-threaded CPU model.

`vdla run --target cpu` runs the model's compiled code with its OpenMP thread pool. A
worker forked from that process inherits the pool's state without its threads and can
hang at its first parallel region, until each measurement's wall-clock limit kills it
(seen as every measurement a timeout; tests/vdla/test_execute.py shows the hang at the
pool, where it is certain). The local pool's workers are forked by a fork server
instead (`vdla._workers`), a fresh interpreter that never ran a model. The two commands
run in one process, a subprocess of the test's, so the test runner's own process never
holds an OpenMP pool."""

import subprocess
import sys
import textwrap

import pytest

from vdla.compiler.tuner import Records

#: `vdla run` then `vdla tune` in one process; argv: the records file. Each measurement
#: may take 60 s of wall time (a CPU measurement compiles and runs in about a second).
SCRIPT = textwrap.dedent("""
    import sys
    from vdla.cli import main

    if __name__ == "__main__":      # the workers import this script: it must not rerun
        assert main(["run", "digits_cnn", "--target", "cpu"]) == 0
        sys.exit(main(["tune", "digits_cnn", "--target", "cpu", "--trials", "4",
                       "--batch", "2", "--tuner", "random", "--jobs", "2",
                       "--timeout", "60", "--records", sys.argv[1]]))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="the hang is fork's; elsewhere workers are spawned")
def test_tuning_after_running_a_cpu_model_in_the_same_process(tmp_path):
    script = tmp_path / "run_then_tune.py"
    script.write_text(SCRIPT)
    records = tmp_path / "tune.db"
    try:
        done = subprocess.run([sys.executable, str(script), str(records)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"run then tune did not finish in 300 s:\n{exc.stderr}")
    assert done.returncode == 0, done.stderr
    with Records(records) as db:
        statuses = [r.status for r in db.query()]
    assert len(statuses) >= 4, statuses
    assert "timeout" not in statuses and statuses.count("ok") >= 1, statuses
