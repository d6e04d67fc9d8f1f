"""Train the small vision transformer that `vdla.compiler.zoo.get("vit_digits")` builds.

Usage: pip install -e ".[train]" && python scripts/train_vit_digits.py

Trains on `vdla.compiler.frontend.datasets.digits_split()` (scikit-learn's bundled 8x8
digits, the split the digits CNN trains on) with torch on the CPU, seeded and
deterministic, in well under a minute. The network, a ViT written with plain torch.nn::

    patch embedding: conv 2x2 stride 2 (1 -> 64)      -> 16 tokens of 64, + class token
    + learned position embedding                        -> 17 x 64
    2 x pre-LN block: LayerNorm, 4-head self-attention (q, k, v and output linears),
                      residual; LayerNorm, MLP 64 -> 128 -> 64 with GELU, residual
    LayerNorm, the class token's features -> Linear(64 -> 10)

Its parameters keep torch's names, which are the names of the zoo graph's constants
(``blocks.0.attn.q.weight``, ...); training uses dropout (0.2 on the attention
probabilities and the MLP's output) and weight decay, which the graph does not need.
It writes, atomically,
``compiler/frontend/models/vit_digits.npz`` (the parameters, float32) and
``compiler/frontend/models/vit_digits.json`` (split, seed, epochs, versions, and the
float test accuracy measured with torch, with vdla's float reference on the zoo graph
built from the written weights, and with onnxruntime on the model exported by
torch.onnx.export (TorchScript, opset 17)). It refuses to write a model whose zoo graph
does not reproduce torch's logits. ``--out DIR`` writes elsewhere; ``--help`` lists the
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
#: The architecture; zoo_transformers.TRANSFORMERS["vit_digits"] must say the same.
WIDTH, DEPTH, HEADS, MLP, PATCH, CLASSES, EPSILON = 64, 2, 4, 128, 2, 10, 1e-6
#: Dropout in training (attention probabilities, the MLP's output); none in the graph.
DROPOUT = 0.2


def make_model():
    import torch
    import torch.nn as nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(WIDTH, WIDTH) for _ in range(3))
            self.proj = nn.Linear(WIDTH, WIDTH)
            self.drop = nn.Dropout(DROPOUT)

        def forward(self, x):
            b, n, d = x.shape
            dh = d // HEADS

            def heads(t):
                return t.reshape(b, n, HEADS, dh).transpose(1, 2)
            q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
            p = torch.softmax(q @ k.transpose(-2, -1) * dh ** -0.5, dim=-1)
            p = self.drop(p)
            return self.proj((p @ v).transpose(1, 2).reshape(b, n, d))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.LayerNorm(WIDTH, eps=EPSILON)
            self.attn = Attention()
            self.norm2 = nn.LayerNorm(WIDTH, eps=EPSILON)
            self.mlp = nn.Module()
            self.mlp.fc1, self.mlp.fc2 = nn.Linear(WIDTH, MLP), nn.Linear(MLP, WIDTH)
            self.act = nn.GELU()
            self.drop = nn.Dropout(DROPOUT)

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.drop(self.mlp.fc2(self.act(self.mlp.fc1(self.norm2(x)))))

    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            tokens = (8 // PATCH) ** 2
            self.patch_embed = nn.Module()
            self.patch_embed.proj = nn.Conv2d(1, WIDTH, PATCH, stride=PATCH)
            self.cls_token = nn.Parameter(torch.randn(1, 1, WIDTH) * 0.02)
            self.pos_embed = nn.Parameter(torch.randn(1, tokens + 1, WIDTH) * 0.02)
            self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
            self.norm = nn.LayerNorm(WIDTH, eps=EPSILON)
            self.head = nn.Linear(WIDTH, CLASSES)

        def forward(self, x):
            x = self.patch_embed.proj(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
            x = x + self.pos_embed
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x)[:, 0])

    return ViT()


def train(seed: int, epochs: int, batch_size: int, lr: float, weight_decay: float):
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
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps = epochs * ((len(xt) + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps,
                                                pct_start=0.1)
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
            sched.step()
            total += float(loss.detach()) * len(idx)
        if (epoch + 1) % 10 == 0 or epoch + 1 == epochs:
            print(f"epoch {epoch + 1:3d}/{epochs}: loss {total / len(xt):.4f}", file=sys.stderr)
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(x_test)).argmax(1).numpy()
    return model, float((pred == y_test).mean()), (x_test, y_test)


def parameters(model) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}


def npz_bytes(params: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **params)           # zip entries dated 1980: the same bytes every time
    return buf.getvalue()


def zoo_check(model, params, x_test, y_test) -> tuple[float, float]:
    """(vdla's float-reference accuracy of the zoo graph with `params`, the largest
    difference from torch's logits relative to their largest magnitude)."""
    import tempfile

    import torch

    from vdla.compiler import run_reference
    from vdla.compiler.frontend import zoo_transformers

    c = zoo_transformers.TRANSFORMERS["vit_digits"]
    if (c.width, c.depth, c.heads, c.mlp, c.patch, c.num_classes, c.epsilon) != \
            (WIDTH, DEPTH, HEADS, MLP, PATCH, CLASSES, EPSILON):
        raise SystemExit(f"error: the zoo's vit_digits ({c}) is not the architecture "
                         "trained here")
    with tempfile.TemporaryDirectory(prefix="vit-digits-") as tmp:
        path = Path(tmp) / "vit_digits.npz"
        path.write_bytes(npz_bytes(params))
        graph = zoo_transformers.vit_digits(batch=len(x_test), weights=path)
    logits = run_reference(graph, {"input": x_test})["logits"]
    with torch.no_grad():
        want = model(torch.from_numpy(x_test)).numpy()
    err = float(np.abs(logits - want).max() / np.abs(want).max())
    return float((logits.argmax(1) == y_test).mean()), err


def onnxruntime_accuracy(model, x_test, y_test) -> float:
    """Accuracy of the model exported by torch.onnx.export (TorchScript, opset 17), run by
    onnxruntime on the whole test split at once (dynamic batch)."""
    import onnxruntime as ort
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (torch.zeros(1, 1, 8, 8),), buf, dynamo=False,
                          opset_version=17, input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    sess = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])
    pred = sess.run(None, {"input": x_test})[0].argmax(1)
    return float((pred == y_test).mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--min-accuracy", type=float, default=0.97,
                    help="refuse to write a model whose test accuracy is lower")
    ap.add_argument("--out", type=Path, default=MODEL_DIR,
                    help="folder for vit_digits.npz and vit_digits.json")
    args = ap.parse_args(argv)

    import onnx
    import onnxruntime
    import sklearn
    import torch

    from vdla._fileio import atomic_write
    from vdla.compiler.frontend.datasets import DIGITS_SPLIT

    model, acc_torch, (x_test, y_test) = train(args.seed, args.epochs, args.batch_size,
                                               args.lr, args.weight_decay)
    params = parameters(model)
    acc_vdla, err = zoo_check(model, params, x_test, y_test)
    acc_ort = onnxruntime_accuracy(model, x_test, y_test)
    print(f"test accuracy: torch {acc_torch:.4f}, vdla float reference {acc_vdla:.4f}, "
          f"onnxruntime {acc_ort:.4f}; zoo graph vs torch logits: {err:.2e} relative",
          file=sys.stderr)
    if err > 1e-4:
        print(f"error: the zoo graph's logits differ from torch's by {err:.2e} (relative); "
              "not writing the model", file=sys.stderr)
        return 1
    if min(acc_torch, acc_vdla, acc_ort) < args.min_accuracy:
        print(f"error: accuracy {min(acc_torch, acc_vdla, acc_ort):.4f} is below "
              f"{args.min_accuracy}; not writing the model", file=sys.stderr)
        return 1
    record = {
        "model": "vit_digits.npz",
        "architecture": f"ViT: patch {PATCH} conv (1-{WIDTH}), class token, position "
                        f"embedding, {DEPTH} pre-LN blocks ({HEADS}-head attention, MLP "
                        f"{WIDTH}-{MLP}-{WIDTH} GELU), LayerNorm, linear({WIDTH}-{CLASSES})",
        "parameters": int(sum(v.size for v in params.values())),
        "split": {**DIGITS_SPLIT, "n_train": 1797 - len(y_test), "n_test": len(y_test)},
        "seed": args.seed, "epochs": args.epochs, "batch_size": args.batch_size,
        "optimizer": f"AdamW lr={args.lr} weight_decay={args.weight_decay}, one-cycle "
                     f"schedule, dropout {DROPOUT}",
        "torch_version": torch.__version__, "onnx_version": onnx.__version__,
        "onnxruntime_version": onnxruntime.__version__, "sklearn_version": sklearn.__version__,
        "test_accuracy_torch": acc_torch, "test_accuracy_vdla_float": acc_vdla,
        "test_accuracy_onnxruntime": acc_ort,
    }
    for name, content in (("vit_digits.npz", npz_bytes(params)),
                          ("vit_digits.json", (json.dumps(record, indent=2) + "\n").encode())):
        # atomic_write's temporary file is private (0600); these are package data.
        atomic_write(args.out / name, content).chmod(0o644)
    print(f"wrote {args.out / 'vit_digits.npz'} and vit_digits.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
