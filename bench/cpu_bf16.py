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

    python3 bench/cpu_bf16.py [--models resnet18 mobilenet_v1 digits_cnn] [--inputs 8]
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--inputs", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    if args.inputs < 1:
        p.error(f"--inputs must be at least 1, not {args.inputs}")
    target, where = bf16_target(args.threads)
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
    print(f"(took {time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
