"""Sequences on the accelerator (`vdla.compiler.targets.vdla.sequence`): on a batch-1
config a transformer's (S, D) and (1, S, D) activations are the image (1, D, S, 1) of
their rows, a dense layer over one runs as a 1x1 convolution whose row tiles share the
weights they load, reshapes between the two shapes are views, ReLU and adds run over the
image, and everything is bit-exact against the integer reference; a CNN's flattened
batch keeps its rows."""

from __future__ import annotations

import numpy as np
import pytest

import vdla
from vdla.compiler import Graph, run_reference
from vdla.compiler.targets import compile_model
from vdla.compiler.targets.vdla import VdlaTarget
from vdla.compiler.targets.vdla.conv import lower_conv2d, run_conv2d
from vdla.compiler.targets.vdla.conv_layer import conv2d_layer, conv2d_workload
from vdla.compiler.targets.vdla.elementwise import lower_elementwise, run_elementwise
from vdla.compiler.targets.vdla.sequence import ROW_BATCHES, pixel_rows
from vdla.shipped import load_config

DEFAULT = vdla.HardwareConfig()
WIDE_OUT = load_config("pynq-z1-plus")        # block_out 32 = 2 x block_in
CONFIGS = [pytest.param(DEFAULT, id="default"), pytest.param(WIDE_OUT, id="pynq-z1-plus")]


def _w(rng, *shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


def sequence_block(s: int, d: int, hidden: int, seed: int = 0) -> Graph:
    """x (1, S, D) -> (S, D) -> dense + bias -> relu -> dense + bias + residual (the
    (S, D) view) -> (1, S, D) -> + x: what a transformer's feed-forward block becomes."""
    rng = np.random.default_rng(seed)
    g = Graph("sequence_block")
    x = g.add_input("x", (1, s, d), "int8")
    rows = g.add_node("reshape", [x], name="rows", shape=(s, d))
    h = g.add_node("qdense", [rows, g.add_constant("w1", _w(rng, hidden, d)),
                              g.add_constant("b1", rng.integers(-4000, 4000, hidden)
                                             .astype(np.int32))], name="up", shift=8)
    h = g.add_node("relu", [h], name="act")
    y = g.add_node("qdense", [h, g.add_constant("w2", _w(rng, d, hidden)),
                              g.add_constant("b2", rng.integers(-4000, 4000, d)
                                             .astype(np.int32)), rows],
                   name="down", shift=9, residual_shift=1)
    y = g.add_node("reshape", [y], name="seq", shape=(1, s, d))
    g.set_outputs([g.add_node("qadd", [y, x], name="skip", a_shift=1, b_shift=1)])
    return g.validate()


def flatten_head(n: int) -> Graph:
    """A CNN's head: (N, 8, 2, 2) -> flatten -> dense: a batch of rows."""
    rng = np.random.default_rng(1)
    g = Graph("head")
    x = g.add_input("x", (n, 8, 2, 2), "int8")
    f = g.add_node("flatten", [x], name="flat")
    g.set_outputs([g.add_node("qdense", [f, g.add_constant("w", _w(rng, 10, 32))],
                              name="fc", shift=7)])
    return g.validate()


def test_which_tensors_are_sequences():
    g = sequence_block(20, 24, 40)
    for name in ("x", "rows_out", "up_out", "act_out", "down_out", "seq_out", "skip_out"):
        assert pixel_rows(g, name, DEFAULT), name
    assert not any(pixel_rows(g, name, vdla.HardwareConfig(batch=2))
                   for name in ("x", "rows_out"))                  # batch configs: rows
    head = flatten_head(3)
    assert not pixel_rows(head, "flat_out", DEFAULT)                 # a flattened batch
    assert not pixel_rows(head, "fc_out", DEFAULT)                   # ... and its dense
    assert not pixel_rows(flatten_head(1), "fc_out", DEFAULT)        # one row: batch form
    g.metadata[ROW_BATCHES] = frozenset({"rows_out"})
    assert not pixel_rows(g, "rows_out", DEFAULT)


@pytest.mark.parametrize("config", CONFIGS)
def test_a_dense_layer_over_a_sequence_is_a_convolution_over_its_rows(config):
    g = sequence_block(20, 24, 40)
    layer, _ = conv2d_layer(g.node("up"), g, config)
    assert (layer.n, layer.c, layer.h, layer.w, layer.o) == (1, 24, 20, 1, 40)
    assert layer.sequence and layer.batch_blocks == 1
    assert conv2d_workload(g.node("up"), g, config)["sequence"] is True
    head, _ = conv2d_layer(flatten_head(3).node("fc"), flatten_head(3), config)
    assert (head.n, head.h, head.sequence) == (3, 1, False)
    assert "sequence" not in conv2d_workload(flatten_head(3).node("fc"), flatten_head(3),
                                           config)


@pytest.mark.parametrize("config", CONFIGS)
def test_lowered_ops_pack_a_sequence_as_an_image(config):
    """The lowered ops' own packing (`run_conv2d`, `run_elementwise`) takes the plain
    operands and gives the plain result."""
    rng = np.random.default_rng(2)
    g = sequence_block(20, 24, 40)
    x = _w(rng, 1, 20, 24)
    dev = vdla.runtime.open(config, backend="functional")
    up = g.node("up")
    rows = x.reshape(20, 24)
    got = run_conv2d(dev, lower_conv2d(up, g, config), rows, g.constant("w1"),
                     g.constant("b1"))
    ref = run_reference(_one(g, "up"), {"rows_out": rows})
    np.testing.assert_array_equal(got, ref["up_out"])
    skip = g.node("skip")
    a, b = _w(rng, 1, 20, 24), _w(rng, 1, 20, 24)
    got = run_elementwise(dev, lower_elementwise(skip, g, config), a, b)
    ref = run_reference(_one(g, "skip"), {"seq_out": a, "x": b})
    np.testing.assert_array_equal(got, ref["skip_out"])


def _one(g: Graph, name: str) -> Graph:
    """The graph of node `name` alone, its activation inputs as graph inputs."""
    node = g.node(name)
    one = Graph(name)
    for t in node.inputs:
        if not t:
            continue
        if g.constant(t) is not None:
            one.add_constant(t, g.constant(t))
        elif t not in one.tensors:
            one.add_input(t, g.tensors[t].shape, "int8")
    one.add_node(node.op, node.inputs, node.outputs, name=name, **node.attrs)
    one.set_outputs(list(node.outputs))
    return one.validate()


def _run(graph: Graph, config, backend: str, seed: int = 3):
    compiled = compile_model(graph, VdlaTarget(config, backend=backend))
    x = _w(np.random.default_rng(seed), *graph.tensors["x"].shape)
    with compiled.session() as session:
        result = session.run({"x": x})
    want = run_reference(graph, {"x": x})
    for name in graph.outputs:
        np.testing.assert_array_equal(result.outputs[name], want[name])
    return compiled, result


@pytest.mark.parametrize("config", CONFIGS)
def test_a_sequence_block_stays_on_the_accelerator_bit_exactly(config):
    """Every op on vdla (the reshapes as views), nothing moved between them, every
    sequence placed as an image of its rows in a buffer of one batch block."""
    g = sequence_block(20, 24, 40)
    compiled, result = _run(g, config, "functional")
    assert {op.op for op in compiled.ops_on("host")} == set()
    assert {s.target for s in result.ops} == {"vdla"}
    assert result.host_time()["between_transfers"] == 0
    plan = compiled.ops_on("vdla")[0].kernel.plan
    for name in ("x", "rows_out", "up_out", "down_out", "seq_out", "skip_out"):
        assert plan.placements[name].sequence, name
        assert plan.buffers[plan.placements[name].buffer].batch_blocks == 1
    assert plan.placements["rows_out"].buffer == plan.placements["x"].buffer     # a view


def test_a_flattened_batch_keeps_its_rows():
    compiled, result = _run(flatten_head(3), DEFAULT, "functional")
    plan = compiled.ops_on("vdla")[0].kernel.plan
    assert not plan.placements["flat_out"].sequence
    assert plan.buffers[plan.placements["fc_out"].buffer].batch_blocks == 3


def test_only_sequence_reshapes_are_views():
    g = Graph("heads")
    x = g.add_input("x", (1, 16, 32), "int8")
    r = g.add_node("reshape", [x], name="split", shape=(1, 16, 2, 16))
    g.set_outputs([g.add_node("relu", [r], name="act")])
    g.validate()
    support = VdlaTarget(DEFAULT).supports(g.node("split"), g)
    assert not support.ok and "(S, D) <-> (1, S, D)" in support.reason


def test_a_sequence_add_with_per_row_requantization_runs_on_the_host():
    g = sequence_block(20, 24, 40)
    g.node("skip").attrs["a_shift"] = tuple(range(20))          # along axis 1: the rows
    support = VdlaTarget(DEFAULT).supports(g.node("skip"), g)
    assert not support.ok and "per tensor" in support.reason


@pytest.mark.parametrize("config", CONFIGS)
def test_verilator_runs_a_sequence_block(config):
    _, result = _run(sequence_block(20, 24, 40), config, "verilator")
    assert all(s.cycles > 0 for s in result.ops if s.op not in ("reshape",))
