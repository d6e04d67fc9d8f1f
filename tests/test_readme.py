"""The README is the front page: short, with the set-up commands CI runs and links into
docs/ that resolve. Its Python examples, like the docs', run in tests/test_docs.py."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: The front page stays a front page; the rest belongs on a docs/ page.
MAX_LINES = 250


def test_readme_commands_match_ci():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in README.read_text()


def test_readme_is_a_front_page():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_LINES, (f"README.md has {lines} lines, more than {MAX_LINES}: move "
                                "the detail to a page under docs/ and link it")


def test_readme_links_resolve():
    """Relative links and images (which the site's strict build does not see) exist."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local, "the README links into docs/"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
