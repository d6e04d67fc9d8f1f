"""Full ResNet-18 on the Verilator backend: compile time and simulation wall time.

Builds ResNet-18 from the zoo (seeded weights), runs the front half (passes, int8
quantization calibrated on `--calibration` seeded images) and the back half
(`compile_model`: every conv and the classifier lowered with the default schedule
chooser), then runs one image on the cycle-accurate backend with the default config and
DRAM model, and checks every output bit-exactly against the quantized reference.

Targets (issue 6): compile under 5 s (front half after the model is built, plus the back
half), the Verilator run under 60 s wall-clock with the model's build cached (the first
run of a config builds it once, about half a minute, outside the timed part).

    python bench/resnet18_e2e.py [--model resnet18] [--calibration 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import vdla  # noqa: E402
from vdla.compiler import passes, quantize, run_reference, zoo  # noqa: E402
from vdla.compiler.backend import compile_model  # noqa: E402

COMPILE_TARGET_S = 5.0
RUN_TARGET_S = 60.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18", choices=zoo.names())
    parser.add_argument("--calibration", type=int, default=1)
    args = parser.parse_args(argv)
    config = vdla.HardwareConfig()
    rng = np.random.default_rng(0)

    graph = zoo.get(args.model)
    name = graph.inputs[0]
    shape = graph.tensors[name].shape
    samples = {name: rng.standard_normal((args.calibration, *shape[1:])).astype(np.float32)}
    feed = {name: rng.standard_normal(shape).astype(np.float32)}

    start = time.perf_counter()
    quantized = quantize(passes.prepare(graph), samples, config)
    front = time.perf_counter() - start
    start = time.perf_counter()
    compiled = compile_model(quantized, config)
    back = time.perf_counter() - start
    compile_s = front + back

    dev = vdla.runtime.open(config, backend="verilator")   # builds once, then cached
    with compiled.session(dev) as session:
        session.run(feed)   # warm-up: first-touch of the DRAM pages, numpy caches
        result = session.run(feed)
    dev.close()
    want = run_reference(quantized, feed)
    exact = all(np.array_equal(result.outputs[k], want[k]) for k in want)

    vdla_ops = [s for s in result.ops if s.target == "vdla"]
    sim_s = sum(s.wall_seconds for s in vdla_ops)
    print(f"{args.model} on Verilator, config {config.name}: {len(result.ops)} ops, "
          f"{len(vdla_ops)} on vdla")
    print(f"  compile: {compile_s:.2f} s (front half {front:.2f} s, back half {back:.2f} s)"
          f"  [target < {COMPILE_TARGET_S:g} s: "
          f"{'met' if compile_s < COMPILE_TARGET_S else 'MISSED'}]")
    print(f"  run:     {result.wall_seconds:.2f} s wall ({sim_s:.2f} s in vdla ops, "
          f"{result.cycles / sim_s / 1e6:.2f} M cycles/s)  [target < {RUN_TARGET_S:g} s: "
          f"{'met' if result.wall_seconds < RUN_TARGET_S else 'MISSED'}]")
    macs = sum(s.macs for s in vdla_ops)
    print(f"  {result.cycles:,} cycles = {result.seconds_at_clock * 1e3:.1f} ms at "
          f"{config.clock_mhz:g} MHz; GEMM utilization over the model "
          f"{macs / (result.cycles * config.macs_per_cycle):.1%}")
    print(f"  bit-exact vs the quantized reference: {'yes' if exact else 'NO'}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
