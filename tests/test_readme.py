"""The README's Python examples run as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_python_api_example_runs(capsys):
    runtime = next(code for code in _examples() if "ProgramBuilder" in code)
    exec(compile(runtime, str(README), "exec"), {})
    assert "[0 0 1 1 2 2 3 3] 16" in capsys.readouterr().out


def test_compiler_example_runs(capsys):
    compiler = next(code for code in _examples() if "quantize(" in code)
    exec(compile(compiler, str(README), "exec"), {})
    report = capsys.readouterr().out
    assert "qconv2d" in report and "vdla" in report and "host" in report


def test_readme_commands_match_ci():
    ci = (README.parent / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in README.read_text()


def test_backend_example_runs(capsys):
    backend = next(code for code in _examples() if "compile_model(" in code)
    exec(compile(backend, str(README), "exec"), {})
    report = capsys.readouterr().out
    assert "vdla {'tile_h'" in report and "host None" in report


def test_tuner_example_runs(capsys, tmp_path):
    code = next(code for code in _examples() if "tune_task(" in code)
    db = tmp_path / "readme.db"
    exec(compile(code.replace("/tmp/vdla-readme-tune.db", str(db)), str(README), "exec"), {})
    report = capsys.readouterr().out.split()
    assert int(report[0]) > 100 and report[-1] == "True"
    assert db.exists()


def test_cpu_example_runs(capsys):
    code = next(code for code in _examples() if "run_graph(" in code)
    exec(compile(code, str(README), "exec"), {})
    exact, seconds = capsys.readouterr().out.split()
    assert exact == "True" and 0 < float(seconds) < 1
