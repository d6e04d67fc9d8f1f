"""``vdla run MODEL``: compile a model for a target, run it, and check it against the
reference (`vdla.compiler.pipeline.run_model`): the quantized graph bit-exactly, or with
``--precision float32`` (``float16``: the gpu target) the float graph within a tolerance.
A target that compiles the whole graph into one program (the CPU target) or launches it
back to back (the GPU target on CUDA) is also timed running it in one call."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import vdla.runtime
from vdla.cli.common import (CONFIG_HELP, CliError, board_config, format_schedule,
                             load_config, progress_line, table, write_json)
from vdla.compiler import pipeline, targets
from vdla.compiler.tuner import Records

__all__ = ["DEFAULT_BACKEND", "DEFAULT_TARGET", "add_parser", "make_target", "run"]

DEFAULT_TARGET = "vdla"
#: The accelerator's simulator without --sim.
DEFAULT_BACKEND = "verilator"
#: Options that only one target takes, by target: (attribute, flag).
_TARGET_OPTIONS = {"vdla": (("sim", "--sim"), ("config", "--config"), ("board", "--board")),
                   "cpu": (("threads", "--threads"), ("isa", "--isa")),
                   "gpu": (("device", "--device"), ("gpu", "--gpu"))}
#: Column headers of the per-op table for figures targets report in `OpStats.extra`,
#: and the unit each shows in (a fraction as a percentage otherwise).
_EXTRA_LABELS = {"gemm_utilization": "GEMM util", "gpu_seconds": "GPU ms",
                 "roofline_seconds": "roofline us (est.)"}
_EXTRA_SCALES = {"gpu_seconds": (1e3, 3), "roofline_seconds": (1e6, 3)}


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
    run_.add_argument("--sim", choices=vdla.runtime.BACKENDS,
                      help=f"the accelerator's simulator (default {DEFAULT_BACKEND}; the first "
                           "run builds the model)")
    run_.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    run_.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    run_.add_argument("--seed", type=int, default=0,
                      help="seeds the inputs (digits_cnn: the test image's index) (default 0)")
    run_.add_argument("--calibration", type=int, default=4, metavar="N",
                      help="calibration samples for quantization (default 4)")
    run_.add_argument("--batch", type=int, metavar="N",
                      help="batch size: a zoo model is built with it, an ONNX model's dynamic "
                           "batch dimension set to it (default 1; an ONNX model that fixes "
                           "another batch is an error)")
    run_.add_argument("--board", metavar="NAME",
                      help="simulate the board's config, DRAM port and memory timing, and "
                           "report time at its clock (see `vdla boards`; --config then names "
                           "a config for the board)")
    run_.add_argument("--threads", type=int, metavar="N",
                      help="OpenMP threads of the cpu target (default: its cores)")
    run_.add_argument("--isa", metavar="NAME",
                      help="instruction set of the cpu target's code: avx512vnni, avx2 or "
                           "portable (default: the best this machine's compiler offers)")
    run_.add_argument("--device", metavar="NAME",
                      help="where the gpu target's kernels run: auto (a CUDA GPU when one is "
                           "present, else Triton's interpreter on the CPU; the default), cuda "
                           "or interpreter")
    run_.add_argument("--gpu", metavar="NAME",
                      help="the gpu target also reports each op's roofline estimate on this "
                           "GPU (see `vdla roofline`)")
    run_.add_argument("--precision", choices=pipeline.PRECISIONS, default="int8",
                      help="int8: the quantized graph, checked bit-exactly (default); "
                           "float32: the float graph (targets that run float ops), checked "
                           f"within {pipeline.FLOAT_TOLERANCE:g} relative; float16: the float "
                           "graph stored and multiplied in float16 (the gpu target), within "
                           f"{pipeline.FLOAT16_TOLERANCE:g}")
    run_.add_argument("--records", metavar="DB",
                      help="compile each tunable op with its best schedule in this tuning "
                           "records file (vdla tune); the target's default for the others")
    run_.set_defaults(func=run)


def check_model_options(args) -> None:
    """CliError for a bad --calibration, --seed or --batch (vdla run and vdla compile)."""
    if args.calibration < 1:
        raise CliError(f"--calibration must be a positive integer, not {args.calibration}")
    if args.seed < 0:
        raise CliError(f"--seed must be a non-negative integer, not {args.seed}")
    if args.batch is not None and args.batch < 1:
        raise CliError(f"--batch must be a positive integer, not {args.batch}")


def make_target(args):
    """The target `args` name, with its options; (target, board or None). Each target's
    own options (`_TARGET_OPTIONS`) are refused for another target."""
    if args.target not in targets.names():
        raise CliError(f"unknown target {args.target!r}; available: "
                       f"{', '.join(targets.names())} (see `vdla targets`)")
    for owner, flags in _TARGET_OPTIONS.items():
        given = [flag for attr, flag in flags if getattr(args, attr, None) is not None]
        if given and args.target != owner:
            raise CliError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to "
                           f"--target {owner}, not to --target {args.target}")
    threads, isa = getattr(args, "threads", None), getattr(args, "isa", None)
    if threads is not None and threads < 1:
        raise CliError(f"--threads must be a positive integer, not {threads}")
    if args.target == "gpu":
        return _gpu_target(args), None
    if getattr(args, "precision", None) == "float16":
        raise CliError(f"--precision float16 runs on --target gpu only ({args.target} runs "
                       "the float graph in float32)")
    if args.target != "vdla":
        options = {k: v for k, v in (("threads", threads), ("isa", isa)) if v is not None}
        target = targets.get(args.target, **options)
        if isa is not None:
            target.isa          # an ISA this machine lacks: a clear error now
        return target, None
    board = None
    if getattr(args, "board", None):
        board, config = board_config(args.board, args.config)
    else:
        config = load_config(getattr(args, "config", None))
    backend = getattr(args, "sim", None) or DEFAULT_BACKEND
    options = {}
    if board is not None and backend == "verilator":
        options["dram"] = board.dram_timing()    # the board's memory, on the timed model
    return targets.get("vdla", config=config, backend=backend, **options), board


def _gpu_target(args):
    """The GPU target with --device, --gpu and --precision; a CliError saying how to
    install Triton when the gpu extra is missing, before any model is loaded."""
    # heavy-free: runtime checks for Triton without importing it
    from vdla.compiler.targets.gpu import runtime

    try:
        runtime.require()
    except ValueError as e:
        raise CliError(f"--target gpu: {e}") from None
    float_dtype = "float16" if getattr(args, "precision", None) == "float16" else "float32"
    target = targets.get("gpu", device=getattr(args, "device", None) or "auto",
                         float_dtype=float_dtype, gpu=getattr(args, "gpu", None))
    target.mode          # no CUDA GPU for --device cuda, ...: a clear error now
    return target


def _open_records(path: str | None) -> Records | None:
    if path is None:
        return None
    if not Path(path).is_file():
        raise CliError(f"records file {path!r} does not exist (vdla tune --records {path} "
                       "writes one)")
    return Records(path)


def _op_table(ops, simulated: set[str] = frozenset()) -> list[str]:
    """The per-op table: name, op, where it ran, schedule, cycles, wall time, GOP/s (of
    the ops whose wall time is the device's own; a simulator's says nothing of the
    hardware's speed), the targets' own figures (GEMM
    utilization), bytes moved. `simulated`: the names of the targets whose wall time is a
    simulator's."""
    # (a view's mark shows in the schedule column; the interpreter's time is the wall time)
    extras = sorted({key for s in ops for key in s.extra
                     if key not in ("view", "interpreter_seconds")})
    header = ("op", "kind", "on", "schedule", "cycles", "wall ms", "GOP/s",
              *(_EXTRA_LABELS.get(k, k.replace("_", " ")) for k in extras), "DRAM bytes")

    def gops(s) -> str:
        if s.target in simulated or not s.macs or s.wall_seconds <= 0:
            return "-"
        return f"{2 * s.macs / s.wall_seconds / 1e9:.1f}"

    def extra(key, value) -> str:
        if value is None:
            return "-"
        if key in _EXTRA_SCALES:
            scale, digits = _EXTRA_SCALES[key]
            return f"{value * scale:.{digits}f}"
        return f"{value:.1%}" if isinstance(value, float) else str(value)

    rows = [(s.name, s.op, s.target,
             "view" if s.extra.get("view") else format_schedule(s.schedule),
             "-" if s.cycles is None else f"{s.cycles:,}",
             f"{s.wall_seconds * 1e3:.2f}", gops(s),
             *(extra(k, s.extra.get(k)) for k in extras),
             "-" if s.bytes is None else f"{s.bytes:,}") for s in ops]
    return table(header, rows, right=set(range(4, len(header))))


def run(args) -> int:
    check_model_options(args)
    target, board = make_target(args)
    records = _open_records(args.records)
    if records is not None and not target.measure_backends:
        raise CliError(f"--records: target {target.name!r} has no tunable ops")
    model = pipeline.load_model(args.model, seed=args.seed, calibration=args.calibration,
                                batch=args.batch)
    compile_show, compile_done = progress_line("compiling")
    run_show, run_done = progress_line(f"running on {target.name}")
    try:
        outcome = pipeline.run_model(model, target, records=records,
                                     precision=getattr(args, "precision", "int8"),
                                     compile_progress=compile_show, run_progress=run_show)
    finally:
        compile_done()
        run_done()
        if records is not None:
            records.close()
    whole = _whole_graph(outcome) if outcome.bit_exact else None
    _report(args, target, board, outcome, whole)
    if args.json:
        write_json(args.json, _json_report(args, target, outcome, whole))
    if not outcome.bit_exact:
        raise CliError(f"{args.model}: the {target.name} outputs differ from the "
                       f"{_reference(outcome)} ({outcome.mismatch})")
    return 0


#: Runs of the whole graph in one call that `vdla run` times (their median is reported).
WHOLE_GRAPH_RUNS = 20


def _whole_graph(outcome) -> tuple[float, dict[str, float]] | None:
    """For a target that compiles the graph into one program (the CPU target): the
    median wall time of the whole graph in one call and of each op inside it, over
    `WHOLE_GRAPH_RUNS` runs after a warm-up run whose outputs must be the op-by-op run's;
    None for other targets."""
    # numpy is a heavy import; this module loads without it (vdla.cli's rule).
    import numpy as np

    with outcome.compiled.session() as session:
        first = session.run_graph(outcome.model.feed)
        if first is None:
            return None
        for name, value in first.outputs.items():
            if not np.array_equal(value, outcome.result.outputs[name]):
                raise CliError(f"the whole-graph run's output {name!r} differs from the "
                               "op-by-op run's")
        totals, per_op = [], {name: [] for name in first.op_seconds}
        for _ in range(WHOLE_GRAPH_RUNS):
            start = time.perf_counter()
            run = session.run_graph(outcome.model.feed)
            totals.append(time.perf_counter() - start)
            for name, seconds in run.op_seconds.items():
                per_op[name].append(seconds)
    return float(np.median(totals)), {k: float(np.median(v)) for k, v in per_op.items()}


def _reference(outcome) -> str:
    return "quantized reference" if outcome.precision == "int8" else "float reference"


def _report(args, target, board, outcome, whole=None) -> None:
    compiled, result = outcome.compiled, outcome.result
    mine = len(compiled.ops_on(target.name))
    where = (f"{mine} on {target.name}, {len(compiled.ops) - mine} on the host"
             if target.name != "host" else "all on the host")
    options = target.options()
    setting = (f"config {options['config']}, {options['backend']} backend"
               if target.name == "vdla" else f"target {target.name}")
    print(f"{args.model}: {len(compiled.ops)} ops ({where}), {setting}, "
          f"{outcome.model.input_note}")
    summary = result.summary.get(target.name, {})
    if board is not None:
        dram = board.dram_timing()
        print(f"board: {board.name} ({board.part.name}) at {board.clock_mhz:g} MHz, DRAM "
              f"{dram.bytes_per_cycle:g} bytes/cycle, {dram.read_latency}-cycle read latency"
              + ("" if options["backend"] == "verilator"
                 else " (the functional backend has no timing)"))
    ops = result.ops
    if whole is not None:
        # The ops' times inside one call of the compiled graph: no Python between them.
        ops = [dataclasses.replace(s, wall_seconds=whole[1][s.name]) for s in ops]
        print(f"  (wall ms: each op inside one call of the whole graph, median of "
              f"{WHOLE_GRAPH_RUNS} runs)")
    for row in _op_table(ops, {target.name} if target.simulated else set()):
        print(f"  {row}")
    for s in result.ops:
        if s.target == "host" and s.op in ("qconv2d", "qdense") and target.name != "host":
            print(f"  note: {s.name} runs on the host: {s.reason}")
    if args.records:
        tunable = {n for t in target.tasks(outcome.quantized) for n in t.nodes}
        print(f"schedules: {len(outcome.schedules)} of {len(tunable)} tunable ops from the "
              f"records {args.records}, the others from the default chooser")
    if "cycles" in summary:
        if summary["cycles"] is None:
            print(f"total cycles: - (the {summary.get('backend')} backend counts no cycles; "
                  "use --sim verilator)")
        else:
            print(f"total cycles: {summary['cycles']:,} = "
                  f"{summary['seconds_at_clock'] * 1e3:.3f} ms at {summary['clock_mhz']:g} MHz")
    if "gemm_utilization" in summary:
        print(_utilization_line(target, summary))
    if target.name == "gpu":
        for line in _gpu_lines(summary):
            print(line)
    if target.name != "host":
        for line in _host_lines(target, result, summary):
            print(line)
    prepared = "prepare + quantize" if outcome.precision == "int8" else "prepare"
    print(f"{prepared}: {outcome.quantize_seconds:.2f} s; compile: "
          f"{compiled.compile_seconds:.2f} s; run: {result.wall_seconds:.2f} s wall")
    if whole is not None:
        print(f"whole graph in one call: {whole[0] * 1e3:.3f} ms (median of "
              f"{WHOLE_GRAPH_RUNS} runs; the op-by-op run above took "
              f"{result.wall_seconds * 1e3:.1f} ms with Python between the ops)")
    if outcome.precision != "int8":
        print(f"within {pipeline.TOLERANCES[outcome.precision]:g} of the float reference: "
              f"{'yes' if outcome.bit_exact else 'NO'} (max relative error "
              f"{outcome.max_error:.2e})" + ("" if outcome.bit_exact
                                              else f" ({outcome.mismatch})"))
    else:
        print(f"bit-exact vs the quantized reference: {'yes' if outcome.bit_exact else 'NO'}"
              + ("" if outcome.bit_exact else f" ({outcome.mismatch})"))


def _gpu_lines(summary) -> list[str]:
    """Where the GPU target's kernels ran and what its times are; the roofline estimate
    on the GPU --gpu named."""
    if summary["mode"] == "cuda":
        lines = [f"gpu: {summary['device']}, {summary['float_dtype']} floats: "
                 f"{summary['gpu_seconds'] * 1e3:.3f} ms of kernels (CUDA events per op)"]
    else:
        lines = [f"gpu: no CUDA GPU here; the kernels ran on the {summary['device']} "
                 f"({summary['interpreter_seconds']:.2f} s): these times are the "
                 "interpreter's, not GPU times"
                 + ("" if summary.get("roofline_seconds") is not None
                    else " (--gpu NAME adds a roofline estimate)")]
    if summary.get("roofline_seconds") is not None:
        lines.append(f"roofline estimate on {summary['roofline_gpu']}: "
                     f"{summary['roofline_seconds'] * 1e6:.2f} us of kernels, "
                     f"{summary['roofline_with_launch_seconds'] * 1e6:.2f} us with a launch "
                     "each (datasheet peaks, not a measurement; `vdla roofline` for the "
                     "bounds)")
    return lines


def _host_lines(target, result, summary) -> list[str]:
    """What the host did besides the target's ops (its ops; the activations it moved,
    and which of those sat between two target ops: none when activations stay in the
    target's memory) and the run end to end: the target's time at its clock plus the
    host's."""
    host = result.host_time()
    kinds = sorted({s.op for s in result.ops if s.target == "host"})
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
                     "(the host repacks activations: this config's block_in and block_out "
                     "differ)")
    else:
        lines.append(f"between {target.name} ops: no host work (activations stay in "
                     f"{target.name}'s memory from producer to consumer)")
    at_clock = summary.get("seconds_at_clock")
    if at_clock is not None:
        lines.append(f"end to end: {at_clock * 1e3:.3f} ms on {target.name} at "
                     f"{summary['clock_mhz']:g} MHz + {host['seconds'] * 1e3:.3f} ms on the host "
                     f"= {(at_clock + host['seconds']) * 1e3:.3f} ms")
    return lines


def _utilization_line(target, summary) -> str:
    """The whole model's GEMM utilization and what it counts."""
    if summary["gemm_utilization"] is None:
        why = (f"the {summary.get('backend')} backend counts no cycles"
               if summary.get("cycles") is None else f"no op on {target.name} does useful MACs")
        return f"GEMM utilization: - ({why})"
    return (f"GEMM utilization: {summary['gemm_utilization']:.1%} = {summary['macs']:,} "
            f"useful MACs / ({summary['cycles']:,} cycles x {summary['macs_per_cycle']} "
            f"MACs/cycle); the cycles of the ops on {target.name} only, host ops excluded")


def _json_report(args, target, outcome, whole=None) -> dict:
    """The run as JSON: the same keys whatever the target (its own settings under
    ``options``, its totals under ``summary``, per op the `OpStats` fields)."""
    result = outcome.result
    summary = result.summary.get(target.name, {})
    host = result.host_time()
    return {"model": args.model, "target": target.name, "options": target.options(),
            "board": args.board, "input": outcome.model.input_note,
            "batch": outcome.model.batch,
            "precision": outcome.precision,
            "quantization": outcome.quantized.metadata.get("quantized", {}).get("mode"),
            # int8: bit-exact; float32, float16: within pipeline.TOLERANCES (max_error).
            "bit_exact": outcome.bit_exact, "mismatch": outcome.mismatch or None,
            "max_error": outcome.max_error,
            "whole_graph_seconds": None if whole is None else whole[0],
            # per op, inside one call of the whole graph (where the target has one)
            "whole_graph_op_seconds": None if whole is None else whole[1],
            "cycles": result.cycles, "seconds_at_clock": summary.get("seconds_at_clock"),
            # Only a target that counts cycles and MACs has it (the host: null).
            "gemm_utilization": summary.get("gemm_utilization"),
            "quantize_seconds": outcome.quantize_seconds,
            "compile_seconds": outcome.compiled.compile_seconds,
            "wall_seconds": result.wall_seconds, "summary": result.summary,
            # The host's ops and activation moves (`RunResult.host_time`), each move, and
            # the run end to end: the target's time at its clock plus the host's.
            "host": host,
            "transfers": [dataclasses.asdict(t) for t in result.transfers],
            "end_to_end_seconds": (None if summary.get("seconds_at_clock") is None else
                                   summary["seconds_at_clock"] + host["seconds"]),
            "records": args.records, "tuned_ops": sorted(outcome.schedules),
            "ops": [s.to_dict() for s in result.ops]}
