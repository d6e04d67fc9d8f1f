"""Channel maps: ops that read (or write) a tensor whose channels do not sit at
positions 0..C-1 of its DRAM buffer.

A concat view places each part at a channel-block boundary of one buffer
(`vdla.compiler.targets.vdla.placement`); a part that does not fill its last block
leaves pad channels behind it, so logical channel c of the concat sits at some physical
position ``positions[c]`` of the P >= C physical channels, and a flatten view's
features sit in the blocked order of its input. The ops that read such a tensor run on
all P physical channels; nothing is moved:

* a convolution (groups 1) or dense layer gets its weights scattered to the physical
  input positions, zeros at the pad positions (which may hold anything);
* a per-channel op (a pool, ReLU, a qadd of the tensor and a zero constant, a depthwise
  convolution) computes every physical channel, its per-channel constants (depthwise
  weights, bias, requantization) scattered alike, and its output keeps the map;
* a host op or a model output gets the logical channels gathered on the read back.

`map_problem` says whether every reader of a mapped tensor is one of those;
`physical_node` rewrites a node into a scratch graph over the physical shapes, which
the lowerings then take as they are.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node, Tensor
from vdla.compiler.targets.vdla.pool import POOL_OPS
from vdla.compiler.targets.vdla.sequence import ROW_BATCHES

__all__ = ["carries_map", "map_problem", "physical_node"]


def _depthwise(node: Node, graph: Graph) -> bool:
    if node.op != "qconv2d" or node.input(3):
        return False
    groups = int(node.attrs.get("groups", 1))
    c = graph.tensors[node.inputs[0]].shape[1]
    return groups > 1 and groups == c == graph.tensors[node.outputs[0]].shape[1]


def carries_map(node: Node, graph: Graph) -> bool:
    """Whether `node` works channel by channel, so that its output has its input's
    channel map: pools, ReLU, a qadd with a zero constant, a depthwise convolution."""
    if node.op in POOL_OPS or node.op == "relu" or _depthwise(node, graph):
        return True
    if node.op == "qadd":
        return any(graph.constant(t) is not None for t in node.inputs)
    return False


def map_problem(graph: Graph, tensor: str, on_accelerator: Callable[[Node], bool]) -> str | None:
    """Why a tensor with a channel map cannot be `tensor` (None when every reader takes
    it): the readers `on_accelerator` says run there must scatter their weights
    (convolutions of groups 1, dense layers reading it as their input) or carry the
    map on (`carries_map`, then their readers are asked in turn); a concat reads it as a
    part that keeps its map (the concat's own map follows from its parts'), a flatten
    passes it on to its readers. Host readers gather the channels."""
    todo, seen = [tensor], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for reader in graph.consumers(name):
            if reader.op == "concat":   # a part keeps its map inside the concat's
                continue
            if reader.op in ("flatten", "reshape"):
                todo.append(reader.outputs[0])
                continue
            if not on_accelerator(reader):
                continue
            if reader.op in ("qconv2d", "qdense") and reader.inputs[0] == name \
                    and name not in reader.inputs[1:] \
                    and int(reader.attrs.get("groups", 1)) == 1:
                continue
            if carries_map(reader, graph) and reader.inputs.count(name) == 1:
                todo.append(reader.outputs[0])
                continue
            return (f"{reader.op} node {reader.name!r} reads {name!r} and cannot take its "
                    "channel map (only convolutions of groups 1, dense layers and "
                    "per-channel ops can)")
    return None


def physical_node(node: Node, graph: Graph, placements: dict) -> tuple[Node, Graph]:
    """`node` over its tensors' physical channels: (node, graph) to lower, the same
    ones when none of its activations has a channel map, else a scratch graph holding
    the node with reshaped activations and scattered constants (see the module
    docstring). `placements`: tensor -> `Placement`."""
    mapped = {t: placements[t] for t in list(node.inputs) + list(node.outputs)
              if t in placements and not placements[t].identity}
    if not mapped or node.op in ("concat", "flatten", "reshape"):   # views: no program
        return node, graph
    scratch = Graph(f"{graph.name}:{node.name}")
    x = node.inputs[0]
    positions = placements[x].positions() if x in mapped else None
    per_channel = carries_map(node, graph) and positions is not None
    attrs = dict(node.attrs)
    for i, name in enumerate(node.inputs):
        if not name or name in scratch.tensors:
            continue
        t = graph.tensors[name]
        if name in mapped:
            scratch.add_tensor(_reshaped(t, mapped[name]))
        elif t.is_constant and i > 0 and node.op in ("qconv2d", "qdense") and positions is not None:
            scratch.add_tensor(_scattered_constant(t, i, positions, placements[x].physical,
                                                   per_channel))
        elif t.is_constant and per_channel and t.data.ndim >= 2 \
                and t.shape[1] == len(positions):
            # a qadd's zero operand (`carries_map`): zeros of the physical shape
            if np.any(t.data):
                raise ValueError(f"{node.op} node {node.name!r}: constant {name!r} is not zero; "
                                 "it cannot follow a channel map")
            shape = (t.shape[0], placements[x].physical) + tuple(t.shape[2:])
            scratch.add_tensor(Tensor(t.name, shape, t.dtype, np.zeros(shape, t.data.dtype),
                                      t.scale))
        else:
            scratch.add_tensor(Tensor(t.name, t.shape, t.dtype, t.data, t.scale))
    for name in node.outputs:
        t = graph.tensors[name]
        scratch.add_tensor(_reshaped(t, mapped[name]) if name in mapped
                           else Tensor(t.name, t.shape, t.dtype, None, t.scale))
    if per_channel:
        physical = placements[x].physical
        for key, value in attrs.items():
            if isinstance(value, (tuple, list, np.ndarray)) and len(value) == len(positions) \
                    and len(positions) > 1:
                attrs[key] = tuple(_scatter(np.asarray(value), positions, physical,
                                            fill=np.asarray(value)[0]).tolist())
        if node.op == "qconv2d":
            attrs["groups"] = physical
    # Only a batch of rows carries a channel map (a flatten of a feature map), and the
    # scratch graph has no producers to tell one from a sequence: it says so
    # (`sequence.pixel_rows`).
    scratch.metadata[ROW_BATCHES] = frozenset(t for t in node.inputs + node.outputs if t)
    scratch.add_node(node.op, node.inputs, node.outputs, name=node.name, infer=False, **attrs)
    # (the scratch graph may have named it apart from a tensor of the same name)
    return dataclasses.replace(scratch.producer(node.outputs[0]), name=node.name), scratch


def _reshaped(t: Tensor, p) -> Tensor:
    shape = (t.shape[0], p.physical) + tuple(t.shape[2:])
    return Tensor(t.name, shape, t.dtype, None, t.scale)


def _scatter(values: np.ndarray, positions: np.ndarray, physical: int, axis: int = 0,
             fill=0) -> np.ndarray:
    shape = list(values.shape)
    shape[axis] = physical
    out = np.full(shape, fill, values.dtype)
    index = [slice(None)] * values.ndim
    index[axis] = positions
    out[tuple(index)] = values
    return out


def _scattered_constant(t: Tensor, i: int, positions, physical: int, per_channel: bool):
    """A GEMM op's weights (input 1) or bias (input 2) on the physical channels: the
    input axis (1) of a convolution's or dense layer's weights; a depthwise one's output
    axis (0) and its bias, with per-channel scales alike."""
    data, scale = t.data, t.scale
    if i == 1 and not per_channel:
        data = _scatter(data, positions, physical, axis=1)
    elif per_channel:
        data = _scatter(data, positions, physical, axis=0)
        if isinstance(scale, np.ndarray) and scale.size == len(positions):
            scale = _scatter(scale, positions, physical, fill=1.0)
    return Tensor(t.name, data.shape, t.dtype, data, scale)
