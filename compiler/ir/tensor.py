"""The values and operator applications of the graph IR: `Tensor`, `Node`, their element
types, and `GraphError`, which names the node and tensor at fault.

These are plain data; `vdla.compiler.ir.graph.Graph` holds them and
`vdla.compiler.ir.ops` defines what an operator may be.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["DTYPES", "GraphError", "Node", "Tensor"]

#: Element types of tensors, by name, and their numpy types.
DTYPES = {"float32": np.float32, "int8": np.int8, "uint8": np.uint8, "int32": np.int32,
          "int64": np.int64, "bool": np.bool_}


class GraphError(ValueError):
    """A graph that is not well formed: the message names the node and tensor at fault."""


@dataclass
class Tensor:
    """A named value of the graph.

    name : str
    shape : tuple of int, or None while not yet inferred
    dtype : str, a key of `DTYPES`
    data : numpy array for a constant (weights, biases, shapes), else None
    scale : None for a float tensor; for a quantized one, ``real = scale * integer``:
        a float (per tensor) or a 1-D float array (per output channel, axis 0 of weights)
    layout : None for the plain layout of its rank (NCHW, OIHW, ...), else a packed
        layout name such as ``NCHW1n16c`` or ``OIHW16o16i`` (see `vdla.compiler.ir.layout`)
    """

    name: str
    shape: tuple[int, ...] | None = None
    dtype: str = "float32"
    data: np.ndarray | None = None
    scale: float | np.ndarray | None = None
    layout: str | None = None

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise GraphError(f"tensor {self.name!r}: dtype {self.dtype!r} is not one of "
                             f"{', '.join(DTYPES)}")
        if self.data is not None:
            self.data = np.asarray(self.data, dtype=DTYPES[self.dtype])
            if self.shape is None:
                self.shape = tuple(self.data.shape)
        if self.shape is not None:
            self.shape = tuple(int(d) for d in self.shape)

    @property
    def is_constant(self) -> bool:
        return self.data is not None


@dataclass
class Node:
    """One operator application: `op` (a name registered in `vdla.compiler.ir.ops`), its
    input and output tensor names, and its attributes (plain Python values)."""

    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)

    def input(self, i: int) -> str:
        """The name of input `i`, or "" when that optional input is absent."""
        return self.inputs[i] if i < len(self.inputs) else ""
