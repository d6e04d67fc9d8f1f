"""Train the cost model a target ships, from a training set's records.

Usage: python scripts/train_cost_model.py [--manifest M.json ...]

Reads the manifests that ``vdla dataset`` wrote (default: the accelerator's training
sets in bench/datasets; each manifest's plan makes its tasks again, joined with its
records), fits a `CostModel` on every measured schedule of the sets' trained platforms
and models (the held-out ones are never measured into them, so the figures of
``bench/tuner_transfer.py`` stay honest), and writes it, atomically, into the
target's package-data folder as ``<feature set>-v<version>.npz``
(``compiler/targets/vdla/models/vdla.conv2d-v1.npz``). ``--out DIR`` writes elsewhere.

The learner (why these settings: docs/tuner.md, "The pretrained model"): scikit-learn's
gradient-boosted regression trees that learn what the feature set's baseline (the
target's own timing model) gets wrong, 200 trees of depth 4. Training is deterministic:
the same records and versions give the same file.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import sklearn

import vdla
from vdla.compiler import pipeline
from vdla.compiler.tuner.cost_model import CostModel, file_name
from vdla.compiler.tuner.learned import Rows

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ROOT / "bench" / "datasets"
#: The training sets the shipped model learns from (bench/datasets/make_*.sh make them).
DEFAULT_MANIFESTS = (DATASETS / "vdla_v1.db.manifest.json",
                     DATASETS / "vdla_small_v1.db.manifest.json")
#: Where each target's models go (the folder its tasks' `pretrained` reads).
OUT = {"vdla": ROOT / "compiler" / "targets" / "vdla" / "models"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, nargs="+", default=list(DEFAULT_MANIFESTS))
    parser.add_argument("--out", type=Path, help="folder to write the model to (default: "
                        "the target's package-data folder)")
    parser.add_argument("--trees", type=int, default=200)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        sets = [pipeline.training_set(path) for path in args.manifest]
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    manifests = [m for _, m in sets]
    kinds = {(m["target"], m["backend"]) for m in manifests}
    if len(kinds) != 1:
        raise SystemExit(f"the manifests are of different targets or backends: {sorted(kinds)}")
    target = manifests[0]["target"]
    out = args.out or OUT.get(target)
    if out is None:
        raise SystemExit(f"target {target!r} has no model folder; give --out")
    rows = Rows.join([r for r, _ in sets])
    feature_set = pipeline.plan_from_manifest(manifests[0])[0].tasks[0].feature_set
    platforms = sorted({platform for platform, _, _ in rows.tasks})
    held_out = {"platforms": sorted({p for m in manifests for p in m["held_out"]["platforms"]}),
                "models": sorted({n for m in manifests for n in m["held_out"]["models"]})}
    trained = set(platforms) & set(held_out["platforms"])
    if trained:
        raise SystemExit(f"platforms held out by one set are measured by another: {trained}")
    model = CostModel.fit(rows, feature_set, trees=args.trees, depth=args.depth,
                          residual=True, meta={
                              "trained_on": [p.name for p in args.manifest],
                              "platforms": platforms, "held_out": held_out, "trees": args.trees,
                              "depth": args.depth, "vdla": vdla.__version__,
                              "sklearn": sklearn.__version__})
    out.mkdir(parents=True, exist_ok=True)
    path = out / file_name(feature_set)
    model.save(path)
    print(f"{path}: {feature_set.name} v{feature_set.version}, {len(rows)} schedules of "
          f"{len(rows.tasks)} tasks on {len(platforms)} platforms, {args.trees} trees of "
          f"depth {args.depth}, {path.stat().st_size:,} bytes "
          f"({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
