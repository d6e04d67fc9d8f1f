"""Import ONNX models into the compiler's graph IR (see `importer` for what is covered).

* `importer`: `from_onnx` and the `Importer` that walks a model's nodes;
* `converters`: one converter per supported ONNX op type;
* `folding`: import-time evaluation of constant shape computations;
* `loader`: reading the model; `nodes`: the error and node type they share.
"""

from vdla.compiler.frontend.onnx_import.importer import from_onnx, supported_ops
from vdla.compiler.frontend.onnx_import.nodes import MIN_OPSET, OnnxImportError

__all__ = ["MIN_OPSET", "OnnxImportError", "from_onnx", "supported_ops"]
