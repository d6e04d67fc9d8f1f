"""``vdla dataset``: measure a training set for cost models that learn across layers and
platforms: random schedules of many workloads (models' tunable ops and random
convolutions) on many platforms of a target (the accelerator's hardware configs), into
a records file with a JSON manifest (`vdla.compiler.tuner.dataset`). The tasks are
measured on local processes (``--jobs``) or a Ray cluster (``--ray``), the executors
``vdla sweep``, ``vdla tune --ray`` and a parallel ``vdla run`` use; this process alone
writes the records."""

from __future__ import annotations

import sys
import time

from vdla.cli.common import (CliError, add_ray_option, add_records_output_option, log,
                             on_interrupt, output_file, table)
from vdla.cli.target_args import DEFAULT_TARGET, add_target_options, make_target
from vdla.compiler import targets, training_sets
from vdla.compiler.tuner import Records
from vdla.compiler.tuner.dataset import generate, measuring_executor, random_shapes

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser(
        "dataset", help="measure a training set for learned cost models: random schedules "
                        "of many workloads on many platforms, into records and a manifest",
        description="Measure a training set: on each of --platforms platforms of the target "
                    "(the accelerator: hardware configs drawn from a space of them), the "
                    "default and --per-task - 1 random schedules of every tunable op of "
                    "each MODEL and of the random workloads (--shapes convolutions and the "
                    "other --*-shapes), on the target's "
                    "first measurement backend (the accelerator: Verilator). Records go to "
                    "--records; a stopped run, started again, measures only what is "
                    "missing. The manifest says what was measured, held out and with "
                    "which tools.")
    p.add_argument("models", metavar="MODEL", nargs="*",
                   help="zoo model names (or .onnx paths) whose tunable ops are workloads")
    add_records_output_option(p)
    p.add_argument("--manifest", type=output_file, metavar="PATH",
                   help="where the manifest goes (default: DB with .manifest.json)")
    p.add_argument("--target", default=DEFAULT_TARGET, metavar="NAME",
                   help=f"the target measured: {', '.join(targets.names())} (default "
                        f"{DEFAULT_TARGET}; its platforms are the target's to draw)")
    p.add_argument("--platforms", type=int, default=4, metavar="N",
                   help="platforms measured (default 4)")
    p.add_argument("--held-out-platforms", type=int, default=0, metavar="H",
                   help="further platforms drawn and named in the manifest, not measured "
                        "(default 0)")
    p.add_argument("--held-out-models", nargs="+", default=[], metavar="MODEL",
                   help="models named in the manifest as held out (not measured)")
    p.add_argument("--shapes", type=int, default=8, metavar="K",
                   help="random convolution workloads besides the models' (default 8)")
    p.add_argument("--small-shapes", type=int, default=0, metavar="K",
                   help="random small convolution workloads (planes of 2 to 14, 16 to 128 "
                        "channels: layers as tuning benchmarks shrink them; default 0)")
    p.add_argument("--grouped-shapes", type=int, default=0, metavar="K",
                   help="random grouped convolution workloads: half depthwise (3x3, one "
                        "channel a group), half with 2, 4 or 8 groups (default 0)")
    p.add_argument("--dense-shapes", type=int, default=0, metavar="K",
                   help="random dense (fully connected) workloads: 64 to 4,096 inputs, 10 "
                        "to 1,024 outputs, batch 1, 4 or 8 (default 0)")
    p.add_argument("--token-shapes", type=int, default=0, metavar="K",
                   help="random dense workloads of many rows, as a transformer's linear "
                        "layers over its tokens: 16 to 256 rows, 64 to 3,072 features each "
                        "way (default 0)")
    p.add_argument("--matmul-shapes", type=int, default=0, metavar="K",
                   help="random batched products of two activations (matmul:M,K,N,BATCH), "
                        "as attention's scores and values: 1 to 12 products of 1 to 256 "
                        "rows, 16 to 256 deep and wide (default 0)")
    p.add_argument("--matmul-t-shapes", type=int, default=0, metavar="K",
                   help="random products a @ b^T of two activations (matmul_t:M,K,N), the "
                        "form the accelerator runs attention's scores and values in: 1 to "
                        "256 rows, 16 to 256 deep and wide in whole blocks of 16 "
                        "(default 0)")
    p.add_argument("--per-task", type=int, default=8, metavar="K",
                   help="schedules per (platform, workload), the default among them "
                        "(default 8)")
    p.add_argument("--picked", type=int, default=0, metavar="K",
                   help="then K more per (platform, workload), the target's pretrained model's "
                        "best-ranked (corrected by what the workload measured): where the "
                        "model is wrong at the top of its ranking, which random schedules "
                        "rarely show (default 0)")
    p.add_argument("--rounds", type=int, default=1, metavar="R",
                   help="then measure every schedule again until each has R measurements, "
                        "a pass over the whole set a round (wall times: the rows take the "
                        "median; two rounds show how far two measurements agree; default 1)")
    p.add_argument("--side-by-side", type=int, default=0, metavar="R",
                   help="then measure each workload's schedules again in turn, R rounds of "
                        "slots of a few milliseconds, each round's figure a row (wall "
                        "times: schedules compared under the same state of a shared machine; "
                        "default 0, none)")
    p.add_argument("--precision", default="int8", choices=("int8", "float32"),
                   help="what the models' layers and the random shapes compute (default "
                        "int8)")
    p.add_argument("--measure", metavar="BACKEND",
                   help="one of the target's measurement backends (default its first: "
                        "the accelerator's is verilator)")
    p.add_argument("--jobs", type=int, default=1, metavar="J",
                   help="local worker processes, each measuring a (platform, workload) "
                        "task at a time, or the CPUs of --ray local's instance (default 1: "
                        "this process; the schedules and rows are the same for any J, "
                        "only wall times differ)")
    add_ray_option(p, "measure on Ray instead", "the records are written here")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the platforms, the shapes and the schedules (default 0)")
    add_target_options(p, "tune")
    p.set_defaults(func=run)


def _check_args(args):
    for name, least in (("platforms", 1), ("held_out_platforms", 0), ("shapes", 0),
                        ("small_shapes", 0), ("grouped_shapes", 0), ("dense_shapes", 0),
                        ("token_shapes", 0), ("matmul_shapes", 0),
                        ("matmul_t_shapes", 0), ("picked", 0),
                        ("rounds", 1), ("side_by_side", 0),
                        ("per_task", 1), ("jobs", 1)):
        value = getattr(args, name)
        if value < least:
            raise CliError(f"--{name.replace('_', '-')} must be at least {least}, not {value}")
    if not args.models and not any((args.shapes, args.small_shapes, args.grouped_shapes,
                                    args.dense_shapes, args.token_shapes, args.matmul_shapes,
                                    args.matmul_t_shapes)):
        raise CliError("nothing to measure: name a MODEL or give --shapes, --small-shapes, "
                       "--grouped-shapes, --dense-shapes, --token-shapes, --matmul-shapes "
                       "or --matmul-t-shapes K > 0")


def run(args) -> int:
    _check_args(args)
    target = make_target(args.target, args, "tune", log=log)
    measure = args.measure or (target.measure_backends or (None,))[0]
    if measure is None:
        raise CliError(f"target {target.name!r} has no tunable ops to measure")
    try:
        target.check_measure(measure)
        drawn = target.platforms(args.platforms + args.held_out_platforms, seed=args.seed)
        plan = training_sets.dataset_plan(
            drawn[:args.platforms], held_out=drawn[args.platforms:], models=args.models,
            shapes=random_shapes(args.shapes, seed=args.seed)
            + random_shapes(args.small_shapes, seed=args.seed, small=True)
            + random_shapes(args.grouped_shapes, seed=args.seed, grouped=True)
            + random_shapes(args.dense_shapes, seed=args.seed, dense=True)
            + random_shapes(args.token_shapes, seed=args.seed, tokens=True)
            + random_shapes(args.matmul_shapes, seed=args.seed, matmul=True)
            + random_shapes(args.matmul_t_shapes, seed=args.seed, matmul_t=True),
            per_task=args.per_task, picked=args.picked,
            seed=args.seed, held_out_models=args.held_out_models,
            precision=args.precision, rounds=args.rounds, side_by_side=args.side_by_side,
            log=log)
    except ValueError as e:
        raise CliError(str(e)) from None
    manifest_path = args.manifest or f"{args.records}.manifest.json"
    start = time.perf_counter()

    def progress(platform, task, done, total):
        print(f"[{done}/{total}] {platform}: {task}", file=sys.stderr, flush=True)

    try:
        # Started before the records are opened: a --ray address with no cluster is an
        # error before any file is written.
        executor = measuring_executor(plan, measure, jobs=args.jobs, ray=args.ray)
    except ValueError as e:     # Ray missing, no cluster at the address
        raise CliError(str(e)) from None
    with executor, Records(args.records) as records:
        on_interrupt(args, f"the records in {args.records} keep what was measured; the "
                           "same command resumes")
        # The manifest is rewritten after every task: a stopped run still says what its
        # records hold ("complete": false).
        manifest = generate(plan, records, backend=measure, executor=executor,
                            progress=progress, log=log,
                            checkpoint=lambda m: m.write(manifest_path))
    manifest.write(manifest_path)
    rounds = f", each measured {args.rounds} times" if args.rounds > 1 else ""
    if args.side_by_side:
        rounds += f", then {args.side_by_side} rounds side by side"
    print(f"training set: {manifest.total} measurements on {len(manifest.counts)} platforms"
          f"{rounds} ({manifest.measured} new, {manifest.failed} failed) in "
          f"{time.perf_counter() - start:.0f} s, {measure} measurements; records "
          f"{args.records}; manifest {manifest_path}")
    rows = [(platform, str(len(counts)), str(sum(counts.values())),
             str(sum(s["platform"] == platform for s in manifest.skipped)))
            for platform, counts in manifest.counts.items()]
    for line in table(("platform", "workloads", "measurements", "skipped"), rows,
                      right={1, 2, 3}):
        print("  " + line)
    held = manifest.held_out
    if held["platforms"] or held["models"]:
        print(f"held out (not measured): platforms {', '.join(held['platforms']) or '-'}; "
              f"models {', '.join(held['models']) or '-'}")
    return 0
