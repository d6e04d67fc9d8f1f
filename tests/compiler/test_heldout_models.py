"""bench/heldout.py: its two torch models export to ONNX files that vdla's importer
loads and computes as torch does (at 32x32, so the test takes seconds; the bench runs
them at 224x224)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from script_loading import load_script

torch = pytest.importorskip("torch")

from vdla.compiler import run_reference  # noqa: E402
from vdla.compiler.frontend.onnx_import import from_onnx  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def heldout():
    return load_script(ROOT / "bench" / "heldout.py")


@pytest.mark.parametrize("name, convs, depthwise, extra", [
    ("mobilenet_v2", 52, 17, {"clip": 35, "add": 10}),
    ("resnet34_w48", 36, 0, {"relu": 33, "add": 16, "max_pool2d": 1}),
])
def test_export_imports_and_matches_torch(heldout, tmp_path, name, convs, depthwise, extra):
    path = heldout.MODELS[name](tmp_path, size=32)
    assert path == tmp_path / f"{name}.onnx"
    graph = from_onnx(path)
    assert graph.inputs == ["input"] and graph.outputs == ["logits"]
    assert graph.tensors["input"].shape == (1, 3, 32, 32)
    ops = graph.count_ops()
    # BN folded by the exporter; only the layers the CPU target runs reach the graph.
    assert ops == {"conv2d": convs, "global_avg_pool2d": 1, "flatten": 1, "dense": 1,
                   **extra}
    assert sum(n.attrs["groups"] > 1 for n in graph.nodes() if n.op == "conv2d") == depthwise

    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    got = run_reference(graph, {"input": x})["logits"]
    module = getattr(heldout, f"{name}_module")()
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    assert got.shape == (1, 1000)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_export_all_drops_stale_quantizations(heldout, tmp_path, monkeypatch):
    # bench/cpu.py reuses OUT/onnx/NAME-s8.onnx and -u8.onnx when they exist: a changed
    # export must not be timed against onnxruntime's quantization of the old one.
    monkeypatch.setattr(heldout, "MODELS", {"mobilenet_v2": heldout.mobilenet_v2})
    cached = tmp_path / "onnx"
    cached.mkdir()
    stale = cached / "mobilenet_v2-u8.onnx"
    stale.write_bytes(b"old")
    (cached / "other-u8.onnx").write_bytes(b"kept")
    assert heldout.export_all(tmp_path / "torch", 32, cached) == [
        tmp_path / "torch" / "mobilenet_v2.onnx"]
    assert not stale.exists() and (cached / "other-u8.onnx").exists()
    # The same export again writes the same bytes: its quantizations are kept.
    stale.write_bytes(b"current")
    heldout.export_all(tmp_path / "torch", 32, cached)
    assert stale.exists()
