"""``qmatmul`` of two activations on the GEMM core (`conv_layer.matmul_problem`,
`Conv2dLayer.streamed`): ``a @ b^T`` as a dense layer over a's rows whose weight blocks
are b's rows, loaded from b's buffer where its producer stored them; bit-exact against
the integer reference on both simulators, for every tiling, with the refusals named."""

from __future__ import annotations

import random

import numpy as np
import pytest

import vdla
from vdla.compiler import Graph, run_reference
from vdla.compiler.targets.vdla import VdlaTarget
from vdla.compiler.targets.vdla.conv import lower_conv2d, run_conv2d
from vdla.compiler.targets.vdla.conv_layer import (alu_passes, choose_conv2d, conv2d_layer,
                                                   conv2d_workload, residual_passes,
                                                   schedule_space)
from vdla.compiler.targets.vdla.timing import estimate_conv2d
from vdla.compiler.targets.vdla.tuning import conv_tasks
from vdla.shipped import load_config

from compiled_runs import run_bit_exact

DEFAULT = vdla.HardwareConfig()


def _int8(rng, *shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


def scores_graph(s: int = 40, t: int = 48, d: int = 32, seed: int = 0) -> Graph:
    """Attention's scores without the softmax: k = x @ Wk^T on the accelerator, then
    q @ k^T with q a host-written sequence."""
    rng = np.random.default_rng(seed)
    g = Graph("scores")
    x = g.add_input("x", (1, t, d), "int8")
    q = g.add_input("q", (1, s, d), "int8")
    k = g.add_node("qdense", [g.add_node("reshape", [x], name="xrows", shape=(t, d)),
                              g.add_constant("wk", _int8(rng, d, d))], name="k", shift=8)
    qr = g.add_node("reshape", [q], name="qrows", shape=(s, d))
    g.set_outputs([g.add_node("qmatmul", [qr, k], name="scores", transpose_b=True,
                              shift=9)])
    return g.validate()


def _feed(graph: Graph, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    return {name: _int8(rng, *graph.tensors[name].shape) for name in graph.inputs}


def _run(graph: Graph, config, backend: str):
    return run_bit_exact(graph, VdlaTarget(config, backend=backend), _feed(graph))


@pytest.mark.parametrize("backend", ["functional", "verilator"])
def test_a_product_of_two_activations_runs_where_they_lie(backend):
    """k is stored by the dense layer and read as weight blocks by the product: every op
    on the accelerator, nothing moved between them, bit-exact."""
    compiled, result = _run(scores_graph(), DEFAULT, backend)
    assert {s.op: s.target for s in result.ops} == {"reshape": "vdla", "qdense": "vdla",
                                                    "qmatmul": "vdla"}
    assert result.host_time()["between_transfers"] == 0
    op = next(op for op in compiled.ops if op.op == "qmatmul")
    assert op.kernel.lowered.layer.streamed and "weights" not in op.kernel.static
    if backend == "verilator":
        assert all(s.cycles > 0 for s in result.ops if s.op != "reshape")


def test_every_tiling_is_bit_exact():
    g = scores_graph(s=36, t=64, d=48)
    node = g.node("scores")
    layer, _ = conv2d_layer(node, g, DEFAULT)
    assert (layer.h, layer.c, layer.o, layer.streamed) == (36, 48, 64, True)
    rng = np.random.default_rng(2)
    a, b = _int8(rng, 36, 48), _int8(rng, 64, 48)
    one = Graph("one")
    one.add_input("a", (36, 48), "int8")
    one.add_input("b", (64, 48), "int8")
    one.set_outputs([one.add_node("qmatmul", ["a", "b"], name="mm", transpose_b=True,
                                  **{k: node.attrs[k] for k in ("shift",)})])
    want = run_reference(one.validate(), {"a": a, "b": b})[one.outputs[0]]
    dev = vdla.runtime.open(DEFAULT, backend="functional")
    space = sorted(schedule_space(layer, DEFAULT), key=str)
    random.Random(0).shuffle(space)
    for s in space[:12]:
        got = run_conv2d(dev, lower_conv2d(node, g, DEFAULT, s), a, b, None)
        np.testing.assert_array_equal(got, want, err_msg=str(s))


def test_the_timing_model_tracks_the_product_on_verilator():
    """Scores of one BERT-base head (128 x 128, 64 wide): the chooser's tiling within 3%
    (b's weight blocks are a LOAD per output block, which the model counts)."""
    rng = np.random.default_rng(3)
    g = Graph("head")
    g.add_input("a", (128, 64), "int8")
    g.add_input("b", (128, 64), "int8")
    g.set_outputs([g.add_node("qmatmul", ["a", "b"], name="mm", transpose_b=True,
                              shift=9)])
    g.validate()
    node = g.node("mm")
    layer, _ = conv2d_layer(node, g, DEFAULT)
    s = choose_conv2d(layer, DEFAULT)
    dev = vdla.runtime.open(DEFAULT, backend="verilator", log=lambda message: None)
    _, stats = run_conv2d(dev, lower_conv2d(node, g, DEFAULT, s), _int8(rng, 128, 64),
                          _int8(rng, 128, 64), None, return_stats=True)
    workload = conv2d_workload(node, g, DEFAULT)
    estimate = estimate_conv2d(layer, s, DEFAULT, alu_passes=alu_passes(workload),
                               residual_passes=residual_passes(workload))
    assert abs(estimate.cycles / stats["cycles"] - 1) < 0.03, (estimate, stats["cycles"])


def test_the_tuner_measures_a_product():
    """A tuning task of the product feeds b as an input and checks the output."""
    g = scores_graph()
    task = {t.node: t for t in conv_tasks(g, VdlaTarget(DEFAULT))}["scores"]
    assert task.workload["op"] == "qmatmul" and task.workload["streamed"] is True
    context = task.open_context("functional")
    for schedule in (task.default_schedule(), next(iter(task.space()))):
        result = task.measure(schedule, context, data=task.measure_data(),
                              backend="functional")
        assert result.ok, result


def _matmul(a_shape, b_shape, transpose_b=True, constant_b=False) -> Graph:
    g = Graph("mm")
    a = g.add_input("a", a_shape, "int8")
    b = (g.add_constant("b", np.ones(b_shape, np.int8)) if constant_b
         else g.add_input("b", b_shape, "int8"))
    g.set_outputs([g.add_node("qmatmul", [a, b], name="mm", transpose_b=transpose_b,
                              shift=4)])
    return g.validate()


@pytest.mark.parametrize("graph, config, reason", [
    (_matmul((32, 32), (32, 32)), load_config("pynq-z1-plus"),
     "block_in = block_out; this config has 16 and 32"),
    (_matmul((32, 32), (32, 48), transpose_b=False), DEFAULT, "a @ b needs b transposed"),
    (_matmul((32, 32), (40, 32)), DEFAULT, "has 40 rows, not a multiple of the block (16)"),
    (_matmul((32, 24), (32, 24)), DEFAULT, "24 columns, not a multiple of the block (16)"),
    (_matmul((32, 32), (32, 32), constant_b=True), DEFAULT, "is a constant"),
])
def test_products_the_gemm_core_cannot_read_run_on_the_host(graph, config, reason):
    support = VdlaTarget(config).supports(graph.node("mm"), graph)
    assert not support.ok and reason in support.reason, support.reason


@pytest.mark.parametrize("backend", ["functional", "verilator"])
def test_an_identity_a_transposes_b_for_the_next_product(backend):
    """v^T = I @ v^T (a constant identity a, written once with the program) makes v's
    columns the rows the next product reads as weight blocks: p @ v runs as
    p @ (v^T)^T with nothing transposed on the host."""
    t, dv, s = 48, 32, 40
    g = Graph("pv")
    v = g.add_input("v", (t, dv), "int8")
    p = g.add_input("p", (s, t), "int8")
    vt = g.add_node("qmatmul", [g.add_constant("eye", np.eye(dv, dtype=np.int8)), v],
                    name="vt", transpose_b=True, shift=0)
    g.set_outputs([g.add_node("qmatmul", [p, vt], name="pv", transpose_b=True, shift=7)])
    compiled, result = _run(g.validate(), DEFAULT, backend)
    assert {s.target for s in result.ops} == {"vdla"}
    assert result.host_time()["between_transfers"] == 0
    op = next(op for op in compiled.ops if op.name == "vt")
    assert "input" in op.kernel.static                   # the identity, written once


def _identity_product(rows: int, out: int) -> Graph:
    """``I @ b^T``: b (out, rows) transposed by a constant identity a (rows, rows)."""
    g = Graph("transpose")
    b = g.add_input("b", (out, rows), "int8")
    g.set_outputs([g.add_node("qmatmul", [g.add_constant("eye", np.eye(rows, dtype=np.int8)),
                                          b], name="t", transpose_b=True, shift=0)])
    return g.validate()


def test_a_block_diagonal_a_reads_only_its_rows_blocks():
    """An identity a (block diagonal) makes the layer `diagonal_rows`: every tiling is
    one chunk a row tile, of its rows' blocks, and bit-exact; a full a is not."""
    g = _identity_product(64, 48)
    node = g.node("t")
    layer, _ = conv2d_layer(node, g, DEFAULT)
    assert layer.diagonal_rows and conv2d_workload(node, g, DEFAULT)["diagonal_rows"]
    assert not conv2d_layer(scores_graph().node("scores"), scores_graph(), DEFAULT)[0] \
        .diagonal_rows
    b = _int8(np.random.default_rng(4), 48, 64)
    dev = vdla.runtime.open(DEFAULT, backend="functional")
    space = list(schedule_space(layer, DEFAULT))
    assert {s.clamped(layer).tile_ci * 16 for s in space} == {s.clamped(layer).tile_h
                                                              for s in space}
    for s in space:
        lowered = lower_conv2d(node, g, DEFAULT, s)
        got = run_conv2d(dev, lowered, np.eye(64, dtype=np.int8), b, None)
        np.testing.assert_array_equal(got, b.T, err_msg=str(s))


def test_the_timing_model_tracks_a_transpose_on_verilator():
    """A ViT head's probabilities brought back from their transpose (208 x 208 by an
    identity): the chooser's tiling, one block a row, within 3% on Verilator."""
    g = _identity_product(208, 208)
    node = g.node("t")
    layer, _ = conv2d_layer(node, g, DEFAULT)
    s = choose_conv2d(layer, DEFAULT)
    dev = vdla.runtime.open(DEFAULT, backend="verilator", log=lambda message: None)
    b = _int8(np.random.default_rng(5), 208, 208)
    got, stats = run_conv2d(dev, lower_conv2d(node, g, DEFAULT, s), np.eye(208, dtype=np.int8),
                            b, None, return_stats=True)
    np.testing.assert_array_equal(got, b.T)
    workload = conv2d_workload(node, g, DEFAULT)
    estimate = estimate_conv2d(layer, s, DEFAULT, alu_passes=alu_passes(workload),
                               residual_passes=residual_passes(workload))
    assert abs(estimate.cycles / stats["cycles"] - 1) < 0.03, (s, estimate, stats["cycles"])
