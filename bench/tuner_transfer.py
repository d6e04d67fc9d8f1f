"""How well a cost model learned across configs ranks schedules on a config it has not
seen (issue 39): leave-one-platform-out over a training set made by ``vdla dataset``.

For each platform of the set in turn, a `CostModel` is trained on every other
platform's rows and ranks the schedules of each of this platform's tasks; the figures
are `pairwise_accuracy` (pairs of one task's schedules ordered right) and `top1_ratio`
(the best measured cost over the cost of the schedule ranked first, geometric mean over
tasks), next to those of the analytical timing model alone (the feature set's
baseline: the model the default chooser uses) and of a model that learns what the
timing model gets wrong (``residual=True``).

    python bench/tuner_transfer.py [--manifest bench/datasets/vdla_v1.db.manifest.json]
                                   [--trees 200] [--depth 4]

Targets (issue 39, vdla on held-out configs): pairwise >= 0.90, top-1 >= 0.97 on the
geometric mean. The rows are the set's random schedules, which are harder to rank than
a tuner's picks only in that they spread over the whole space.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from vdla._platform import cpu_name
from vdla.compiler import pipeline
from vdla.compiler.tuner import Records
from vdla.compiler.tuner.cost_model import CostModel
from vdla.compiler.tuner.learned import pairwise_accuracy, top1_ratio, training_rows

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MANIFEST = ROOT / "bench" / "datasets" / "vdla_v1.db.manifest.json"
TARGETS = {"pairwise": 0.90, "top1": 0.97}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST)
    parser.add_argument("--trees", type=int, default=200)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args(argv)
    try:
        manifest = json.loads(args.manifest.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"--manifest {args.manifest}: {exc}") from None
    plan, _ = pipeline.plan_from_manifest(manifest)
    records_path = Path(manifest["records"])
    if not records_path.is_absolute():
        records_path = ROOT / records_path
    with Records(records_path) as db:
        rows = training_rows(plan.tasks, db, manifest["backend"])
    feature_set = plan.tasks[0].feature_set
    platform_of = np.array([rows.tasks[g][0] for g in rows.groups])
    platforms = sorted(set(platform_of))
    if len(platforms) < 2:
        raise SystemExit(f"{args.manifest}: rows on {len(platforms)} platform(s); leaving one "
                         "out needs two")
    est = (rows.x[:, feature_set.names.index("log_est_over_ideal")]
           + rows.x[:, feature_set.names.index("log_ideal_cycles")])
    print(f"{manifest['target']} cost model, leave one platform out: {len(rows)} measured "
          f"schedules of {len(rows.tasks)} tasks on {len(platforms)} platforms "
          f"({manifest['backend']}; manifest {args.manifest.name}"
          f"{'' if manifest.get('complete') else ', generation not complete'}); "
          f"{args.trees} trees of depth {args.depth}; machine: {cpu_name()}, "
          f"{len(os.sched_getaffinity(0))} cores")
    header = (f"  {'held-out platform':34s} {'rows':>5s} {'tasks':>5s}   timing model      "
              "learned           learned residual")
    print(header + "\n" + " " * 48 + "pairwise  top-1   pairwise  top-1   pairwise  top-1")
    logs = {"est": [], "model": [], "residual": []}
    for platform in platforms:
        test = platform_of == platform
        train, held = rows.subset(~test), rows.subset(test)
        model = CostModel.fit(train, feature_set, trees=args.trees, depth=args.depth)
        fixed = CostModel.fit(train, feature_set, trees=args.trees, depth=args.depth,
                              residual=True)
        figures = {}
        for name, predicted in (("est", est[test]), ("model", model.predict(held.x)),
                                ("residual", fixed.predict(held.x))):
            try:
                figures[name] = (pairwise_accuracy(predicted, held.y, held.groups),
                                 top1_ratio(predicted, held.y, held.groups))
            except ValueError:   # no two schedules of one task with different costs
                figures[name] = (float("nan"), top1_ratio(predicted, held.y, held.groups))
            logs[name].append(figures[name])
        cells = "   ".join(f"{p:8.3f} {t:6.3f}" for p, t in figures.values())
        print(f"  {platform:34s} {len(held):5d} {len(held.tasks):5d}   {cells}")
    ok = True
    for name, label in (("est", "timing model"), ("model", "learned"),
                        ("residual", "learned residual")):
        pairwise = float(np.nanmean([p for p, _ in logs[name]]))
        top1 = float(np.exp(np.mean([np.log(t) for _, t in logs[name]])))
        print(f"  {label:16s} mean pairwise {pairwise:.3f}, geometric-mean top-1 {top1:.4f}")
        if name != "est":
            ok &= pairwise >= TARGETS["pairwise"] and top1 >= TARGETS["top1"]
    print(("PASS" if ok else "BELOW") + f" (both learned models; targets: pairwise >= "
          f"{TARGETS['pairwise']}, top-1 >= {TARGETS['top1']})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
