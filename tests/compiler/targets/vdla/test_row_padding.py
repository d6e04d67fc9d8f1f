"""Sequences padded to whole blocks (`vdla.compiler.targets.vdla.row_padding`): a
self-attention over a sequence that is not whole blocks of 16 (a ViT's 197 tokens) runs
head by head on the accelerator after its sequence is padded with zero rows; the real
rows are the unpadded graph's bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import vdla
from vdla.compiler import run_reference
from vdla.compiler.targets.vdla import VdlaTarget
from vdla.compiler.targets.vdla.row_padding import PADDED_ROWS, pad_sequences
from vdla.shipped import load_config

from compiled_runs import run_bit_exact
from transformer_blocks import feed, quantized_block

DEFAULT = vdla.HardwareConfig()
SOFTMAX = load_config("pynq-z1-transformers")     # TAB and DIV: the softmax down the rows
ROWS, PADDED = 24, 32
MODES = {"attention_mask": dict(masked=True), "causal": dict(masked=False),
         "no_mask": dict(masked=False, causal=False)}


def block(mode: str):
    return quantized_block(S=ROWS, **MODES[mode])


def inputs(mode: str):
    return feed(np.random.default_rng(3), MODES[mode]["masked"], S=ROWS)


@pytest.mark.parametrize("mode", MODES)
def test_the_padded_graph_keeps_the_real_rows(mode):
    q = block(mode)
    padded = pad_sequences(q, DEFAULT)
    attention = next(n for n in padded.nodes() if n.op == "qattention")
    assert padded.tensors[attention.inputs[0]].shape[2] == PADDED
    assert {tuple(v) for v in padded.metadata[PADDED_ROWS].values()} == {(ROWS, PADDED)}
    # the output keeps its rows: they are cut off before the dequantize
    assert [padded.tensors[t].shape for t in padded.outputs] == \
        [q.tensors[t].shape for t in q.outputs]
    assert padded.producer(padded.producer(padded.outputs[0]).inputs[0]).op == "slice"
    mask = attention.input(3)
    if mode == "causal":
        assert not mask                     # the padded keys follow every real query
    elif mode == "no_mask":
        assert padded.constant(mask)[0, 0, 0].tolist() == [False] * ROWS + [True] * 8
    else:
        assert padded.producer(mask).op == "pad"
    _same_outputs(q, padded, mode)


@pytest.mark.parametrize("config", [DEFAULT, SOFTMAX], ids=["softmax_on_host", "tab_div"])
@pytest.mark.parametrize("mode", MODES)
def test_a_padded_attention_runs_head_by_head_bit_exactly(mode, config):
    _, result = run_bit_exact(block(mode), VdlaTarget(config, backend="functional"),
                              inputs(mode))
    ops = {s.op: s.target for s in result.ops}
    assert "qattention" not in ops and ops["qmatmul"] == "vdla"
    assert ops["pad"] == "host"
    if config is SOFTMAX:
        assert ops["qsoftmax"] == "vdla"


def test_a_slice_of_rows_reads_the_padded_sequence_and_others_are_cut_back():
    """A ViT's class token (rows 0:1), or any slice of rows, is read from the padded
    sequence as it lies; a dequantize gets the real rows first."""
    q = block("no_mask")
    out = q.producer(q.outputs[0]).inputs[0]            # the int8 before the dequantize
    first = q.add_node("slice", [out], name="first", starts=(0,), ends=(1,), axes=(1,))
    last = q.add_node("slice", [out], name="last", starts=(ROWS - 1,), ends=(ROWS,),
                      axes=(1,))
    floats = q.outputs[0]
    q.set_outputs([first, last, floats])
    padded = pad_sequences(q.validate(), DEFAULT)
    assert {padded.tensors[padded.node(n).inputs[0]].shape[1] for n in ("first", "last")} \
        == {PADDED}
    dequantize = padded.producer(floats)
    assert padded.producer(dequantize.inputs[0]).op == "slice"
    _same_outputs(q, padded)


def test_an_output_of_the_sequence_keeps_its_name_and_rows():
    """Its producer writes a padded tensor, sliced back to the output's rows."""
    q = block("no_mask")
    out = q.producer(q.outputs[0]).inputs[0]
    q.set_outputs([out])
    padded = pad_sequences(q, DEFAULT)
    assert padded.tensors[out].shape == q.tensors[out].shape
    assert padded.producer(out).op == "slice"
    _same_outputs(q, padded)


def _same_outputs(q, padded, mode="no_mask"):
    want, got = run_reference(q, inputs(mode)), run_reference(padded, inputs(mode))
    for name in q.outputs:
        np.testing.assert_array_equal(got[name], want[name])


def test_whole_blocks_and_configs_that_split_no_attention_are_left_alone():
    whole = quantized_block(True)                       # 32 tokens
    assert pad_sequences(whole, DEFAULT) is whole
    odd = block("attention_mask")
    assert pad_sequences(odd, load_config("pynq-z1-plus")) is odd    # 16 != 32


def test_verilator_runs_a_padded_attention_bit_exactly():
    """The cycle-accurate model runs the padded block (its products and its softmax
    down the rows, 24 keys in 32) with the outputs the unpadded graph's."""
    _, result = run_bit_exact(block("no_mask"), VdlaTarget(SOFTMAX, backend="verilator"),
                              inputs("no_mask"))
    ran = [s for s in result.ops if s.op in ("qmatmul", "qsoftmax")]
    assert ran and all(s.target == "vdla" and s.cycles > 0 for s in ran)
