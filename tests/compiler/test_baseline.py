"""onnxruntime as a reference (`vdla.compiler.baseline`): its bad arguments are clear
errors, and a profiled run of an exported model gives its outputs and group times."""

from __future__ import annotations

import numpy as np
import pytest

from vdla.compiler import baseline, pipeline
from vdla.compiler.frontend.onnx_export import save_onnx


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    model = pipeline.load_model("digits_cnn", note=None)
    path = save_onnx(model.graph, tmp_path_factory.mktemp("ort") / "digits.onnx")
    return model, path


def test_profile_times_groups_and_matches_the_float_reference(digits):
    model, path = digits
    x = np.asarray(model.feed[model.graph.inputs[0]], np.float32)
    run = baseline.profile(path, 1, [x], runs=2)
    want = pipeline.reference_of(model.graph, model.feed)[model.graph.outputs[0]]
    np.testing.assert_allclose(run.outputs[0], want, rtol=1e-4, atol=1e-5)
    assert run.group_seconds["conv"] > 0 and run.total_seconds > 0 and run.kernels > 0
    # Per node: the same kernels, by onnxruntime's node names, with their op types.
    assert sum(run.node_seconds.values()) == pytest.approx(sum(run.group_seconds.values()))
    convs = [n for n, op in run.node_ops.items() if baseline.OP_GROUPS.get(op) == "conv"]
    assert convs and all(run.node_seconds[n] > 0 for n in convs)


@pytest.mark.parametrize("call, message", [
    (lambda p, x: baseline.profile(p, 1, [x], runs=0), "runs must be a positive integer"),
    (lambda p, x: baseline.profile(p, 1, [x, x]), "takes 1 inputs"),
    (lambda p, x: baseline.session(p, 0), "threads must be a positive integer, not 0"),
    (lambda p, x: baseline.quantize_qdq(p, None, p.with_name("q.onnx"), "i4"),
     "activations must be 'u8' or 's8', not 'i4'"),
])
def test_bad_arguments_name_the_value(digits, call, message):
    model, path = digits
    x = np.asarray(model.feed[model.graph.inputs[0]], np.float32)
    with pytest.raises(ValueError, match=message):
        call(path, x)
