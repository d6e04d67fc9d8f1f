"""The compiler's graph IR: what every other part of the compiler reads and writes.

* `tensor`: `Tensor` (a named value: shape, dtype, constant data, quantization scale,
  layout), `Node` (an operator application) and `GraphError`;
* `ops`: the operator set, each op's inputs, attributes and shape inference;
  `ops_sequence`: the operators of sequence models (transformers), registered with them;
* `graph`: `Graph`, operators as nodes of a networkx graph over named tensors;
* `layout`: plain and blocked tensor layouts (``NCHW1n16c``, ``OIHW16o16i``) and the
  numpy packing between them.
"""

from vdla.compiler.ir import ops_sequence  # noqa: F401  (registers its operators)
from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import DTYPES, GraphError, Node, Tensor

__all__ = ["DTYPES", "Graph", "GraphError", "Node", "Tensor"]
