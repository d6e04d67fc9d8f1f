"""How many files name each hardware extension: the measure of how far one extension
spreads through the repository, so that adding or changing one stays a small, known edit.

    python scripts/extension_footprint.py            # a table
    python scripts/extension_footprint.py --files    # the table, then each extension's files
    python scripts/extension_footprint.py --json     # the same as JSON

For each extension past VTA (`vdla.extensions.EXTENSIONS`: its config field and the other
identifiers that name it, such as ``REQ`` or a derived property), the files git
tracks or would track (``git ls-files --cached --others --exclude-standard``: new files
count before they are committed, ignored ones never) outside tests/ whose text has one of those identifiers as a whole word,
counted in three kinds: code (Python, C++, Verilog, Tcl), docs (Markdown) and data (JSON,
TOML and the rest). This script is left out: it names every extension by construction.
A test (tests/vdla/test_extensions.py) holds the code count of one extension at most at
its measured value, so an extension that starts spreading again fails it.

Needs git and a checkout (it lists the files); imports only the standard library
and `vdla.extensions` (itself standard library only).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: File suffixes counted as code; ``.md`` is docs; everything else is data.
CODE_SUFFIXES = (".py", ".cpp", ".h", ".hpp", ".c", ".v", ".sv", ".tcl", ".sh")

#: The identifiers that name each extension when `vdla.extensions` is not importable
#: (a checkout from before the registry): the same words it declares, so that counts
#: taken before and after the registry came compare.
FALLBACK_NAMES = {
    "req": ("REQ",),
    "hold": ("alu_hold",),
    "dw": ("dw_taps", "dw_column_rows", "dw_window_rows", "dw_pass_cycles"),
    "dsp": ("gemm_dsp_limit", "gemm_lut_multipliers"),
}


def extension_names() -> dict[str, tuple[str, ...]]:
    """Each extension's key and the identifiers that name it, from the registry when
    there is one (so a new extension is counted without editing this script)."""
    sys.path.insert(0, str(ROOT))
    try:
        from vdla.extensions import EXTENSIONS
    except ImportError:   # a checkout from before the registry: the same words
        return dict(FALLBACK_NAMES)
    finally:
        sys.path.remove(str(ROOT))
    return {ext.key: ext.identifiers for ext in EXTENSIONS}


def kind_of(path: str) -> str:
    """``code``, ``docs`` or ``data`` for a repository path, by its suffix."""
    if path.endswith(".md"):
        return "docs"
    return "code" if path.endswith(CODE_SUFFIXES) else "data"


def tracked_files(root: Path) -> list[str]:
    """The files outside tests/ that git tracks or would track (not ignored), as paths
    relative to `root`; the ones deleted in the working tree (moved, not yet committed)
    are left out, so the count is the working tree's as it would be committed."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=root, check=True, capture_output=True).stdout.decode()
    this = Path(__file__).resolve().relative_to(ROOT).as_posix()
    return sorted(p for p in out.split("\0")
                  if p and not p.startswith("tests/") and p != this and (root / p).is_file())


def footprint(root: Path = ROOT,
              names: dict[str, tuple[str, ...]] | None = None) -> dict[str, dict[str, list[str]]]:
    """For each extension, its files by kind: ``{key: {"code": [...], "docs": [...],
    "data": [...]}}``.

    root : the checkout to count in
    names : extension key -> identifiers; default `extension_names()`
    """
    names = extension_names() if names is None else names
    patterns = {key: re.compile(r"\b(?:%s)\b" % "|".join(map(re.escape, words)))
                for key, words in names.items()}
    found: dict[str, dict[str, list[str]]] = {
        key: {"code": [], "docs": [], "data": []} for key in names}
    for path in tracked_files(root):
        try:
            text = (root / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):   # binary files name nothing
            continue
        for key, pattern in patterns.items():
            if pattern.search(text):
                found[key][kind_of(path)].append(path)
    return found


def table(found: dict[str, dict[str, list[str]]], names: dict[str, tuple[str, ...]],
          files: bool = False) -> str:
    """The counts as a fixed-width table; with `files`, each extension's files after it."""
    lines = [f"{'extension':<10} {'code':>5} {'docs':>5} {'data':>5} {'total':>6}  identifiers"]
    for key, kinds in found.items():
        counts = [len(kinds[k]) for k in ("code", "docs", "data")]
        lines.append(f"{key:<10} {counts[0]:>5} {counts[1]:>5} {counts[2]:>5} "
                     f"{sum(counts):>6}  {', '.join(names[key])}")
    if files:
        for key, kinds in found.items():
            lines.append(f"\n{key}:")
            lines += [f"  {kind:<5} {path}" for kind in ("code", "docs", "data")
                      for path in kinds[kind]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--files", action="store_true", help="list each extension's files")
    args = parser.parse_args(argv)
    names = extension_names()
    found = footprint(ROOT, names)
    if args.json:
        print(json.dumps({key: {"identifiers": list(names[key]),
                                "counts": {k: len(v) for k, v in kinds.items()},
                                "files": kinds} for key, kinds in found.items()}, indent=2))
    else:
        print(table(found, names, files=args.files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
