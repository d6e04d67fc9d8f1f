"""Packed tensor layouts: the accelerator's blocked formats and the pass that uses them.

The GEMM core multiplies a ``batch x block_in`` tile of inputs by a ``block_out x
block_in`` tile of weights, so its DRAM tensors are stored in blocks of those sizes
(VTA's layouts). Layout names:

===================  ===============================  ====================================
name                 shape                            holds
===================  ===============================  ====================================
``NCHW``             (N, C, H, W)                     activations (plain)
``NCHW{b}n{c}c``     (N/b, C/c, H, W, b, c)           activations, packed
``NC``               (N, C)                           dense activations (plain)
``NC{b}n{c}c``       (N/b, C/c, b, c)                 dense activations, packed
``OIHW``             (O, I, kH, kW)                   conv weights (plain)
``OIHW{o}o{i}i``     (O/o, I/i, kH, kW, o, i)         conv weights, packed
``OI``               (O, I)                           dense weights (plain)
``OI{o}o{i}i``       (O/o, I/i, o, i)                 dense weights, packed
===================  ===============================  ====================================

Packing pads the first two plain axes (N and C, or O and I) with zeros up to multiples
of their blocks; unpacking crops them back when told the original sizes (``batch`` for
axis 0, ``channels`` for axis 1) and keeps the padding otherwise.

`pack_graph(graph, config)` rewrites a graph's GEMM operators into this packed form with
``layout_transform`` nodes at the boundaries; `run_reference` executes the packed
operators with the same plain kernels (see `vdla.compiler.reference`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from vdla.compiler.graph import Graph, Node, Tensor
from vdla.compiler.reference import kernel

__all__ = ["Layout", "pack", "pack_graph", "parse_layout", "plain_layout", "transform",
           "transform_shape", "unpack"]

# Plain layout -> (letter of the outer block, letter of the inner block).
_FAMILIES = {"NCHW": ("n", "c"), "NC": ("n", "c"), "OIHW": ("o", "i"), "OI": ("o", "i")}
_PATTERN = re.compile(r"^(NCHW|NC|OIHW|OI)(?:(\d+)([a-z])(\d+)([a-z]))?$")
_KNOWN = "NCHW, NC, OIHW, OI, NCHW{b}n{c}c, NC{b}n{c}c, OIHW{o}o{i}i, OI{o}o{i}i"


@dataclass(frozen=True)
class Layout:
    """A parsed layout name: `base` is the plain layout (``NCHW``, ``NC``, ``OIHW``,
    ``OI``); `outer` and `inner` are the block sizes of its axes 0 and 1 (None for the
    plain layout itself)."""

    name: str
    base: str
    outer: int | None = None
    inner: int | None = None

    @property
    def packed(self) -> bool:
        return self.outer is not None

    @property
    def rank(self) -> int:
        """Rank of a tensor in this layout."""
        return len(self.base) + (2 if self.packed else 0)

    @property
    def plain(self) -> "Layout":
        return Layout(self.base, self.base)


def parse_layout(name: str | Layout) -> Layout:
    """Parse a layout name (see the module docstring); raise ValueError naming the
    allowed forms for anything else."""
    if isinstance(name, Layout):
        return name
    m = _PATTERN.match(name) if isinstance(name, str) else None
    if m is None:
        raise ValueError(f"unknown layout {name!r}; known forms: {_KNOWN}")
    base, outer, outer_letter, inner, inner_letter = m.groups()
    if outer is None:
        return Layout(name, base)
    if (outer_letter, inner_letter) != _FAMILIES[base]:
        o, i = _FAMILIES[base]
        raise ValueError(f"layout {name!r}: {base} blocks are written {base}{{x}}{o}{{y}}{i}")
    if int(outer) < 1 or int(inner) < 1:
        raise ValueError(f"layout {name!r}: block sizes must be >= 1")
    return Layout(name, base, int(outer), int(inner))


def plain_layout(name: str | Layout) -> str:
    """The plain layout of `name`'s family (``NCHW16n16c`` -> ``NCHW``)."""
    return parse_layout(name).base


def _round_up(value: int, block: int) -> int:
    return -(-value // block) * block


def _check_same_family(src: Layout, dst: Layout):
    if src.base != dst.base:
        raise ValueError(f"cannot transform layout {src.name!r} to {dst.name!r}: a layout "
                         f"only converts within its family ({src.base} and its blocked forms)")


def _plain_shape(shape, layout: Layout) -> tuple[int, ...]:
    """The padded plain shape of a tensor of `shape` in `layout`."""
    shape = tuple(int(d) for d in shape)
    if len(shape) != layout.rank:
        raise ValueError(f"a tensor in layout {layout.name!r} has rank {layout.rank}, "
                         f"not shape {shape}")
    if not layout.packed:
        return shape
    if shape[-2:] != (layout.outer, layout.inner):
        raise ValueError(f"a tensor in layout {layout.name!r} ends with blocks "
                         f"({layout.outer}, {layout.inner}), not shape {shape}")
    return (shape[0] * layout.outer, shape[1] * layout.inner) + shape[2:-2]


def _crop_sizes(padded: tuple[int, ...], batch, channels) -> tuple[int, int]:
    a0, a1 = padded[0], padded[1]
    for what, value, limit in (("batch", batch, a0), ("channels", channels, a1)):
        if value is not None and not 1 <= int(value) <= limit:
            raise ValueError(f"{what}={value} must be between 1 and the padded size {limit}")
    return (a0 if batch is None else int(batch)), (a1 if channels is None else int(channels))


def transform_shape(shape, src, dst, channels=None, batch=None) -> tuple[int, ...]:
    """The shape of a tensor of `shape` in layout `src` after transforming it to `dst`.

    `channels` and `batch` are the unpadded sizes of plain axes 1 and 0 (C and N, or I
    and O of weights): with them a packed tensor is cropped back; without them its
    padding stays. Raises ValueError for unknown layouts, layouts of different families
    and shapes that do not fit `src`."""
    src, dst = parse_layout(src), parse_layout(dst)
    _check_same_family(src, dst)
    plain = _plain_shape(shape, src)
    a0, a1 = _crop_sizes(plain, batch, channels)
    plain = (a0, a1) + plain[2:]
    if not dst.packed:
        return plain
    return (_round_up(a0, dst.outer) // dst.outer, _round_up(a1, dst.inner) // dst.inner) \
        + plain[2:] + (dst.outer, dst.inner)


def pack(array: np.ndarray, src, dst) -> np.ndarray:
    """Pack a plain-layout `array` (layout `src`) into the blocked layout `dst`, padding
    axes 0 and 1 with zeros to multiples of the blocks."""
    src, dst = parse_layout(src), parse_layout(dst)
    _check_same_family(src, dst)
    if src.packed or not dst.packed:
        raise ValueError(f"pack converts a plain layout to a blocked one, not {src.name!r} "
                         f"to {dst.name!r} (use transform)")
    array = np.asarray(array)
    _plain_shape(array.shape, src)
    a0, a1 = array.shape[:2]
    p0, p1 = _round_up(a0, dst.outer), _round_up(a1, dst.inner)
    if (p0, p1) != (a0, a1):
        array = np.pad(array, [(0, p0 - a0), (0, p1 - a1)] + [(0, 0)] * (array.ndim - 2))
    rest = array.shape[2:]
    blocked = array.reshape((p0 // dst.outer, dst.outer, p1 // dst.inner, dst.inner) + rest)
    # (A0/o, o, A1/i, i, *rest) -> (A0/o, A1/i, *rest, o, i)
    k = len(rest)
    order = (0, 2) + tuple(range(4, 4 + k)) + (1, 3)
    return np.ascontiguousarray(blocked.transpose(order))


def unpack(array: np.ndarray, src, dst, channels=None, batch=None) -> np.ndarray:
    """Unpack a blocked `array` (layout `src`) to the plain layout `dst`, cropping axis 1
    to `channels` and axis 0 to `batch` when given (else the zero padding is kept)."""
    src, dst = parse_layout(src), parse_layout(dst)
    _check_same_family(src, dst)
    if not src.packed or dst.packed:
        raise ValueError(f"unpack converts a blocked layout to a plain one, not {src.name!r} "
                         f"to {dst.name!r} (use transform)")
    array = np.asarray(array)
    plain = _plain_shape(array.shape, src)
    k = array.ndim - 4
    # (A0/o, A1/i, *rest, o, i) -> (A0/o, o, A1/i, i, *rest)
    order = (0, array.ndim - 2, 1, array.ndim - 1) + tuple(range(2, 2 + k))
    out = array.transpose(order).reshape(plain)
    a0, a1 = _crop_sizes(plain, batch, channels)
    return np.ascontiguousarray(out[:a0, :a1])


def transform(array: np.ndarray, src, dst, channels=None, batch=None) -> np.ndarray:
    """Convert `array` from layout `src` to `dst` (plain or blocked, same family),
    cropping to `channels`/`batch` on the way when given (see `transform_shape`)."""
    src, dst = parse_layout(src), parse_layout(dst)
    transform_shape(np.shape(array), src, dst, channels, batch)     # validates everything
    array = np.asarray(array)
    if src.packed:
        array = unpack(array, src, src.plain, channels, batch)
    elif channels is not None or batch is not None:
        a0, a1 = _crop_sizes(array.shape, batch, channels)
        array = array[:a0, :a1]
    return pack(array, src.plain, dst) if dst.packed else np.ascontiguousarray(array)


@kernel("layout_transform")
def _layout_transform(node, args, graph):
    a = node.attrs
    return [transform(args[0], a["src"], a["dst"], a["channels"], a.get("batch"))]


# --- the packing pass --------------------------------------------------------------------

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


def pack_graph(graph: Graph, config) -> Graph:
    """A copy of `graph` with every GEMM operator (`ops.GEMM_OPS`) whose ``groups`` is 1
    in the accelerator's packed layouts for `config` (a `vdla.HardwareConfig`):

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
    from vdla.compiler.ops import GEMM_OPS, infer_node
    from vdla.compiler.passes import infer_shapes
    g = infer_shapes(graph)
    b, bi, bo = int(config.batch), int(config.block_in), int(config.block_out)
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
        padded = _round_up(channels, bo)

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
