"""Full ResNet-18 on the Verilator backend: compile time and simulation wall time.

Builds ResNet-18 from the zoo (seeded weights), runs the front half (passes, int8
quantization calibrated on `--calibration` seeded images) and the vdla target's back
half (every conv and the classifier lowered with the default schedule chooser), through
`vdla.compiler.pipeline`, then runs one image on the cycle-accurate backend with the
default config and DRAM model, and checks every output bit-exactly against the quantized reference.

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

import vdla  # noqa: E402
from vdla.compiler import pipeline, targets, zoo  # noqa: E402
from vdla.compiler.reference import run_reference  # noqa: E402

COMPILE_TARGET_S = 5.0
RUN_TARGET_S = 60.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18", choices=zoo.names())
    parser.add_argument("--calibration", type=int, default=1)
    args = parser.parse_args(argv)
    config = vdla.HardwareConfig()
    target = targets.get("vdla", config=config, backend="verilator")
    model = pipeline.load_model(args.model, calibration=args.calibration)

    start = time.perf_counter()
    quantized = pipeline.quantize_for(model, target)
    front = time.perf_counter() - start
    start = time.perf_counter()
    compiled, _ = pipeline.compile_for(quantized, target)
    back = time.perf_counter() - start
    compile_s = front + back

    with compiled.session() as session:   # builds the Verilator model once, then cached
        session.run(model.feed)   # warm-up: first-touch of the DRAM pages, numpy caches
        result = session.run(model.feed, keep=True)
    exact, mismatch = pipeline.check(result.values, run_reference(quantized, model.feed,
                                                                   keep=True), quantized)

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
    seconds_at_clock = result.summary["vdla"]["seconds_at_clock"]
    print(f"  {result.cycles:,} cycles = {seconds_at_clock * 1e3:.1f} ms at "
          f"{config.clock_mhz:g} MHz; GEMM utilization over the model "
          f"{macs / (result.cycles * config.macs_per_cycle):.1%}")
    print(f"  bit-exact vs the quantized reference: {'yes' if exact else 'NO ' + mismatch}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
