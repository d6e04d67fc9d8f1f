"""The registry of reference kernels: op name -> numpy implementation.

Kernels register with ``@kernel("op")`` in `vdla.compiler.reference.kernels_float` and
`vdla.compiler.reference.kernels_int`; importing `vdla.compiler.reference` loads both.
A kernel is ``fn(node, inputs, graph) -> list of arrays``: ``inputs`` holds one array per
node input (None for an absent optional input), and the graph gives shape-bound kernels
(flatten, reshape) their output shapes.
"""

from __future__ import annotations

from typing import Callable

__all__ = ["KERNELS", "kernel"]

#: op name -> fn(node, inputs: list[ndarray | None], graph) -> list[ndarray]
KERNELS: dict[str, Callable] = {}


def kernel(op: str):
    """Register the reference implementation of `op`."""
    def register(fn):
        if op in KERNELS:
            raise ValueError(f"reference kernel for {op!r} is registered twice")
        KERNELS[op] = fn
        return fn
    return register


