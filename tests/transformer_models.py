"""Small transformers written with plain torch.nn, and their ONNX exports, for the tests
of importing, quantizing and running sequence models.

Three kinds, each small enough for a test (a few layers, width 32, short sequences):

* ``vit``: a vision transformer (patch convolution, class token, learned positions,
  pre-LayerNorm blocks with erf GELU, a classifier on the class token); input
  ``pixel_values`` (1, 3, H, W) float32;
* ``bert``: a BERT-style encoder (token + position + token-type embeddings, post-LayerNorm
  blocks with erf GELU, a tanh pooler and a classifier); inputs ``input_ids`` (1, S)
  int64 and ``attention_mask`` (1, S) int64 (1 keeps a token, 0 masks it);
* ``gpt``: a GPT-style causal decoder (token + position embeddings, a causal mask from a
  lower-triangular buffer, pre-LayerNorm blocks with the tanh GELU written out as
  ``0.5 * x * (1 + tanh(...(x + 0.044715 * x ** 3)))``, a final LayerNorm and an LM head
  tied to the token embedding); input ``input_ids`` (1, S) int64, output logits
  (1, S, vocab).

`build(kind, seed, **sizes)` makes a model in eval mode with seeded weights;
`example_inputs(kind, model)` its inputs as numpy arrays; `export(model, inputs, path,
exporter, opset, fold, dynamic)` writes the ONNX file with torch's TorchScript exporter
(``"legacy"``: ``dynamo=False``) or its dynamo exporter (``"dynamo"``);
`exported(kind, exporter, tmp_path, opset, ...)` does all three and returns (path,
inputs, model); `imported(...)` imports that file too, returning (graph, inputs, path);
`run_onnxruntime(path, inputs)` runs a file on onnxruntime; `torch_outputs(model,
inputs)` runs the torch model.

The attention is written out three ways (`SelfAttention`'s styles: ViT "chunk" (Split),
BERT "separate" (three projections), GPT "packed" (indexing)), and GPT's causal mask
three ways (``causal="add"`` (default), ``"where"``, ``"triu"``), so that the graphs
cover what exporters write for common models.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

__all__ = ["EXPORTERS", "KINDS", "Bert", "Gpt", "Vit", "build", "example_inputs", "export",
           "exported", "imported", "run_onnxruntime", "torch_outputs"]

KINDS = ("vit", "bert", "gpt")
EXPORTERS = ("legacy", "dynamo")


class SelfAttention(nn.Module):
    """Multi-head self-attention written out, in one of three styles that exporters
    write differently:

    * ``"packed"``: one QKV projection, heads split by reshape/permute and indexing
      (Gather of a constant index on an activation);
    * ``"chunk"``: one QKV projection cut by ``chunk`` (Split);
    * ``"separate"``: three projections (BERT's query, key, value).

    Scores are q @ k^T / sqrt(d) plus an additive mask; a boolean `keep` mask (True:
    attend) is applied with ``masked_fill`` (Where on the scores); softmax, @ v."""

    def __init__(self, width: int, heads: int, style: str = "packed"):
        super().__init__()
        self.heads, self.head_dim, self.style = heads, width // heads, style
        if style == "separate":
            self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))
        else:
            self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def _heads(self, t, b, s):
        return t.reshape(b, s, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x, mask=None, keep=None):
        b, s, d = x.shape
        if self.style == "packed":
            qkv = self.qkv(x).reshape(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
        else:
            q, k, v = (self.qkv(x).chunk(3, dim=-1) if self.style == "chunk" else
                       (self.query(x), self.key(x), self.value(x)))
            q, k, v = (self._heads(t, b, s) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        p = scores.softmax(dim=-1)
        y = (p @ v).transpose(1, 2).reshape(b, s, d)
        return self.proj(y)


class TanhGelu(nn.Module):
    """GPT-2's GELU, written out (Pow, Tanh, Mul, Add in the export)."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                           * (x + 0.044715 * torch.pow(x, 3.0))))


class Mlp(nn.Sequential):
    def __init__(self, width: int, act: nn.Module):
        super().__init__(nn.Linear(width, 4 * width), act, nn.Linear(4 * width, width))


class PreNormBlock(nn.Module):
    def __init__(self, width: int, heads: int, act: nn.Module, style: str):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads, style)
        self.mlp = Mlp(width, act)

    def forward(self, x, mask=None, keep=None):
        x = x + self.attn(self.ln1(x), mask, keep)
        return x + self.mlp(self.ln2(x))


class PostNormBlock(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width, eps=1e-12), nn.LayerNorm(width, eps=1e-12)
        self.attn = SelfAttention(width, heads, "separate")
        self.mlp = Mlp(width, nn.GELU())

    def forward(self, x, mask=None):
        x = self.ln1(x + self.attn(x, mask))
        return self.ln2(x + self.mlp(x))


class Vit(nn.Module):
    def __init__(self, width=32, layers=2, heads=2, image=16, patch=4, classes=10,
                 channels=3):
        super().__init__()
        self.image, self.channels = image, channels
        self.patch = nn.Conv2d(channels, width, patch, stride=patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.randn(1, 1, width) * 0.5)
        self.pos = nn.Parameter(torch.randn(1, n + 1, width) * 0.5)
        self.blocks = nn.ModuleList(PreNormBlock(width, heads, nn.GELU(), "chunk")
                                    for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, pixel_values):
        x = self.patch(pixel_values).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


class Bert(nn.Module):
    def __init__(self, width=32, layers=2, heads=2, seq=16, vocab=100, classes=3):
        super().__init__()
        self.seq, self.vocab = seq, vocab
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(seq, width)
        self.types = nn.Embedding(2, width)
        self.norm = nn.LayerNorm(width, eps=1e-12)
        self.blocks = nn.ModuleList(PostNormBlock(width, heads) for _ in range(layers))
        self.pooler = nn.Linear(width, width)
        self.classifier = nn.Linear(width, classes)

    def forward(self, input_ids, attention_mask):
        s = input_ids.shape[1]
        positions = torch.arange(s, device=input_ids.device).unsqueeze(0)
        x = self.tokens(input_ids) + self.positions(positions) + \
            self.types(torch.zeros_like(input_ids))
        x = self.norm(x)
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for block in self.blocks:
            x = block(x, mask)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return self.classifier(pooled)


class Gpt(nn.Module):
    """`causal`: how the causal mask is made: ``"add"`` (an additive -inf mask from a
    lower-triangular buffer), ``"where"`` (``masked_fill`` of the scores with the
    buffer: Where), ``"triu"`` (an additive mask made by ``torch.triu`` in forward:
    Trilu)."""

    def __init__(self, width=32, layers=2, heads=2, seq=16, vocab=100, causal="add"):
        super().__init__()
        self.seq, self.vocab, self.causal_style = seq, vocab, causal
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(PreNormBlock(width, heads, TanhGelu(), "packed")
                                    for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.register_buffer("causal", torch.tril(torch.ones(seq, seq, dtype=torch.bool))
                             .view(1, 1, seq, seq), persistent=False)

    def forward(self, input_ids):
        s = input_ids.shape[1]
        positions = torch.arange(s, device=input_ids.device)
        x = self.tokens(input_ids) + self.positions(positions)
        keep = self.causal[:, :, :s, :s]
        mask = None
        if self.causal_style == "add":
            mask = torch.zeros(1, 1, s, s).masked_fill(~keep, float("-inf"))
        elif self.causal_style == "triu":
            mask = torch.triu(torch.full((s, s), float("-inf")), diagonal=1)
        for block in self.blocks:
            x = block(x, mask, keep if self.causal_style == "where" else None)
        return self.norm(x) @ self.tokens.weight.t()


_CLASSES = {"vit": Vit, "bert": Bert, "gpt": Gpt}


def build(kind: str, seed: int = 0, **sizes) -> nn.Module:
    """A `kind` model ("vit", "bert", "gpt") in eval mode with weights seeded by `seed`;
    `sizes` override the class's defaults (width, layers, heads, seq or image, vocab)."""
    if kind not in _CLASSES:
        raise ValueError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    torch.manual_seed(seed)
    model = _CLASSES[kind](**sizes)
    with torch.no_grad():
        for m in model.modules():     # non-trivial LayerNorm affine maps
            if isinstance(m, nn.LayerNorm):
                m.weight.add_(torch.randn_like(m.weight) * 0.2)
                m.bias.add_(torch.randn_like(m.bias) * 0.2)
    return model.eval()


def example_inputs(kind: str, model: nn.Module, seed: int = 1,
                   masked: int = 3) -> dict[str, np.ndarray]:
    """Inputs for `model` by name: random pixels, or token ids inside the vocabulary (and
    for BERT an attention mask whose last `masked` tokens are 0)."""
    rng = np.random.default_rng(seed)
    if kind == "vit":
        shape = (1, model.channels, model.image, model.image)
        return {"pixel_values": rng.standard_normal(shape).astype(np.float32)}
    ids = rng.integers(0, model.vocab, (1, model.seq), dtype=np.int64)
    if kind == "gpt":
        return {"input_ids": ids}
    mask = np.ones((1, model.seq), np.int64)
    if masked:
        mask[0, -masked:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def torch_outputs(model: nn.Module, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The model's output on `inputs` (numpy in, numpy out)."""
    with torch.no_grad():
        return model(**{k: torch.from_numpy(v) for k, v in inputs.items()}).numpy()


def export(model: nn.Module, inputs: dict[str, np.ndarray], path, exporter: str = "legacy",
           opset: int | None = None, fold: bool = True, dynamic: bool = False) -> Path:
    """Write `model` to `path` as ONNX with torch's TorchScript exporter (``"legacy"``,
    ``dynamo=False``, opset 17 by default) or its dynamo exporter (``"dynamo"``, opset 18
    by default). The graph inputs keep the names of `inputs`; the output is ``logits``.
    ``fold=False`` turns off the exporter's constant folding (legacy) or optimization
    (dynamo), leaving shape computations and mask building in the model; ``dynamic``
    makes the legacy export's sequence (or image batch) axis symbolic."""
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter {exporter!r} is not one of {', '.join(EXPORTERS)}")
    args = tuple(torch.from_numpy(v) for v in inputs.values())
    names = list(inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            axes = {n: ({1: "seq"} if v.dtype == np.int64 else {0: "batch"})
                    for n, v in inputs.items()} if dynamic else None
            torch.onnx.export(model, args, str(path), dynamo=False,
                              opset_version=opset or 17, input_names=names,
                              output_names=["logits"], do_constant_folding=fold,
                              dynamic_axes=axes)
        else:
            torch.onnx.export(model, args, str(path), dynamo=True, verbose=False,
                              opset_version=opset or 18, input_names=names,
                              output_names=["logits"], optimize=fold)
    return Path(path)


def exported(kind: str, exporter: str, tmp_path, opset: int | None = None, seed: int = 0,
             fold: bool = True, dynamic: bool = False, **sizes):
    """Build a small `kind` model, export it with `exporter` into `tmp_path` (`fold`,
    `dynamic`: see `export`); returns (path, inputs, model)."""
    model = build(kind, seed, **sizes)
    inputs = example_inputs(kind, model)
    tag = "_".join(f"{k}{v}" for k, v in sorted(sizes.items()))
    name = f"{kind}_{exporter}_{opset}_{fold}_{dynamic}_{seed}_{tag}.onnx"
    path = export(model, inputs, Path(tmp_path) / name, exporter, opset, fold, dynamic)
    return path, inputs, model


def imported(kind: str, exporter: str, tmp_path, opset: int | None = None, seed: int = 0,
             **sizes):
    """`exported`, then imported with vdla's `from_onnx`; returns (graph, inputs, path)."""
    from vdla.compiler.frontend.onnx_import import from_onnx
    path, inputs, _ = exported(kind, exporter, tmp_path, opset, seed, **sizes)
    return from_onnx(path, input_shapes={k: v.shape for k, v in inputs.items()}), inputs, path


def run_onnxruntime(path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of the ONNX file at `path` on onnxruntime's CPU provider."""
    import onnx
    import onnxruntime as ort
    proto = onnx.load(str(path))
    proto.ir_version = min(proto.ir_version, 10)       # onnxruntime reads <= 10 here
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)
