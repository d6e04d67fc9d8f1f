"""The model zoo: every model builds and validates, has torchvision's parameter count and
layer structure, runs to finite, non-degenerate activations, and (when the ONNX exporter
is present) agrees with onnxruntime and survives an ONNX round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vdla.compiler import run_reference, zoo

HAVE_EXPORT = (Path(zoo.__file__).parent / "onnx_export.py").is_file()
SEEDED = ["resnet18", "resnet34", "resnet50", "mobilenet_v1", "mobilenet_v2", "small_cnn"]
#: Small inputs keep the reference runs fast; 32 is the ImageNet models' minimum.
SMALL = {"resnet18": 32, "resnet34": 32, "resnet50": 32, "mobilenet_v1": 32,
         "mobilenet_v2": 32, "small_cnn": 32}


def _params(graph) -> int:
    """Trainable parameters as torch counts them: BN running statistics excluded."""
    stats = {i for n in graph.nodes() if n.op == "batch_norm" for i in n.inputs[3:5]}
    return sum(t.data.size for name, t in graph.tensors.items()
               if t.is_constant and name not in stats)


def _image(graph, seed=0):
    shape = graph.tensors["input"].shape
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_names():
    assert zoo.names() == ["resnet18", "resnet34", "resnet50", "mobilenet_v1",
                           "mobilenet_v2", "small_cnn",
                           "digits_cnn", "vit_tiny", "bert_base", "bert_tiny", "gpt_mini",
                           "vit_digits"]


@pytest.mark.parametrize("name, params, ops", [
    ("resnet18", 11_689_512, {"conv2d": 20, "batch_norm": 20, "relu": 17, "add": 8}),
    ("resnet50", 25_557_032, {"conv2d": 53, "batch_norm": 53, "relu": 49, "add": 16}),
    # MobileNet v1 1.0: 27 convs (1 + 13 depthwise + 13 pointwise), each with BN and ReLU.
    ("mobilenet_v1", 4_231_976, {"conv2d": 27, "batch_norm": 27, "relu": 27}),
    # MobileNet v2 1.0 (torchvision's count): 52 convs (stem, 17 blocks of expand (but the
    # first), depthwise and projection, the 1x1 to 1280), ReLU6 on all but the 17
    # projections, 10 residual adds.
    ("mobilenet_v2", 3_504_872, {"conv2d": 52, "batch_norm": 52, "clip": 35, "add": 10}),
])
def test_full_size_models(name, params, ops):
    g = zoo.get(name)
    g.validate()
    assert g.inputs == ["input"] and g.outputs == ["logits"]
    assert g.tensors["input"].shape == (1, 3, 224, 224)
    assert g.tensors["logits"].shape == (1, 1000)
    assert _params(g) == params
    counts = g.count_ops()
    assert {k: counts[k] for k in ops} == ops
    assert counts["global_avg_pool2d"] == 1 and counts["dense"] == 1
    # The deepest feature map is 7x7 at 224 (total downsampling 32).
    gap = [n for n in g.nodes() if n.op == "global_avg_pool2d"][0]
    assert g.tensors[gap.inputs[0]].shape[2:] == (7, 7)


def test_resnet34_parameters():
    # Parameter counts do not depend on the image size (global pooling before the dense).
    assert _params(zoo.get("resnet34", image_size=32)) == 21_797_672


def test_mobilenet_v1_parameters_from_its_architecture():
    # Count MobileNet v1 from its definition: 3x3 stem, 13 (depthwise 3x3 + pointwise 1x1)
    # blocks, BN (gamma, beta) after each conv, dense 1024 -> 1000 with bias.
    widths = [32, 64, 128, 128, 256, 256, 512, 512, 512, 512, 512, 512, 1024, 1024]
    total = 3 * 32 * 9 + 2 * 32
    for cin, cout in zip(widths, widths[1:]):
        total += cin * 9 + 2 * cin + cin * cout + 2 * cout
    total += 1024 * 1000 + 1000
    assert total == 4_231_976
    assert _params(zoo.get("mobilenet_v1", image_size=32)) == total


def test_mobilenet_v2_parameters_from_its_architecture():
    # Count MobileNet v2 from the paper's table: stem 3x3 to 32, inverted residual blocks
    # (t, c, n, s), the 1x1 to 1280 and the dense; BN (gamma, beta) after each conv.
    total, cin = 3 * 32 * 9 + 2 * 32, 32
    for t, c, n, _ in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for _ in range(n):
            hidden = cin * t
            if t != 1:
                total += cin * hidden + 2 * hidden
            total += hidden * 9 + 2 * hidden + hidden * c + 2 * c
            cin = c
    total += 320 * 1280 + 2 * 1280 + 1280 * 1000 + 1000
    assert total == 3_504_872
    g = zoo.get("mobilenet_v2", image_size=32)
    assert _params(g) == total
    # Names follow torchvision; the residual joins only where the shape is kept.
    assert g.node("features.2.conv.1.0").attrs["groups"] == 96
    assert g.node("features.2.conv.1.0").attrs["strides"] == (2, 2)
    assert "features.2.add" not in g.nx and "features.3.add" in g.nx
    assert g.node("features.18.2").op == "clip"


def test_resnet50_is_v1_5_and_names_follow_torchvision():
    g = zoo.get("resnet50", image_size=64)
    # v1.5: the stride of a downsampling bottleneck sits on its 3x3 conv.
    assert g.node("layer2.0.conv1").attrs["strides"] == (1, 1)
    assert g.node("layer2.0.conv2").attrs["strides"] == (2, 2)
    assert g.node("layer2.0.downsample.0").attrs["strides"] == (2, 2)
    assert g.tensors["layer2.0.conv3.weight"].shape == (512, 128, 1, 1)
    assert g.node("conv1").attrs["pads"] == (3, 3, 3, 3)
    pool = g.node("maxpool").attrs
    assert (pool["kernel"], pool["strides"], pool["pads"]) == ((3, 3), (2, 2), (1, 1, 1, 1))
    r18 = zoo.get("resnet18", image_size=32)
    assert "layer1.0.downsample.0" not in r18.nx and "layer2.0.downsample.0" in r18.nx
    mb = zoo.get("mobilenet_v1", image_size=32)
    assert mb.node("features.1.dw.conv").attrs["groups"] == 64
    assert mb.node("features.1.dw.conv").attrs["strides"] == (2, 2)


@pytest.mark.parametrize("name", SEEDED)
def test_models_run_to_sane_activations(name):
    g = zoo.get(name, batch=2, image_size=SMALL[name])
    g.validate()
    x = np.concatenate([_image(g, 1)[:1], _image(g, 2)[:1]])
    values = run_reference(g, {"input": x}, keep=True)
    logits = values["logits"]
    assert logits.shape == (2, zoo.MODELS[name].num_classes)
    assert np.all(np.isfinite(logits))
    assert not np.allclose(logits[0], logits[1], atol=1e-3)     # the input matters
    assert 0.05 < logits.std() < 50
    relus = [n.outputs[0] for n in g.nodes() if n.op in ("relu", "clip")]   # clip: ReLU6
    assert relus
    for r in relus:
        v = values[r]
        assert np.all(np.isfinite(v)), r
        assert 0.1 < v.std() < 10, (r, v.std())            # neither collapsed nor exploding
        assert 0.1 < (v > 0).mean() < 0.99, (r, (v > 0).mean())
    # Batch norm really normalizes: the last BN's output is about N(beta, gamma^2).
    bn = [n for n in g.nodes() if n.op == "batch_norm"][-1]
    out = values[bn.outputs[0]]
    assert 0.1 < out.std() < 5


def test_options():
    g = zoo.get("small_cnn", batch=3, image_size=(16, 24), num_classes=7, seed=5)
    assert g.tensors["input"].shape == (3, 3, 16, 24)
    assert g.tensors["logits"].shape == (3, 7)
    assert zoo.get("small_cnn").tensors["input"].shape == (1, 3, 32, 32)
    r = zoo.get("resnet18", image_size=64, num_classes=10)
    assert r.tensors["logits"].shape == (1, 10) and r.tensors["input"].shape == (1, 3, 64, 64)


def test_seeds_fix_the_weights_and_batch_does_not_change_them():
    a = zoo.get("small_cnn")
    b = zoo.get("small_cnn", batch=4)
    c = zoo.get("small_cnn", seed=1)
    for name, t in a.tensors.items():
        if t.is_constant:
            np.testing.assert_array_equal(t.data, b.tensors[name].data)
            assert not np.array_equal(t.data, c.tensors[name].data), name
    x = _image(a)
    np.testing.assert_array_equal(run_reference(a, {"input": x})["logits"],
                                  run_reference(zoo.get("small_cnn"), {"input": x})["logits"])


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="resnet19"), r"unknown model 'resnet19'; known models: resnet18, .*digits_cnn"),
    (dict(name="resnet18", batch=0), r"resnet18: batch must be an int >= 1, not 0"),
    (dict(name="resnet18", batch=True), r"batch must be an int >= 1, not True"),
    (dict(name="resnet18", image_size=16),
     r"resnet18: image_size must be an int >= 32 \(resnet18 downsamples by 32\), not 16"),
    (dict(name="small_cnn", image_size=4), r"image_size must be an int >= 8"),
    (dict(name="mobilenet_v1", image_size=(32, 32, 3)), r"image_size must be an int or "
                                                          r"\(height, width\)"),
    (dict(name="resnet50", image_size=64.0), r"image_size must be an int >= 32"),
    (dict(name="small_cnn", num_classes=0), r"num_classes must be an int >= 1, not 0"),
    (dict(name="small_cnn", seed=-2), r"seed must be a non-negative int, not -2"),
    (dict(name="digits_cnn", image_size=16), r"digits_cnn: image_size is fixed at 8"),
    (dict(name="digits_cnn", num_classes=100), r"digits_cnn: num_classes is fixed at 10"),
])
def test_bad_options(kwargs, match):
    name = kwargs.pop("name")
    with pytest.raises(ValueError, match=match):
        zoo.get(name, **kwargs)


# --- ONNX: onnxruntime agrees with the reference, and the round trip is lossless -------

@pytest.mark.skipif(not HAVE_EXPORT, reason="compiler/onnx_export.py is not there yet")
@pytest.mark.parametrize("name, size", [("resnet18", 32), ("mobilenet_v1", 32),
                                        ("mobilenet_v2", 32), ("small_cnn", 32)])
def test_onnx_export_matches_onnxruntime_and_round_trips(name, size):
    ort = pytest.importorskip("onnxruntime")
    from vdla.compiler import from_onnx, to_onnx

    g = zoo.get(name, image_size=size)
    model = to_onnx(g)
    x = _image(g, 3)
    ref = run_reference(g, {"input": x})["logits"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(["logits"], {"input": x})[0]
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())
    back = from_onnx(model)
    assert back.inputs == ["input"] and back.outputs == ["logits"]
    again = run_reference(back, {"input": x})["logits"]
    assert np.abs(again - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())
