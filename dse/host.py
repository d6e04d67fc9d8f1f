"""The host's time in a sweep: how long the ops a config leaves on the host take.

    model = HostModel.load()                    # dse/calibration/host.json
    model.op_seconds(node, graph)               # one host op's predicted seconds
    model.seconds(graph, names)                 # the host ops `names` of `graph` together

A config that cannot run an op leaves it on the host, where a session runs it on vdla's
integer reference kernels (numpy: `vdla.compiler.reference`, the host target). A sweep
that counted only the accelerator's cycles would price those ops at nothing, and a
feature that moves one onto the accelerator (the ALU's table running ``qgelu``) would
look worse for the cycles it adds. This model gives every host op a time.

**The model.** Each host op has a *kind* (`kind_of`) and a *work* (`work_of`): one or
two counts its kernel's time grows with. Its time is linear in them,

    seconds = per_op + sum(per_unit[w] * work[w] for w in the kind's work)

with these kinds and work counts (elements are the product of a tensor's shape):

=================  ============================================================
kind               work
=================  ============================================================
qsoftmax           ``elements`` of its input (the rows it walks); no mask, not causal
qsoftmax_masked    the same, with a mask input (an op that is also causal is
                   priced as the costlier of this and ``qsoftmax_causal``)
qsoftmax_causal    the same, causal, without a mask input
qlayer_norm        ``elements`` of its input (the rows it walks)
qgelu              ``elements`` of its output
qattention         ``macs`` of its two products (q·kᵀ and p·v) and ``scores``
                   (the softmax's elements, B·H·S·T): the whole attention on the host
gather             ``elements`` of its output (the rows it copies)
quantize           ``elements`` of its output
dequantize         ``elements`` of its output
gemm               ``macs``: qdense, qmatmul, qconv2d and their float forms
layout             ``elements`` of its output: reshape, flatten, transpose, slice,
                   concat, expand, pad, layout_transform (views and copies)
elementwise        ``elements`` of its output: every other op (float add, mul, cast,
                   tanh, comparisons, pools, ...), so that no host op is free
=================  ============================================================

**Parameters.** ``per_op`` (seconds) and ``per_unit`` (seconds per unit of each work
count), per kind, fitted by ``scripts/calibrate_host.py`` to median wall times of the
kernels on the machine it ran on, by non-negative least squares on the relative error.
The file also holds each kind's samples (shape, work, measured seconds), the fit's
worst relative error over them, and its provenance: the CPU's model name and the
instruction sets numpy dispatches to on it, core count, numpy's version, the date and
the command. The times are that CPU's: a board's ARM core is slower, so a sweep on this
model values work moved to the accelerator conservatively.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["FORMAT", "HOST_CALIBRATION", "HostModel", "KINDS", "LAYOUT_OPS", "GEMM_OPS",
           "kind_of", "work_of"]

#: The committed calibration (`scripts/calibrate_host.py` writes it).
HOST_CALIBRATION = Path(__file__).resolve().parent / "calibration" / "host.json"
#: The calibration file's format version.
FORMAT = 1
#: kind -> the names of its work counts (see the module docstring).
KINDS: dict[str, tuple[str, ...]] = {
    "qsoftmax": ("elements",),
    "qsoftmax_masked": ("elements",),
    "qsoftmax_causal": ("elements",),
    "qlayer_norm": ("elements",),
    "qgelu": ("elements",),
    "qattention": ("macs", "scores"),
    "gather": ("elements",),
    "quantize": ("elements",),
    "dequantize": ("elements",),
    "gemm": ("macs",),
    "layout": ("elements",),
    "elementwise": ("elements",),
}
#: Ops priced as data movement (per element of their output).
LAYOUT_OPS = frozenset({"reshape", "flatten", "transpose", "slice", "concat", "expand",
                        "pad", "layout_transform"})
#: Ops priced by their multiply-accumulates.
GEMM_OPS = frozenset({"qdense", "qmatmul", "qconv2d", "dense", "matmul", "conv2d"})
#: Ops whose kind is their own name.
_OWN_KIND = frozenset({"qlayer_norm", "qgelu", "qattention", "gather", "quantize",
                       "dequantize"})
#: Ops whose work is counted on their input (the rows the kernel walks).
_INPUT_WALKERS = frozenset({"qsoftmax", "qlayer_norm"})


def _elements(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def kind_of(op: str, *, masked: bool = False, causal: bool = False) -> str:
    """The kind of a host op `op` (a qsoftmax's: whether it has a mask input, whether
    it is causal)."""
    if op == "qsoftmax":
        if masked:
            return "qsoftmax_masked"
        return "qsoftmax_causal" if causal else "qsoftmax"
    if op in _OWN_KIND:
        return op
    if op in GEMM_OPS:
        return "gemm"
    if op in LAYOUT_OPS:
        return "layout"
    return "elementwise"


def work_of(op: str, inputs: Sequence[Sequence[int] | None],
            output: Sequence[int]) -> dict[str, int]:
    """The work counts of host op `op` with input shapes `inputs` (None: an absent
    optional input) and output shape `output`, by the kind's names (`KINDS`)."""
    kind = kind_of(op)
    if kind == "qattention":
        q, k, v = inputs[0], inputs[1], inputs[2]
        s, t = int(q[-2]), int(k[-2])
        heads = _elements(q[:-2])
        return {"macs": heads * s * t * (int(q[-1]) + int(v[-1])),
                "scores": heads * s * t}
    if kind == "gemm":
        x, w = inputs[0], inputs[1]
        if op in ("qconv2d", "conv2d"):    # (O, I / groups, kh, kw): each output's MACs
            per_output = _elements(w[1:])
        else:                              # x (..., K): products with K terms
            per_output = int(x[-1])
        return {"macs": _elements(output) * per_output}
    if op in _INPUT_WALKERS:
        return {"elements": _elements(inputs[0])}
    return {"elements": _elements(output)}


class HostModel:
    """Host op times (see the module docstring).

    coefficients : kind -> {"per_op": seconds, "per_unit": {work: seconds per unit}}
        for every kind of `KINDS`
    provenance : where the figures come from (``cpu`` at least: whose host it is)
    source : what to call the model in errors (a file's path)
    """

    def __init__(self, coefficients: Mapping[str, Mapping[str, Any]],
                 provenance: Mapping[str, Any], *, source: str = "host model"):
        self.source = source
        self.coefficients = _check_coefficients(coefficients, source)
        cpu = provenance.get("cpu") if isinstance(provenance, Mapping) else None
        if not isinstance(cpu, str) or not cpu.strip():
            raise ValueError(f"{source}: machine.cpu must name the CPU the kernels were "
                             f"timed on (a non-empty string), not {cpu!r}")
        self.provenance = dict(provenance)

    # --- construction -----------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path | None = None) -> "HostModel":
        """The model in calibration file `path` (default: the committed one,
        `HOST_CALIBRATION`). ValueError naming the file and what is wrong."""
        path = Path(HOST_CALIBRATION if path is None else path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"host calibration {path}: no such file (python3 "
                             f"scripts/calibrate_host.py writes it)") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"host calibration {path}: not a readable JSON file "
                             f"({exc})") from None
        return cls.from_dict(data, source=f"host calibration {path}")

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "host calibration") -> "HostModel":
        """The model of a calibration file's contents (`to_dict`'s form, or the file
        `scripts/calibrate_host.py` writes, whose extra fields are kept out of it)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{source}: must be a JSON object, not {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise ValueError(f"{source}: format must be {FORMAT}, not "
                             f"{data.get('format')!r}")
        kinds = data.get("kinds")
        if not isinstance(kinds, Mapping):
            raise ValueError(f"{source}: kinds must be an object kind -> coefficients, "
                             f"not {kinds!r}")
        machine = data.get("machine")
        if not isinstance(machine, Mapping):
            raise ValueError(f"{source}: machine must be an object naming the CPU "
                             f"(cpu, isa, ...), not {machine!r}")
        coefficients = {k: {"per_op": v.get("per_op"), "per_unit": v.get("per_unit")}
                        if isinstance(v, Mapping) else v for k, v in kinds.items()}
        provenance = {**machine, **{k: data[k] for k in ("date", "command", "numpy")
                                    if k in data}}
        return cls(coefficients, provenance, source=source)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "machine": dict(self.provenance),
                "kinds": {k: {"per_op": c["per_op"], "per_unit": dict(c["per_unit"])}
                          for k, c in self.coefficients.items()}}

    @property
    def cpu(self) -> str:
        """Whose host: the CPU the kernels were timed on."""
        return self.provenance["cpu"]

    @property
    def digest(self) -> str:
        """A short hash of the coefficients and the CPU (a sweep store's key part)."""
        text = json.dumps({"kinds": self.coefficients, "cpu": self.cpu}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # --- predictions ------------------------------------------------------------------

    def predict(self, kind: str, work: Mapping[str, float]) -> float:
        """Seconds of one op of `kind` with `work` (its `KINDS` counts)."""
        c = self.coefficients[kind]
        return c["per_op"] + sum(c["per_unit"][w] * float(work[w]) for w in KINDS[kind])

    def op_seconds(self, node, graph) -> float:
        """Seconds of `node` of `graph` on the host (shapes from the graph)."""
        shapes = [graph.tensors[i].shape if i else None for i in node.inputs]
        output = graph.tensors[node.outputs[0]].shape
        work = work_of(node.op, shapes, output)
        if node.op == "qsoftmax":
            masked = len(node.inputs) > 1 and bool(node.inputs[1])
            causal = bool(node.attrs.get("causal"))
            kinds = [kind_of("qsoftmax", masked=masked, causal=causal)]
            if masked and causal:
                kinds.append("qsoftmax_causal")
            return max(self.predict(k, work) for k in kinds)
        return self.predict(kind_of(node.op), work)

    def seconds(self, graph, names: Iterable[str]) -> float:
        """Seconds of the nodes `names` of `graph` on the host, one after another."""
        return sum(self.op_seconds(graph.node(n), graph) for n in names)


def _number(value: Any, where: str, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"{source}: {where} must be a finite number of seconds >= 0, "
                         f"not {value!r}")
    return float(value)


def _check_coefficients(coefficients: Any, source: str) -> dict:
    if not isinstance(coefficients, Mapping):
        raise ValueError(f"{source}: kinds must be an object kind -> coefficients, not "
                         f"{coefficients!r}")
    missing = [k for k in KINDS if k not in coefficients]
    if missing:
        raise ValueError(f"{source}: kinds lacks {', '.join(missing)}; it must price every "
                         f"kind: {', '.join(KINDS)}")
    unknown = sorted(set(coefficients) - set(KINDS))
    if unknown:
        raise ValueError(f"{source}: unknown kind(s) {', '.join(map(repr, unknown))}; the "
                         f"kinds are {', '.join(KINDS)}")
    out = {}
    for kind, work in KINDS.items():
        c = coefficients[kind]
        if not isinstance(c, Mapping):
            raise ValueError(f"{source}: kinds.{kind} must be an object with per_op and "
                             f"per_unit, not {c!r}")
        per_unit = c.get("per_unit")
        if not isinstance(per_unit, Mapping) or set(per_unit) != set(work):
            raise ValueError(f"{source}: kinds.{kind}.per_unit must be an object of "
                             f"{', '.join(work)} (seconds per unit), not {per_unit!r}")
        out[kind] = {"per_op": _number(c.get("per_op"), f"kinds.{kind}.per_op", source),
                     "per_unit": {w: _number(per_unit[w], f"kinds.{kind}.per_unit.{w}",
                                             source) for w in work}}
    return out
