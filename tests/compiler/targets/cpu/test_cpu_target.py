"""The CPU target's generated C, bit-exact against the integer reference: a conv grid
(kernels 1-7, strides, pads, dilation, groups and depthwise, channel counts of no
particular multiple, residual, per-channel and per-tensor requantization in both modes),
dense layers, and whole zoo models through the pipeline."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from vdla.compiler import Graph, pipeline, run_reference, targets
from vdla.compiler.targets.model import compile_model


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    return targets.get("cpu", threads=2)


def run_cpu(target, g, feed):
    compiled = compile_model(g, target)
    assert all(op.target == "cpu" for op in compiled.ops), [
        (op.name, op.target, op.reason) for op in compiled.ops]
    with compiled.session() as session:
        return session.run(feed).outputs


def conv_graph(rng, *, n=1, c=20, h=9, w=9, o=24, k=3, stride=1, pad=1, dilation=1,
               groups=1, residual=False, bias=True, multiply=False, per_channel=True):
    g = Graph("qconv")
    x = g.add_input("x", (n, c, h, w), "int8")
    weights = rng.integers(-128, 128, (o, c // groups, k, k)).astype(np.int8)
    inputs = [x, g.add_constant("w", weights, "int8")]
    inputs.append(g.add_constant("b", rng.integers(-5000, 5000, (o,)).astype(np.int32),
                                 "int32") if bias else "")
    span = dilation * (k - 1) + 1
    ho, wo = (h + 2 * pad - span) // stride + 1, (w + 2 * pad - span) // stride + 1
    feed = {"x": rng.integers(-128, 128, (n, c, h, w)).astype(np.int8)}
    attrs = {}
    if per_channel:
        attrs["shift"] = tuple(int(s) for s in rng.integers(-2, 16, o))
    else:
        attrs["shift"] = (9,)
    if multiply:
        attrs["multiplier"] = tuple(int(m) for m in rng.integers(1, 32768, o)) \
            if per_channel else (1234,)
        attrs["shift"] = tuple(s + 12 for s in attrs["shift"])
    if residual:
        inputs.append(g.add_input("r", (n, o, ho, wo), "int8"))
        feed["r"] = rng.integers(-128, 128, (n, o, ho, wo)).astype(np.int8)
        attrs.update(residual_shift=1, residual_multiplier=(77,) if multiply else None)
    y = g.add_node("qconv2d", inputs, name="conv", strides=(stride, stride),
                   pads=(pad,) * 4, dilations=(dilation, dilation), groups=groups,
                   out_min=-100, out_max=127, **attrs)
    g.set_outputs([y])
    return g, feed


GRID = [dict(k=k, stride=s, pad=p) for k, s, p in itertools.product((1, 3, 5, 7), (1, 2),
                                                                    (0, 1, 3)) if p < k]


@pytest.mark.parametrize("shape", GRID, ids=lambda d: "k{k}s{stride}p{pad}".format(**d))
def test_conv_grid_is_bit_exact(cpu, shape):
    rng = np.random.default_rng(hash(tuple(shape.values())) % 2**32)
    g, feed = conv_graph(rng, c=13, o=10, h=11, w=10, **shape)
    np.testing.assert_array_equal(run_cpu(cpu, g, feed)[g.outputs[0]],
                                  run_reference(g, feed)[g.outputs[0]])


@pytest.mark.parametrize("case", [
    dict(groups=2, c=14, o=10), dict(groups=4, c=12, o=20), dict(groups=7, c=7, o=7),
    dict(groups=24, c=24, o=24, k=3, stride=2), dict(groups=5, c=5, o=10, k=5, pad=2),
    dict(dilation=2, k=3, pad=2), dict(n=2, residual=True), dict(residual=True, multiply=True),
    dict(multiply=True, per_channel=False), dict(bias=False, per_channel=False),
], ids=str)
def test_groups_depthwise_dilation_residual_and_modes_are_bit_exact(cpu, case):
    rng = np.random.default_rng(7)
    g, feed = conv_graph(rng, **case)
    np.testing.assert_array_equal(run_cpu(cpu, g, feed)[g.outputs[0]],
                                  run_reference(g, feed)[g.outputs[0]])


@pytest.mark.parametrize("residual", [False, True])
def test_dense_is_bit_exact(cpu, residual):
    rng = np.random.default_rng(3)
    g = Graph("qdense")
    x = g.add_input("x", (3, 37), "int8")
    inputs = [x, g.add_constant("w", rng.integers(-128, 128, (11, 37)).astype(np.int8), "int8"),
              g.add_constant("b", rng.integers(-9000, 9000, (11,)).astype(np.int32), "int32")]
    feed = {"x": rng.integers(-128, 128, (3, 37)).astype(np.int8)}
    if residual:
        inputs.append(g.add_input("r", (3, 11), "int8"))
        feed["r"] = rng.integers(-128, 128, (3, 11)).astype(np.int8)
    y = g.add_node("qdense", inputs, name="fc", shift=(8,), residual_shift=0)
    g.set_outputs([y])
    np.testing.assert_array_equal(run_cpu(cpu, g, feed)[y], run_reference(g, feed)[y])


@pytest.mark.parametrize("model", ["digits_cnn", "small_cnn", "mobilenet_v1"])
def test_zoo_models_are_bit_exact_through_the_pipeline(model):
    loaded = pipeline.load_model(model, calibration=1, note=None)
    outcome = pipeline.run_model(loaded, targets.get("cpu"))
    assert outcome.bit_exact, outcome.mismatch
    # Every op but the edges' quantize/dequantize and flatten runs on the CPU target.
    host = {op.op for op in outcome.compiled.ops if op.target != "cpu"}
    assert host <= {"quantize", "dequantize", "flatten"}, host


def test_what_it_does_not_run_says_why(cpu):
    rng = np.random.default_rng(0)
    g, _ = conv_graph(rng)
    g2 = Graph("other")
    a = g2.add_input("a", (1, 4), "float32")
    y = g2.add_node("relu", [a], name="relu")
    g2.set_outputs([y])
    ok, reason = cpu.supports(g2.node("relu"), g2)
    assert not ok and "relu on float32 data" in reason
    s = g2.add_node("softmax", [a], name="softmax")
    ok, reason = cpu.supports(g2.node("softmax"), g2)
    assert not ok and "does not run 'softmax'" in reason
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        targets.get("cpu", threads=0)


def test_vdla_run_on_the_cpu_target_with_threads(capsys):
    from vdla.cli import main
    assert main(["run", "digits_cnn", "--target", "cpu", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "bit-exact vs the quantized reference: yes" in out and " cpu " in out
    assert main(["run", "digits_cnn", "--target", "host", "--threads", "2"]) == 1
    assert "--threads applies to --target cpu" in capsys.readouterr().err


def _one_node(op, shapes, rng, **attrs):
    g = Graph(op)
    names = [g.add_input(f"x{i}", s, "int8") for i, s in enumerate(shapes)]
    feed = {n: rng.integers(-128, 128, s).astype(np.int8) for n, s in zip(names, shapes)}
    y = g.add_node(op, names, name="op", **attrs)
    g.set_outputs([y])
    return g, feed


@pytest.mark.parametrize("op, attrs", [
    ("max_pool2d", dict(kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))),
    ("max_pool2d", dict(kernel=(2, 2), strides=(2, 2), ceil_mode=True)),
    ("max_pool2d", dict(kernel=(3, 2), strides=(1, 2), pads=(2, 0, 1, 1))),
    ("qavg_pool2d", dict(kernel=(2, 2), strides=(2, 2), shift=(2,))),
    ("qavg_pool2d", dict(kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1),
                         count_include_pad=True, multiplier=(3641,), shift=(15,))),
    ("qglobal_avg_pool2d", dict(multiplier=(1337,), shift=(17,))),
    ("qglobal_avg_pool2d", dict(shift=(7,))),
], ids=str)
def test_int8_pools_are_bit_exact(cpu, op, attrs):
    g, feed = _one_node(op, [(2, 5, 9, 11)], np.random.default_rng(11), **attrs)
    np.testing.assert_array_equal(run_cpu(cpu, g, feed)[g.outputs[0]],
                                  run_reference(g, feed)[g.outputs[0]])


@pytest.mark.parametrize("shape", [(2, 6, 5, 7), (3, 17)])
def test_qadd_and_relu_are_bit_exact(cpu, shape):
    rng = np.random.default_rng(5)
    channels = shape[1]
    g, feed = _one_node("qadd", [shape, shape], rng,
                        a_multiplier=tuple(int(m) for m in rng.integers(1, 30000, channels)),
                        a_shift=(14,), b_shift=(1,), out_min=-90, out_max=100)
    np.testing.assert_array_equal(run_cpu(cpu, g, feed)[g.outputs[0]],
                                  run_reference(g, feed)[g.outputs[0]])
    g, feed = _one_node("relu", [shape], rng)
    np.testing.assert_array_equal(run_cpu(cpu, g, feed)[g.outputs[0]],
                                  run_reference(g, feed)[g.outputs[0]])
