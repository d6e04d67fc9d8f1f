"""Rules over every file of the repository, not only the package's modules (those are
tests/test_imports.py's): no file cites a tracker issue by its number, and no Python file
is too long to read.

An issue number says nothing to a reader without the tracker at hand, and the tracker
may move or go: code, docs, tests, benchmarks and configs say what a figure, a fix or a
limit is for instead. A link to another project's tracker (a bug in a tool vdla works
around) is a citation of that project, and is allowed.

The files are those git tracks, and the new ones it does not ignore (so that a file is
checked before it is committed); those deleted in the working tree are skipped."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Lines no Python file may have, whatever its docstring says (tests/test_imports.py's
#: `MAX_LINES` is where a package module must start saying why it is long).
HARD_MAX_LINES = 800
#: This project's name, as its repository's would be in a tracker's address.
PROJECT = "vdla"

#: What a citation of an issue (or pull request) by number looks like. Each pattern
#: needs a word that makes the number a tracker's: a bare "#1" is a node's index in an
#: error message, "#222" a colour, "(#0, Add)" a node named with its index.
CITATIONS = [
    # the word issue (or ticket, bug; plural, any case) then a number: with a space, a
    # hash, a dash, a colon or "no." between them, or across a line break (where the next
    # line may start with a comment's mark)
    re.compile(r"\b(?:issues?|tickets?|bugs?)(?:[ \t]*(?:no\.?|nr\.?|number)?[ \t]*[#:-]?"
               r"|[ \t]*\n[ \t]*(?:#|//|\*|--|;)?)[ \t]*#?\d+\b", re.IGNORECASE),
    # a hash (or a dash) and a number after PR, pull request, GH, fixes, closes,
    # resolves, see or cf.
    re.compile(r"\b(?:prs?|pull[ \t]+requests?|gh|fix(?:es|ed)?|clos(?:es|ed)|"
               r"resolv(?:es|ed)|see|cf\.?)[ \t]*(?:#|-(?=\d))[ \t]*\d+\b", re.IGNORECASE),
    # hashed numbers alone in parentheses, one or a list of them
    re.compile(r"\([ \t]*#\d+(?:[ \t]*(?:,|and)[ \t]*#\d+)*[ \t]*\)", re.IGNORECASE),
    # a link to this project's own tracker
    re.compile(rf"/{PROJECT}/(?:-/)?(?:issues|pull|merge_requests)/\d+", re.IGNORECASE),
]
#: A link to another project's tracker (``https://github.com/OWNER/REPO/issues/N``,
#: GitLab's ``/-/issues/N``): removed from a line before it is searched.
OTHER_TRACKER = re.compile(r"https?://[^\s/]+/[\w.-]+/(?P<repo>[\w.-]+)/(?:-/)?"
                           r"(?:issues|pull|merge_requests)/\d+\b")


def repository_files() -> list[Path]:
    """Every file git tracks or would track (not ignored), that exists now."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    return sorted({ROOT / name for name in listed if name and (ROOT / name).is_file()})


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file (a NUL byte, or not UTF-8)."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def citations(text: str) -> list[tuple[int, str]]:
    """(line number, the citation) of every issue number `text` cites."""
    # Another project's tracker, linked, is a citation of that project, not of ours: each
    # such link is blanked out (with as many characters, so the line numbers hold).
    text = OTHER_TRACKER.sub(
        lambda m: m[0] if m["repo"].lower() == PROJECT else " " * len(m[0]), text)
    return sorted((text.count("\n", 0, m.start()) + 1, m[0])
                  for pattern in CITATIONS for m in pattern.finditer(text))


FILES = repository_files()


def test_the_files_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in FILES}
    assert {"README.md", "pyproject.toml", "tests/test_repository.py"} <= names
    assert any(n.startswith("docs/") for n in names) and len(names) > 300


# The examples are built from parts, so that this file does not cite what it shows.
ISSUE, HASH = "issue", "#"


@pytest.mark.parametrize("text", [
    f"{ISSUE} 37", f"{ISSUE} {HASH}37", f"{ISSUE.title()}-37", f"{ISSUE}s 37 and 40",
    f"the fix ({HASH}37)", f"({HASH}37, {HASH}40)", f"see {HASH}12", f"PR {HASH}9",
    "gh" + "-37", f"https://github.com/someone/{PROJECT}/{ISSUE}s/37",
    f"{ISSUE}: 37", f"{ISSUE} no. 37", f"before {ISSUE}\n38: the old", f"{ISSUE}\n# 38 asks"])
def test_a_citation_is_found(text):
    assert citations(f"a line with {text} in it"), text


@pytest.mark.parametrize("text", [
    "#include <stdint.h>", "color: #222;", "node 'conv' (#0, Conv): bad", "C8#2",
    "sha256 9f2c4e7a1b3d", "the op's input #1", f"https://github.com/numpy/numpy/{ISSUE}s/37",
    f"https://gitlab.com/group/tool/-/{ISSUE}s/12", "the tissue 3", "reissue 3 loads",
    f"known {ISSUE}s:\n\n1. the first"])
def test_legitimate_text_is_not_a_citation(text):
    assert not citations(text), text


def test_no_file_cites_a_tracker_issue_number():
    """Say what the number referred to instead (`git log -S` finds where it came in)."""
    bad = []
    for path in FILES:
        text = text_of(path)
        if text is None:
            continue
        bad += [f"{path.relative_to(ROOT)}:{lineno}: {what!r}"
                for lineno, what in citations(text)]
    assert not bad, ("tracker issue numbers cited (say what the issue was about "
                     "instead):\n" + "\n".join(bad))


def test_no_python_file_is_over_the_hard_limit():
    """No Python file of the repository (the package, tests, benchmarks, scripts) over
    `HARD_MAX_LINES` lines, with no way out: past it a module is split along its seams
    (tests/test_imports.py lets a package module pass 600 lines if it says why)."""
    long = sorted((n, path.relative_to(ROOT).as_posix()) for path in FILES
                  if path.suffix == ".py"
                  and (n := len(path.read_text(errors="replace").splitlines()))
                  > HARD_MAX_LINES)
    assert not long, (f"Python files over {HARD_MAX_LINES} lines (split them): "
                      + ", ".join(f"{name} ({n})" for n, name in reversed(long)))
