"""What every part of the ONNX importer shares: its error, an ONNX node with decoded
attributes, and the element types it reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import AttributeProto, helper, numpy_helper

__all__ = ["ELEM_TYPES", "MIN_OPSET", "OnnxImportError", "OnnxNode", "decode_attrs",
           "reshape_target"]

#: The oldest default-domain opset the importer understands (opset 7 brought numpy
#: broadcasting to Add/Mul/Gemm; older models use a different convention).
MIN_OPSET = 7


class OnnxImportError(ValueError):
    """An ONNX model vdla cannot import: the message says which node or file and why."""


@dataclass
class OnnxNode:
    """An ONNX node with its attributes decoded to Python values."""

    index: int
    op: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]

    def where(self) -> str:
        return f"node {self.name!r} (#{self.index}, {self.op})"

    def fail(self, message: str):
        raise OnnxImportError(f"{self.where()}: {message}")

    def input(self, i: int) -> str:
        return self.inputs[i] if i < len(self.inputs) else ""


def decode_attrs(proto) -> dict[str, Any]:
    attrs = {}
    for a in proto.attribute:
        if a.type == AttributeProto.TENSOR:
            value = numpy_helper.to_array(a.t)
        else:
            value = helper.get_attribute_value(a)
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            elif a.type in (AttributeProto.INTS, AttributeProto.FLOATS):
                value = list(value)
        attrs[a.name] = value
    return attrs


ELEM_TYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64"}


def reshape_target(node: OnnxNode, in_shape, target, allowzero: bool) -> tuple[int, ...]:
    """ONNX Reshape's output shape: 0 copies the input's dimension (unless allowzero),
    -1 takes what is left."""
    target = [int(d) for d in np.asarray(target).reshape(-1)]
    out = []
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            if i >= len(in_shape):
                node.fail(f"shape {target} copies dimension {i} (a 0), but the input has shape "
                          f"{tuple(in_shape)}")
            d = in_shape[i]
        elif d < -1:
            node.fail(f"shape {target} has {d}; dimensions are >= -1")
        out.append(d)
    total = int(np.prod(in_shape))
    if out.count(-1) > 1:
        node.fail(f"shape {target} has more than one -1")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        if known == 0 or total % known:
            node.fail(f"cannot reshape {tuple(in_shape)} ({total} elements) to {target}")
        out[out.index(-1)] = total // known
    if int(np.prod(out)) != total:
        node.fail(f"cannot reshape {tuple(in_shape)} ({total} elements) to {target} "
                  f"(resolved to {tuple(out)})")
    return tuple(out)
