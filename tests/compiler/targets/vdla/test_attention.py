"""Attention on the accelerator head by head (`vdla.compiler.targets.vdla.attention`):
a fused ``qattention`` whose sizes the GEMM core takes is split into its products (on
the accelerator, reading q, k and v where the projection stored them) and its softmax
(on the host), bit for bit the fused op; any other stays whole on the host."""

from __future__ import annotations

import numpy as np
import pytest

import vdla
from vdla.compiler.targets import get
from vdla.compiler.targets.vdla import VdlaTarget
from vdla.compiler.targets.vdla.attention import split_attention
from vdla.shipped import load_config

from compiled_runs import run_bit_exact
import transformer_blocks
from transformer_blocks import feed

DEFAULT = vdla.HardwareConfig()
S, D, HEADS = 32, 32, 2                       # heads of 16 features: whole blocks


def quantized_block(masked: bool, s: int = S):
    return transformer_blocks.quantized_block(masked, S=s, D=D, HEADS=HEADS)


def _run(graph, config, backend="functional", masked=True):
    inputs = feed(np.random.default_rng(7), masked, S=graph.tensors["input_ids"].shape[1])
    return run_bit_exact(graph, VdlaTarget(config, backend=backend), inputs)


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "attention_mask"])
def test_attention_runs_head_by_head_bit_exactly(masked):
    q = quantized_block(masked)
    compiled, result = _run(q, DEFAULT, masked=masked)
    ops = [s for s in result.ops]
    assert "qattention" not in {s.op for s in ops}
    products = [s for s in ops if s.op == "qmatmul"]
    assert len(products) == 3 * HEADS and {s.target for s in products} == {"vdla"}
    softmax = [s for s in ops if s.op == "qsoftmax"]
    assert len(softmax) == HEADS and {s.target for s in softmax} == {"host"}
    node = compiled.graph.node(softmax[0].name)
    assert bool(node.attrs["causal"]) != masked and bool(node.input(1)) == masked
    # q, k, v are views of the projection's buffer, the heads' outputs one buffer
    assert all(s.target == "vdla" for s in ops if s.op in ("slice", "concat")
               and s.name.startswith(node.name.rsplit(".", 1)[0]))
    assert result.host_time()["between_transfers"] == 0


def test_verilator_runs_attention_head_by_head():
    _, result = _run(quantized_block(False), DEFAULT, "verilator", masked=False)
    assert all(s.cycles > 0 for s in result.ops if s.op == "qmatmul")


def test_other_attentions_stay_whole():
    """block_in 16 != block_out 32 (keys not whole blocks are padded first,
    `vdla.compiler.targets.vdla.row_padding`)."""
    q, config = quantized_block(True), load_config("pynq-z1-plus")
    assert split_attention(q, config) is q
    compiled, result = _run(q, config, masked=True)
    assert [st.target for st in result.ops if st.op == "qattention"] == ["host"]


def test_other_targets_leave_a_masked_softmax_to_their_attention():
    """The split's softmax leaves positions out; a target that runs qsoftmax only in
    the plain form refuses it by name (the host runs it, as on the accelerator)."""
    q = split_attention(quantized_block(True), DEFAULT)
    node = next(n for n in q.nodes() if n.op == "qsoftmax")
    support = get("cpu").supports(node, q)
    assert not support.ok and "leaves positions out" in support.reason


def test_a_zoo_bert_runs_head_by_head_through_the_pipeline():
    """`run_model`'s outcome names the graph compiled (its ops are the run's) and checks
    the outputs against the fused graph's own reference."""
    from vdla.compiler import pipeline

    outcome = pipeline.run_model(pipeline.load_model("bert_tiny", calibration=1, note=None),
                                 VdlaTarget(DEFAULT, backend="functional"))
    assert outcome.bit_exact, outcome.mismatch
    ops = {n.op for n in outcome.quantized.nodes()}
    assert "qattention" not in ops and "qmatmul" in ops
    assert {s.name for s in outcome.result.ops} == {n.name for n in outcome.quantized.nodes()}


def test_estimates_name_the_attention_each_split_op_came_from():
    q = quantized_block(False)
    attention = next(n.name for n in q.nodes() if n.op == "qattention")
    estimates = VdlaTarget(DEFAULT).estimate(q)
    split = [e for e in estimates if e.origin != e.name]
    assert {e.origin for e in split} == {attention}
    assert {e.op for e in split} >= {"qmatmul", "qsoftmax", "slice", "concat"}
    assert all(e.cycles for e in split if e.op == "qmatmul")


def test_the_tuner_measures_every_product_of_a_split_attention():
    """Its tasks include the heads' products, v^T's with a constant identity a; each
    measures (its output checked) with its default schedule."""
    target = VdlaTarget(DEFAULT)
    tasks = target.tasks(quantized_block(False))
    assert {t.workload["op"] for t in tasks} == {"qdense", "qmatmul"}
    for task in tasks:
        result = task.measure(task.default_schedule(), task.open_context("functional"),
                              data=task.measure_data(), backend="functional")
        assert result.ok, (task.name, result)
