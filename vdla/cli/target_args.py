"""Targets on the command line, with no target named here: every registered target's own
options (`vdla.compiler.targets.options.TargetOption`) are added to a command's parser,
each target is built from its own (`Target.from_cli`), and an option given for a target
that does not take it is an error naming the targets that do. Also the options every
command that compiles for a target says the same way: ``--precision``, ``--chooser`` and
``--target``'s default (`DEFAULT_TARGET`), each declared here once.

    add_target_options(parser, "run")
    target = make_target(args.target, args, "run", precision=args.precision)
"""

from __future__ import annotations

from typing import Callable

from vdla.cli.common import CliError
from vdla.compiler import pipeline, targets

__all__ = ["DEFAULT_TARGET", "add_chooser_option", "add_precision_option",
           "add_target_options", "check_target_options", "make_target", "target_factory",
           "unavailable"]

#: The target of the commands that run, tune or measure a model when --target is not
#: given (run, tune, dataset) and that deploy compiles for: the simulated accelerator.
DEFAULT_TARGET = "vdla"


def _chooser_name(name: str) -> str:
    """A --chooser name as the pipeline names it now (an old name read as the new one, so
    the report and the record say the new)."""
    return pipeline.CHOOSER_ALIASES.get(name, name)


def add_chooser_option(parser) -> None:
    """``--chooser``, of the commands that compile a model (run, compile, compare,
    deploy): who picks the schedules the records do not give (`pipeline.CHOOSERS`).

    parser : the command's parser
    """
    # The names come from the pipeline (the one place they are defined): the cost
    # model's chooser, and the old names it still takes.
    aliases = pipeline.CHOOSER_ALIASES
    model = ", ".join(c for c in pipeline.CHOOSERS if c != "default" and c not in aliases)
    old = "".join(f"; {a}: {n}'s old name" for a, n in aliases.items())
    parser.add_argument("--chooser", choices=pipeline.CHOOSERS, default="default",
                        type=_chooser_name,
                        help="who picks the schedule of each tunable op that --records does "
                             "not give: default, the target's own chooser (the default); "
                             f"{model}, the target's pretrained cost model, measuring "
                             f"nothing (the target's own where it ships no model){old}")


def add_precision_option(parser) -> None:
    """``--precision``, of the commands that compile a model's graph for a target (run,
    compile, tune): which graph, the quantized or the float one (`pipeline.PRECISIONS`),
    and how closely its outputs match the reference. (``vdla roofline --precision`` names
    a GPU's tensor cores instead, and declares its own.)

    parser : the command's parser
    """
    parser.add_argument("--precision", choices=pipeline.PRECISIONS, default="int8",
                        help="int8: the quantized graph, bit-exact against its reference "
                             "(default); float32: the float graph (targets that run float "
                             f"ops), within {pipeline.FLOAT_TOLERANCE:g} relative; float16: "
                             "the float graph stored and multiplied in float16 (the gpu "
                             f"target), within {pipeline.FLOAT16_TOLERANCE:g}; bf16: its "
                             "convolutions and matrix products in bfloat16 on AMX tiles (the "
                             f"cpu target), within {pipeline.TOLERANCES['bf16']:g}")


def target_factory(name: str):
    """What makes target `name` (its class); CliError naming the known targets."""
    try:
        return targets.factory(name)
    except ValueError as e:
        raise CliError(f"{e} (see `vdla targets`)") from None


def unavailable(name: str) -> str | None:
    """Why target `name` cannot run here (`Target.unavailable`), or None."""
    return getattr(target_factory(name), "unavailable", lambda: None)()


def _declared(command: str) -> dict[str, tuple]:
    """flag -> (its `TargetOption` as the first target declares it, the names of the
    targets that take it), over every registered target, for `command`."""
    found: dict[str, tuple] = {}
    for name in targets.names():
        try:
            options = getattr(targets.factory(name), "cli_options", ())
        except Exception:  # noqa: BLE001 - a broken plug-in fails when it is picked, not here
            continue
        for option in options:
            if command in option.commands:
                first, owners = found.get(option.flag, (option, []))
                found[option.flag] = (first, owners + [name])
    return found


def add_target_options(parser, command: str) -> None:
    """Add to `parser` every option a registered target takes in `command`, each once
    (a flag two targets declare is one option, described by the first and delivered
    to both)."""
    group = parser.add_argument_group("target options", "each applies to the targets named")
    for flag, (option, owners) in _declared(command).items():
        group.add_argument(flag, dest=option.dest, type=option.type, metavar=option.metavar,
                           choices=option.choices, default=None,
                           help=f"{option.help} [{', '.join(owners)}]")


def check_target_options(args, chosen: list[str], command: str,
                         dropped: dict[str, str] | None = None) -> None:
    """CliError for an option given although none of the `chosen` targets takes it;
    `dropped` (target -> why it was left out: it cannot run here, or a comparison leaves
    it out by default) names the targets left out."""
    dropped = dropped or {}
    for flag, (option, owners) in _declared(command).items():
        if getattr(args, option.dest, None) is None or set(owners) & set(chosen):
            continue
        why = "; ".join(f"{n} is left out: {dropped[n]}" for n in owners if n in dropped)
        raise CliError(f"{flag} applies to --target{'s' if len(owners) > 1 else ''} "
                       f"{', '.join(owners)}, not to --target {', '.join(chosen)}"
                       + (f" ({why})" if why else ""))


def make_target(name: str, args, command: str, *, precision: str = "int8",
                log: Callable[[str], None] | None = None, strict: bool = True):
    """Target `name` built from its own options in `args` (the command's defaults for
    those not given), for a run at `precision` (ValueError for one it does not run). With
    `strict`, the options it does not take are refused (``--sim applies to --target vdla,
    not to --target cpu``)."""
    factory = target_factory(name)
    missing = unavailable(name)
    if missing is not None:
        raise CliError(f"--target {name}: {missing}")
    if strict:
        declared = _declared(command)
        wrong = [flag for flag, (option, owners) in declared.items()
                 if getattr(args, option.dest, None) is not None and name not in owners]
        if wrong:
            owners = sorted({o for flag in wrong for o in declared[flag][1]})
            raise CliError(f"{', '.join(wrong)} appl{'ies' if len(wrong) == 1 else 'y'} to "
                           f"--target {', '.join(owners)}, not to --target {name}")
    values = {}
    for option in getattr(factory, "cli_options", ()):
        if command in option.commands:
            given = getattr(args, option.dest, None)
            values[option.dest] = option.defaults.get(command) if given is None else given
    from_cli = getattr(factory, "from_cli", None)
    # (a plain factory registered in code has no options of its own)
    target = targets.get(name) if from_cli is None else from_cli(values, precision=precision,
                                                                  log=log)
    target.check_precision(precision)
    return target
