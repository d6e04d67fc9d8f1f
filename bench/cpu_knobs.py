"""Whole graphs with the CPU target's default schedules against the same graphs with
some knobs of the blocked direct convolutions (or, with ``--winograd``, of the Winograd
ones) changed, side by side: how a change to a default rule
(`vdla.compiler.targets.cpu.schedule._choose_blocked`, `_choose_winograd`) is measured
before it is made.

    python bench/cpu_knobs.py --set mr=6,nv=2,order=px [--models resnet50 mobilenet_v1]
                              [--precisions float32 int8] [--rounds 15] [--threads 2]
                              [--winograd] [--kernel 3x3]

Per model and precision: every tuning task whose default is a blocked direct
convolution (one group, not Winograd; with ``--winograd`` a Winograd one instead) gets
its default with the `--set` knobs replaced
(`ConvSchedule` fields; a schedule the layer cannot take, `ConvSchedule.check`, keeps
its default and is counted). Both programs are compiled, checked against the reference
(int8 bit for bit, float32 within the pipeline's tolerance), then run in `--rounds`
interleaved rounds of one whole-graph call each. Printed: each one's median time and the
median of the rounds' ratios (default / changed, above 1: the change is faster) with its
quartiles: on a shared host the machine's speed drifts from minute to minute, and only
the ratio of neighbouring runs is comparable (`docs/targets/cpu.md`).

What it measured on the AVX2-only AMD EPYC (2 threads, 15 rounds, 2026-11-29), against
the defaults of the time, the AVX2 rule's figures: ``--set mr=6,nv=2,order=px,tile_co=32``
(the defaults then: a row of up to 12 pixels by one vector) ResNet-50 and MobileNet-v1
float32 1.14x and 1.15x, int8 1.04x and 1.07x, ResNet-18 1.02x; then, with that the
default, ``--set unroll=2``: float32 ResNet-50 1.06x, MobileNet-v1 1.04x; int8 0.99x and
1.00x (so only float32 took it). On the Winograd layers, ``--winograd --set
mr=8,unroll=2,order=px`` (the 1,000-trial tuner's pick there, about 1.2x on each layer
measured alone at one thread): ResNet-18 float32 1.02x and 0.97x, ResNet-50 1.00x and
1.00x at 2 threads in two runs, so their default stayed. ``--kernel 3x3 --set mr=2,nv=1,tile_co=8,unroll=2`` (the 3x3 layers
only): int8 ResNet-18 1.14x, ResNet-50 1.03x, which made it AVX2's int8 rule for layers
of several taps; on every int8 layer ResNet-18 1.08x, ResNet-50 0.99x and MobileNet-v1
0.88x (so its 1x1 layers keep 6 x 2); on the float32 3x3 layers ResNet-18 0.81x and
ResNet-50 0.86x.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

import numpy as np

from vdla._platform import cpu_name
from vdla.compiler import pipeline, targets
from vdla.compiler.targets.cpu.schedule import ConvSchedule
from vdla.compiler.targets.cpu import isa as cpu_isa
from vdla.compiler.targets.model import compile_model

KNOBS = {f.name: f.type for f in dataclasses.fields(ConvSchedule)}


def parse_knobs(text: str) -> dict:
    """``mr=6,nv=2,order=px`` -> {"mr": 6, "nv": 2, "order": "px"}; ValueError naming
    an unknown knob or a malformed pair."""
    knobs = {}
    for pair in text.split(","):
        name, sep, value = pair.partition("=")
        if not sep or name not in KNOBS:
            raise ValueError(f"--set takes knob=value pairs of {', '.join(KNOBS)}, not "
                             f"{pair!r}")
        knobs[name] = int(value) if value.lstrip("-").isdigit() else value
    return knobs


def parse_kernel(text: str) -> tuple[int, int]:
    """``3x3`` -> (3, 3); argparse's error names the value otherwise."""
    kh, sep, kw = text.partition("x")
    if not (sep and kh.isdigit() and kw.isdigit() and int(kh) > 0 and int(kw) > 0):
        raise argparse.ArgumentTypeError(f"--kernel takes KHxKW (3x3, 1x1), not {text!r}")
    return int(kh), int(kw)


def changed_schedules(graph, target, knobs: dict, winograd: bool = False,
                      kernel: tuple[int, int] | None = None) -> tuple[dict, int]:
    """{node: its default with `knobs`} for the blocked direct convolutions (`winograd`:
    the Winograd ones; `kernel`: only those of that kernel size, (kh, kw)), and how many
    such tasks could not take them."""
    out, refused = {}, 0
    for task in target.tasks(graph):
        if not task.conv:
            continue
        default = task.default_schedule()
        if default.layout != "nchwc" or bool(default.wino) != winograd \
                or task.shape.depthwise:
            continue
        if kernel is not None and (task.shape.kh, task.shape.kw) != kernel:
            continue
        try:
            schedule = dataclasses.replace(default, **knobs).check(task.shape, task._isa)
        except ValueError:
            refused += 1
            continue
        out.update((node, schedule) for node in task.nodes)
    return out, refused


def measure(name: str, precision: str, knobs: dict, args) -> str:
    target = targets.get("cpu", threads=args.threads, isa=args.isa)
    model = pipeline.load_model(name, calibration=args.calibration, note=None)
    graph = pipeline.graph_for(model, target, precision=precision)
    changed, refused = changed_schedules(graph, target, knobs, args.winograd, args.kernel)
    reference = pipeline.reference_of(graph, model.feed)
    sessions = {}
    for who, schedules in (("default", {}), ("changed", changed)):
        session = compile_model(graph, target, schedules=schedules).session()
        outputs = session.run_graph(model.feed).outputs
        error = max(pipeline.relative_error(outputs[o], reference[o]) for o in graph.outputs)
        if error > (0.0 if precision == "int8" else pipeline.FLOAT_TOLERANCE):
            raise SystemExit(f"{name} {precision} {who}: differs from the reference by "
                             f"{error:.3g}")
        sessions[who] = session
    times = {who: [] for who in sessions}
    for _ in range(args.rounds):
        for who, session in sessions.items():
            start = time.perf_counter()
            session.run_graph(model.feed)
            times[who].append(time.perf_counter() - start)
    ratios = [d / c for d, c in zip(times["default"], times["changed"])]
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return (f"{name:13} {precision:8} {len(changed):4} nodes ({refused} tasks refused)  "
            f"default {1e3 * np.median(times['default']):8.2f} ms  changed "
            f"{1e3 * np.median(times['changed']):8.2f} ms  speed {np.median(ratios):.3f}x "
            f"(quartiles {q1:.3f}-{q3:.3f})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--set", required=True, metavar="KNOB=VALUE,...",
                   help=f"knobs to change: {', '.join(KNOBS)}")
    p.add_argument("--models", nargs="+", default=["resnet18", "resnet50", "mobilenet_v1"])
    p.add_argument("--precisions", nargs="+", default=["float32", "int8"],
                   choices=["float32", "int8"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--isa", default=None, choices=list(cpu_isa.ISAS),
                   help="vdla's instruction set (default: the best this machine runs; on "
                        "AMX tiles an int8 convolution of one group is a tile GEMM, "
                        "without the knobs of a blocked layer)")
    p.add_argument("--calibration", type=int, default=8)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--winograd", action="store_true",
                   help="change the Winograd layers' defaults instead of the blocked "
                        "direct ones'")
    p.add_argument("--kernel", type=parse_kernel, default=None, metavar="KHxKW",
                   help="change only the layers of this kernel size (3x3, 1x1, ...)")
    args = p.parse_args(argv)
    try:
        knobs = parse_knobs(args.set)
    except ValueError as e:
        p.error(str(e))
    if args.rounds < 2:
        p.error(f"--rounds must be at least 2, not {args.rounds}")
    isa = targets.get("cpu", isa=args.isa).isa.name
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; vdla's code for {isa}; "
          f"{args.threads} threads; --set {args.set}"
          f"{' on the Winograd layers' if args.winograd else ''}"
          f"{f' on the {args.kernel[0]}x{args.kernel[1]} layers' if args.kernel else ''}; "
          f"{args.rounds} interleaved "
          f"rounds")
    for name in args.models:
        for precision in args.precisions:
            print(measure(name, precision, knobs, args), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
