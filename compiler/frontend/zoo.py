"""Built-in models: torchvision-equivalent architectures with seeded weights, and the
trained digits CNN.

``get(name, *, batch=1, image_size=None, num_classes=None, seed=0) -> Graph``:

=============  ====================================================  ===============
name           architecture                                          default input
=============  ====================================================  ===============
resnet18       ResNet, basic blocks [2, 2, 2, 2]                     1x3x224x224
resnet34       ResNet, basic blocks [3, 4, 6, 3]                     1x3x224x224
resnet50       ResNet, bottlenecks [3, 4, 6, 3], stride on the 3x3   1x3x224x224
               (torchvision's "v1.5")
mobilenet_v1   MobileNet v1, width 1.0: 13 depthwise-separable       1x3x224x224
               blocks, each conv followed by BN + ReLU
mobilenet_v2   MobileNet v2, width 1.0 (torchvision's): 17 inverted   1x3x224x224
               residual blocks, ReLU6, linear bottlenecks
small_cnn      3 x (conv3x3 + BN + ReLU) with max/avg pooling,       1x3x32x32
               flatten, dense
digits_cnn     the CNN trained on scikit-learn's digits by           1x1x8x8
               ``scripts/train_digits.py`` (``models/digits_cnn.onnx``)
vit_tiny       ViT (DeiT-tiny): 12 blocks, width 192, 3 heads        1x3x224x224
bert_base      BERT-base encoder, classifier head                    ids, mask 1x128
bert_tiny      BERT with 2 layers, width 128, 2 heads                ids, mask 1x128
gpt_mini       GPT-2-style decoder: 4 blocks, width 256, 4 heads     ids 1x64
vit_digits     a small ViT trained on the digits by                  1x1x8x8
               ``scripts/train_vit_digits.py`` (``models/vit_digits.npz``)
=============  ====================================================  ===============

The transformers (`vdla.compiler.frontend.zoo_transformers` describes them) take token
ids ``input_ids`` (int64) and, for BERT, an ``attention_mask``; their sequence length is
`seq_len`. They are built in the form an ONNX import of the torch model has.

Every CNN is NCHW float32 with one input named ``"input"`` and one output ``"logits"``
(the last dense layer's output, before any softmax). Weights of the seeded models come
from `vdla.compiler.frontend.builder.GraphBuilder` (He-normal convolutions, data-dependent batch
norm statistics); parameter counts equal torchvision's (resnet18: 11,689,512). BN is kept
as separate nodes, as an importer would produce it, so the BN-folding pass has work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from vdla.compiler.frontend import zoo_transformers
from vdla.compiler.frontend.builder import GraphBuilder
from vdla.compiler.ir.graph import Graph

__all__ = ["DIGITS_MODEL", "MODELS", "SHIPPED_WEIGHTS", "get", "names"]

#: The trained digits model and its training record (written by scripts/train_digits.py).
DIGITS_MODEL = Path(__file__).resolve().parent / "models" / "digits_cnn.onnx"
#: The trained models' files the zoo reads: what a model built from them depends on
#: besides the code (a cache of built models is keyed on their contents too).
SHIPPED_WEIGHTS = (DIGITS_MODEL, zoo_transformers.VIT_DIGITS_MODEL)


def _conv_bn(b: GraphBuilder, x: str, channels: int, kernel: int, stride: int, padding: int,
             conv: str, bn: str, relu: str | None, *, groups: int = 1,
             residual_branch: bool = False) -> str:
    """conv (no bias) + BN, then ReLU when `relu` names it; names follow torchvision."""
    y = b.conv(x, channels, kernel, stride=stride, padding=padding, groups=groups, name=conv)
    y = b.batch_norm(y, residual_branch=residual_branch, name=bn)
    return b.relu(y, name=relu) if relu else y


def _basic_block(b: GraphBuilder, x: str, planes: int, stride: int, prefix: str) -> str:
    in_ch = b.graph.tensors[x].shape[1]
    p = prefix
    y = _conv_bn(b, x, planes, 3, stride, 1, f"{p}conv1", f"{p}bn1", f"{p}relu1")
    y = _conv_bn(b, y, planes, 3, 1, 1, f"{p}conv2", f"{p}bn2", None, residual_branch=True)
    shortcut = x
    if stride != 1 or in_ch != planes:
        shortcut = _conv_bn(b, x, planes, 1, stride, 0, f"{p}downsample.0",
                            f"{p}downsample.1", None)
    return b.relu(b.add(y, shortcut, name=f"{prefix}add"), name=f"{prefix}out")


def _bottleneck(b: GraphBuilder, x: str, planes: int, stride: int, prefix: str) -> str:
    in_ch = b.graph.tensors[x].shape[1]
    out_ch = planes * 4
    p = prefix
    y = _conv_bn(b, x, planes, 1, 1, 0, f"{p}conv1", f"{p}bn1", f"{p}relu1")
    # v1.5: the stride sits on the 3x3, not on the first 1x1.
    y = _conv_bn(b, y, planes, 3, stride, 1, f"{p}conv2", f"{p}bn2", f"{p}relu2")
    y = _conv_bn(b, y, out_ch, 1, 1, 0, f"{p}conv3", f"{p}bn3", None, residual_branch=True)
    shortcut = x
    if stride != 1 or in_ch != out_ch:
        shortcut = _conv_bn(b, x, out_ch, 1, stride, 0, f"{p}downsample.0",
                            f"{p}downsample.1", None)
    return b.relu(b.add(y, shortcut, name=f"{prefix}add"), name=f"{prefix}out")


def _classifier(b: GraphBuilder, x: str, num_classes: int) -> str:
    x = b.flatten(b.global_avg_pool(x, name="avgpool"), name="flatten")
    return b.dense(x, num_classes, name="logits")


def _resnet(block: Callable, layers: list[int]):
    def build(b: GraphBuilder, x: str, num_classes: int) -> str:
        x = _conv_bn(b, x, 64, 7, 2, 3, "conv1", "bn1", "relu")
        x = b.max_pool(x, 3, 2, 1, name="maxpool")
        for stage, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers)):
            for i in range(blocks):
                stride = 2 if stage > 0 and i == 0 else 1
                x = block(b, x, planes, stride, f"layer{stage + 1}.{i}.")
        return _classifier(b, x, num_classes)
    return build


#: MobileNet v1's depthwise-separable blocks: (pointwise output channels, depthwise stride).
_MOBILENET_BLOCKS = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
                     (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1)]


def _mobilenet_v1(b: GraphBuilder, x: str, num_classes: int) -> str:
    x = _conv_bn(b, x, 32, 3, 2, 1, "conv1", "bn1", "relu1")
    for i, (channels, stride) in enumerate(_MOBILENET_BLOCKS):
        c, p = b.graph.tensors[x].shape[1], f"features.{i}."
        x = _conv_bn(b, x, c, 3, stride, 1, f"{p}dw.conv", f"{p}dw.bn", f"{p}dw.relu",
                     groups=c)
        x = _conv_bn(b, x, channels, 1, 1, 0, f"{p}pw.conv", f"{p}pw.bn", f"{p}pw.relu")
    return _classifier(b, x, num_classes)


#: MobileNet v2's inverted residual stages: (expansion t, output channels c, blocks n,
#: stride s of the first block), as in the paper's Table 2 and torchvision.
_MOBILENET_V2_STAGES = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                        (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def _conv_bn_relu6(b: GraphBuilder, x: str, channels: int, kernel: int, stride: int,
                   prefix: str, *, groups: int = 1) -> str:
    """torchvision's Conv2dNormActivation with ReLU6: conv (no bias, same padding), BN,
    clip(0, 6); named ``prefix.0`` (conv), ``prefix.1`` (BN), ``prefix.2`` (ReLU6)."""
    y = _conv_bn(b, x, channels, kernel, stride, kernel // 2, f"{prefix}.0", f"{prefix}.1",
                 None, groups=groups)
    return b.relu6(y, name=f"{prefix}.2")


def _mobilenet_v2(b: GraphBuilder, x: str, num_classes: int) -> str:
    x = _conv_bn_relu6(b, x, 32, 3, 2, "features.0")
    index = 1
    for t, c, n, s in _MOBILENET_V2_STAGES:
        for i in range(n):
            p, in_ch = f"features.{index}.conv", b.graph.tensors[x].shape[1]
            stride = s if i == 0 else 1
            y, layer = x, 0
            if t != 1:   # the first block has no expansion
                y = _conv_bn_relu6(b, y, in_ch * t, 1, 1, f"{p}.{layer}")
                layer += 1
            y = _conv_bn_relu6(b, y, in_ch * t if t != 1 else in_ch, 3, stride,
                               f"{p}.{layer}", groups=in_ch * t if t != 1 else in_ch)
            # The linear bottleneck: a projection with BN and no activation.
            y = _conv_bn(b, y, c, 1, 1, 0, f"{p}.{layer + 1}", f"{p}.{layer + 2}", None,
                         residual_branch=stride == 1 and in_ch == c)
            x = b.add(y, x, name=f"features.{index}.add") if stride == 1 and in_ch == c else y
            index += 1
    x = _conv_bn_relu6(b, x, 1280, 1, 1, f"features.{index}")
    return _classifier(b, x, num_classes)


def _small_cnn(b: GraphBuilder, x: str, num_classes: int) -> str:
    x = _conv_bn(b, x, 16, 3, 1, 1, "conv1", "bn1", "relu1")
    x = b.max_pool(x, 2, 2, name="pool1")
    x = _conv_bn(b, x, 32, 3, 1, 1, "conv2", "bn2", "relu2")
    x = b.max_pool(x, 2, 2, name="pool2")
    x = _conv_bn(b, x, 64, 3, 1, 1, "conv3", "bn3", "relu3")
    x = b.avg_pool(x, 2, 2, name="pool3")
    return b.dense(b.flatten(x, name="flatten"), num_classes, name="logits")


class _Spec:
    """How to build one seeded model: its builder function, default input and classes,
    and the smallest input side it takes (its total downsampling)."""

    def __init__(self, build: Callable, channels: int, image_size: int, num_classes: int,
                 min_size: int):
        self.build, self.channels = build, channels
        self.image_size, self.num_classes, self.min_size = image_size, num_classes, min_size


MODELS: dict[str, object] = {
    "resnet18": _Spec(_resnet(_basic_block, [2, 2, 2, 2]), 3, 224, 1000, 32),
    "resnet34": _Spec(_resnet(_basic_block, [3, 4, 6, 3]), 3, 224, 1000, 32),
    "resnet50": _Spec(_resnet(_bottleneck, [3, 4, 6, 3]), 3, 224, 1000, 32),
    "mobilenet_v1": _Spec(_mobilenet_v1, 3, 224, 1000, 32),
    "mobilenet_v2": _Spec(_mobilenet_v2, 3, 224, 1000, 32),
    "small_cnn": _Spec(_small_cnn, 3, 32, 10, 8),
    "digits_cnn": None,           # trained, loaded from DIGITS_MODEL
    # transformers: their configuration (zoo_transformers.TRANSFORMERS)
    **zoo_transformers.TRANSFORMERS,
}


def names() -> list[str]:
    """The names `get` accepts."""
    return list(MODELS)


def _check_int(value, what: str, minimum: int, hint: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an int >= {minimum}{hint}, not {value!r}")
    return value


def _image_hw(name: str, image_size, spec: _Spec) -> tuple[int, int]:
    if image_size is None:
        return spec.image_size, spec.image_size
    sizes = image_size if isinstance(image_size, (tuple, list)) else (image_size,) * 2
    if len(sizes) != 2:
        raise ValueError(f"{name}: image_size must be an int or (height, width), "
                         f"not {image_size!r}")
    hint = f" ({name} downsamples by {spec.min_size})"
    return tuple(_check_int(s, f"{name}: image_size", spec.min_size, hint) for s in sizes)


def get(name: str, *, batch: int = 1, image_size: int | tuple[int, int] | None = None,
        num_classes: int | None = None, seed: int = 0, seq_len: int | None = None) -> Graph:
    """Build model `name` (one of `names()`) as a validated float `Graph`.

    batch : the input's batch size (>= 1); the weights do not depend on it
    image_size : input height = width (an int), or (height, width); None: the model's
        default; at least the model's total downsampling (32 for the ImageNet models)
    num_classes : classifier outputs; None: 1000 (ImageNet models), 10 (small_cnn)
    seed : seeds every weight of the seeded models
    seq_len : tokens of the text models (bert_base, bert_tiny, gpt_mini); None: 128 for
        BERT, 64 for gpt_mini; image models refuse it, text models refuse image_size
        (num_classes is gpt_mini's vocabulary, 8192 by default)

    digits_cnn is trained: it takes only 8x8 images and 10 classes, ignores `seed`, and
    needs the ONNX importer. vit_digits is trained too: 8x8 images, 10 classes, its
    weights from ``models/vit_digits.npz``. Raises ValueError for an unknown name or a
    bad option."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(names())}")
    batch = _check_int(batch, f"{name}: batch", 1)
    if name in zoo_transformers.TRANSFORMERS:
        return zoo_transformers.build(name, batch=batch, image_size=image_size,
                                      num_classes=num_classes, seq_len=seq_len, seed=seed)
    if seq_len is not None:
        raise ValueError(f"{name}: seq_len is for text models; {name} takes image_size")
    if name == "digits_cnn":
        return _digits_cnn(batch, image_size, num_classes)
    spec = MODELS[name]
    h, w = _image_hw(name, image_size, spec)
    classes = spec.num_classes if num_classes is None else \
        _check_int(num_classes, f"{name}: num_classes", 1)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"{name}: seed must be a non-negative int, not {seed!r}")
    b = GraphBuilder(name, seed=seed)
    x = b.input("input", (batch, spec.channels, h, w))
    graph = b.build([spec.build(b, x, classes)])
    graph.metadata.update(model=name, image_size=(h, w), num_classes=classes)
    return graph


def _digits_cnn(batch: int, image_size, num_classes) -> Graph:
    if image_size not in (None, 8, (8, 8), [8, 8]):
        raise ValueError(f"digits_cnn: image_size is fixed at 8 (trained on 8x8 digits), "
                         f"not {image_size!r}")
    if num_classes not in (None, 10):
        raise ValueError(f"digits_cnn: num_classes is fixed at 10 (trained), "
                         f"not {num_classes!r}")
    if not DIGITS_MODEL.is_file():
        raise ValueError(f"digits_cnn: the trained model {DIGITS_MODEL} is missing; make it "
                         "with `python scripts/train_digits.py`")
    # onnx is a heavy import that the seeded models do not need.
    import onnx
    from vdla.compiler.frontend.onnx_import import from_onnx   # heavy: onnx
    if batch == 1:
        graph = from_onnx(DIGITS_MODEL)
    else:
        model = onnx.load(DIGITS_MODEL)
        _rebatch(model, batch)
        graph = from_onnx(model)
    graph.name = "digits_cnn"
    graph.metadata.update(model="digits_cnn", image_size=(8, 8), num_classes=10)
    return graph


#: ONNX operators whose meaning does not depend on the batch size (no shape constants).
_BATCH_FREE_OPS = frozenset({"Conv", "BatchNormalization", "Relu", "Clip", "Add", "MaxPool",
                             "AveragePool", "GlobalAveragePool", "Flatten", "Gemm"})


def _rebatch(model, batch: int):
    """Set the batch dimension of `model`'s inputs and outputs to `batch`, in place.

    The committed file fixes batch 1 (what the accelerator runs) and the importer rightly
    refuses to override a fixed dimension; this is safe only because every operator of
    the digits model is batch-free (Flatten(axis=1), no Reshape to a constant shape)."""
    ops = {node.op_type for node in model.graph.node}
    if not ops <= _BATCH_FREE_OPS:
        raise ValueError(f"digits_cnn: {DIGITS_MODEL.name} uses {sorted(ops - _BATCH_FREE_OPS)}, "
                         f"which may fix the batch; only batch=1 is available")
    for value in list(model.graph.input) + list(model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = batch
    del model.graph.value_info[:]          # intermediate shapes recorded for batch 1
