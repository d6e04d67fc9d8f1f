"""How close a target's results must come to the reference: int outputs exactly, float
ones within a relative tolerance (max |difference| / max |reference|), since a target's
float sums round differently from the reference's float64 ones.

The pipeline checks whole models with these (`vdla.compiler.pipeline.check`); the
targets' tuning tasks check each measured schedule with `mismatch`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["BF16_TOLERANCE", "FLOAT16_TOLERANCE", "FLOAT_TOLERANCE", "TOLERANCES", "mismatch",
           "relative_error"]

#: How far a float32 run may be from the float reference, relative.
FLOAT_TOLERANCE = 1e-4
#: How far a float16 run may be: activations and weights rounded to float16 (11
#: significant bits, 4.9e-4 relative each), sums in float32. Measured on the GPU target
#: under Triton's interpreter: small_cnn 4.4e-4, digits_cnn 1.5e-3, ResNet-18 9.7e-4.
FLOAT16_TOLERANCE = 1e-2
#: How far a bf16 run may be: the operands of its convolutions and matrix products rounded
#: to bfloat16 (8 significant bits, 3.9e-3 relative each), sums in float32, the rest
#: float32. Measured on the CPU target's tile kernels (on the software model of the
#: tiles; bench/cpu_bf16.py, 8 inputs each): ResNet-18 5.2e-3, ResNet-50 1.8e-2,
#: MobileNet-v1 8.9e-2 (its seeded weights: 28 layers deep, with the top output the
#: reference's on every input), the trained digits models 3.0e-3 and 2.0e-3 at their
#: float32 accuracy. A layout or indexing mistake is off by the outputs' own size.
BF16_TOLERANCE = 0.15
#: The tolerance of each float precision.
TOLERANCES = {"float32": FLOAT_TOLERANCE, "float16": FLOAT16_TOLERANCE,
              "bf16": BF16_TOLERANCE}


def relative_error(value: np.ndarray, reference: np.ndarray) -> float:
    """max |value - reference| / max |reference| (a reference of zeros counts as 1);
    inf when the shapes differ."""
    a, b = np.asarray(value, np.float64), np.asarray(reference, np.float64)
    if a.shape != b.shape:
        return float("inf")
    scale = float(np.abs(b).max(initial=0.0)) or 1.0
    return float(np.abs(a - b).max(initial=0.0)) / scale


def mismatch(got: np.ndarray, want: np.ndarray, tolerance: float = FLOAT_TOLERANCE) -> str:
    """'' when `got` matches the reference output `want` (int: exactly; float: within
    `tolerance` relative), else what differs."""
    if np.shape(got) != np.shape(want):
        return f"output of shape {np.shape(got)}, the reference's {np.shape(want)}"
    if want.dtype.kind in "iu":
        if np.array_equal(got, want):
            return ""
        return (f"{int(np.count_nonzero(got != want))} of {want.size} output values differ "
                "from the reference")
    err = relative_error(got, want)
    return "" if err <= tolerance else (f"output differs from the float reference by "
                                        f"{err:.3g} relative (> {tolerance:g})")
