"""What the bf16 precision costs in accuracy: the CPU target's whole-graph runner with the
float graph's convolutions of one group and matrix products in bfloat16 on AMX tiles
(``vdla run --precision bf16``), against the float32 reference.

Per model, over `--inputs` inputs (the zoo's seeded ones; the trained digits models:
their test images): the largest output error relative to the largest reference output,
the median of that over the inputs, and how often the top output is the reference's;
for the trained digits models, the test accuracy in float32 and in bf16 beside it. The
batch is one image; the inputs run one after another through one compiled model.

Where the machine has no AMX-BF16 (this project's AMD hosts), the tile kernels run on
`vdla_cpu.h`'s software model of the tiles (`amx.modelled`), which follows Intel's
documented ``tdpbf16ps`` (its summation order and rounding): the errors are the
hardware's, the times are not, and no time is printed.

With ``--speed ROUNDS`` (AMX-BF16 machines only), each model's whole graph at bf16 and
at float32 (the default CPU target) alternate over that many rounds of ``--runs`` runs;
printed: each one's median time and the median of the rounds' ratios (float32's time
over bf16's, so above 1 is bf16 faster), with their quartiles.

    python3 bench/cpu_bf16.py [--models resnet18 mobilenet_v1 digits_cnn] [--inputs 8]
                              [--speed 9] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from vdla._platform import cpu_name
from vdla.compiler import pipeline, run_reference
from vdla.compiler.frontend.datasets import digits_split
from vdla.compiler.reference.tolerance import relative_error
from vdla.compiler.targets.cpu import amx
from vdla.compiler.targets.cpu.build import machine_features
from vdla.compiler.targets.cpu.isa import get as get_isa
from vdla.compiler.targets.cpu.target import CpuTarget

MODELS = ("resnet18", "resnet50", "mobilenet_v1", "digits_cnn", "vit_digits", "bert_tiny")
TRAINED = ("digits_cnn", "vit_digits")


def bf16_target(threads: int) -> tuple[CpuTarget, str]:
    """The CPU target at bf16: natively where AMX-BF16 runs, else on the tile model."""
    isa = get_isa("amx")
    why = isa.refusal(machine_features())
    if why is None and machine_features().amx_bf16:
        return CpuTarget(threads=threads, bf16=True), "AMX tiles"
    return (CpuTarget(threads=threads, isa=amx.modelled(isa), bf16=True),
            "the software model of the tiles (no AMX-BF16 here)")


def feeds(model: pipeline.LoadedModel, name: str, count: int) -> list[dict]:
    """`count` inputs: the trained digits models' test images, else the model's own feed
    and seeded inputs of its shapes."""
    if name in TRAINED:
        _, _, x, _ = digits_split()
        return [{model.graph.inputs[0]: x[i:i + 1]} for i in range(count)]
    rng = np.random.default_rng(1)
    out = [model.feed]
    while len(out) < count:
        feed = {}
        for key, value in model.feed.items():
            if value.dtype.kind == "f":
                feed[key] = rng.standard_normal(value.shape).astype(value.dtype)
            else:
                feed[key] = value      # token ids and masks: the model's own
        out.append(feed)
    return out


def accuracy(session, graph, output: str) -> tuple[float, float]:
    """(float32, bf16) accuracy on the digits test split."""
    _, _, x, y = digits_split()
    name = graph.inputs[0]
    ref = np.array([run_reference(graph, {name: x[i:i + 1]})[output].argmax(-1)[0]
                    for i in range(len(x))])
    got = np.array([session.run({name: x[i:i + 1]}).outputs[output].argmax(-1)[0]
                    for i in range(len(x))])
    return float((ref == y).mean()), float((got == y).mean())


def speed(model: pipeline.LoadedModel, name: str, target: CpuTarget, args) -> str:
    """One line: `model` at bf16 on `target` against float32 on the default CPU target,
    whole graph, alternating rounds (`--speed`, `--runs`)."""
    sessions = {}
    for who, t, precision in (("bf16", target, "bf16"),
                              ("float32", CpuTarget(threads=args.threads), "float32")):
        graph = pipeline.graph_for(model, t, precision=precision)
        sessions[who] = pipeline.compile_for(graph, t)[0].session()
    feed = dict(model.feed)
    times = {who: [] for who in sessions}
    for _ in range(args.speed):
        for who, session in sessions.items():
            session.run_graph(feed)
            runs = []
            for _ in range(args.runs):
                start = time.perf_counter()
                session.run_graph(feed)
                runs.append(time.perf_counter() - start)
            times[who].append(statistics.median(runs))
    for session in sessions.values():
        session.close()
    ratios = [f / b for f, b in zip(times["float32"], times["bf16"])]
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    ms = {who: 1e3 * statistics.median(t) for who, t in times.items()}
    return (f"{name:<13} bf16 {ms['bf16']:8.2f} ms  float32 {ms['float32']:8.2f} ms  "
            f"bf16 speed {statistics.median(ratios):.2f}x float32's (quartiles "
            f"{q1:.2f}-{q3:.2f})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--inputs", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--speed", type=int, default=0, metavar="ROUNDS",
                   help="also time bf16 against float32 in this many alternating rounds "
                        "(machines with AMX-BF16 only)")
    p.add_argument("--runs", type=int, default=5, help="runs a round with --speed")
    args = p.parse_args(argv)
    if args.inputs < 1:
        p.error(f"--inputs must be at least 1, not {args.inputs}")
    if args.speed < 0 or args.runs < 1:
        p.error(f"--speed must be 0 or more and --runs at least 1, not {args.speed} and "
                f"{args.runs}")
    target, where = bf16_target(args.threads)
    if args.speed and where != "AMX tiles":
        p.error(f"--speed times the tiles, and this machine has no AMX-BF16: bf16 runs on "
                f"{where}")
    print(f"machine: {cpu_name()}; bf16 kernels on {where}; {args.threads} threads")
    print(f"{'model':<13} {'tiles':>5} {'max error':>10} {'median':>8} {'top-1 agree':>12} "
          f"{'accuracy f32 / bf16':>20}")
    start = time.perf_counter()
    for name in args.models:
        model = pipeline.load_model(name, note=None)
        graph = pipeline.graph_for(model, target, precision="bf16")
        compiled, _ = pipeline.compile_for(graph, target)
        tiles = sum("vdla_amx_block_bf16" in op.kernel.kernel.body
                    for op in compiled.ops if op.target == "cpu")
        output = graph.outputs[0]
        errors, agree = [], []
        with compiled.session() as session:
            for feed in feeds(model, name, args.inputs):
                want = run_reference(graph, feed)[output]
                got = session.run(feed).outputs[output]
                errors.append(relative_error(got, want))
                agree.append(float((got.argmax(-1) == want.argmax(-1)).mean()))
            acc = ("{:.4f} / {:.4f}".format(*accuracy(session, graph, output))
                   if name in TRAINED else "")
        print(f"{name:<13} {tiles:>5} {max(errors):>10.2e} {statistics.median(errors):>8.2e} "
              f"{statistics.mean(agree):>12.3f} {acc:>20}", flush=True)
    if args.speed:
        print(f"\nSpeed ({args.threads} threads, whole graph, {args.speed} alternating rounds "
              f"of {args.runs} runs; float32: the default CPU target)")
        for name in args.models:
            print(speed(pipeline.load_model(name, note=None), name, target, args), flush=True)
    print(f"(took {time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
