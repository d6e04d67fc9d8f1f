"""The cost of int8 on the zoo's seeded transformers: each model's logits quantized
(calibrated on `--calibration` generated samples, "multiply" requantization) against the
float reference on one generated input, with softmax, LayerNorm, GELU and attention in
their integer definitions and kept in float (`integer_nonlinear=False`), side by side.

Printed per model: the largest logit error relative to the largest float logit, and how
often the int8 model's top logit is the float model's (per row: one for a classifier,
one per position for gpt_mini). The weights are seeded random ones, not trained: their
logits are close together, so the top-1 agreement is a harsh measure; the trained
vit_digits' accuracy is tests/compiler/test_transformer_zoo.py's.

    python3 bench/transformer_error.py [--models bert_tiny gpt_mini bert_base]
"""

from __future__ import annotations

import argparse

import numpy as np

from vdla._platform import cpu_name
from vdla.compiler import pipeline, run_reference
from vdla.compiler.passes import prepare


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--models", nargs="+", default=["bert_tiny", "gpt_mini", "bert_base"])
    p.add_argument("--calibration", type=int, default=4)
    args = p.parse_args(argv)
    print(f"machine: {cpu_name()}; calibration "
          f"{args.calibration} generated samples, multiply requantization")
    print(f"{'model':<10} {'softmax/LN/GELU':<16} {'max logit error':>16} {'top-1 agreement':>16}")
    for name in args.models:
        model = pipeline.load_model(name, calibration=args.calibration, note=None)
        reference = run_reference(prepare(model.graph), model.feed)["logits"]
        for integer in (True, False):
            graph = pipeline.quantize_for(model, [], mode="multiply",
                                          integer_nonlinear=integer)
            got = run_reference(graph, model.feed)["logits"].astype(np.float64)
            error = np.abs(got - reference).max() / np.abs(reference).max()
            agree = (got.argmax(-1) == reference.argmax(-1)).mean()
            print(f"{name:<10} {'integer' if integer else 'float':<16} {error:>16.3f} "
                  f"{agree:>16.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
