"""Model compiler.

Front half (backend-neutral; the accelerator, CPU and GPU back halves share it):

* `Graph` (`vdla.compiler.graph`): the IR, operators over named tensors on networkx;
* `from_onnx(path_or_model)`: import an ONNX model; `to_onnx(graph)`: export one;
* `zoo.get(name)`: built-in models (resnet18/34/50, mobilenet_v1, small_cnn, digits_cnn);
* passes (`vdla.compiler.passes`): shape inference, constant folding, BN folding, fusion;
  `quantize(graph, calibration_inputs, config)`: int8 quantization;
  `vdla.compiler.layout`: packing to the accelerator's blocked layouts;
  `vdla.compiler.partition`: which ops run on the accelerator and which on the host;
* `run_reference(graph, inputs)`: the numpy reference executor (float, or exact integer
  arithmetic for a quantized graph), against which back halves are checked bit-exactly.
"""

from vdla.compiler.graph import Graph, GraphError, Node, Tensor
from vdla.compiler.reference import run_reference

__all__ = ["Graph", "GraphError", "Node", "Tensor", "from_onnx", "quantize", "run_reference",
           "to_onnx", "zoo"]


def __getattr__(name):
    # Imported on first use: onnx is a heavy import that graph-only users do not need.
    if name == "from_onnx":
        from vdla.compiler.onnx_import import from_onnx
        return from_onnx
    if name == "to_onnx":
        from vdla.compiler.onnx_export import to_onnx
        return to_onnx
    if name == "quantize":
        from vdla.compiler.quantization import quantize
        return quantize
    if name == "zoo":
        import vdla.compiler.zoo as zoo
        return zoo
    raise AttributeError(f"module 'vdla.compiler' has no attribute {name!r}")
