"""Model compiler: one front half, many back halves.

The folders follow the data flow:

* `ir` (`Graph`, tensors, operators, layouts) is what everything else reads and writes;
* `frontend`: graphs in and out: `from_onnx`, `to_onnx`, the model `zoo`, workloads;
* `reference`: the numpy kernels that define every op's results, float and integer
  (`run_reference`), against which back halves are checked bit-exactly;
* `passes`: `prepare` (shape inference, constant folding, BN folding, fusion),
  `quantize` (int8, for a requantization mode), `pack_graph`, `partition`;
* `targets`: the back halves behind one interface (`vdla`, the accelerator; `host`,
  the reference kernels), and `compile_model`, which runs what a target refuses on the
  host;
* `tuner`: schedule search over any target's tunable tasks;
* `pipeline`: load -> prepare -> quantize -> compile -> run -> check, written once.
"""

from vdla.compiler.frontend import zoo
from vdla.compiler.ir import Graph, GraphError, Node, Tensor
from vdla.compiler.passes.quantize import quantize
from vdla.compiler.reference import run_reference

__all__ = ["Graph", "GraphError", "Node", "Tensor", "from_onnx", "quantize", "run_reference",
           "to_onnx", "zoo"]


def __getattr__(name):
    # onnx is a heavy import (protobuf) that users of built-in models do not need.
    if name == "from_onnx":
        from vdla.compiler.frontend.onnx_import import from_onnx
        return from_onnx
    if name == "to_onnx":
        from vdla.compiler.frontend.onnx_export import to_onnx   # heavy: onnx
        return to_onnx
    raise AttributeError(f"module 'vdla.compiler' has no attribute {name!r}")
