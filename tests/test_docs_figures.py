"""The documentation's figures: every figure a page includes is one `scripts/docs_figures.py`
defines, its file exists and says where it came from. Nothing here runs a figure's
command (they take minutes); the script's own logic is checked with a quick fake one."""

import re
from pathlib import Path

import pytest

from script_loading import load_script

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# A snippet line of pymdownx.snippets: --8<-- "path"
SNIPPET = re.compile(r'^\s*-{1,}8<-{1,}\s+"([^"]+)"\s*$', re.MULTILINE)


def _load_script():
    return load_script(ROOT / "scripts" / "docs_figures.py")


figures = _load_script()


def _snippets():
    for page in sorted(DOCS.rglob("*.md")):
        for path in SNIPPET.findall(page.read_text()):
            yield page.relative_to(ROOT), path


def test_figure_names_are_unique():
    names = [f.name for f in figures.FIGURES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("page, path", list(_snippets()) or [(None, None)])
def test_every_included_figure_is_defined_and_written(page, path):
    if page is None:
        pytest.skip("no page includes a figure")
    assert path.startswith("docs/figures/") and path.endswith(".txt"), \
        f"{page} includes {path}: pages include figures from docs/figures/NAME.txt"
    stem = Path(path).stem
    try:
        figure, _ = figures.figure_of(stem)
    except KeyError:
        raise AssertionError(f"{page} includes {path}, which scripts/docs_figures.py does "
                             "not define") from None
    assert (ROOT / path).is_file(), \
        f"{page} includes {path}: run python3 scripts/docs_figures.py --only {figure.name}"


@pytest.mark.parametrize("path", sorted((DOCS / "figures").glob("*.txt")), ids=lambda p: p.stem)
def test_every_figure_file_starts_with_its_provenance(path):
    try:
        figure, _ = figures.figure_of(path.stem)
    except KeyError:
        raise AssertionError(f"{path.name} is no figure of scripts/docs_figures.py (a stale "
                             "file?)") from None
    first = path.read_text().split("\n", 1)[0]
    assert first.startswith(figures.PROVENANCE_PREFIX + figure.shown_command() + "    # commit "), \
        f"{path.name}: the first line must name its command and commit, not {first!r}"
    assert re.search(r"# commit [0-9a-f]{4,}(-dirty)?, \d{4}-\d\d-\d\d, .+, \d+ s$", first), first


def test_every_figure_plot_exists():
    for path in sorted((DOCS / "figures").glob("*.txt")):
        figure, slug = figures.figure_of(path.stem)
        for name in figure.plots.values():
            plot = figure.plot_name(name, slug)
            assert (DOCS / "img" / plot).is_file(), f"{path.name}: docs/img/{plot}"


def test_a_per_machine_figure_is_named_for_its_machine(monkeypatch):
    monkeypatch.setattr(figures, "machine_slug", lambda: "amd-epyc-avx2")
    speed = figures.BY_NAME["cpu_speed"]
    assert speed.per_machine
    assert speed.stem() == "cpu_speed--amd-epyc-avx2"
    assert speed.plot_name("cpu_speed.png") == "cpu_speed--amd-epyc-avx2.png"
    assert figures.figure_of("cpu_speed--intel-xeon-amx") == (speed, "intel-xeon-amx")
    for stem in ("cpu_speed", "cpu_speed--", "targets--amd-epyc-avx2", "nope--x"):
        with pytest.raises(KeyError):
            figures.figure_of(stem)


def test_the_machine_slug_names_the_cpu_and_the_instruction_set():
    slug = figures.machine_slug()
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", slug), slug
    from vdla.compiler.targets.cpu import isa
    assert slug.endswith("-" + isa.detect().name.replace("_", "-")), slug


def test_list(capsys):
    assert figures.main(["--list"]) == 0
    out = capsys.readouterr().out
    for figure in figures.FIGURES:
        assert f"docs/figures/{figure.stem('MACHINE')}.txt" in out
        assert figure.shown_command() in out


def test_only_refuses_an_unknown_figure(capsys):
    with pytest.raises(SystemExit) as exc:
        figures.main(["--only", "no_such_figure"])
    assert exc.value.code == 2


def test_make_writes_the_figure_with_its_provenance(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path / "figures")
    monkeypatch.setattr(figures, "IMG_DIR", tmp_path / "img")
    monkeypatch.setattr(figures, "machine", lambda: "a CPU, 2 cores, AVX2")
    fake = figures.Figure("fake", "python3 -c \"print('a'); print('b'); print('c')\"",
                          "three lines", tail=2)
    ok, seconds, error = figures.make(fake, "abc1234")
    assert ok, error
    lines = (tmp_path / "figures" / "fake.txt").read_text().splitlines()
    assert lines[0].startswith("$ python3 -c \"print('a'); print('b'); print('c')\"    "
                               "# commit abc1234, ")
    assert re.search(r"a CPU, 2 cores, AVX2, load \d+\.\d, \d+ s$", lines[0])
    assert lines[1:] == ["b", "c"]


def test_only_a_change_outside_the_figures_makes_the_commit_dirty(tmp_path, monkeypatch):
    """A changed figure (a status line that starts with a space: changed in the work tree
    only) leaves the label clean; a changed source file marks it -dirty."""
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "docs" / "figures").mkdir(parents=True)
    (tmp_path / "docs" / "figures" / "a.txt").write_text("1\n")
    (tmp_path / "code.py").write_text("1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "start")
    monkeypatch.setattr(figures, "ROOT", tmp_path)
    (tmp_path / "docs" / "figures" / "a.txt").write_text("2\n")
    assert not figures.commit().endswith("-dirty")
    (tmp_path / "code.py").write_text("2\n")
    assert figures.commit().endswith("-dirty")


def test_a_failing_command_keeps_the_old_file(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)
    (tmp_path / "bad.txt").write_text("old\n")
    bad = figures.Figure("bad", "python3 -c \"raise SystemExit('broken')\"", "fails")
    ok, _, error = figures.make(bad, "abc1234")
    assert not ok and "broken" in error
    assert (tmp_path / "bad.txt").read_text() == "old\n"


def test_a_command_that_writes_no_plot_keeps_the_old_files(tmp_path, monkeypatch):
    """A command that exits 0 without its plot (a bench that had nothing to plot) fails
    the figure, naming the plot, and writes neither the text nor any plot."""
    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path / "figures")
    monkeypatch.setattr(figures, "IMG_DIR", tmp_path / "img")
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "noplot.txt").write_text("old\n")
    fake = figures.Figure("noplot", "python3 -c \"print('nothing to plot')\"", "no plot",
                          plots={"curve.png": "noplot.png"})
    ok, _, error = figures.make(fake, "abc1234")
    assert not ok and "wrote no curve.png" in error and "nothing to plot" in error
    assert (tmp_path / "figures" / "noplot.txt").read_text() == "old\n"
    assert not (tmp_path / "img").exists()


def test_the_readme_quotes_its_figures_as_the_files_hold_them():
    """The README's figure blocks are copies (GitHub cannot include snippets); the script
    rewrites them after every run, and a hand edit or a stale copy fails here."""
    text = figures.README.read_text()
    assert figures._README_BLOCK.search(text), "the README quotes no figure"
    assert figures.sync_readme(text) == text, (
        "README.md's figure blocks differ from docs/figures/: run "
        "`python3 scripts/docs_figures.py --only NAME` or copy them with sync_readme")


def test_the_readme_refuses_a_per_machine_figure():
    with pytest.raises(ValueError, match="per machine"):
        figures.sync_readme("<!-- figure cpu_speed -->\n```text\nx\n```\n")


def test_the_readme_refuses_an_unknown_figure():
    with pytest.raises(ValueError, match="does not define"):
        figures.sync_readme("<!-- figure nope -->\n```text\nx\n```\n")
