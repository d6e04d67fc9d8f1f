"""Models exported by torch (legacy TorchScript exporter and dynamo exporter) import and
compute what onnxruntime and torch compute."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from vdla.compiler import run_reference  # noqa: E402
from vdla.compiler.frontend.onnx_import import from_onnx  # noqa: E402


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNetStyle(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU())
        self.layer1 = BasicBlock(8, 8, 1)
        self.layer2 = BasicBlock(8, 16, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class VGGStyle(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Linear(16 * 8 * 8, 32), nn.ReLU(), nn.Dropout(0.5),
                                        nn.Linear(32, 10))

    def forward(self, x):
        x = self.features(x)
        return self.classifier(x.view(x.size(0), -1))


def separable(cin, cout, stride):
    return nn.Sequential(
        nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
        nn.ReLU6(),
        nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU6())


class MobileNetStyle(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6(),
            separable(8, 16, 1), separable(16, 32, 2), nn.AvgPool2d(8))
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(self.features(x).reshape(x.shape[0], -1))


def build(cls, seed=0):
    """The model in eval mode with seeded weights and non-trivial BN statistics (so that
    folding them, or not, matters)."""
    torch.manual_seed(seed)
    model = cls()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.weight.data = torch.rand(n) + 0.5
            m.bias.data = torch.randn(n) * 0.2
            m.running_mean = torch.randn(n) * 0.2
            m.running_var = torch.rand(n) + 0.5
    return model.eval()


def export(model, x, path, how):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "legacy":
            torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=13)
        elif how == "legacy_unfolded":
            # No constant folding and a symbolic batch: BatchNormalization nodes and
            # Shape/Gather/Unsqueeze/Concat computations stay in the model.
            torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=13,
                              do_constant_folding=False, input_names=["x"],
                              dynamic_axes={"x": {0: "batch"}})
        elif how == "dynamo":
            torch.onnx.export(model, (x,), str(path), dynamo=True, verbose=False)
        else:
            # Unoptimized: Shape/Expand/CastLike bias computations and BN stay in.
            torch.onnx.export(model, (x,), str(path), dynamo=True, verbose=False,
                              optimize=False)
    return path


def close(got, want):
    return np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("how", ["legacy", "dynamo", "legacy_unfolded", "dynamo_unoptimized"])
@pytest.mark.parametrize("cls", [ResNetStyle, VGGStyle, MobileNetStyle])
def test_torch_model_imports_and_matches(cls, how, tmp_path):
    model = build(cls)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want_torch = model(x).numpy()
    path = export(model, x, tmp_path / f"{cls.__name__}.onnx", how)

    graph = from_onnx(path)
    proto = onnx.load(path)
    proto.ir_version = min(proto.ir_version, 10)       # onnxruntime reads <= 13
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {sess.get_inputs()[0].name: x.numpy()}
    want_ort = sess.run(None, feeds)[0]
    assert graph.inputs == [sess.get_inputs()[0].name]
    assert graph.outputs == [sess.get_outputs()[0].name]      # the ONNX output name stays
    got = run_reference(graph, feeds)[graph.outputs[0]]

    assert got.shape == (1, 10)
    assert close(got, want_ort)
    assert close(got, want_torch)
    # Only layer ops reach the graph: the shape computations were evaluated at import.
    ops = set(graph.count_ops())
    assert ops <= {"conv2d", "batch_norm", "relu", "clip", "add", "max_pool2d", "avg_pool2d",
                   "global_avg_pool2d", "flatten", "reshape", "dense"}
    assert graph.metadata["onnx"]["producer"] == "pytorch"
    assert graph.metadata["onnx"]["opset"] == (13 if how.startswith("legacy") else
                                               proto.opset_import[0].version)
    if how.endswith("unfolded") or how.endswith("unoptimized"):
        assert "batch_norm" in ops
    if cls is MobileNetStyle:
        convs = [n for n in graph.nodes() if n.op == "conv2d"]
        assert any(n.attrs["groups"] == 8 for n in convs)
        assert graph.count_ops()["clip"] == 5


@pytest.mark.parametrize("opset, cls", [(9, MobileNetStyle), (11, VGGStyle), (17, ResNetStyle)])
def test_legacy_exporter_opsets(opset, cls, tmp_path):
    # Older opsets: Clip with attributes and a Pad in front of AveragePool (opset 9),
    # Unsqueeze with an axes attribute (before 13).
    model = build(cls, seed=opset)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(opset))
    path = tmp_path / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=opset,
                          do_constant_folding=False, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}})
    graph = from_onnx(path, input_shapes={"x": (2, 3, 32, 32)})
    assert graph.metadata["onnx"]["opset"] == opset
    got = run_reference(graph, {"x": x.numpy()})[graph.outputs[0]]
    with torch.no_grad():
        assert close(got, model(x).numpy())
    proto = onnx.load(path)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    assert close(got, sess.run(None, {"x": x.numpy()})[0])
