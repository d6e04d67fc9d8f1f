"""The CPU target: its speed against onnxruntime and OpenVINO, its tuner, and its exactness.

Part 1, speed (ResNet-18, ResNet-50, MobileNet-v1; batch 1; `--threads` threads, 2 by
default), measured in one process, so the two compete on the same machine state:

* float32: vdla's CPU target on the prepared float graph against onnxruntime on the
  ONNX model `vdla export` writes from the same graph;
* int8: vdla's CPU target on vdla's quantized graph against onnxruntime on that ONNX
  model quantized by onnxruntime itself: `quant_pre_process`, then static QDQ
  quantization (`quantize_static`) on the same calibration samples; with int8
  activations (its default) and with uint8 activations (the faster path of its x86
  kernels). The goal is measured against the faster of the two.
* OpenVINO (its CPU plugin, `vdla.compiler.baseline_openvino`; when it is installed, or
  with `--openvino`): float32 on the same float ONNX model at inference precision f32,
  int8 on the same two QDQ models, the faster of them; the same threads, the latency
  hint. A second reference: the goal stays onnxruntime's.

vdla runs through its whole-graph runner (one C call, `ModelSession.run_graph`), once
with the default chooser's schedules and once with the tuned ones (part 2's records).
Every configuration runs in blocks of `--runs` runs; the blocks of all configurations
are interleaved over `--rounds` rounds, with a pause before each block so that no
thread pool (onnxruntime's or OpenMP's) still spins from the block before. Printed: the
median time per run, and the speed ratios (onnxruntime's time / vdla's, the goal >=
1.0, and OpenVINO's time / vdla's beside it) as the median over the rounds of each
round's ratio: this machine's speed drifts by tens of percent from one minute to the
next (its second core is sometimes only half there), and blocks measured seconds apart
see the same machine.

Part 2, tuning: per model and precision, `vdla tune`'s loop (the default schedule
first, then `--tuner`, by default the pretrained model corrected online) with `--trials`
wall-time measurements per distinct layer, kept in `--records` (a second run resumes).
Printed per layer: default and tuned time. The tuned column of part 1 compiles the
records' schedules with their layouts chosen for the whole graph (`best_schedules`).

Part 3, convergence: for `--layers` (ResNet-18 names, H,W,Cin,Cout,k,pad,stride, or
MODEL:PRECISION:NODE), a long run of `--long-trials`, then fresh runs of the model tuner
with other seeds: the trials each needed to come within 5% of the long run's best (a
schedule measured before is not measured again). The default layers are ones where the
default chooser is measurably off; on most layers it is within 5% already.

Part 4, exactness: the conv grid (kernels 1, 3, 5, 7; strides 1, 2; pads; groups 1, 2
and depthwise; channel counts that are no multiple of a vector width) on every
instruction set this machine runs, and the zoo models: int8 bit-exact against the
integer reference, float32's largest relative error against the float reference.

    python bench/cpu.py [--models resnet18 resnet50 mobilenet_v1] [--trials 32]
                        [--isa avx2] [--skip-tune] [--skip-convergence]
                        [--skip-exactness] [--out bench-cpu]

MODEL is a zoo name or an .onnx file (`bench/heldout.py` exports models the bench never
tuned on). `--isa` makes vdla generate code for another instruction set this machine
runs (AVX2 code on an AVX-512 machine); onnxruntime picks its kernels from the machine's
CPU features and has no setting that restricts them, so it runs as usual, and the report
says so.

Writes OUT/cpu.json and OUT/cpu.png (speed against onnxruntime; OpenVINO's bars beside
vdla's, on the same scale).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # numpy's BLAS off our cores

import numpy as np  # noqa: E402

from vdla.compiler import (Graph, baseline, baseline_openvino, pipeline,  # noqa: E402
                           run_reference, targets)
from vdla.compiler.frontend.onnx_export import save_onnx  # noqa: E402
from vdla.compiler.targets.model import compile_model  # noqa: E402
from vdla._platform import cpu_name  # noqa: E402
from vdla.compiler.tuner.workload_tasks import tasks_from_workload  # noqa: E402
from vdla.compiler.tuner import LocalRunner, Records, tune_task  # noqa: E402
from vdla.compiler.tuner.search import TUNERS  # noqa: E402
from vdla.compiler.targets.cpu import isa as cpu_isa  # noqa: E402

MODELS = ("resnet18", "resnet50", "mobilenet_v1")
GOAL = 1.0
WITHIN = 1.05


def log(message: str) -> None:
    print(f"[cpu bench] {message}", file=sys.stderr, flush=True)


# --- part 1: the configurations ---------------------------------------------------------

@dataclasses.dataclass
class Config:
    model: str
    precision: str
    who: str                 # "ort-fp32", "ort-s8", "ort-u8", "ov-fp32", "ov-s8", "ov-u8",
    #                          "vdla-default", "vdla-tuned"
    run: object              # a callable running one inference
    times: list = dataclasses.field(default_factory=list)
    rounds: list = dataclasses.field(default_factory=list)   # each round's median

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def vdla_runner(graph: Graph, target, feed, records=None):
    schedules = {}
    if records is not None:
        from vdla.compiler.tuner import best_schedules
        schedules = {n: s for n, (s, _) in best_schedules(records, graph, target).items()}
    compiled = compile_model(graph, target, schedules=schedules)
    session = compiled.session()
    run = session.run_graph(feed)
    if run is None:
        raise SystemExit(f"{graph.name}: not every op runs on the CPU target "
                         f"({[o.name for o in compiled.ops if o.target != 'cpu'][:4]})")
    return (lambda: session.run_graph(feed)), run.outputs, len(schedules)


def model_name(spec: str) -> str:
    """A zoo name, or an .onnx file's stem: the name the report and the files use."""
    return Path(spec).stem if spec.lower().endswith(".onnx") else spec


def cpu_target(args):
    return targets.get("cpu", threads=args.threads, isa=args.isa)


def speed(models, args, records: Records | None, workdir: Path) -> list[dict]:
    target = cpu_target(args)
    configs: list[Config] = []
    checks = []
    for spec in models:
        name = model_name(spec)
        model = pipeline.load_model(spec, calibration=args.calibration, note=None)
        x = model.feed[model.graph.inputs[0]].astype(np.float32)
        fp32 = save_onnx(model.graph, workdir / f"{name}.onnx")
        log(f"{name}: onnxruntime's quantization (int8 and uint8 activations) ...")
        ort_models = {"ort-fp32": fp32}
        for act in ("s8", "u8"):
            path = workdir / f"{name}-{act}.onnx"
            ort_models[f"ort-{act}"] = path if path.exists() else baseline.quantize_qdq(
                fp32, model, path, act)
        for who, path in ort_models.items():
            session = baseline.session(path, args.threads)
            feed = {session.get_inputs()[0].name: x}
            configs.append(Config(name, "float32" if who == "ort-fp32" else "int8", who,
                                  lambda s=session, f=feed: s.run(None, f)))
            if args.openvino:
                configs.append(Config(name, "float32" if who == "ort-fp32" else "int8",
                                      "ov" + who[3:],
                                      baseline_openvino.runner(path, args.threads, [x])))
        for precision in ("float32", "int8"):
            log(f"{name} {precision}: compiling for the CPU target ...")
            graph = pipeline.graph_for(model, target, precision=precision)
            reference = run_reference(graph, model.feed)
            for who, recs in (("vdla-default", None), ("vdla-tuned", records)):
                if who == "vdla-tuned" and recs is None:
                    continue
                run, out, tuned = vdla_runner(graph, target, model.feed, recs)
                error = max(pipeline.relative_error(out[o], reference[o]) for o in graph.outputs)
                checks.append({"model": name, "precision": precision, "who": who,
                               "tuned_ops": tuned, "max_error": error})
                if precision == "int8" and error != 0.0 or error > pipeline.FLOAT_TOLERANCE:
                    raise SystemExit(f"{name} {precision} {who}: output differs from the "
                                     f"reference by {error:.3g}")
                configs.append(Config(name, precision, who, run))
    log(f"timing {len(configs)} configurations: {args.rounds} rounds of {args.runs} runs ...")
    time_interleaved(configs, args)
    rows = []
    for name in map(model_name, models):
        for precision in ("float32", "int8"):
            mine = [c for c in configs if c.model == name and c.precision == precision]
            ort = {c.who: c for c in mine if c.who.startswith("ort")}
            base = min(ort.values(), key=lambda c: c.median)
            row = {"model": name, "precision": precision,
                   "ort": {who: c.median * 1e3 for who, c in ort.items()},
                   "ort_best": base.who, "ort_ms": base.median * 1e3}
            ov = {c.who: c for c in mine if c.who.startswith("ov")}
            second = min(ov.values(), key=lambda c: c.median) if ov else None
            if second is not None:
                row.update(ov={who: c.median * 1e3 for who, c in ov.items()},
                           ov_best=second.who, ov_ms=second.median * 1e3,
                           openvino=speed_of(second, base))
            for c in mine:
                if c.who.startswith("vdla"):
                    row[c.who] = speed_of(c, base)
                    if second is not None:
                        against = speed_of(c, second)
                        row[c.who].update(speed_ov=against["speed"],
                                          speed_ov_rounds=against["speed_rounds"])
            rows.append(row)
    for check in checks:
        for row in rows:
            if (row["model"], row["precision"]) == (check["model"], check["precision"]) \
                    and check["who"] in row:
                row[check["who"]].update(max_error=check["max_error"],
                                         tuned_ops=check["tuned_ops"])
    return rows


def speed_of(config: Config, base: Config) -> dict:
    """`config`'s median time per run and its speed against `base` (base's time /
    config's): this machine's speed drifts (its second core is sometimes half there), so
    the ratio of each round's blocks, measured seconds apart, then the median over the
    rounds."""
    ratios = [b / c for b, c in zip(base.rounds, config.rounds)]
    return {"ms": config.median * 1e3, "speed": statistics.median(ratios),
            "speed_rounds": ratios, "runs": len(config.times)}


def print_speed(rows, threads: int) -> None:
    with_ov = any("ov_ms" in r for r in rows)
    print(f"\nSpeed against onnxruntime{' and OpenVINO' if with_ov else ''} ({threads} "
          f"threads, batch 1; median ms per run; speed = onnxruntime's time / vdla's, goal "
          f">= {GOAL}" + ("; then OpenVINO's time / vdla's" if with_ov else "") + ")")
    width = 26 if with_ov else 22
    print(f"{'model':14}{'prec':9}{'onnxruntime':>16}" + (f"{'openvino':>16}" if with_ov else "")
          + f"{'vdla default':>{width}}{'vdla tuned':>{width}}  goal")
    for r in rows:
        refs = [_reference_cell(r, "ort")] + ([_reference_cell(r, "ov")] if with_ov else [])
        cells = []
        for who in ("vdla-default", "vdla-tuned"):
            if who not in r:
                cells.append("-")
                continue
            ratios = f"{r[who]['speed']:.2f}x" + (f", {r[who]['speed_ov']:.2f}x"
                                                  if "speed_ov" in r[who] else "")
            cells.append(f"{r[who]['ms']:.2f} ({ratios})")
        best = max(r[w]["speed"] for w in ("vdla-default", "vdla-tuned") if w in r)
        print(f"{r['model']:14}{r['precision']:9}" + "".join(f"{c:>16}" for c in refs)
              + f"{cells[0]:>{width}}{cells[1]:>{width}}  {'yes' if best >= GOAL else 'NO'}")
        if r["precision"] == "int8":
            for key, name in (("ort", "onnxruntime"), ("ov", "OpenVINO")):
                if key in r:
                    print(f"{'':23}{name} int8 activations {r[key][key + '-s8']:.2f} ms, "
                          f"uint8 activations {r[key][key + '-u8']:.2f} ms")


def _reference_cell(row: dict, key: str) -> str:
    """A reference runtime's time in `row` (`key` "ort" or "ov"), int8 with the faster
    of its two QDQ models; "-" where it did not run."""
    if f"{key}_ms" not in row:
        return "-"
    variant = row[f"{key}_best"].split("-", 1)[1]
    return (f"{row[f'{key}_ms']:.2f} ({variant})" if row["precision"] == "int8"
            else f"{row[f'{key}_ms']:.2f}")


def plot_speed(rows, path: Path, *, threads: int, isa: str) -> None:
    """Bars of vdla's speed relative to onnxruntime (default and tuned schedules), and
    OpenVINO's where it ran, per model and precision, onnxruntime's time under each
    group, the goal as a line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    # The reference's time on lines of its own: on one line the neighbours' labels met.
    labels = [f"{r['model']}\n{r['precision']}\nonnxruntime\n{r['ort_ms']:.1f} ms"
              + (f" ({r['ort_best'][4:]})" if r["precision"] == "int8" else "") for r in rows]
    top = 1.0
    # Only the columns the run measured (no tuned bars, and no legend entry, without
    # records), side by side around each group's tick.
    columns = [(who, color, label) for who, color, label in (
        ("vdla-default", "#9ecae1", "vdla cpu, default schedules"),
        ("vdla-tuned", "#08519c", "vdla cpu, tuned schedules"),
        ("openvino", "#bdbdbd", "OpenVINO (int8: its faster variant)"))
        if any(who in r for r in rows)]
    width = 0.76 / len(columns)
    for i, (who, color, label) in enumerate(columns):
        values = [r[who]["speed"] if who in r else 0 for r in rows]
        xs = [k + (i - (len(columns) - 1) / 2) * width for k in range(len(rows))]
        ax.bar(xs, values, width, color=color, label=label,
               hatch=".." if who == "openvino" else None)
        for x, v, r in zip(xs, values, rows):
            if v:
                ax.text(x, v + 0.015, f"{v:.2f}\n{r[who]['ms']:.1f} ms", ha="center",
                        va="bottom", fontsize="x-small",
                        bbox=dict(facecolor="white", edgecolor="none", pad=0.5, alpha=0.8))
                top = max(top, v)
    ax.axhline(1.0, color="black", lw=1, label="onnxruntime (int8: its faster variant)")
    ax.axhline(GOAL, color="red", lw=1, ls="--", label=f"goal: {GOAL}x onnxruntime's speed")
    ax.set_ylim(0, top + 0.25)
    ax.set_xticks(range(len(rows)), labels, fontsize="x-small")
    ax.set_ylabel("speed relative to onnxruntime (higher is faster)")
    # The thread count and instruction set are the run's, never assumed: the figure names
    # what it measured.
    plural = "" if threads == 1 else "s"
    others = ("onnxruntime and OpenVINO" if any("openvino" in r for r in rows)
              else "onnxruntime")
    ax.set_title(f"vdla's CPU target ({isa}) against {others}: batch 1, {threads} "
                 f"thread{plural}, measured side by side", fontsize="medium")
    ax.legend(fontsize="x-small", loc="upper center", ncol=4, bbox_to_anchor=(0.5, -0.22),
              frameon=False)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


# --- part 2: tuning -----------------------------------------------------------------------

def tune(models, args, records: Records) -> list[dict]:
    target = cpu_target(args)
    rows = []
    with LocalRunner("wall", jobs=1, log=log) as runner:
        for spec in models:
            name = model_name(spec)
            model = pipeline.load_model(spec, calibration=args.calibration, note=None)
            for precision in ("float32", "int8"):
                graph = pipeline.graph_for(model, target, precision=precision)
                tasks = target.tasks(graph)
                for i, task in enumerate(tasks):
                    log(f"tuning {name} {precision} [{i + 1}/{len(tasks)}] {task.describe()}")
                    r = tune_task(task, runner, trials=args.trials, records=records,
                                  tuner=args.tuner, seed=args.seed)
                    rows.append({"model": name, "precision": precision, "layer": task.name,
                                 "shape": task.describe(), "nodes": len(task.nodes),
                                 "space": r.space_size, "trials": r.trials,
                                 "default_us": None if r.default_cycles is None
                                 else r.default_cycles / 1e3,
                                 "tuned_us": None if r.best_cycles is None else r.best_cycles / 1e3,
                                 "speedup": r.speedup,
                                 "best": task.schedule_to_dict(r.best) if r.best else None})
    return rows


def print_tuning(rows) -> None:
    print("\nTuned against default schedules, per layer (median wall time of the layer "
          "alone, us; x: nodes sharing the layer's shape)")
    print(f"{'model':13}{'prec':8}{'layer':42}{'x':>3}{'default':>10}{'tuned':>10}{'speedup':>9}")
    for r in rows:
        print(f"{r['model']:13}{r['precision']:8}{r['shape'][:41]:42}{r['nodes']:>3}"
              f"{r['default_us'] or 0:>10.1f}{r['tuned_us'] or 0:>10.1f}"
              f"{(r['speedup'] or 0):>8.2f}x")


# --- part 3: convergence ---------------------------------------------------------------

class MemoRunner:
    """Measures each (task, schedule) once; later seeds get the same result."""

    def __init__(self, runner):
        self.runner, self.backend, self.memo = runner, runner.backend, {}

    def measure(self, inputs):
        todo = [i for i in inputs if (i.task.uid, i.schedule) not in self.memo]
        for inp, result in zip(todo, self.runner.measure(todo) if todo else []):
            self.memo[inp.task.uid, inp.schedule] = result
        return [self.memo[i.task.uid, i.schedule] for i in inputs]


def layer_task(spec: str, target, args):
    """The task of `spec`: a ResNet-18 layer name or H,W,Cin,Cout,k,pad,stride (int8,
    `tasks_from_workload`), or MODEL:PRECISION:NODE (the task holding that node)."""
    if spec.count(":") != 2:
        return tasks_from_workload(spec, target)[0]
    name, precision, node = spec.split(":")
    model = pipeline.load_model(name, calibration=args.calibration, note=None)
    for task in target.tasks(pipeline.graph_for(model, target, precision=precision)):
        if node in task.nodes:
            return task
    raise SystemExit(f"--layers {spec}: {name} at {precision} has no tunable node {node!r}")


def convergence(args, out: Path) -> list[dict]:
    target = cpu_target(args)
    rows = []
    folder = out / "convergence"
    folder.mkdir(exist_ok=True)
    with LocalRunner("wall", jobs=1, log=log) as local:
        runner = MemoRunner(local)
        for layer in args.layers:
            task = layer_task(layer, target, args)
            log(f"convergence {layer}: a long run of {args.long_trials} trials ...")
            safe = layer.replace(":", "-").replace(",", "_")
            # Always a fresh long run: a resumed one measures nothing new, and its best
            # must be like against like with the fresh seeds' first measurements.
            (folder / f"{safe}-long.db").unlink(missing_ok=True)
            with Records(folder / f"{safe}-long.db") as records:
                long = tune_task(task, runner, trials=args.long_trials, records=records,
                                 seed=0, confirm=0)
            # Like against like: every schedule's first (memoized) measurement.
            best = min(m.cycles for _, m in long.history if m.ok)
            needed = []
            for seed in range(1, args.seeds + 1):
                # A fresh search, resumed 8 trials at a time until one is within 5%.
                path = folder / f"{safe}-seed{seed}.db"
                path.unlink(missing_ok=True)
                hit, done = None, 0
                with Records(path) as records:
                    while hit is None and done < args.long_trials:
                        r = tune_task(task, runner, trials=min(done + 8, args.long_trials),
                                      records=records, seed=seed, confirm=0)
                        for k, (_, m) in enumerate(r.history, done + 1):
                            if m.ok and m.cycles <= WITHIN * best:
                                hit = k
                                break
                        done = r.trials
                needed.append(hit)
            rows.append({"layer": layer, "shape": task.describe(), "space": long.space_size,
                         "long_trials": long.trials, "best_us": best / 1e3,
                         "default_us": (long.default_cycles or 0) / 1e3,
                         "default_within_5pct": (long.default_cycles or 0) <= WITHIN * best,
                         "trials_to_5pct": needed})
    return rows


def print_convergence(rows, long_trials: int) -> None:
    print(f"\nTrials to come within 5% of the best of a {long_trials}-trial run (model "
          "tuner, fresh seeds)")
    print(f"{'layer':40}{'shape':44}{'space':>7}{'best us':>9}{'default':>9}  trials "
          "per seed")
    for r in rows:
        print(f"{r['layer'][:39]:40}{r['shape'][:43]:44}{r['space']:>7}{r['best_us']:>9.1f}"
              f"{r['default_us']:>9.1f}  {r['trials_to_5pct']}")


# --- part 4: exactness -------------------------------------------------------------------

def exactness(args) -> dict:
    from vdla.compiler.targets.cpu.build import machine_features

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "compiler"
                           / "targets" / "cpu"))
    from test_cpu_target import conv_graph   # the tests' graphs: one definition

    isas = [n for n, i in cpu_isa.ISAS.items() if i.runs_on(machine_features())]
    grid = [dict(k=k, stride=s, pad=p) for k, s, p in itertools.product(
        (1, 3, 5, 7), (1, 2), (0, 1, 3)) if p < k]
    groups = [dict(groups=1, c=13, o=10), dict(groups=2, c=14, o=10),
              dict(groups=12, c=12, o=12)]
    out = {"isas": isas, "grid": len(grid) * len(groups), "int8_exact": 0, "int8_total": 0,
           "float_max_error": 0.0, "models": {}}
    for isa in isas:
        target = targets.get("cpu", threads=args.threads, isa=isa)
        log(f"exactness: the conv grid on {isa} ...")
        for shape, group in itertools.product(grid, groups):
            for dtype in ("int8", "float32"):
                rng = np.random.default_rng(len(out["models"]) + out["int8_total"])
                g, feed = conv_graph(rng, h=11, w=10, dtype=dtype, **shape, **group)
                compiled = compile_model(g, target)
                with compiled.session() as session:
                    got = session.run(feed).outputs[g.outputs[0]]
                want = run_reference(g, feed)[g.outputs[0]]
                if dtype == "int8":
                    out["int8_total"] += 1
                    out["int8_exact"] += int(np.array_equal(got, want))
                else:
                    out["float_max_error"] = max(out["float_max_error"],
                                                 pipeline.relative_error(got, want))
    target = cpu_target(args)
    for name in ("digits_cnn", "small_cnn", "mobilenet_v1", "resnet18", "resnet50"):
        model = pipeline.load_model(name, calibration=args.calibration, note=None)
        result = {}
        for precision in ("int8", "float32"):
            o = pipeline.run_model(model, target, precision=precision)
            result[precision] = {"ok": o.bit_exact, "max_error": o.max_error}
        out["models"][name] = result
        log(f"exactness: {name}: {result}")
    return out


def print_exactness(e) -> None:
    print(f"\nExactness: conv grid of {e['grid']} shapes on {', '.join(e['isas'])}: int8 "
          f"bit-exact {e['int8_exact']}/{e['int8_total']}; float32 largest relative error "
          f"{e['float_max_error']:.2e}")
    for name, r in e["models"].items():
        print(f"  {name:14} int8 bit-exact: {'yes' if r['int8']['ok'] else 'NO'}; float32 "
              f"relative error {r['float32']['max_error']:.2e}")


# --- main ----------------------------------------------------------------------------------

def model_spec(spec: str) -> str:
    try:
        return pipeline.check_model_spec(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def time_interleaved(configs: list[Config], args) -> None:
    """Each configuration's blocks of `args.runs` runs, interleaved over `args.rounds`
    rounds with `args.pause` seconds before each block (after three warm-up runs each),
    as both CPU benches time them: times into each `Config`'s ``times`` and ``rounds``."""
    for config in configs:
        for _ in range(3):
            config.run()
    for _ in range(args.rounds):
        for config in configs:
            time.sleep(args.pause)
            block = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                config.run()
                block.append(time.perf_counter() - t0)
            config.times += block
            config.rounds.append(statistics.median(block))

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), type=model_spec,
                   help=f"zoo names or .onnx files (default: {' '.join(MODELS)})")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--isa", default=None, choices=list(cpu_isa.ISAS),
                   help="vdla's instruction set (default: the best this machine runs)")
    p.add_argument("--calibration", type=int, default=4)
    p.add_argument("--runs", type=int, default=10, help="runs per block (default 10)")
    p.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    p.add_argument("--pause", type=float, default=0.3,
                   help="seconds between blocks (default 0.3)")
    p.add_argument("--trials", type=int, default=32, help="tuning trials per layer")
    p.add_argument("--tuner", default="pretrained", choices=list(TUNERS),
                   help="the search (default pretrained: the shipped cost model, which "
                        "knows the layout and Winograd knobs, corrected online)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", nargs="+", default=[
        "mobilenet_v1:int8:features.1.pw.conv", "resnet50:int8:layer2.0.conv1",
        "mobilenet_v1:float32:features.0.pw.conv", "mobilenet_v1:float32:features.6.dw.conv"])
    p.add_argument("--long-trials", type=int, default=160)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--records", default=None,
                   help="tuning records (default OUT/cpu-records.db)")
    p.add_argument("--out", default="bench-cpu", help="output folder (default bench-cpu)")
    p.add_argument("--skip-tune", action="store_true",
                   help="no tuning (the tuned figures come from --records if it exists)")
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--skip-convergence", action="store_true")
    p.add_argument("--skip-exactness", action="store_true")
    p.add_argument("--openvino", action=argparse.BooleanOptionalAction, default=None,
                   help="OpenVINO's columns in the speed part (default: when it is "
                        "installed; --openvino without it is an error)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records_path = Path(args.records) if args.records else out / "cpu-records.db"
    report = {"threads": args.threads, "models": args.models}
    report["cpu"] = cpu_name()
    try:
        report["isa"] = cpu_target(args).isa.name
    except ValueError as e:             # an ISA this machine or its compiler lacks
        raise SystemExit(f"--isa {args.isa}: {e}")
    report["machine_isa"] = cpu_isa.detect().name
    import onnxruntime
    report["onnxruntime"] = onnxruntime.__version__
    missing = baseline_openvino.available()
    if args.openvino and missing:
        raise SystemExit(f"--openvino: {missing}")
    if args.openvino is None:
        args.openvino = missing is None
        if missing and not args.skip_speed:
            log(f"no OpenVINO columns: {missing}")
    report["openvino"] = baseline_openvino.version() if args.openvino else None
    print(f"machine: {report['cpu']}, {os.cpu_count()} cores, {report['machine_isa']}; "
          f"vdla's code for {report['isa']}; onnxruntime {report['onnxruntime']}"
          + (f", OpenVINO {report['openvino']}" if args.openvino else "")
          + " (their kernels for the machine's own features: neither has a setting that "
            "restricts them)")
    records = None
    if not args.skip_tune:
        started = time.perf_counter()
        with Records(records_path) as records:
            report["tuning"] = tune(args.models, args, records)
        report["tuning_seconds"] = time.perf_counter() - started
        print_tuning(report["tuning"])
    # Tuning and convergence measure in forked worker processes: they run before this
    # process starts OpenMP's threads (speed, exactness), which a fork does not carry.
    if not args.skip_convergence:
        report["convergence"] = convergence(args, out)
        print_convergence(report["convergence"], args.long_trials)
    if records_path.exists():
        records = Records(records_path)
    if not args.skip_speed:
        work = out / "onnx"          # kept: onnxruntime's quantization takes minutes
        work.mkdir(exist_ok=True)
        report["speed"] = speed(args.models, args, records, work)
        print_speed(report["speed"], args.threads)
        plot_speed(report["speed"], out / "cpu.png", threads=args.threads, isa=report["isa"])
    if not args.skip_exactness:
        report["exactness"] = exactness(args)
        print_exactness(report["exactness"])
    (out / "cpu.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"\nwrote {out / 'cpu.json'}" + ("" if args.skip_speed else f", {out / 'cpu.png'}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
