"""Transformer models of the zoo: ViT, BERT-style and GPT-style, written with
`vdla.compiler.frontend.builder.GraphBuilder` in the form a torch export of the same
torch.nn model takes after vdla's ONNX import.

=============  =======================================================  ==================
name           architecture                                             default inputs
=============  =======================================================  ==================
vit_tiny       ViT (DeiT-tiny): 12 pre-LN blocks, width 192, 3 heads,   input 1x3x224x224
               MLP 768, patch 16, class token; 1000 classes
bert_base      BERT-base encoder: 12 post-LN layers, width 768, 12      input_ids,
               heads, FFN 3072, vocabulary 30522; pooler + classifier   attention_mask 1x128
               (2 classes)
bert_tiny      the same with 2 layers, width 128, 2 heads, FFN 512      input_ids,
                                                                        attention_mask 1x128
gpt_mini       GPT-2-style causal decoder: 4 pre-LN blocks, width 256,  input_ids 1x64
               4 heads, MLP 1024 (tanh GELU), vocabulary 8192, LM
               head tied to the token embedding
vit_digits     a small ViT trained on scikit-learn's digits by          input 1x1x8x8
               ``scripts/train_vit_digits.py``: patch 2, width 64, 2
               blocks, 4 heads (``models/vit_digits.npz``)
=============  =======================================================  ==================

Each graph has one output, ``"logits"``: (N, classes) for the classifiers (the class
token's features, or BERT's pooled first token, through the head), (N, S, vocabulary)
for gpt_mini. Token ids are int64 inputs (N, S); BERT's ``attention_mask`` is int64 (N,
S), 1 for a token and 0 for padding, turned into the additive mask ``(1 - mask) *
-10000`` (cast, reshape to (N, 1, 1, S), sub, mul), as transformers' BERT does.

The graph is what an ONNX import of the torch.nn model makes of it: every linear layer
on a 2-D view (reshape -> dense -> reshape), ``layer_norm`` and ``gelu`` nodes, and the
attention core written out (q, k, v split into heads by reshape and transpose, matmul,
scale, mask, softmax, matmul), so the fusion passes find what they would find in an
imported model. Constant inputs are folded as the importer folds them: the position
embeddings of the first S positions are one constant; BERT has no token type
embedding (one segment).

Weights are seeded (``np.random.default_rng(seed)``) with BERT's and ViT's initializer:
N(0, 0.02^2) linear weights and embeddings, zero biases, LayerNorm gamma 1 and beta 0
(the ViT patch embedding is a convolution with the builder's He-normal weights).
Tensor names follow the torch modules' parameter names (``encoder.layer.0.attention.
self.query.weight``, ``blocks.0.mlp.fc1.bias``, ...); vit_digits loads its trained
weights by those names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vdla.compiler.frontend.builder import GraphBuilder
from vdla.compiler.ir.graph import Graph

__all__ = ["TRANSFORMERS", "VIT_DIGITS_MODEL", "build", "load_vit_digits_weights",
           "parameter_count", "training_record", "vit_digits"]

#: The trained vit_digits weights (torch parameter names -> arrays) and their training
#: record, written by scripts/train_vit_digits.py.
VIT_DIGITS_MODEL = Path(__file__).resolve().parent / "models" / "vit_digits.npz"


@dataclass(frozen=True)
class ViTConfig:
    width: int
    depth: int
    heads: int
    mlp: int
    patch: int
    image_size: int
    channels: int
    num_classes: int
    epsilon: float = 1e-6
    trained: bool = False
    kind: str = "vit"


@dataclass(frozen=True)
class BertConfig:
    width: int
    depth: int
    heads: int
    ffn: int
    vocab: int
    seq_len: int
    num_classes: int = 2
    max_positions: int = 512
    epsilon: float = 1e-12
    kind: str = "bert"


@dataclass(frozen=True)
class GPTConfig:
    width: int
    depth: int
    heads: int
    vocab: int
    seq_len: int
    max_positions: int = 1024
    epsilon: float = 1e-5
    kind: str = "gpt"


TRANSFORMERS = {
    "vit_tiny": ViTConfig(width=192, depth=12, heads=3, mlp=768, patch=16, image_size=224,
                          channels=3, num_classes=1000),
    "bert_base": BertConfig(width=768, depth=12, heads=12, ffn=3072, vocab=30522,
                            seq_len=128),
    "bert_tiny": BertConfig(width=128, depth=2, heads=2, ffn=512, vocab=30522, seq_len=128),
    "gpt_mini": GPTConfig(width=256, depth=4, heads=4, vocab=8192, seq_len=64),
    "vit_digits": ViTConfig(width=64, depth=2, heads=4, mlp=128, patch=2, image_size=8,
                            channels=1, num_classes=10, trained=True),
}


# --- blocks ------------------------------------------------------------------------------

def _self_attention(b: GraphBuilder, x: str, heads: int, names: tuple[str, str, str, str],
                    prefix: str, *, mask: str | None = None, causal: bool = False,
                    scale_op: str = "mul") -> str:
    """q, k, v projections of `x`, the attention core, the output projection."""
    width = b.graph.tensors[x].shape[-1]
    q, k, v = (b.linear(x, width, name=n) for n in names[:3])
    ctx = b.attention_heads(q, k, v, heads, mask=mask, causal=causal, scale_op=scale_op,
                            name=prefix)
    return b.linear(ctx, width, name=names[3])


def _vit(b: GraphBuilder, c: ViTConfig, batch: int, size: int, num_classes: int) -> str:
    x = b.input("input", (batch, c.channels, size, size))
    patches = b.conv(x, c.width, c.patch, stride=c.patch, bias=True, name="patch_embed.proj")
    n = (size // c.patch) ** 2
    tokens = b.transpose(b.reshape(patches, (batch, c.width, n), name="patch_embed.flatten"),
                         (0, 2, 1), name="patch_embed.tokens")
    cls = b.constant("cls_token", b.normal((1, 1, c.width), 0.02))
    if batch > 1:
        cls = b.expand(cls, (batch, 1, c.width), name="cls_token.expand")
    x = b.concat([cls, tokens], axis=1, name="tokens")
    pos = b.constant("pos_embed", b.normal((1, n + 1, c.width), 0.02))
    x = b.add(x, pos, name="pos_drop")
    for i in range(c.depth):
        p = f"blocks.{i}."
        a = b.layer_norm(x, epsilon=c.epsilon, name=f"{p}norm1")
        a = _self_attention(b, a, c.heads, (f"{p}attn.q", f"{p}attn.k", f"{p}attn.v",
                                            f"{p}attn.proj"), f"{p}attn")
        x = b.add(x, a, name=f"{p}add1")
        m = b.layer_norm(x, epsilon=c.epsilon, name=f"{p}norm2")
        m = b.gelu(b.linear(m, c.mlp, name=f"{p}mlp.fc1"), name=f"{p}mlp.act")
        m = b.linear(m, c.width, name=f"{p}mlp.fc2")
        x = b.add(x, m, name=f"{p}add2")
    x = b.layer_norm(x, epsilon=c.epsilon, name="norm")
    cls = b.reshape(b.slice(x, 1, 0, 1, name="cls"), (batch, c.width), name="cls.flatten")
    return b.linear(cls, num_classes, name="head", output="logits")


def _bert(b: GraphBuilder, c: BertConfig, batch: int, seq: int, num_classes: int) -> str:
    ids = b.input("input_ids", (batch, seq), dtype="int64", high=c.vocab)
    mask = b.input("attention_mask", (batch, seq), dtype="int64")
    x = b.embedding(ids, c.vocab, c.width, name="embeddings.word_embeddings")
    table = b.normal((c.max_positions, c.width), 0.02)
    x = b.add(x, b.constant("embeddings.position_embeddings", table[:seq]),
              name="embeddings.sum")
    x = b.layer_norm(x, epsilon=c.epsilon, name="embeddings.LayerNorm")
    m = b.reshape(b.cast(mask, "float32", name="mask.float"), (batch, 1, 1, seq),
                  name="mask.heads")
    m = b.sub(b.constant("mask.one", np.float32(1.0)), m, name="mask.inverted")
    m = b.mul(m, b.constant("mask.min", np.float32(-10000.0)),
              name="extended_attention_mask")
    for i in range(c.depth):
        p = f"encoder.layer.{i}."
        s = f"{p}attention.self."
        a = _self_attention(b, x, c.heads, (f"{s}query", f"{s}key", f"{s}value",
                                            f"{p}attention.output.dense"),
                            f"{p}attention.self", mask=m, scale_op="div")
        x = b.layer_norm(b.add(a, x, name=f"{p}attention.output.add"), epsilon=c.epsilon,
                         name=f"{p}attention.output.LayerNorm")
        h = b.gelu(b.linear(x, c.ffn, name=f"{p}intermediate.dense"),
                   name=f"{p}intermediate.act")
        h = b.linear(h, c.width, name=f"{p}output.dense")
        x = b.layer_norm(b.add(h, x, name=f"{p}output.add"), epsilon=c.epsilon,
                         name=f"{p}output.LayerNorm")
    first = b.reshape(b.slice(x, 1, 0, 1, name="pooler.first"), (batch, c.width),
                      name="pooler.first_flat")
    pooled = b.tanh(b.linear(first, c.width, name="pooler.dense"), name="pooler.activation")
    return b.linear(pooled, num_classes, name="classifier", output="logits")


def _gpt(b: GraphBuilder, c: GPTConfig, batch: int, seq: int, vocab: int) -> str:
    ids = b.input("input_ids", (batch, seq), dtype="int64", high=vocab)
    x = b.embedding(ids, vocab, c.width, name="wte")
    wte = b.graph.tensors["wte.weight"].data
    table = b.normal((c.max_positions, c.width), 0.02)
    x = b.add(x, b.constant("wpe", table[:seq]), name="embeddings")
    for i in range(c.depth):
        p = f"h.{i}."
        a = b.layer_norm(x, epsilon=c.epsilon, name=f"{p}ln_1")
        a = _self_attention(b, a, c.heads, (f"{p}attn.q_proj", f"{p}attn.k_proj",
                                            f"{p}attn.v_proj", f"{p}attn.c_proj"),
                            f"{p}attn", causal=True)
        x = b.add(x, a, name=f"{p}add1")
        m = b.layer_norm(x, epsilon=c.epsilon, name=f"{p}ln_2")
        m = b.gelu(b.linear(m, 4 * c.width, name=f"{p}mlp.c_fc"), approximate="tanh",
                   name=f"{p}mlp.act")
        x = b.add(x, b.linear(m, c.width, name=f"{p}mlp.c_proj"), name=f"{p}add2")
    x = b.layer_norm(x, epsilon=c.epsilon, name="ln_f")
    # The LM head is tied to the token embedding: an import holds the table twice (the
    # gather's, and the matmul's transposed copy folded back into dense weights).
    return b.linear(x, vocab, bias=False, weight=wte, name="lm_head", output="logits")


# --- building ----------------------------------------------------------------------------

def _check_int(value, what: str, minimum: int, maximum: int | None = None,
               hint: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or \
            (maximum is not None and value > maximum):
        limits = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{what} must be an int {limits}{hint}, not {value!r}")
    return value


def build(name: str, *, batch: int = 1, image_size=None, num_classes: int | None = None,
          seq_len: int | None = None, seed: int = 0) -> Graph:
    """Build transformer `name` (a key of `TRANSFORMERS`) as a validated float `Graph`;
    `zoo.get` documents the options. ValueError for a bad option."""
    c = TRANSFORMERS[name]
    if c.kind == "vit":
        if seq_len is not None:
            raise ValueError(f"{name}: seq_len is for text models; {name} takes image_size")
        size = _vit_size(name, c, image_size)
        if c.trained and num_classes not in (None, c.num_classes):
            raise ValueError(f"{name}: num_classes is fixed at {c.num_classes} (trained), "
                             f"not {num_classes!r}")
        classes = c.num_classes if num_classes is None else \
            _check_int(num_classes, f"{name}: num_classes", 1)
        extra = {"image_size": (size, size)}
    else:
        if image_size is not None:
            raise ValueError(f"{name}: image_size is for image models; {name} takes seq_len "
                             f"(tokens, default {c.seq_len})")
        seq = c.seq_len if seq_len is None else \
            _check_int(seq_len, f"{name}: seq_len", 1, c.max_positions,
                       f" (the {c.max_positions} positions of its embedding)")
        default = c.num_classes if c.kind == "bert" else c.vocab
        classes = default if num_classes is None else \
            _check_int(num_classes, f"{name}: num_classes", 1,
                       hint=" (gpt_mini: the vocabulary)" if c.kind == "gpt" else "")
        extra = {"seq_len": seq}
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"{name}: seed must be a non-negative int, not {seed!r}")
    if c.kind == "vit" and c.trained:
        return vit_digits(batch=batch)
    # No batch norm to set from data: the builder need not run the layers as it adds them.
    b = GraphBuilder(name, seed=seed, eager=False)
    if c.kind == "vit":
        out = _vit(b, c, batch, size, classes)
    elif c.kind == "bert":
        out = _bert(b, c, batch, seq, classes)
    else:
        out = _gpt(b, c, batch, seq, classes)
    graph = b.build([out])
    graph.metadata.update(model=name, num_classes=classes, **extra)
    return graph


def vit_digits(*, batch: int = 1, weights: str | Path = VIT_DIGITS_MODEL) -> Graph:
    """The trained vit_digits graph with `batch` images, its weights from `weights` (see
    `load_vit_digits_weights`)."""
    c = TRANSFORMERS["vit_digits"]
    b = GraphBuilder("vit_digits", seed=0, eager=False)
    graph = b.build([_vit(b, c, batch, c.image_size, c.num_classes)])
    load_vit_digits_weights(graph, Path(weights))
    graph.metadata.update(model="vit_digits", num_classes=c.num_classes,
                          image_size=(c.image_size, c.image_size))
    return graph


def _vit_size(name: str, c: ViTConfig, image_size) -> int:
    if image_size is None:
        return c.image_size
    if c.trained and image_size not in (c.image_size, (c.image_size,) * 2,
                                        [c.image_size] * 2):
        raise ValueError(f"{name}: image_size is fixed at {c.image_size} (trained on "
                         f"{c.image_size}x{c.image_size} digits), not {image_size!r}")
    sizes = image_size if isinstance(image_size, (tuple, list)) else (image_size,) * 2
    if len(sizes) != 2 or sizes[0] != sizes[1]:
        raise ValueError(f"{name}: image_size must be an int or a square (size, size), not "
                         f"{image_size!r}")
    size = sizes[0]
    if isinstance(size, bool) or not isinstance(size, int) or size < c.patch or \
            size % c.patch:
        raise ValueError(f"{name}: image_size must be a positive multiple of the patch size "
                         f"{c.patch}, not {image_size!r}")
    return size


def load_vit_digits_weights(graph: Graph, path: Path = VIT_DIGITS_MODEL) -> Graph:
    """Set the weights of a vit_digits graph, in place, from the trained parameters at
    `path` (an .npz of torch parameter names -> float32 arrays). Every parameter must
    name a constant of the graph of the same shape, and every weight of the graph must
    be set. ValueError naming the file and what does not fit."""
    if not Path(path).is_file():
        raise ValueError(f"vit_digits: the trained weights {path} are missing; make them "
                         "with `python scripts/train_vit_digits.py`")
    with np.load(path) as params:
        params = {k: params[k] for k in params.files}
    wanted = set(_weights(graph))
    missing, unknown = sorted(wanted - set(params)), sorted(set(params) - wanted)
    if missing or unknown:
        raise ValueError(f"vit_digits: {path} does not fit the model: missing "
                         f"{missing[:5]}, unknown {unknown[:5]}")
    for key, value in params.items():
        t = graph.tensors[key]
        if value.shape != t.shape:
            raise ValueError(f"vit_digits: {path}: {key!r} has shape {value.shape}, the model "
                             f"needs {t.shape}")
        t.data = np.ascontiguousarray(value, dtype=np.float32)
    return graph


def training_record() -> dict:
    """The training record of vit_digits (``models/vit_digits.json``)."""
    return json.loads(VIT_DIGITS_MODEL.with_suffix(".json").read_text())


def _weights(graph: Graph) -> dict:
    """The graph's trainable tensors: float constants but the builder's scalars
    (attention scale, mask constants) and causal masks."""
    return {n: t for n, t in graph.tensors.items()
            if t.is_constant and t.data.ndim >= 1 and t.dtype == "float32"
            and not n.endswith("causal_mask")}


def parameter_count(graph: Graph) -> int:
    """Trainable parameters of a zoo transformer, as torch counts them."""
    return sum(t.data.size for t in _weights(graph).values())
