"""What a target tells the command line about itself, so that the CLI names no target.

A target class lists its own command-line options (`Target.cli_options`, each a
`TargetOption`) and builds itself from their values (`Target.from_cli`); it says how
the figures it puts in `OpStats.extra` show in a table (`ExtraColumn`) and may offer a
second column of estimates beside its measurements in ``vdla compare``
(`EstimateColumn`). ``vdla run --target NAME``, ``vdla compare``, ``vdla tune`` and
``vdla compile`` add every registered target's options to their parsers and hand each
target only its own; an option given for a target that does not take it is an error
naming the targets that do.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

__all__ = ["COMMANDS", "EstimateColumn", "ExtraColumn", "TargetOption"]

#: The commands that build targets from their options.
COMMANDS = ("run", "compare", "tune", "compile", "targets")


@dataclasses.dataclass(frozen=True)
class TargetOption:
    """One command-line option of a target.

    flag : the option as typed (``--threads``); its value reaches `Target.from_cli`
        under `dest`, the flag without its dashes and with ``_`` for ``-``
    help : one line for ``--help``; the CLI adds which targets take it
    type : turns the text into the value (``int``, ``str``); argparse reports a bad one
    metavar, choices : as argparse's
    commands : the commands that take it (of `COMMANDS`)
    defaults : the value when the option is not given, per command (command -> value);
        None for a command not named (the target then picks its own default)
    """

    flag: str
    help: str
    type: Callable[[str], Any] = str
    metavar: str | None = None
    choices: tuple | None = None
    commands: tuple[str, ...] = ("run", "tune", "compile")
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not self.flag.startswith("--") or not self.dest.isidentifier():
            raise ValueError(f"a target option's flag must look like --name, not "
                             f"{self.flag!r}")
        unknown = set(self.commands) - set(COMMANDS)
        if unknown:
            raise ValueError(f"option {self.flag}: unknown command(s) "
                             f"{', '.join(sorted(unknown))}; known: {', '.join(COMMANDS)}")

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")


@dataclasses.dataclass(frozen=True)
class ExtraColumn:
    """How one figure of `OpStats.extra` shows in the per-op table.

    header : the column's heading
    scale : what the value is multiplied by (seconds -> ms: 1e3); None: a fraction shown
        as a percentage
    digits : decimals after scaling
    hidden : not a column (a figure that another column already shows)
    """

    header: str
    scale: float | None = None
    digits: int = 3
    hidden: bool = False

    def format(self, value) -> str:
        if value is None:
            return "-"
        if self.scale is None:
            return f"{value:.1%}" if isinstance(value, float) else str(value)
        return f"{value * self.scale:.{self.digits}f}"


@dataclasses.dataclass(frozen=True)
class EstimateColumn:
    """A column of estimates a target adds beside its measured one (``vdla compare``).

    label : the column's heading
    note : what its times are (it is printed under the table and marks the column as an
        estimate in the chart)
    op_seconds : an op's estimated seconds, from its `OpStats`
    """

    label: str
    note: str
    op_seconds: Callable[[Any], float]
