"""`vdla.compiler.pipeline`: loading models, the requantization mode targets share, and
bad arguments."""

import pytest

import vdla
from vdla.compiler import pipeline, targets


def test_load_model_feeds_and_calibrates():
    model = pipeline.load_model("small_cnn", seed=3, calibration=2)
    assert model.calibration["input"].shape == (2, 1, 3, 32, 32)
    assert model.feed["input"].shape == (1, 3, 32, 32) and "seed 3" in model.input_note
    digits = pipeline.load_model("digits_cnn", seed=451)
    assert "test image 1 of the digits split" in digits.input_note   # 450 test images


@pytest.mark.parametrize("spec, options, message", [
    ("resnet19", {}, "unknown model 'resnet19'; MODEL is a zoo name"),
    ("missing.onnx", {}, "ONNX file 'missing.onnx' does not exist"),
    ("small_cnn", {"seed": -1}, "seed must be a non-negative integer, not -1"),
    ("small_cnn", {"calibration": 0}, "calibration sample count must be a positive integer"),
])
def test_load_model_refuses_bad_arguments(spec, options, message):
    with pytest.raises(ValueError, match=message):
        pipeline.load_model(spec, **options)


def test_the_mode_the_targets_share():
    shift_only = targets.get("vdla", config=vdla.HardwareConfig())
    with_mul = targets.get("vdla", config=vdla.HardwareConfig(
        alu_ops={"MIN", "MAX", "ADD", "SHR", "MUL"}))
    host = targets.get("host")
    assert pipeline.requant_mode([with_mul]) == "multiply"
    assert pipeline.requant_mode([host, shift_only]) == "shift"

    class MultiplyOnly(type(host)):
        requant_modes = ("multiply",)

    with pytest.raises(ValueError, match=r"share no requantization mode \(host: multiply; "
                                         r"vdla: shift\)"):
        pipeline.requant_mode([MultiplyOnly(), shift_only])
