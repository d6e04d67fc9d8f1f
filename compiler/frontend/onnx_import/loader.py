"""Reading an ONNX model from a path, bytes or a ModelProto, with its external data, and
upgrading a model older than the importer's oldest opset with onnx's version converter."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, shape_inference, version_converter
from onnx.external_data_helper import load_external_data_for_model

from vdla.compiler.frontend.onnx_import.nodes import MIN_OPSET, OnnxImportError

__all__ = ["default_opset", "load", "upgrade"]

#: The newest opset the importer is tested with (the error messages name it).
TESTED_OPSET = 21


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


def default_opset(model, source: str) -> int:
    """The model's default-domain (ai.onnx) opset version."""
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise OnnxImportError(f"{source!r} imports no default-domain (ai.onnx) opset; "
                              f"it imports {[o.domain for o in model.opset_import]}")
    return int(versions[0])


def upgrade(model, source: str):
    """(model, the opset it was upgraded from or None): a model whose default-domain opset
    is below `MIN_OPSET` comes back converted to `MIN_OPSET` by onnx's version converter,
    with a warning saying so (the importer's converters read opset 7 and later; older
    opsets differ: Add/Mul's `broadcast` attribute, BatchNormalization's `is_test`, ...),
    legacy broadcasts aligned first (`_align_legacy_broadcasts`). A model the
    converter cannot upgrade is refused naming its opset, what vdla imports and the
    converter's reason. Other models come back unchanged."""
    opset = default_opset(model, source)
    if opset >= MIN_OPSET:
        return model, None
    refusal = (f"{source!r} uses opset {opset}; vdla imports opset {MIN_OPSET} and later "
               f"(tested up to {TESTED_OPSET}), and upgrades opsets 1 to {MIN_OPSET - 1} "
               "with onnx's version converter")
    if opset < 1:
        raise OnnxImportError(f"{refusal}; opset {opset} is not an ONNX opset")
    try:
        converted = version_converter.convert_version(_align_legacy_broadcasts(model),
                                                      MIN_OPSET)
    # The converter documents RuntimeError but raises more (found by tests/fuzz): its own
    # ConvertError (an undefined input), shape inference's InferenceError (contradicting
    # types), RuntimeError (a failed assertion: an op without an adapter or a schema),
    # ValueError (protobuf's 2 GiB limit). Each only means this model cannot be upgraded.
    except Exception as exc:  # noqa: BLE001
        raise OnnxImportError(f"{refusal}, which cannot upgrade this model: "
                              f"{_converter_reason(exc)}") from None
    message = (f"{source!r}: upgraded from opset {opset} to {MIN_OPSET} with onnx's version "
               "converter")
    # stacklevel 3: the warning points at the caller of from_onnx.
    warnings.warn(message, UserWarning, stacklevel=3)
    return converted, opset


def _align_legacy_broadcasts(model):
    """`model` with each legacy broadcast (``broadcast=1`` with an ``axis``, opsets 1-6) whose
    B is not aligned with A's first or last axes rewritten for onnx's version converter.

    The converter (onnx 1.23) upgrades such a node by unsqueezing B to A's rank at the end,
    which aligns B with A's axis 0 whatever `axis` says: ``Add(A (1, 3, 4, 4), b (3,),
    broadcast=1, axis=1)``, a per-channel bias, would become a (3, 1, 1, 1) operand and a
    (3, 3, 4, 4) result. Here B gets an Unsqueeze-1 of its trailing axes instead, so B
    lines up with A's last axes, and the node loses `axis` (numpy-style broadcasting,
    which the converter upgrades as it is). Nodes whose ranks shape inference cannot tell
    are left to the converter, which refuses them (it needs both shapes)."""
    def legacy(node):
        attrs = {a.name: a for a in node.attribute}
        return (node.domain in ("", "ai.onnx") and len(node.input) == 2 and "axis" in attrs
                and "broadcast" in attrs and attrs["broadcast"].i)

    if not any(legacy(n) for n in model.graph.node):
        return model
    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001  (an inconsistent model: the converter says why)
        inferred = model
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output)
             if v.type.tensor_type.HasField("shape")}
    ranks.update({t.name: len(t.dims) for t in model.graph.initializer})
    taken = {name for n in model.graph.node for name in (*n.input, *n.output)} | set(ranks)
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    nodes = fixed.graph.node
    k = 0
    while k < len(nodes):
        node = nodes[k]
        ra, rb = (ranks.get(node.input[0]), ranks.get(node.input[1])) if legacy(node) else \
            (None, None)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        # Aligned at A's axis 0 or at its end, the converter's result is right; an axis out
        # of range is the converter's (or the importer's) to refuse.
        if ra is None or rb is None or not 0 < axis < ra - rb:
            k += 1
            continue
        aligned = f"{node.input[1]}_aligned"
        while aligned in taken:
            aligned += "_"
        taken.add(aligned)
        nodes.insert(k, helper.make_node("Unsqueeze", [node.input[1]], [aligned],
                                         axes=list(range(rb, ra - axis))))
        node = nodes[k + 1]
        node.input[1] = aligned
        kept = [a for a in node.attribute if a.name != "axis"]
        del node.attribute[:]
        node.attribute.extend(kept)
        k += 2
    return fixed


def _converter_reason(exc: Exception) -> str:
    """The converter's message without the C++ location and assertion text it starts with
    ("convert.cc:101: convert_graph: Assertion `...` failed: ...")."""
    text = str(exc).strip()
    text = re.sub(r"^\S+:\d+: \w+: ", "", text)
    text = re.sub(r"^Assertion `.*?` failed: ", "", text, flags=re.S)
    return text or type(exc).__name__
