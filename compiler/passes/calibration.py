"""Calibration for `vdla.compiler.passes.quantize`: calibration data in the forms
`quantize` and `quantize_error` take, split into per-sample input dicts
(`split_samples`), each tensor's range over them (`calibrate_ranges`), and the error of a
quantized graph against its float one on such samples (`quantize_error`; exported by
`vdla.compiler.passes.quantize` too).

Inputs of any dtype calibrate: token ids (int64) and masks (bool) get ranges like float
tensors, which the quantizer never uses for them. A range is over the finite values: an
additive mask's ``-inf`` (a causal or padding exclusion) is no error, a NaN is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.reference.executor import run_reference
from vdla.compiler.reference.integer import QuantizationError

__all__ = ["calibrate_ranges", "quantize_error", "split_samples"]


# --- calibration data ---------------------------------------------------------------------

def split_samples(graph: Graph, data, what: str) -> list[dict[str, np.ndarray]]:
    """Per-sample input dicts from `data`: a dict name -> array whose leading axis
    stacks samples shaped like the graph input (for an input with batch 1 the batch axis
    may be the sample axis; an array of exactly the input's shape is one sample), or a
    list of input dicts."""
    inputs = {n: graph.tensors[n].shape for n in graph.inputs}
    takes = ", ".join(f"{n} {s}" for n, s in inputs.items())

    def check_names(d: Mapping, where: str):
        if not isinstance(d, Mapping):
            raise QuantizationError(f"{what}{where} must be a dict of input name -> array, "
                                    f"not {type(d).__name__}")
        missing = [n for n in inputs if n not in d]
        unknown = sorted(set(d) - set(inputs))
        if missing or unknown:
            raise QuantizationError(
                f"{what}{where}: " + (f"missing input(s) {missing}" if missing else "")
                + ("; " if missing and unknown else "")
                + (f"unknown input(s) {unknown}" if unknown else "")
                + f"; graph {graph.name!r} takes {takes}")

    if data is None or (hasattr(data, "__len__") and len(data) == 0):
        raise QuantizationError(f"{what} is empty; give at least one sample of {takes}")
    if isinstance(data, Mapping):
        check_names(data, "")
        stacked = {}
        for name, shape in inputs.items():
            arr = np.asarray(data[name])
            if arr.ndim == len(shape) + 1 and tuple(arr.shape[1:]) == shape:
                stacked[name] = arr
            elif shape and shape[0] == 1 and arr.ndim == len(shape) \
                    and tuple(arr.shape[1:]) == shape[1:]:
                stacked[name] = arr[:, None]
            elif tuple(arr.shape) == shape:
                stacked[name] = arr[None]                  # one sample of a batched input
            else:
                raise QuantizationError(
                    f"{what}[{name!r}] has shape {tuple(arr.shape)}; expected samples stacked "
                    f"on a leading axis, (N,) + {shape}"
                    + (f", or (N,) + {shape[1:]} with the batch axis as the sample axis"
                       if shape and shape[0] == 1 else ""))
        counts = {name: arr.shape[0] for name, arr in stacked.items()}
        if len(set(counts.values())) > 1:
            raise QuantizationError(f"{what}: the inputs have different sample counts {counts}")
        n = next(iter(counts.values()))
        if n == 0:
            raise QuantizationError(f"{what} holds 0 samples; give at least one of {takes}")
        return [{name: arr[i] for name, arr in stacked.items()} for i in range(n)]
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        samples = []
        for i, d in enumerate(data):
            check_names(d, f"[{i}]")
            sample = {}
            for name, shape in inputs.items():
                arr = np.asarray(d[name])
                if tuple(arr.shape) != shape:
                    raise QuantizationError(f"{what}[{i}][{name!r}] has shape "
                                            f"{tuple(arr.shape)}; the graph input is {shape}")
                sample[name] = arr
            samples.append(sample)
        return samples
    raise QuantizationError(f"{what} must be a dict of input name -> stacked samples or a "
                            f"list of input dicts, not {type(data).__name__}")


#: Per sample and tensor, at most this many |values| are kept for a percentile.
_PERCENTILE_SAMPLE = 1 << 16


def calibrate_ranges(graph: Graph, samples, percentile: float | None, *,
                     observe: Callable[[dict[str, np.ndarray]], None] | None = None,
                     infinite: set[str] | None = None) -> dict[str, float]:
    """The range of every non-constant tensor over the samples: max |value| over its
    finite values, or the given percentile of |value| (over a strided subsample of large
    tensors). `observe`, if given, is called with every tensor's value (name -> array)
    of each sample: what a pass records beyond ranges (inside a fused op); `infinite`,
    if given, receives the names of the tensors that held an infinity. Raises
    QuantizationError for a tensor with a NaN."""
    maxima: dict[str, float] = {}
    pools: dict[str, list[np.ndarray]] = {}
    for sample in samples:
        values = run_reference(graph, sample, keep=True)
        if observe is not None:
            observe(values)
        for name, value in values.items():
            if graph.tensors[name].is_constant:
                continue
            v = np.abs(np.asarray(value, dtype=np.float64)).ravel()
            if np.isnan(v).any():
                raise QuantizationError(f"calibration: tensor {name!r} has non-finite values "
                                        "(NaN) on a calibration sample")
            if not np.all(np.isfinite(v)):
                v = v[np.isfinite(v)]
                if infinite is not None:
                    infinite.add(name)
            if percentile is None:
                maxima[name] = max(maxima.get(name, 0.0), float(v.max(initial=0.0)))
            else:
                step = max(1, v.size // _PERCENTILE_SAMPLE)
                pools.setdefault(name, []).append(v[::step])
    if percentile is not None:
        maxima = {name: float(np.percentile(np.concatenate(parts), percentile))
                  for name, parts in pools.items()}
    return maxima


def quantize_error(float_graph: Graph, quant_graph: Graph, inputs) -> dict[str, dict[str, float]]:
    """Compare a float graph with its quantized version on `inputs` (one input dict, or
    samples in the forms `quantize` takes for calibration).

    Outputs are matched by position; returns, per output name of `float_graph`,
    ``{"max_abs": max |float - quantized|, "range": max - min of the float output,
    "relative": max_abs / range}`` over all samples (range 0 counts as 1)."""
    if len(float_graph.outputs) != len(quant_graph.outputs):
        raise QuantizationError(f"quantize_error: the float graph has "
                                f"{len(float_graph.outputs)} outputs, the quantized one "
                                f"{len(quant_graph.outputs)}")
    samples = split_samples(float_graph, inputs, "inputs")
    errors = {name: 0.0 for name in float_graph.outputs}
    lows = {name: math.inf for name in float_graph.outputs}
    highs = {name: -math.inf for name in float_graph.outputs}
    for sample in samples:
        f = run_reference(float_graph, sample)
        qv = run_reference(quant_graph, sample)
        for fname, qname in zip(float_graph.outputs, quant_graph.outputs):
            a = np.asarray(f[fname], dtype=np.float64)
            b = np.asarray(qv[qname], dtype=np.float64)
            errors[fname] = max(errors[fname], float(np.abs(a - b).max(initial=0.0)))
            lows[fname] = min(lows[fname], float(a.min(initial=math.inf)))
            highs[fname] = max(highs[fname], float(a.max(initial=-math.inf)))
    result = {}
    for name in float_graph.outputs:
        span = highs[name] - lows[name]
        result[name] = {"max_abs": errors[name], "range": span,
                        "relative": errors[name] / (span if span > 0 else 1.0)}
    return result
