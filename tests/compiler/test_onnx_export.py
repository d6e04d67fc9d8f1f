"""ONNX export: graphs built op by op run the same on onnxruntime as on the numpy reference,
survive a round trip through the importer, and quantized graphs are refused; and the
`vdla export` command."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from vdla.compiler import Graph, run_reference
from vdla.compiler.frontend.onnx_export import OnnxExportError, save_onnx, to_onnx
from vdla.compiler.frontend.onnx_import import from_onnx
from vdla.cli import main

RNG = np.random.default_rng(7)


def rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def close(got, want):
    return got.shape == want.shape and \
        np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


def check_export(graph: Graph, opset: int = 13) -> onnx.ModelProto:
    """Export `graph`; onnxruntime's outputs and those of the re-imported graph must equal
    run_reference's. Returns the model."""
    model = to_onnx(graph, opset=opset)
    assert model.ir_version <= 13 and model.opset_import[0].version == opset
    feeds = {name: rand(*graph.tensors[name].shape) for name in graph.inputs}
    want = run_reference(graph, feeds)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [o.name for o in sess.get_outputs()] == graph.outputs
    for name, got in zip(graph.outputs, sess.run(None, feeds)):
        assert close(got, want[name]), (name, opset)
    back = from_onnx(model)
    assert back.inputs == graph.inputs and back.outputs == graph.outputs
    again = run_reference(back, feeds)
    for name in graph.outputs:
        assert close(again[name], want[name]), (name, "round trip")
    return model


def conv_graph(activation=None, residual=True, bias=True, groups=1, **act_attrs) -> Graph:
    g = Graph("conv")
    x = g.add_input("x", (1, 4, 7, 7))
    w = g.add_constant("w", rand(8, 4 // groups, 3, 3))
    r = g.add_input("r", (1, 8, 4, 4)) if residual else ""
    b = g.add_constant("b", rand(8)) if bias else ""
    y = g.add_node("conv2d", [x, w, b, r] if residual else [x, w, b], strides=(2, 2),
                   pads=(1, 1, 2, 1), groups=groups, activation=activation, **act_attrs)
    g.set_outputs([y])
    return g


OPSETS = [9, 11, 13, 18, 21]


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("activation, act_attrs, residual, bias, groups", [
    ("relu", {}, True, True, 1),
    ("clip", dict(clip_min=0.0, clip_max=6.0), True, False, 2),
    ("clip", dict(clip_max=0.5), False, True, 1),
    (None, {}, True, True, 1),
    (None, {}, False, False, 4),
])
def test_conv2d_with_fused_tail(opset, activation, act_attrs, residual, bias, groups):
    model = check_export(conv_graph(activation, residual, bias, groups, **act_attrs), opset)
    ops = [n.op_type for n in model.graph.node]
    expect = ["Conv"] + (["Add"] if residual else []) + \
        ({"relu": ["Relu"], "clip": ["Clip"], None: []}[activation])
    assert ops == expect


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("bias, residual, activation", [
    (True, False, "relu"), (False, True, "clip"), (False, False, None), (True, True, None),
])
def test_dense(opset, bias, residual, activation):
    g = Graph("dense")
    x = g.add_input("x", (3, 5))
    inputs = [x, g.add_constant("w", rand(4, 5)), g.add_constant("b", rand(4)) if bias else ""]
    if residual:
        inputs.append(g.add_input("r", (3, 4)))
    attrs = dict(clip_min=-0.5, clip_max=0.5) if activation == "clip" else {}
    g.set_outputs([g.add_node("dense", inputs, activation=activation, **attrs)])
    model = check_export(g, opset)
    gemm = model.graph.node[0]
    assert gemm.op_type == "Gemm" and onnx.helper.get_attribute_value(gemm.attribute[0]) == 1


@pytest.mark.parametrize("opset", [11, 13, 18, 21])
def test_pools(opset):
    g = Graph("pools")
    x = g.add_input("x", (1, 3, 9, 10))
    a = g.add_node("max_pool2d", [x], kernel=(3, 3), strides=(2, 2), pads=(1, 0, 1, 1),
                   ceil_mode=True)
    b = g.add_node("avg_pool2d", [x], kernel=(3, 2), strides=(2, 2), pads=(1, 1, 1, 1),
                   count_include_pad=True)
    c = g.add_node("avg_pool2d", [x], kernel=(2, 2), strides=(2, 2), ceil_mode=True)
    d = g.add_node("global_avg_pool2d", [a])
    g.set_outputs([a, b, c, d])
    check_export(g, opset)


@pytest.mark.parametrize("opset", OPSETS)
def test_other_float_ops(opset):
    g = Graph("misc")
    x = g.add_input("x", (2, 4, 5, 5))
    bn = g.add_node("batch_norm", [x, g.add_constant("s", rand(4)), g.add_constant("o", rand(4)),
                                   g.add_constant("m", rand(4)),
                                   g.add_constant("v", np.abs(rand(4)) + 0.5)], epsilon=1e-3)
    p = g.add_node("pad", [bn], pads=(0, 0, 1, 0, 0, 2, 0, 1), value=0.5)
    lrn = g.add_node("lrn", [p], size=3, alpha=1e-2, beta=0.6, bias=1.5)
    r = g.add_node("relu", [lrn])
    cl = g.add_node("clip", [r], min=None, max=1.5)
    m = g.add_node("mul", [cl, g.add_constant("k", rand(6, 1, 1))])
    s = g.add_node("add", [m, g.add_constant("z", rand(1, 1, 6))])
    cat = g.add_node("concat", [s, g.add_constant("extra", rand(2, 2, 6, 6))], axis=-3)
    t = g.add_node("transpose", [cat], perm=(0, 2, 3, 1))
    f = g.add_node("flatten", [t], axis=-1)
    rs = g.add_node("reshape", [t], shape=(2, -1))
    mm = g.add_node("matmul", [rs, g.add_constant("mw", rand(288, 3))])
    sm = g.add_node("softmax", [mm], axis=-1)
    g.set_outputs([sm, f])
    check_export(g, opset)


def test_softmax_axis_and_opsets():
    g = Graph("softmax")
    x = g.add_input("x", (2, 3, 4))
    g.set_outputs([g.add_node("softmax", [x], axis=1)])
    check_export(g, 13)
    with pytest.raises(OnnxExportError, match="softmax over axis 1 .* needs opset 13"):
        to_onnx(g, opset=11)


def test_constant_output_and_shared_weights():
    g = Graph("shared")
    x = g.add_input("x", (1, 2, 4, 4))
    w = g.add_constant("w", rand(2, 2, 1, 1))
    a = g.add_node("conv2d", [x, w])
    b = g.add_node("conv2d", [a, w], activation="relu")
    g.set_outputs([b, w])
    model = check_export(g)
    assert [i.name for i in model.graph.initializer] == ["w"]


# --- errors ----------------------------------------------------------------------------------

def test_quantized_graph_is_refused():
    g = Graph("quantized")
    x = g.add_input("x", (1, 4))
    g.set_outputs([g.add_node("quantize", [x], name="q", scale=0.05)])
    with pytest.raises(OnnxExportError, match="node 'q': op 'quantize' has no ONNX export"):
        to_onnx(g)


def test_integer_and_scaled_tensors_are_refused():
    g = Graph("ints")
    x = g.add_input("x", (1, 4), dtype="int8")
    g.set_outputs([g.add_node("relu", [x], name="r")])
    with pytest.raises(OnnxExportError, match="'r' \\(relu\\): tensor 'x' is int8"):
        to_onnx(g)
    g = Graph("scaled")
    x = g.add_input("x", (1, 4))
    g.tensors[x].scale = 0.1
    g.set_outputs([g.add_node("relu", [x], name="r")])
    with pytest.raises(OnnxExportError, match="tensor 'x' is quantized"):
        to_onnx(g)


def test_bad_opsets():
    g = conv_graph()
    for opset in (6, 22, "13"):
        with pytest.raises(OnnxExportError, match="to_onnx writes opsets 7 to 21"):
            to_onnx(g, opset=opset)
    h = Graph("ceil")
    x = h.add_input("x", (1, 1, 5, 5))
    h.set_outputs([h.add_node("max_pool2d", [x], kernel=(2, 2), strides=(2, 2),
                              ceil_mode=True, name="pool")])
    with pytest.raises(OnnxExportError, match="'pool' .*ceil_mode needs opset 10"):
        to_onnx(h, opset=9)


def test_save_onnx(tmp_path):
    g = conv_graph("relu")
    path = save_onnx(g, tmp_path / "sub" / "conv.onnx")
    assert path.is_file() and not list(path.parent.glob(".*tmp"))
    back = from_onnx(path)
    feeds = {"x": rand(1, 4, 7, 7), "r": rand(1, 8, 4, 4)}
    assert close(run_reference(back, feeds)[back.outputs[0]],
                 run_reference(g, feeds)[g.outputs[0]])


# --- vdla export -------------------------------------------------------------------------------

def test_cli_export_small_cnn(tmp_path, capsys):
    from vdla.compiler import zoo

    out = tmp_path / "small.onnx"
    assert main(["export", "small_cnn", "-o", str(out), "--batch", "2", "--image-size", "16",
                 "--opset", "18"]) == 0
    line = capsys.readouterr().out.strip()
    graph = zoo.get("small_cnn", batch=2, image_size=16)
    assert line.startswith(f"{out}: small_cnn, {len(graph.nodes())} ops, ")
    assert "parameters" in line and len(line.splitlines()) == 1
    model = onnx.load(out)
    assert model.opset_import[0].version == 18
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = rand(2, 3, 16, 16)
    want = run_reference(graph, {graph.inputs[0]: x})[graph.outputs[0]]
    assert close(sess.run(None, {graph.inputs[0]: x})[0], want)


def test_cli_export_errors(tmp_path, capsys):
    out = tmp_path / "x.onnx"
    assert main(["export", "no_such_net", "-o", str(out)]) == 1    # a user error, as elsewhere
    err = capsys.readouterr().err
    assert "unknown model 'no_such_net'" in err and "small_cnn" in err
    assert main(["export", "small_cnn", "-o", str(out), "--batch", "0"]) == 1
    assert "--batch must be a positive integer, not 0" in capsys.readouterr().err
    assert main(["export", "small_cnn", "-o", str(out), "--opset", "5"]) == 1
    assert "--opset 5 is not supported" in capsys.readouterr().err
    assert not out.exists()
