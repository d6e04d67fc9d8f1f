"""Fuzzing the ONNX importer: mutated models end in a clear `OnnxImportError` or a valid
graph, never in another exception (a traceback on the command line).

The inputs start from real small models: the trained digits CNN (a torch export), the
zoo's small CNN exported at opsets 13 and 7 (attributes where later opsets have inputs),
and a hand-written model with the shape computation torch writes for
``x.view(x.size(0), -1)`` plus Pad, Clip, Gemm, Softmax and Dropout. Two kinds of
mutation:

* bytes: flips, truncation, insertions and deletions in the serialized model;
* fields, through the protobuf API: input shapes and element types, initializer shapes,
  types and data, attributes (values, types, dropped, added), op types, domains and
  opsets, dropped or reordered nodes and initializers, renamed inputs and outputs, and
  inserted nodes reading existing tensors.

An error must be an `OnnxImportError` whose message says where (the node, the file, the
graph input or output); a graph must be valid and run on the float reference with the
output shapes its tensors declare. Hypothesis draws the mutations (derandomized: the same
inputs on every run) and shrinks a failure to a minimal one.
"""

from __future__ import annotations

import functools
import re
import warnings

import numpy as np
import onnx
import pytest
from hypothesis import given, strategies as st
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from fuzzing import count, fuzz_settings
from vdla.compiler.frontend import zoo
from vdla.compiler.frontend.onnx_export import to_onnx
from vdla.compiler.frontend.onnx_import import OnnxImportError, from_onnx, supported_ops
from vdla.compiler.reference import run_reference

TARGET = "onnx importer"
#: Inputs per test: 1-3 ms each, so both tests take about 5 s.
FIELD_EXAMPLES, BYTE_EXAMPLES = 1000, 500
#: Graphs with more values than this are imported but not run on the reference.
MAX_RUN_ELEMENTS = 1 << 20
#: Where an error says it happened: a node, the file (bytes here), a graph input or
#: output, an initializer or the opset.
WHERE = re.compile(r"node '[^']*' \(#\d+, [^)]*\)|'the given bytes'|graph (input|output) '"
                   r"|initializer '|input_shapes")


def _shape_chain_model() -> bytes:
    """A small opset-13 model: conv, pool, the Shape/Gather/Unsqueeze/Concat/Reshape
    chain of a torch ``view``, Pad, Clip, Gemm, Softmax, Dropout."""
    rng = np.random.default_rng(0)

    def init(name, value):
        return numpy_helper.from_array(np.asarray(value), name)

    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1],
                         kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Pad", ["p", "pads", "zero"], ["padded"], name="pad"),
        helper.make_node("Clip", ["padded", "lo", "hi"], ["clipped"], name="clip"),
        helper.make_node("Shape", ["clipped"], ["shape"], name="shape"),
        helper.make_node("Constant", [], ["zero_index"], name="index",
                         value=numpy_helper.from_array(np.array(0, np.int64))),
        helper.make_node("Gather", ["shape", "zero_index"], ["batch"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch1"], name="unsqueeze"),
        helper.make_node("Concat", ["batch1", "minus_one"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["clipped", "target"], ["flat"], name="reshape"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
        helper.make_node("Dropout", ["probs"], ["y"], name="dropout"),
    ]
    inits = [init("w", rng.standard_normal((8, 4, 3, 3)).astype(np.float32)),
             init("b", rng.standard_normal(8).astype(np.float32)),
             init("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)),
             init("zero", np.array(0.0, np.float32)),
             init("lo", np.array(-1.0, np.float32)), init("hi", np.array(1.0, np.float32)),
             init("axes", np.array([0], np.int64)),
             init("minus_one", np.array([-1], np.int64)),
             init("fc_w", rng.standard_normal((5, 8 * 5 * 5)).astype(np.float32)),
             init("fc_b", rng.standard_normal(5).astype(np.float32))]
    graph = helper.make_graph(
        nodes, "shape_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             ["N", 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


@functools.cache
def seeds() -> dict[str, bytes]:
    """The serialized models the mutations start from."""
    small = zoo.get("small_cnn")
    return {"digits_cnn": zoo.DIGITS_MODEL.read_bytes(),
            "small_cnn": to_onnx(small).SerializeToString(),
            "small_cnn opset 7": to_onnx(small, opset=7).SerializeToString(),
            "shape_chain": _shape_chain_model()}


def check_import(data: bytes):
    """Feed `data` to the importer (counted); the graph, or None after a clear error.
    Any other exception fails the test."""
    count(TARGET)
    try:
        with warnings.catch_warnings():
            # numpy's warnings on mutated constants (a sqrt of a negative, a complex
            # shape) are no errors; the outcome is what is checked.
            warnings.simplefilter("ignore", RuntimeWarning)
            graph = from_onnx(data)
    except OnnxImportError as exc:
        message = str(exc)
        assert WHERE.search(message), f"the error does not say where: {message}"
        return None
    # A model: valid, and it runs with the shapes it declares.
    graph.validate()
    assert graph.outputs and all(min(graph.tensors[i].shape, default=1) >= 1
                                 for i in graph.inputs)
    # Names are text (protobuf hands over a string that is not UTF-8 as bytes).
    assert all(isinstance(name, str) for name in graph.tensors)
    assert all(isinstance(node.name, str) for node in graph.nodes())
    sizes = sum(int(np.prod(t.shape)) for t in graph.tensors.values())
    if sizes <= MAX_RUN_ELEMENTS:
        rng = np.random.default_rng(0)
        feed = {name: rng.standard_normal(graph.tensors[name].shape).astype(
            graph.tensors[name].dtype) for name in graph.inputs}
        with np.errstate(all="ignore"):      # mutated weights may overflow: not a bug
            out = run_reference(graph, feed)
        for name in graph.outputs:
            assert out[name].shape == tuple(graph.tensors[name].shape), name
    return graph


def test_the_seed_models_import_and_an_empty_file_does_not():
    for name, data in seeds().items():
        assert check_import(data) is not None, name
    assert check_import(b"") is None


# --- what fuzzing found ---------------------------------------------------------------------

def _model(nodes, inits=(), *, opset=13, elem_type=TensorProto.FLOAT, outputs=("y",)):
    """A model of `nodes` over input x (1, 2, 4, 4) and initializers `inits` (name ->
    array or TensorProto)."""
    tensors = [t if isinstance(t, TensorProto) else numpy_helper.from_array(np.asarray(t), n)
               for n, t in dict(inits).items()]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", elem_type, [1, 2, 4, 4])], [helper.make_tensor_value_info(
            o, TensorProto.FLOAT, None) for o in outputs], tensors)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _bad_initializer():
    t = numpy_helper.from_array(np.ones(2, np.float32), "c")
    t.data_type = 29                               # no such element type
    return _model([helper.make_node("Add", ["x", "c"], ["y"])], {"c": t})


def _non_utf8_name():
    data = bytearray(_model([helper.make_node("Relu", ["x"], ["y"], name="relu")])
                     .SerializeToString())
    data[data.find(b"relu") + 1] = 0xdc            # "r\xdclu": protobuf hands over bytes
    return bytes(data)


W = np.ones((3, 2, 1, 1), np.float32)

#: Models that raised something other than OnnxImportError before (IndexError,
#: TypeError, KeyError, AttributeError, RuntimeError, a numpy ValueError naming nothing,
#: or a multi-gigabyte allocation), and what the error says now.
FOUND = {
    "a required input missing": (
        _model([helper.make_node("Conv", ["x"], ["y"], name="conv")]),
        r"node 'conv' \(#0, Conv\): has 1 input\(s\); Conv-11 takes at least 2"),
    "a required input empty": (
        _model([helper.make_node("Gemm", ["x", ""], ["y"], name="fc")]),
        r"node 'fc' .*required input 1 \(B\) of Gemm-13 is missing"),
    "no output": (
        _model([helper.make_node("Relu", ["x"], [], name="relu")], outputs=("x",)),
        r"node 'relu' .*required output 0 \(Y\) of Relu-\d+ is missing"),
    "an attribute of the wrong type": (
        _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", dilations=1.0)],
               {"w": W}),
        r"node 'conv' .*attribute 'dilations' is FLOAT; Conv-11 takes INTS"),
    "an attribute of another opset": (
        _model([helper.make_node("BatchNormalization", ["x", "s", "s", "s", "s"], ["y"],
                                 name="bn", training_mode=[1, 2])],   # BN-14's, as INTS
               {"s": np.ones(2, np.float32)}),
        r"node 'bn' .*cannot import it \(TypeError: int\(\) argument"),
    "an undefined input element type": (
        _model([helper.make_node("Relu", ["x"], ["y"])], elem_type=0),
        r"graph input 'x' has element type 0 \(not an ONNX element type\); vdla imports"),
    "an undefined initializer element type": (
        _bad_initializer(), r"cannot read initializer 'c' of 'the given bytes'"),
    "a name that is not UTF-8": (
        _non_utf8_name(), r"model.graph.node\[0\].name is not UTF-8 text"),
    "a NaN in a reshape target": (
        _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="r")],
               {"s": np.array([np.nan, 1.0])}),
        r"node 'r' .*cannot import it \(ValueError: cannot convert float NaN"),
    "a folded tensor of 64 dimensions": (
        _model([helper.make_node("Expand", ["c", "s"], ["e"], name="expand"),
                helper.make_node("Add", ["x", "e"], ["y"])],
               {"c": np.ones(1, np.float32), "s": np.ones(64, np.int64)}),
        r"node 'expand' .*cannot evaluate it on its constant inputs"),
    "a folded tensor of 10^12 elements": (
        _model([helper.make_node("ConstantOfShape", ["s"], ["e"], name="fill"),
                helper.make_node("Add", ["x", "e"], ["y"])],
               {"s": np.array([10**6, 10**6], np.int64)}),
        r"node 'fill' .*tensor of shape \(1000000, 1000000\), more than the"),
    "a ConstantOfShape value that is no tensor": (
        _model([helper.make_node("ConstantOfShape", ["s"], ["e"], name="fill", value=2.0),
                helper.make_node("Add", ["x", "e"], ["y"])],
               {"s": np.array([4], np.int64)}, opset=8),
        None),                                    # opset 8 has no ConstantOfShape: a model
    # A constant output of another dtype than float32: bool is one of the graph IR's
    # dtypes (transformers' masks), so it imports.
    "a constant bool output": (
        _model([helper.make_node("Equal", ["a", "a"], ["y"])], {"a": np.ones(2, np.int64)}),
        None),
    "a reduction over one axis named twice": (
        _model([helper.make_node("ReduceMean", ["a"], ["y"], axes=[0, 0])],
               {"a": np.ones(3, np.float32)}),
        r"axes \[0, 0\] must be distinct axes of a rank-1 input"),
}


@pytest.mark.parametrize("name", FOUND)
def test_what_fuzzing_found_is_a_clear_error(name):
    model, message = FOUND[name]
    data = model if isinstance(model, bytes) else model.SerializeToString()
    if message is None:
        assert check_import(data) is not None
        return
    with pytest.raises(OnnxImportError, match=message):
        from_onnx(data)
    check_import(data)


# --- byte mutations ------------------------------------------------------------------------

@fuzz_settings(examples=BYTE_EXAMPLES)
@given(st.data())
def test_mutated_bytes(data):
    name = data.draw(st.sampled_from(sorted(seeds())), label="seed")
    blob = bytearray(seeds()[name])
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        at = data.draw(st.integers(0, max(len(blob) - 1, 0)), label="offset")
        kind = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete"]),
                         label="kind")
        if kind == "flip" and blob:
            blob[at] ^= data.draw(st.integers(1, 255), label="xor")
        elif kind == "truncate":
            del blob[at:]
        elif kind == "insert":
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=16), label="bytes")
        else:
            del blob[at:at + data.draw(st.integers(1, 64), label="length")]
    check_import(bytes(blob))


# --- field mutations -----------------------------------------------------------------------

#: Integers a mutation writes: small ones (the interesting boundaries) and extremes.
INTS = st.one_of(st.integers(-3, 9), st.integers(-(1 << 63), (1 << 63) - 1))
NAMES = st.text(alphabet="abcxyz_.:/0123456789", max_size=8)
#: Attribute names the converters and folders read.
ATTR_NAMES = ("kernel_shape", "strides", "pads", "dilations", "group", "auto_pad", "axis",
              "axes", "perm", "transA", "transB", "alpha", "beta", "epsilon", "keepdims",
              "to", "value", "mode", "shape", "allowzero", "training_mode", "ceil_mode",
              "count_include_pad", "storage_order", "start", "end", "size", "min", "max",
              "spatial", "noop_with_empty_axes", "value_ints", "value_float")
OP_TYPES = tuple(supported_ops()) + ("LSTM", "Foo", "")


def _index(data, seq, label) -> int | None:
    return data.draw(st.integers(0, len(seq) - 1), label=label) if len(seq) else None


def _tensor_names(model) -> list[str]:
    g = model.graph
    return sorted({i.name for i in g.input} | {t.name for t in g.initializer}
                  | {o for n in g.node for o in n.output})


def _attribute(data, name: str) -> AttributeProto:
    """An attribute `name` of a random type and value (a mismatched type included)."""
    kind = data.draw(st.sampled_from(["int", "ints", "float", "floats", "string", "tensor",
                                      "bad type"]), label="attribute kind")
    if kind == "int":
        return helper.make_attribute(name, data.draw(INTS, label="int"))
    if kind == "ints":
        return helper.make_attribute(name, data.draw(st.lists(INTS, max_size=6), label="ints"),
                                     attr_type=AttributeProto.INTS)
    if kind == "float":
        return helper.make_attribute(name, data.draw(st.floats(width=32), label="float"))
    if kind == "floats":
        return helper.make_attribute(name, data.draw(st.lists(st.floats(width=32),
                                                              max_size=4), label="floats"),
                                     attr_type=AttributeProto.FLOATS)
    if kind == "string":
        return helper.make_attribute(name, data.draw(st.sampled_from(
            ["NOTSET", "VALID", "SAME_UPPER", "constant", "reflect", "", "\xff"]), label="s"))
    if kind == "tensor":
        value = data.draw(st.lists(INTS, max_size=4), label="tensor")
        return helper.make_attribute(name, numpy_helper.from_array(
            np.array(value, np.int64) if value else np.zeros(0, np.float32)))
    attr = helper.make_attribute(name, 1)
    attr.type = data.draw(st.integers(0, 14), label="type")    # a type without its payload
    return attr


def _mutate_input(model, data):
    inputs = [i for i in model.graph.input
              if i.name not in {t.name for t in model.graph.initializer}]
    if not inputs:
        return
    value = inputs[_index(data, inputs, "input")]
    ttype = value.type.tensor_type
    what = data.draw(st.sampled_from(["dim", "dim_param", "add dim", "drop dim", "no shape",
                                      "elem_type"]), label="input change")
    dims = ttype.shape.dim
    if what == "elem_type":
        ttype.elem_type = data.draw(st.integers(0, 30), label="elem_type")
    elif what == "no shape":
        ttype.ClearField("shape")
    elif what == "add dim":
        dims.add().dim_value = data.draw(INTS, label="dim")
    elif len(dims):
        k = _index(data, dims, "dim index")
        if what == "dim":
            dims[k].dim_value = data.draw(INTS, label="dim")
        elif what == "dim_param":
            dims[k].dim_param = data.draw(NAMES, label="dim_param")
        else:
            del dims[k]


def _mutate_initializer(model, data):
    inits = model.graph.initializer
    t = inits[_index(data, inits, "initializer")]
    what = data.draw(st.sampled_from(["dims", "data_type", "truncate", "data", "drop",
                                      "rename"]), label="initializer change")
    if what == "dims":
        del t.dims[:]
        t.dims.extend(data.draw(st.lists(st.one_of(st.integers(0, 8), INTS), max_size=4),
                                label="dims"))
    elif what == "data_type":
        t.data_type = data.draw(st.integers(0, 30), label="data_type")
    elif what == "truncate":
        t.raw_data = t.raw_data[:data.draw(st.integers(0, max(len(t.raw_data) - 1, 0)),
                                           label="length")]
    elif what == "data":
        t.raw_data = data.draw(st.binary(max_size=64), label="raw_data")
    elif what == "drop":
        inits.remove(t)
    else:
        t.name = data.draw(st.sampled_from(_tensor_names(model) + ["", "new"]), label="name")


def _mutate_node(model, data):
    nodes = model.graph.node
    node = nodes[_index(data, nodes, "node")]
    what = data.draw(st.sampled_from(["attribute", "drop attribute", "add attribute",
                                      "op_type", "domain", "input", "output", "drop",
                                      "move", "drop input"]), label="node change")
    names = _tensor_names(model)
    if what == "attribute" and len(node.attribute):
        k = _index(data, node.attribute, "attribute")
        node.attribute[k].CopyFrom(_attribute(data, node.attribute[k].name))
    elif what == "drop attribute" and len(node.attribute):
        del node.attribute[_index(data, node.attribute, "attribute")]
    elif what == "add attribute":
        node.attribute.append(_attribute(data, data.draw(st.sampled_from(ATTR_NAMES),
                                                         label="attribute name")))
    elif what == "op_type":
        node.op_type = data.draw(st.sampled_from(OP_TYPES), label="op_type")
    elif what == "domain":
        node.domain = data.draw(st.sampled_from(["ai.onnx", "com.microsoft", "x"]),
                                label="domain")
    elif what == "input" and len(node.input):
        node.input[_index(data, node.input, "input index")] = data.draw(
            st.sampled_from(names + ["", "missing"]), label="input name")
    elif what == "output" and len(node.output):
        node.output[_index(data, node.output, "output index")] = data.draw(
            st.sampled_from(names + ["", "fresh"]), label="output name")
    elif what == "drop":
        nodes.remove(node)
    elif what == "move":
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        nodes.remove(node)
        nodes.insert(data.draw(st.integers(0, len(nodes)), label="position"), copy)
    elif what == "drop input" and len(node.input):
        del node.input[_index(data, node.input, "input index")]


def _insert_node(model, data):
    """A new node of a supported op reading existing tensors (shape computations on
    odd shapes, ops on the wrong ranks)."""
    names = _tensor_names(model)
    if not names:
        return
    op = data.draw(st.sampled_from(supported_ops()), label="new op")
    inputs = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3),
                       label="new inputs")
    attrs = [_attribute(data, name) for name in data.draw(
        st.lists(st.sampled_from(ATTR_NAMES), max_size=2, unique=True), label="new attrs")]
    node = helper.make_node(op, inputs, [f"fuzz_{len(model.graph.node)}"], name="fuzz")
    node.attribute.extend(attrs)
    position = data.draw(st.integers(0, len(model.graph.node)), label="position")
    model.graph.node.insert(position, node)
    if data.draw(st.booleans(), label="as output"):
        model.graph.output.add().name = node.output[0]


def _mutate_graph(model, data):
    what = data.draw(st.sampled_from(["opset", "opset domain", "drop output",
                                      "rename output", "add output", "drop input",
                                      "rename input"]),
                     label="graph change")
    g = model.graph
    if what == "opset":
        model.opset_import[0].version = data.draw(st.integers(-1, 30), label="opset")
    elif what == "opset domain":
        model.opset_import[0].domain = data.draw(st.sampled_from(["ai.onnx", "x"]),
                                                 label="domain")
    elif what == "drop output" and len(g.output):
        del g.output[_index(data, g.output, "output")]
    elif what == "rename output" and len(g.output):
        g.output[_index(data, g.output, "output")].name = data.draw(
            st.sampled_from(_tensor_names(model) + ["", "missing"]), label="name")
    elif what == "add output" and _tensor_names(model):
        g.output.add().name = data.draw(st.sampled_from(_tensor_names(model)), label="name")
    elif what == "drop input" and len(g.input):
        del g.input[_index(data, g.input, "input")]
    elif what == "rename input" and len(g.input):
        g.input[_index(data, g.input, "input")].name = data.draw(
            st.sampled_from(_tensor_names(model) + ["", "renamed"]), label="name")


MUTATIONS = {"input": _mutate_input, "initializer": _mutate_initializer,
             "node": _mutate_node, "insert node": _insert_node, "graph": _mutate_graph}


@fuzz_settings(examples=FIELD_EXAMPLES)
@given(st.data())
def test_mutated_fields(data):
    model = onnx.ModelProto()
    model.ParseFromString(seeds()[data.draw(st.sampled_from(sorted(seeds())), label="seed")])
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        kind = data.draw(st.sampled_from(sorted(MUTATIONS)), label="mutation")
        if kind == "input" and not len(model.graph.input):
            continue
        if kind == "initializer" and not len(model.graph.initializer):
            continue
        if kind == "node" and not len(model.graph.node):
            continue
        MUTATIONS[kind](model, data)
    check_import(model.SerializeToString())
