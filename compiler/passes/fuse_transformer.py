"""Fusion of the patterns transformers are exported as (float graphs, after import and
constant folding, before `vdla.compiler.passes.prepare.fuse`).

Both of torch's ONNX exporters (TorchScript, ``dynamo=False``, and ``torch.export``,
``dynamo=True``) write a transformer's layers out as chains of elementwise ops; this pass
finds them and puts the spec's fused ops in their place. Each rewrite keeps the float
results (to float rounding: the fused kernels compute in float64) and each pattern is
matched exactly: a chain that differs (another constant, another axis, an intermediate
tensor read outside the chain or a graph output) stays as it is. Nothing is refused.

* ``layer_norm`` from LayerNorm written out over the last axis::

      m = reduce_mean(x); d = x - m; v = reduce_mean(d ** 2  or  d * d)
      y = d / sqrt(v + eps)   or   d * (1 / sqrt(v + eps))
      [y * gamma] [+ beta]      (gamma, beta constants along the last axis or scalars)

  (the two ``x - m`` may be one node or two equal ones);
* ``gelu`` (approximate "none") from ``x * 0.5 * (1 + erf(x / sqrt 2))`` (``x / 1.4142``
  or ``x * 0.7071``) and ``gelu`` (approximate "tanh") from ``x * 0.5 * (1 + tanh(sqrt(2 /
  pi) * (x + 0.044715 * x ** 3)))`` (the cube as ``pow(x, 3)`` or ``x * (x * x)``), the
  outer product in each order the exporters write: ``(x * a) * 0.5``, ``x * (a * 0.5)``,
  ``(x * 0.5) * a``;
* bias and activation into a float ``dense`` (directly, or through the ``reshape`` that
  the importer puts after a linear layer on a 3-D input): an ``add`` of a constant along
  the output features becomes (part of) its bias, a following ``gelu`` its activation
  ``"gelu"`` / ``"gelu_tanh"``; a transpose that moves only axes of length 1 becomes a
  reshape, chained reshapes collapse to one, and equal reshapes or transposes of one
  tensor to one;
* Q, K, V projections (two or more bias-only float ``dense`` nodes with constant weights
  reading one input) become one ``dense`` with the weights and biases concatenated, and a
  ``slice`` per projection writing its old output (quantized, the three then share one
  output scale);
* ``attention`` from the attention core::

      s = matmul(q [* c1], k_t [* c2])  [* c | / c]  [+ mask]  [where(causal, s, fill)]
      y = matmul(softmax(s, last axis), v)

  with ``k_t`` k transposed on its last two axes (a transpose before it is folded into
  the one that makes k), scale = the constants' product, the mask any float tensor that
  broadcasts to the scores, and a causal exclusion (a constant ``where`` fill of
  <= -1e4 or an additive constant of 0 and <= -1e4 whose excluded keys are exactly those
  past each query) as ``causal=True``. Another constant ``where`` exclusion that leaves
  every query a key becomes an additive constant mask.

The attention matcher lives in `vdla.compiler.passes.fuse_attention`, what the
matchers share in `vdla.compiler.passes.pattern_view`. `fuse_transformer(graph)` runs
them in that order and records each rewrite in
``graph.metadata["fused_transformer"]`` (dicts with pattern, node, replaced);
`fusion_counts` counts them by pattern.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.ops import infer_node
from vdla.compiler.ir.tensor import Node
from vdla.compiler.passes.fuse_attention import fuse_attentions
from vdla.compiler.passes.pattern_view import (PatternView, last_axis_vector, rebuild,
                                               replace_nodes)

__all__ = ["PATTERNS", "fuse_transformer", "fusion_counts"]

#: The patterns `fuse_transformer` records, in the order it runs them.
PATTERNS = ("layer_norm", "gelu", "gelu_tanh", "unit_transpose", "reshape_chain", "dense_bias",
            "dense_gelu", "duplicate_view", "qkv", "attention")


def _infer_shapes(g: Graph) -> Graph:
    for node in g.nodes():
        infer_node(g, node)
    return g


def _reduces_last(g: Graph, node: Node) -> bool:
    rank = len(g.tensors[node.inputs[0]].shape)
    if rank == 0:
        return False
    axes = tuple(int(a) % rank for a in node.attrs.get("axes", ())) or tuple(range(rank))
    return axes == (rank - 1,) and bool(node.attrs.get("keepdims", True))


# --- layer norm --------------------------------------------------------------------------

def _match_layer_norm(v: PatternView, mean1: Node):
    """The nodes of a written-out LayerNorm starting at its first ``reduce_mean`` and
    (x, gamma, beta, epsilon, out), or None."""
    g = v.g
    x, m = mean1.inputs[0], mean1.outputs[0]
    if not v.float32(x) or not _reduces_last(g, mean1):
        return None
    size = g.tensors[x].shape[-1]
    subs = [n for n in v.readers.get(m, []) if n.op == "sub" and n.inputs == [x, m]]
    if not subs or len(subs) != len(v.readers.get(m, [])) or m in g.outputs:
        return None
    for d in subs:
        dt = d.outputs[0]
        for sq in v.readers.get(dt, []):
            if not ((sq.op == "pow" and sq.inputs[0] == dt and v.is_value(sq.inputs[1], 2.0))
                    or (sq.op == "mul" and sq.inputs == [dt, dt])):
                continue
            mean2 = v.only(sq.outputs[0], "reduce_mean")
            if mean2 is None or not _reduces_last(g, mean2):
                continue
            add = v.only(mean2.outputs[0], "add")
            eps = v.scalar(v.other(add, mean2.outputs[0]) or "") if add else None
            if eps is None or not eps > 0:
                continue
            root = v.only(add.outputs[0], "sqrt")
            if root is None:
                continue
            nodes = [mean1, *subs, sq, mean2, add, root]
            r = root.outputs[0]
            div = v.only(r, "div")
            if div is not None and div.inputs[1] == r and div.inputs[0] in \
                    [s.outputs[0] for s in subs]:
                nodes.append(div)
            elif div is not None and div.inputs[1] == r and v.is_value(div.inputs[0], 1.0):
                mul = v.only(div.outputs[0], "mul")
                d2 = v.other(mul, div.outputs[0]) if mul else None
                if d2 not in [s.outputs[0] for s in subs]:
                    continue
                nodes += [div, mul]
            else:
                continue
            found = _affine_tail(v, nodes, size)
            if found is None:
                continue
            nodes, gamma, beta = found
            out = nodes[-1].outputs[0]
            if not v.private(nodes, out):
                continue
            return nodes, x, gamma, beta, eps, out
    return None


def _affine_tail(v: PatternView, nodes: list[Node], size: int):
    """`nodes` extended by an optional ``mul`` by gamma and ``add`` of beta (constants
    along the last axis): (nodes, gamma or None, beta or None)."""
    gamma = beta = None
    y = nodes[-1].outputs[0]
    mul = v.only(y, "mul")
    if mul is not None:
        gamma = last_axis_vector(v.g, v.other(mul, y) or "", size)
        if gamma is not None:
            nodes, y = nodes + [mul], mul.outputs[0]
    add = v.only(y, "add")
    if add is not None:
        beta = last_axis_vector(v.g, v.other(add, y) or "", size)
        if beta is not None:
            nodes = nodes + [add]
    if v.g.tensors[nodes[-1].outputs[0]].shape != v.g.tensors[nodes[0].inputs[0]].shape:
        return None
    return nodes, gamma, beta


def _fuse_layer_norms(g: Graph, record: list):
    for name in [n.name for n in g.nodes() if n.op == "reduce_mean"]:
        if name not in g.nx:
            continue
        v = PatternView(g)
        found = _match_layer_norm(v, g.node(name))
        if found is None:
            continue
        nodes, x, gamma, beta, eps, out = found
        size = g.tensors[x].shape[-1]
        base = nodes[0].name
        scale = g.add_constant(f"{base}_gamma", (np.ones(size) if gamma is None else gamma)
                               .astype(np.float32))
        inputs = [x, scale] + ([g.add_constant(f"{base}_beta", beta.astype(np.float32))]
                               if beta is not None else [])
        node = replace_nodes(g, nodes, "layer_norm", inputs, out, f"{base}_layer_norm",
                        axis=-1, epsilon=eps)
        record.append({"pattern": "layer_norm", "node": node,
                       "replaced": [n.name for n in nodes]})


# --- GELU --------------------------------------------------------------------------------

_SQRT2 = math.sqrt(2.0)
_TANH_C = math.sqrt(2.0 / math.pi)


def _gelu_inner(v: PatternView, inner: Node):
    """For the ``erf`` or ``tanh`` node of a GELU: (x, the nodes from x to it) or None."""
    z = inner.inputs[0]
    if inner.op == "erf":
        div = v.op(z, "div", "mul")
        if div is None or not v.float32(z):
            return None
        if div.op == "div" and v.is_value(div.inputs[1], _SQRT2):
            return div.inputs[0], [div]
        if div.op == "mul":
            for x in div.inputs:
                if v.is_value(v.other(div, x) or "", 1 / _SQRT2):
                    return x, [div]
        return None
    scaled = v.op(z, "mul")
    if scaled is None:
        return None
    for w in scaled.inputs:
        if not v.is_value(v.other(scaled, w) or "", _TANH_C):
            continue
        add = v.op(w, "add")
        if add is None:
            continue
        for x in add.inputs:
            cubic = v.op(v.other(add, x) or "", "mul")
            if cubic is None:
                continue
            cube = v.other(cubic, cubic.inputs[0]) if v.is_value(cubic.inputs[0], 0.044715) \
                else cubic.inputs[0] if v.is_value(cubic.inputs[1], 0.044715) else None
            chain = _cube(v, cube, x) if cube else None
            if chain is not None:
                return x, chain + [cubic, add, scaled]
    return None


def _cube(v: PatternView, tensor: str, x: str) -> list[Node] | None:
    """The nodes computing ``x ** 3`` into `tensor` (``pow(x, 3)`` or ``x * (x * x)``)."""
    node = v.g.producer(tensor)
    if node is None:
        return None
    if node.op == "pow" and node.inputs[0] == x and v.is_value(node.inputs[1], 3.0):
        return [node]
    if node.op == "mul" and x in node.inputs:
        square = v.op(v.other(node, x) or "", "mul")
        if square is not None and square.inputs == [x, x]:
            return [square, node]
    return None


def _gelu_outer(v: PatternView, x: str, a: str):
    """The nodes of ``x * a * 0.5`` in any order, reading `a` (``1 + erf``/``tanh``):
    (nodes, output) or None."""
    m1 = v.only(a, "mul")
    if m1 is None:
        return None
    f = v.other(m1, a)
    if f == x:                                   # (x * a) * 0.5
        m2 = v.only(m1.outputs[0], "mul")
        if m2 is not None and v.is_value(v.other(m2, m1.outputs[0]) or "", 0.5):
            return [m1, m2], m2.outputs[0]
    elif v.is_value(f or "", 0.5):               # x * (a * 0.5)
        m2 = v.only(m1.outputs[0], "mul")
        if m2 is not None and v.other(m2, m1.outputs[0]) == x:
            return [m1, m2], m2.outputs[0]
    else:                                        # (x * 0.5) * a
        half = v.op(f or "", "mul")
        if half is not None and x in half.inputs and v.is_value(v.other(half, x) or "", 0.5):
            return [half, m1], m1.outputs[0]
    return None


def _fuse_gelus(g: Graph, record: list):
    for name in [n.name for n in g.nodes() if n.op in ("erf", "tanh")]:
        if name not in g.nx:
            continue
        v = PatternView(g)
        inner = g.node(name)
        found = _gelu_inner(v, inner)
        if found is None:
            continue
        x, chain = found
        one = v.only(inner.outputs[0], "add")
        if one is None or not v.is_value(v.other(one, inner.outputs[0]) or "", 1.0):
            continue
        outer = _gelu_outer(v, x, one.outputs[0])
        if outer is None:
            continue
        tail, out = outer
        nodes = chain + [inner, one] + tail
        if g.tensors[out].shape != g.tensors[x].shape or not v.private(nodes, out):
            continue
        approximate = "none" if inner.op == "erf" else "tanh"
        node = replace_nodes(g, nodes, "gelu", [x], out, f"{inner.name}_gelu",
                        approximate=approximate)
        record.append({"pattern": "gelu" if approximate == "none" else "gelu_tanh",
                       "node": node, "replaced": [n.name for n in nodes]})


# --- dense epilogues ---------------------------------------------------------------------

def _plain_dense(g: Graph, node: Node) -> bool:
    """A float dense in plain layouts without a residual input."""
    return (node.op == "dense" and g.tensors[node.outputs[0]].dtype == "float32"
            and not node.input(3) and node.attrs.get("data_layout") in (None, "NC")
            and node.attrs.get("kernel_layout") in (None, "OI"))

def _absorb_after(g: Graph, dense: Node, reshape: Node | None, gone: Node, *,
                  inputs=None, attrs=None):
    """`dense` (new inputs/attrs) takes over elementwise `gone`, which reads its output
    directly or through `reshape`: the last node of the chain writes `gone`'s output."""
    g.remove_node(gone.name)
    dense = rebuild(g, dense, inputs=inputs, attrs=attrs)
    last = reshape or dense
    middle = last.outputs[0]
    rebuild(g, last, outputs=gone.outputs)
    del g.tensors[middle]


def _fuse_dense_epilogues(g: Graph, record: list):
    changed = True
    while changed:
        changed = False
        for name in [n.name for n in g.nodes() if n.op == "dense"]:
            node = g.node(name)
            if not _plain_dense(g, node) or node.attrs.get("activation") is not None:
                continue
            v = PatternView(g)
            y, features = node.outputs[0], g.tensors[node.outputs[0]].shape[1]
            reshape = v.only(y, "reshape")
            if reshape is not None and g.tensors[reshape.outputs[0]].shape[-1] != features:
                continue
            t = reshape.outputs[0] if reshape else y
            nxt = v.only(t, "add", "gelu")
            if nxt is None:
                continue
            if nxt.op == "add":
                bias = last_axis_vector(g, v.other(nxt, t) or "", features)
                if bias is None or g.tensors[nxt.outputs[0]].shape != g.tensors[t].shape:
                    continue
                old = node.input(2)
                if old:
                    bias = bias + g.tensors[old].data.astype(np.float64)
                b = g.add_constant(f"{name}_bias", bias.astype(np.float32))
                inputs = list(node.inputs) + [""] * (3 - len(node.inputs))
                inputs[2] = b
                _absorb_after(g, node, reshape, nxt, inputs=inputs)
                record.append({"pattern": "dense_bias", "node": name, "replaced": [nxt.name]})
            else:
                act = "gelu" if nxt.attrs["approximate"] == "none" else "gelu_tanh"
                _absorb_after(g, node, reshape, nxt, attrs=dict(node.attrs, activation=act))
                record.append({"pattern": "dense_gelu", "node": name, "replaced": [nxt.name],
                               "activation": act})
            changed = True


def _unit_transposes(g: Graph, record: list):
    """A transpose that moves only axes of length 1 keeps the order of every element: it
    becomes a reshape (which `_fuse_reshape_chains` then merges with its neighbours;
    torch's MultiheadAttention writes such around its sequence-first layout)."""
    for node in [n for n in g.nodes() if n.op == "transpose"]:
        shape = g.tensors[node.inputs[0]].shape
        perm = tuple(node.attrs["perm"]) or tuple(reversed(range(len(shape))))
        moved = [p for p in perm if shape[p] != 1]
        if moved != sorted(moved):
            continue
        g.replace_node(Node(node.name, "reshape", list(node.inputs), list(node.outputs),
                            {"shape": tuple(g.tensors[node.outputs[0]].shape)}))
        record.append({"pattern": "unit_transpose", "node": node.name, "replaced": []})


def _fuse_reshape_chains(g: Graph, record: list):
    """reshape(reshape(x)) -> reshape(x); a reshape back to x's own shape goes."""
    for name in [n.name for n in g.nodes() if n.op == "reshape"]:
        node = g.node(name)
        first = g.producer(node.inputs[0])
        if first is None or first.op != "reshape":
            continue
        src, out = first.inputs[0], node.outputs[0]
        if g.tensors[src].shape == g.tensors[out].shape and out not in g.outputs \
                and g.tensors[src].dtype == g.tensors[out].dtype:
            g.remove_node(name)
            g.replace_uses(out, src)
            del g.tensors[out]
        else:
            rebuild(g, node, inputs=[src])
        middle = first.outputs[0]
        if middle not in g.outputs and not any(middle in n.inputs
                                               for n in g.nodes_unordered()):
            g.remove_node(first.name)       # read by nothing now
            del g.tensors[middle]
        record.append({"pattern": "reshape_chain", "node": name, "replaced": [first.name]})


# --- Q, K, V projections -----------------------------------------------------------------

def _merge_duplicate_views(g: Graph, record: list):
    """Reshapes and transposes of one tensor with equal attributes become one (the
    importer writes a reshape per linear layer, so Q, K and V read three equal ones)."""
    seen: dict[tuple, str] = {}
    for node in g.nodes():
        if node.op not in ("reshape", "transpose"):
            continue
        key = (node.op, node.inputs[0], repr(sorted(node.attrs.items())))
        out = node.outputs[0]
        if key not in seen:
            seen[key] = out
            continue
        if out in g.outputs:
            continue
        g.remove_node(node.name)
        g.replace_uses(out, seen[key])
        del g.tensors[out]
        record.append({"pattern": "duplicate_view", "node": g.producer(seen[key]).name,
                       "replaced": [node.name]})


def _fuse_qkv(g: Graph, record: list):
    groups: dict[tuple, list[Node]] = {}
    for node in g.nodes():
        if not _plain_dense(g, node) or g.constant(node.inputs[1]) is None:
            continue
        if node.input(2) and g.constant(node.input(2)) is None:
            continue
        key = (node.inputs[0], tuple(sorted((k, repr(a)) for k, a in node.attrs.items())))
        groups.setdefault(key, []).append(node)
    for (x, _), nodes in groups.items():
        if len(nodes) < 2:
            continue
        weights = [g.constant(n.inputs[1]) for n in nodes]
        biases = [g.constant(n.input(2)) if n.input(2) else np.zeros(w.shape[0], np.float32)
                  for n, w in zip(nodes, weights)]
        base = nodes[0].name
        w = g.add_constant(f"{base}_qkv_weight", np.concatenate(weights, axis=0))
        b = g.add_constant(f"{base}_qkv_bias", np.concatenate(biases).astype(np.float32))
        outs = [n.outputs[0] for n in nodes]
        for n in nodes:
            g.remove_node(n.name)
        merged = g.add_node("dense", [x, w, b], name=g.unique_name(f"{base}_qkv"),
                            **nodes[0].attrs)
        offset = 0
        for n, out, part in zip(nodes, outs, weights):
            g.add_node("slice", [merged], [out], name=g.unique_name(f"{n.name}_slice"),
                       starts=(offset,), ends=(offset + part.shape[0],), axes=(1,),
                       steps=(1,))
            offset += part.shape[0]
        record.append({"pattern": "qkv", "node": g.producer(merged).name,
                       "replaced": [n.name for n in nodes]})

# --- the pass ----------------------------------------------------------------------------

def fuse_transformer(graph: Graph) -> Graph:
    """A copy of `graph` with the transformer patterns of the module docstring fused:
    LayerNorm, GELU, dense bias and GELU, chained reshapes, Q/K/V projections sharing an
    input, the attention core. Records ``metadata["fused_transformer"]``."""
    g = _infer_shapes(graph.copy())
    record = g.metadata.setdefault("fused_transformer", [])
    _fuse_layer_norms(g, record)
    _fuse_gelus(g, record)
    _unit_transposes(g, record)
    _fuse_reshape_chains(g, record)
    _fuse_dense_epilogues(g, record)
    _fuse_reshape_chains(g, record)
    _merge_duplicate_views(g, record)
    _fuse_qkv(g, record)
    fuse_attentions(g, record)
    g.prune()
    return _infer_shapes(g)


def fusion_counts(graph: Graph) -> dict[str, int]:
    """How many rewrites of each pattern `fuse_transformer` recorded in `graph`."""
    return dict(Counter(r["pattern"] for r in graph.metadata.get("fused_transformer", [])))
