"""A tiny transformer block as vdla's ONNX importer writes one, for the accelerator's
tests of transformers: `block_graph` builds it (an embedding gather, LayerNorm and GELU
written out, linear layers as reshape -> dense -> reshape + bias, heads by
reshape/transpose, a causal ``where`` or a BERT-style additive mask), `feed` its inputs,
`quantized_block` it quantized."""

from __future__ import annotations

import math

import numpy as np

from vdla.compiler import Graph

S, D, HEADS, VOCAB = 8, 16, 2, 40


def block_graph(masked: bool, S: int = S, D: int = D, HEADS: int = HEADS,
                VOCAB: int = VOCAB, causal: bool = True) -> Graph:
    """A tiny transformer block as vdla's ONNX importer writes one: an embedding gather,
    LayerNorm and GELU written out, linear layers as reshape -> dense -> reshape + bias,
    heads by reshape/transpose, scores q @ k^T / sqrt(d) with a causal ``where`` or a
    BERT-style additive mask from an ``attention_mask`` input (neither where not
    `masked` nor `causal`: a ViT's), softmax, @ v."""
    rng = np.random.default_rng(5)
    g = Graph("block")

    def c(value, name="c"):
        return g.add_constant(name, np.asarray(value, np.float32))

    def f32(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def layer_norm(x):
        m = g.add_node("reduce_mean", [x], axes=(-1,))
        d = g.add_node("sub", [x, m])
        v = g.add_node("reduce_mean", [g.add_node("pow", [d, c(2.0)])], axes=(-1,))
        y = g.add_node("div", [d, g.add_node("sqrt", [g.add_node("add", [v, c(1e-5)])])])
        y = g.add_node("mul", [y, c(1 + 0.2 * f32(D))])
        return g.add_node("add", [y, c(0.2 * f32(D))])

    def linear(x, n_out):
        k = g.tensors[x].shape[-1]
        y = g.add_node("dense", [g.add_node("reshape", [x], shape=(S, k)),
                                 c(f32(n_out, k, scale=0.3))])
        return g.add_node("add", [g.add_node("reshape", [y], shape=(1, S, n_out)),
                                  c(f32(n_out, scale=0.1))])

    def heads(t):
        r = g.add_node("reshape", [t], shape=(1, S, HEADS, D // HEADS))
        return g.add_node("transpose", [r], perm=(0, 2, 1, 3))

    ids = g.add_input("input_ids", (1, S), "int64")
    x = g.add_node("gather", [c(f32(VOCAB, D), "table"), ids])
    h = layer_norm(x)
    q, k, v = heads(linear(h, D)), heads(linear(h, D)), heads(linear(h, D))
    kt = g.add_node("transpose", [k], perm=(0, 1, 3, 2))
    s = g.add_node("div", [g.add_node("matmul", [q, kt]), c(math.sqrt(D // HEADS))])
    if masked:
        am = g.add_input("attention_mask", (1, S), "int64")
        am = g.add_node("cast", [g.add_node("reshape", [am], shape=(1, 1, 1, S))],
                        dtype="float32")
        s = g.add_node("add", [s, g.add_node("mul", [g.add_node("sub", [c(1.0), am]),
                                                     c(-10000.0)])])
    elif causal:
        cond = g.add_constant("causal", np.triu(np.ones((1, 1, S, S), bool), 1))
        s = g.add_node("where", [cond, c(-np.inf), s])
    a = g.add_node("matmul", [g.add_node("softmax", [s], axis=-1), v])
    a = g.add_node("reshape", [g.add_node("transpose", [a], perm=(0, 2, 1, 3))],
                   shape=(1, S, D))
    x = g.add_node("add", [x, linear(a, D)])
    u = linear(layer_norm(x), 4 * D)
    e = g.add_node("add", [g.add_node("erf", [g.add_node("div", [u, c(math.sqrt(2))])]),
                           c(1.0)])
    u = g.add_node("mul", [g.add_node("mul", [u, e]), c(0.5)])
    g.set_outputs([g.add_node("add", [x, linear(u, D)])])
    return g.validate()


def feed(rng, masked: bool, S: int = S, VOCAB: int = VOCAB) -> dict[str, np.ndarray]:
    out = {"input_ids": rng.integers(0, VOCAB, (1, S)).astype(np.int64)}
    if masked:
        mask = np.ones((1, S), np.int64)
        mask[0, -3:] = 0
        out["attention_mask"] = mask
    return out


def quantized_block(masked: bool, S: int = 32, D: int = 32, HEADS: int = 2,
                    causal: bool = True) -> Graph:
    """`block_graph` prepared and quantized (shift mode) on four random feeds: heads of
    D / HEADS features, whole blocks on the accelerator's 16-wide configs by default."""
    from vdla.compiler.passes import prepare, quantize
    rng = np.random.default_rng(0)
    prepared = prepare(block_graph(masked, S=S, D=D, HEADS=HEADS, causal=causal))
    samples = [feed(rng, masked, S=S) for _ in range(4)]
    return quantize(prepared, samples, "shift")
