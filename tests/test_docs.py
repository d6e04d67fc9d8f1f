"""The documentation holds: the site builds without a warning, every Python example in it
runs as written (and prints what the page says it does), the tables that restate the
code (instruction layouts, control registers) match the code, and nothing tracked by git
points at a file outside the repository.

An example may opt out of running only with a visible reason: an HTML comment on the
line before its fence, ``<!-- not-run: why -->``. Such examples are reported as skipped
with their reason, so the list stays in sight.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import vdla
from vdla.cli import COMMANDS
from vdla.isa import layouts_for
from vdla.isa.registers import REGISTERS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.*?)\s*-->")
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class Example:
    path: Path
    line: int            # of the opening fence, 1-based
    code: str
    not_run: str | None  # the reason it is not run, or None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def _examples() -> list[Example]:
    found = []
    for path in _pages():
        text = path.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            before = [s for s in text[:match.start()].splitlines() if s.strip()]
            reason = NOT_RUN.fullmatch(before[-1].strip()) if before else None
            found.append(Example(path, line, match.group(1),
                                 reason.group(1) if reason else None))
    return found


EXAMPLES = _examples()

# What an example prints, checked for every example that contains the key (the same
# example may be shown on more than one page). Each key must match at least one example,
# so an example cannot disappear from the docs unnoticed.
CHECKS = {
    "ProgramBuilder(cfg)":
        lambda out: "[0 0 1 1 2 2 3 3] 16" in out,
    "print(partition(q, target).report())":
        lambda out: "qconv2d" in out and "vdla" in out and "host" in out,
    "targets.compile_model(q, target)":
        lambda out: "vdla {'tile_h'" in out and "host None" in out,
    "tune_task(task, runner":
        lambda out: int(out.split()[0]) > 100 and out.split()[-1] == "True",
    "tune_tasks(target.tasks(graph)":
        lambda out: out.split() == ["12", "True"],
    "layouts_for(big_uop)":
        lambda out: out.split() == ["1x16x16_i8w8a32_17_13_16_15", "22:8", "66:53", "75:67"],
    "session.run_graph(model.feed)":
        lambda out: out.split()[0] == "True" and 0 < float(out.split()[1]) < 1,
}

#: Examples write their scratch files under /tmp/vdla-*; the test points them at its own
#: temporary folder, so runs in parallel never share a file.
SCRATCH = re.compile(r"/tmp/(vdla-[\w.-]+)")


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.where for e in EXAMPLES])
def test_example_runs(example, capsys, tmp_path, monkeypatch):
    if example.not_run is not None:
        pytest.skip(f"{example.where} is not run: {example.not_run}")
    monkeypatch.chdir(tmp_path)
    code = SCRATCH.sub(lambda m: str(tmp_path / m.group(1)), example.code)
    exec(compile(code, str(example.path), "exec"), {"__name__": "__docs_example__"})
    out = capsys.readouterr().out
    for key, check in CHECKS.items():
        if key in example.code:
            assert check(out), f"{example.where} printed an unexpected result:\n{out}"
    if "tune_task(" in example.code:
        assert list(tmp_path.glob("vdla-*.db")), "the tuning example wrote no records"


def test_every_checked_example_is_in_the_docs():
    missing = [key for key in CHECKS if not any(key in e.code for e in EXAMPLES)]
    assert not missing, f"no example in the docs contains {missing}"


def test_examples_opted_out_say_why():
    """Lists the examples that are not run (shown with -rs as skips too)."""
    skipped = [f"{e.where}: {e.not_run}" for e in EXAMPLES if e.not_run is not None]
    assert all(s.split(": ", 1)[1] for s in skipped), skipped
    print("examples not run:", *(skipped or ["none"]), sep="\n  ")


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: a broken link, a missing snippet, a reference the API
    pages cannot resolve or a docstring mkdocstrings cannot parse fails the build."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-6000:]}"
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    # The generated reference is there: every command, target options included.
    missing = [name for name in COMMANDS if f"<code>vdla {name}</code>" not in cli]
    assert not missing, f"docs/cli.md's generated reference lacks {missing}"
    assert "--precision" in cli and "--sim" in cli and "[vdla]" in cli


def _table_after(heading: str, page: Path) -> list[list[str]]:
    """The rows of the first table after `heading` on `page`, cells stripped of backticks."""
    text = page.read_text()
    start = text.index(heading)
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append([c.strip().strip("`") for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]   # past the header and the |---| line


def test_the_isa_page_layout_table_is_the_code():
    layouts = layouts_for(vdla.HardwareConfig())
    rows = _table_after("### Layout for the default config", DOCS / "isa.md")
    kinds = ("LOAD", "GEMM", "ALU", "FINISH")   # the LOAD column is STORE's too
    on_page = {kind: {} for kind in kinds}
    for field, *cells in rows:
        for kind, cell in zip(kinds, cells, strict=True):
            if cell != "—":
                on_page[kind][field] = cell
    for kind in kinds:
        assert on_page[kind] == layouts[kind].bit_ranges(), kind
    assert layouts["STORE"].bit_ranges() == layouts["LOAD"].bit_ranges()


def test_the_isa_page_register_table_is_the_code():
    rows = _table_after("**Control registers.**", DOCS / "isa.md")
    on_page = {name: (int(offset, 16), access) for offset, name, access, _ in rows
               if not offset.endswith("…")}
    assert on_page == {name: (offset, access)
                       for name, (offset, access, _) in REGISTERS.items()}


# Paths outside the repository, which a clone does not have. Written so that this file
# does not match them itself.
OUTSIDE = {
    "a sibling folder": re.compile(r"\.\./shared"),
    "the design notes": re.compile(r"DESIGN\.md"),
    "the style notes": re.compile(r"STYLE\.md"),
    "a machine's work folder": re.compile(r"/work[/]"),
    "a machine's library folder": re.compile(r"(?<![\w.])[.]library\b"),
}


def test_nothing_tracked_points_outside_the_repository():
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc}): nothing to list")
    bad = []
    for name in filter(None, listed):
        path = ROOT / name
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue   # binary files, and files deleted but not yet staged
        for lineno, line in enumerate(text.splitlines(), 1):
            for what, pattern in OUTSIDE.items():
                if pattern.search(line):
                    bad.append(f"{name}:{lineno}: {what}: {line.strip()[:100]}")
    assert not bad, ("tracked files name paths outside the repository (cite a docs/ page "
                     "instead):\n" + "\n".join(bad))


def test_the_docs_sweep_specs_parse_and_their_values_are_allowed():
    """A sweep spec shown in the docs is one `vdla sweep` accepts: its keys parse and each
    value passes the up-front check against its board's default config (the front it
    leaves is the example file's business: tests/vdla/test_cli_sweep.py runs that)."""
    import tomllib
    from vdla import boards
    from vdla.dse.spec import SweepSpec
    specs = [block for page in sorted(DOCS.rglob("*.md"))
             for block in re.findall(r"```toml\n(.*?)```", page.read_text(), re.S)
             if "[[models]]" in block]
    assert specs, "no sweep spec found in docs/"
    for text in specs:
        spec = SweepSpec.from_dict(tomllib.loads(text))
        spec.check_values(boards.get(spec.board).config)


def test_the_sites_default_output_folder_is_ignored_by_git():
    """``mkdocs build`` without ``--site-dir`` writes mkdocs.yml's site_dir (``site/``);
    git ignores it, so building the docs leaves ``git status`` clean."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    site_dir = "site"
    for line in (ROOT / "mkdocs.yml").read_text().splitlines():
        if line.startswith("site_dir:"):
            site_dir = line.split(":", 1)[1].strip().strip("'\"")
    probe = f"{site_dir}/index.html"
    ignored = subprocess.run([git, "check-ignore", "-q", "--no-index", probe], cwd=ROOT)
    assert ignored.returncode == 0, f"git does not ignore {probe}: add /{site_dir}/ to " \
                                    ".gitignore"
