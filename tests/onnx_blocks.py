"""Small ONNX networks of architectures vdla's zoo does not write, exported by torch
(`torch.onnx.export`), for the tests and for bench/coverage.py:

* `inception_block`: an Inception-v1 (GoogLeNet) style network: stem convolution and
  ceil-mode max pool, two Inception modules of four concatenated branches whose channel
  counts are no multiple of 16, global average pool over 7x7, linear;
* `densenet_block`: a DenseNet-BC style network: a dense block of three BN-ReLU-conv1x1-
  BN-ReLU-conv3x3 layers (growth rate 12), each concatenated with its input (so BN
  follows a concat), a transition, final BN-ReLU, global average pool, linear;
* `alexnet_grouped`: a small AlexNet: convolutions with groups 2 and 4, ReLU, local
  response normalization followed by max pooling, dense layers.

Each function takes a folder (or a path ending in ``.onnx``), writes the model there and
returns the file's path. The models are deterministic: weights from `torch.manual_seed`,
BatchNorm layers in eval mode with random non-trivial running statistics (so folding
them, or not, matters). The input is named ``input``, the output ``logits``, as in the
zoo. They are exported by torch's TorchScript-based exporter (``dynamo=False``, opset
13, constant folding on): the exporter tests/compiler/test_onnx_torch.py shows working
for every construct used here; the ONNX IR version is capped at 10 so that
onnxruntime reads the file whatever onnx wrote.

Run as a script to write all three into a folder::

    python tests/onnx_blocks.py OUT_DIR
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from collections.abc import Callable

__all__ = ["BLOCKS", "INPUT_SHAPES", "alexnet_grouped", "densenet_block", "inception_block"]

#: Highest ONNX IR version written (onnxruntime rejects files newer than it knows).
MAX_IR_VERSION = 10


def _torch():
    """torch and torch.nn, imported on first use (a heavy import; an optional
    dependency of vdla), with a clear error when missing."""
    try:
        import torch
    except ImportError as e:          # pragma: no cover - torch is a test dependency
        raise ImportError("tests/onnx_blocks.py builds its models with torch: "
                          "pip install torch") from e
    return torch, torch.nn


def _target(path: str | Path, name: str) -> Path:
    """The file to write: `path` itself when it ends in .onnx, else `path`/`name`.onnx
    (the folder is created)."""
    path = Path(path)
    if path.suffix.lower() == ".onnx":
        path.parent.mkdir(parents=True, exist_ok=True)
        return path
    path.mkdir(parents=True, exist_ok=True)
    return path / f"{name}.onnx"


def randomize_batch_norms(model, seed: int):
    """Give every BatchNorm2d random affine parameters and running statistics (seeded)
    and put the model in eval mode, so BN is a non-trivial per-channel affine map."""
    torch, nn = _torch()
    generator = torch.Generator().manual_seed(seed + 1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.weight.data = torch.rand(n, generator=generator) + 0.5
            m.bias.data = torch.randn(n, generator=generator) * 0.2
            m.running_mean = torch.randn(n, generator=generator) * 0.2
            m.running_var = torch.rand(n, generator=generator) + 0.5
    return model.eval()


def export(model, shape: tuple[int, ...], path: Path) -> Path:
    """Export `model` (eval mode) for an input of `shape` to `path` (opset 13, legacy
    exporter), with the IR version capped at `MAX_IR_VERSION`; returns `path`."""
    torch, _ = _torch()
    import onnx

    x = torch.zeros(shape)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")   # the legacy exporter's deprecation notice
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=13,
                          input_names=["input"], output_names=["logits"])
    proto = onnx.load(str(path))
    if proto.ir_version > MAX_IR_VERSION:
        proto.ir_version = MAX_IR_VERSION
        onnx.save(proto, str(path))
    onnx.checker.check_model(proto)
    return path


# --- Inception-v1 ---------------------------------------------------------------------------

def _inception_module(cin: int, b1: int, b2: tuple[int, int], b3: tuple[int, int], b4: int,
                      five: bool):
    """GoogLeNet's module: 1x1 | 1x1 -> 3x3 | 1x1 -> 5x5 (3x3 when not `five`) |
    maxpool 3x3 s1 p1 -> 1x1, each conv followed by ReLU, concatenated on channels
    (b2, b3: the reduction's and the spatial conv's output channels)."""
    torch, nn = _torch()

    def conv(i, o, k):
        return [nn.Conv2d(i, o, k, padding=k // 2), nn.ReLU()]

    class Module(nn.Module):
        def __init__(self):
            super().__init__()
            self.branch1 = nn.Sequential(*conv(cin, b1, 1))
            self.branch2 = nn.Sequential(*conv(cin, b2[0], 1), *conv(b2[0], b2[1], 3))
            self.branch3 = nn.Sequential(*conv(cin, b3[0], 1),
                                         *conv(b3[0], b3[1], 5 if five else 3))
            self.branch4 = nn.Sequential(nn.MaxPool2d(3, 1, 1), *conv(cin, b4, 1))
            self.out_channels = b1 + b2[1] + b3[1] + b4

        def forward(self, x):
            return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x),
                              self.branch4(x)], 1)

    return Module()


def inception_block(path: str | Path, *, seed: int = 0) -> Path:
    """An Inception-v1 style network as ONNX, input 1x3x56x56 (56 rather than 64 so that
    the last feature map is 7x7, as in GoogLeNet: its global average pool then counts 49
    elements, no power of two), about 7 M MACs.

    stem: conv 7x7/2 (3 -> 32) + ReLU, max pool 3x3/2 with ceil_mode (28 -> 14; floor
    mode would give 13); module 3a (32 -> 24 + 40 + 12 + 20 = 96 channels, a 5x5
    branch); max pool 3x3/2 ceil (14 -> 7); module 3b (96 -> 40 + 52 + 20 + 28 = 140, a
    3x3 in the third branch); global average pool; flatten; linear 140 -> 10.

    path : a folder (the file is ``inception_block.onnx`` in it) or a path ending in .onnx
    seed : seeds the weights
    Returns the path of the ONNX file."""
    torch, nn = _torch()
    torch.manual_seed(seed)

    class Inception(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 32, 7, 2, 3), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, ceil_mode=True))
            self.a = _inception_module(32, 24, (16, 40), (8, 12), 20, five=True)
            self.pool = nn.MaxPool2d(3, 2, ceil_mode=True)
            self.b = _inception_module(self.a.out_channels, 40, (24, 52), (12, 20), 28,
                                       five=False)
            self.gap = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(self.b.out_channels, 10)

        def forward(self, x):
            x = self.b(self.pool(self.a(self.stem(x))))
            return self.fc(torch.flatten(self.gap(x), 1))

    model = randomize_batch_norms(Inception(), seed)
    return export(model, INPUT_SHAPES["inception_block"], _target(path, "inception_block"))


# --- DenseNet --------------------------------------------------------------------------------

def densenet_block(path: str | Path, *, seed: int = 0, growth: int = 12) -> Path:
    """A DenseNet-BC style network as ONNX, input 1x3x32x32, about 24 M MACs.

    stem: conv 3x3 (3 -> 24, no bias); a dense block of 3 layers, each BN-ReLU-conv1x1
    (-> 4 x growth) -BN-ReLU-conv3x3 (-> growth), concatenated with its input (24 -> 36
    -> 48 -> 60 channels: the first BN of each layer follows a concat or a convolution
    the concat also reads, so it folds into no convolution); a transition: BN-ReLU-
    conv1x1 (60 -> 30) and average pool 2x2; final BN-ReLU; global average pool over
    16x16; linear 30 -> 10.

    path : a folder (the file is ``densenet_block.onnx`` in it) or a path ending in .onnx
    seed : seeds the weights and the BN statistics
    growth : the growth rate (default 12: no multiple of 16)
    Returns the path of the ONNX file."""
    torch, nn = _torch()
    torch.manual_seed(seed)

    class DenseLayer(nn.Module):
        def __init__(self, cin: int):
            super().__init__()
            self.body = nn.Sequential(
                nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, 4 * growth, 1, bias=False),
                nn.BatchNorm2d(4 * growth), nn.ReLU(),
                nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False))

        def forward(self, x):
            return torch.cat([x, self.body(x)], 1)

    class DenseNet(nn.Module):
        def __init__(self):
            super().__init__()
            stem = 24
            self.stem = nn.Conv2d(3, stem, 3, padding=1, bias=False)
            self.block = nn.Sequential(*(DenseLayer(stem + i * growth) for i in range(3)))
            width = stem + 3 * growth
            self.transition = nn.Sequential(nn.BatchNorm2d(width), nn.ReLU(),
                                            nn.Conv2d(width, width // 2, 1, bias=False),
                                            nn.AvgPool2d(2, 2))
            self.final = nn.Sequential(nn.BatchNorm2d(width // 2), nn.ReLU())
            self.gap = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(width // 2, 10)

        def forward(self, x):
            x = self.final(self.transition(self.block(self.stem(x))))
            return self.fc(torch.flatten(self.gap(x), 1))

    model = randomize_batch_norms(DenseNet(), seed)
    return export(model, INPUT_SHAPES["densenet_block"], _target(path, "densenet_block"))


# --- AlexNet with grouped convolutions -------------------------------------------------------

def _lrn_module(size: int, *, alpha: float, beta: float, k: float):
    """`torch.nn.LocalResponseNorm` that exports as one ONNX ``LRN`` node (the exporter
    writes torch's own module as a 3-D average pool over an unsqueezed square, which is
    not the operator a model file from another framework holds). torch's and ONNX's LRN
    agree: ``x / (k + alpha / size * sum of squares over the channel window) ** beta``,
    the window centred (for odd `size`)."""
    torch, nn = _torch()

    class LrnFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.nn.functional.local_response_norm(x, size, alpha, beta, k)

        @staticmethod
        def symbolic(g, x):
            return g.op("LRN", x, size_i=size, alpha_f=alpha, beta_f=beta, bias_f=k)

    class Lrn(nn.Module):
        def forward(self, x):
            return LrnFunction.apply(x)

    return Lrn()


def alexnet_grouped(path: str | Path, *, seed: int = 0) -> Path:
    """A small AlexNet as ONNX, input 1x3x64x64, about 28 M MACs: the original's two
    GPU halves as groups=2, one layer with groups=4, LRN before the max pools.

    conv 7x7/2 (3 -> 48) + ReLU, LRN(5), max pool 3x3/2 (31 -> 15); conv 5x5 groups 2
    (48 -> 96) + ReLU, LRN(5), max pool 3x3/2 (15 -> 7); conv 3x3 groups 2 (96 -> 144)
    + ReLU; conv 3x3 groups 4 (144 -> 144) + ReLU; conv 3x3 groups 2 (144 -> 96) + ReLU,
    max pool 3x3/2 (7 -> 3); flatten; linear 864 -> 256 + ReLU, dropout, linear
    256 -> 128 + ReLU, linear 128 -> 10.

    path : a folder (the file is ``alexnet_grouped.onnx`` in it) or a path ending in .onnx
    seed : seeds the weights
    Returns the path of the ONNX file."""
    torch, nn = _torch()
    torch.manual_seed(seed)

    def lrn():
        return _lrn_module(5, alpha=1e-4, beta=0.75, k=2.0)

    model = nn.Sequential(
        nn.Conv2d(3, 48, 7, 2, 2), nn.ReLU(), lrn(), nn.MaxPool2d(3, 2),
        nn.Conv2d(48, 96, 5, padding=2, groups=2), nn.ReLU(), lrn(), nn.MaxPool2d(3, 2),
        nn.Conv2d(96, 144, 3, padding=1, groups=2), nn.ReLU(),
        nn.Conv2d(144, 144, 3, padding=1, groups=4), nn.ReLU(),
        nn.Conv2d(144, 96, 3, padding=1, groups=2), nn.ReLU(), nn.MaxPool2d(3, 2),
        nn.Flatten(), nn.Linear(96 * 3 * 3, 256), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    model = randomize_batch_norms(model, seed)
    return export(model, INPUT_SHAPES["alexnet_grouped"], _target(path, "alexnet_grouped"))


#: The input shape of each block.
INPUT_SHAPES: dict[str, tuple[int, ...]] = {
    "inception_block": (1, 3, 56, 56),
    "densenet_block": (1, 3, 32, 32),
    "alexnet_grouped": (1, 3, 64, 64),
}

#: Each block by name: a function (folder) -> ONNX path.
BLOCKS: dict[str, Callable[..., Path]] = {
    "inception_block": inception_block,
    "densenet_block": densenet_block,
    "alexnet_grouped": alexnet_grouped,
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python tests/onnx_blocks.py OUT_DIR", file=sys.stderr)
        return 2
    for build in BLOCKS.values():
        print(build(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
