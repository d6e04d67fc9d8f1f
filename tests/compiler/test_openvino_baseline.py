"""OpenVINO as a reference (`vdla.compiler.baseline_openvino`): its CPU plugin compiles
the float model at f32 on the threads asked for, runs it as closely to the float
reference as onnxruntime does, runs onnxruntime's QDQ int8 model with int8 layers, and
its bad arguments are clear errors; bench/cpu.py times it beside onnxruntime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from script_loading import load_script
from vdla.compiler import baseline, baseline_openvino, pipeline
from vdla.compiler.frontend.onnx_export import save_onnx

BENCH = Path(__file__).resolve().parents[2] / "bench"

ov = pytest.importorskip("openvino", reason="the openvino extra is not installed")
pytest.importorskip("onnxruntime", reason="onnxruntime (the openvino extra's quantizer) "
                                          "is not installed")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """small_cnn exported to ONNX, and onnxruntime's static QDQ int8 of it: the files both
    reference columns run."""
    model = pipeline.load_model("small_cnn", note=None)
    folder = tmp_path_factory.mktemp("ov")
    fp32 = save_onnx(model.graph, folder / "small.onnx")
    int8 = baseline.quantize_qdq(fp32, model, folder / "small-u8.onnx", "u8")
    want = pipeline.reference_of(model.graph, model.feed)[model.graph.outputs[0]]
    return model, fp32, int8, want


@pytest.mark.parametrize("threads", [1, 2])
def test_compiled_at_f32_on_the_threads_asked_for(small, threads):
    """The precision hint is f32 whatever the machine's default (bf16 where it has AMX
    or AVX-512 BF16), on one stream of `threads` threads with the latency hint."""
    _, fp32, int8, _ = small
    for path in (fp32, int8):
        compiled = baseline_openvino.compile_onnx(path, threads)
        assert compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32
        assert compiled.get_property("INFERENCE_NUM_THREADS") == threads
        assert compiled.get_property("NUM_STREAMS") == 1
        assert compiled.get_property("PERFORMANCE_HINT") == "LATENCY"


def test_float32_matches_the_float_reference_as_onnxruntime_does(small):
    model, fp32, _, want = small
    x = model.feed[model.graph.inputs[0]]
    run = baseline_openvino.profile(fp32, 1, [x], runs=3)
    np.testing.assert_allclose(run.outputs[0], want, rtol=1e-4, atol=1e-5)
    ort = baseline.profile(fp32, 1, [x], runs=2)
    np.testing.assert_allclose(run.outputs[0], ort.outputs[0], rtol=1e-4, atol=1e-5)
    # Every convolution and dense layer ran at f32, none at bf16.
    assert run.precisions and set(run.precisions.values()) == {"f32"}
    assert run.group_seconds["conv"] > 0 and run.total_seconds > 0 and run.kernels > 0
    assert sum(run.node_seconds.values()) == pytest.approx(sum(run.group_seconds.values()))
    assert set(run.precisions) <= set(run.node_ops)


def test_int8_runs_the_qdq_model_with_int8_layers(small):
    """onnxruntime's QDQ model through OpenVINO's low-precision transformations: its
    convolutions run on 8-bit data; its outputs are its own quantization's, near the
    float reference as onnxruntime's are (a speed reference, checked loosely)."""
    model, _, int8, want = small
    x = model.feed[model.graph.inputs[0]]
    run = baseline_openvino.profile(int8, 2, {model.graph.inputs[0]: x}, runs=3)
    convs = {n: p for n, p in run.precisions.items() if run.node_ops[n] == "Convolution"}
    assert len(convs) == 3 and set(convs.values()) <= {"u8", "i8"}
    ort = baseline.profile(int8, 2, [x], runs=2)
    for outputs in (run.outputs, ort.outputs):
        assert 0 < pipeline.relative_error(outputs[0], want) < 0.5
    assert run.group_seconds["conv"] > 0
    # The bench's runner computes what the profiled run does.
    assert np.array_equal(baseline_openvino.runner(int8, 2, [x])()[0], run.outputs[0])


@pytest.mark.parametrize("call, error, message", [
    (lambda p, x: baseline_openvino.compile_onnx(p, 0), ValueError,
     "openvino threads must be a positive integer, not 0"),
    (lambda p, x: baseline_openvino.profile(p, 1, [x], runs=0), ValueError,
     "runs must be a positive integer, not 0"),
    (lambda p, x: baseline_openvino.profile(p, 1, [x, x]), ValueError, "takes 1 inputs"),
])
def test_bad_arguments_name_the_value(small, call, error, message):
    model, fp32, _, _ = small
    with pytest.raises(error, match=message):
        call(fp32, model.feed[model.graph.inputs[0]])


def test_available_names_the_extra(monkeypatch):
    assert baseline_openvino.available() is None
    assert baseline_openvino.version()[:4].isdigit()
    monkeypatch.setattr(baseline_openvino.importlib.util, "find_spec",
                        lambda name: None if name == "openvino" else object())
    assert baseline_openvino.available() == ("openvino is not installed "
                                             "(pip install 'vdla[openvino]')")


def test_cpu_bench_times_openvino_beside_onnxruntime(tmp_path, capsys, monkeypatch):
    """bench/cpu.py's speed part: OpenVINO's blocks interleaved with the others', its
    time and vdla's speed against it beside onnxruntime's, the plot with its bars;
    --openvino without the extra is an error naming it."""
    bench = load_script(BENCH / "cpu.py")
    assert bench.main(["--models", "small_cnn", "--skip-tune", "--skip-convergence",
                       "--skip-exactness", "--rounds", "2", "--runs", "2", "--pause", "0",
                       "--threads", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Speed against onnxruntime and OpenVINO" in out and "OpenVINO's time / vdla's" in out
    assert "OpenVINO int8 activations" in out
    report = json.loads((tmp_path / "cpu.json").read_text())
    assert report["openvino"] == baseline_openvino.version()
    for row in report["speed"]:
        keys = {"fp32"} if row["precision"] == "float32" else {"s8", "u8"}
        assert set(row["ov"]) == {f"ov-{k}" for k in keys}
        assert row["ov_ms"] == min(row["ov"].values()) > 0
        assert len(row["openvino"]["speed_rounds"]) == 2
        vdla = row["vdla-default"]
        assert vdla["speed_ov"] > 0 and len(vdla["speed_ov_rounds"]) == 2
        # The ratio is OpenVINO's time over vdla's, round by round.
        assert vdla["speed_ov"] == pytest.approx(float(np.median(vdla["speed_ov_rounds"])))
    assert (tmp_path / "cpu.png").stat().st_size > 10_000
    monkeypatch.setattr(baseline_openvino.importlib.util, "find_spec",
                        lambda name: None if name == "openvino" else object())
    with pytest.raises(SystemExit, match="--openvino: openvino is not installed"):
        bench.main(["--models", "small_cnn", "--openvino", "--skip-tune",
                    "--skip-convergence", "--skip-exactness", "--out", str(tmp_path)])
