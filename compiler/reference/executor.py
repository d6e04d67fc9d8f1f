"""The reference executor: runs any graph with the registered numpy kernels.

`run_reference(graph, inputs)` runs a float graph in float32 (float64 inside
convolutions and products, rounded back to float32) and a quantized graph with exact
integer arithmetic (`vdla.compiler.reference.integer`). A GEMM node in packed layouts
(`vdla.compiler.passes.pack.pack_graph`) runs through the same plain kernel: its inputs
are unpacked and its output packed around the call, so kernels only see plain layouts.
`check_inputs` is the one check of a feed, shared with every target's sessions.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.layout import pack, parse_layout, unpack
from vdla.compiler.ir.tensor import DTYPES, GraphError, Node
from vdla.compiler.reference.registry import KERNELS

__all__ = ["check_inputs", "run_reference"]


def check_inputs(graph: Graph, feed) -> dict[str, np.ndarray]:
    """`feed` (input name -> array) checked against `graph`'s inputs and cast to their
    dtypes: the one input check of `run_reference` and of the back halves' sessions.
    Raises ValueError naming a missing, unknown, wrong-shaped or wrong-typed input and
    what the graph takes; TypeError when `feed` is not a mapping."""
    if not isinstance(feed, Mapping):
        raise TypeError(f"feed must be a dict input name -> array, not {type(feed).__name__}")
    takes = ", ".join(f"{n} {graph.tensors[n].shape} {graph.tensors[n].dtype}"
                      for n in graph.inputs)
    missing = [n for n in graph.inputs if n not in feed]
    if missing:
        raise ValueError(f"missing input(s) {missing}; graph {graph.name!r} takes {takes}")
    unknown = sorted(set(feed) - set(graph.inputs))
    if unknown:
        raise ValueError(f"unknown input(s) {unknown}; graph {graph.name!r} takes {takes}")
    values = {}
    for name in graph.inputs:
        t = graph.tensors[name]
        array = np.asarray(feed[name])
        if tuple(array.shape) != t.shape:
            raise ValueError(f"input {name!r} has shape {tuple(array.shape)}; the graph "
                             f"expects {t.shape}")
        if t.dtype == "float32":
            if array.dtype.kind not in "fiu":
                raise ValueError(f"input {name!r} has dtype {array.dtype}; expected a number")
        elif array.dtype != DTYPES[t.dtype]:
            raise ValueError(f"input {name!r} has dtype {array.dtype}; the graph expects "
                             f"{t.dtype}")
        values[name] = array.astype(DTYPES[t.dtype], copy=False)
    return values


def run_reference(graph: Graph, inputs: dict[str, np.ndarray], *,
                  keep: bool = False) -> dict[str, np.ndarray]:
    """Run `graph` on `inputs` (name -> array) and return its outputs (name -> array).

    With `keep`, every intermediate tensor is returned too (for debugging and for the
    per-op comparisons of back halves). Inputs are checked against the graph's input
    shapes and dtypes; a wrong or missing input raises ValueError naming it."""
    values = check_inputs(graph, inputs)
    for name, t in graph.tensors.items():
        if t.is_constant:
            values[name] = t.data
    for node in graph.nodes():
        fn = KERNELS.get(node.op)
        if fn is None:
            raise GraphError(f"node {node.name!r}: no reference kernel for op {node.op!r}")
        args = [values[i] if i else None for i in node.inputs]
        if "data_layout" in node.attrs and node.attrs["data_layout"] not in ("NCHW", "NC"):
            results = _run_packed(fn, node, args, graph)
        else:
            results = fn(node, args, graph)
        for out, value in zip(node.outputs, results):
            dtype = DTYPES[graph.tensors[out].dtype]
            values[out] = np.asarray(value).astype(dtype, copy=False)
    if keep:
        return values
    return {name: values[name] for name in graph.outputs}


def _run_packed(fn, node: Node, args: list, graph: Graph) -> list:
    """Run a GEMM node in packed layouts with its plain kernel: unpack data, weights and
    residual (keeping their zero-padded channels and batch rows), run the kernel with the
    plain layout attributes, and pack the output into ``out_layout``. The padded weights
    are zero, so the real channels come out exactly as the unpacked op computes them."""
    a = node.attrs
    data, kern, out = (parse_layout(a[k]) for k in ("data_layout", "kernel_layout", "out_layout"))
    args = list(args) + [None] * (4 - len(args))
    x = unpack(args[0], data, data.base)
    w = unpack(args[1], kern, kern.base) if kern.packed else args[1]
    residual = args[3]
    if residual is not None and out.packed:
        residual = unpack(residual, out, out.base)
    plain = Node(node.name, node.op, list(node.inputs), list(node.outputs),
                 dict(a, data_layout=data.base, kernel_layout=kern.base, out_layout=out.base))
    results = fn(plain, [x, w, args[2], residual][:max(len(node.inputs), 2)], graph)
    return [pack(results[0], out.base, out) if out.packed else results[0]] + list(results[1:])
