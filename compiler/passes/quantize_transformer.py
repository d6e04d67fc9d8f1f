"""The transformer half of `vdla.compiler.passes.quantize`: how the operators of sequence
models become integer operators, whose arithmetic
`vdla.compiler.reference.integer_transformer` defines.

* ``matmul`` of two activations (rank >= 2 each) -> ``qmatmul``: both operands int8 per
  tensor at their own scales, the output requantized per tensor to its calibrated scale
  (``worst = 128 * 128 * K``);
* ``softmax`` over the last axis -> ``qsoftmax``: its input's scale gives
  ``exp_multiplier``, the calibrated largest probability ``prob_bits`` (the output's
  scale is ``2**-prob_bits``);
* ``layer_norm`` (constant gamma and beta, last axis) -> ``qlayer_norm``, gamma and beta
  folded into two int32 constants per channel;
* ``gelu`` (either form; a ``dense`` with a fused GELU is split into the ``dense`` and a
  ``gelu`` before calibration, so the linear output gets its own range) -> ``qgelu``;
* ``attention`` -> ``qattention`` when its mask (if any) is an exclusion: every
  calibrated value 0, or <= -1e4 (-inf included); the mask becomes bool
  (``less(mask, -5000)``, or a bool constant) with True where a key is excluded. The
  scores ``q @ k^T`` are calibrated inside the fused op (their range over the kept
  positions, and the largest probability); the float ``scale`` folds into the softmax's
  ``exp_multiplier``, so the scores' requantization stays a power of two in the
  "shift" mode. Any other mask keeps the attention in float, and
  ``metadata["quantized"]["float_ops"]`` says why;
* ``gather`` of a constant float table by computed or input ids (embeddings) ->
  ``gather`` on the int8 table (per tensor, ``scale = max|table| / 127``): quantizing
  commutes with it, so the result is the table's int8 rows exactly;
* ``gather``, ``slice`` and ``expand`` of an int8 activation (constant indices) stay on
  int8 at its scale, like ``reshape`` and ``transpose``.

``integer_nonlinear=False`` keeps softmax, layer_norm, gelu and attention in float (on
the host, between ``dequantize`` and ``quantize``), to compare the integer definitions'
effect on a model with float ones; matmul, dense, add and gather are quantized either
way.
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node, Tensor
from vdla.compiler.reference.integer import (INT8_MAX, INT8_PRODUCTS_MAX, QuantizationError,
                                             round_half_up)
from vdla.compiler.reference.integer_transformer import (gelu_params, layer_norm_params,
                                                         softmax_params)

__all__ = ["EXCLUDED", "EXCLUDE_BELOW", "AttentionObserver", "TransformerPlans",
           "split_activations"]

#: An additive mask value at or below this excludes a key (as the fusion pass reads it).
EXCLUDED = -1e4
#: The float mask values below this become True (excluded) in qattention's bool mask.
EXCLUDE_BELOW = -5000.0
#: Plan kinds of this module whose output scale is free (requantized to its range).
FREE_SCALE_KINDS = frozenset({"qmatmul", "qlayer_norm", "qgelu", "qattention"})
NONLINEAR_OPS = frozenset({"softmax", "layer_norm", "gelu", "attention"})


def split_activations(graph: Graph) -> Graph:
    """`graph` with each ``dense`` whose activation is a GELU split into the ``dense``
    without it and a ``gelu`` node (the quantizer calibrates the linear output)."""
    if not any(n.op == "dense" and n.attrs.get("activation") in ("gelu", "gelu_tanh")
               for n in graph.nodes_unordered()):
        return graph
    g = graph.copy()
    for node in g.nodes():
        act = node.attrs.get("activation")
        if node.op != "dense" or act not in ("gelu", "gelu_tanh"):
            continue
        y = node.outputs[0]
        pre = g.unique_name(f"{y}_linear")
        g.add_tensor(Tensor(pre, g.tensors[y].shape, "float32"))
        g.replace_node(Node(node.name, node.op, list(node.inputs), [pre],
                            dict(node.attrs, activation=None)))
        g.add_node("gelu", [pre], [y], name=g.unique_name(f"{node.name}_gelu"),
                   approximate="tanh" if act == "gelu_tanh" else "none")
    return g.validate()


def _causal(s: int, t: int) -> np.ndarray:
    return np.arange(t)[None, :] > np.arange(s)[:, None] + (t - s)


class AttentionObserver:
    """What calibration records inside each ``attention`` node: the range of the raw
    scores ``q @ k^T`` over the kept positions, the largest probability, and whether
    every mask value was an exclusion or 0 (`calibrate_ranges`' ``observe``)."""

    def __init__(self, graph: Graph):
        self.nodes = [n for n in graph.nodes() if n.op == "attention"]
        self.scores: dict[str, float] = {}
        self.probs: dict[str, float] = {}
        self.mask_bad: dict[str, str] = {}

    def __call__(self, values: dict[str, np.ndarray]):
        for node in self.nodes:
            q, k, v = (np.asarray(values[t], np.float64) for t in node.inputs[:3])
            raw = q @ np.swapaxes(k, -1, -2)
            mask = None
            if node.input(3):
                mask = np.asarray(values[node.input(3)], np.float64)
                ok = (mask == 0) | (mask <= EXCLUDED)
                if not ok.all() and node.name not in self.mask_bad:
                    bad = float(mask[~ok].ravel()[0])
                    self.mask_bad[node.name] = (
                        f"its mask {node.input(3)!r} holds {bad:g} on a calibration sample, "
                        f"neither 0 nor an exclusion (<= {EXCLUDED:g}): an additive mask "
                        "stays in float")
            logits = raw * float(node.attrs["scale"])
            excluded = np.zeros(raw.shape, bool)
            if mask is not None:
                excluded = excluded | np.broadcast_to(mask <= EXCLUDED, raw.shape)
                logits = logits + mask
            if node.attrs.get("causal"):
                excluded = excluded | np.broadcast_to(_causal(*raw.shape[-2:]), raw.shape)
            kept = ~excluded
            self.scores[node.name] = max(self.scores.get(node.name, 0.0),
                                         float(np.abs(raw[kept]).max(initial=0.0)))
            logits = np.where(kept, logits, -np.inf)
            top = logits.max(axis=-1, keepdims=True)
            e = np.where(kept, np.exp(logits - np.where(np.isfinite(top), top, 0)), 0.0)
            p = e / np.maximum(e.sum(axis=-1, keepdims=True), 1e-300)
            self.probs[node.name] = max(self.probs.get(node.name, 0.0),
                                        float(p.max(initial=0.0)))


class TransformerPlans:
    """The transformer operators' plans and emission, mixed into the quantizer of
    `vdla.compiler.passes.quantize` (which holds the graph, ranges, scales and the
    emission helpers these methods use)."""

    integer_nonlinear: bool = True
    observer: AttentionObserver | None = None
    #: Tensors that held an infinity on a calibration sample (`calibrate_ranges`).
    infinite: frozenset[str] | set[str] = frozenset()

    @staticmethod
    def error(message: str) -> QuantizationError:
        return QuantizationError(message)

    def guard(self, node: Node, fn, *args):
        """`fn(*args)`, its QuantizationError naming `node`."""
        try:
            return fn(*args)
        except QuantizationError as e:
            raise QuantizationError(f"node {node.name!r} ({node.op}): {e}") from None

    def float_reason(self, node: Node, reason: str) -> str:
        self.float_reasons[node.name] = reason
        return "float"

    def classify_transformer(self, node: Node) -> str | None:
        """The plan kind of a transformer operator, or None for another op."""
        g = self.g

        def const(i: int) -> bool:
            return bool(node.input(i)) and g.tensors[node.input(i)].is_constant

        def act(i: int) -> bool:
            return bool(node.input(i)) and not g.tensors[node.input(i)].is_constant

        def rank(i: int) -> int:
            return len(g.tensors[node.input(i)].shape)

        if node.op in NONLINEAR_OPS and not self.integer_nonlinear:
            return self.float_reason(node, "integer_nonlinear=False keeps softmax, "
                                           "layer_norm, gelu and attention in float")
        if node.op == "matmul":
            if not (act(0) and act(1)):
                return "float"
            if rank(0) < 2 or rank(1) < 2:
                return self.float_reason(node, "a matmul of a 1-D operand stays in float")
            k = g.tensors[node.input(0)].shape[-1]
            if k > INT8_PRODUCTS_MAX:
                return self.float_reason(node, f"its {k} products per output could wrap "
                                               "an int32 accumulator")
            return "qmatmul"
        if node.op == "add" and self.holds_exclusions(node.outputs[0]) and \
                any(r.op == "softmax" for r in g.consumers(node.outputs[0])):
            return self.float_reason(node, "it adds an exclusion mask to a softmax's "
                                           "input: int8 cannot hold both")
        if node.op == "softmax":
            if node.outputs[0] in g.outputs:
                return "float"      # a model's output: int8 would only lose precision
            if self.holds_exclusions(node.input(0)):
                return self.float_reason(node, "its input holds an additive mask's "
                                               "exclusions: int8 cannot hold them and "
                                               "the scores both")
            x = g.tensors[node.input(0)].shape
            if node.attrs["axis"] not in (-1, len(x) - 1):
                return self.float_reason(node, f"softmax over axis {node.attrs['axis']}: "
                                               "the integer softmax is over the last axis")
            return "qsoftmax"
        if node.op == "layer_norm":
            if not (act(0) and const(1) and (not node.input(2) or const(2))):
                return self.float_reason(node, "layer_norm with computed gamma or beta "
                                               "stays in float")
            return "qlayer_norm"
        if node.op == "gelu":
            return "qgelu"
        if node.op == "attention":
            if not (act(0) and act(1) and act(2)):
                return "float"
            reason = self.observer.mask_bad.get(node.name) if self.observer else None
            if node.input(3) and const(3):
                m = np.asarray(g.tensors[node.input(3)].data, np.float64)
                if not np.all((m == 0) | (m <= EXCLUDED)):
                    reason = (f"its constant mask {node.input(3)!r} holds values that are "
                              f"neither 0 nor an exclusion (<= {EXCLUDED:g})")
            return self.float_reason(node, reason) if reason else "qattention"
        if node.op == "gather":
            if const(0) and act(1) and g.tensors[node.input(0)].dtype == "float32":
                return "qembed"
            if act(0) and const(1) and self.is_int(node.input(0)):
                return "pass_indexed"
            return "float"
        return None

    def holds_exclusions(self, tensor: str) -> bool:
        """Whether float `tensor` held an exclusion (|value| >= 5000, or an infinity) in
        calibration."""
        return not self.is_int(tensor) and (self.ranges.get(tensor, 0.0) >= -EXCLUDE_BELOW
                                            or tensor in self.infinite)

    def plan_transformer(self, node: Node, kind: str):
        """The output scale of a node of this module's plan kinds."""
        out = node.outputs[0]
        if kind in FREE_SCALE_KINDS:
            self.scale[out] = self.act_scale(out)
        elif kind == "qsoftmax":
            k = softmax_params(1.0, self.ranges.get(out, 1.0))["prob_bits"]
            self.scale[out] = 2.0 ** -k
        elif kind == "qembed":
            self.scale[out] = self.table_scale(node.input(0))
        elif kind == "pass_indexed":
            self.scale[out] = self.scale[node.input(0)]

    def table_scale(self, tensor: str) -> float:
        data = np.asarray(self.g.tensors[tensor].data, np.float64)
        if not np.all(np.isfinite(data)):
            raise self.error(f"table {tensor!r} holds inf or NaN")
        top = float(np.abs(data).max(initial=0.0))
        s = (top if top > 0 else 1.0) / INT8_MAX
        return s if self.multiply else self.pow2_up(s)

    # --- emission ---------------------------------------------------------------------

    def add_q(self, op: str, inputs, output: str, name: str, out_scale: float,
              **attrs) -> str:
        """`add` for an operator of this module, its ``out_scale`` attribute (for
        reports) set to the output's scale too."""
        self.add(op, inputs, output, name, out_scale=out_scale, **attrs)
        self.out.node(name).attrs["out_scale"] = float(out_scale)
        return output

    def emit_qmatmul(self, node: Node):
        (a, s_a), (b, s_b) = self.get_int(node.inputs[0]), self.get_int(node.inputs[1])
        y = node.outputs[0]
        s_y = self.scale[y]
        k = self.g.tensors[node.inputs[0]].shape[-1]
        m, s = self.requant(node, s_a * s_b / s_y, 128 * 128 * k)
        self.record_int(node, self.add_q(
            "qmatmul", [a, b], self.int_output(y), node.name, out_scale=s_y,
            multiplier=m, shift=(s,), out_min=-128, out_max=127, transpose_b=False,
            a_scale=s_a, b_scale=s_b))

    def emit_qsoftmax(self, node: Node):
        x, s_x = self.get_int(node.inputs[0])
        y = node.outputs[0]
        params = softmax_params(s_x, self.ranges.get(y, 1.0))
        self.record_int(node, self.add_q("qsoftmax", [x], self.int_output(y), node.name,
                                       out_scale=self.scale[y], axis=-1, in_scale=s_x,
                                       params=params))

    def emit_qlayer_norm(self, node: Node):
        x, s_x = self.get_int(node.inputs[0])
        y = node.outputs[0]
        s_y = self.scale[y]
        g = self.g
        gamma = g.tensors[node.input(1)].data
        beta = g.tensors[node.input(2)].data if node.input(2) else None
        length = g.tensors[node.inputs[0]].shape[-1]
        gamma = np.broadcast_to(np.asarray(gamma, np.float64).reshape(-1), (length,))
        if beta is not None:
            beta = np.broadcast_to(np.asarray(beta, np.float64).reshape(-1), (length,))
        G, B, params = self.guard(node, layer_norm_params, gamma, beta,
                                  float(node.attrs["epsilon"]), s_x, s_y, length)
        gq = self.out.add_constant(self.fresh(f"{node.input(1)}_q"), G, "int32")
        bq = self.out.add_constant(self.fresh(f"{node.name}_beta_q"), B, "int32")
        self.record_int(node, self.add_q(
            "qlayer_norm", [x, gq, bq], self.int_output(y), node.name, out_scale=s_y,
            axis=-1, epsilon=float(node.attrs["epsilon"]), in_scale=s_x, params=params))

    def emit_qgelu(self, node: Node):
        x, s_x = self.get_int(node.inputs[0])
        y = node.outputs[0]
        s_y = self.scale[y]
        params = self.guard(node, gelu_params, s_x, s_y)
        self.record_int(node, self.add_q("qgelu", [x], self.int_output(y), node.name,
                                       out_scale=s_y, approximate=node.attrs["approximate"],
                                       in_scale=s_x, params=params))

    def emit_qattention(self, node: Node):
        (q, s_q), (k, s_k), (v, s_v) = (self.get_int(t) for t in node.inputs[:3])
        y = node.outputs[0]
        s_y = self.scale[y]
        g = self.g
        depth = g.tensors[node.inputs[0]].shape[-1]
        keys = g.tensors[node.inputs[1]].shape[-2]
        r = self.observer.scores.get(node.name, 0.0) if self.observer else 0.0
        s_s = (r if r > 0 else 1.0) / INT8_MAX
        s_s = s_s if self.multiply else self.pow2_up(s_s)
        qk_m, qk_s = self.requant(node, s_q * s_k / s_s, 128 * 128 * depth)
        scale = float(node.attrs["scale"])
        if not (np.isfinite(scale) and scale > 0):
            raise self.error(f"node {node.name!r} (attention): scale {scale!r} must be "
                             "positive and finite for the integer softmax")
        max_prob = self.observer.probs.get(node.name, 1.0) if self.observer else 1.0
        sm = softmax_params(s_s * scale, max_prob)
        s_p = 2.0 ** -sm["prob_bits"]
        pv_m, pv_s = self.requant(node, s_p * s_v / s_y, 128 * 128 * keys)
        inputs = [q, k, v]
        if node.input(3):
            inputs.append(self.exclusion_mask(node.input(3)))
        self.record_int(node, self.add_q(
            "qattention", inputs, self.int_output(y), node.name, out_scale=s_y,
            scale=scale, causal=bool(node.attrs.get("causal")), q_scale=s_q, k_scale=s_k,
            v_scale=s_v, qk_multiplier=qk_m, qk_shift=(qk_s,), qk_out_min=-128,
            qk_out_max=127, qk_scale=s_s, softmax_params=sm, softmax_scale=s_p,
            pv_multiplier=pv_m, pv_shift=(pv_s,), pv_out_min=-128, pv_out_max=127))

    def exclusion_mask(self, tensor: str) -> str:
        """The bool version of additive mask `tensor`: True where it excludes a key."""
        key = ("exclusion", tensor)
        if key in self.converted:
            return self.converted[key]
        t = self.g.tensors[tensor]
        if t.is_constant:
            out = self.out.add_constant(self.fresh(f"{tensor}_excluded"),
                                        np.asarray(t.data, np.float64) < EXCLUDE_BELOW,
                                        "bool")
        else:
            limit = self.out.add_constant(self.fresh("exclude_below"),
                                          np.full(1, EXCLUDE_BELOW, np.float32), "float32")
            out = self.fresh(f"{tensor}_excluded")
            self.out.add_node("less", [self.get_float(tensor), limit], [out],
                              name=self.fresh(f"{tensor}_exclusion"))
        self.converted[key] = out
        return out

    def emit_qembed(self, node: Node):
        table = node.input(0)
        s = self.scale[node.outputs[0]]
        data = np.asarray(self.g.tensors[table].data, np.float64)
        q = np.clip(round_half_up(data / s), -INT8_MAX, INT8_MAX).astype(np.int8)
        tq = self.out.add_constant(self.fresh(f"{table}_q"), q, "int8", scale=s)
        y = node.outputs[0]
        self.record_int(node, self.add("gather", [tq, self.get_float(node.input(1))],
                                       self.int_output(y), node.name, out_scale=s,
                                       **node.attrs))

    def emit_pass_indexed(self, node: Node):
        x, _ = self.get_int(node.inputs[0])
        y = node.outputs[0]
        rest = [self.constant(t) for t in node.inputs[1:]]
        self.record_int(node, self.add(node.op, [x] + rest, self.int_output(y), node.name,
                                       out_scale=self.scale[y], **node.attrs))
