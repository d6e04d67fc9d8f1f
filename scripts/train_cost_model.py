"""Train the cost model a target ships, from a training set's records.

Usage: python scripts/train_cost_model.py [--manifest M.json ...]
       python scripts/train_cost_model.py --manifest bench/datasets/cpu_v3.db.manifest.json \
           bench/datasets/cpu_f32_v3.db.manifest.json --trees 300 --depth 6 --rate 0.05 \
           --test bench/datasets/cpu_test_v3.db.manifest.json \
           bench/datasets/cpu_f32_test_v3.db.manifest.json --feature-sets cpu.conv2d
       python scripts/train_cost_model.py --manifest \
           bench/datasets/cpu_gemm_v1.db.manifest.json \
           bench/datasets/cpu_gemm_f32_v1.db.manifest.json \
           --feature-sets cpu.dense cpu.matmul --cv 5

Reads the manifests that ``vdla dataset`` wrote (default: the accelerator's training
sets in bench/datasets; each manifest's plan makes its tasks again, joined with its
records), fits a `CostModel` on every measured schedule of the sets' trained platforms
and models (the held-out ones are never measured into them, so the figures of
``bench/tuner_transfer.py`` stay honest), and writes it, atomically, into the
target's package-data folder as ``<feature set>-v<version>.npz``
(``compiler/targets/vdla/models/vdla.conv2d-v1.npz``). ``--out DIR`` writes elsewhere.
A target whose tasks read several feature sets (the CPU's convolutions, dense layers and
batched products) gets one model per feature set that has at least ``--min-tasks``
tasks in the sets; ``--feature-sets`` names the ones to train (the others' shipped
files are left as they are).

The learner (why these settings: docs/tuner.md, "The pretrained model"): scikit-learn's
gradient-boosted regression trees that learn what the feature set's baseline (the
target's own timing model) gets wrong, 200 trees of depth 4. Training is deterministic:
the same records and versions give the same file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import sklearn

import vdla
from vdla.compiler import training_sets
from vdla.compiler.tuner.cost_model import CostModel, file_name
from vdla.compiler.tuner.rows import Rows, pairwise_accuracy, top1_ratio

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ROOT / "bench" / "datasets"
#: The training sets the shipped model learns from (bench/datasets/make_*.sh make them).
DEFAULT_MANIFESTS = (DATASETS / "vdla_v1.db.manifest.json",
                     DATASETS / "vdla_small_v1.db.manifest.json",
                     DATASETS / "vdla_seq_v1.db.manifest.json")
#: Where each target's models go (the folder its tasks' `pretrained` reads).
OUT = {"vdla": ROOT / "compiler" / "targets" / "vdla" / "models",
       "cpu": ROOT / "compiler" / "targets" / "cpu" / "models"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, nargs="+", default=list(DEFAULT_MANIFESTS))
    parser.add_argument("--out", type=Path, help="folder to write the model to (default: "
                        "the target's package-data folder)")
    parser.add_argument("--trees", type=int, default=200)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--rate", type=float, default=0.1, help="the trees' learning rate")
    parser.add_argument("--cv", type=int, metavar="K", help="write nothing: print the "
                        "ranking figures of K-fold cross-validation over the sets' tasks "
                        "(each fold's tasks left out of its training), by platform, for "
                        "choosing the settings")
    parser.add_argument("--min-tasks", type=int, default=20, help="a feature set with fewer "
                        "tasks in the sets gets no model (default 20)")
    parser.add_argument("--feature-sets", nargs="+", default=[], metavar="NAME",
                        help="train (or cross-validate) only these of the sets' feature sets "
                        "(the CPU's cpu.conv2d, cpu.dense, cpu.matmul; default: every one)")
    parser.add_argument("--test", type=Path, nargs="+", default=[], metavar="M.json",
                        help="then rank each written model on these manifests' sets (held "
                        "out of the training sets), beside its baseline feature alone (the "
                        "target's own cost model), by platform")
    parser.add_argument("--classes", nargs="+", default=[], metavar="FEATURE",
                        help="with --test, also: on tasks that measured several classes of "
                        "schedule (the values of these features; the CPU's: blocked "
                        "winograd), how often the first-ranked schedule is of the class of "
                        "the fastest measured, and what a wrong class costs")
    args = parser.parse_args(argv)
    if args.cv is not None and args.cv < 2:
        parser.error(f"--cv must be at least 2 folds, not {args.cv}")
    if args.test and args.cv is not None:
        parser.error("--test ranks the model written, and --cv writes none: give one")
    if args.classes and not args.test:
        parser.error("--classes counts on the --test sets: give --test too")
    start = time.perf_counter()
    try:
        manifests = [json.loads(path.read_text()) for path in args.manifest]
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"manifest: {exc}") from None
    kinds = {(m["target"], m["backend"]) for m in manifests}
    if len(kinds) != 1:
        raise SystemExit(f"the manifests are of different targets or backends: {sorted(kinds)}")
    target = manifests[0]["target"]
    out = args.out or OUT.get(target)
    if out is None:
        raise SystemExit(f"target {target!r} has no model folder; give --out")
    # A target's tasks may read several feature sets (the CPU's convolutions and dense
    # layers): one model each, for those with enough tasks to learn across.
    feature_sets = {}
    for m in manifests:
        for task in training_sets.plan_from_manifest(m)[0].tasks:
            feature_sets.setdefault(task.feature_set.name, task.feature_set)
    unknown = sorted(set(args.feature_sets) - set(feature_sets))
    if unknown:
        raise SystemExit(f"--feature-sets {unknown}: the sets' tasks read "
                         f"{sorted(feature_sets)}")
    for name, feature_set in feature_sets.items():
        if args.feature_sets and name not in args.feature_sets:
            continue
        try:
            rows = Rows.join([training_sets.training_set(path, feature_set=name)[0]
                              for path in args.manifest])
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        if len(rows.tasks) < args.min_tasks:
            print(f"{name}: {len(rows.tasks)} tasks, fewer than --min-tasks "
                  f"{args.min_tasks}: no model written")
            continue
        if args.cv:
            _cross_validate(args, feature_set, rows)
        else:
            # The held-out sets read (and --classes checked) before the training, so
            # that a bad one is named at once, not after minutes of trees.
            held = _test_rows(args, feature_set) if args.test else None
            model = _write(args, manifests, out, feature_set, rows)
            if held is not None:
                _test(args, model, feature_set, held)
    print(f"({time.perf_counter() - start:.1f} s)")
    return 0


def _cross_validate(args, feature_set, rows: Rows) -> None:
    """K-fold cross-validation by task (seeded): every row predicted by a model that
    never saw its task, then pairwise accuracy and top-1 per platform and over all,
    beside the baseline feature's alone (the target's own cost model)."""
    rng = np.random.default_rng(0)
    fold_of_task = rng.integers(args.cv, size=len(rows.tasks))
    fold = fold_of_task[rows.groups]
    predicted = np.zeros(len(rows))
    for k in range(args.cv):
        model = CostModel.fit(rows.subset(fold != k), feature_set, trees=args.trees,
                              depth=args.depth, rate=args.rate, residual=True)
        predicted[fold == k] = model.predict(rows.x[fold == k])
    baseline = feature_set.baseline_of(rows.x)
    platform = np.array([rows.tasks[g][0] for g in rows.groups])
    print(f"{feature_set.name} v{feature_set.version}, {args.trees} trees of depth "
          f"{args.depth}, rate {args.rate}: {args.cv}-fold cross-validation by task, "
          f"{len(rows)} schedules of {len(rows.tasks)} tasks")
    for name in sorted(set(platform)) + ["all platforms"]:
        at = platform == name if name != "all platforms" else np.ones(len(rows), bool)
        figures = [(pairwise_accuracy(p[at], rows.y[at], rows.groups[at]),
                    top1_ratio(p[at], rows.y[at], rows.groups[at]))
                   for p in (predicted, baseline)]
        print(f"  {name:40s} pairwise {figures[0][0]:.3f} (baseline {figures[1][0]:.3f}), "
              f"top-1 {figures[0][1]:.4f} (baseline {figures[1][1]:.4f})")


def _test_rows(args, feature_set) -> Rows:
    """The `args.test` sets' rows of `feature_set`; SystemExit naming a set that cannot
    be read, or `args.classes` features the rows lack."""
    try:
        rows = Rows.join([training_sets.training_set(path, feature_set=feature_set.name)[0]
                          for path in args.test])
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--test: {exc}") from None
    if not set(args.classes) <= set(rows.feature_names):
        raise SystemExit(f"--classes: the features are {', '.join(rows.feature_names)}, "
                         f"not all of {', '.join(args.classes)}")
    return rows


def _test(args, model: CostModel, feature_set, rows: Rows) -> None:
    """`model`'s ranking of the held-out `rows` (`_test_rows`), beside the baseline
    feature's."""
    predicted = model.predict(rows.x)
    baseline = sum(rows.x[:, rows.feature_names.index(n)] for n in feature_set.baseline)
    platform = np.array([rows.tasks[g][0] for g in rows.groups])
    print(f"held out ({', '.join(p.name for p in args.test)}): {len(rows)} schedules of "
          f"{len(rows.tasks)} tasks")
    for name in sorted(set(platform)):
        at = platform == name
        figures = [(f"{pairwise_accuracy(p[at], rows.y[at], rows.groups[at]):.3f}",
                    f"{top1_ratio(p[at], rows.y[at], rows.groups[at]):.4f}")
                   for p in (predicted, baseline)]
        print(f"  {name:40s} pairwise {figures[0][0]} (baseline {figures[1][0]}), top-1 "
              f"{figures[0][1]} (baseline {figures[1][1]})")
        if args.classes:
            _classes(args.classes, rows, at, {"model": predicted, "baseline": baseline})


def _classes(names: list[str], rows: Rows, at: np.ndarray, rankings: dict) -> None:
    """How often each ranking's first pick is of the fastest measured schedule's class
    (its values of the features `names`), on the tasks among `at` that measured two
    classes or more; and the geometric mean of the fastest of the picked class over the
    fastest of all."""
    try:
        columns = [rows.feature_names.index(n) for n in names]
    except ValueError:
        raise SystemExit(f"--classes: the features are {', '.join(rows.feature_names)}, "
                         f"not all of {', '.join(names)}") from None
    kinds = [tuple(row) for row in rows.x[:, columns]]
    tasks = [g for g in np.unique(rows.groups[at])
             if len({kinds[i] for i in np.flatnonzero(rows.groups == g)}) > 1]
    for label, ranked in rankings.items():
        right, costs = 0, []
        for g in tasks:
            rows_of = np.flatnonzero(rows.groups == g)
            fastest = {}
            for i in rows_of:
                fastest[kinds[i]] = min(fastest.get(kinds[i], np.inf), rows.y[i])
            picked = kinds[rows_of[np.argmin(ranked[rows_of])]]
            right += fastest[picked] == min(fastest.values())
            costs.append(fastest[picked] - min(fastest.values()))
        print(f"    {label}: the fastest class ({', '.join(names)}) first on {right} of "
              f"{len(tasks)} tasks; the picked class's fastest at "
              f"{2 ** np.mean(costs) if costs else 1.0:.3f}x the fastest (geometric mean)")


def _write(args, manifests: list[dict], out: Path, feature_set, rows: Rows) -> CostModel:
    platforms = sorted({platform for platform, _, _ in rows.tasks})
    # A model is held out at a precision (a set may measure it at another).
    held_out = {"platforms": sorted({p for m in manifests for p in m["held_out"]["platforms"]}),
                "models": sorted({f"{n} ({m.get('precision', 'int8')})" for m in manifests
                                  for n in m["held_out"]["models"]})}
    trained = set(platforms) & set(held_out["platforms"])
    if trained:
        raise SystemExit(f"platforms held out by one set are measured by another: {trained}")
    model = CostModel.fit(rows, feature_set, trees=args.trees, depth=args.depth,
                          rate=args.rate, residual=True, meta={
                              "trained_on": [p.name for p in args.manifest],
                              "platforms": platforms, "held_out": held_out, "trees": args.trees,
                              "depth": args.depth, "rate": args.rate, "vdla": vdla.__version__,
                              "sklearn": sklearn.__version__})
    out.mkdir(parents=True, exist_ok=True)
    path = out / file_name(feature_set)
    model.save(path)
    print(f"{path}: {feature_set.name} v{feature_set.version}, {len(rows)} schedules of "
          f"{len(rows.tasks)} tasks on {len(platforms)} platforms, {args.trees} trees of "
          f"depth {args.depth}, {path.stat().st_size:,} bytes")
    return model


if __name__ == "__main__":
    sys.exit(main())
