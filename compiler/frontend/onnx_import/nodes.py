"""What every part of the ONNX importer shares: its error, an ONNX node with decoded
attributes, and the element types it reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import AttributeProto, defs, helper, numpy_helper

__all__ = ["ELEM_TYPES", "MIN_OPSET", "OnnxImportError", "OnnxNode", "check_schema",
           "decode_attrs", "elem_type_name", "reshape_target"]

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


def _attr_type_name(attr_type: int) -> str:
    try:
        return AttributeProto.AttributeType.Name(attr_type)
    except ValueError:
        return f"undefined type {attr_type}"


def check_schema(node: OnnxNode, proto, opset: int) -> None:
    """Check `node` (its `proto`) against ONNX's definition of its op at `opset`, so a
    malformed node fails with its name rather than deep in a converter: every required
    input is there, and every attribute the op defines has the op's type. An op ONNX
    does not define at `opset` is left to the converters, which refuse what they do not
    know."""
    try:
        # An opset newer than this onnx knows keeps its latest definitions (and a huge
        # number would not fit the C++ int).
        schema = defs.get_schema(node.op, min(opset, defs.onnx_opset_version()), "")
    except defs.SchemaError:
        return
    op = f"{node.op}-{schema.since_version}"
    if len(node.inputs) < schema.min_input:
        node.fail(f"has {len(node.inputs)} input(s); {op} takes at least {schema.min_input}")
    single = defs.OpSchema.FormalParameterOption.Single
    for k, formal in enumerate(schema.inputs):
        if formal.option == single and not node.input(k):
            node.fail(f"required input {k} ({formal.name}) of {op} is missing")
    for k, formal in enumerate(schema.outputs):
        if formal.option == single and (k >= len(node.outputs) or not node.outputs[k]):
            node.fail(f"required output {k} ({formal.name}) of {op} is missing")
    for a in proto.attribute:
        defined = schema.attributes.get(a.name)
        if defined is not None and int(defined.type) != a.type:
            node.fail(f"attribute {a.name!r} is {_attr_type_name(a.type)}; {op} takes "
                      f"{_attr_type_name(int(defined.type))}")


def elem_type_name(elem_type: int) -> str:
    """An ONNX element type's name (``FLOAT``), also for numbers ONNX does not define."""
    try:
        return helper.tensor_dtype_to_string(elem_type)
    except (KeyError, ValueError):
        return f"{elem_type} (not an ONNX element type)"


def decode_attrs(proto, node: OnnxNode | None = None) -> dict[str, Any]:
    """`proto`'s attributes as Python values; an attribute that cannot be read (an
    undefined type, a bad tensor) fails naming `node` when given."""
    attrs = {}
    for a in proto.attribute:
        try:
            value = (numpy_helper.to_array(a.t) if a.type == AttributeProto.TENSOR
                     else helper.get_attribute_value(a))
        except (ValueError, TypeError, KeyError) as exc:
            message = (f"attribute {a.name!r} ({_attr_type_name(a.type)}) cannot be read: "
                       f"{exc}")
            if node is None:
                raise OnnxImportError(message) from None
            node.fail(message)
        if a.type != AttributeProto.TENSOR:
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            elif a.type in (AttributeProto.INTS, AttributeProto.FLOATS):
                value = list(value)
        attrs[a.name] = value
    return attrs


ELEM_TYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 9: "bool"}


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
