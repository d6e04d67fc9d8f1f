"""The packing pass: GEMM operators in blocked layouts (`vdla.compiler.ir.layout`).

`pack_graph(graph, batch=, block_in=, block_out=)` rewrites a graph's conv2d/dense nodes
(float or integer) into the blocked layouts ``NCHW{b}n{c}c`` / ``OIHW{o}o{i}i`` with
``layout_transform`` nodes at the boundaries, as a back half with a blocked GEMM core
stores its tensors. The block sizes are parameters (a target passes its own); the
reference executes the packed operators exactly (`vdla.compiler.reference`).
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.layout import pack, parse_layout, round_up
from vdla.compiler.ir.ops import GEMM_OPS, infer_node
from vdla.compiler.ir.tensor import Node, Tensor
from vdla.compiler.passes.prepare import infer_shapes

__all__ = ["pack_graph"]


#: Per-output-channel attributes of the integer GEMM ops: padded with the output channels.
_CHANNEL_ATTRS = ("multiplier", "shift")


def _pad_axis0(data: np.ndarray, size: int) -> np.ndarray:
    data = np.asarray(data)
    return np.pad(data, [(0, size - data.shape[0])] + [(0, 0)] * (data.ndim - 1))


def _pad_channel_attr(value, channels: int, padded: int):
    """A per-channel attribute (length `channels`) padded to `padded` by repeating its
    last value: the padded channels' accumulators are zero, so any valid parameter
    gives them zero, and repeating keeps every entry in the range the op accepts."""
    if value is None or np.ndim(value) == 0 or len(value) != channels or channels == padded:
        return value
    arr = np.asarray(value)
    padded_arr = np.pad(arr, (0, padded - channels), mode="edge")
    return tuple(v.item() for v in padded_arr) if isinstance(value, tuple) else padded_arr


def _pad_scale(scale, channels: int, padded: int):
    # A per-output-channel scale follows its weights' padded channels (the padding
    # channels repeat the last scale: their values are zero, so any positive scale fits).
    if scale is None or np.ndim(scale) == 0 or np.size(scale) != channels:
        return scale
    return np.pad(np.asarray(scale, dtype=np.float64), (0, padded - channels), mode="edge")


def pack_graph(graph: Graph, *, batch: int, block_in: int, block_out: int) -> Graph:
    """A copy of `graph` with every GEMM operator (`GEMM_OPS`) whose ``groups`` is 1 in
    blocked layouts of `batch` rows, `block_in` input and `block_out` output channels
    (for the accelerator: its config's ``batch``, ``block_in`` and ``block_out``):

    * data in ``NCHW{batch}n{block_in}c`` (``NC...`` for dense), inserted by a
      ``layout_transform`` from the plain tensor;
    * weights as packed constants ``OIHW{block_out}o{block_in}i`` with zero-padded
      channels (a computed weight gets a ``layout_transform`` node instead);
    * bias padded to the padded output channel count, per-channel requantization
      attributes likewise;
    * residual and output in ``NCHW{batch}n{block_out}c``; a ``layout_transform`` back to
      the plain layout (cropped to the original channels and batch) keeps the original
      output tensor name, so other consumers and graph outputs see plain tensors.

    Between consecutive packed operators the unpack -> pack pair is removed when both
    sides use the same blocked layout, or merged into one blocked -> blocked transform
    when they differ, so tensors stay packed through chains of GEMM operators. Grouped
    and depthwise convolutions stay unpacked. Returns the new graph (validated), with
    ``metadata["packed"]``: the packed node names and the block sizes used."""
    for what, value in (("batch", batch), ("block_in", block_in), ("block_out", block_out)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"pack_graph: {what} must be a positive integer, not {value!r}")
    g = infer_shapes(graph)
    b, bi, bo = batch, block_in, block_out
    packed_inputs: dict[tuple[str, str], str] = {}      # (tensor, layout) -> packed tensor
    packed_nodes = []

    def to_layout(tensor: str, src: str, dst: str, near: str) -> str:
        key = (tensor, dst)
        if key not in packed_inputs:
            t = g.tensors[tensor]
            out = g.add_node("layout_transform", [tensor], name=f"{near}_pack",
                             src=src, dst=dst)
            g.tensors[out].layout, g.tensors[out].scale = dst, t.scale
            packed_inputs[key] = out
        return packed_inputs[key]

    for node in g.nodes():
        if node.op not in GEMM_OPS or int(node.attrs.get("groups", 1)) != 1:
            continue
        if parse_layout(node.attrs["data_layout"]).packed:
            continue                                      # packed already
        conv = len(g.tensors[node.inputs[0]].shape) == 4
        act, wgt = ("NCHW", "OIHW") if conv else ("NC", "OI")
        data_layout, kernel_layout = f"{act}{b}n{bi}c", f"{wgt}{bo}o{bi}i"
        out_layout = f"{act}{b}n{bo}c"
        y = g.tensors[node.outputs[0]]
        n, channels = y.shape[0], y.shape[1]
        padded = round_up(channels, bo)

        inputs = [to_layout(node.inputs[0], act, data_layout, node.name)]
        w = g.tensors[node.inputs[1]]
        if w.is_constant:
            inputs.append(g.add_constant(f"{node.inputs[1]}_packed",
                                         pack(w.data, wgt, kernel_layout), w.dtype,
                                         scale=_pad_scale(w.scale, channels, padded)))
            g.tensors[inputs[-1]].layout = kernel_layout
        else:
            inputs.append(to_layout(node.inputs[1], wgt, kernel_layout, node.name))
        bias = node.input(2)
        if bias and padded != channels:
            bt = g.tensors[bias]
            if bt.is_constant:
                bias = g.add_constant(f"{bias}_padded", _pad_axis0(bt.data, padded), bt.dtype,
                                      scale=_pad_scale(bt.scale, channels, padded))
            else:
                bias = g.add_node("pad", [bias], name=f"{node.name}_bias_pad",
                                  pads=(0, padded - channels), value=0)
        inputs.append(bias)
        if node.input(3):
            inputs.append(to_layout(node.input(3), act, out_layout, node.name))
        while inputs and not inputs[-1]:
            inputs.pop()

        attrs = dict(node.attrs, data_layout=data_layout, kernel_layout=kernel_layout,
                     out_layout=out_layout)
        for key in _CHANNEL_ATTRS:
            if key in attrs:
                attrs[key] = _pad_channel_attr(attrs[key], channels, padded)
        packed_out = g.unique_name(f"{node.outputs[0]}_packed")
        g.add_tensor(Tensor(packed_out, dtype=y.dtype, scale=y.scale, layout=out_layout))
        g.replace_node(Node(node.name, node.op, inputs, [packed_out], attrs))
        infer_node(g, g.node(node.name))
        g.add_node("layout_transform", [packed_out], [node.outputs[0]],
                   name=f"{node.name}_unpack", src=out_layout, dst=act,
                   channels=channels, batch=n)
        packed_nodes.append(node.name)

    _remove_unpack_pack_pairs(g)
    g.prune()
    g.metadata["packed"] = {"nodes": packed_nodes, "batch": b, "block_in": bi,
                            "block_out": bo}
    return g.validate()


def _remove_unpack_pack_pairs(g: Graph):
    """Let packed consumers read packed producers directly: a pack (plain -> L) of the
    output of an unpack (L' -> plain) becomes the unpack's input itself when L == L',
    else one L' -> L transform. The crop that is skipped only dropped padding, which a
    GEMM consumer multiplies by zero weights (padded channels) or keeps in rows it never
    mixes with real ones (padded batch)."""
    for node in g.nodes():
        if node.op != "layout_transform" or node.name not in g.nx:
            continue
        src, dst = parse_layout(node.attrs["src"]), parse_layout(node.attrs["dst"])
        if src.packed or not dst.packed:
            continue
        producer = g.producer(node.inputs[0])
        if producer is None or producer.op != "layout_transform":
            continue
        p_src, p_dst = parse_layout(producer.attrs["src"]), parse_layout(producer.attrs["dst"])
        if not p_src.packed or p_dst.packed or p_src.base != dst.base:
            continue
        packed = producer.inputs[0]
        if p_src.name == dst.name and node.attrs.get("channels") is None \
                and node.attrs.get("batch") is None:
            g.remove_node(node.name)
            g.replace_uses(node.outputs[0], packed)
            del g.tensors[node.outputs[0]]
        else:
            out = node.outputs[0]
            g.replace_node(Node(node.name, "layout_transform", [packed], [out],
                           dict(node.attrs, src=p_src.name,
                                channels=producer.attrs.get("channels"),
                                batch=producer.attrs.get("batch"))))
