"""Train the small digits CNN that `vdla.compiler.zoo.get("digits_cnn")` loads.

Usage: pip install -e ".[train]" && python scripts/train_digits.py

Trains on `vdla.compiler.frontend.datasets.digits_split()` (scikit-learn's bundled 8x8 digits) with
torch on the CPU, seeded and deterministic, in a few seconds. The network::

    conv3x3(1->16, pad 1) + BN + ReLU
    conv3x3(16->32, pad 1) + BN + ReLU
    max pool 2x2                                  -> 32 x 4 x 4
    conv3x3(32->32, pad 1) + BN + ReLU
    flatten (torch.flatten(x, 1): ONNX Flatten, so any batch works) + Linear(512 -> 10)

In eval mode the exporter folds each BN into the conv before it, so the file holds
Conv (with bias), Relu, MaxPool, Flatten and Gemm. It writes, atomically,
``compiler/frontend/models/digits_cnn.onnx`` (opset 13, input "input" (1, 1, 8, 8), output
"logits", IR version 10 so onnxruntime reads it) and ``compiler/frontend/models/digits_cnn.json``
(split, seed, epochs, versions, and the float test accuracy measured with torch and with
onnxruntime on the exported file). ``--out DIR`` writes elsewhere; ``--help`` lists the
training options. Training is deterministic: the same versions give the same bytes.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "compiler" / "frontend" / "models"
#: onnx >= 1.17 writes IR versions that onnxruntime 1.31 cannot read (it takes <= 13).
IR_VERSION = 10


def make_model():
    import torch.nn as nn

    class DigitsCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
            self.classifier = nn.Linear(32 * 4 * 4, 10)

        def forward(self, x):
            import torch
            return self.classifier(torch.flatten(self.features(x), 1))

    return DigitsCNN()


def train(seed: int, epochs: int, batch_size: int, lr: float):
    """Train the model; returns (model in eval mode, torch test accuracy, split)."""
    import torch
    import torch.nn.functional as F

    from vdla.compiler.frontend.datasets import digits_split

    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)          # one thread: the same sums in the same order, always
    x_train, y_train, x_test, y_test = digits_split()
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    gen = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(xt), generator=gen)
        total = 0.0
        for i in range(0, len(xt), batch_size):
            idx = order[i:i + batch_size]
            loss = F.cross_entropy(model(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss) * len(idx)
        sched.step()
        print(f"epoch {epoch + 1:2d}/{epochs}: loss {total / len(xt):.4f}", file=sys.stderr)
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(x_test)).argmax(1).numpy()
    return model, float((pred == y_test).mean()), (x_test, y_test)


def export(model) -> bytes:
    """The model as ONNX bytes (batch fixed to 1, IR version onnxruntime reads)."""
    import onnx
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings():
        # The TorchScript exporter is deprecated, but it is the one that needs no
        # onnxscript at training time and writes a plain opset-13 graph.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(model.eval(), (torch.zeros(1, 1, 8, 8),), buf, dynamo=False,
                          opset_version=13, input_names=["input"], output_names=["logits"])
    proto = onnx.load_from_string(buf.getvalue())
    proto.ir_version = IR_VERSION
    proto.producer_name = "vdla scripts/train_digits.py"
    onnx.checker.check_model(proto)
    return proto.SerializeToString()


def onnxruntime_accuracy(data: bytes, x_test: np.ndarray, y_test: np.ndarray) -> float:
    """Accuracy of the exported model, one image at a time (its batch is fixed at 1)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    pred = [int(np.argmax(sess.run(None, {"input": x[None]})[0])) for x in x_test]
    return float((np.array(pred) == y_test).mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-accuracy", type=float, default=0.95,
                    help="refuse to write a model whose test accuracy is lower")
    ap.add_argument("--out", type=Path, default=MODEL_DIR,
                    help="folder for digits_cnn.onnx and digits_cnn.json")
    args = ap.parse_args(argv)

    import onnx
    import onnxruntime
    import sklearn
    import torch

    from vdla._fileio import atomic_write
    from vdla.compiler.frontend.datasets import DIGITS_SPLIT

    model, acc_torch, (x_test, y_test) = train(args.seed, args.epochs, args.batch_size,
                                               args.lr)
    data = export(model)
    acc_ort = onnxruntime_accuracy(data, x_test, y_test)
    print(f"test accuracy: torch {acc_torch:.4f}, onnxruntime {acc_ort:.4f}", file=sys.stderr)
    if min(acc_torch, acc_ort) < args.min_accuracy:
        print(f"error: accuracy {min(acc_torch, acc_ort):.4f} is below {args.min_accuracy}; "
              "not writing the model", file=sys.stderr)
        return 1
    record = {
        "model": "digits_cnn.onnx",
        "architecture": "conv3x3(1-16)+BN+ReLU, conv3x3(16-32)+BN+ReLU, maxpool2, "
                        "conv3x3(32-32)+BN+ReLU, flatten, linear(512-10)",
        "split": {**DIGITS_SPLIT, "n_train": 1797 - len(y_test), "n_test": len(y_test)},
        "seed": args.seed, "epochs": args.epochs, "batch_size": args.batch_size,
        "optimizer": f"Adam lr={args.lr}, cosine schedule",
        "opset": 13, "ir_version": IR_VERSION,
        "torch_version": torch.__version__, "onnx_version": onnx.__version__,
        "onnxruntime_version": onnxruntime.__version__, "sklearn_version": sklearn.__version__,
        "test_accuracy_torch": acc_torch, "test_accuracy_onnxruntime": acc_ort,
    }
    for name, content in (("digits_cnn.onnx", data),
                          ("digits_cnn.json", (json.dumps(record, indent=2) + "\n").encode())):
        # atomic_write's temporary file is private (0600); these are package data.
        atomic_write(args.out / name, content).chmod(0o644)
    print(f"wrote {args.out / 'digits_cnn.onnx'} ({len(data)} bytes) and digits_cnn.json",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
