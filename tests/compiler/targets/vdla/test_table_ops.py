"""Functions of an int8 value on the ALU's lookup table (`vdla.compiler.targets.vdla.table`):
a ``qgelu`` on a config with TAB is the elementwise one-operand plan with one TAB pass,
bit for bit the integer reference; a config without the table leaves it to the host and
says why."""

from __future__ import annotations

import numpy as np
import pytest

import vdla
from vdla.compiler import Graph, run_reference
from vdla.compiler.reference.integer_transformer import gelu_params, gelu_table
from vdla.compiler.targets.vdla import VdlaTarget, lower_elementwise, run_elementwise
from vdla.compiler.targets.vdla.elementwise import (ElementwiseSchedule, choose_elementwise,
                                                    elementwise_layer, estimate_elementwise)
from vdla.compiler.targets.vdla.support import describe
from vdla.compiler.targets.vdla.table import table_load_cycles
from vdla.config import AluOp
from vdla.isa import Alu, Load, MemoryType

TABLE = vdla.HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR", "TAB"})
#: An output block takes two input blocks (the widening GEMM's `ratio`).
TABLE_WIDE = vdla.HardwareConfig(block_out=32, alu_ops={"MIN", "MAX", "ADD", "SHR", "TAB"})


def gelu_graph(shape, in_scale=0.05, out_scale=0.03) -> Graph:
    g = Graph("gelu")
    x = g.add_input("x", shape, "int8")
    g.set_outputs([g.add_node("qgelu", [x], name="op", in_scale=in_scale,
                              out_scale=out_scale, params=gelu_params(in_scale, out_scale))])
    return g.validate()


def check(g, config=TABLE, schedule=None, backend="functional", seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, g.tensors["x"].shape).astype(np.int8)
    want = run_reference(g, {"x": x})[g.outputs[0]]
    lowered = lower_elementwise("op", g, config, schedule)
    dev = vdla.runtime.open(config, backend=backend, **(
        {"log": lambda message: None} if backend == "verilator" else {}))
    got, stats = run_elementwise(dev, lowered, x, return_stats=True)
    np.testing.assert_array_equal(got, want)
    return lowered, stats


@pytest.mark.parametrize("shape, config", [
    ((1, 40, 5, 6), TABLE), ((3, 16), TABLE), ((24, 64), TABLE), ((1, 24, 48), TABLE),
    ((1, 24, 48), TABLE_WIDE)], ids=["image", "rows", "sequence", "sequence3", "wide"])
def test_qgelu_is_one_table_pass_bit_for_bit(shape, config):
    g = gelu_graph(shape)
    lowered, _ = check(g, config, seed=len(shape))
    program = list(lowered.program)
    tables = [i for i in program if isinstance(i, Load) and i.memory_type == MemoryType.TAB]
    assert len(tables) == 1 and tables[0].x_size == 256
    assert program.index(tables[0]) < min(i for i, insn in enumerate(program)
                                          if isinstance(insn, Alu))
    # One ALU pass: TAB by the immediate 127 (entry 127 - x); the entries are int8
    # results, so no clamp.
    assert {(i.alu_opcode, i.imm) for i in program if isinstance(i, Alu)} == {
        (AluOp.TAB, 127)}
    x = np.arange(-128, 128)
    np.testing.assert_array_equal(lowered.table_entries[127 - x], gelu_table(g.node("op")))


def test_every_int8_value_through_a_small_schedule():
    """All 256 inputs, several tiles (the table is loaded once for all of them)."""
    g = gelu_graph((1, 32, 16, 16), in_scale=0.1, out_scale=0.02)
    layer, _ = elementwise_layer(g.node("op"), g, TABLE)
    assert layer.table and layer.clamp == ()
    check(g, schedule=ElementwiseSchedule(32, 1))


def test_the_table_load_is_in_the_estimate():
    """The first tile's compute waits for the table's 256 entries, one a cycle."""
    g = gelu_graph((1, 16, 4, 4))
    layer, _ = elementwise_layer(g.node("op"), g, TABLE)
    s = choose_elementwise(layer, TABLE)
    entries = 16 * layer.entry_cycles()
    assert estimate_elementwise(layer, s, TABLE) >= entries + table_load_cycles(TABLE)


def test_a_config_without_the_table_leaves_qgelu_to_the_host():
    g = gelu_graph((2, 16))
    node = g.node("op")
    ok, why = describe(node, g, vdla.HardwareConfig())
    assert not ok and "lookup table (TAB in alu_ops)" in why
    ok, why = describe(node, g, TABLE)
    assert ok and "TAB" in why
    with pytest.raises(ValueError, match="qgelu node 'op': .*TAB in alu_ops"):
        lower_elementwise("op", g, vdla.HardwareConfig())
    assert not VdlaTarget(vdla.HardwareConfig()).supports(node, g).ok
    assert VdlaTarget(TABLE).supports(node, g).ok


def test_cycle_accurate_backend_matches():
    lowered, stats = check(gelu_graph((1, 24, 64)), backend="verilator", seed=3)
    estimate = estimate_elementwise(lowered.layer, lowered.schedule, TABLE)
    assert stats["cycles"] > 0 and estimate > 0
