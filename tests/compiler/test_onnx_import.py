"""ONNX import: one small model per operator and opset variant, run by the numpy reference
and by onnxruntime; and the importer's errors for bad files and unsupported models."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vdla.compiler import GraphError, run_reference
from vdla.compiler.frontend.onnx_import import OnnxImportError, from_onnx, supported_ops

RNG = np.random.default_rng(1234)


def rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def make_model(nodes, inputs: dict, outputs, *, inits: dict | None = None, opset=13,
               input_types: dict | None = None, check: bool = True):
    """A model of `nodes` with float inputs {name: shape}, outputs (a list of names whose
    shapes ONNX shape inference fills in, or {name: shape}) and initializers {name: array},
    in opset `opset`. With `check`, the model must pass onnx's checker; without, it is
    left as built (for models that are meant to be refused)."""
    graph = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(n, (input_types or {}).get(n, TensorProto.FLOAT), s)
         for n, s in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT,
                                       outputs[o] if isinstance(outputs, dict) else None)
         for o in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in (inits or {}).items()])
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="vdla-tests")
    # onnxruntime reads IR versions <= 13; onnx 1.23 writes 14.
    model.ir_version = max(8, helper.find_min_ir_version_for(opsets))
    if check:
        # The checker wants every graph output's shape: shape inference writes them.
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        onnx.checker.check_model(model)
    return model


def ort_run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check(model, feeds, **import_args):
    """Import `model`, run it on `feeds` with run_reference and onnxruntime, compare every
    output; returns the graph."""
    graph = from_onnx(model, **import_args)
    expected = ort_run(model, feeds)
    ours = run_reference(graph, feeds)
    assert len(graph.outputs) == len(expected)
    for name, want in zip(graph.outputs, expected):
        got = ours[name]
        assert got.shape == want.shape, (name, got.shape, want.shape)
        assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max()), name
    return graph


def single(op, attrs=None, *, x=(1, 4, 8, 8), inits=None, extra_inputs=(), opset=13,
           n_outputs=1, check=True):
    """A model of one node `op` over input x (plus initializer/empty inputs)."""
    node = helper.make_node(op, ["x", *extra_inputs], [f"y{i}" for i in range(n_outputs)],
                            name=f"the_{op.lower()}", **(attrs or {}))
    return make_model([node], {"x": x}, [f"y{i}" for i in range(n_outputs)], inits=inits,
                      opset=opset, check=check)


# --- per-operator comparisons with onnxruntime ----------------------------------------------

@pytest.mark.parametrize("attrs, w_shape, bias", [
    (dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), (6, 4, 3, 3), True),
    (dict(strides=[2, 2], pads=[0, 1, 2, 1], dilations=[2, 1]), (6, 4, 3, 3), False),
    (dict(group=2, strides=[1, 2], pads=[1, 0, 1, 0]), (6, 2, 3, 2), True),
    (dict(group=4), (4, 1, 3, 3), True),                               # depthwise
    (dict(auto_pad="SAME_UPPER", strides=[2, 2]), (5, 4, 4, 4), True),
    (dict(auto_pad="SAME_LOWER", strides=[2, 2]), (5, 4, 3, 4), False),
    (dict(auto_pad="VALID", strides=[3, 3]), (5, 4, 3, 3), True),
])
def test_conv(attrs, w_shape, bias):
    inits = {"w": rand(*w_shape)}
    if bias:
        inits["b"] = rand(w_shape[0])
    model = single("Conv", attrs, x=(2, 4, 9, 8), inits=inits,
                   extra_inputs=["w", "b"] if bias else ["w"])
    graph = check(model, {"x": rand(2, 4, 9, 8)})
    assert graph.count_ops() == {"conv2d": 1}


def test_conv_same_padding_with_dilations():
    # onnxruntime refuses auto_pad SAME with dilations: compare with the explicit pads
    # SAME_UPPER means (span 5 over 9x8 at stride 1: 4 pixels in all, 2 on each side).
    w = rand(3, 4, 3, 3)
    x = rand(1, 4, 9, 8)
    same = single("Conv", dict(auto_pad="SAME_UPPER", dilations=[2, 2]), x=(1, 4, 9, 8),
                  inits={"w": w}, extra_inputs=["w"])
    explicit = single("Conv", dict(pads=[2, 2, 2, 2], dilations=[2, 2]), x=(1, 4, 9, 8),
                      inits={"w": w}, extra_inputs=["w"])
    graph = from_onnx(same)
    assert graph.nodes()[0].attrs["pads"] == (2, 2, 2, 2)
    got = run_reference(graph, {"x": x})["y0"]
    want = ort_run(explicit, {"x": x})[0]
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


def test_conv_with_computed_weights_and_metadata():
    # Weights that are a graph input, not an initializer, still import as conv2d.
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    model = make_model([node], {"x": (1, 3, 6, 6), "w": (2, 3, 3, 3)}, ["y"], opset=11)
    graph = check(model, {"x": rand(1, 3, 6, 6), "w": rand(2, 3, 3, 3)})
    assert graph.inputs == ["x", "w"] and graph.outputs == ["y"]
    assert graph.metadata["onnx"]["opset"] == 11
    assert graph.metadata["onnx"]["producer"] == "vdla-tests"


@pytest.mark.parametrize("opset, attrs", [(9, {}), (14, {"training_mode": 0}), (15, {})])
def test_batch_norm(opset, attrs):
    c = 4
    inits = {"s": rand(c), "b": rand(c), "m": rand(c), "v": np.abs(rand(c)) + 0.5}
    model = single("BatchNormalization", dict(epsilon=1e-3, **attrs), inits=inits,
                   extra_inputs=["s", "b", "m", "v"], opset=opset)
    graph = check(model, {"x": rand(1, 4, 8, 8)})
    assert graph.count_ops() == {"batch_norm": 1}
    assert graph.nodes()[0].attrs["epsilon"] == pytest.approx(1e-3)


def test_relu_identity_and_output_names():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Identity", ["r"], ["out"])]
    model = make_model(nodes, {"x": (2, 3)}, ["out"])
    graph = check(model, {"x": rand(2, 3)})
    # The Identity disappears and the graph output keeps the model's name.
    assert graph.count_ops() == {"relu": 1} and graph.outputs == ["out"]


@pytest.mark.parametrize("opset, attrs, bounds", [
    (7, dict(min=0.0, max=6.0), ()),                     # attributes before opset 11
    (7, dict(max=0.5), ()),
    (11, {}, ("lo",)),                                   # optional inputs from opset 11
    (13, {}, ("lo", "hi")),
    (13, {}, ("", "hi")),
    (13, {}, ()),
])
def test_clip(opset, attrs, bounds):
    inits = {k: np.float32(v) for k, v in (("lo", -0.3), ("hi", 0.7)) if k in bounds}
    model = single("Clip", attrs, x=(2, 5), inits=inits, extra_inputs=bounds, opset=opset)
    graph = check(model, {"x": rand(2, 5)})
    node = graph.nodes()[0]
    assert node.op == "clip"
    if opset == 13 and bounds == ("", "hi"):
        assert node.attrs["min"] is None and node.attrs["max"] == pytest.approx(0.7)


@pytest.mark.parametrize("op, other", [
    ("Add", rand(4, 1, 1)), ("Mul", rand(4, 1, 1)), ("Add", np.float32(2.5)),
    ("Mul", rand(8)), ("Add", None), ("Mul", None),
])
def test_add_mul_broadcast(op, other):
    x = (2, 4, 3, 8)
    if other is None:                       # two activations, the second broadcast
        node = helper.make_node(op, ["x", "z"], ["y"])
        model = make_model([node], {"x": x, "z": (1, 4, 1, 8)}, ["y"])
        graph = check(model, {"x": rand(*x), "z": rand(1, 4, 1, 8)})
    else:
        model = single(op, x=x, inits={"c": other}, extra_inputs=["c"])
        graph = check(model, {"x": rand(*x)})
        const = graph.nodes()[0].inputs[1]
        assert graph.tensors[const].is_constant
    assert graph.count_ops() == {op.lower(): 1}


def test_sum_becomes_a_chain_of_adds():
    node = helper.make_node("Sum", ["a", "b", "c"], ["y"])
    model = make_model([node], {"a": (2, 3), "b": (2, 3), "c": (1, 3)}, ["y"])
    graph = check(model, {"a": rand(2, 3), "b": rand(2, 3), "c": rand(1, 3)})
    assert graph.count_ops() == {"add": 2}


@pytest.mark.parametrize("op, opset, attrs", [
    ("MaxPool", 7, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", 10, dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("MaxPool", 12, dict(kernel_shape=[2, 3], strides=[2, 1], pads=[0, 1, 1, 0], ceil_mode=1)),
    ("MaxPool", 13, dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2])),
    ("AveragePool", 7, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", 7, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                            count_include_pad=1)),
    ("AveragePool", 10, dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("AveragePool", 19, dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1],
                             ceil_mode=1, count_include_pad=1)),
    ("AveragePool", 11, dict(kernel_shape=[2, 2], auto_pad="SAME_LOWER", strides=[2, 2])),
])
def test_pools(op, opset, attrs):
    model = single(op, attrs, x=(1, 3, 9, 10), opset=opset)
    graph = check(model, {"x": rand(1, 3, 9, 10)})
    assert graph.count_ops() == {"max_pool2d" if op == "MaxPool" else "avg_pool2d": 1}


def test_global_average_pool():
    graph = check(single("GlobalAveragePool", x=(2, 3, 5, 7)), {"x": rand(2, 3, 5, 7)})
    assert graph.count_ops() == {"global_avg_pool2d": 1}


@pytest.mark.parametrize("opset, axes, keepdims", [
    (13, [2, 3], 1), (13, [-1, -2], 0), (18, [2, 3], 1), (18, [3, 2], 0), (21, [-2, -1], 1),
])
def test_reduce_mean_over_spatial_axes(opset, axes, keepdims):
    if opset < 18:
        model = single("ReduceMean", dict(axes=axes, keepdims=keepdims), x=(2, 3, 4, 5),
                       opset=opset)
    else:
        model = single("ReduceMean", dict(keepdims=keepdims), x=(2, 3, 4, 5), opset=opset,
                       inits={"axes": np.array(axes, np.int64)}, extra_inputs=["axes"])
    graph = check(model, {"x": rand(2, 3, 4, 5)})
    expect = {"global_avg_pool2d": 1} if keepdims else {"global_avg_pool2d": 1, "reshape": 1}
    assert graph.count_ops() == expect


@pytest.mark.parametrize("opset, attrs, b_shape, c_shape", [
    (13, dict(transB=1), (5, 6), (5,)),
    (9, dict(), (6, 5), (5,)),
    (13, dict(alpha=0.5, beta=2.0, transB=1), (5, 6), (1, 5)),
    (13, dict(transA=1), (6, 5), (5,)),
    (13, dict(alpha=1.5, beta=0.5), (6, 5), (3, 5)),     # per-row C: dense, then add
    (13, dict(beta=3.0), (6, 5), ()),                    # scalar C
    (13, dict(transB=1), (5, 6), None),
    (11, dict(alpha=2.0, transA=1, transB=1), (5, 6), (3, 1)),
])
def test_gemm_with_constant_b(opset, attrs, b_shape, c_shape):
    a_shape = (6, 3) if attrs.get("transA") else (3, 6)
    inits = {"B": rand(*b_shape)}
    extra = ["B"]
    if c_shape is not None:
        inits["C"] = rand(*c_shape)
        extra.append("C")
    model = single("Gemm", attrs, x=a_shape, inits=inits, extra_inputs=extra, opset=opset)
    graph = check(model, {"x": rand(*a_shape)})
    assert graph.count_ops()["dense"] == 1 and "matmul" not in graph.count_ops()


@pytest.mark.parametrize("attrs, c_input", [
    (dict(alpha=0.5, beta=2.0, transA=1, transB=1), "const"),
    (dict(), None),
    (dict(beta=0.5), "input"),
])
def test_gemm_with_computed_b(attrs, c_input):
    a_shape = (4, 3) if attrs.get("transA") else (3, 4)
    b_shape = (5, 4) if attrs.get("transB") else (4, 5)
    inputs = {"a": a_shape, "b": b_shape}
    names, inits = ["a", "b"], {}
    if c_input == "const":
        inits["c"] = rand(5)
        names.append("c")
    elif c_input == "input":
        inputs["c"] = (3, 5)
        names.append("c")
    model = make_model([helper.make_node("Gemm", names, ["y"], **attrs)], inputs, ["y"],
                       inits=inits)
    feeds = {n: rand(*s) for n, s in inputs.items()}
    graph = check(model, feeds)
    assert graph.count_ops()["matmul"] == 1 and "dense" not in graph.count_ops()


def test_matmul():
    model = single("MatMul", x=(3, 6), inits={"w": rand(6, 4)}, extra_inputs=["w"])
    graph = check(model, {"x": rand(3, 6)})
    assert graph.count_ops() == {"dense": 1}
    w = graph.tensors[graph.nodes()[0].inputs[1]]
    assert w.shape == (4, 6)                    # dense keeps the weights as (out, in)
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    model = make_model([node], {"a": (2, 3, 4), "b": (4, 5)}, ["y"])
    graph = check(model, {"a": rand(2, 3, 4), "b": rand(4, 5)})
    assert graph.count_ops() == {"matmul": 1}


@pytest.mark.parametrize("opset, axis", [(9, 1), (9, 2), (13, -1), (13, 0)])
def test_flatten(opset, axis):
    graph = check(single("Flatten", dict(axis=axis), x=(2, 3, 4, 5), opset=opset),
                  {"x": rand(2, 3, 4, 5)})
    assert graph.count_ops() == {"flatten": 1}


@pytest.mark.parametrize("opset, shape, attrs", [
    (9, [0, -1], {}), (13, [2, 0, -1, 1], {}), (14, [2, 3, 20], dict(allowzero=1)),
    (14, [-1, 4, 5], {}),
])
def test_reshape(opset, shape, attrs):
    model = single("Reshape", attrs, x=(2, 3, 4, 5), opset=opset,
                   inits={"shape": np.array(shape, np.int64)}, extra_inputs=["shape"])
    graph = check(model, {"x": rand(2, 3, 4, 5)})
    node = graph.nodes()[0]
    assert node.op == "reshape" and -1 not in node.attrs["shape"] and 0 not in node.attrs["shape"]


def test_transpose():
    graph = check(single("Transpose", dict(perm=[0, 2, 3, 1]), x=(1, 2, 3, 4)),
                  {"x": rand(1, 2, 3, 4)})
    assert graph.count_ops() == {"transpose": 1}


def test_concat_with_a_constant_operand():
    node = helper.make_node("Concat", ["x", "c", "z"], ["y"], axis=1)
    model = make_model([node], {"x": (1, 2, 3, 3), "z": (1, 4, 3, 3)}, ["y"],
                       inits={"c": rand(1, 3, 3, 3)})
    graph = check(model, {"x": rand(1, 2, 3, 3), "z": rand(1, 4, 3, 3)})
    assert graph.count_ops() == {"concat": 1}


@pytest.mark.parametrize("opset, attrs, shape", [
    (11, {}, (3, 7)),                          # default axis 1 of a 2-D input
    (11, dict(axis=1), (2, 7, 1, 1)),          # the flattened axes are 7, 1, 1
    (9, dict(axis=-1), (2, 3, 4)),
    (13, {}, (2, 3, 4)),                       # opset 13: the last axis
    (13, dict(axis=1), (2, 3, 4)),
])
def test_softmax(opset, attrs, shape):
    graph = check(single("Softmax", attrs, x=shape, opset=opset), {"x": rand(*shape)})
    assert graph.count_ops() == {"softmax": 1}


def test_softmax_before_opset_13_over_several_axes_is_refused():
    with pytest.raises(OnnxImportError, match=r"the_softmax.*axis=1.*\(2, 3, 4\)"):
        from_onnx(single("Softmax", dict(axis=1), x=(2, 3, 4), opset=11))


@pytest.mark.parametrize("opset", [10, 13])
def test_dropout_disappears(opset):
    if opset < 12:
        dropout = helper.make_node("Dropout", ["r"], ["d"], ratio=0.3)
    else:
        dropout = helper.make_node("Dropout", ["r", "ratio"], ["d"])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), dropout,
             helper.make_node("Relu", ["d"], ["y"])]
    model = make_model(nodes, {"x": (2, 5)}, ["y"], opset=opset,
                       inits={"ratio": np.float32(0.3)} if opset >= 12 else None)
    graph = check(model, {"x": rand(2, 5)})
    assert graph.count_ops() == {"relu": 2}


def test_constants_feed_layers():
    nodes = [
        helper.make_node("Constant", [], ["c1"], value=numpy_helper.from_array(rand(3, 1, 1))),
        helper.make_node("Constant", [], ["c2"], value_float=0.5),
        helper.make_node("Constant", [], ["c3"], value_floats=[1.0, 2.0, 3.0, 4.0]),
        helper.make_node("Constant", [], ["dims"], value_ints=[1, 3, 1, 4]),
        helper.make_node("ConstantOfShape", ["dims"], ["c4"],
                         value=numpy_helper.from_array(np.array([0.25], np.float32))),
        helper.make_node("Add", ["x", "c1"], ["a"]),
        helper.make_node("Mul", ["a", "c2"], ["b"]),
        helper.make_node("Add", ["b", "c3"], ["c"]),
        helper.make_node("Add", ["c", "c4"], ["y"]),
    ]
    model = make_model(nodes, {"x": (1, 3, 2, 4)}, ["y"])
    graph = check(model, {"x": rand(1, 3, 2, 4)})
    assert graph.count_ops() == {"add": 3, "mul": 1}


@pytest.mark.parametrize("opset, pads, value, axes", [
    (7, [0, 0, 1, 2, 0, 0, 2, 1], 0.0, None),
    (10, [0, 1, 0, 1, 0, 0, 1, 0], 1.5, None),
    (11, [0, 0, 1, 1, 0, 0, 1, 1], None, None),
    (13, [0, 0, 2, 0, 0, 0, 0, 3], -2.0, None),
    (18, [1, 2, 3, 0], 0.5, [2, -1]),
])
def test_pad(opset, pads, value, axes):
    if opset < 11:
        model = single("Pad", dict(pads=pads, value=value), x=(1, 2, 3, 4), opset=opset)
    else:
        inits = {"pads": np.array(pads, np.int64)}
        extra = ["pads"]
        if value is not None:
            inits["v"] = np.float32(value)
            extra.append("v")
        if axes is not None:
            inits["axes"] = np.array(axes, np.int64)
            extra = ["pads", "v" if value is not None else "", "axes"]
        model = single("Pad", x=(1, 2, 3, 4), opset=opset, inits=inits, extra_inputs=extra)
    graph = check(model, {"x": rand(1, 2, 3, 4)})
    assert graph.count_ops() == {"pad": 1}


@pytest.mark.parametrize("attrs", [dict(size=3), dict(size=5, alpha=1e-3, beta=0.5, bias=2.0),
                                   dict(size=7, alpha=0.1)])
def test_lrn(attrs):
    graph = check(single("LRN", attrs, x=(1, 7, 3, 3)), {"x": rand(1, 7, 3, 3, scale=3)})
    assert graph.count_ops() == {"lrn": 1}


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_shape_computations_are_evaluated_at_import(opset):
    # x.view(x.size(0), -1) the way torch's legacy exporter writes it, plus Slice, Cast,
    # Div and Range on the side.
    unsq = (helper.make_node("Unsqueeze", ["n"], ["n1"], axes=[0]) if opset < 13 else
            helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]))
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        unsq,
        helper.make_node("Slice", ["s", "one1", "big1"], ["rest"]),
        helper.make_node("Cast", ["rest"], ["restf"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["restf"], ["resti"], to=TensorProto.INT64),
        helper.make_node("Div", ["resti", "two"], ["half"]),
        helper.make_node("Range", ["zero", "three", "one"], ["rng"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["r", "target"], ["y"]),
    ]
    inits = {"zero": np.array(0, np.int64), "zero1": np.array([0], np.int64),
             "one": np.array(1, np.int64), "one1": np.array([1], np.int64),
             "big1": np.array([2**62], np.int64), "two": np.array(2, np.int64),
             "three": np.array(3, np.int64), "minus1": np.array([-1], np.int64)}
    model = make_model(nodes, {"x": ("N", 3, 4, 5)}, {"y": ("N", 60)}, inits=inits,
                       opset=opset)
    graph = check(model, {"x": rand(1, 3, 4, 5)})
    assert graph.count_ops() == {"relu": 1, "reshape": 1}
    assert graph.tensors["y"].shape == (1, 60)
    # The symbolic batch follows input_shapes.
    graph = check(model, {"x": rand(3, 3, 4, 5)}, input_shapes={"x": (3, 3, 4, 5)})
    assert graph.tensors["y"].shape == (3, 60)


def test_initializer_that_is_also_an_input_is_a_constant():
    node = helper.make_node("Add", ["x", "c"], ["y"])
    model = make_model([node], {"x": (2, 3), "c": (2, 3)}, ["y"], inits={"c": rand(2, 3)})
    graph = from_onnx(model)
    assert graph.inputs == ["x"] and graph.tensors[graph.nodes()[0].inputs[1]].is_constant
    sess_inputs = {"x": rand(2, 3)}
    np.testing.assert_allclose(run_reference(graph, sess_inputs)["y"],
                               ort_run(model, sess_inputs)[0], rtol=1e-6)


def test_path_and_bytes_inputs(tmp_path):
    model = single("Relu", x=(2, 3))
    path = tmp_path / "relu.onnx"
    onnx.save(model, path)
    for source in (path, str(path), model.SerializeToString()):
        graph = from_onnx(source)
        assert graph.count_ops() == {"relu": 1}


# --- errors --------------------------------------------------------------------------------

def test_unsupported_op_names_op_node_and_supported_set():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="first"),
             helper.make_node("Sigmoid", ["r"], ["y"], name="squash")]
    with pytest.raises(OnnxImportError) as info:
        from_onnx(make_model(nodes, {"x": (2, 3)}, ["y"]))
    message = str(info.value)
    assert "'Sigmoid'" in message and "'squash'" in message and "#1" in message
    assert ", ".join(supported_ops()) in message
    assert supported_ops() == sorted(supported_ops()) and "Conv" in supported_ops()


def test_shape_op_on_computed_values_is_refused():
    nodes = [helper.make_node("Trilu", ["x"], ["y"], name="pick")]
    model = make_model(nodes, {"x": (2, 3)}, ["y"], opset=14, check=False)
    with pytest.raises(OnnxImportError, match=r"'pick'.*Trilu only on constant inputs.*'x'"):
        from_onnx(model)


def test_custom_domain_is_refused():
    node = helper.make_node("Relu", ["x"], ["y"], domain="com.example", name="custom")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, (2,))],
                              [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("com.example", 1)])
    with pytest.raises(OnnxImportError, match="'custom'.*domain 'com.example'"):
        from_onnx(model)


def test_malformed_bytes():
    with pytest.raises(OnnxImportError, match="cannot parse"):
        from_onnx(b"this is certainly not an ONNX model \x00\xff\x12")
    with pytest.raises(OnnxImportError, match="cannot parse"):
        from_onnx(b"")


def test_truncated_file(tmp_path):
    model = single("Conv", x=(1, 4, 8, 8), inits={"w": rand(8, 4, 3, 3)}, extra_inputs=["w"])
    data = model.SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(OnnxImportError, match=f"cannot parse '{path}'"):
        from_onnx(path)


def test_missing_file(tmp_path):
    path = tmp_path / "nothing_here.onnx"
    with pytest.raises(OnnxImportError, match=f"cannot read ONNX model '{path}'"):
        from_onnx(path)
    with pytest.raises(OnnxImportError, match="takes a path, bytes or an onnx.ModelProto"):
        from_onnx(42)


def test_non_4d_conv_input():
    model = single("Conv", x=(1, 4, 8), inits={"w": rand(2, 4, 3)}, extra_inputs=["w"])
    with pytest.raises(OnnxImportError, match=r"'the_conv'.*must be 4-D.*\(1, 4, 8\)"):
        from_onnx(model)


def test_wrong_input_shape_for_run_reference():
    graph = from_onnx(single("Relu", x=(2, 3)))
    with pytest.raises(ValueError, match=r"input 'x' has shape \(3, 2\)"):
        run_reference(graph, {"x": rand(3, 2)})


@pytest.mark.parametrize("model, pattern", [
    (lambda: single("Conv", dict(auto_pad="SAME_MIDDLE"), inits={"w": rand(2, 4, 3, 3)},
                    extra_inputs=["w"]), "auto_pad 'SAME_MIDDLE'"),
    (lambda: single("BatchNormalization", dict(training_mode=1), opset=15, n_outputs=3,
                    inits={k: np.ones(4, np.float32) for k in "sbmv"},
                    extra_inputs=list("sbmv")), "training_mode=1"),
    (lambda: single("Pad", dict(mode="reflect"), inits={"p": np.ones(8, np.int64)},
                    extra_inputs=["p"]), "mode 'reflect'"),
    (lambda: single("MaxPool", dict(kernel_shape=[2, 2], dilations=[2, 2]), opset=12),
     r"dilations \[2, 2\]"),
    (lambda: single("MaxPool", dict(kernel_shape=[2, 2], storage_order=1), opset=12),
     "storage_order=1"),
    (lambda: single("MaxPool", dict(kernel_shape=[2, 2]), opset=12, n_outputs=2, check=False),
     "output 1 \\(indices"),
    (lambda: single("ReduceMean", dict(axes=[4]), opset=13, check=False), r"axis 4 is out of range"),
    (lambda: single("LayerNormalization", dict(axis=1), opset=17,
                    inits={"s": np.ones((4, 8, 8), np.float32)}, extra_inputs=["s"]),
     "last axis only"),
    (lambda: single("Slice", inits={k: np.array([v], np.int64) for k, v in
                                    zip("beas", (5, 0, 3, -1))}, extra_inputs=list("beas")),
     "steps >= 1 only"),
    (lambda: single("Pad", inits={"p": -np.ones(8, np.int64)}, extra_inputs=["p"]),
     "negative pads"),
])
def test_unsupported_attribute_values(model, pattern):
    with pytest.raises(OnnxImportError, match=pattern):
        from_onnx(model())


def test_input_shapes_errors():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ("N", 3)}, ["y"])
    assert from_onnx(model).tensors["x"].shape == (1, 3)
    assert from_onnx(model, input_shapes={"x": (4, 3)}).tensors["x"].shape == (4, 3)
    with pytest.raises(OnnxImportError, match=r"\(4, 5\) does not fit.*\('\?', 3\)"):
        from_onnx(model, input_shapes={"x": (4, 5)})
    with pytest.raises(OnnxImportError, match=r"\['y'\], which are not inputs"):
        from_onnx(model, input_shapes={"y": (1, 3)})


def test_dynamic_dimensions_are_recorded_and_batch_sets_the_leading_one():
    """Every symbolic or unknown input dimension is recorded with the value it got;
    `batch` sets a dynamic leading dimension, and refuses to change a fixed one."""
    relu = helper.make_node("Relu", ["x"], ["y"])
    model = make_model([relu], {"x": ("N", 3, None)}, ["y"])
    graph = from_onnx(model)
    assert graph.tensors["x"].shape == (1, 3, 1)
    assert graph.metadata["onnx"]["dynamic_dims"] == [
        {"input": "x", "axis": 0, "name": "N", "value": 1},
        {"input": "x", "axis": 2, "name": None, "value": 1}]
    graph = check(model, {"x": rand(4, 3, 1)}, batch=4)
    assert graph.tensors["x"].shape == (4, 3, 1)
    assert graph.metadata["onnx"]["dynamic_dims"][0] == {"input": "x", "axis": 0,
                                                          "name": "N", "value": 4}
    # input_shapes decides for the inputs it names, and must agree with batch.
    assert from_onnx(model, input_shapes={"x": (2, 3, 5)}, batch=2).tensors["x"].shape == (
        2, 3, 5)
    with pytest.raises(OnnxImportError, match=r"input_shapes\['x'\] = \(2, 3, 5\) has "
                                              r"batch 2, but batch=3"):
        from_onnx(model, input_shapes={"x": (2, 3, 5)}, batch=3)
    fixed = make_model([relu], {"x": (2, 3)}, ["y"])
    assert from_onnx(fixed, batch=2).metadata["onnx"]["dynamic_dims"] == []
    with pytest.raises(OnnxImportError, match=r"graph input 'x' of 'the given ModelProto' has "
                                              r"a fixed batch of 2 \(shape \(2, 3\)\); batch "
                                              r"4 can only set a dynamic batch dimension"):
        from_onnx(fixed, batch=4)
    for bad in (0, 2.0, True):
        with pytest.raises(OnnxImportError, match=rf"batch must be a positive integer, not "
                                                  rf"{bad!r}"):
            from_onnx(model, batch=bad)


def test_import_errors_are_value_errors_not_graph_errors():
    # Errors from the IR's shape inference surface with the ONNX node named.
    node = helper.make_node("Add", ["x", "z"], ["y"], name="bad_add")
    model = make_model([node], {"x": (2, 3), "z": (4, 3)}, ["y"], check=False)
    with pytest.raises(OnnxImportError, match="'bad_add' \\(#0, Add\\).*do not broadcast") as info:
        from_onnx(model)
    assert isinstance(info.value, ValueError) and not isinstance(info.value, GraphError)
