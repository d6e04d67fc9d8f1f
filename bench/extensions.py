"""What each extension past VTA buys and costs: whole models on Verilator with VTA's
default sizes and each extension alone and all together (cycles, every run bit-exact),
then what each costs by yosys on the families the resource model calibrates it on.

    python bench/extensions.py [--models resnet18 mobilenet_v1 resnet50]

The cycles are ``vdla run MODEL --config ...``'s (the pipeline's whole-model run on the
Verilator backend); the costs are the calibration measurements of
`scripts/calibrate_resources.py` (`dse/calibration/<family>.json`): a config with the
extension minus the same config without it, both synthesized by yosys. The extensions
are `vdla.extensions.EXTENSIONS`; those that change no cycle (the DSP limit: only
synthesis differs) are in the cost table only.
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
from vdla.dse.resources import (TERM_EXTENSIONS, calibrated_families,  # noqa: E402
                                calibration_path, extension_pairs, extension_terms)
from vdla.extensions import EXTENSIONS, by_key  # noqa: E402


def _variants() -> dict[str, HardwareConfig]:
    """VTA's default sizes, then with each extension a program sees alone (at its example
    value), then with all of them."""
    base, variants = HardwareConfig(), {"VTA": HardwareConfig()}
    together = base
    for ext in EXTENSIONS:
        if ext.in_programs:   # the others change no cycle
            config = base.replace(**ext.with_(base))
            variants[ext.alu_op or ext.short(config)] = config
            # One at a time: the ALU ops' extensions share alu_ops.
            together = together.replace(**ext.with_(together))
    variants["all"] = together
    return variants


#: The configs the cycle table runs: label -> config.
VARIANTS = _variants()


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
    lines = ["", "what each extension costs by yosys (calibration runs: the config with it "
             "minus the same config without; LUT is ALMs on the Cyclone V)",
             f"  {'family':<11} {'extension':<16} {'config':<44} {'LUT':>7} {'FF':>5} "
             f"{'DSP':>5} {'BRAM':>5}"]
    for family in calibrated_families():
        points = json.loads(calibration_path(family).read_text())["points"]
        for name, base in extension_pairs(points):
            config = HardwareConfig.from_dict(points[name]["config"])
            # Once each (the table is priced by two terms).
            exts = " + ".join(dict.fromkeys(by_key(TERM_EXTENSIONS[t][0]).title
                                            for t, v in extension_terms(config).items() if v))
            m, b = points[name]["resources"], points[base]["resources"]
            lines.append(f"  {family:<11} {exts:<16} {config.name:<44} "
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
