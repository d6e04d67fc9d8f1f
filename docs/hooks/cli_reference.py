"""MkDocs hook: the command-line reference, generated from vdla's own argparse parser.

`docs/cli.md` is a hand-written introduction with a marker line, ``<!-- cli-reference
-->``; at build time this hook replaces the marker with every command's usage,
description and options, walking the parser `vdla.cli.build_parser` returns. Walking
the real parser is what keeps the page honest: the options each target adds to `run`,
`compare`, `tune` and `compile` (`vdla/cli/target_args.py`) appear because the
registered targets add them, and a renamed or new option changes the page with no edit.
"""

from __future__ import annotations

import argparse
import re

#: The line of docs/cli.md the reference replaces.
MARKER = "<!-- cli-reference -->"
#: Usage lines are wrapped at this width, whatever the terminal building the site.
WIDTH = 88


def on_page_markdown(markdown: str, page, **_) -> str:
    if page.file.src_uri != "cli.md":
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/cli.md has lost its marker line {MARKER!r}, where the "
                         "hook writes the generated command reference")
    from vdla.cli import build_parser  # imported at build time: the installed vdla's parser
    return markdown.replace(MARKER, render(build_parser()))


def render(parser: argparse.ArgumentParser) -> str:
    """Markdown for every command under `parser`, nested commands included."""
    sections: list[str] = []
    for name, sub, summary in _commands(parser):
        _walk(sections, f"vdla {name}", sub, summary)
    return "\n".join(sections)


def _commands(parser: argparse.ArgumentParser):
    """(name, parser, one-line help) of each subcommand, in the order --help lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, sub, helps.get(name)


def _walk(sections: list[str], title: str, parser: argparse.ArgumentParser,
          summary: str | None) -> None:
    children = list(_commands(parser))
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=WIDTH)
    formatter = parser._get_formatter()
    sections.append(f"## `{title}`\n")
    if summary:
        sections.append(f"{_text(_sentence(summary))}\n")
    if parser.description:
        sections.append(f"{_text(parser.description)}\n")
    sections.append(f"```text\n{parser.format_usage().strip()}\n```\n")
    for group in parser._action_groups:
        rows = [_row(formatter, action) for action in group._group_actions
                if action.help is not argparse.SUPPRESS
                and not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))]
        if not rows:
            continue
        heading = group.title or "options"
        sections.append(f"**{_text(heading[0].upper() + heading[1:])}**"
                        + (f": {_text(group.description)}" if group.description else "")
                        + "\n")
        sections.append("| argument | meaning |\n|---|---|\n" + "\n".join(rows) + "\n")
    for name, sub, child_summary in children:
        _walk(sections, f"{title} {name}", sub, child_summary)


def _row(formatter: argparse.HelpFormatter, action: argparse.Action) -> str:
    if action.option_strings:
        metavar = formatter._format_args(action, action.dest.upper()) if action.nargs != 0 else ""
        names = ", ".join(f"`{flag}{' ' + metavar if metavar else ''}`"
                          for flag in action.option_strings)
    else:
        names = f"`{formatter._metavar_formatter(action, action.dest)(1)[0]}`"
    help_text = formatter._expand_help(action) if action.help else ""
    if action.choices is not None and action.option_strings and "{" not in names:
        help_text += f" (one of: {', '.join(map(str, action.choices))})"
    # Python-Markdown's tables leave a | inside a code span alone.
    return f"| {names} | {_text(help_text)} |"


def _sentence(text: str) -> str:
    text = text.strip()
    return text[0].upper() + text[1:] + ("" if text.endswith((".", ")")) else ".")


def _text(text: str) -> str:
    """Help text as Markdown: one line, code spans kept, the rest escaped so that `*`,
    `_`, `<` or `|` in an option's help cannot turn into markup or break a table."""
    text = " ".join(text.split())
    # An odd number of backticks would open a span that never closes: no spans then.
    parts = text.split("`") if text.count("`") % 2 == 0 else [text.replace("`", "'")]
    for i in range(0, len(parts), 2):       # outside code spans
        parts[i] = (re.sub(r"([\\*_\[\]])", r"\\\1", parts[i])
                    .replace("<", "&lt;").replace("|", "&#124;"))
    return "`".join(parts)
