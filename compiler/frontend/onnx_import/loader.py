"""Reading an ONNX model from a path, bytes or a ModelProto, with its external data."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto
from onnx.external_data_helper import load_external_data_for_model

from vdla.compiler.frontend.onnx_import.nodes import OnnxImportError

__all__ = ["load"]


def load(path_or_model):
    """(ModelProto, description of where it came from) for any accepted argument."""

    if isinstance(path_or_model, onnx.ModelProto):
        return path_or_model, "the given ModelProto"
    if isinstance(path_or_model, (bytes, bytearray, memoryview)):
        data, source, folder = bytes(path_or_model), "the given bytes", None
    elif isinstance(path_or_model, (str, os.PathLike)):
        path = Path(path_or_model)
        source, folder = str(path), path.parent
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise OnnxImportError(f"cannot read ONNX model {source!r}: "
                                  f"{exc.strerror or exc}") from None
    else:
        raise OnnxImportError("from_onnx takes a path, bytes or an onnx.ModelProto, not "
                              f"{type(path_or_model).__name__}")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise OnnxImportError(f"cannot parse {source!r} as an ONNX model ({len(data)} bytes; "
                              f"truncated or not ONNX: {exc})") from None
    # Arbitrary bytes sometimes decode as a protobuf message by chance: insist on the
    # parts every ONNX model has.
    if not model.HasField("graph") or not model.opset_import or not model.graph.output:
        raise OnnxImportError(f"cannot parse {source!r} as an ONNX model ({len(data)} bytes): "
                              "it has no graph, outputs or opset (truncated or not ONNX)")
    bad = _invalid_text(model, "model")
    if bad is not None:
        raise OnnxImportError(f"cannot parse {source!r} as an ONNX model: {bad[0]} is not "
                              f"UTF-8 text ({bad[1]!r}; a corrupted file)")
    if folder is not None and uses_external_data(model):
        try:
            load_external_data_for_model(model, str(folder))
        except (OSError, ValueError) as exc:
            raise OnnxImportError(f"cannot read the external data of {source!r}: {exc}") from None
    return model, source


def _invalid_text(message, path: str):
    """(field path, value) of the first string field of `message` that is not valid UTF-8
    (protobuf hands such a field over as bytes, which the importer would trip on), or
    None."""
    for field, value in message.ListFields():
        # protobuf 7 has `is_repeated` where older versions have `label`.
        repeated = (field.is_repeated if hasattr(field, "is_repeated")
                    else field.label == field.LABEL_REPEATED)
        for k, item in enumerate(value if repeated else [value]):
            where = f"{path}.{field.name}" + (f"[{k}]" if repeated else "")
            if field.type == field.TYPE_STRING and isinstance(item, bytes):
                return where, item
            if field.type == field.TYPE_MESSAGE:
                found = _invalid_text(item, where)
                if found is not None:
                    return found
    return None


def uses_external_data(model) -> bool:
    return any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)
