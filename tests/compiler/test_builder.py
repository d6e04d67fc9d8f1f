"""GraphBuilder: each layer makes the right node and weights, seeds fix the weights, and
bad arguments are refused with messages that name them."""

from __future__ import annotations

import numpy as np
import pytest

from vdla.compiler.frontend.builder import GraphBuilder
from vdla.compiler.ir import GraphError
from vdla.compiler.reference import run_reference


def _tiny(seed=0, batch=2):
    b = GraphBuilder("tiny", seed=seed)
    x = b.input("input", (batch, 3, 16, 16))
    y = b.relu(b.batch_norm(b.conv(x, 8, 3, padding=1, name="c1")), name="r1")
    z = b.relu6(b.batch_norm(b.conv(y, 8, 3, padding=1, groups=8, bias=True)))
    y = b.add(y, z, name="sum")
    y = b.max_pool(y, 3, 2, padding=1)
    y = b.avg_pool(y, 2, 2)
    y = b.flatten(b.global_avg_pool(y))
    logits = b.dense(y, 5, name="logits")
    b.softmax(logits, name="unused")            # pruned: not an output
    return b.build(["logits"])


def test_layers_make_the_right_nodes_and_shapes():
    g = _tiny()
    assert g.inputs == ["input"] and g.outputs == ["logits"]
    assert g.tensors["logits"].shape == (2, 5)
    assert g.count_ops() == {"conv2d": 2, "batch_norm": 2, "relu": 1, "clip": 1, "add": 1,
                             "max_pool2d": 1, "avg_pool2d": 1, "global_avg_pool2d": 1,
                             "flatten": 1, "dense": 1}
    c1 = g.node("c1")
    assert c1.attrs["pads"] == (1, 1, 1, 1) and c1.attrs["groups"] == 1
    assert c1.inputs == ["input", "c1.weight"]                 # no bias by default
    dw = [n for n in g.nodes() if n.op == "conv2d" and n.name != "c1"][0]
    assert dw.attrs["groups"] == 8 and g.tensors[dw.inputs[1]].shape == (8, 1, 3, 3)
    assert g.tensors[dw.inputs[2]].shape == (8,)
    clip = [n for n in g.nodes() if n.op == "clip"][0]
    assert (clip.attrs["min"], clip.attrs["max"]) == (0.0, 6.0)
    pool = [n for n in g.nodes() if n.op == "max_pool2d"][0]
    assert pool.attrs["kernel"] == (3, 3) and pool.attrs["strides"] == (2, 2)
    assert g.tensors[pool.outputs[0]].shape == (2, 8, 8, 8)
    assert "unused" not in g.tensors
    assert all(t.data.dtype == np.float32 for t in g.tensors.values() if t.is_constant)


def test_he_normal_weights():
    b = GraphBuilder("he", seed=3)
    x = b.input("input", (1, 64, 8, 8))
    b.conv(x, 256, 3, padding=1, name="c")
    w = b.graph.tensors["c.weight"].data
    fan_in = 64 * 9
    assert abs(w.mean()) < 0.01 * np.sqrt(2 / fan_in) * 10
    assert w.std() == pytest.approx(np.sqrt(2 / fan_in), rel=0.02)


def test_batch_norm_parameters_are_non_trivial_and_normalize_their_input():
    b = GraphBuilder("bn", seed=1)
    x = b.input("input", (1, 3, 16, 16))
    c = b.conv(x, 16, 3, padding=1, name="c")
    y = b.batch_norm(c, name="bn")
    v = b.calibration_value(c).astype(np.float64)
    out = b.calibration_value(y).astype(np.float64)
    g = b.build([y])
    gamma, beta, mean, var = (g.tensors[f"bn.{k}"].data for k in
                              ("weight", "bias", "running_mean", "running_var"))
    # Running statistics are the input's actual per-channel statistics ...
    np.testing.assert_allclose(mean, v.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var, v.var(axis=(0, 2, 3)), rtol=1e-4)
    # ... so the output is N(beta, gamma^2) per channel; and none of it is 1 / 0.
    np.testing.assert_allclose(out.mean(axis=(0, 2, 3)), beta, atol=1e-4)
    np.testing.assert_allclose(out.std(axis=(0, 2, 3)), gamma, rtol=1e-3)
    for p in (gamma, beta, mean, var):
        assert np.all(np.abs(p - 1) > 1e-3) or np.all(np.abs(p) > 1e-3)
    assert np.all(np.abs(mean) > 0) and not np.allclose(var, 1, atol=0.05)
    assert 0.5 <= gamma.min() and gamma.max() <= 1.5
    assert g.node("bn").attrs["epsilon"] == 1e-5


def test_builder_calibration_agrees_with_the_reference():
    # The builder's eager float32 kernels and run_reference must compute the same network.
    b = GraphBuilder("agree", seed=4, calibration_batch=3)
    x = b.input("input", (3, 3, 16, 16))
    y = b.relu(b.batch_norm(b.conv(x, 8, 3, stride=2, padding=1)))
    y = b.conv(y, 8, 3, padding=(1, 1), groups=8, bias=True)
    y = b.avg_pool(y, 3, 1, padding=1)
    y = b.max_pool(y, 2)
    y = b.dense(b.flatten(y), 4)
    values = {"input": b.calibration_value(x), y: b.calibration_value(y)}
    g = b.build([y])
    out = run_reference(g, {"input": values["input"]})[y]
    np.testing.assert_allclose(out, values[y], rtol=1e-4, atol=1e-4)


def test_same_seed_same_weights_other_seed_other_weights():
    a, b, c = _tiny(seed=7), _tiny(seed=7), _tiny(seed=8)
    consts = [n for n, t in a.tensors.items() if t.is_constant]
    assert consts == [n for n, t in c.tensors.items() if t.is_constant]
    for name in consts:
        np.testing.assert_array_equal(a.tensors[name].data, b.tensors[name].data)
        assert not np.array_equal(a.tensors[name].data, c.tensors[name].data), name


def test_weights_do_not_depend_on_the_batch():
    a, b = _tiny(batch=1), _tiny(batch=4)
    for name, t in a.tensors.items():
        if t.is_constant:
            np.testing.assert_array_equal(t.data, b.tensors[name].data)


def test_sane_activations_through_a_deep_plain_stack():
    # 30 conv+BN+ReLU layers: data-dependent BN keeps every layer's scale near 1.
    b = GraphBuilder("deep", seed=0)
    x = b.input("input", (1, 3, 16, 16))
    relus = []
    for _ in range(30):
        x = b.relu(b.batch_norm(b.conv(x, 16, 3, padding=1)))
        relus.append(x)
    g = b.build([x])
    rng = np.random.default_rng(9)
    values = run_reference(g, {"input": rng.standard_normal((1, 3, 16, 16))}, keep=True)
    for r in relus:
        assert np.all(np.isfinite(values[r]))
        assert 0.2 < values[r].std() < 5, (r, values[r].std())
        assert 0.2 < (values[r] > 0).mean() < 0.9


@pytest.mark.parametrize("call, match", [
    (lambda b, x: b.conv(x, 0, 3), "out_channels must be a positive int"),
    (lambda b, x: b.conv(x, 8, 3, groups=2), r"groups=2 must divide the input channels \(3\)"),
    (lambda b, x: b.conv(x, 8, (3, 3, 3)), "conv kernel must be an int or a pair"),
    (lambda b, x: b.conv(x, 8, 3, padding=-1), r"padding \(-1, -1, -1, -1\) >= 0"),
    (lambda b, x: b.conv("nope", 8, 3), "'nope' is not a tensor made by this builder"),
    (lambda b, x: b.conv(x, 8, 3, name="input"), "name 'input' is already used"),
    (lambda b, x: b.dense(x, 10), r"must be 2-D \(N, features\).*flatten it first"),
    (lambda b, x: b.dense(b.flatten(x), 0), "dense units must be a positive int"),
    (lambda b, x: b.max_pool(x, 0), "kernel .* must be >= 1"),
    (lambda b, x: b.max_pool(x, 9), "does not fit"),
    (lambda b, x: b.add(x, b.conv(x, 4, 1)), "do not broadcast"),
    (lambda b, x: b.batch_norm(x, epsilon=0), "epsilon must be > 0"),
    (lambda b, x: b.global_avg_pool(b.flatten(x)), "must be 4-D NCHW"),
    (lambda b, x: b.build([]), "at least one output"),
])
def test_errors_name_what_is_wrong(call, match):
    b = GraphBuilder("bad")
    x = b.input("input", (1, 3, 8, 8))
    with pytest.raises(GraphError, match=match):
        call(b, x)


def test_constructor_and_input_errors():
    with pytest.raises(GraphError, match="seed must be a non-negative int"):
        GraphBuilder("g", seed=-1)
    with pytest.raises(GraphError, match="calibration_batch must be a positive int"):
        GraphBuilder("g", calibration_batch=0)
    with pytest.raises(GraphError, match="shape must be positive ints"):
        GraphBuilder("g").input("input", (1, 0, 8, 8))
    b = GraphBuilder("g")
    x = b.input("input", (1, 3, 8, 8))
    b.build([x])
    with pytest.raises(GraphError, match="already built"):
        b.relu(x)
