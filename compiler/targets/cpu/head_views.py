"""The fused attention reading its heads where the projection wrote them, and writing
its output where the merge of heads puts it, in the whole-graph runner.

Exporters write a transformer's attention as: the projection's output X, (B * S, W) or
(B, S, W) (one dense layer for Q, K and V together, `fuse_transformer`), sliced into
columns [start, start + H * D), reshaped to (B, S, H, D) and transposed to (B, H, S, D)
heads for each of q, k and v; after the attention, a transpose back to (B, S, H, Dv)
and a reshape to (B * S, H * Dv) for the output projection. The reshapes are views
(`program.VIEW_OPS`), but each slice and transpose copies the tensor: 3 slices and 4
transposes a layer (ViT-tiny float32: 0.5 and 0.6 ms of about 16 ms on an Intel Xeon,
2 threads). Here the attention kernel reads q, k and v from X in place (a head's row
``row`` elements from the next) and writes its output as (B, S, H, Dv) directly
(`HeadView`), and the runner leaves the slices and transposes out: their
`fusion.Fusion` names them (`program.plan_steps`).

An operand's chain is taken when every tensor in it is read by the next node alone and
is no graph output, the transpose is ``perm=(0, 2, 1, 3)``, the slice (if any) is one
contiguous range of X's last axis, and the reshape only splits the last axis into
heads. The session's op-by-op calls still run every node alone, with the attention's
own kernel, so both paths are checked against each other (and the reference).

    views, absorbed, output = head_views(graph, node, names)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Collection

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node

__all__ = ["HeadView", "head_views"]

_HEADS_FIRST = (0, 2, 1, 3)


@dataclasses.dataclass(frozen=True)
class HeadView:
    """An operand of shape (B, H, S, D) read in place from the tensor a transformer's
    projection wrote, or the output written in place into the tensor its merge of heads
    makes: element (b, h, s, d) at ``(b * S + s) * row + start + h * D + d`` of `source`
    (``(B * S, row)`` or ``(B, S, row)`` elements: columns ``start`` on of the
    projection's output, sliced, reshaped to (B, S, H, D) and transposed to heads first;
    for the output, (B, S, H, D) with ``row = H * D``). `head_views` finds them."""

    source: str
    start: int
    row: int

    def offsets(self, shape: tuple[int, ...]) -> np.ndarray:
        """Element offsets of each (b, h) head's first row, in ``b * H + h`` order."""
        b, h, s, d = shape
        heads = np.arange(b * h)
        return (heads // h) * s * self.row + self.start + (heads % h) * d


def _private(graph: Graph, tensor: str, reader: Node) -> bool:
    """Whether `reader` alone reads `tensor`, once, and it is no graph output."""
    return (tensor not in graph.outputs and reader.inputs.count(tensor) == 1
            and [c.name for c in graph.consumers(tensor)] == [reader.name])


def _range(node: Node) -> tuple[int, int] | None:
    """A slice node's one contiguous range [start, end) (the IR keeps them in bounds)."""
    a = node.attrs
    if len(a["axes"]) != 1 or tuple(a.get("steps") or (1,)) != (1,):
        return None
    return int(a["starts"][0]), int(a["ends"][0])


def _operand(graph: Graph, node: Node, tensor: str,
             names: Collection[str]) -> tuple[HeadView, list[str]] | None:
    """Operand `tensor` of attention `node` as a `HeadView` of the projection's output,
    and the nodes it leaves out (slice, reshape, transpose); None if it is no such
    chain."""
    t = graph.tensors
    transpose = graph.producer(tensor)
    if (transpose is None or transpose.name not in names or transpose.op != "transpose"
            or tuple(transpose.attrs["perm"]) != _HEADS_FIRST
            or not _private(graph, tensor, node)):
        return None
    reshape = graph.producer(transpose.inputs[0])
    if (reshape is None or reshape.name not in names or reshape.op != "reshape"
            or not _private(graph, transpose.inputs[0], transpose)):
        return None
    b, h, s, d = t[tensor].shape
    split = t[reshape.inputs[0]].shape
    if (tuple(t[reshape.outputs[0]].shape) != (b, s, h, d) or split[-1] != h * d
            or math.prod(split[:-1]) != b * s):
        return None
    source, start, chain = reshape.inputs[0], 0, [reshape.name, transpose.name]
    sliced = graph.producer(source)
    if (sliced is not None and sliced.name in names and sliced.op == "slice"
            and _private(graph, source, reshape)):
        whole = t[sliced.inputs[0]].shape
        span = _range(sliced)
        if (span is not None and int(sliced.attrs["axes"][0]) == len(whole) - 1
                and span[1] - span[0] == h * d and math.prod(whole[:-1]) == b * s):
            source, start, chain = sliced.inputs[0], span[0], [sliced.name] + chain
    if t[source].dtype != t[tensor].dtype:
        return None
    return HeadView(source, start, t[source].shape[-1]), chain


def head_views(graph: Graph, node: Node, names: Collection[str]
               ) -> tuple[tuple[HeadView | None, ...], tuple[str, ...], str]:
    """For an ``attention`` or ``qattention`` `node`: the views of q, k, v and its
    output (None where an operand is read as it is), the nodes of `names` (the CPU
    target's) that the views leave out, and the tensor the kernel then writes instead of
    its own output ("" for its own)."""
    views: list[HeadView | None] = []
    absorbed: list[str] = []
    for tensor in node.inputs[:3]:
        found = _operand(graph, node, tensor, names)
        views.append(found[0] if found else None)
        absorbed += found[1] if found else []
    out, output = node.outputs[0], ""
    readers = graph.consumers(out)
    merge = readers[0] if len(readers) == 1 else None
    views.append(None)
    if (merge is not None and merge.name in names and merge.op == "transpose"
            and tuple(merge.attrs["perm"]) == _HEADS_FIRST and _private(graph, out, merge)
            and len(graph.tensors[out].shape) == 4):
        b, h, s, dv = graph.tensors[out].shape
        output = merge.outputs[0]
        views[3] = HeadView(output, 0, h * dv)
        absorbed.append(merge.name)
    return tuple(views), tuple(absorbed), output
