"""The tuner's measurements per minute on ResNet-18's layers C2-C11: the Verilator model
of the old build (the recipe before the simulator's speed-up: g++ -O3, the WIDE GEMM core, the raw reset)
against today's default build, side by side.

Each layer's tasks (`vdla.compiler.tuner.workload_tasks.tasks_from_workload`: ``C8`` and
``C8+residual`` are two) get the same `--per-task` schedules, drawn from the task's valid
space with a fixed seed, and both builds measure them all through the tuner's own
runner (`LocalRunner`, `--jobs` worker processes, each compiling a schedule and running
it on its model, as `vdla tune` does). Every schedule must take the same cycles on both
builds. Printed: measurements per minute on each build (the wall time of the whole
batch, workers' start included) and the ratio.

The old build is loaded by opening each worker's device on its library
(`vdla.runtime.open(..., library=...)`), the tuner's code otherwise unchanged.

    python bench/tuner_speed.py [--layers C2 ... C11] [--per-task 8] [--jobs 2]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import vdla  # noqa: E402
import vdla.runtime  # noqa: E402
from vdla._platform import cpu_name  # noqa: E402
from vdla.compiler.tuner.workload_tasks import tasks_from_workload  # noqa: E402
from vdla.compiler.targets import get as get_target  # noqa: E402
from vdla.compiler.targets.vdla import tuning  # noqa: E402
from vdla.compiler.tuner import LocalRunner, MeasureInput  # noqa: E402
from vdla.sim.verilator import build_model  # noqa: E402

LAYERS = [f"C{i}" for i in range(2, 12)]
#: The old build's recipe (bench/sim_speed.py's first rung).
OLD = dict(optimise="O3", gemm_arithmetic="wide", reset="raw")


def measure_all(inputs, jobs: int, library=None) -> tuple[float, list]:
    """Wall time and results of measuring `inputs` on `jobs` workers, each device opened
    on `library` (None: the default build)."""
    original = tuning.ConvTask.open_context
    if library is not None:
        def open_on_library(self, backend):
            return vdla.runtime.open(self.config, backend=backend, library=library,
                                     log=lambda message: None)
        tuning.ConvTask.open_context = open_on_library   # the forked workers inherit it
    try:
        with LocalRunner("verilator", jobs=jobs) as runner:
            start = time.perf_counter()
            results = runner.measure(inputs)
            return time.perf_counter() - start, results
    finally:
        tuning.ConvTask.open_context = original


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", nargs="+", default=LAYERS)
    parser.add_argument("--per-task", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    config = vdla.HardwareConfig()
    target = get_target("vdla", config=config, backend="verilator")
    rng = random.Random(0)
    inputs = []
    for name in args.layers:
        for task in tasks_from_workload(name, target):
            space = task.space()
            inputs += [MeasureInput(task, s) for s in rng.sample(space, min(args.per_task,
                                                                             len(space)))]
    old = build_model(config, log=print, **OLD)
    build_model(config, log=print)
    print(f"{len(inputs)} measurements (layers {' '.join(args.layers)}, up to {args.per_task} "
          f"schedules a task) on {args.jobs} workers; machine: {cpu_name()}, "
          f"{len(os.sched_getaffinity(0))} cores")
    old_s, old_results = measure_all(inputs, args.jobs, old.library)
    new_s, new_results = measure_all(inputs, args.jobs)
    bad = [(i, a, b) for i, (a, b) in enumerate(zip(old_results, new_results))
           if a.status != b.status or a.cycles != b.cycles]
    if bad:
        i, a, b = bad[0]
        raise SystemExit(f"{len(bad)} measurements differ between the builds, the first "
                         f"{inputs[i].task.name} {inputs[i].schedule}: {a} vs {b}")
    ok = sum(r.status == "ok" for r in new_results)
    print(f"  old build      {old_s:7.1f} s   {60 * len(inputs) / old_s:7.1f} measurements/min")
    print(f"  default build  {new_s:7.1f} s   {60 * len(inputs) / new_s:7.1f} measurements/min"
          f"   ({old_s / new_s:.2f}x)")
    print(f"  {ok} of {len(inputs)} ran (the others are refused alike by both); every "
          "schedule took the same cycles on both builds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
