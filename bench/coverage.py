"""Coverage of the accelerator: how much of each model runs on vdla, and what is left on
the host and why.

For each model (the zoo's resnet18, resnet50, mobilenet_v1, small_cnn, digits_cnn, and
the Inception-v1, DenseNet and grouped-AlexNet networks of tests/onnx_blocks.py, written
as ONNX files by torch), the run is exactly `vdla run MODEL --sim BACKEND --json`'s:
`vdla.compiler.pipeline.load_model` (seed 0, 4 calibration samples), the target made by
`vdla.cli.target_args.make_target`, and `pipeline.run_model` (quantize for the target's
best requantization mode or `--mode`, compile with host fallback, run once, check every
tensor bit-exactly against the quantized reference). Printed per model:

* ops on vdla / all ops of the compiled graph;
* MACs on vdla / all MACs: the useful multiply-accumulates of every GEMM node
  (convolutions, dense layers, matmuls; a grouped convolution counts C / groups input
  channels per output), counted from the graph the same way for ops on either side;
* host ops and the host's time: its ops (the reference kernels on this machine) and
  its moves of activations to and from the accelerator (`RunResult.host_time`), and of
  those the moves between two accelerator ops (none where activations stay in DRAM);
* the accelerator's cycles with their time at the config's clock: measured on the
  Verilator backend; on the functional backend, which counts no cycles, the target's
  timing model (`estimate`, what design sweeps use), marked ``~``; and the run end to
  end: that time plus the host's;
* whether the run was bit-exact against the quantized reference;

then, per model, the host ops grouped by the reason the target gave (with counts, op
kinds and MACs), which is the to-do list for moving ops onto the accelerator. The table
keeps working as ops move: nothing here knows which ops vdla runs.

Then the `--verilator-models` (default resnet18 and mobilenet_v1; ``none`` skips them)
run the same way on the Verilator backend (same config and mode; on `--backend
verilator` the runs above are reused), with measured figures: a table of ops and MACs on
vdla, total cycles and their time at the clock, GEMM utilization (the useful MACs of
vdla's ops / (their cycles x the config's peak MACs per cycle)), host time, moves
between vdla ops, end to end time and bit-exactness; and,
for each such model with depthwise convolutions (qconv2d nodes of the quantized graph
whose groups equal their input and output channels, more than one: mobilenet_v1's), a
per-layer table: shape (C x H x W -> output H x W, stride), measured cycles, useful
MACs, GEMM utilization and its fraction of the diagonal weight-block scheme's ceiling
(1 / block_in of the config), the timing model's cycles for the layer and their ratio
to the measured ones; then the depthwise layers' totals and share of the model's vdla
cycles.

    python bench/coverage.py [--models resnet18 densenet_block ...]
                             [--backend functional|verilator] [--config FILE]
                             [--verilator-models resnet18,mobilenet_v1|none]
                             [--mode shift|multiply] [--out DIR]

With `--out`, writes DIR/coverage.json (atomically; the Verilator runs under
``verilator``, each with its ``depthwise`` figures) and keeps the ONNX files in
DIR/onnx; otherwise they go to a temporary folder. Exits with 1 if a model was not
bit-exact or failed to run, on either backend (the others still run; the error is
printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # numpy's BLAS off the shared cores

import numpy as np  # noqa: E402

from vdla._fileio import atomic_write  # noqa: E402
from vdla.cli.common import CliError, table  # noqa: E402
from vdla.cli.target_args import make_target  # noqa: E402
from vdla.compiler import pipeline  # noqa: E402
from vdla.compiler.passes import MODES  # noqa: E402

TESTS = Path(__file__).resolve().parents[1] / "tests"
ZOO_MODELS = ("resnet18", "resnet50", "mobilenet_v1", "small_cnn", "digits_cnn")
#: The networks of tests/onnx_blocks.py (imported only when one is asked for: torch).
BLOCK_MODELS = ("inception_block", "densenet_block", "alexnet_grouped")
MODELS = ZOO_MODELS + BLOCK_MODELS
#: The models also run on the Verilator backend by default (--verilator-models).
VERILATOR_MODELS = ("resnet18", "mobilenet_v1")
#: Ops whose MACs count: the GEMM operators, float and integer.
_GEMM_OPS = ("conv2d", "qconv2d", "dense", "qdense", "matmul")


def log(message: str) -> None:
    print(f"[coverage] {message}", file=sys.stderr, flush=True)


# --- figures --------------------------------------------------------------------------------

def node_macs(graph) -> dict[str, int]:
    """Node name -> useful MACs of each GEMM node of `graph` (plain layouts): for a
    convolution the output size times the weights per output (C / groups x kH x kW),
    for a dense layer the output size times K, for a matmul the output size times the
    shared axis."""
    macs = {}
    for node in graph.nodes():
        if node.op not in _GEMM_OPS:
            continue
        out = graph.tensors[node.outputs[0]].shape
        if node.op == "matmul":
            per_output = graph.tensors[node.inputs[0]].shape[-1]
        else:
            per_output = int(np.prod(graph.tensors[node.inputs[1]].shape[1:]))
        macs[node.name] = int(np.prod(out)) * int(per_output)
    return macs


def timing_model(target, graph, schedules=None) -> tuple[list | None, str | None]:
    """The target's timing-model estimate of every node of `graph` (`estimate`, where the
    target has one; a list of `OpEstimate`), or (None, why not)."""
    estimate = getattr(target, "estimate", None)
    if estimate is None:
        return None, f"target {target.name!r} has no timing model"
    try:
        return list(estimate(graph, schedules=schedules or None)), None
    except Exception as e:   # the model is a side figure: report, keep the run's figures
        return None, f"the timing model failed: {type(e).__name__}: {e}"


def model_cycles(estimates: list | None) -> int | None:
    """The timing model's cycles of the ops the target would run (None without a model)."""
    if estimates is None:
        return None
    return int(sum(op.cycles for op in estimates if op.cycles is not None))


def diagonal_ceiling(config) -> float | None:
    """The best GEMM utilization of a depthwise convolution on diagonal weight blocks: each
    GEMM step does batch x block_out useful MACs of batch x block_in x block_out, so
    1 / block_in (None where block_in != block_out: no layer is diagonal then)."""
    return 1.0 / config.block_in if config.block_in == config.block_out else None


def depthwise_nodes(graph) -> list:
    """The depthwise convolutions of the quantized `graph`: qconv2d nodes whose groups
    equal both their input and output channels (more than one)."""
    found = []
    for node in graph.nodes():
        if node.op != "qconv2d":
            continue
        groups = int(node.attrs.get("groups", 1))
        c = graph.tensors[node.inputs[0]].shape[1]
        o = graph.tensors[node.outputs[0]].shape[1]
        if groups > 1 and groups == c == o:
            found.append(node)
    return found


def depthwise_layers(graph, result, estimates: list | None, target) -> dict:
    """Per depthwise layer of a run with cycles: its shape, measured cycles, useful MACs,
    GEMM utilization (MACs / (cycles x macs_per_cycle)) and the timing model's cycles;
    with their totals and share of the accelerator's cycles."""
    stats, counted = {s.name: s for s in result.ops}, node_macs(graph)
    model = {op.name: op.cycles for op in estimates or ()}
    peak, ceiling = target.config.macs_per_cycle, diagonal_ceiling(target.config)
    layers = []
    for node in depthwise_nodes(graph):
        s = stats.get(node.name)
        _, c, h, w = graph.tensors[node.inputs[0]].shape
        _, _, oh, ow = graph.tensors[node.outputs[0]].shape
        kh, kw = graph.tensors[node.inputs[1]].shape[2:]
        cycles = None if s is None or s.cycles is None else int(s.cycles)
        macs = s.macs if s is not None and s.macs else counted[node.name]
        modelled = model.get(node.name)
        layers.append({
            "name": node.name, "target": None if s is None else s.target,
            "channels": int(c), "height": int(h), "width": int(w),
            "out_height": int(oh), "out_width": int(ow), "kernel": [int(kh), int(kw)],
            "stride": [int(v) for v in node.attrs["strides"]],
            "cycles": cycles, "macs": int(macs),
            "gemm_utilization": macs / (cycles * peak) if cycles else None,
            "model_cycles": modelled,
            "model_ratio": modelled / cycles if cycles and modelled is not None else None})
    measured = [x for x in layers if x["cycles"] is not None]
    cycles = sum(x["cycles"] for x in measured)
    macs = sum(x["macs"] for x in measured)
    modelled = [x["model_cycles"] for x in measured if x["model_cycles"] is not None]
    modelled = sum(modelled) if len(modelled) == len(measured) else None
    total = result.summary.get(target.name, {}).get("cycles")
    return {"layers": layers, "ceiling": ceiling, "macs_per_cycle": peak,
            "cycles": cycles, "macs": macs,
            "gemm_utilization": macs / (cycles * peak) if cycles else None,
            "model_cycles": modelled,
            "model_ratio": modelled / cycles if cycles and modelled is not None else None,
            "share_of_cycles": cycles / total if total else None}


def summarize(name: str, outcome, target, wall: float) -> dict:
    """The figures of one model's `pipeline.Outcome` as a plain dict (the JSON record)."""
    result, graph = outcome.result, outcome.quantized
    macs = node_macs(graph)
    mine = [s for s in result.ops if s.target == target.name]
    host = [s for s in result.ops if s.target != target.name]
    reasons: dict[str, dict] = {}
    for s in host:
        entry = reasons.setdefault(s.reason, {"reason": s.reason, "count": 0, "ops": Counter(),
                                              "macs": 0, "wall_seconds": 0.0})
        entry["count"] += 1
        entry["ops"][s.op] += 1
        entry["macs"] += macs.get(s.name, 0)
        entry["wall_seconds"] += s.wall_seconds
    summary = result.summary.get(target.name, {})
    clock_mhz = summary.get("clock_mhz") or target.options().get("clock_mhz")
    cycles = summary.get("cycles")
    estimates, estimate_note = timing_model(target, graph, outcome.schedules)
    estimated = model_cycles(estimates)
    record = {
        "model": name,
        "input": outcome.model.input_note,
        "mode": graph.metadata.get("quantized", {}).get("mode"),
        "ops": {"total": len(result.ops), target.name: len(mine), "host": len(host)},
        "macs": {"total": sum(macs.values()),
                 target.name: sum(macs.get(s.name, 0) for s in mine)},
        "host_reasons": sorted(({**r, "ops": dict(r["ops"])} for r in reasons.values()),
                               key=lambda r: (-r["macs"], -r["count"], r["reason"])),
        "host_wall_seconds": sum(s.wall_seconds for s in host),
        # The host's ops and activation moves; `between_*`: moves between two target ops.
        "host": result.host_time(),
        f"{target.name}_wall_seconds": sum(s.wall_seconds for s in mine),
        "clock_mhz": clock_mhz,
        "cycles": cycles,
        "seconds_at_clock": summary.get("seconds_at_clock"),
        "gemm_utilization": summary.get("gemm_utilization"),
        "model_cycles": estimated,
        "model_seconds_at_clock": (None if estimated is None or not clock_mhz
                                   else estimated / (clock_mhz * 1e6)),
        "model_note": estimate_note,
        "bit_exact": outcome.bit_exact,
        "mismatch": outcome.mismatch or None,
        "quantize_seconds": outcome.quantize_seconds,
        "compile_seconds": outcome.compiled.compile_seconds,
        "run_wall_seconds": result.wall_seconds,
        "total_seconds": wall,
    }
    if cycles is not None:      # measured: the depthwise layers' own figures
        record["depthwise"] = depthwise_layers(graph, result, estimates, target)
    return record


# --- models ---------------------------------------------------------------------------------

def model_spec(name: str, onnx_dir: Path) -> str:
    """What `pipeline.load_model` takes for `name`: the zoo name, or the path of the ONNX
    file tests/onnx_blocks.py writes into `onnx_dir`."""
    if name in ZOO_MODELS:
        return name
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import onnx_blocks    # tests/onnx_blocks.py: torch builds and exports the network

    return str(onnx_blocks.BLOCKS[name](onnx_dir))


def run_one(name: str, target, mode: str | None, onnx_dir: Path) -> dict:
    """Load, quantize, compile, run and check one model through the pipeline."""
    start = time.perf_counter()
    model = pipeline.load_model(model_spec(name, onnx_dir), seed=0, calibration=4,
                                note=lambda message: log(f"{name}: {message}"))
    outcome = pipeline.run_model(model, target, mode=mode)
    return summarize(name, outcome, target, time.perf_counter() - start)


def run_models(names, target, mode: str | None, onnx_dir: Path,
               label: str = "") -> tuple[list[dict], dict[str, str]]:
    """`run_one` for each of `names`: (records, model -> error). A model that fails is
    logged with its traceback and the others still run (one model's failure must not
    hide the others' figures)."""
    records, failures = [], {}
    for name in names:
        log(f"{name}{label}: quantize, compile, run and check ...")
        start = time.perf_counter()
        try:
            record = run_one(name, target, mode, onnx_dir)
        except Exception as e:
            failures[name] = f"{type(e).__name__}: {e}"
            log(f"{name}{label}: FAILED: {failures[name]}")
            traceback.print_exc(file=sys.stderr)
            continue
        records.append(record)
        log(f"{name}{label}: {record['ops'][target.name]}/{record['ops']['total']} ops on "
            f"{target.name}, bit-exact {'yes' if record['bit_exact'] else 'NO'} "
            f"({time.perf_counter() - start:.1f} s)")
    return records, failures


# --- report ---------------------------------------------------------------------------------

def _millions(n: int) -> str:
    return f"{n / 1e6:.1f}M"


def _cycles_cells(r: dict) -> tuple[str, str]:
    """(cycles, ms at the clock): measured, else the timing model's marked ``~``."""
    if r["cycles"] is not None:
        return f"{r['cycles']:,}", f"{r['seconds_at_clock'] * 1e3:.2f}"
    if r["model_cycles"] is not None:
        ms = r["model_seconds_at_clock"]
        return f"~{r['model_cycles']:,}", "-" if ms is None else f"~{ms * 1e3:.2f}"
    return "-", "-"


def report(records: list[dict], failures: dict[str, str], target_name: str,
           clock_mhz) -> list[str]:
    """The table and the per-model host reasons, as lines."""
    header = ("model", f"ops on {target_name}", f"MACs on {target_name}", "host ops",
              "host ms", f"between {target_name} ops", f"{target_name} cycles",
              f"ms @{clock_mhz:g} MHz", "end to end ms", "bit-exact")
    rows = []
    for r in records:
        ops, macs = r["ops"], r["macs"]
        share = macs[target_name] / macs["total"] if macs["total"] else 0.0
        cycles, ms = _cycles_cells(r)
        mac_cell = f"{_millions(macs[target_name])}/{_millions(macs['total'])} ({share:.1%})"
        rows.append((r["model"], f"{ops[target_name]}/{ops['total']}", mac_cell,
                     str(ops["host"]), f"{r['host']['seconds'] * 1e3:.1f}", _between(r),
                     cycles, ms, _end_to_end(r), "yes" if r["bit_exact"] else "NO"))
    for name, error in failures.items():
        rows.append((name, "-", "-", "-", "-", "-", "-", "-", "-",
                     f"FAILED ({error.splitlines()[0]})"))
    lines = table(header, rows, right=set(range(1, 9)))
    lines.append(f"host ms: the host's ops and its activation moves to and from "
                 f"{target_name} (the model's input and outputs, host ops' operands);")
    lines.append(f"between {target_name} ops: activations the host moved between two "
                 f"{target_name} ops (none: they stay in DRAM); end to end: {target_name} at "
                 "its clock + host")
    if any(r["cycles"] is None and r["model_cycles"] is not None for r in records):
        lines.append("~: the target's timing model (this backend counts no cycles)")
    for r in records:
        lines.append("")
        lines.append(f"{r['model']}: {r['ops']['host']} host ops by reason "
                     f"(count, op kinds, MACs, wall ms)")
        for entry in r["host_reasons"]:
            kinds = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in entry["ops"].items())
            lines.append(f"  {entry['count']:3d}  {entry['reason']}")
            lines.append(f"       [{kinds}; {_millions(entry['macs'])} MACs; "
                         f"{entry['wall_seconds'] * 1e3:.1f} ms]")
        if not r["bit_exact"]:
            lines.append(f"  NOT bit-exact: {r['mismatch']}")
        if r["model_note"] and r["cycles"] is None:
            lines.append(f"  (no cycles: {r['model_note']})")
    return lines


def _between(r: dict) -> str:
    """The host's moves between two accelerator ops: ``none`` or count and bytes."""
    host = r["host"]
    return ("none" if not host["between_transfers"] else
            f"{host['between_transfers']} ({host['between_bytes']:,} B)")


def _end_to_end(r: dict) -> str:
    """The accelerator's time at its clock (measured, else the timing model's, ``~``)
    plus the host's, in ms."""
    at_clock = r["seconds_at_clock"] if r["cycles"] is not None else r["model_seconds_at_clock"]
    if at_clock is None:
        return "-"
    mark = "" if r["cycles"] is not None else "~"
    return f"{mark}{(at_clock + r['host']['seconds']) * 1e3:.2f}"


def _percent(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}%}"


def measured_report(records: list[dict], failures: dict[str, str], target_name: str,
                    clock_mhz) -> list[str]:
    """The table of the runs with measured cycles: ops and MACs on the accelerator, its
    cycles and their time at the clock, GEMM utilization, bit-exactness."""
    header = ("model", f"ops on {target_name}", f"MACs on {target_name}",
              f"{target_name} cycles", f"ms @{clock_mhz:g} MHz", "GEMM util", "host ms",
              f"between {target_name} ops", "end to end ms", "bit-exact")
    rows = []
    for r in records:
        ops, macs = r["ops"], r["macs"]
        cycles, ms = _cycles_cells(r)
        rows.append((r["model"], f"{ops[target_name]}/{ops['total']}",
                     f"{_millions(macs[target_name])}/{_millions(macs['total'])}", cycles, ms,
                     _percent(r["gemm_utilization"]), f"{r['host']['seconds'] * 1e3:.2f}",
                     _between(r), _end_to_end(r), "yes" if r["bit_exact"] else "NO"))
    for name, error in failures.items():
        rows.append((name, "-", "-", "-", "-", "-", "-", "-", "-",
                     f"FAILED ({error.splitlines()[0]})"))
    lines = table(header, rows, right=set(range(1, 9)))
    lines.append("GEMM util: useful MACs on the accelerator / (its cycles x peak MACs per "
                 "cycle);")
    lines.append("           its cycles include pools, elementwise ops and epilogues")
    lines += [f"{r['model']}: NOT bit-exact: {r['mismatch']}" for r in records
              if not r["bit_exact"]]
    return lines


def depthwise_report(record: dict, target_name: str) -> list[str]:
    """The per-layer table of one measured run's depthwise convolutions, with their totals
    and share of the model's accelerator cycles."""
    dw = record["depthwise"]
    ceiling = dw["ceiling"]
    note = ("no diagonal ceiling (block_in != block_out)" if ceiling is None else
            f"diagonal weight blocks' GEMM util ceiling 1/block_in = {ceiling:.2%}")
    lines = [f"{record['model']}: {len(dw['layers'])} depthwise convolutions, measured; {note}"]
    header = ("layer", "C x H x W", "-> H x W", "stride", "cycles", "MACs", "GEMM util",
              "of ceiling", "model cycles", "model/meas")

    def row(name, shape, out, stride, x):
        util = x["gemm_utilization"]
        of = None if util is None or not ceiling else util / ceiling
        ratio = x["model_ratio"]
        return (name, shape, out, stride, "-" if x["cycles"] is None else f"{x['cycles']:,}",
                f"{x['macs']:,}", _percent(util, 2), _percent(of),
                "-" if x["model_cycles"] is None else f"{x['model_cycles']:,}",
                "-" if ratio is None else f"{ratio:.2f}")

    rows = []
    for x in dw["layers"]:
        sh, sw = x["stride"]
        rows.append(row(x["name"] + ("" if x["target"] == target_name else " (host)"),
                        f"{x['channels']}x{x['height']}x{x['width']}",
                        f"{x['out_height']}x{x['out_width']}",
                        str(sh) if sh == sw else f"{sh}x{sw}", x))
    rows.append(row("all depthwise", "", "", "", dw))
    lines += table(header, rows, right={1, 2, 3, 4, 5, 6, 7, 8, 9})
    if dw["share_of_cycles"] is not None:
        lines.append(f"depthwise share: {dw['cycles']:,} of the model's {record['cycles']:,} "
                     f"{target_name} cycles ({dw['share_of_cycles']:.1%})")
    return lines


def model_list(value: str) -> list[str]:
    """--verilator-models' value: comma-separated model names, or ``none``."""
    if value.strip().lower() == "none":
        return []
    names = [n.strip() for n in value.split(",") if n.strip()]
    bad = [n for n in names if n not in MODELS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown model(s) {', '.join(map(repr, bad)) or repr(value)}; allowed: "
            f"{', '.join(MODELS)} (comma-separated), or none")
    return list(dict.fromkeys(names))


def verilator_target(args, target):
    """The target the --verilator-models run on: the main one on --backend verilator,
    else the same config on the Verilator backend."""
    if args.backend == "verilator":
        return target
    return make_target("vdla", argparse.Namespace(sim="verilator", config=args.config), "run")


def run_verilator(args, target, records, failures, onnx_dir):
    """The --verilator-models' records and failures, in their order; on --backend
    verilator, the main runs of the models already run are reused."""
    shared = set(args.models) if args.backend == "verilator" else set()
    vrecords, vfailures = run_models([n for n in args.verilator_models if n not in shared],
                                     target, args.mode, onnx_dir, " (verilator)")
    vrecords += [r for r in records if r["model"] in shared & set(args.verilator_models)]
    vfailures.update({n: e for n, e in failures.items()
                      if n in shared & set(args.verilator_models)})
    vrecords.sort(key=lambda r: args.verilator_models.index(r["model"]))
    return vrecords, vfailures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS),
                        metavar="MODEL", help=f"the models to run (default all: "
                                              f"{', '.join(MODELS)})")
    parser.add_argument("--backend", choices=("functional", "verilator"),
                        default="functional",
                        help="the accelerator's simulator (default functional: no cycles, "
                             "the timing model's estimate instead)")
    parser.add_argument("--verilator-models", type=model_list, metavar="M1,M2|none",
                        default=list(VERILATOR_MODELS),
                        help=f"models also run on the Verilator backend for measured "
                             f"cycles, GEMM utilization and the depthwise layers' table "
                             f"(default {','.join(VERILATOR_MODELS)}; none: skip)")
    parser.add_argument("--config", metavar="FILE",
                        help="a hardware config JSON (vdla's or VTA's); default: the "
                             "default config")
    parser.add_argument("--mode", choices=MODES,
                        help="requantization mode (default: the target's best for the "
                             "config: shift without ALU MUL)")
    parser.add_argument("--out", metavar="DIR",
                        help="write DIR/coverage.json and keep the ONNX files in DIR/onnx")
    args = parser.parse_args(argv)

    try:
        target = make_target("vdla", argparse.Namespace(sim=args.backend, config=args.config),
                             "run")
        vtarget = verilator_target(args, target) if args.verilator_models else None
    except (CliError, ValueError) as e:      # a bad --config: vdla run's own message
        print(f"coverage: error: {e}", file=sys.stderr)
        return 1
    options = target.options()
    mode = args.mode or target.requant_modes[0]
    log(f"config {options['config']}, {options['backend']} backend, {mode} requantization")

    vrecords, vfailures = [], {}
    with tempfile.TemporaryDirectory(prefix="vdla-coverage-") as tmp:
        onnx_dir = Path(args.out) / "onnx" if args.out else Path(tmp)
        records, failures = run_models(args.models, target, args.mode, onnx_dir)
        if vtarget is not None:
            vrecords, vfailures = run_verilator(args, vtarget, records, failures, onnx_dir)

    print(f"Coverage on {target.name}: config {options['config']}, {options['backend']} "
          f"backend, {mode} requantization")
    for line in report(records, failures, target.name, options["clock_mhz"]):
        print(line)
    if vtarget is not None:
        voptions = vtarget.options()
        print()
        print(f"Measured on {vtarget.name}: config {voptions['config']}, "
              f"{voptions['backend']} backend, {mode} requantization")
        for line in measured_report(vrecords, vfailures, vtarget.name, voptions["clock_mhz"]):
            print(line)
        for r in vrecords:
            if r.get("depthwise", {}).get("layers"):
                print()
                for line in depthwise_report(r, vtarget.name):
                    print(line)
    if args.out:
        path = Path(args.out) / "coverage.json"
        data = {"target": target.name, "options": options, "mode": mode,
                "models": {r["model"]: r for r in records}, "failures": failures,
                "verilator": None if vtarget is None else {
                    "options": vtarget.options(), "models": {r["model"]: r for r in vrecords},
                    "failures": vfailures}}
        atomic_write(path, (json.dumps(data, indent=2) + "\n").encode())
        log(f"wrote {path}")
    everything = records + vrecords
    return 0 if not failures and not vfailures and all(r["bit_exact"] for r in everything) else 1

if __name__ == "__main__":
    sys.exit(main())
