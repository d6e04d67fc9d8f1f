"""int8 quantization: the pass that turns a float graph into integer operators, whose
arithmetic `vdla.compiler.reference.integer` defines.

`quantize(graph, calibration_inputs, mode)` prepares the graph (BN folding, fusion:
`vdla.compiler.passes.prepare`), runs it on the calibration samples and records each
tensor's range ``r`` (max |value|, or a percentile of |value|:
`vdla.compiler.passes.calibration`), then rewrites it.

The *requantization mode* is what the quantized graph asks of the back half that runs
it, and the only thing the quantizer needs to know about one: each target says which
modes it runs (`Target.requant_modes`; the accelerator runs "multiply" only when its ALU
has MUL).

* ``"shift"``: every requantization is a rounding shift (no multiplier);
* ``"multiply"``: a 16-bit fixed-point multiplier, then a rounding shift.

The rewrite:

* activations: symmetric int8 per tensor, zero point 0, ``scale = r / 127`` (a ReLU's
  output is non-negative, so it uses [0, 127] with ``out_min = 0``); a tensor that was
  0 on every sample gets ``r = 1``;
* weights: per output channel (default) or per tensor, ``scale = max|w| / 127``, values
  in [-127, 127]; bias ``int32 = floor(b / (s_x * s_w) + 0.5)`` (saturated to int32);
* *shift mode*: every activation and weight scale is
  rounded UP to a power of two, so no value clips and every requantization ratio
  ``s_in / s_out`` of a GEMM, add or rescale is ``2**-shift``: multipliers are None. A
  weight channel whose shift would exceed 31 gets a coarser scale so that it is 31.
  The exception is an average pool whose window count is not a power of two (a global
  pool over 7x7 = 49): its ratio ``s_in / (count * s_out)`` is not one either, so it
  gets a small multiplier, the rule of the multiply mode below with the multiplier
  bounded by 127 (`POOL_MULTIPLIER_MAX`) instead of 32767: an int8 value that a target
  without MUL applies as the weight of its window sum on the GEMM core (the vdla
  accelerator's pools sum windows there). A 7-bit multiplier divides by 49 within
  0.4% (84 / 2**12 for 1 / 49);
* *multiply mode*: float scales; a ratio becomes ``multiplier * 2**-shift``
  with the LARGEST shift in [-31, 31] such that ``multiplier = floor(ratio * 2**shift +
  0.5)`` is at most 32767 and the product cannot wrap:
  ``worst * multiplier + 2**(shift - 1) < 2**31``, where ``worst`` bounds |acc|: for a
  GEMM channel ``sum|w_int| * 128 + |bias_int|``, for a pool ``128 * kernel area``, for an
  int8 operand 128. A ratio that is a power of two needs no multiplier (None). A ratio
  too small for any multiplier >= 1 gets multiplier 1 at shift 31 (the result is 0).

Rewriting: the float input -> ``quantize`` -> integer operators -> ``dequantize``, so the
graph's outputs stay float32 and keep their names. conv2d/dense with constant weights ->
qconv2d/qdense (the fused activation becomes out_min/out_max), add of two activations ->
qadd, clip -> qadd with a zero operand (only out_min/out_max), avg pools with a constant
count -> qavg_pool2d/qglobal_avg_pool2d, the int8-capable ops above stay as they are with
their input's scale. Concat gives its output the largest of its inputs' scales (and its
own calibrated one); an input produced by a requantizing operator that only feeds the
concat is produced at that scale directly, any other input is rescaled by a
``qadd`` with a zero operand. Transformers' operators (matmul of two activations,
softmax, layer_norm, gelu, attention, embedding gathers) become the integer operators of
`vdla.compiler.passes.quantize_transformer` (``integer_nonlinear=False`` keeps softmax,
layer_norm, gelu and attention in float; a softmax that is a graph output stays float).
Every other op (lrn, a conv with computed weights, ...) runs in float: ``dequantize`` ->
float op -> ``quantize`` where an integer consumer follows; ``metadata["quantized"]
["float_ops"]`` names the transformer operators left in float and why.

*Quantizing early.* ``quantize`` is monotonic (non-decreasing) and maps 0 to 0, so it
commutes exactly with ``max_pool2d`` (padding -inf and -128 both quantize to -128),
``relu``, ``clip`` (with the bounds quantized alike), ``flatten``, ``reshape``,
``transpose``, ``slice``, ``expand`` and ``pad`` with value 0:
``op(quantize(x, s)) == quantize(op(x), s)``
bit for bit. So such an op whose input is float (after an LRN, a softmax, a float
graph input) and whose every reader is an integer op runs on int8 instead: its float
input is quantized at the scale its readers would have quantized its output at, and
the op keeps that scale (chains of them too, e.g. ``lrn -> max_pool2d -> relu ->
conv``). The result is the same integers as pooling in float then quantizing, with the
op on int8, where a target can run it. An op whose output is a graph output or also
read by a float op stays in float.

Integer tensors carry `Tensor.scale`; ``graph.metadata["quantized"]`` records
``{"mode": "shift" | "multiply", "per_channel": bool}``, plus ``"integer_nonlinear":
False`` and ``"float_ops"`` where they apply.
"""

from __future__ import annotations

import copy

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.passes.calibration import calibrate_ranges, quantize_error, split_samples
from vdla.compiler.passes.prepare import prepare
from vdla.compiler.passes.quantize_transformer import (FREE_SCALE_KINDS, AttentionObserver,
                                                       TransformerPlans, split_activations)
from vdla.compiler.reference.integer import (INT8_MAX, INT8_MIN, INT32_MAX, INT32_MIN,
                                             POOL_MULTIPLIER_MAX, SHIFT_MAX,
                                             QuantizationError, requantize_params,
                                             round_half_up)
from vdla.compiler.reference.numerics import avg_pool_sums

__all__ = ["MODES", "QuantizationError", "quantize", "quantize_error"]

# --- the pass ----------------------------------------------------------------------------

#: Float ops whose kernels work unchanged on int8 and keep the scale.
_PASSTHROUGH = frozenset({"max_pool2d", "relu", "flatten", "reshape", "transpose", "pad",
                          "slice", "expand"})
#: Plan kinds whose output is requantized (its scale is free to choose).
_REQUANTIZING = frozenset({"gemm", "qadd", "qpool", "qgpool"}) | FREE_SCALE_KINDS
#: Float ops that commute exactly with ``quantize`` (module docstring, "Quantizing early").
_COMMUTING = _PASSTHROUGH | {"clip"}


def _pow2_up(scale: np.ndarray | float):
    """The smallest powers of two >= `scale` (elementwise)."""
    s = np.asarray(scale, dtype=np.float64)
    out = np.exp2(np.ceil(np.log2(s)))
    out = np.where(out < s, out * 2, out)           # guard log2's rounding
    return float(out) if out.ndim == 0 else out


class _Quantizer(TransformerPlans):
    """One run of the pass: `plan` decides each node's integer form and each tensor's
    scale, `emit` writes the new graph (the transformer operators' plans and emission:
    `vdla.compiler.passes.quantize_transformer`)."""

    def __init__(self, graph: Graph, ranges: dict[str, float], multiply: bool,
                 per_channel: bool, *, integer_nonlinear: bool = True,
                 observer: AttentionObserver | None = None):
        self.g = graph
        self.integer_nonlinear = integer_nonlinear
        self.observer = observer
        self.float_reasons: dict[str, str] = {}    # node -> why it stays in float
        self.ranges = ranges
        self.multiply = multiply
        self.per_channel = per_channel
        self.out = Graph(graph.name)
        self.out.metadata = copy.deepcopy(graph.metadata)
        self.kind: dict[str, str] = {}             # node -> plan kind
        self.scale: dict[str, float] = {}          # int-produced tensor -> its scale
        self.count: dict[str, int] = {}            # avg pool node -> window count
        self.int_map: dict[str, tuple[str, float]] = {}   # tensor -> (int8 name, scale)
        self.float_map: dict[str, str] = {}        # tensor -> float name
        self.converted: dict[tuple[str, float], str] = {}
        self.zero: str | None = None
        # Ops on float input that run on int8 (`pull_into_int8`) -> the scale their
        # float input is quantized at.
        self.early: dict[str, float] = {}

    # --- scales -----------------------------------------------------------------------

    @staticmethod
    def pow2_up(scale: float) -> float:
        return _pow2_up(scale)


    def act_scale(self, tensor: str) -> float:
        """The calibrated scale of activation `tensor` (a power of two in shift mode)."""
        r = self.ranges.get(tensor)
        if r is None:
            raise QuantizationError(f"no calibration range for tensor {tensor!r}")
        s = (r if r > 0 else 1.0) / INT8_MAX
        return s if self.multiply else _pow2_up(s)

    def requant(self, node: Node, ratio, worst=0, *, pool: bool = False):
        """(multiplier, shift) for `ratio` with `worst` bounding |acc|
        (`requantize_params`). `pool`: an average pool's, which in shift mode may take
        a multiplier up to `POOL_MULTIPLIER_MAX` (module docstring)."""
        try:
            if pool and not self.multiply:
                return requantize_params(ratio, worst, multiply=True,
                                         max_multiplier=POOL_MULTIPLIER_MAX)
            return requantize_params(ratio, worst, multiply=self.multiply)
        except QuantizationError as e:
            raise QuantizationError(f"node {node.name!r} ({node.op}): {e}") from None

    # --- planning -----------------------------------------------------------------------

    def is_int(self, tensor: str) -> bool:
        p = self.g.producer(tensor)
        return p is not None and self.kind.get(p.name, "float") != "float"

    def in_scale(self, tensor: str) -> float:
        return self.scale[tensor] if self.is_int(tensor) else self.act_scale(tensor)

    def classify(self, node: Node) -> str:
        """The plan kind of `node`: how `emit` writes it (an ``emit_<kind>`` method)."""
        g = self.g

        def const(i: int) -> bool:
            return bool(node.input(i)) and g.tensors[node.input(i)].is_constant

        def act(i: int) -> bool:
            return bool(node.input(i)) and not g.tensors[node.input(i)].is_constant

        transformer = self.classify_transformer(node)
        if transformer is not None:
            return transformer
        if node.op in ("conv2d", "dense"):
            ok = (act(0) and const(1) and (not node.input(2) or const(2))
                  and (not node.input(3) or act(3)))
            return "gemm" if ok else "float"
        if node.op == "add":
            return "qadd" if act(0) and act(1) else "float"
        if node.op == "clip":
            return "qclip" if self.is_int(node.inputs[0]) else "float"
        if node.op in ("avg_pool2d", "global_avg_pool2d"):
            count = self.constant_count(node)
            if count is None:
                return "float"
            self.count[node.name] = count
            return "qpool" if node.op == "avg_pool2d" else "qgpool"
        if node.op in _PASSTHROUGH:
            if node.op == "pad" and float(node.attrs["value"]) != 0.0:
                return "float"
            return "pass" if self.is_int(node.inputs[0]) else "float"
        if node.op == "concat":
            if any(not act(i) for i in range(len(node.inputs))):
                return "float"
            return "concat" if any(self.is_int(t) for t in node.inputs) else "float"
        return "float"

    def constant_count(self, node: Node) -> int | None:
        """The element count of every window of an average pool, or None if it varies."""
        shape = self.g.tensors[node.inputs[0]].shape
        if node.op == "global_avg_pool2d":
            return int(shape[2] * shape[3])
        _, counts = avg_pool_sums(node, np.zeros((1, 1) + tuple(shape[2:]), np.int8))
        counts = np.unique(counts)
        return int(counts[0]) if counts.size == 1 else None

    def plan(self):
        g = self.g
        for node in g.nodes():
            kind = self.kind[node.name] = self.classify(node)
            out = node.outputs[0]
            if kind in FREE_SCALE_KINDS or kind in ("qsoftmax", "qembed", "pass_indexed"):
                self.plan_transformer(node, kind)
            elif kind in _REQUANTIZING:
                self.scale[out] = self.act_scale(out)
            elif kind in ("pass", "qclip"):
                self.scale[out] = self.scale[node.inputs[0]]
            elif kind == "concat":
                s = max([self.in_scale(t) for t in node.inputs] + [self.act_scale(out)])
                self.scale[out] = s
                for t in set(node.inputs):
                    p = g.producer(t)
                    if (p is not None and self.kind[p.name] in _REQUANTIZING
                            and t not in g.outputs
                            and all(c.name == node.name for c in g.consumers(t))):
                        self.scale[t] = s
        self.pull_into_int8()

    def read_scale(self, reader: Node, tensor: str) -> float:
        """The scale at which integer node `reader` reads float `tensor`: what its
        `emit_*` method asks `get_int` for."""
        if self.kind[reader.name] == "concat":
            return self.scale[reader.outputs[0]]
        if reader.name in self.early:
            return self.early[reader.name]
        return self.act_scale(tensor)

    def reads_float(self, reader: Node, tensor: str) -> bool:
        """Whether `reader` reads `tensor` as float: a float op, or the additive mask of
        an integer attention (turned into its bool exclusion)."""
        return (self.kind[reader.name] == "float"
                or (self.kind[reader.name] == "qattention" and reader.input(3) == tensor))

    def pull_into_int8(self):
        """Run on int8 the float ops that commute with ``quantize`` and whose every
        reader is integer (module docstring, "Quantizing early"): each quantizes its
        float input at the one scale its readers read its output at. Visits the nodes
        backwards, so a chain of such ops (pool then relu) moves as a whole."""
        g = self.g
        for node in reversed(g.nodes()):
            if self.kind[node.name] != "float" or node.op not in _COMMUTING:
                continue
            if node.op == "pad" and float(node.attrs["value"]) != 0.0:
                continue                # quantize(value) would have to be the pad value
            x, y = node.inputs[0], node.outputs[0]
            if g.tensors[x].is_constant or y in g.outputs:
                continue
            readers = g.consumers(y)
            if not readers or any(self.reads_float(r, y) for r in readers):
                continue                # a float reader wants the exact float value
            scales = {self.read_scale(r, y) for r in readers}
            if len(scales) != 1:
                continue                # one int8 value per element: one scale
            scale = scales.pop()
            self.kind[node.name] = "qclip" if node.op == "clip" else "pass"
            self.early[node.name] = scale
            self.scale[y] = scale

    # --- emission helpers -------------------------------------------------------------

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while (name in self.out.tensors or name in self.out.nx or name in self.g.tensors
               or name in self.g.nx):
            i += 1
            name = f"{base}_{i}"
        return name

    def int_output(self, tensor: str) -> str:
        # A graph output keeps its name for the float value the final dequantize makes.
        return self.fresh(f"{tensor}_int8") if tensor in self.g.outputs else tensor

    def add(self, op: str, inputs, output: str, name: str, out_scale=None, **attrs) -> str:
        """Add node `op` writing tensor `output`, whose scale becomes `out_scale`."""
        self.out.add_node(op, inputs, [output], name=name, **attrs)
        self.out.tensors[output].scale = out_scale
        return output

    def constant(self, tensor: str) -> str:
        if tensor not in self.out.tensors:
            self.out.add_tensor(copy.copy(self.g.tensors[tensor]))
        return tensor

    def get_float(self, tensor: str) -> str:
        """The float32 version of `tensor` in the new graph (dequantized if needed)."""
        if self.g.tensors[tensor].is_constant:
            return self.constant(tensor)
        if tensor not in self.float_map:
            src, s = self.int_map[tensor]
            out = tensor if tensor in self.g.outputs else self.fresh(f"{tensor}_dq")
            self.add("dequantize", [src], out, self.fresh(f"{tensor}_dequantize"), scale=s)
            self.float_map[tensor] = out
        return self.float_map[tensor]

    def get_int(self, tensor: str, scale: float | None = None) -> tuple[str, float]:
        """The int8 version of `tensor` (at `scale`, if given) and its scale: the
        integer producer's output, a ``quantize`` of a float value, or a rescaling."""
        if tensor in self.int_map:
            name, s = self.int_map[tensor]
            if scale is None or scale == s:
                return name, s
            key = (tensor, scale)
            if key not in self.converted:
                self.converted[key] = self.rescale(name, s, scale, tensor)
            return self.converted[key], scale
        if scale is None:
            scale = self.act_scale(tensor)
            cache = True
        else:
            cache = False
        key = (tensor, scale)
        if key not in self.converted:
            if tensor in self.infinite:
                raise QuantizationError(f"calibration: tensor {tensor!r} has non-finite "
                                        "values (inf) on a calibration sample, and an "
                                        "integer operator reads it")
            out = self.fresh(f"{tensor}_q")
            self.add("quantize", [self.get_float(tensor)], out,
                     self.fresh(f"{tensor}_quantize"), out_scale=scale, scale=scale,
                     dtype="int8")
            self.converted[key] = out
        if cache:
            self.int_map[tensor] = (self.converted[key], scale)
        return self.converted[key], scale

    def zero_operand(self) -> str:
        if self.zero is None:
            self.zero = self.out.add_constant(self.fresh("qadd_zero"), np.zeros(1, np.int8),
                                              "int8", scale=1.0)
        return self.zero

    def rescale(self, src: str, s_from: float, s_to: float, tensor: str, *,
                out: str | None = None, name: str | None = None, bounds=(INT8_MIN, INT8_MAX),
                node: Node | None = None) -> str:
        """``qadd(src, 0)``: `src` requantized from scale `s_from` to `s_to`, clipped."""
        m, s = self.requant(node or Node(tensor, "rescale", [], []), s_from / s_to, 128)
        out = out or self.fresh(f"{tensor}_rescaled")
        return self.add("qadd", [src, self.zero_operand()], out,
                        name or self.fresh(f"{tensor}_rescale"), out_scale=s_to,
                        a_multiplier=m, a_shift=s, b_multiplier=None, b_shift=0,
                        out_min=int(bounds[0]), out_max=int(bounds[1]))

    def bounds(self, lo, hi, scale: float) -> tuple[int, int]:
        """int8 limits for the float interval [lo, hi] (None: unbounded) at `scale`."""
        lo_i = INT8_MIN if lo is None else int(np.clip(round_half_up(lo / scale),
                                                       INT8_MIN, INT8_MAX))
        hi_i = INT8_MAX if hi is None else int(np.clip(round_half_up(hi / scale),
                                                       INT8_MIN, INT8_MAX))
        return lo_i, max(lo_i, hi_i)

    # --- emission ---------------------------------------------------------------------

    def emit(self) -> Graph:
        g, out = self.g, self.out
        for name in g.inputs:
            t = g.tensors[name]
            out.add_input(name, t.shape, t.dtype)
            self.float_map[name] = name
        for node in g.nodes():
            kind = self.kind[node.name]
            getattr(self, f"emit_{kind}")(node)
        out.set_outputs([self.get_float(t) for t in g.outputs])
        return out

    def record_int(self, node: Node, produced: str):
        self.int_map[node.outputs[0]] = (produced, self.scale[node.outputs[0]])

    def emit_float(self, node: Node):
        inputs = [self.get_float(t) if t else "" for t in node.inputs]
        self.out.add_node(node.op, inputs, list(node.outputs), name=node.name, **node.attrs)
        for t in node.outputs:
            self.float_map[t] = t

    def emit_pass(self, node: Node):
        x, _ = self.get_int(node.inputs[0], self.early.get(node.name))
        y = node.outputs[0]
        self.record_int(node, self.add(node.op, [x], self.int_output(y), node.name,
                                       out_scale=self.scale[y], **node.attrs))

    def emit_qclip(self, node: Node):
        x, s = self.get_int(node.inputs[0], self.early.get(node.name))
        y = node.outputs[0]
        lo, hi = node.attrs["min"], node.attrs["max"]
        if node.name in self.early:
            # The float clip clips float32 data to the bounds rounded to float32; the
            # same rounding makes quantize(clip(x)) == clip(quantize(x)) exact.
            lo = None if lo is None else float(np.float32(lo))
            hi = None if hi is None else float(np.float32(hi))
        bounds = self.bounds(lo, hi, s)
        self.record_int(node, self.rescale(x, s, s, y, out=self.int_output(y), name=node.name,
                                           bounds=bounds, node=node))

    def emit_concat(self, node: Node):
        y = node.outputs[0]
        s = self.scale[y]
        inputs = [self.get_int(t, s)[0] for t in node.inputs]
        self.record_int(node, self.add("concat", inputs, self.int_output(y), node.name,
                                       out_scale=s, **node.attrs))

    def emit_qadd(self, node: Node):
        (a, s_a), (b, s_b) = self.get_int(node.inputs[0]), self.get_int(node.inputs[1])
        y = node.outputs[0]
        s_y = self.scale[y]
        am, ash = self.requant(node, s_a / s_y, 128)
        bm, bsh = self.requant(node, s_b / s_y, 128)
        self.record_int(node, self.add("qadd", [a, b], self.int_output(y), node.name,
                                       out_scale=s_y, a_multiplier=am, a_shift=ash,
                                       b_multiplier=bm, b_shift=bsh))

    def emit_qpool(self, node: Node):
        x, s_x = self.get_int(node.inputs[0])
        y = node.outputs[0]
        s_y = self.scale[y]
        count = self.count[node.name]
        if node.op == "avg_pool2d":
            kernel_hw = node.attrs["kernel"]
            kh, kw = (kernel_hw, kernel_hw) if isinstance(kernel_hw, int) else kernel_hw
            m, s = self.requant(node, s_x / (count * s_y), 128 * kh * kw, pool=True)
            produced = self.add("qavg_pool2d", [x], self.int_output(y), node.name,
                                out_scale=s_y, multiplier=m, shift=s, **node.attrs)
        else:
            m, s = self.requant(node, s_x / (count * s_y), 128 * count, pool=True)
            produced = self.add("qglobal_avg_pool2d", [x], self.int_output(y), node.name,
                                out_scale=s_y, multiplier=m, shift=s)
        self.record_int(node, produced)

    emit_qgpool = emit_qpool

    def emit_gemm(self, node: Node):
        g = self.g
        x, s_x = self.get_int(node.inputs[0])
        y = node.outputs[0]
        s_y = self.scale[y]
        w = np.asarray(g.tensors[node.inputs[1]].data, dtype=np.float64)
        channels = w.shape[0]
        s_w = self.weight_scales(w, s_x, s_y)
        w_int = np.clip(round_half_up(w / s_w.reshape((-1,) + (1,) * (w.ndim - 1))),
                        -INT8_MAX, INT8_MAX).astype(np.int8)
        w_scale = s_w if self.per_channel else float(s_w[0])
        inputs = [self.out.add_constant(self.fresh(f"{node.inputs[1]}_q"), w_int, "int8",
                                        scale=w_scale), ""]
        bias_int = np.zeros(channels, np.int64)
        if node.input(2):
            b = np.asarray(g.tensors[node.input(2)].data, dtype=np.float64)
            bias_int = np.clip(round_half_up(b / (s_x * s_w)), INT32_MIN,
                               INT32_MAX).astype(np.int64)
            inputs[1] = self.out.add_constant(self.fresh(f"{node.input(2)}_q"),
                                              bias_int.astype(np.int32), "int32",
                                              scale=s_x * s_w)
        worst = np.abs(w_int.reshape(channels, -1).astype(np.int64)).sum(axis=1) * 128 \
            + np.abs(bias_int)
        ratio = s_x * s_w / s_y
        if self.per_channel:
            m, s = self.requant(node, ratio, worst)
        else:
            m, s = self.requant(node, float(ratio[0]), int(worst.max()))
        rm, rs = None, 0
        if node.input(3):
            r, s_r = self.get_int(node.input(3))
            inputs.append(r)
            rm, rs = self.requant(node, s_r / s_y, 128)
        while inputs and not inputs[-1]:
            inputs.pop()
        act = node.attrs.get("activation")
        if act == "relu":
            lo, hi = 0, INT8_MAX
        elif act == "clip":
            lo, hi = self.bounds(node.attrs.get("clip_min"), node.attrs.get("clip_max"), s_y)
        else:
            lo, hi = INT8_MIN, INT8_MAX
        attrs = {k: v for k, v in node.attrs.items()
                 if k not in ("activation", "clip_min", "clip_max")}
        op = "qconv2d" if node.op == "conv2d" else "qdense"
        self.record_int(node, self.add(
            op, [x] + inputs, self.int_output(y), node.name, out_scale=s_y, multiplier=m,
            shift=s,
            residual_multiplier=rm, residual_shift=rs, out_min=lo, out_max=hi, **attrs))

    def weight_scales(self, w: np.ndarray, s_x: float, s_y: float) -> np.ndarray:
        """Per output channel weight scales (all equal when not per channel)."""
        channels = w.shape[0]
        peak = np.abs(w.reshape(channels, -1)).max(axis=1)
        top = float(peak.max()) if peak.size else 0.0
        if not np.all(np.isfinite(peak)):
            raise QuantizationError("weights hold inf or NaN")
        if not self.per_channel:
            peak = np.full(channels, top)
        # An all-zero channel takes the tensor's scale (its bias keeps that precision).
        peak = np.where(peak > 0, peak, top if top > 0 else 1.0)
        s_w = peak / INT8_MAX
        if not self.multiply:
            s_w = _pow2_up(s_w)
            # shift = log2(s_y / (s_x * s_w)) must stay <= 31: a coarser weight scale for
            # a channel of tiny weights loses nothing the output could show.
            floor = s_y / (s_x * 2.0 ** SHIFT_MAX)
            s_w = np.maximum(s_w, floor)
        return np.atleast_1d(np.asarray(s_w, dtype=np.float64))


#: The requantization modes (see the module docstring).
MODES = ("shift", "multiply")


def quantize(graph: Graph, calibration_inputs, mode: str = "shift", *,
             per_channel: bool = True, percentile: float | None = None,
             integer_nonlinear: bool = True) -> Graph:
    """An int8 copy of float `graph` whose requantizations use `mode`.

    graph : a float Graph (it is not modified)
    calibration_inputs : a dict input name -> array stacking N samples on a leading axis
        (each sample shaped like the graph input; for a batch-1 input the batch axis may
        serve as the sample axis; an array of exactly the input's shape is one sample),
        or a list of dicts input name -> array
    mode : ``"shift"`` (power-of-two scales, rounding shifts only) or ``"multiply"``
        (fixed-point multiplier and shift); a target's ``requant_modes[0]`` is its best
    per_channel : weight scales per output channel (True) or per tensor
    percentile : calibrate each tensor's range as this percentile (0 < p <= 100) of
        |value| instead of its maximum
    integer_nonlinear : softmax, layer_norm, gelu and attention become the integer
        operators of `vdla.compiler.reference.integer_transformer` (True) or stay in
        float on the host (False, to compare; `vdla.compiler.passes.quantize_transformer`)
    Returns the quantized graph (validated): float inputs and outputs of the same names,
    integer operators in between (see the module docstring). Raises QuantizationError
    for empty or malformed calibration data and bad arguments."""
    if not isinstance(graph, Graph):
        raise QuantizationError(f"quantize: graph must be a vdla.compiler.Graph, not "
                                f"{type(graph).__name__}")
    if mode not in MODES:
        hint = (" (a HardwareConfig no longer picks it: pass the target's "
                "requant_modes[0], e.g. vdla.compiler.targets.get('vdla', config=...)"
                ".requant_modes[0])" if hasattr(mode, "alu_ops") else "")
        raise QuantizationError(f"quantize: mode must be one of {', '.join(MODES)}, not "
                                f"{mode!r}{hint}")
    if percentile is not None and (isinstance(percentile, bool)
                                   or not isinstance(percentile, (int, float))
                                   or not 0 < percentile <= 100):
        raise QuantizationError(f"quantize: percentile must be a number in (0, 100] or None, "
                                f"not {percentile!r}")
    if "quantized" in graph.metadata:
        raise QuantizationError(f"quantize: graph {graph.name!r} is quantized already")
    if not isinstance(integer_nonlinear, bool):
        raise QuantizationError(f"quantize: integer_nonlinear must be True or False, not "
                                f"{integer_nonlinear!r}")
    g = split_activations(prepare(graph))
    samples = split_samples(g, calibration_inputs, "calibration_inputs")
    observer = AttentionObserver(g) if integer_nonlinear else None
    infinite: set[str] = set()
    ranges = calibrate_ranges(g, samples, percentile, infinite=infinite,
                              observe=observer if observer and observer.nodes else None)
    multiply = mode == "multiply"
    q = _Quantizer(g, ranges, multiply, bool(per_channel),
                   integer_nonlinear=integer_nonlinear, observer=observer)
    q.infinite = infinite
    q.plan()
    out = q.emit()
    out.metadata["quantized"] = {"mode": mode, "per_channel": bool(per_channel)}
    if not integer_nonlinear:
        out.metadata["quantized"]["integer_nonlinear"] = False
    if q.float_reasons:
        out.metadata["quantized"]["float_ops"] = dict(q.float_reasons)
    return out.validate()
