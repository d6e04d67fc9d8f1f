"""Whole models on platforms the pretrained models never saw: zero-shot
schedules and a whole model tuned in 64 measurements on Verilator, and a whole model
tuned in 64 measurements on the CPU.

Part 1, ``zeroshot``: ResNet-18 and MobileNet-v1 on each of `--configs` configs of
``bench/datasets/make_vdla_fewshot_v1.py`` (none in a training set), run on Verilator
with every tunable op's schedule from the default chooser, from the learned chooser
(`--chooser learned`: the pretrained model's first pick, nothing measured) and from a
`--tuned`-trial run of `vdla tune` (the pretrained tuner and the task scheduler):
the model's cycles each way. Targets: learned <= default on every config, and within 3%
of the tuned run.

Part 2, ``model``: ResNet-18 on `--model-config` (default: the first training set's first
held-out config, a 32x32 core with the ALU's src hold, where the default chooser is 9%
off the tuned schedules), tuned by several strategies, each from empty records:

* ``pretrained + scheduler``: `vdla tune resnet18 --trials 64`'s way;
* ``pretrained, equal split``: the same model, 64 / tasks each;
* ``scratch, equal split``: the from-scratch model tuner, 64 / tasks each;
* ``random, equal split``: random search;
* ``scratch, 1000 trials``: the reference, AutoTVM's way (``--reference`` trials);
* ``unshared + scheduler``, only when named in ``--strategies``: the pretrained tuner
  with the scheduler, each task learning from its own measurements alone
  (``tune_tasks(share=False)``), to measure the shared correction against.

Printed: the tuned ops' cost (each task's best cycles times its nodes) with the
default schedules and after each strategy, the share of the reference's improvement
each gets (target: >= 99% for pretrained + scheduler), and the tuning overhead (wall
time outside measurements: fitting, search, features) over the measurements' wall time
(target: <= 10%). The spaces and features of a (config, workload) are computed once and
remembered in vdla's cache (`remembered_space`, `space_features`); the first run on a
config pays for them, and the bench prints what that costs for the model's tasks. The
tuning curves are plotted (``--plot``).

Part 3, ``cpu``: the same strategies for ``--cpu-model`` at each ``--cpu-precision``
(default MobileNet-v1 float32, a model and precision the CPU's training set never
measured, ``make_cpu_v3.sh``) on the CPU (the widest instruction set this machine runs,
one thread, one measurement at a time). The bench prints the platforms the shipped
models were trained on beside this machine. ``--cpu-leave-out ISA`` makes the pretrained
strategies start from models trained as shipped (their metadata's sets and settings)
without that instruction set's rows: a machine kind they have not seen (``auto``: the
instruction set the target runs here, where the rows have it). The CPU's target is 95%
of the reference's gain (a tuner adapting to a machine it has not seen), not
Verilator's 99%. Wall
times are noisy and the fastest of a long search is flattered by its luck, so the
strategies are compared by their picks measured again side by side: every strategy's
best schedule of every task and its default, one after another in slots of a few
milliseconds, 15 rounds (`TuneTask.side_by_side`), each pick by its median ratio to the
default. Where the reference gains less than `SIDE_NOISE` (about what two side-by-side
measurements of the same picks differ by), no share of its gain is defined, and the
target is the pretrained tuner's picks within `SIDE_NOISE` of the reference's.
Its curves go to ``--cpu-plot``.

Records: one file per (platform, model, strategy) under ``--records`` (default
``bench-tuner-model`` in vdla's cache folder), so a rerun resumes and measures nothing
twice; a pretrained strategy's file is also its models' (their digest), so a model
trained again starts from empty records.

    python bench/tuner_model.py [--part zeroshot model cpu] [--configs 5] [--tuned 256]
                                [--reference 1000] [--jobs 2] [--plot PNG] [--cpu-plot PNG]
                                [--cpu-model resnet18] [--cpu-precision float32 int8]
                                [--cpu-leave-out auto]

(from anywhere: it imports only the installed package)
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from vdla._buildcache import cache_root  # noqa: E402
from vdla._platform import cpu_name  # noqa: E402
from vdla.compiler import pipeline  # noqa: E402
from vdla.compiler.targets.cpu.target import CpuTarget  # noqa: E402
from vdla.compiler.targets.vdla import VdlaTarget  # noqa: E402
from vdla.compiler.tuner import LocalRunner, ModelTuner, Records, tune_tasks  # noqa: E402
from vdla.compiler.tuner.candidates import POOL, Candidates, remembered_space  # noqa: E402
from vdla.compiler.tuner.cost_model import CostModel, file_name  # noqa: E402
from vdla.compiler.tuner.rows import Rows  # noqa: E402
from vdla.compiler.tuner.plot import tuning_curves  # noqa: E402
from vdla.compiler.tuner.search import scratch_rows  # noqa: E402
from vdla.compiler.tuner.space import knob_grid  # noqa: E402
from vdla.compiler.training_sets import training_set, unseen_platforms  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def unseen_configs() -> list:
    """The configs no training set measured (``bench/datasets/make_vdla_fewshot_v1.py``'s
    five): the platforms ``vdla_v1`` never trained on (`unseen_platforms`)."""
    training = json.loads((ROOT / "bench" / "datasets" / "vdla_v1.db.manifest.json")
                          .read_text())
    return [target.config for target in unseen_platforms(training)]


#: How far two side-by-side measurements of the same picks put the tuned ops' total
#: apart (docs/tuner.md: over 20 layers, about 1%).
SIDE_NOISE = 0.01
#: The share of the 1,000-trial reference's gain the pretrained tuner must reach in 64
#: trials: on Verilator's exact cycles, and on the CPU's wall times (a machine the model
#: may never have seen, whose side-by-side figures are themselves noisy by about 1%).
SHARE = {"cycles": 0.99, "wall": 0.95}
MODELS = ("resnet18", "mobilenet_v1")
#: Part 2's config: vdla_v1's first held-out config.
HELD_OUT = "1x32x32_i8w8a32_15_14_19_18-hold"
STRATEGIES = {   # name -> (tuner, split, trials: "few" or "reference", share)
    "pretrained + scheduler": ("pretrained", "gradient", "few", True),
    "pretrained, equal split": ("pretrained", "equal", "few", True),
    "scratch, equal split": ("model", "equal", "few", True),
    "random, equal split": ("random", "equal", "few", True),
    "scratch, reference": ("model", "equal", "reference", True),
    "unshared + scheduler": ("pretrained", "gradient", "few", False),
}
#: What runs unless `--strategies` names others (the unshared one is an ablation).
DEFAULT_STRATEGIES = tuple(name for name in STRATEGIES if name != "unshared + scheduler")


def left_out(tasks, isa: str, folder: Path, *, required: bool) -> tuple[list, str]:
    """`tasks` remade to read models trained as their shipped ones were (the sets and
    settings the metadata names) on the rows of every instruction set but `isa`, saved
    under `folder`: a machine kind the pretrained tuner has not seen. Returns the tasks
    and what was trained, for the heading. Rows without `isa` are an error when
    `required`, else that model stays as shipped (it never saw `isa`)."""
    folder.mkdir(parents=True, exist_ok=True)
    said = []
    for feature_set in {task.feature_set.name: task.feature_set for task in tasks}.values():
        task = next(t for t in tasks if t.feature_set is feature_set)
        model = task.pretrained()
        if model is None:
            continue
        meta = model.meta
        rows = Rows.join([training_set(ROOT / "bench" / "datasets" / m,
                                       feature_set=feature_set.name)[0]
                          for m in meta["trained_on"]])
        isa_of = np.array([rows.tasks[g][0].rsplit(", ", 1)[-1] for g in rows.groups])
        keep = isa_of != isa
        if keep.all() and not required:
            said.append(f"{feature_set.name} as shipped (no {isa} rows)")
            continue
        if keep.all():
            raise SystemExit(f"{feature_set.name}'s training rows have no {isa!r} platform: "
                             f"nothing to leave out (they have "
                             f"{', '.join(sorted(set(isa_of)))})")
        model = CostModel.fit(rows.subset(keep), feature_set, trees=meta["trees"],
                              depth=meta["depth"], rate=meta["rate"],
                              residual=meta["residual"],
                              meta={"left_out": isa, "trained_on": meta["trained_on"]})
        model.save(folder / file_name(feature_set))
        said.append(f"{feature_set.name} on {int(keep.sum()):,} of {len(rows):,} rows")
    return [dataclasses.replace(task, models=folder) for task in tasks], "; ".join(said)


def seen_platforms(tasks) -> list[str]:
    """The platforms the shipped models of `tasks` were trained on (their metadata)."""
    seen = set()
    for task in tasks:
        model = task.pretrained()
        if model is not None:
            seen.update(model.meta.get("platforms", ()))
    return sorted(seen)


class TimedRunner:
    """A runner that adds up the wall time of its `measure` calls."""

    def __init__(self, runner):
        self.runner, self.backend, self.seconds = runner, runner.backend, 0.0

    def measure(self, inputs, on_result=None):
        start = time.perf_counter()
        try:
            if on_result is None:
                return self.runner.measure(inputs)
            return self.runner.measure(inputs, on_result=on_result)
        finally:
            self.seconds += time.perf_counter() - start


def tune(tasks, runner, path: Path, *, trials: int, tuner: str, split: str, batch: int,
         share: bool = True):
    """`tune_tasks` into the records at `path`: (its `ModelTuning`, the measurements' wall
    seconds, the whole wall seconds)."""
    timed = TimedRunner(runner)
    start = time.perf_counter()
    with Records(path) as db:
        tuning = tune_tasks(tasks, timed, trials=trials, records=db, tuner=tuner, split=split,
                            batch=batch, share=share)
    return tuning, timed.seconds, time.perf_counter() - start


def cycles(model, target, **options) -> int:
    outcome = pipeline.run_model(model, target, jobs=2, **options)
    if not outcome.bit_exact:
        raise SystemExit(f"{model.name} on {target.config.name}: not bit-exact: "
                         f"{outcome.mismatch}")
    return outcome.result.cycles


def zeroshot(args, runner) -> bool:
    print(f"Part 1: zero-shot on {args.configs} unseen configs: the model's Verilator cycles "
          f"with the default chooser, the learned chooser, and a {args.tuned}-trial tune "
          "(pretrained + scheduler)")
    print(f"  {'config':34s} {'model':13s} {'default':>11s} {'learned':>11s} {'tuned':>11s} "
          f"{'learned/default':>15s} {'learned/tuned':>13s}")
    ok = True
    for config in unseen_configs()[:args.configs]:
        target = VdlaTarget(config)
        for name in MODELS:
            model = pipeline.load_model(name)
            graph = pipeline.graph_for(model, target)
            path = args.records / config.name / f"{name}-tuned.db"
            path.parent.mkdir(parents=True, exist_ok=True)
            tune(target.tasks(graph), runner, path, trials=args.tuned, tuner="pretrained",
                 split="gradient", batch=args.batch)
            default = cycles(model, target)
            learned = cycles(model, target, chooser="learned")
            with Records(path) as db:
                tuned = cycles(model, target, records=db)
            ok &= learned <= default and learned <= tuned * 1.03
            print(f"  {config.name:34s} {name:13s} {default:11,} {learned:11,} {tuned:11,} "
                  f"{learned / default:15.4f} {learned / tuned:13.4f}", flush=True)
    print("  " + ("PASS" if ok else "BELOW") + " (targets: learned <= default, learned <= "
          "1.03 x tuned, on every config)")
    return ok


def first_run_cost(tasks) -> tuple[float, float]:
    """Seconds to enumerate the spaces of `tasks` and compute without the cache what the
    pretrained tuner ranks (`Candidates`: every schedule's features, or a large space's
    sample's and its knob grid), and what the from-scratch tuner learns from (its own
    features of a whole space, `ModelTuner`): what a first tuning run on a platform pays
    once, for each."""
    pretrained = scratch = 0.0
    for task in tasks:
        start = time.perf_counter()
        space = task.space()
        sample = (range(len(space)) if len(space) <= POOL else
                  np.random.default_rng(0).choice(len(space), POOL, replace=False))
        for i in sample:
            task.feature_set.vector(task.transfer_features(space[i]))
        if len(space) > POOL:
            knob_grid(task, space)
        pretrained += time.perf_counter() - start
        start = time.perf_counter()
        if len(space) <= POOL:
            scratch_rows(task, space, task.estimate(space[0]) is not None)
        scratch += time.perf_counter() - start
    return pretrained, scratch


def warm_caches(tasks) -> None:
    """Fill the on-disk caches the pretrained tuner reads (`Candidates`: a space's
    features and predictions, a large space's sample and knob grid) before any strategy
    runs, and the from-scratch tuner's features of a whole space (`ModelTuner`), so that
    none of their overheads holds what only a platform's first run pays (`first_run_cost`
    prints that)."""
    for task in tasks:
        model = task.pretrained()
        space = remembered_space(task)
        if model is not None:     # what `pretrained_choice` does, the climb included
            found = Candidates(task, model, space)
            found.climb(found.prior)
        if len(space) <= POOL:
            ModelTuner(task, space)


def side_by_side(results: dict) -> dict[str, int]:
    """Wall-time tasks: every strategy's best schedule of every task and its default,
    measured again in turn (`TuneTask.side_by_side`: on the CPU, slots of a few
    milliseconds in 15 rounds), so that the strategies are compared under the same
    machine state rather than by the fastest of their own noisy searches. A pick's cost
    is its median ratio to the default over the rounds times the default's fastest
    slot; the tuned ops' cost (each task's times its nodes) by strategy, ``default``
    included."""
    first = next(iter(results.values()))[0]
    names = ["default", *results]
    total = dict.fromkeys(names, 0)
    for k, r in enumerate(first.results):
        picks = [r.default] + [tuning.results[k].best for tuning, _, _ in results.values()]
        unique = list(dict.fromkeys(picks))
        times = r.task.side_by_side(unique)
        anchor = float(times[:, 0].min())
        for name, pick in zip(names, picks):
            ratio = float(np.median(times[:, unique.index(pick)] / times[:, 0]))
            total[name] += len(r.task.nodes) * int(round(ratio * anchor))
    return total


def pretrained_digest(tasks) -> str:
    """A short digest of the pretrained models `tasks` start from (`CostModel.digest`)."""
    digests = sorted({m.digest for m in (task.pretrained() for task in tasks) if m is not None})
    return hashlib.sha256(" ".join(digests).encode()).hexdigest()[:12]


def whole_model(args, runner, target, model: str, *, precision: str, folder: Path,
                where: str, short: str, plot: Path | None, leave_out: str | None = None
                ) -> bool:
    """Part 2 (or 3): `model` at `precision` on `target`, tuned by each strategy from
    empty records kept under `folder`; `where` names the platform in the heading,
    `short` in the plot's title; the curves go to `plot`. With `leave_out`, the
    pretrained strategies' models are trained without that instruction set (`left_out`)."""
    tasks = target.tasks(pipeline.graph_for(pipeline.load_model(model), target,
                                            precision=precision))
    noisy = any(task.noisy for task in tasks)
    unit = tasks[0].unit
    target_share = SHARE["wall" if noisy else "cycles"]
    if noisy:
        print(f"\nthe shipped models were trained on: {'; '.join(seen_platforms(tasks))}")
    if leave_out:
        auto = leave_out == "auto"
        leave_out = target.isa.name if auto else leave_out
        tasks, said = left_out(tasks, leave_out, folder / f"models-without-{leave_out}",
                               required=not auto)
        print(f"the pretrained strategies start from models trained without {leave_out}'s "
              f"rows: {said}")
    cold = first_run_cost(tasks)
    warm_caches(tasks)
    print(f"\n{model} {precision} ({len(tasks)} tasks) tuned on {where}, each strategy from "
          f"empty records; {runner.backend}, {getattr(runner, 'jobs', 1)} jobs, batches of "
          f"{args.batch}")
    print(f"  {'strategy':26s} {'trials':>6s} {'tuned ops':>13s} {'speedup':>8s} "
          f"{'of the reference gain':>21s} {'overhead':>8s}")
    results, curves, runs = {}, {}, {}
    for name in args.strategies:
        tuner, split, budget, share = STRATEGIES[name]
        trials = args.few if budget == "few" else args.reference
        folder.mkdir(parents=True, exist_ok=True)
        stem = model if precision == "int8" else f"{model}-{precision}"
        without = f"-without-{leave_out}" if leave_out and tuner == "pretrained" else ""
        # A pretrained strategy's records are its models' (a model trained again starts
        # from empty records, not from what the previous one picked).
        models = f"-{pretrained_digest(tasks)}" if tuner == "pretrained" else ""
        path = folder / (f"{stem}-{name.replace(' ', '_')}{without}{models}.db"
                         if budget == "few" else f"{stem}-scratch-{trials}.db")
        tuning, measuring, wall = tune(tasks, runner, path, trials=trials, tuner=tuner,
                                       split=split, batch=args.batch, share=share)
        overhead = (wall - measuring) / measuring if tuning.curve else None
        results[name] = (tuning, trials, overhead)
        if budget == "few":    # from the defaults' cost, a task untuned yet at its default
            curves[f"{name} ({trials})"] = (tuning.resumed + 1, tuning.default_curve())
            runs[f"{name} ({trials})"] = tuning.cost("default")
    if "scratch, reference" not in results or "pretrained + scheduler" not in results:
        print("  (the figures need both 'scratch, reference' and 'pretrained + scheduler')")
        return False
    # Wall times: compare what each strategy picked, measured again side by side.
    cost = side_by_side(results) if noisy else {
        "default": results["scratch, reference"][0].cost("default"),
        **{name: tuning.cost("best") for name, (tuning, _, _) in results.items()}}
    default = cost["default"]
    reference_gain = default - cost["scratch, reference"]
    # Side by side, the same picks' total agrees within about 1% between runs: a
    # reference that gains less than that gains nothing measurable, and a share of it
    # is noise over noise. The target is then to land within that 1% of the reference.
    flat = noisy and reference_gain < SIDE_NOISE * default
    ok = True
    for name, (tuning, trials, overhead) in results.items():
        best = cost[name]
        share = (default - best) / reference_gain if reference_gain and not flat \
            else float("nan")
        note = "resumed" if overhead is None else f"{overhead:8.1%}"
        print(f"  {name:26s} {trials:6d} {best:13,} {default / best:7.4f}x "
              f"{'n/a' if flat else f'{share:.1%}':>21s} {note:>8s}")
        # The target is the pretrained tuner's (and the reference's, when it ran here);
        # the 64-trial from-scratch and random runs are the curves' baselines.
        if overhead is not None and (name.startswith("pretrained") or trials == args.reference):
            ok &= overhead <= 0.10
    if flat:
        ok &= cost["pretrained + scheduler"] <= cost["scratch, reference"] * (1 + SIDE_NOISE)
        print(f"  the reference gains {default / cost['scratch, reference'] - 1:+.2%} on the "
              f"defaults, under the side-by-side noise ({SIDE_NOISE:.0%}): no share of it is "
              f"defined; the target is pretrained + scheduler within {SIDE_NOISE:.0%} of it")
    else:
        ok &= (default - cost["pretrained + scheduler"]) / reference_gain >= target_share
    print(f"  default schedules: {default:,} {unit} (the tuned ops' sum)"
          + (": each task's picks and default measured again in turn, 15 rounds of "
             "slots a few ms long, a pick by its median ratio to the default" if noisy else ""))
    print(f"  a first run on a platform also computes its tasks' spaces and features once "
          f"(then cached): {cold[0]:.1f} s for these {len(tasks)} tasks for the pretrained "
          f"tuner, {cold[1]:.1f} s more for the from-scratch one")
    print("  " + ("PASS" if ok else "BELOW") + f" (targets: pretrained + scheduler >= "
          f"{target_share:.0%} of the "
          "reference's gain, or within 1% of the reference where it gains nothing "
          "measurable; the pretrained runs' and the reference's overhead <= 10% of "
          "measuring)")
    if plot and not any(c is not None for _, curve in curves.values() for c in curve):
        print(f"  no tuning curve to plot: every strategy resumed from its records "
              f"(delete {folder} to measure again)")
        plot = None
    elif plot and not noisy:
        tuning_curves(curves, plot, unit=unit, title=f"{model} on {short}: tuned ops' {unit}",
                      reference={f"scratch, {args.reference} trials": cost["scratch, reference"],
                                 "default schedules": default})
    elif plot:
        # Wall times drift between runs minutes apart (the defaults measured 10% apart
        # in two of them): each curve is its own run's speedup over its own defaults, and
        # the reference line the side-by-side figure.
        speedups = {name: (first, [None if c is None else runs[name] / c for c in curve])
                    for name, (first, curve) in curves.items()}
        tuning_curves(speedups, plot, unit=unit,
                      title=f"{model} {precision} on {short}: speedup of the tuned ops",
                      ylabel="speedup over the default schedules (same run)",
                      reference={f"scratch, {args.reference} trials":
                                 default / cost["scratch, reference"]})
    if plot:
        print(f"  wrote {plot}")
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", choices=("zeroshot", "model", "cpu"),
                        default=["zeroshot", "model", "cpu"])
    parser.add_argument("--configs", type=int, default=5)
    parser.add_argument("--tuned", type=int, default=256)
    parser.add_argument("--few", type=int, default=64)
    parser.add_argument("--reference", type=int, default=1000)
    parser.add_argument("--model-config", default=HELD_OUT)
    parser.add_argument("--strategies", nargs="+", choices=tuple(STRATEGIES),
                        default=list(DEFAULT_STRATEGIES), metavar="NAME",
                        help=f"the strategies to run (default: "
                             f"{', '.join(DEFAULT_STRATEGIES)}; also: "
                             f"{', '.join(n for n in STRATEGIES if n not in DEFAULT_STRATEGIES)})")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--records", type=Path, default=cache_root() / "bench-tuner-model")
    parser.add_argument("--plot", type=Path, help="part 2's tuning curves")
    parser.add_argument("--cpu-plot", type=Path,
                        help="part 3's tuning curves (with several precisions, one file "
                             "each: NAME_PRECISION.png)")
    parser.add_argument("--cpu-model", default="mobilenet_v1", choices=MODELS,
                        help="part 3's model (default mobilenet_v1)")
    parser.add_argument("--cpu-precision", nargs="+", default=["float32"],
                        choices=("float32", "int8"), help="part 3's precisions")
    parser.add_argument("--cpu-leave-out", metavar="ISA",
                        choices=("auto", "amx", "avx512vnni", "avx2"),
                        help="part 3's pretrained strategies start from models trained "
                             "without this instruction set's rows (auto: the one the "
                             "target runs here)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    print(f"machine: {cpu_name()}, {len(os.sched_getaffinity(0))} cores")
    ok = True
    with LocalRunner("verilator", jobs=args.jobs) as runner:
        if "zeroshot" in args.part:
            ok &= zeroshot(args, runner)
        if "model" in args.part:
            config = next(c for c in unseen_configs() if c.name == args.model_config)
            ok &= whole_model(args, runner, VdlaTarget(config), "resnet18", precision="int8",
                              folder=args.records / config.name,
                              where=f"{config.name} (no training set measured it)",
                              short=config.name, plot=args.plot)
    if "cpu" in args.part:
        # One thread and one job, as the CPU's training set was measured: nothing else
        # shares the cores while a schedule is timed.
        target = CpuTarget(threads=1)
        with LocalRunner("wall", jobs=1) as runner:
            for precision in args.cpu_precision:
                plot = args.cpu_plot
                if plot and len(args.cpu_precision) > 1:
                    plot = plot.with_name(f"{plot.stem}_{precision}{plot.suffix}")
                ok &= whole_model(args, runner, target, args.cpu_model, precision=precision,
                                  folder=args.records / f"cpu-{target.isa.name}-1-thread",
                                  where=f"the CPU ({cpu_name()}, {target.isa.name}, 1 thread)",
                                  short=f"the CPU ({target.isa.name}, 1 thread)", plot=plot,
                                  leave_out=args.cpu_leave_out)
    print(f"(took {time.perf_counter() - start:.0f} s)")
    # A figure below its target is a result to report, not a failure of the bench.
    print("all targets met" if ok else "some targets not met: see BELOW above")
    return 0


if __name__ == "__main__":
    sys.exit(main())
