"""``vdla run MODEL``: compile a model for a target, run it, and check it against the
reference (`vdla.compiler.pipeline.run_model`): the quantized graph bit-exactly, or with
``--precision float32`` (``float16``: the gpu target) the float graph within a tolerance.
A target that compiles the whole graph into one program (the CPU target) or launches it
back to back (the GPU target on CUDA) is also timed running it in one call."""

from __future__ import annotations

import dataclasses
import os

from vdla.cli.common import (WHOLE_GRAPH_RUNS, CliError, add_batch_option,
                             add_calibration_option, add_float_nonlinear_option,
                             add_input_option, add_ray_option, add_records_option,
                             add_seed_option, check_model_options, log, open_records,
                             output_file, progress_line, table, whole_graph, write_json)
from vdla.cli.target_args import (DEFAULT_TARGET, add_chooser_option, add_precision_option,
                                  add_target_options, make_target)
from vdla.compiler import pipeline, targets
from vdla.compiler.targets.base import WALL
from vdla.compiler.targets.options import ExtraColumn

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    run_ = sub.add_parser("run", help="compile a model for a target (the simulated "
                                      "accelerator by default), run it and check it "
                                      "bit-exactly against the quantized reference")
    run_.add_argument("model", metavar="MODEL",
                      help="zoo model name (resnet18, digits_cnn, small_cnn, ...) or an .onnx path")
    run_.add_argument("--target", default=DEFAULT_TARGET, metavar="NAME",
                      help=f"where it runs: {', '.join(targets.names())} (default "
                           f"{DEFAULT_TARGET}; see `vdla targets`); ops the target does not "
                           "run fall back to the host")
    run_.add_argument("--json", type=output_file,
                      metavar="PATH", help="also write the results as JSON here")
    add_seed_option(run_)
    add_calibration_option(run_)
    add_batch_option(run_)
    add_input_option(run_)
    add_float_nonlinear_option(run_)
    add_precision_option(run_)
    add_records_option(run_)
    add_chooser_option(run_)
    run_.add_argument("--jobs", type=int, default=_default_jobs(), metavar="N",
                      help="simulate the ops of a target that runs them apart (vdla) in N "
                           "worker processes at once, each fed its inputs from the reference: "
                           "the same cycles and outputs as one after another (default: the "
                           f"cores, {_default_jobs()}; 1 runs them in order in this process)")
    add_ray_option(run_, "simulate the ops on Ray instead")
    run_.add_argument("--chain", action="store_true",
                      help="with --jobs or --ray: each worker runs consecutive ops, feeding "
                           "each from the one before it, and only the first from the reference")
    run_.add_argument("--remote", metavar="HOST:PORT",
                      help="run on the accelerator `vdla serve` serves there (a board's), "
                           "compiling here for its config; the ops run one after another")
    run_.add_argument("--key-file", metavar="PATH",
                      help="with --remote: the client.key `vdla serve --new-key` wrote "
                           "(default $VDLA_REMOTE_KEY_FILE)")
    run_.add_argument("--remote-wait", type=float, default=0.0, metavar="S",
                      help="with --remote: wait up to S seconds while another session "
                           "holds the server's device (default 0: report it busy)")
    add_target_options(run_, "run")
    run_.set_defaults(func=run)


def _remote(args, target):
    """(the `RemoteDevice` at ``--remote``, the target compiling for its config). CliError
    for another target than the accelerator, a config the server does not have, a key
    missing, or a server that cannot be reached or refuses the key."""
    # Imported here: sockets and the runtime, only for --remote (heavy: numpy).
    from vdla.runtime.remote import RemoteDevice, RemoteError, read_key

    if args.ray:
        raise CliError("--remote and --ray: one runs the ops on the remote accelerator, the "
                       "other on a cluster; give one")
    try:
        device = RemoteDevice(args.remote, key=read_key(args.key_file),
                              wait=args.remote_wait)
    except (ValueError, RemoteError) as exc:
        raise CliError(str(exc)) from None
    try:
        remote = target.on_device(device)
    except ValueError as exc:
        device.close()
        raise CliError(str(exc)) from None
    chosen = getattr(args, "config", None) or getattr(args, "board", None)
    if chosen and getattr(target, "config", None) != device.config:
        device.close()
        raise CliError(f"--remote {args.remote} runs config {device.config.name}; this run "
                       f"asks for {target.config.name}: drop --config/--board to compile for "
                       "the server's")
    return device, remote


def _default_jobs() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)


def _check_parallel_options(args) -> None:
    """CliError for a bad --jobs, or --chain with one job and no --ray."""
    if args.jobs < 1:
        raise CliError(f"--jobs must be a positive integer, not {args.jobs}")
    if args.chain and args.jobs == 1 and not args.ray:
        raise CliError("--chain cuts the ops among several workers: give --jobs N > 1 or "
                       "--ray")


def _op_table(ops, target) -> list[str]:
    """The per-op table: name, op, where it ran, schedule (in the target's words), cycles,
    wall time, GOP/s (of the ops whose wall time is the device's own; a simulator's says
    nothing of the hardware's speed), the target's own figures (`Target.extra_columns`:
    GEMM utilization, GPU time), bytes moved."""
    columns = dict(target.extra_columns)
    # (a view's mark shows in the schedule column)
    extras = [key for key in sorted({key for s in ops for key in s.extra})
              if key != "view" and not columns.get(key, ExtraColumn("")).hidden]
    shown = {key: columns.get(key, ExtraColumn(key.replace("_", " "), None)) for key in extras}
    header = ("op", "kind", "on", "schedule", "cycles", "wall ms", "GOP/s",
              *(shown[k].header for k in extras), "DRAM bytes")

    def gops(s) -> str:
        if (s.target == target.name and target.simulated) or not s.macs or s.wall_seconds <= 0:
            return "-"
        return f"{2 * s.macs / s.wall_seconds / 1e9:.1f}"

    def schedule(s) -> str:
        if s.extra.get("view"):
            return "view"
        return "-" if s.schedule is None else target.describe_schedule(s.schedule)

    rows = [(s.name, s.op, s.target, schedule(s),
             "-" if s.cycles is None else f"{s.cycles:,}",
             f"{s.wall_seconds * 1e3:.2f}", gops(s),
             *(shown[k].format(s.extra.get(k)) for k in extras),
             "-" if s.bytes is None else f"{s.bytes:,}") for s in ops]
    return table(header, rows, right=set(range(4, len(header))))


def run(args) -> int:
    check_model_options(args)
    _check_parallel_options(args)
    target = make_target(args.target, args, "run", precision=args.precision, log=log)
    records = open_records(args.records)
    if records is not None and not target.measure_backends:
        raise CliError(f"--records: target {target.name!r} has no tunable ops")
    device, jobs = None, args.jobs
    if getattr(args, "remote", None):
        device, target = _remote(args, target)
        jobs = 1      # one accelerator: the ops run in order on it
    elif getattr(args, "key_file", None):
        raise CliError("--key-file goes with --remote HOST:PORT")
    model = pipeline.load_model(args.model, seed=args.seed, calibration=args.calibration,
                                batch=args.batch, inputs=args.input)
    compile_show, compile_done = progress_line("compiling")
    run_show, run_done = progress_line(f"running on {target.name}")
    try:
        outcome = pipeline.run_model(model, target, records=records,
                                     precision=getattr(args, "precision", "int8"),
                                     compile_progress=compile_show, run_progress=run_show,
                                     jobs=jobs, ray=args.ray, chain=args.chain,
                                     chooser=args.chooser, device=device,
                                     integer_nonlinear=not args.float_nonlinear)
    finally:
        compile_done()
        run_done()
        if records is not None:
            records.close()
        if device is not None:
            device.close()
    whole = whole_graph(outcome) if outcome.bit_exact else None
    if args.json:   # before the report: a closed stdout (`| head`) ends the command
        write_json(args.json, _json_report(args, target, outcome, whole))
    _report(args, target, outcome, whole, device)
    if not outcome.bit_exact:
        raise CliError(f"{args.model}: the {target.name} outputs differ from the "
                       f"{_reference(outcome)} ({outcome.mismatch})")
    return 0


def _reference(outcome) -> str:
    return "quantized reference" if outcome.precision == "int8" else "float reference"


def _report(args, target, outcome, whole=None, device=None) -> None:
    compiled, result = outcome.compiled, outcome.result
    mine = len(compiled.ops_on(target.name))
    where = (f"{mine} on {target.name}, {len(compiled.ops) - mine} on the host"
             if target.name != targets.HOST else "all on the host")
    print(f"{args.model}: {len(compiled.ops)} ops ({where}), {target.title()}, "
          f"{outcome.model.input_note}")
    if device is not None:
        print(f"  ran on the accelerator `vdla serve` serves at {args.remote} "
              f"({device.backend} backend)")
    summary = result.summary.get(target.name, {})
    ops = result.ops
    if whole is not None:
        # The ops' times inside one call of the compiled graph: no Python between them.
        ops = [dataclasses.replace(s, wall_seconds=whole[1][s.name]) for s in ops]
        print(f"  (wall ms: each op inside one call of the whole graph, median of "
              f"{WHOLE_GRAPH_RUNS} runs)")
    for row in _op_table(ops, target):
        print(f"  {row}")
    if target.name != targets.HOST:
        for line in host_op_lines(result.ops):
            print(f"  {line}")
    if args.records or args.chooser != "default":
        tunable = {n for t in target.tasks(outcome.quantized) for n in t.nodes}
        print("schedules: " + (f"{len(outcome.schedules)} of {len(tunable)} tunable ops from "
                               f"the records {args.records}, the others" if args.records
                               else f"{len(tunable)} tunable ops")
              + f" from the {args.chooser} chooser")
    # A target that ran nothing has no totals, and "no host work between its ops"
    # would read as if it had run them: say so instead (at the end, on stderr).
    ran_nothing = target.name != targets.HOST and mine == 0
    if not ran_nothing:
        for line in target.report_lines(summary):
            print(line)
        if target.name != targets.HOST:
            for line in _host_lines(target, result):
                print(line)
    prepared = "prepare + quantize" if outcome.precision == "int8" else "prepare"
    print(f"{prepared}: {outcome.quantize_seconds:.2f} s; compile: "
          f"{compiled.compile_seconds:.2f} s; run: {outcome.run_seconds:.2f} s wall"
          + (f" (ops on {outcome.parallel}: {outcome.simulate_seconds:.2f} s)"
             if outcome.parallel else ""))
    if whole is not None:
        print(f"whole graph in one call: {whole[0] * 1e3:.3f} ms (median of "
              f"{WHOLE_GRAPH_RUNS} runs; the op-by-op run above took "
              f"{result.wall_seconds * 1e3:.1f} ms with Python between the ops)")
        if whole[2]:
            print(f"layout conversions inside it: {len(whole[2])} in "
                  f"{sum(whole[2].values()) * 1e3:.3f} ms ("
                  + ", ".join(f"{name.removeprefix('layout:')} {seconds * 1e3:.3f} ms"
                              for name, seconds in whole[2].items()) + ")")
    if outcome.precision != "int8":
        print(f"within {pipeline.TOLERANCES[outcome.precision]:g} of the float reference: "
              f"{'yes' if outcome.bit_exact else 'NO'} (max relative error "
              f"{outcome.max_error:.2e})" + ("" if outcome.bit_exact
                                              else f" ({outcome.mismatch})"))
    else:
        print(f"bit-exact vs the quantized reference: {'yes' if outcome.bit_exact else 'NO'}"
              + ("" if outcome.bit_exact else f" ({outcome.mismatch})"))
    if ran_nothing:
        # Exit status stays 0: the model ran and matched its reference (on the host); the
        # warning is for the person who expected the target to run it, and the JSON's
        # ops_on_target (0) for a script.
        log(f"warning: {no_op_warning(target.name, result.ops, outcome.precision)}")


def host_op_lines(ops) -> list[str]:
    """The footnote of a run's table on a target other than the host: each op that fell
    back to the host and why (``ops on the host: NAME - REASON``); none if none did."""
    host = [s for s in ops if s.target == targets.HOST]
    if not host:
        return []
    width = max(len(s.name) for s in host)
    return ["ops on the host (why):"] + [f"  {s.name:<{width}}  {s.reason or '-'}"
                                         for s in host]


def no_op_warning(target: str, ops, precision: str) -> str:
    """What a run whose target ran no op says: that every op fell back to the host, and
    the first of the reasons (all of them are in the table's footnote)."""
    reasons = list(dict.fromkeys(s.reason for s in ops if s.reason))
    why = reasons[0] if reasons else "no reason given"
    more = f"; and {len(reasons) - 1} more, listed under the table" if len(reasons) > 1 else ""
    hint = ("; --precision int8 (the default) runs the quantized graph"
            if precision != "int8" else "")
    return f"{target} ran no op: every op fell back to the host ({why}{more}){hint}"


def _device_time(target, result) -> tuple[float, str] | None:
    """The target's ops' device time in total and what it is (`OpStats.device_time`),
    or None when some of it is only wall time (a simulator without cycles: nothing to
    add to the host's)."""
    ops = [s for s in result.ops if s.target == target.name]
    kinds = {s.device_time for s in ops}
    if not ops or WALL in kinds:
        return None
    return sum(s.device_seconds for s in ops), " + ".join(sorted(kinds))


def _host_lines(target, result) -> list[str]:
    """What the host did besides the target's ops (its ops; the activations it moved,
    and which of those sat between two target ops: none when activations stay in the
    target's memory) and the run end to end: the target's device time plus the host's."""
    host = result.host_time()
    kinds = sorted({s.op for s in result.ops if s.target == targets.HOST})
    moved = ", ".join(f"{t.tensor} {'to ' + t.target if t.direction == 'to_target' else 'back'}"
                      for t in result.transfers[:4]) + (", ..." if len(result.transfers) > 4
                                                        else "")
    lines = [f"host: {host['ops']} ops in {host['op_seconds'] * 1e3:.2f} ms"
             + (f" ({', '.join(kinds)})" if kinds else "")
             + f"; {host['transfers']} activation transfers, {host['transfer_bytes']:,} bytes "
             f"in {host['transfer_seconds'] * 1e3:.2f} ms" + (f" ({moved})" if moved else "")]
    if host["between_transfers"]:
        lines.append(f"between {target.name} ops: {host['between_transfers']} transfers, "
                     f"{host['between_bytes']:,} bytes in {host['between_seconds'] * 1e3:.2f} ms "
                     f"(the host repacks activations between {target.name} ops)")
    else:
        lines.append(f"between {target.name} ops: no host work (activations stay in "
                     f"{target.name}'s memory from producer to consumer)")
    device = _device_time(target, result)
    if device is not None:
        seconds, what = device
        lines.append(f"end to end: {seconds * 1e3:.3f} ms on {target.name} ({what}) + "
                     f"{host['seconds'] * 1e3:.3f} ms on the host = "
                     f"{(seconds + host['seconds']) * 1e3:.3f} ms")
    return lines


def _json_report(args, target, outcome, whole=None) -> dict:
    """The run as JSON: the same keys whatever the target (its own settings under
    ``options``, its totals under ``summary``, per op the `OpStats` fields)."""
    result = outcome.result
    summary = result.summary.get(target.name, {})
    host = result.host_time()
    device = _device_time(target, result)
    return {"model": args.model, "target": target.name,
            # A --remote run's target names the server's backend (`VdlaTarget.on_device`).
            "options": target.options(),
            "board": target.options().get("board"), "input": outcome.model.input_note,
            "batch": outcome.model.batch,
            "precision": outcome.precision,
            "quantization": outcome.quantized.metadata.get("quantized", {}).get("mode"),
            # int8: bit-exact; float32, float16: within pipeline.TOLERANCES (max_error).
            "bit_exact": outcome.bit_exact, "mismatch": outcome.mismatch or None,
            "max_error": outcome.max_error,
            "whole_graph_seconds": None if whole is None else whole[0],
            # per op, inside one call of the whole graph (where the target has one)
            "whole_graph_op_seconds": None if whole is None else whole[1],
            # the CPU target's layout conversions between ops, inside the same call
            "whole_graph_layout_seconds": None if whole is None else whole[2],
            "cycles": result.cycles, "seconds_at_clock": summary.get("seconds_at_clock"),
            # Only a target that counts cycles and MACs has it (the host: null).
            "gemm_utilization": summary.get("gemm_utilization"),
            "quantize_seconds": outcome.quantize_seconds,
            "compile_seconds": outcome.compiled.compile_seconds,
            # The run's wall time (a parallel run's: the reference that feeds it, the ops
            # on the workers, the replay) and where its ops ran in parallel (or null).
            "wall_seconds": outcome.run_seconds, "parallel": outcome.parallel,
            "simulate_seconds": outcome.simulate_seconds,
            "summary": result.summary,
            # How many ops ran on the target (0: all fell back to the host; see "ops").
            "ops_on_target": len(outcome.compiled.ops_on(target.name)),
            # The host's ops and activation moves (`RunResult.host_time`), each move, and
            # the run end to end: the target's time at its clock plus the host's.
            "host": host,
            "transfers": [dataclasses.asdict(t) for t in result.transfers],
            # The target's ops' device time (`OpStats.device_time`: cycles at the clock, a
            # GPU's events; null where it is only wall time) and with the host's.
            "device_seconds": None if device is None else device[0],
            "device_time": None if device is None else device[1],
            "end_to_end_seconds": None if device is None else device[0] + host["seconds"],
            "records": args.records, "tuned_ops": sorted(outcome.schedules),
            "ops": [s.to_dict() for s in result.ops]}
