"""Exhaustive Verilator measurements of ResNet-18's reduced layers on five configs that
the first training set (``vdla_v1``) never measured: what the few-shot and zero-shot
figures of ``bench/tuner_transfer.py`` replay.

The configs: the default config, the two that ``vdla_v1`` holds out, and the next two
of the same seeded draw (`vdla.compiler.training_sets.unseen_platforms`: the set's
draw with its seed, after its ten; the benches that replay this set take its configs
and tasks from the package the same way). The layers: C2-C11 with the image 4x
smaller on each side and half the channels (`vdla.compiler.tuner.workload_tasks.
reduced_tasks`, ``bench/tuner.py``'s reduced layers, ``C5/r``), whose whole schedule
spaces (91-345 schedules each) can be measured. Resumable: run again to measure only
what is missing.

Run from anywhere (it imports only the installed package):

    python bench/datasets/make_vdla_fewshot_v1.py [--jobs 2] [--records FILE]

The repository keeps the records xz-compressed (``vdla_fewshot_v1.db.xz``): the script
unpacks them before resuming and packs them again when done.

On an AMD EPYC with 2 cores (2 workers) it measured 9,000-odd schedules in the time its
last line prints.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from vdla.config import HardwareConfig  # noqa: E402
from vdla.compiler.targets import get as get_target  # noqa: E402
from vdla.compiler.training_sets import unseen_platforms  # noqa: E402
from vdla.compiler.tuner import LocalRunner, Records, tune_task  # noqa: E402
from vdla.compiler.tuner.workload_tasks import reduced_tasks  # noqa: E402

HERE = Path(__file__).resolve().parent

TRAINING = HERE / "vdla_v1.db.manifest.json"
RECORDS = HERE / "vdla_fewshot_v1.db"


def configs() -> list[HardwareConfig]:
    """The default config, the training set's held-out configs, and the next two of its
    draw: five configs it never measured."""
    return [target.config for target in unseen_platforms(json.loads(TRAINING.read_text()))]


def tasks(config: HardwareConfig) -> list:
    """ResNet-18's reduced layers (``C5/r``) on `config`."""
    return reduced_tasks(get_target("vdla", config=config))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--records", type=Path, default=RECORDS)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    measured = 0
    packed = args.records.with_name(args.records.name + ".xz")
    if not args.records.exists() and packed.exists():
        args.records.write_bytes(lzma.decompress(packed.read_bytes()))
    with Records(args.records) as db, LocalRunner("verilator", jobs=args.jobs) as runner:
        for config in configs():
            for task in tasks(config):
                space = task.space()
                result = tune_task(task, runner, trials=len(space), records=db,
                                   tuner="grid", measure_default=False)
                measured += len(result.history)
                print(f"{config.name} {task.name}: {len(space)} schedules, "
                      f"{len(result.history)} measured now, {result.failures} failed; "
                      f"{time.perf_counter() - start:.0f} s", flush=True)
    packed.write_bytes(lzma.compress(args.records.read_bytes(), preset=9))
    print(f"{measured} measurements in {time.perf_counter() - start:.0f} s "
          f"({args.jobs} workers); records {args.records}, packed in {packed.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
