"""``vdla compare MODEL``: one quantized model on every target, outputs checked against
each other and the reference, time per op group and in total, a table and a chart.

Each target says what its times are (`OpStats.device_time`: the accelerator's cycles at
its clock, a GPU's CUDA events, the host's wall time) and may add a column of estimates
beside its own (`Target.estimate_column`: the GPU target's roofline on the GPU ``--gpu``
names), labelled as an estimate. Without ``--targets`` the comparison takes the targets
that run here at their own speed (`Target.left_out_by_default`: the GPU target only on a
CUDA GPU, not on Triton's interpreter) and says which it left out and why; a target
named in ``--targets`` that cannot run here is an error.

``--reference onnxruntime,openvino`` adds other runtimes' columns as speed references
(`vdla.compiler.baseline`, `vdla.compiler.baseline_openvino`): both run the float model
exported to ONNX and the static QDQ int8 model onnxruntime's quantizer writes of it, on
the CPU target's thread count; ``--onnxruntime`` is ``--reference onnxruntime``."""

from __future__ import annotations

import collections
import io
import tempfile
import time
from pathlib import Path

from vdla._fileio import atomic_write
from vdla.cli.common import (WHOLE_GRAPH_RUNS, CliError, add_calibration_option,
                             add_float_nonlinear_option, add_input_option, add_records_option, add_seed_option, check_model_options, log,
                             open_records, output_file, table, whole_graph, write_json)
from vdla.cli.target_args import (add_chooser_option, add_target_options,
                                  check_target_options, make_target, target_factory,
                                  unavailable)
from vdla.compiler import baseline, baseline_openvino, pipeline, targets
from vdla.compiler.passes import prepare

__all__ = ["GROUPS", "add_parser", "run"]

#: Op groups of the comparison (op -> group); other ops are "other". Transformers' ops
#: are grouped like onnxruntime's kernels in its columns (`baseline.OP_GROUPS`):
#: attention with its softmax, LayerNorm as "norm", the embedding's gather.
GROUPS = {**dict.fromkeys(("qconv2d", "conv2d"), "conv"),
          **dict.fromkeys(("qdense", "dense", "matmul", "qmatmul"), "dense"),
          **dict.fromkeys(("max_pool2d", "qavg_pool2d", "qglobal_avg_pool2d", "avg_pool2d",
                           "global_avg_pool2d"), "pool"),
          **dict.fromkeys(("qadd", "add", "mul", "relu", "clip", "sub", "div", "pow", "sqrt",
                           "erf", "tanh", "exp", "neg", "where", "gelu", "qgelu", "equal",
                           "less", "greater"), "elementwise"),
          **dict.fromkeys(("attention", "qattention", "softmax", "qsoftmax", "reduce_max",
                           "reduce_sum"), "attention"),
          **dict.fromkeys(("layer_norm", "qlayer_norm", "reduce_mean"), "norm"),
          **dict.fromkeys(("gather",), "embedding"),
          **dict.fromkeys(("quantize", "dequantize"), "quantize"),
          **dict.fromkeys(("flatten", "reshape", "transpose", "concat", "pad", "slice",
                           "expand", "cast"), "layout")}
#: The targets compared without --targets, in this order, each where it runs here at its
#: own speed (`Target.left_out_by_default`: gpu on a CUDA GPU, not on the interpreter).
DEFAULT_TARGETS = ("vdla", "cpu", "gpu", "host")
#: The reference runtimes ``--reference`` takes, their columns in this order, each with
#: its module (`available` says what to install).
REFERENCES = {"onnxruntime": baseline, "openvino": baseline_openvino}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "compare", help="run one quantized model on every target and compare outputs and "
                        "time per op group",
        description="Quantize MODEL once (for a requantization mode every target runs), "
                    "compile and run it on each target, check every target's outputs "
                    "bit-exactly against the quantized reference (and so against each "
                    "other), and report time per op group and in total: the accelerator's "
                    "cycles at its clock (on Verilator), the others' wall time on this "
                    "machine. Writes a bar chart (PNG) of time per op group and target.")
    add_target_options(p, "compare")
    p.add_argument("model", metavar="MODEL", help="zoo model name or an .onnx path")
    p.add_argument("--targets", metavar="A,B,...",
                   help=f"targets to compare (default {','.join(DEFAULT_TARGETS)}, each "
                        "where it runs here at its own speed: gpu only on a CUDA GPU, "
                        "since Triton's interpreter takes minutes; name it to add it)")
    add_seed_option(p)
    add_calibration_option(p)
    add_input_option(p)
    add_float_nonlinear_option(p)
    add_records_option(p)
    add_chooser_option(p)
    p.add_argument("--chart", type=output_file,
                   metavar="PNG", help="bar chart path (default compare-MODEL.png)")
    p.add_argument("--json", type=output_file,
                   metavar="PATH", help="also write the comparison as JSON here")
    p.add_argument("--reference", metavar="A,B",
                   help="add other runtimes as reference columns, float32 and int8 each "
                        f"(of {', '.join(REFERENCES)}; their numerics differ from vdla's: "
                        "speed references, not checked bit for bit). onnxruntime: the float "
                        "model exported to ONNX, and its own static QDQ int8 of it on the "
                        "same calibration samples; for a transformer, also its transformer "
                        "optimizer's float model and its dynamic int8 of that, each column "
                        "the faster of its precision (the onnxruntime extra). openvino: its "
                        "CPU plugin at inference precision f32 on the same float model, and "
                        "on onnxruntime's static QDQ int8 model (the openvino extra)")
    p.add_argument("--onnxruntime", action="store_true",
                   help="the same as --reference onnxruntime (with --reference: added to "
                        "its list)")
    p.add_argument("--runs", type=int, default=10, metavar="N",
                   help="timed runs of each reference column (default 10)")
    p.set_defaults(func=run)


def _targets(args) -> list:
    """The targets --targets names, each built from its own options; a default one that
    cannot run here is left out with a note, one named is an error."""
    check_model_options(args)
    named = args.targets is not None
    names = [n.strip() for n in (args.targets.split(",") if named else DEFAULT_TARGETS)
             if n.strip()]
    unknown = []
    for name in names:
        try:
            target_factory(name)
        except CliError:
            unknown.append(name)
    if unknown or not names:
        raise CliError(f"--targets: unknown target(s) {', '.join(unknown) or '(none)'}; "
                       f"available: {', '.join(targets.names())}")
    chosen, dropped = [], {}
    for name in names:
        if named:
            missing = unavailable(name)
            if missing is not None:
                raise CliError(f"--targets {name}: {missing}")
        else:
            left_out = getattr(target_factory(name), "left_out_by_default", None)
            missing = left_out() if left_out is not None else unavailable(name)
        if missing is None:
            chosen.append(name)
        else:
            dropped[name] = missing
    check_target_options(args, chosen, "compare", dropped)
    for name, missing in dropped.items():
        log(f"note: no {name} column ({missing})")
    return [make_target(name, args, "compare", log=log, strict=False) for name in chosen]


def _by_group(ops, seconds) -> dict[str, float]:
    """The `seconds` of each op (an `OpStats`) added up by op group (`GROUPS`)."""
    groups = collections.defaultdict(float)
    for s in ops:
        groups[GROUPS.get(s.op, "other")] += seconds(s)
    return dict(groups)


def _references(args) -> list[str]:
    """The reference runtimes ``--reference`` (and ``--onnxruntime``) name, in
    `REFERENCES`' order; an unknown or uninstalled one is an error saying what to
    install."""
    named = [n.strip() for n in (args.reference or "").split(",") if n.strip()]
    unknown = [n for n in named if n not in REFERENCES]
    if unknown or (args.reference is not None and not named):
        raise CliError(f"--reference: unknown reference(s) {', '.join(unknown) or '(none)'}; "
                       f"available: {', '.join(REFERENCES)}")
    chosen = [n for n in REFERENCES if n in named or (n == "onnxruntime" and args.onnxruntime)]
    for name in chosen:
        missing = REFERENCES[name].available()
        if missing:
            flag = "--onnxruntime" if name not in named else f"--reference {name}"
            raise CliError(f"{flag}: {missing}")
    if chosen and args.runs < 1:
        raise CliError(f"--runs must be a positive integer, not {args.runs}")
    return chosen


def run(args) -> int:
    chosen = _targets(args)
    references = _references(args)
    model = pipeline.load_model(args.model, seed=args.seed, calibration=args.calibration,
                                inputs=args.input)
    mode = pipeline.requant_mode(chosen)
    results, failed, outputs = {}, [], {}
    records = open_records(args.records)
    try:
        for target in chosen:
            _run_one(args, model, mode, target, records, results, failed, outputs)
    finally:
        if records is not None:
            records.close()
    if references:
        _reference_columns(args, model, results, references)
    same = _same_outputs(outputs)
    # The files first: a reader of stdout that stops early (`| head`) ends the command
    # at its next print, and must not cost the files asked for.
    chart = args.chart or f"compare-{args.model.replace('/', '_')}.png"
    _chart(chart, args.model, results)
    if args.json:
        write_json(args.json, {"model": args.model, "input": model.input_note,
                               "integer_nonlinear": not args.float_nonlinear,
                               "requantization": mode,
                               "board": getattr(args, "board", None),
                               "chooser": args.chooser, "records": args.records,
                               "outputs_identical": same,
                               "targets": results})
    _print(args, mode, results, same)
    print(f"wrote {chart}" + (f", {args.json}" if args.json else ""))
    if failed:
        raise CliError("outputs differ from the quantized reference: " + "; ".join(failed))
    if not same:
        raise CliError("the targets' outputs differ from each other")
    return 0


def _same_outputs(outputs: dict) -> bool:
    """Whether every target's outputs equal the first target's, byte for byte."""
    import numpy as np  # heavy; the module loads without it (vdla.cli's rule)

    first = next(iter(outputs.values()))
    return all(set(o) == set(first) and all(np.array_equal(o[k], first[k]) for k in first)
               for o in outputs.values())


def _order(results) -> list[str]:
    seen = []
    for r in results.values():
        for g in r["groups"]:
            if g not in seen:
                seen.append(g)
    return sorted(seen, key=lambda g: -max(r["groups"].get(g, 0) for r in results.values()))


def _print(args, mode, results, same: bool = True) -> None:
    names = list(results)
    print(f"{args.model}, quantized once ({mode} requantization), on {', '.join(names)}")
    rows = [[g, *(_ms(results[n]["groups"].get(g)) for n in names)] for g in _order(results)]
    rows.append(["total", *(_ms(results[n]["total_seconds"]) for n in names)])
    rows.append(["ops on the target", *(f"{results[n]['ops_on_target']}/{results[n]['ops']}"
                                        for n in names)])
    rows.append(["bit-exact", *("-" if _aside(results[n]) else
                                "yes" if results[n]["bit_exact"] else "NO" for n in names)])
    rows.append(["same outputs", *("-" if _aside(results[n]) else
                                   "yes" if same else "NO" for n in names)])
    labels = [results[n].get("label", n) for n in names]
    for line in table(["time (ms)", *labels], rows, right=set(range(1, len(names) + 1))):
        print(line)
    for n, label in zip(names, labels):
        print(f"  {label}: {results[n]['time']}")
    for n, label in zip(names, labels):
        if _aside(results[n]) or not results[n]["ops_on_host"]:
            continue
        # One line per reason: a model's ops often fall back for the same one.
        by_reason = collections.defaultdict(list)
        for op, reason in results[n]["ops_on_host"].items():
            by_reason[reason or "no reason given"].append(op)
        print(f"ops on the host in the {label} column:")
        for reason, ops in by_reason.items():
            print(f"  {', '.join(ops)}: {reason}")


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.3f}"


def _chart(path: str, model: str, results) -> None:
    """Grouped bars: time per op group (log scale), one bar per target."""
    # matplotlib is imported here: heavy (a second to load), and only the chart needs it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # heavy, as above

    groups, names = _order(results), list(results)
    fig = Figure(figsize=(10, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [results[name]["groups"].get(g, 0) * 1e3 for g in groups]
        xs = [k + (i - (len(names) - 1) / 2) * width for k in range(len(groups))]
        total = results[name]["total_seconds"] * 1e3
        estimate = results[name].get("estimate", False)
        hatch = "//" if estimate else ".." if results[name].get("reference") else None
        ax.bar(xs, values, width, hatch=hatch,
               label=f"{results[name].get('label', name)}\n(total "
                     f"{f'{total:,.0f}' if total >= 100 else f'{total:.3g}'} ms"
                     f"{', estimate' if estimate else ''})")
    ax.set_xticks(range(len(groups)), groups)
    ax.set_yscale("log")
    ax.set_ylabel("time (ms, log scale)")
    ax.set_title(f"{model}: time per op group (each target's device time; hatched: "
                 "estimates; dotted: other runtimes, references)", fontsize="medium")
    ax.grid(True, axis="y", which="major", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=130)
    atomic_write(path, buffer.getvalue())


def _run_one(args, model, mode, target, records, results, failed, outputs) -> None:
    """Run `model` on `target`, adding its row to `results` (and its estimate column's,
    if any), its outputs to `outputs` and any mismatch to `failed`."""
    log(f"running {args.model} on {target.name} ...")
    start = time.perf_counter()
    outcome = pipeline.run_model(model, target, mode=mode, records=records,
                                 chooser=args.chooser,
                                 integer_nonlinear=not args.float_nonlinear)
    outputs[target.name] = outcome.result.outputs
    groups = _by_group(outcome.result.ops, lambda s: s.device_seconds)
    summary = outcome.result.summary.get(target.name, {})
    # A target that runs the whole graph in one call (the CPU target): its ops' times
    # inside that call, and its layout conversions between them, rather than op-by-op
    # calls from Python (which convert layouts in numpy around every op).
    whole = whole_graph(outcome) if outcome.bit_exact else None
    whole_note = ""
    if whole is not None:
        groups = _by_group(outcome.result.ops, lambda s: whole[1].get(s.name, s.device_seconds))
        if whole[2]:
            groups["layout"] = groups.get("layout", 0.0) + sum(whole[2].values())
        whole_note = (f" (each op inside one call of the compiled graph, median of "
                      f"{WHOLE_GRAPH_RUNS} runs; the call took {whole[0] * 1e3:.3f} ms)")
    results[target.name] = {
        "bit_exact": outcome.bit_exact, "mismatch": outcome.mismatch,
        "groups": groups, "total_seconds": sum(groups.values()),
        "ops_on_target": len(outcome.compiled.ops_on(target.name)),
        "ops": len(outcome.compiled.ops), "options": target.options(),
        # The ops that fell back to the host, and why (none on the host target).
        "ops_on_host": {} if target.name == targets.HOST else {
            s.name: s.reason for s in outcome.result.ops if s.target == targets.HOST},
        "seconds_to_run": time.perf_counter() - start,
        "time": target.time_note(summary) + whole_note,
        "label": target.column_label(summary)}
    column = target.estimate_column()
    if column is not None:
        estimate = _by_group(outcome.result.ops, column.op_seconds)
        results[f"{target.name} est."] = {
            **results[target.name], "estimate": True, "groups": estimate,
            "label": column.label, "total_seconds": sum(estimate.values()),
            "seconds_to_run": 0.0, "time": column.note}
    if not outcome.bit_exact:
        failed.append(f"{target.name}: {outcome.mismatch}")


def _aside(result: dict) -> bool:
    """A column that is not a target's run: an estimate, or a reference runtime's."""
    return bool(result.get("estimate") or result.get("reference"))


def _reference_columns(args, model, results, references: list[str]) -> None:
    """The columns of the reference runtimes `references` (`REFERENCES`), each timed
    `args.runs` times on the CPU target's thread count (``--threads``, else the cores),
    with its largest relative error against the float reference. Their models are made
    once: the float model exported to ONNX, and onnxruntime's static QDQ int8 of it
    (`baseline.variants`; for a transformer, with onnxruntime's column, its optimizer's
    and dynamic int8 paths too). An ONNX file given as MODEL for a transformer is run as
    it is (its exporter's graph, which onnxruntime's optimizer knows), not as vdla
    exports it again."""
    import onnxruntime  # heavy, and optional (checked in `_references`)
    from vdla.compiler.frontend.onnx_export import save_onnx  # heavy: onnx

    threads = getattr(args, "threads", None) or baseline.default_threads()
    want = pipeline.reference_of(model.graph, model.feed)[model.graph.outputs[0]]
    prepared = prepare(model.graph)
    kind = baseline.transformer_kind(prepared)
    heads, hidden = baseline.transformer_shape(prepared)
    # onnxruntime's own transformer paths only for its own column: OpenVINO runs the
    # exported float model and the static QDQ one.
    paths = kind if "onnxruntime" in references else None
    with tempfile.TemporaryDirectory(prefix="vdla-compare-") as tmp:
        if kind is not None and args.model.lower().endswith(".onnx"):
            fp32 = Path(args.model)
        else:
            # LayerNormalization needs opset 17.
            fp32 = save_onnx(model.graph, Path(tmp) / "model.onnx",
                             **({} if kind is None else {"opset": 17}))
        log(f"onnxruntime {onnxruntime.__version__}: quantizing {args.model} ("
            + ("static QDQ, uint8 activations" if paths is None else
               f"a {kind} transformer: its optimizer, static QDQ and dynamic int8")
            + ") ...")
        found = baseline.variants(fp32, model, Path(tmp) / "ort", kind=paths, heads=heads,
                                  hidden=hidden, log=log)
        if "onnxruntime" in references:
            _onnxruntime(args, model, results, found, threads, want, kind)
        if "openvino" in references:
            _openvino(args, model, results, found, threads, want)


def _onnxruntime(args, model, results, found, threads: int, want, kind) -> None:
    """onnxruntime's columns (`vdla.compiler.baseline`) from its models `found`, per op
    group from its profiler. A transformer (`kind`) has more paths in onnxruntime: each
    column is the faster of its precision (`baseline.fastest`), and says which."""
    import numpy as np  # heavy; the module loads without it (vdla.cli's rule)
    import onnxruntime  # heavy, and optional (checked in `_references`)

    picked = {v.precision: (v, {}) for v in found}
    if kind is not None:
        log(f"timing onnxruntime's {len(found)} ways ({threads} threads) to pick the "
            "faster of each precision ...")
        picked = baseline.fastest(found, threads, model.feed, runs=args.runs, rounds=1)
    for key, precision in (("onnxruntime fp32", "float32"), ("onnxruntime int8", "int8")):
        if precision not in picked:         # its tools built none (`variants` said why)
            log(f"note: no {key} column (onnxruntime built no {precision} model)")
            continue
        variant, times = picked[precision]
        log(f"running {args.model} on onnxruntime ({variant.what}, {threads} threads) ...")
        run = baseline.profile(variant.path, threads, model.feed, args.runs)
        error = pipeline.relative_error(np.asarray(run.outputs[0], np.float64), want)
        others = "; ".join(f"{k} {t * 1e3:.3f} ms" for k, t in times.items())
        results[key] = _reference_result(
            key, run, error, {"threads": threads, "version": onnxruntime.__version__,
                              "variant": variant.key,
                              **({"variants_seconds": times} if times else {})},
            f"onnxruntime {onnxruntime.__version__} ({variant.what}), a reference "
            f"implementation whose numerics differ from vdla's: wall time on this machine, "
            f"{threads} threads, kernel times from its profiler (a run took "
            f"{run.total_seconds * 1e3:.3f} ms, median of {args.runs}); largest relative "
            f"error against the float reference {error:.2g}"
            + (f"; the fastest of its {precision} ways ({others})" if len(times) > 1 else ""))


def _openvino(args, model, results, found, threads: int, want) -> None:
    """OpenVINO's columns (`vdla.compiler.baseline_openvino`): its CPU plugin at
    inference precision f32 on the exported float model and on onnxruntime's static QDQ
    int8 model (`found`'s ``fp32`` and ``int8-qdq-u8``), per op group from its
    performance counters."""
    import numpy as np  # heavy; the module loads without it (vdla.cli's rule)

    version = baseline_openvino.version()
    models = {v.key: v for v in found}
    for key, variant, what in (
            ("openvino fp32", "fp32", "float32, the exported model"),
            ("openvino int8", "int8-qdq-u8", "int8, onnxruntime's static QDQ model (uint8 "
                                            "activations) through its low-precision "
                                            "transformations")):
        if variant not in models:           # onnxruntime's quantizer made none (logged)
            log(f"note: no {key} column (no {variant} model to give it)")
            continue
        log(f"running {args.model} on OpenVINO {version} ({what}, {threads} threads) ...")
        run = baseline_openvino.profile(models[variant].path, threads, model.feed, args.runs)
        error = pipeline.relative_error(np.asarray(run.outputs[0], np.float64), want)
        # What its transformations made of the model: the precision each convolution and
        # dense layer ran at (an int8 model's layers that stayed float show here).
        layers = dict(collections.Counter(run.precisions.values()).most_common())
        results[key] = _reference_result(
            key, run, error, {"threads": threads, "version": version, "variant": variant,
                              "inference_precision": "f32", "performance_hint": "LATENCY",
                              "layer_precisions": layers},
            f"OpenVINO {version}, its CPU plugin ({what}), a reference implementation "
            f"whose numerics differ from vdla's: wall time on this machine, {threads} "
            f"threads, inference precision f32, the latency hint; its convolution and dense "
            f"layers ran at " + ", ".join(f"{p} ({n})" for p, n in layers.items())
            + f"; node times from its performance counters (a run took "
            f"{run.total_seconds * 1e3:.3f} ms, median of {args.runs}); largest relative "
            f"error against the float reference {error:.2g}")


def _reference_result(key: str, run, error: float, options: dict, note: str) -> dict:
    """A reference runtime's column from its `run` (a `baseline.ProfiledRun`): never
    counted as bit-exact or mismatching; `error` against the float reference instead."""
    return {"reference": True, "bit_exact": None, "mismatch": None,
            "groups": run.group_seconds, "total_seconds": sum(run.group_seconds.values()),
            "wall_seconds": run.total_seconds, "max_error": error,
            "ops_on_target": run.kernels, "ops": run.kernels, "options": options,
            "ops_on_host": {}, "seconds_to_run": 0.0, "label": f"{key} (ref.)",
            "time": note}
