"""`vdla.compiler.pipeline`: loading models, the requantization mode targets share, and
bad arguments."""

import re

import numpy as np
import pytest

import vdla
from vdla.compiler import pipeline, targets

from onnx_testing import dynamic_batch_model


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


def test_a_dynamic_batch_gets_a_note_and_the_batch(tmp_path, capsys):
    path = dynamic_batch_model(tmp_path / "dyn.onnx")
    model = pipeline.load_model(path, calibration=2)
    note = "input 'x' has a dynamic batch dimension 'N'; using batch 1 (vdla run --batch sets it)"
    assert model.notes == (note,) and model.batch == 1
    assert capsys.readouterr().err == f"vdla: {note}\n"      # printed by default
    assert model.feed["x"].shape == (1, 3, 8, 8)
    heard = []
    model = pipeline.load_model(path, calibration=2, batch=3, note=heard.append)
    assert heard == list(model.notes) == [
        "input 'x' has a dynamic batch dimension 'N'; using batch 3"]
    assert capsys.readouterr().err == ""
    assert model.batch == 3 and model.feed["x"].shape == (3, 3, 8, 8)
    assert model.calibration["x"].shape == (2, 3, 3, 8, 8) and "batch 3" in model.input_note
    unknown = pipeline.load_model(dynamic_batch_model(tmp_path / "u.onnx", batch_dim=None),
                                  note=None)
    assert unknown.notes == ("input 'x' has a dynamic batch dimension (unnamed); using batch "
                             "1 (vdla run --batch sets it)",)
    assert capsys.readouterr().err == ""                      # note=None: quiet


def test_a_fixed_batch_is_not_overridden(tmp_path, capsys):
    path = dynamic_batch_model(tmp_path / "fixed.onnx", fixed_batch=1)
    assert pipeline.load_model(path).notes == () and capsys.readouterr().err == ""
    assert pipeline.load_model(path, batch=1).batch == 1
    with pytest.raises(ValueError, match=r"graph input 'x' of '.*fixed.onnx' has a fixed batch "
                                         r"of 1 \(shape \(1, 3, 8, 8\)\); batch 2 can only set "
                                         r"a dynamic batch dimension"):
        pipeline.load_model(path, batch=2)


def test_zoo_models_are_built_with_the_batch():
    model = pipeline.load_model("small_cnn", batch=2, calibration=3)
    assert model.batch == 2 and model.notes == ()
    assert model.feed["input"].shape == (2, 3, 32, 32)
    assert model.calibration["input"].shape == (3, 2, 3, 32, 32)
    digits = pipeline.load_model("digits_cnn", seed=448, batch=3, calibration=2)
    assert digits.feed["input"].shape == (3, 1, 8, 8)
    assert digits.calibration["input"].shape == (2, 3, 1, 8, 8)
    assert "3 test images of the digits split from image 448" in digits.input_note
    assert digits.feed["input"][2].tolist() == pipeline.load_model("digits_cnn").feed[
        "input"][0].tolist()                                    # 448, 449, then 0
    one = pipeline.load_model("digits_cnn", seed=448)
    assert one.feed["input"].shape == (1, 1, 8, 8) and "test image 448 " in one.input_note


@pytest.mark.parametrize("batch", [0, -1, 1.5, True])
def test_load_model_refuses_a_bad_batch(batch):
    with pytest.raises(ValueError, match=rf"the batch must be a positive integer, not "
                                         rf"{re.escape(repr(batch))}"):
        pipeline.load_model("small_cnn", batch=batch)


# --- the quantized graph, remembered on disk (quantize_for) ---------------------------------

def test_a_quantized_graph_is_remembered_and_keyed_on_what_decides_it(tmp_path, monkeypatch):
    """The second quantization of the same model is read from $VDLA_CACHE, equal to the
    first; other calibration samples, another mode or float nonlinear ops quantize again;
    a damaged entry is quantized again, never used."""
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path))
    calls = []
    real = pipeline.quantize

    def counting(*args, **kwargs):
        calls.append((args[2], kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "quantize", counting)
    target = targets.get("vdla")
    model = pipeline.load_model("small_cnn")
    first = pipeline.quantize_for(model, target)
    second = pipeline.quantize_for(model, target)
    assert len(calls) == 1 and second.fingerprint() == first.fingerprint()
    pipeline.quantize_for(pipeline.load_model("small_cnn", seed=1), target)
    assert len(calls) == 2
    # Softmax, LayerNorm and GELU kept in float is another graph (the same here: the
    # model has none; what matters is that it is keyed apart).
    pipeline.quantize_for(model, target, integer_nonlinear=False)
    assert len(calls) == 3 and calls[-1][1] == {"integer_nonlinear": False}
    entries = list(tmp_path.glob("quantized/*/*.pickle"))
    assert len(entries) == 3
    for entry in entries:
        entry.write_bytes(entry.read_bytes()[:-10])      # truncated
    assert pipeline.quantize_for(model, target).fingerprint() == first.fingerprint()
    assert len(calls) == 4


def test_a_graph_fingerprint_sees_one_weight():
    graph = pipeline.load_model("small_cnn").graph
    before = graph.fingerprint()
    assert graph.copy().fingerprint() == before
    name = next(n for n, t in graph.tensors.items() if t.is_constant and t.data.size > 1)
    changed = graph.copy()
    data = changed.tensors[name].data.copy()
    data.flat[0] += 1
    changed.tensors[name].data = data
    assert changed.fingerprint() != before


def test_a_compiled_model_is_remembered_for_its_graph_config_and_schedules(tmp_path,
                                                                           monkeypatch):
    """compile_for on the vdla target reads a model compiled before from $VDLA_CACHE: the
    same programs and static data, the caller's graph and target; another config
    compiles again. A target without a compile key (the host) is never remembered."""
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path))
    calls = []
    real = pipeline.compile_model

    def counting(graph, target, **options):
        calls.append(target.name)
        return real(graph, target, **options)

    monkeypatch.setattr(pipeline, "compile_model", counting)
    target = targets.get("vdla")
    quantized = pipeline.graph_for(pipeline.load_model("small_cnn"), target)
    first, _ = pipeline.compile_for(quantized, target)
    second, _ = pipeline.compile_for(quantized, target)
    assert calls == ["vdla"]
    assert second.target is target and second.graph is quantized
    for a, b in zip(first.ops, second.ops):
        assert a.name == b.name and a.schedule == b.schedule
        if getattr(a.kernel, "lowered", None) is not None:
            assert a.kernel.lowered.program.to_bytes() == b.kernel.lowered.program.to_bytes()
            assert all(np.array_equal(a.kernel.static[k], b.kernel.static[k])
                       for k in a.kernel.static)
    other = targets.get("vdla", config=vdla.HardwareConfig(block_out=32))
    pipeline.compile_for(pipeline.graph_for(pipeline.load_model("small_cnn"), other), other)
    assert calls == ["vdla", "vdla"]
    host = targets.get("host")
    pipeline.compile_for(quantized, host)
    pipeline.compile_for(quantized, host)
    assert calls == ["vdla", "vdla", "host", "host"]


def test_the_reference_and_zoo_models_are_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path))
    model = pipeline.load_model("small_cnn")
    again = pipeline.load_model("small_cnn")
    assert again.graph.fingerprint() == model.graph.fingerprint()
    assert list(tmp_path.glob("zoo/*/*.pickle"))
    quantized = pipeline.graph_for(model, targets.get("vdla"))
    first = pipeline.reference_of(quantized, model.feed)
    fresh = pipeline.run_reference(quantized, model.feed, keep=True)
    assert first.keys() == fresh.keys()
    assert all(np.array_equal(first[k], fresh[k]) for k in fresh)
    changed = {k: v + 1 for k, v in model.feed.items()}
    other = pipeline.reference_of(quantized, changed)
    assert not all(np.array_equal(other[k], first[k]) for k in first)
    assert len(list(tmp_path.glob("reference/*/*.pickle"))) == 2
