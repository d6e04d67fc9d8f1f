"""Coverage of the accelerator: how much of each model runs on vdla, and what is left on
the host and why.

For each model (the zoo's resnet18, resnet50, mobilenet_v1, small_cnn, digits_cnn, and
the Inception-v1, DenseNet and grouped-AlexNet networks of tests/onnx_blocks.py, written
as ONNX files by torch), the run is exactly `vdla run MODEL --sim BACKEND --json`'s:
`vdla.compiler.pipeline.load_model` (seed 0, 4 calibration samples), the target made by
`vdla.cli.run.make_target`, and `pipeline.run_model` (quantize for the target's best
requantization mode or `--mode`, compile with host fallback, run once, check every
tensor bit-exactly against the quantized reference). Printed per model:

* ops on vdla / all ops of the compiled graph;
* MACs on vdla / all MACs: the useful multiply-accumulates of every GEMM node
  (convolutions, dense layers, matmuls; a grouped convolution counts C / groups input
  channels per output), counted from the graph the same way for ops on either side;
* host ops and their wall time (the reference kernels on this machine), and the
  accelerator's cycles with their time at the config's clock: measured on the
  Verilator backend; on the functional backend, which counts no cycles, the target's
  timing model (`estimate`, what design sweeps use), marked ``~``;
* whether the run was bit-exact against the quantized reference;

then, per model, the host ops grouped by the reason the target gave (with counts, op
kinds and MACs), which is the to-do list for moving ops onto the accelerator. The table
keeps working as ops move: nothing here knows which ops vdla runs.

    python bench/coverage.py [--models resnet18 densenet_block ...]
                             [--backend functional|verilator] [--config FILE]
                             [--mode shift|multiply] [--out DIR]

With `--out`, writes DIR/coverage.json (atomically) and keeps the ONNX files in
DIR/onnx; otherwise they go to a temporary folder. Exits with 1 if a model was not
bit-exact or failed to run (the others still run; the error is printed).
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
from vdla.cli.run import make_target  # noqa: E402
from vdla.compiler import pipeline  # noqa: E402
from vdla.compiler.passes import MODES  # noqa: E402

TESTS = Path(__file__).resolve().parents[1] / "tests"
ZOO_MODELS = ("resnet18", "resnet50", "mobilenet_v1", "small_cnn", "digits_cnn")
#: The networks of tests/onnx_blocks.py (imported only when one is asked for: torch).
BLOCK_MODELS = ("inception_block", "densenet_block", "alexnet_grouped")
MODELS = ZOO_MODELS + BLOCK_MODELS
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


def model_cycles(target, graph) -> tuple[int | None, str | None]:
    """The target's timing-model cycles of the ops it would run (`estimate`, where the
    target has one), or (None, why not)."""
    estimate = getattr(target, "estimate", None)
    if estimate is None:
        return None, f"target {target.name!r} has no timing model"
    try:
        ops = estimate(graph)
    except Exception as e:   # the model is a side figure: report, keep the run's figures
        return None, f"the timing model failed: {type(e).__name__}: {e}"
    return int(sum(op.cycles for op in ops if op.cycles is not None)), None


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
    estimated, estimate_note = model_cycles(target, graph)
    return {
        "model": name,
        "input": outcome.model.input_note,
        "mode": graph.metadata.get("quantized", {}).get("mode"),
        "ops": {"total": len(result.ops), target.name: len(mine), "host": len(host)},
        "macs": {"total": sum(macs.values()),
                 target.name: sum(macs.get(s.name, 0) for s in mine)},
        "host_reasons": sorted(({**r, "ops": dict(r["ops"])} for r in reasons.values()),
                               key=lambda r: (-r["macs"], -r["count"], r["reason"])),
        "host_wall_seconds": sum(s.wall_seconds for s in host),
        f"{target.name}_wall_seconds": sum(s.wall_seconds for s in mine),
        "clock_mhz": clock_mhz,
        "cycles": cycles,
        "seconds_at_clock": summary.get("seconds_at_clock"),
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
              "host ms", f"{target_name} cycles", f"ms @{clock_mhz:g} MHz", "bit-exact")
    rows = []
    for r in records:
        ops, macs = r["ops"], r["macs"]
        share = macs[target_name] / macs["total"] if macs["total"] else 0.0
        cycles, ms = _cycles_cells(r)
        mac_cell = f"{_millions(macs[target_name])}/{_millions(macs['total'])} ({share:.1%})"
        rows.append((r["model"], f"{ops[target_name]}/{ops['total']}", mac_cell,
                     str(ops["host"]), f"{r['host_wall_seconds'] * 1e3:.1f}", cycles, ms,
                     "yes" if r["bit_exact"] else "NO"))
    for name, error in failures.items():
        rows.append((name, "-", "-", "-", "-", "-", "-", f"FAILED ({error.splitlines()[0]})"))
    lines = table(header, rows, right={1, 2, 3, 4, 5, 6})
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS),
                        metavar="MODEL", help=f"the models to run (default all: "
                                              f"{', '.join(MODELS)})")
    parser.add_argument("--backend", choices=("functional", "verilator"),
                        default="functional",
                        help="the accelerator's simulator (default functional: no cycles, "
                             "the timing model's estimate instead)")
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
        target, _ = make_target(argparse.Namespace(target="vdla", sim=args.backend,
                                                   config=args.config, board=None))
    except (CliError, ValueError) as e:      # a bad --config: vdla run's own message
        print(f"coverage: error: {e}", file=sys.stderr)
        return 1
    options = target.options()
    mode = args.mode or target.requant_modes[0]
    log(f"config {options['config']}, {options['backend']} backend, {mode} requantization")

    records, failures = [], {}
    with tempfile.TemporaryDirectory(prefix="vdla-coverage-") as tmp:
        onnx_dir = Path(args.out) / "onnx" if args.out else Path(tmp)
        for name in args.models:
            log(f"{name}: quantize, compile, run and check ...")
            start = time.perf_counter()
            try:
                record = run_one(name, target, args.mode, onnx_dir)
            except Exception as e:    # one model's failure must not hide the others' figures
                failures[name] = f"{type(e).__name__}: {e}"
                log(f"{name}: FAILED: {failures[name]}")
                traceback.print_exc(file=sys.stderr)
                continue
            records.append(record)
            log(f"{name}: {record['ops'][target.name]}/{record['ops']['total']} ops on "
                f"{target.name}, bit-exact {'yes' if record['bit_exact'] else 'NO'} "
                f"({time.perf_counter() - start:.1f} s)")

    print(f"Coverage on {target.name}: config {options['config']}, {options['backend']} "
          f"backend, {mode} requantization")
    for line in report(records, failures, target.name, options["clock_mhz"]):
        print(line)
    if args.out:
        path = Path(args.out) / "coverage.json"
        data = {"target": target.name, "options": options, "mode": mode,
                "models": {r["model"]: r for r in records}, "failures": failures}
        atomic_write(path, (json.dumps(data, indent=2) + "\n").encode())
        log(f"wrote {path}")
    return 0 if not failures and all(r["bit_exact"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
