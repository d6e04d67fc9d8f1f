"""What each feature past VTA buys and costs: whole models on Verilator with VTA's
default sizes and each feature alone and together (cycles, every run bit-exact), then
what each costs by yosys on the families the resource model calibrates it on.

    python bench/features.py [--models resnet18 mobilenet_v1 resnet50]

The cycles are ``vdla run MODEL --config ...``'s (the pipeline's whole-model run on the
Verilator backend); the costs are the calibration measurements of
`scripts/calibrate_resources.py` (`dse/calibration/<family>.json`): a config with the
feature minus the same config without it, both synthesized by yosys.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from vdla import HardwareConfig  # noqa: E402
from vdla.compiler import pipeline  # noqa: E402
from vdla.compiler.targets import get as get_target  # noqa: E402
from vdla.config import REQUIRED_ALU_OPS, AluOp  # noqa: E402
from vdla.dse.resources import (calibrated_families, calibration_path,  # noqa: E402
                                feature_pairs, feature_terms)

REQ = REQUIRED_ALU_OPS | {AluOp.REQ}
#: VTA's default sizes with each feature past VTA alone and together.
VARIANTS = {"VTA": HardwareConfig(), "REQ": HardwareConfig(alu_ops=REQ),
            "hold": HardwareConfig(alu_hold=True),
            "REQ + hold": HardwareConfig(alu_ops=REQ, alu_hold=True),
            "dw3": HardwareConfig(dw_taps=3),
            "all": HardwareConfig(alu_ops=REQ, alu_hold=True, dw_taps=3)}
#: The resource model's term of each feature (`vdla.dse.resources.feature_terms`).
TERMS = {"req_lanes": "REQ", "alu_hold": "hold", "lut_pairs": "DSP limit",
         "dw_window": "dw window"}


def cycles(model: str, config: HardwareConfig) -> int:
    outcome = pipeline.run_model(model, get_target("vdla", config=config))
    if not outcome.bit_exact:
        raise SystemExit(f"{model} on {config.name}: not bit-exact: {outcome.mismatch}")
    return sum(op.cycles or 0 for op in outcome.result.ops if op.target == "vdla")


def cycle_table(models: list[str]) -> list[str]:
    runs = {(name, model): cycles(model, config)
            for name, config in VARIANTS.items() for model in models}
    lines = ["cycles on Verilator (whole model, bit-exact), VTA's default sizes; saved "
             "against VTA's ISA",
             f"  {'config':<12} {'name':<44}" + "".join(f" {m:>24}" for m in models)]
    for name, config in VARIANTS.items():
        cells = []
        for model in models:
            c, base = runs[name, model], runs["VTA", model]
            cells.append(f"{c:>11,}" + (f" (-{100 * (1 - c / base):4.1f}%)" if c != base
                                        else " " * 9))
        lines.append(f"  {name:<12} {config.name:<44}" + "".join(f" {x:>24}" for x in cells))
    return lines


def cost_table() -> list[str]:
    lines = ["", "what each feature costs by yosys (calibration runs: the config with it "
             "minus the same config without; LUT is ALMs on the Cyclone V)",
             f"  {'family':<11} {'feature':<11} {'config':<44} {'LUT':>7} {'FF':>5} "
             f"{'DSP':>5} {'BRAM':>5}"]
    for family in calibrated_families():
        points = json.loads(calibration_path(family).read_text())["points"]
        for name, base in feature_pairs(points):
            config = HardwareConfig.from_dict(points[name]["config"])
            feats = " + ".join(TERMS[t] for t, v in feature_terms(config).items() if v)
            m, b = points[name]["resources"], points[base]["resources"]
            lines.append(f"  {family:<11} {feats:<11} {config.name:<44} "
                         f"{m['lut'] - b['lut']:>+7,} {m['ff'] - b['ff']:>+5,} "
                         f"{m['dsp'] - b['dsp']:>+5g} {m['bram'] - b['bram']:>+5g}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v1"])
    args = parser.parse_args(argv)
    start = time.perf_counter()
    print("\n".join(cycle_table(args.models) + cost_table()))
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
