"""The CPU target against onnxruntime on models the bench never tuned on.

`bench/cpu.py` measures, tunes and checks resnet18, resnet50 and mobilenet_v1 from the
zoo; the default chooser's cost model and rules were read off those layers. This script
checks that the speed holds on models from outside: two CNNs defined here in plain
`torch.nn` (no torchvision), in the style of known architectures but with layer shapes
none of the three has, exported to ONNX by torch as a user would, then imported by vdla
like any user's file:

* `mobilenet_v2`: MobileNet-v2 (width 1.0): a 3x3/2 stem, 17 inverted residual blocks
  (1x1 expansion by 6, depthwise 3x3, linear 1x1 projection; residual adds where the
  shape allows), ReLU6 (ONNX Clip), a 1x1 conv to 1280 channels, global average pool,
  linear 1280 -> 1000. Channel counts 24, 144 and 576 are no multiple of the 16-lane
  vector, and the residual sums feeding the next expansion are signed (so the int8
  expansion layers read an input that may be negative);
* `resnet34_w48`: ResNet-34's layout (basic blocks 3, 4, 6, 3) at stage widths 48, 96,
  192, 384 instead of 64 ... 512, so no convolution has a shape of the zoo's ResNets.

Weights are seeded (`torch.manual_seed`), BatchNorm is in eval mode with random
non-trivial running statistics; batch 1, 224x224 RGB input named ``input``, output
``logits``. Export: torch's TorchScript-based exporter (``dynamo=False``, opset 13,
constant folding on), the settings tests/compiler/test_onnx_torch.py and
tests/onnx_blocks.py use, with the IR version capped at 10 for onnxruntime.

Then it runs bench/cpu.py's speed part on the two files, in a subprocess (torch's own
thread pools stay out of the measuring process):

    python3 bench/cpu.py --models OUT/torch/mobilenet_v2.onnx OUT/torch/resnet34_w48.onnx
        --skip-tune --skip-convergence --skip-exactness --threads 2 --out OUT

That run checks the timed whole-graph outputs against the reference (int8 bit-exact,
float32 within `pipeline.FLOAT_TOLERANCE`; it stops on a mismatch); this script then
prints each one's error from OUT/cpu.json and whether float32 stays within 1e-5.

    python3 bench/heldout.py [--out bench-heldout] [--threads 2] [--rounds 9]
                             [--size 224] [--export-only]

Writes OUT/torch/*.onnx (torch's files), and bench/cpu.py's OUT/cpu.json, OUT/cpu.png
and OUT/onnx/ (onnxruntime's files, its quantizations kept for the next run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

#: float32's bound for these models (tighter than pipeline.FLOAT_TOLERANCE, 1e-4).
FLOAT_BOUND = 1e-5

# MobileNet-v2's inverted residual settings: expansion t, output channels c, blocks n,
# first block's stride s (Sandler et al. 2018, table 2).
MOBILENET_V2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                         (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
RESNET34_BLOCKS = (3, 4, 6, 3)
RESNET34_W48_WIDTHS = (48, 96, 192, 384)


def _torch():
    """torch and torch.nn, imported on first use (a heavy import that the bench part,
    run in a subprocess, never needs here)."""
    try:
        import torch
    except ImportError as e:            # pragma: no cover - torch is a test dependency
        raise SystemExit("bench/heldout.py builds its models with torch: "
                         "pip install torch") from e
    return torch, torch.nn


def _blocks():
    """tests/onnx_blocks.py, whose torch helpers the tests' networks use: one seeded
    BatchNorm randomizer and one exporter for every torch model this project writes."""
    tests = Path(__file__).resolve().parents[1] / "tests"
    if str(tests) not in sys.path:
        sys.path.insert(0, str(tests))
    import onnx_blocks  # heavy: torch, on first use
    return onnx_blocks


def _randomize_batch_norms(model, seed: int):
    """Every BatchNorm2d's affine parameters and running statistics drawn (seeded), and
    the model in eval mode (`onnx_blocks.randomize_batch_norms`)."""
    return _blocks().randomize_batch_norms(model, seed)


def _target(path: str | Path, name: str) -> Path:
    """The file to write: `path` itself when it ends in .onnx, else `path`/`name`.onnx
    (folders created).

    path : a folder or an .onnx path
    name : the file's stem in a folder"""
    path = Path(path)
    if path.suffix.lower() != ".onnx":
        path = path / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _export(model, size: int, path: Path) -> Path:
    """Export `model` (eval mode) for a 1x3x`size`x`size` input to `path`
    (`onnx_blocks.export`: opset 13, the IR version capped, checked by onnx's checker);
    returns `path`."""
    return _blocks().export(model, (1, 3, size, size), path)


# --- MobileNet-v2 ---------------------------------------------------------------------------

def mobilenet_v2_module(*, seed: int = 0, classes: int = 1000):
    """MobileNet-v2 (width 1.0) as a torch module in eval mode, seeded.

    seed : seeds the weights and the BN statistics
    classes : the classifier's outputs
    Returns the module."""
    torch, nn = _torch()
    torch.manual_seed(seed)

    def conv_bn(cin, cout, k, stride=1, groups=1, act=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout)]
        return layers + [nn.ReLU6()] if act else layers

    class InvertedResidual(nn.Module):
        def __init__(self, cin, cout, stride, expand):
            super().__init__()
            hidden = cin * expand
            layers = conv_bn(cin, hidden, 1) if expand != 1 else []
            layers += conv_bn(hidden, hidden, 3, stride, groups=hidden)
            layers += conv_bn(hidden, cout, 1, act=False)     # the linear bottleneck
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            return x + self.body(x) if self.residual else self.body(x)

    class MobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            layers, cin = conv_bn(3, 32, 3, 2), 32
            for t, c, n, s in MOBILENET_V2_SETTINGS:
                for i in range(n):
                    layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                    cin = c
            layers += conv_bn(cin, 1280, 1)
            self.features = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

        def forward(self, x):
            return self.classifier(torch.flatten(self.pool(self.features(x)), 1))

    return _randomize_batch_norms(MobileNetV2(), seed)


def mobilenet_v2(path: str | Path, *, size: int = 224, seed: int = 0) -> Path:
    """MobileNet-v2 as ONNX (about 300 M MACs at 224x224).

    path : a folder (the file is ``mobilenet_v2.onnx`` in it) or a path ending in .onnx
    size : the input's height and width (a multiple of 32 keeps every stage whole)
    seed : seeds the weights
    Returns the path of the ONNX file."""
    return _export(mobilenet_v2_module(seed=seed), size, _target(path, "mobilenet_v2"))


# --- ResNet-34 at other widths ----------------------------------------------------------

def resnet34_w48_module(*, seed: int = 0, widths=RESNET34_W48_WIDTHS,
                        blocks=RESNET34_BLOCKS, classes: int = 1000):
    """A ResNet-34-style network (basic blocks, 1x1 projection shortcuts) as a torch
    module in eval mode, seeded.

    seed : seeds the weights and the BN statistics
    widths : the four stages' channels (the stem has the first)
    blocks : the four stages' basic blocks
    classes : the classifier's outputs
    Returns the module."""
    torch, nn = _torch()
    torch.manual_seed(seed)

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
            y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False),
                                      nn.BatchNorm2d(widths[0]), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            stages, cin = [], widths[0]
            for i, (width, n) in enumerate(zip(widths, blocks)):
                for j in range(n):
                    stages.append(BasicBlock(cin, width, 2 if i > 0 and j == 0 else 1))
                    cin = width
            self.stages = nn.Sequential(*stages)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, classes)

        def forward(self, x):
            return self.fc(torch.flatten(self.pool(self.stages(self.stem(x))), 1))

    return _randomize_batch_norms(ResNet(), seed)


def resnet34_w48(path: str | Path, *, size: int = 224, seed: int = 0) -> Path:
    """The ResNet-34-style network at widths 48/96/192/384 as ONNX (about 2.1 G MACs at
    224x224).

    path : a folder (the file is ``resnet34_w48.onnx`` in it) or a path ending in .onnx
    size : the input's height and width (a multiple of 32 keeps every stage whole)
    seed : seeds the weights
    Returns the path of the ONNX file."""
    return _export(resnet34_w48_module(seed=seed), size, _target(path, "resnet34_w48"))


#: Each held-out model by name: a function (path, size=, seed=) -> ONNX path.
MODELS = {"mobilenet_v2": mobilenet_v2, "resnet34_w48": resnet34_w48}


# --- main ----------------------------------------------------------------------------------

def export_all(folder: Path, size: int, cached: Path) -> list[Path]:
    """Export every model into `folder`. Where a file's bytes change (another seed, size
    or definition), bench/cpu.py's kept onnxruntime quantizations of it in `cached` are
    deleted: it reuses any that exist, and they would be of the old model.

    folder : where torch's files go
    size : the input's height and width
    cached : bench/cpu.py's onnx folder (OUT/onnx)
    Returns the files' paths."""
    paths = []
    for name, export in MODELS.items():
        path = folder / f"{name}.onnx"
        old = path.read_bytes() if path.exists() else None
        export(path, size=size)
        if path.read_bytes() != old:
            for stale in cached.glob(f"{name}-*8.onnx"):
                stale.unlink()
        paths.append(path)
    return paths


def print_exactness(report: dict) -> bool:
    """Each timed configuration's error against the reference, from bench/cpu.py's
    report; True when int8 is bit-exact and float32 within `FLOAT_BOUND` everywhere.

    report : bench/cpu.py's cpu.json, loaded"""
    ok = True
    print(f"\nExactness of the timed whole-graph runs (int8: bit-exact; float32: largest "
          f"relative error, bound {FLOAT_BOUND:g})")
    for row in report["speed"]:
        for who in ("vdla-default", "vdla-tuned"):
            if who not in row:
                continue
            error = row[who]["max_error"]
            good = error == 0.0 if row["precision"] == "int8" else error <= FLOAT_BOUND
            ok &= good
            what = ("bit-exact" if error == 0.0 else f"error {error:.2e}") \
                if row["precision"] == "int8" else f"{error:.2e}"
            print(f"  {row['model']:14}{row['precision']:9}{who:14}{what:12}"
                  f"{'ok' if good else 'NO'}")
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench-heldout",
                   help="output folder (default bench-heldout)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    p.add_argument("--size", type=int, default=224, help="input height and width")
    p.add_argument("--export-only", action="store_true", help="write the ONNX files only")
    args = p.parse_args(argv)
    out = Path(args.out)
    paths = export_all(out / "torch", args.size, out / "onnx")
    for path in paths:
        print(f"exported {path}", flush=True)
    if args.export_only:
        return 0
    bench = Path(__file__).resolve().with_name("cpu.py")
    command = [sys.executable, str(bench), "--models", *map(str, paths), "--skip-tune",
               "--skip-convergence", "--skip-exactness", "--threads", str(args.threads),
               "--rounds", str(args.rounds), "--out", str(out)]
    print("$ " + " ".join(command), flush=True)
    # A subprocess: torch's thread pools, started by the export, stay out of the process
    # that times OpenMP and onnxruntime; bench/cpu.py exits non-zero on a mismatch.
    rc = subprocess.run(command).returncode
    if rc != 0:
        return rc
    report = json.loads((out / "cpu.json").read_text())
    return 0 if print_exactness(report) else 1


if __name__ == "__main__":
    sys.exit(main())
