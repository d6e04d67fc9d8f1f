"""The accelerator target on a quantized transformer block: its int8 dense layers run on
the GEMM core, the transformer ops it has no kernel for (gather, qlayer_norm,
qattention, qgelu, qadd on 3-D activations, slice, ...) fall back to the host with a
reason, and the whole model stays bit-exact against the integer reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

import vdla
from vdla.compiler import Graph, run_reference
from vdla.compiler.passes import fusion_counts, prepare, quantize
from vdla.compiler.passes.partition import HOST
from vdla.compiler.targets import compile_model
from vdla.compiler.targets.vdla import VdlaTarget

CFG = vdla.HardwareConfig()
S, D, HEADS, VOCAB = 8, 16, 2, 40


def block_graph(masked: bool) -> Graph:
    """A tiny transformer block as vdla's ONNX importer writes one: an embedding gather,
    LayerNorm and GELU written out, linear layers as reshape -> dense -> reshape + bias,
    heads by reshape/transpose, scores q @ k^T / sqrt(d) with a causal ``where`` or a
    BERT-style additive mask from an ``attention_mask`` input, softmax, @ v."""
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
    else:
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


def feed(rng, masked: bool) -> dict[str, np.ndarray]:
    out = {"input_ids": rng.integers(0, VOCAB, (1, S)).astype(np.int64)}
    if masked:
        mask = np.ones((1, S), np.int64)
        mask[0, -3:] = 0
        out["attention_mask"] = mask
    return out


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "attention_mask"])
def test_transformer_block_falls_back_to_the_host_bit_exactly(masked):
    rng = np.random.default_rng(0)
    prepared = prepare(block_graph(masked))
    counts = fusion_counts(prepared)
    assert counts["layer_norm"] == 2 and counts["attention"] == 1 and counts["qkv"] == 1
    samples = [feed(rng, masked) for _ in range(4)]
    quantized = quantize(prepared, samples, "shift")
    target = VdlaTarget(CFG)
    compiled = compile_model(quantized, target)
    device = vdla.runtime.open(CFG, backend="functional")
    inputs = feed(rng, masked)
    result = compiled.session(device).run(inputs)
    want = run_reference(quantized, inputs)
    for name, value in want.items():
        np.testing.assert_array_equal(result.outputs[name], value)
    where = {s.name: s for s in result.ops}
    ops = {s.op for s in result.ops}
    assert {"qattention", "qlayer_norm", "qdense"} <= ops
    on_vdla = {s.op for s in result.ops if s.target == "vdla"}
    assert on_vdla == {"qdense", "reshape"}   # the dense layers (Q/K/V merged), views
    for stat in where.values():
        if stat.target == HOST:
            assert stat.reason, f"{stat.name} ({stat.op}) fell back without a reason"
    for op in ("qattention", "qlayer_norm", "gather", "slice"):
        for stat in (s for s in result.ops if s.op == op):
            assert stat.target == HOST and op in stat.reason
