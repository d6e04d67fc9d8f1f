"""Structural passes over the graph IR (float graphs, before quantization).

Every pass takes a `Graph` and returns a NEW graph; its input is left untouched, so a
caller (or a test) can compare the two:

* `infer_shapes`: shapes and dtypes of every tensor, from the graph inputs;
* `fold_constants`: nodes whose inputs are all constants become constants; no-op nodes
  (reshape to the same shape, identity transpose, zero pad, ...) are removed;
* `fold_batch_norm`: batch_norm into the weights and bias of the conv2d/dense before it,
  else (on an NCHW activation) into a depthwise 1x1 ``conv2d`` (groups = channels: one
  weight per channel, the scale, and the shift as its bias), which the quantizer turns
  into an int8 ``qconv2d``; on other ranks into a per-channel ``mul`` + ``add``;
* `fold_channel_affine`: the same for a ``mul`` by a per-channel constant (optionally
  followed by an ``add`` of one) and a standalone per-channel constant ``add`` on an
  NCHW activation: into the weights of the conv2d/dense before it, else a depthwise 1x1
  ``conv2d``;
* `fuse`: a per-channel constant ``add`` into the conv2d/dense bias, an ``add`` of
  another activation into its residual input, ``relu``/``clip`` into its activation;
* `prepare`: the standard pipeline before quantization (all of the above, with
  `vdla.compiler.passes.fuse_transformer` after constant folding: transformer layers
  written out become ``layer_norm``, ``gelu``, dense attributes and ``attention``; then
  `Graph.validate`).

The depthwise convolutions are made before `fuse`, so a ReLU after a batch norm that
had nothing to fold into (one after a concat, DenseNet-style) fuses into them.

What a pass changed is recorded in ``graph.metadata`` (``"folded_constants"``,
``"removed_noops"``, ``"folded_batch_norm"``, ``"folded_channel_affine"``, ``"fused"``,
``"fused_transformer"``) for humans and tests.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.ops import infer_node
from vdla.compiler.ir.tensor import GraphError, Node
from vdla.compiler.passes.fuse_transformer import fuse_transformer
from vdla.compiler.reference import KERNELS

__all__ = ["fold_batch_norm", "fold_channel_affine", "fold_constants", "fuse",
           "infer_shapes", "prepare"]

_FUSIBLE = ("conv2d", "dense")


# --- helpers -----------------------------------------------------------------------------

def _rebuild(g: Graph, node: Node, *, inputs=None, outputs=None, attrs=None) -> Node:
    """Replace `node` by a node of the same name and op with new inputs/outputs/attrs
    (networkx edges are recomputed)."""
    new = Node(node.name, node.op, list(node.inputs if inputs is None else inputs),
               list(node.outputs if outputs is None else outputs),
               dict(node.attrs if attrs is None else attrs))
    while len(new.inputs) > 2 and not new.inputs[-1]:
        new.inputs.pop()                      # trailing absent optional inputs
    g.replace_node(new)
    return new


def _consumer_map(g: Graph) -> dict[str, list[str]]:
    """tensor -> names of the nodes reading it (once per input position)."""
    readers: dict[str, list[str]] = {}
    for node in g.nodes_unordered():
        for tensor in node.inputs:
            if tensor:
                readers.setdefault(tensor, []).append(node.name)
    return readers


def _sole_consumer(g: Graph, readers, tensor: str) -> Node | None:
    """The one node reading `tensor`, if exactly one does and it is no graph output."""
    names = readers.get(tensor, [])
    if len(names) != 1 or tensor in g.outputs:
        return None
    return g.node(names[0])


def _absorb(g: Graph, producer: Node, consumer: Node, *, inputs=None, attrs=None) -> Node:
    """Merge `consumer` into `producer`: the producer takes the consumer's output tensor
    (so names seen by later nodes and graph outputs stay), its intermediate tensor goes."""
    middle = producer.outputs[0]
    g.remove_node(consumer.name)
    new = _rebuild(g, producer, inputs=inputs, outputs=consumer.outputs, attrs=attrs)
    del g.tensors[middle]
    return new


# --- shape inference ---------------------------------------------------------------------

def infer_shapes(graph: Graph) -> Graph:
    """A copy of `graph` with the shape and dtype of every tensor inferred from the graph
    inputs' shapes (`ops.infer_node` in topological order). Raises GraphError naming
    the node whose inputs do not fit its op, or the graph input without a shape."""
    g = graph.copy()
    for name in g.inputs:
        if name not in g.tensors or g.tensors[name].shape is None:
            raise GraphError(f"graph input {name!r} has no shape; give every input a shape "
                             "before inferring the others")
    for node in g.nodes():
        infer_node(g, node)
    return g


# --- constant folding --------------------------------------------------------------------

def _is_noop(g: Graph, node: Node) -> bool:
    """Whether `node` returns its first input unchanged (same shape, dtype and values)."""
    if not node.inputs or len(node.outputs) != 1:
        return False
    x, y = g.tensors[node.inputs[0]], g.tensors[node.outputs[0]]
    if x.shape != y.shape or x.dtype != y.dtype or x.layout != y.layout:
        return False
    a = node.attrs
    if node.op in ("reshape", "flatten"):
        return True
    if node.op == "transpose":
        return tuple(a["perm"] or reversed(range(len(x.shape)))) == tuple(range(len(x.shape)))
    if node.op == "pad":
        return not any(a["pads"])
    if node.op == "clip":
        return a["min"] is None and a["max"] is None
    if node.op == "concat":
        return len([i for i in node.inputs if i]) == 1
    if node.op == "layout_transform":
        return a["src"] == a["dst"]
    if node.op in ("add", "mul"):
        other = g.constant(node.inputs[1])
        neutral = 0 if node.op == "add" else 1
        return other is not None and bool(np.all(other == neutral))
    return False


def fold_constants(graph: Graph) -> Graph:
    """A copy of `graph` in which every node whose inputs are all constants is evaluated
    with the reference kernels and replaced by a constant tensor of the same name, and
    no-op nodes (see `_is_noop`) are removed (unless their output is a graph output,
    whose name must stay). Records ``metadata["folded_constants"]`` and
    ``metadata["removed_noops"]`` (node names)."""
    g = infer_shapes(graph)
    folded, removed = [], []
    for node in g.nodes():
        present = [i for i in node.inputs if i]
        if present and all(g.tensors[i].is_constant for i in present):
            fn = KERNELS.get(node.op)
            if fn is None:
                continue
            args = [g.tensors[i].data if i else None for i in node.inputs]
            try:
                results = fn(node, args, g)
            except Exception as e:   # a kernel's own error, re-raised with the node's name
                raise GraphError(f"node {node.name!r} ({node.op}): constant folding failed: "
                                 f"{e}") from e
            g.remove_node(node.name)
            for out, value in zip(node.outputs, results):
                t = g.tensors[out]
                t.data = np.asarray(value).astype(t.dtype)
                t.shape = tuple(t.data.shape)
            folded.append(node.name)
        elif _is_noop(g, node) and node.outputs[0] not in g.outputs:
            g.remove_node(node.name)
            g.replace_uses(node.outputs[0], node.inputs[0])
            del g.tensors[node.outputs[0]]
            removed.append(node.name)
    g.prune()
    g.metadata.setdefault("folded_constants", []).extend(folded)
    g.metadata.setdefault("removed_noops", []).extend(removed)
    return g


# --- batch norm folding ------------------------------------------------------------------

def _can_take_batch_norm(g: Graph, producer: Node | None, x: str, readers) -> bool:
    """Whether batch norm on `x` can be folded into the weights of `x`'s producer."""
    if producer is None or producer.op not in _FUSIBLE or g.tensors[x].dtype != "float32":
        return False
    if producer.attrs.get("activation") is not None or producer.input(3):
        return False              # BN after an activation or residual is no affine of w
    if not g.tensors[producer.inputs[1]].is_constant:
        return False
    if producer.input(2) and not g.tensors[producer.input(2)].is_constant:
        return False
    return len(readers.get(x, [])) == 1 and x not in g.outputs


def _scaled_weights(g: Graph, producer: Node, scale: np.ndarray, bias: np.ndarray,
                    last: Node) -> Node:
    """`producer` (a conv2d/dense that `_can_take_batch_norm` accepts) with its weights
    scaled per output channel by `scale` and its bias replaced by `bias` (both float64,
    one value per channel); it takes over the output of `last`, the node it absorbs."""
    w = g.tensors[producer.inputs[1]].data.astype(np.float64)
    w_new = g.add_constant(f"{producer.name}_w_bn",
                           (w * scale.reshape((-1,) + (1,) * (w.ndim - 1))).astype(np.float32))
    b_new = g.add_constant(f"{producer.name}_b_bn", bias.astype(np.float32))
    return _absorb(g, producer, last, inputs=[producer.inputs[0], w_new, b_new])


def _producer_bias(g: Graph, producer: Node) -> np.ndarray:
    """The bias of conv2d/dense `producer` as float64 (zeros when it has none)."""
    name = producer.input(2)
    if name:
        return g.tensors[name].data.astype(np.float64)
    return np.zeros(g.tensors[producer.inputs[1]].shape[0])


def _depthwise(g: Graph, x: str, scale: np.ndarray, shift: np.ndarray, out: str,
               name: str) -> str:
    """Add ``out = x * scale + shift`` per channel of the NCHW float tensor `x` as a
    depthwise 1x1 ``conv2d`` (groups = channels, weights (C, 1, 1, 1) = `scale`, bias =
    `shift`), named `name` (made unique). The tensor `out` exists already (the output of
    the nodes it replaces, which the caller removed). Returns the node's name."""
    channels = g.tensors[x].shape[1]
    node = g.unique_name(name)
    w = g.add_constant(f"{node}_weight", scale.reshape(channels, 1, 1, 1).astype(np.float32))
    b = g.add_constant(f"{node}_bias", shift.reshape(channels).astype(np.float32))
    g.add_node("conv2d", [x, w, b], [out], name=node, groups=channels)
    return node


def _plain_nchw(g: Graph, tensor: str) -> bool:
    """Whether `tensor` is a float32 activation in the plain 4-D NCHW layout (what a
    depthwise conv2d reads)."""
    t = g.tensors[tensor]
    return (not t.is_constant and t.dtype == "float32" and t.layout is None
            and t.shape is not None and len(t.shape) == 4)


def fold_batch_norm(graph: Graph) -> Graph:
    """A copy of `graph` without batch_norm nodes (whose parameters are constants).

    A batch_norm reading a conv2d/dense output that nobody else reads (and that has no
    activation or residual) is folded into it: weights scaled per output channel by
    ``scale / sqrt(var + eps)``, bias (created when absent) shifted accordingly. Any
    other batch_norm on an NCHW activation (after a concat, a pool, a graph input, a
    conv with an activation, ...) becomes a depthwise 1x1 ``conv2d`` of the same name:
    groups = channels, weights ``inv = scale / sqrt(var + eps)`` as (C, 1, 1, 1), bias
    ``beta - mean * inv``; a following ReLU then fuses into it (`fuse`) and the quantizer
    makes it an int8 ``qconv2d`` with groups = C. On another rank it becomes ``mul`` +
    ``add`` with per-channel constants. Records ``metadata["folded_batch_norm"]``: dicts
    with node, into (the conv/dense it was folded into, the depthwise conv2d made for
    it, or None), how ("weights", "depthwise_conv" or "mul_add")."""
    g = infer_shapes(graph)
    record = g.metadata.setdefault("folded_batch_norm", [])
    for name in [n.name for n in g.nodes() if n.op == "batch_norm"]:
        bn = g.node(name)
        params = [g.constant(i) for i in bn.inputs[1:]]
        if any(p is None for p in params):
            continue                    # computed BN parameters: nothing to fold into
        scale, beta, mean, var = (p.astype(np.float64) for p in params)
        inv = scale / np.sqrt(var + float(bn.attrs["epsilon"]))
        x = bn.inputs[0]
        producer = g.producer(x)
        if _can_take_batch_norm(g, producer, x, _consumer_map(g)):
            bias = (_producer_bias(g, producer) - mean) * inv + beta
            _scaled_weights(g, producer, inv, bias, bn)
            record.append({"node": name, "into": producer.name, "how": "weights"})
            continue
        out = bn.outputs[0]
        g.remove_node(name)
        if _plain_nchw(g, x):
            conv = _depthwise(g, x, inv, beta - mean * inv, out, name)
            record.append({"node": name, "into": conv, "how": "depthwise_conv"})
            continue
        rank = len(g.tensors[x].shape)
        shape = (1, -1) + (1,) * (rank - 2)
        a = g.add_constant(f"{name}_scale", inv.reshape(shape).astype(np.float32))
        c = g.add_constant(f"{name}_shift",
                           (beta - mean * inv).reshape(shape).astype(np.float32))
        m = g.add_node("mul", [x, a], name=f"{name}_mul")
        g.add_node("add", [m, c], [out], name=f"{name}_add")
        record.append({"node": name, "into": None, "how": "mul_add"})
    g.prune()
    return g


def _channel_operand(g: Graph, node: Node) -> tuple[str, np.ndarray] | None:
    """For a binary ``mul``/``add`` of a plain NCHW float activation and a constant that
    broadcasts per channel (a scalar, (C, 1, 1) or (1, C, 1, 1)) to an output of the
    activation's shape: (the activation, the constant as one float64 value per
    channel); else None."""
    if len(node.inputs) != 2 or not all(node.inputs):
        return None
    for k in (0, 1):
        x, other = node.inputs[k], node.inputs[1 - k]
        const = g.constant(other)
        if const is None or not _plain_nchw(g, x):
            continue
        if g.tensors[node.outputs[0]].shape != g.tensors[x].shape:
            continue
        vector = _channel_vector(const, g.tensors[x].shape)
        if vector is not None:
            return x, vector
    return None


def _only_attention_mask(g: Graph, readers, tensor: str) -> bool:
    """Whether `tensor` is read only as the mask of ``attention`` nodes (a BERT-style
    additive mask, ``(1 - mask) * -10000``, is 4-D but has no channels)."""
    names = readers.get(tensor, [])
    return bool(names) and tensor not in g.outputs and all(
        g.node(n).op == "attention" and g.node(n).input(3) == tensor for n in names)


def fold_channel_affine(graph: Graph) -> Graph:
    """A copy of `graph` in which per-channel affine maps of NCHW float activations by
    constants become GEMM nodes the quantizer makes integer:

    * ``mul(x, a)`` with `a` constant per channel, together with a following
      ``add(., c)`` of a per-channel constant when it is the product's only reader:
      ``x * a + c``;
    * ``add(x, c)`` alone, unless `x` comes from a conv2d/dense without activation that
      `fuse` will give it as a bias.

    One whose result is only an ``attention`` node's mask stays as it is.

    Each becomes, like a batch norm (`fold_batch_norm`), either scaled weights and a
    shifted bias of the conv2d/dense producing `x` (when nothing else reads `x` and it has
    no activation or residual), or a depthwise 1x1 ``conv2d`` named after the ``mul``
    (``add``): groups = channels, weights `a`, bias `c`. Run it before `fuse`, so a ReLU
    after it fuses. Records ``metadata["folded_channel_affine"]``: dicts with nodes (the
    mul/add names it replaced), into (the conv/dense or the depthwise conv2d), how
    ("weights" or "depthwise_conv")."""
    g = infer_shapes(graph)
    record = g.metadata.setdefault("folded_channel_affine", [])
    for name in [n.name for n in g.nodes() if n.op in ("mul", "add")]:
        if name not in g.nx or g.node(name).op not in ("mul", "add"):
            continue                # absorbed (or replaced) by an earlier one
        node = g.node(name)
        found = _channel_operand(g, node)
        if found is None:
            continue
        x, vector = found
        readers = _consumer_map(g)
        producer = g.producer(x)
        last = node
        if node.op == "mul":
            scale, shift = vector, np.zeros_like(vector)
            add = _sole_consumer(g, readers, node.outputs[0])
            then = _channel_operand(g, add) if add is not None and add.op == "add" else None
            if then is not None and then[0] == node.outputs[0]:
                shift, last = then[1], add
        else:
            if (producer is not None and _fusible(g, producer)
                    and producer.attrs["activation"] is None
                    and _sole_consumer(g, readers, x) is not None):
                continue            # fuse makes it the producer's bias
            scale, shift = np.ones_like(vector), vector
        replaced = [node.name] + ([last.name] if last is not node else [])
        out = last.outputs[0]
        if _only_attention_mask(g, readers, out):
            continue                # a transformer's additive mask is no image channel map
        if _can_take_batch_norm(g, producer, x, readers):
            if last is not node:
                g.remove_node(node.name)
            _scaled_weights(g, producer, scale, _producer_bias(g, producer) * scale + shift,
                            last)
            record.append({"nodes": replaced, "into": producer.name, "how": "weights"})
            continue
        for gone in replaced:
            g.remove_node(gone)
        conv = _depthwise(g, x, scale, shift, out, node.name)
        record.append({"nodes": replaced, "into": conv, "how": "depthwise_conv"})
    g.prune()
    return g


# --- fusion ------------------------------------------------------------------------------

def _fusible(g: Graph, node: Node) -> bool:
    return node.op in _FUSIBLE and g.tensors[node.outputs[0]].dtype == "float32" \
        and node.attrs.get("data_layout") in (None, "NCHW", "NC")


def _channel_vector(const: np.ndarray, out_shape) -> np.ndarray | None:
    """`const` as one value per output channel (axis 1 of `out_shape`) when numpy
    broadcasting adds it that way: a scalar, or (C, 1, 1) / (1, C, 1, 1) for conv and
    (C,) / (1, C) for dense. A (C,) vector on a 4-D output broadcasts along W, not C,
    so it is no bias."""
    rank, channels = len(out_shape), out_shape[1]
    if const.ndim > rank:
        return None
    if const.size == 1:
        return np.full(channels, const.reshape(()).item(), dtype=np.float64)
    full = (1,) * (rank - const.ndim) + const.shape
    if full[0] == 1 and full[1] == channels and all(d == 1 for d in full[2:]):
        return const.reshape(channels).astype(np.float64)
    return None


def _fuse_bias(g: Graph, fused: list) -> bool:
    changed = False
    for node in g.nodes():
        while _fusible(g, node) and node.attrs["activation"] is None:
            readers = _consumer_map(g)
            add = _sole_consumer(g, readers, node.outputs[0])
            if add is None or add.op != "add":
                break
            y = node.outputs[0]
            other = add.inputs[1] if add.inputs[0] == y else add.inputs[0]
            const = g.constant(other)
            if const is None or g.tensors[add.outputs[0]].shape != g.tensors[y].shape:
                break
            vector = _channel_vector(const, g.tensors[y].shape)
            if vector is None:
                break
            old = node.input(2)
            bias = vector + (g.tensors[old].data if old else 0)
            b = g.add_constant(f"{node.name}_bias", bias.astype(np.float32))
            inputs = list(node.inputs) + [""] * (3 - len(node.inputs))
            inputs[2] = b
            node = _absorb(g, node, add, inputs=inputs)
            fused.append({"node": node.name, "op": node.op, "absorbed": add.name,
                          "absorbed_op": "add", "as": "bias"})
            changed = True
    return changed


def _fuse_residual(g: Graph, fused: list) -> bool:
    changed = False
    for add in g.nodes():
        if add.name not in g.nx or add.op != "add" or len(add.inputs) != 2:
            continue
        order = {n.name: i for i, n in enumerate(g.nodes())}
        readers = _consumer_map(g)
        out_shape = g.tensors[add.outputs[0]].shape
        candidates = []
        for k in (0, 1):
            y, other = add.inputs[k], add.inputs[1 - k]
            producer, view = g.producer(y), None
            if producer is not None and producer.op == "reshape" \
                    and _sole_consumer(g, readers, producer.inputs[0]) is producer:
                view, producer = producer, g.producer(producer.inputs[0])
            if producer is None or not _fusible(g, producer) or y == other:
                continue
            if producer.attrs["activation"] is not None or producer.input(3):
                continue
            if _sole_consumer(g, readers, y) is None or g.tensors[other].is_constant:
                continue
            t, o = g.tensors[y], g.tensors[other]
            if not (t.shape == o.shape == out_shape and o.dtype == t.dtype):
                continue
            source = g.producer(other)
            # Reading `other` inside the conv would close a cycle if `other` depends on
            # the conv's own output.
            if source is not None and nx.has_path(g.nx, producer.name, source.name):
                continue
            # Prefer the conv whose other operand is ready earliest (graph inputs first).
            candidates.append((order[source.name] if source else -1, k, producer, other,
                               view))
        if not candidates:
            continue
        _, _, producer, other, view = min(candidates, key=lambda c: (c[0], c[1]))
        inputs = list(producer.inputs) + [""] * (4 - len(producer.inputs))
        if view is None:
            inputs[3] = other
            new = _absorb(g, producer, add, inputs=inputs)
        else:
            new = _residual_through(g, producer, view, add, other, inputs)
        fused.append({"node": new.name, "op": new.op, "absorbed": add.name,
                      "absorbed_op": "add", "as": "residual", "residual": other})
        changed = True
    return changed


def _residual_through(g: Graph, producer: Node, view: Node, add: Node, other: str,
                      inputs: list) -> Node:
    """``add(reshape(producer(x)), other)`` as ``reshape(producer(x, residual=
    reshape(other)))``: a transformer's dense runs on (tokens, features) between two
    reshapes of its (batch, tokens, features) activations, and its residual add reads
    the reshaped output. Reshapes are views, so the residual costs no copy."""
    shape = tuple(g.tensors[producer.outputs[0]].shape)
    inputs[3] = g.add_node("reshape", [other], name=f"{add.name}.residual", shape=shape)
    middle = view.outputs[0]
    g.remove_node(add.name)
    _rebuild(g, view, outputs=add.outputs)
    del g.tensors[middle]
    return _rebuild(g, producer, inputs=inputs)


def _bounds(kind: str | None, lo, hi) -> tuple[float, float]:
    if kind == "relu":
        return 0.0, np.inf
    return (-np.inf if lo is None else float(lo)), (np.inf if hi is None else float(hi))


def _compose(first: tuple[float, float], then: tuple[float, float]) -> tuple[float, float]:
    """clip(clip(x, l1, h1), l2, h2) == clip(x, max(l1, l2), min(max(h1, l2), h2)) with
    numpy's clip (minimum(maximum(x, lo), hi)), exactly, for all bounds."""
    (l1, h1), (l2, h2) = first, then
    return max(l1, l2), min(max(h1, l2), h2)


def _fuse_activation(g: Graph, fused: list) -> bool:
    changed = False
    for node in g.nodes():
        while _fusible(g, node):
            act = _sole_consumer(g, _consumer_map(g), node.outputs[0])
            if act is None or act.op not in ("relu", "clip"):
                break
            a = node.attrs
            if a["activation"] not in (None, "relu", "clip"):
                break               # a GELU (fuse_transformer) is no clamp to compose
            current = _bounds(a["activation"], a["clip_min"], a["clip_max"]) \
                if a["activation"] else (-np.inf, np.inf)
            new = _bounds(act.op, act.attrs.get("min"), act.attrs.get("max"))
            lo, hi = _compose(current, new)
            attrs = dict(a)
            if lo == 0.0 and hi == np.inf:
                attrs.update(activation="relu", clip_min=None, clip_max=None)
            else:
                attrs.update(activation="clip", clip_min=None if lo == -np.inf else lo,
                             clip_max=None if hi == np.inf else hi)
            node = _absorb(g, node, act, attrs=attrs)
            fused.append({"node": node.name, "op": node.op, "absorbed": act.name,
                          "absorbed_op": act.op, "as": "activation",
                          "activation": attrs["activation"], "clip_min": attrs["clip_min"],
                          "clip_max": attrs["clip_max"]})
            changed = True
    return changed


def fuse(graph: Graph) -> Graph:
    """A copy of `graph` with elementwise ops fused into the float conv2d/dense before
    them (an intermediate tensor is fused only when one node reads it and it is no graph
    output):

    * ``add`` of a constant that broadcasts per output channel -> bias (added to an
      existing bias);
    * ``add`` of another activation of the output's shape -> residual input; of two
      candidate convs the one whose other operand is computed earlier takes it, and
      never one on which that operand depends (that would be a cycle);
    * ``relu`` / ``clip`` -> activation "relu" / "clip" (chains compose exactly).

    A bias or residual fuses only before an activation. Repeats until nothing changes.
    Records ``metadata["fused"]``: one dict per fusion (node, op, absorbed, absorbed_op,
    as, and the details)."""
    g = infer_shapes(graph)
    fused = g.metadata.setdefault("fused", [])
    changed = True
    while changed:
        changed = _fuse_bias(g, fused)
        changed = _fuse_residual(g, fused) or changed
        changed = _fuse_activation(g, fused) or changed
    return g


# --- pipeline ----------------------------------------------------------------------------

def prepare(graph: Graph) -> Graph:
    """The standard pipeline before quantization: `infer_shapes`, `fold_constants`,
    `fuse_transformer` (transformer layers written out as fused ops; before the affine
    folds, which would make an attention's 4-D scale a depthwise convolution),
    `fold_batch_norm`, `fold_channel_affine`, `fuse`, then `Graph.validate`. Returns a
    new graph."""
    g = infer_shapes(graph)
    g = fold_constants(g)
    g = fuse_transformer(g)
    g = fold_batch_norm(g)
    g = fold_channel_affine(g)
    g = fuse(g)
    return g.validate()
