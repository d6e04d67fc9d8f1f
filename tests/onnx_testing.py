"""ONNX models built with onnx's helper API for the tests of loading and running them."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def dynamic_batch_model(path, batch_dim="N", fixed_batch=None):
    """A conv + ReLU ONNX model whose input 'x' has batch `batch_dim` (a dim_param name,
    None for an unknown dimension) or `fixed_batch`, written to `path`."""
    rng = np.random.default_rng(5)
    n = fixed_batch if fixed_batch is not None else batch_dim
    w = numpy_helper.from_array((rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])], "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 16, 8, 8])],
        initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)
