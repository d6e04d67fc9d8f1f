"""The tuner against exhaustive search, and tuned vs default schedules, on Verilator.

Part 1, reduced layers: each of ResNet-18's C2-C11 with the image 4x smaller on each side
and half the channels (kernel, pad and stride kept; ``C5/r`` = 7,7,64,64,3,1,1), on the
default config. Their whole valid schedule spaces (316-555 schedules) are measured on the
Verilator backend once (kept in the records file, so later runs skip it). Then, per layer:

* the tuner (`ModelTuner`: gradient-boosted trees + simulated annealing, batches of 8)
  with a budget of 10% of the valid space, over `--seeds` seeds; printed: trials until it
  measured a schedule within 5% of the exhaustive best (median and worst over the seeds);
* the same tuner learning from the knobs alone (no analytical timing model among its
  features, no pre-screening): what the learned model does by itself;
* random search: trials to within 5% (mean over 50 seeds; it may need more than 10%);
* the default chooser's schedule (the analytical model's pick) against the best.

These searches replay the exhaustive measurements (`ReplayRunner`) instead of simulating
again: the simulator is deterministic, so a replayed trial is what re-measuring would
give, and many seeds cost seconds.

Part 2, the real layers on the default config (each name's tasks: ResNet-18's own layers,
``C8`` and ``C8+residual``): `vdla tune`'s loop (default schedule first, then the model
tuner) with `--trials` measurements per task on Verilator, in
`--jobs` worker processes; printed: default and best cycles and the speedup.

    python bench/tuner.py [--layers C2 C5] [--seeds 5] [--trials 24] [--jobs 2]
                          [--records FILE] [--skip-default] [--skip-exhaustive]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import vdla  # noqa: E402
from vdla._buildcache import cache_root  # noqa: E402
from vdla.compiler.tuner.workload_tasks import (REDUCED_LAYERS, reduced_spec,  # noqa: E402
                                                 tasks_from_workload)
from vdla.compiler.tuner import (LocalRunner, MeasureInput, Records, ReplayRunner,  # noqa: E402
                                 tune_task)
from vdla.compiler.frontend.workloads import RESNET18  # noqa: E402
from vdla.compiler.targets import get as get_target  # noqa: E402

LAYERS = list(REDUCED_LAYERS)
WITHIN = 1.05
BUDGET = 0.10


def short(s) -> str:
    threads = " oc2" if s.oc_nthread > 1 else " ht2" if s.h_nthread > 1 else ""
    return f"h{s.tile_h} w{s.tile_w} ci{s.tile_ci} co{s.tile_co}{threads}"


def trials_to_within(result, target: float) -> int | None:
    for i, (_, r) in enumerate(result.history):
        if r.ok and r.cycles <= target:
            return i + 1
    return None


def progress_line(task, done, total, best):
    if sys.stderr.isatty():
        print(f"\r\x1b[K  {task.name}: {done}/{total} measured, best "
              f"{best if best is not None else '-'}", end="", file=sys.stderr, flush=True)


def clear_line():
    if sys.stderr.isatty():
        print("\r\x1b[K", end="", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", nargs="+", default=LAYERS, choices=LAYERS)
    parser.add_argument("--seeds", type=int, default=5, help="tuner seeds per layer (5)")
    parser.add_argument("--trials", type=int, default=24,
                        help="measurements per real layer in part 2 (24)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--records", default=None,
                        help="records file (default: bench-tuner.db in vdla's cache folder)")
    parser.add_argument("--skip-default", action="store_true", help="skip part 2")
    parser.add_argument("--skip-exhaustive", action="store_true",
                        help="skip part 1 (with a new --records file, part 2 alone measures "
                             "from scratch)")
    args = parser.parse_args(argv)
    if args.records is None:
        args.records = str(cache_root() / "bench-tuner.db")
    config = vdla.HardwareConfig()
    accelerator = get_target("vdla", config=config)
    failed = False
    start = time.perf_counter()
    with Records(args.records) as db, LocalRunner("verilator", jobs=args.jobs) as runner:
        if not args.skip_exhaustive:
            print(f"Part 1: reduced ResNet-18 layers (H/4, W/4, C/2), config {config.name}; "
                  f"tuner budget {BUDGET:.0%} of the valid space; records {args.records}")
            print(f"{'layer':7s} {'workload':22s} {'space':>5s} {'budget':>6s} {'best':>8s} "
                  f"{'tuner':>11s} {'knobs-only':>11s} {'random':>7s} {'default':>8s}  "
                  "verdict")
        replay = ReplayRunner(db, "verilator")
        for name in ([] if args.skip_exhaustive else args.layers):
            spec = reduced_spec(name)
            [task] = tasks_from_workload(spec, accelerator)
            task = task.with_name(f"{name}/r")
            space = task.space()
            # Exhaustive: the grid over the whole space (resumes from the records).
            full = tune_task(task, runner, trials=len(space), records=db, tuner="grid",
                             measure_default=False, progress=progress_line)
            clear_line()
            if full.failures:
                print(f"{task.name}: {full.failures} measurement(s) failed: "
                      f"{[r.error for _, r in full.history if not r.ok][:3]}")
                failed = True
            best = full.best_cycles
            target = best * WITHIN
            budget = max(1, int(BUDGET * len(space)))
            found, knobs_only = [], []
            for seed in range(args.seeds):
                for use_estimate, out in ((True, found), (False, knobs_only)):
                    r = tune_task(task, replay, trials=budget, tuner="model", seed=seed,
                                  measure_default=False,
                                  tuner_options={"use_estimate": use_estimate})
                    out.append(trials_to_within(r, target))
            rand = []
            for seed in range(50):
                r = tune_task(task, replay, trials=len(space), tuner="random", seed=seed,
                              measure_default=False, batch=len(space))
                rand.append(trials_to_within(r, target))
            default_cycles = replay.measure([MeasureInput(task, full.default)])[0].cycles

            def fmt(values):
                hit = [v for v in values if v is not None]
                if len(hit) < len(values):
                    return f"miss {len(values) - len(hit)}/{len(values)}"
                return f"{statistics.median(hit):g} (<={max(hit)})"

            ok = all(v is not None for v in found)
            failed |= not ok
            print(f"{task.name:7s} {spec:22s} {len(space):5d} {budget:6d} {best:8d} "
                  f"{fmt(found):>11s} {fmt(knobs_only):>11s} "
                  f"{statistics.mean(rand):7.1f} {default_cycles / best - 1:+8.1%}  "
                  f"{'ok' if ok else 'MISSED'}", flush=True)
        if not args.skip_exhaustive:
            print("tuner / knobs-only: trials until a schedule within 5% of the exhaustive "
                  f"best was measured, median (worst) over {args.seeds} seeds; random: mean "
                  "over 50 seeds; default: the default chooser's cycles over the best")

        if not args.skip_default:
            print(f"\nPart 2: ResNet-18 layers on config {config.name}, {args.trials} trials "
                  f"each on Verilator ({args.jobs} jobs; default schedule first)")
            print(f"{'layer':12s} {'space':>5s} {'default':24s} {'cycles':>9s} "
                  f"{'best found':24s} {'cycles':>9s} {'speedup':>8s}")
            speedups = []
            # A name is ResNet-18's own layers: C8 and C8+residual are two tasks.
            for task in (t for name in args.layers
                         for t in tasks_from_workload(name, accelerator)):
                r = tune_task(task, runner, trials=args.trials, records=db, tuner="model",
                              progress=progress_line)
                clear_line()
                speedups.append(r.speedup)
                print(f"{task.name:12s} {r.space_size:5d} {short(r.default):24s} "
                      f"{r.default_cycles:9d} {short(r.best):24s} {r.best_cycles:9d} "
                      f"{r.speedup:7.3f}x", flush=True)
            geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
            print(f"geometric mean speedup of the tuned over the default schedule: {geo:.3f}x")
    print(f"(took {time.perf_counter() - start:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
