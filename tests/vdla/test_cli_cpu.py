"""The CPU target from the command line: `vdla compile` (a project that builds with make
and whose program matches the reference), `vdla run --target cpu` at both precisions and
instruction sets, and `vdla tune --target cpu` feeding `vdla run --records`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from vdla.cli import main

from script_loading import load_script


def test_compile_writes_a_project_that_builds_and_matches(tmp_path, capsys):
    out = tmp_path / "digits"
    assert main(["compile", "digits_cnn", "-o", str(out), "--check"]) == 0
    text = capsys.readouterr().out
    for name in ("Makefile", "model.c", "vdla_cpu.h", "vdla_model.h", "model.params",
                 "run_model.c", "loader.c", "README.md"):
        assert (out / name).is_file(), name
    assert "checked: built with make" in text and "bit-exact vs the quantized reference" in text
    header = (out / "vdla_model.h").read_text()
    assert "'input', float32 [1 x 1 x 8 x 8]" in header and "vdla_model_run(" in header


def test_compile_writes_an_example_input_that_run_model_reproduces(tmp_path, capsys):
    """The project's in.bin (the seeded input) run by the built run_model gives out.bin
    (the reference's output) byte for byte, and the README says the files' layout. The
    project builds with every warning an error (gcc 14 made posix_memalign's implicit
    declaration one), as a user's newer compiler would."""
    import shutil
    import subprocess

    import numpy as np
    from vdla.compiler import pipeline

    make, cc = shutil.which("make"), shutil.which("cc") or shutil.which("gcc")
    if make is None or cc is None:
        pytest.skip("needs make and a C compiler")
    out = tmp_path / "digits"
    assert main(["compile", "digits_cnn", "-o", str(out), "--seed", "2"]) == 0
    assert "./run_model model.params in.bin my_out.bin" in capsys.readouterr().out
    model = pipeline.load_model("digits_cnn", seed=2, calibration=4)
    (name, image), = model.feed.items()
    assert (out / "in.bin").read_bytes() == np.ascontiguousarray(image, "<f4").tobytes()
    readme = (out / "README.md").read_text()
    assert f"- input 0: `{name}`, float32 [1, 1, 8, 8], 256 bytes (`in.bin`)" in readme
    assert "C order (row-major" in readme and "little-endian" in readme
    assert "    ./run_model model.params in.bin my_out.bin\n    cmp my_out.bin out.bin" in readme

    build = subprocess.run([make, "-j2", f"CC={cc} -Werror"], cwd=out, capture_output=True,
                           text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run(["./run_model", "model.params", "in.bin", "my_out.bin"], cwd=out,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    expected = (out / "out.bin").read_bytes()
    assert len(expected) == 10 * 4 and (out / "my_out.bin").read_bytes() == expected


def _built_project(tmp_path, model: str) -> Path:
    """`vdla compile MODEL` into tmp_path, built with make (skips without make or cc)."""
    make, cc = shutil.which("make"), shutil.which("cc") or shutil.which("gcc")
    if make is None or cc is None:
        pytest.skip("needs make and a C compiler")
    out = tmp_path / model
    assert main(["compile", model, "-o", str(out)]) == 0
    build = subprocess.run([make, "-j2", f"CC={cc}"], cwd=out, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    return out


def test_run_model_repeats_and_prints_the_median(tmp_path, capsys):
    """run_model's optional last argument: N timed runs after the untimed one, the
    median printed (the line bench/cpu_project.py parses), the output still out.bin
    byte for byte; without it, one timed run as before."""
    out = _built_project(tmp_path, "digits_cnn")
    capsys.readouterr()
    expected = (out / "out.bin").read_bytes()
    line = re.compile(r"^([0-9.]+) ms per run \(median of (\d+) runs?; min ([0-9.]+), "
                      r"mean ([0-9.]+)\)$")
    for extra, runs in (([], 1), (["7"], 7)):
        (out / "my_out.bin").unlink(missing_ok=True)
        run = subprocess.run(["./run_model", "model.params", "in.bin", "my_out.bin", *extra],
                             cwd=out, capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert run.returncode == 0, run.stderr
        match = line.match(run.stdout.strip())
        assert match, run.stdout
        median, minimum, mean = float(match[1]), float(match[3]), float(match[4])
        assert int(match[2]) == runs and 0 < minimum <= median and mean > 0
        assert (out / "my_out.bin").read_bytes() == expected
    readme = (out / "README.md").read_text()
    assert "is a repeat count N" in readme and "median time per run" in readme


def test_cpu_project_bench_runs(tmp_path, capsys, monkeypatch):
    """bench/cpu_project.py end to end on a small model, one short round: its table, its
    JSON, and outputs identical to the in-process runner's at both precisions."""
    # the bench sets OMP_NUM_THREADS for itself; monkeypatch puts the old value back
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    if shutil.which("make") is None:
        pytest.skip("needs make")
    bench = load_script(Path(__file__).resolve().parents[2] / "bench" / "cpu_project.py")
    assert bench.main(["--models", "digits_cnn", "--threads", "1", "--runs", "3",
                       "--rounds", "1", "--pause", "0", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "digits_cnn    float32" in text and "digits_cnn    int8" in text
    rows = json.loads((tmp_path / "cpu_project.json").read_text())["rows"]
    assert [r["precision"] for r in rows] == ["float32", "int8"]
    for r in rows:
        assert r["c_ms"] > 0 and r["in_process_ms"] > 0 and len(r["ratio_rounds"]) == 1
    assert rows[1]["identical"] and rows[0]["max_error"] <= 1e-4

def test_compile_float_small_cnn(tmp_path, capsys):
    assert main(["compile", "small_cnn", "-o", str(tmp_path / "p"), "--precision", "float32",
                 "--check"]) == 0
    assert "within 0.0001 of the float reference" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["compile", "digits_cnn", "--target", "host"], "has no stand-alone form"),
    (["compile", "nosuch"], "unknown model 'nosuch'"),
    (["compile", "digits_cnn", "--threads", "0"], "--threads must be a positive integer"),
    (["compile", "digits_cnn", "--isa", "mmx"], "unknown CPU instruction set 'mmx'"),
    (["compile", "digits_cnn", "--calibration", "0"], "--calibration must be a positive"),
    (["compile", "digits_cnn", "--seed", "-1"], "--seed must be a non-negative integer"),
    (["compile", "digits_cnn", "--batch", "0"], "--batch must be a positive integer"),
])
def test_compile_errors(tmp_path, capsys, argv, message):
    assert main(argv + ["-o", str(tmp_path / "out")]) == 1
    assert message in capsys.readouterr().err


def test_compile_into_a_file_is_an_error(tmp_path, capsys):
    path = tmp_path / "file"
    path.write_text("x")
    assert main(["compile", "digits_cnn", "-o", str(path)]) == 1
    assert "is a file; give a folder" in capsys.readouterr().err


def _named_isa() -> str:
    """An instruction set to name with --isa that this machine runs: avx2 where the
    compiler offers it (an x86 machine may lack it), else the portable C."""
    from vdla.compiler.targets.cpu.build import machine_features
    from vdla.compiler.targets.cpu.isa import get

    return "avx2" if get("avx2").runs_on(machine_features()) else "portable"


@pytest.mark.parametrize("precision", ["int8", "float32"])
def test_run_on_the_cpu_target(tmp_path, capsys, precision):
    report, isa = tmp_path / "r.json", _named_isa()
    assert main(["run", "small_cnn", "--target", "cpu", "--precision", precision,
                 "--isa", isa, "--threads", "1", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "whole graph in one call:" in out and "GOP/s" in out
    doc = json.loads(report.read_text())
    assert doc["precision"] == precision and doc["bit_exact"] is True
    assert doc["options"] == {"threads": 1, "isa": isa}
    assert doc["whole_graph_seconds"] > 0
    if precision == "float32":
        assert "within 0.0001 of the float reference: yes" in out
        assert doc["quantization"] is None and 0 < doc["max_error"] < 1e-4
    else:
        assert "bit-exact vs the quantized reference: yes" in out and doc["max_error"] == 0


def test_isa_and_threads_belong_to_the_cpu_target(capsys):
    assert main(["run", "digits_cnn", "--target", "host", "--isa", "avx2"]) == 1
    assert "--isa applies to --target cpu" in capsys.readouterr().err


def _tunable_ops(model: str, threads: int) -> int:
    """The nodes of `model`'s tuning tasks on this machine's CPU target (an int8 stem that
    runs as one GEMM, on an instruction set without VNNI, is none)."""
    from vdla.compiler import pipeline, targets
    target = targets.get("cpu", threads=threads)
    graph = pipeline.graph_for(pipeline.load_model(model, calibration=8, note=None), target,
                               precision="int8")
    return sum(len(task.nodes) for task in target.tasks(graph))


def test_tune_then_run_with_the_records(tmp_path, capsys):
    db = tmp_path / "cpu.db"
    ops = _tunable_ops("digits_cnn", 1)
    assert ops >= 3
    assert main(["tune", "digits_cnn", "--target", "cpu", "--trials", "12", "--split", "equal",
                 "--records", str(db), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "target cpu" in out and "wall measurements" in out and " ns " in out
    # The note on repeated measurements is a whole sentence (it once ended mid-phrase).
    note = next(line for line in out.splitlines() if line.startswith("wall time varies"))
    assert note.endswith("the table gives the median of each one's measurements.")
    assert main(["run", "digits_cnn", "--target", "cpu", "--threads", "1", "--records",
                 str(db)]) == 0
    out = capsys.readouterr().out
    assert f"schedules: {ops} of {ops} tunable ops from the records" in out
    # Records are kept per thread count: two threads find none of them.
    assert main(["run", "digits_cnn", "--target", "cpu", "--threads", "2", "--records",
                 str(db)]) == 0
    assert f"schedules: 0 of {ops} tunable ops" in capsys.readouterr().out
