"""The README's Python example runs as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_python_api_example_runs(capsys):
    [code] = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    exec(compile(code, str(README), "exec"), {})
    assert "[0 0 1 1 2 2 3 3] 16" in capsys.readouterr().out


def test_readme_commands_match_ci():
    ci = (README.parent / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in README.read_text()
