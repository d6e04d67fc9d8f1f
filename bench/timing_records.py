"""The accelerator's timing model against every Verilator measurement the recorded sets
hold: no simulation here, only `ConvTask.estimate` beside the records.

The sets are the training sets and the few-shot set of ``bench/datasets`` (29,606
schedules of ResNet-18's and MobileNet-v1's layers, random shapes, ResNet-18's
reduced layers and transformer workloads: GPT-mini's, random dense layers over tokens
and products ``a @ b^T``; on 13 configs), most of them schedules the default chooser
would never pick, so they test the model where the whole-model benches
(``model_layers.py``, ``front_timing.py``) do not. Per set: the mean |error|, the share of schedules within
2% and 5%, the extremes, and how well the model alone ranks each task's schedules
(`pairwise_accuracy`, `top1_ratio`: the default chooser's view). ``--worst N`` lists
the N schedules it misses most.

    python bench/timing_records.py [--worst 10]     # from anywhere: it imports only vdla

What it is for: a change to the timing model (``compiler/targets/vdla/conv_layer.py``)
shows here, over thousands of schedules, what it does beyond the layers it was made
for (the two-thread first-load fix took the mean error from 1.2/3.0/2.2% to
0.9/1.3/0.7%).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from vdla.compiler import targets, training_sets
from vdla.compiler.tuner import Records
from vdla.compiler.tuner.dataset import local_records
from vdla.compiler.tuner.rows import pairwise_accuracy, top1_ratio
from vdla.compiler.training_sets import fewshot_set
from vdla.compiler.tuner.records import OK

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ROOT / "bench" / "datasets"

MANIFESTS = ("vdla_v1", "vdla_small_v1", "vdla_seq_v1")


def sets():
    """(name, tasks, records file) of each recorded set."""
    for name in MANIFESTS:
        path = ROOT / "bench" / "datasets" / f"{name}.db.manifest.json"
        manifest = json.loads(path.read_text())
        plan, _ = training_sets.plan_from_manifest(manifest)
        yield name, plan.tasks, local_records(path.parent / Path(manifest["records"]).name)
    tasks = [t for _, tasks in fewshot_set(DATASETS / "vdla_v1.db.manifest.json")
             for t in tasks]
    yield "vdla_fewshot_v1", tasks, local_records(DATASETS / "vdla_fewshot_v1.db")


def rows_of(tasks, records: Path):
    """(task index, measured median cycles, estimated cycles, task, schedule) of every ok
    Verilator record of `tasks`."""
    rows = []
    with Records(records) as db:
        for k, task in enumerate(tasks):
            costs: dict[str, tuple[dict, list[int]]] = {}
            for r in db.query(task.key, task.platform, "verilator", target=task.target,
                              status=OK):
                costs.setdefault(r.schedule_json, (r.schedule, []))[1].append(r.cycles)
            for data, measured in costs.values():
                schedule = task.schedule_from_dict(data)
                rows.append((k, statistics.median(measured), task.estimate(schedule).cycles,
                             task, schedule))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worst", type=int, default=5, metavar="N",
                        help="list the N schedules the model misses most (default 5)")
    args = parser.parse_args(argv)
    if args.worst < 0:
        parser.error(f"--worst must be >= 0, not {args.worst}")
    start = time.perf_counter()
    print(f"  {'set':16s} {'schedules':>9s} {'mean |err|':>10s} {'within 2%':>9s} "
          f"{'within 5%':>9s} {'lowest':>7s} {'highest':>7s} {'pairwise':>8s} {'top-1':>7s}")
    everything = []
    for name, tasks, records in sets():
        rows = rows_of(tasks, records)
        if not rows:
            raise SystemExit(f"{name}: no Verilator record of its tasks in {records}")
        groups = np.array([k for k, *_ in rows])
        measured = np.array([m for _, m, *_ in rows], dtype=np.float64)
        estimated = np.array([e for _, _, e, *_ in rows], dtype=np.float64)
        err = estimated / measured - 1
        print(f"  {name:16s} {len(rows):9,d} {np.mean(np.abs(err)):10.2%} "
              f"{np.mean(np.abs(err) < 0.02):9.1%} {np.mean(np.abs(err) < 0.05):9.1%} "
              f"{err.min():+7.1%} {err.max():+7.1%} "
              f"{pairwise_accuracy(np.log2(estimated), np.log2(measured), groups):8.3f} "
              f"{top1_ratio(np.log2(estimated), np.log2(measured), groups):7.4f}")
        everything += [(e, name, row) for e, row in zip(err, rows)]
    if args.worst:
        print(f"\nthe {args.worst} schedules it misses most (estimate over Verilator):")
        everything.sort(key=lambda item: -abs(item[0]))
        describe = targets.get("vdla").describe_schedule
        for e, name, (_, m, est, task, schedule) in everything[:args.worst]:
            print(f"  {e:+6.1%}  {est:>10,} / {int(m):>10,}  {task.platform} {task.name} "
                  f"{describe(task.schedule_to_dict(schedule))}  ({name})")
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
