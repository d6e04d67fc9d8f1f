"""Functions of an int8 value on the vector ALU's lookup table (TAB, `vdla.extensions`).

A config whose ``alu_ops`` list TAB has a 256-entry table in every ALU lane, filled by a
LOAD of TAB and read by the TAB op: ``table[(operand - acc) mod 256]`` (docs: the ISA
page, TAB). The integer GELU of `vdla.compiler.reference.integer_transformer` is a
function of the 256 int8 values (``gelu_table``), so on such a config a ``qgelu`` is the
elementwise family's one-operand plan (`vdla.compiler.targets.vdla.elementwise`) with
one TAB pass by the immediate 127 (entry 127 - x holds x's result) as its only ALU
step: exact, where the definition's 64-bit products and division could not run in the
32-bit lanes. The program loads the table
(1 KiB of int32 entries in its arena's ``table`` region) once, at its start, on the
compute module.

This module holds what the table's users share: which ops use it and at what offset,
the entries of a node, the LOAD that fills it, its time, and why a config cannot.
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference.integer_transformer import gelu_table
from vdla.config import TABLE_BITS, TABLE_ENTRIES, AluOp, HardwareConfig
from vdla.isa import MemoryType

__all__ = ["TABLE_OFFSETS", "TABLE_OPS", "TAB_ENTRY_BYTES", "load_table", "table_entries",
           "table_load_cycles", "table_problem"]

#: The ops a table pass computes, and the TAB immediate that turns a lane's int8 value x
#: into its entry's index: 127 - x, so entry 0 holds x = 127's result and entry 255 x =
#: -128's (TAB indexes by the operand minus the lane).
TABLE_OFFSETS = {"qgelu": 127}
TABLE_OPS = tuple(TABLE_OFFSETS)
#: Bytes of one entry in DRAM (`vdla.isa.memory_geometry`'s TAB element).
TAB_ENTRY_BYTES = 4


def table_problem(node: Node, config: HardwareConfig) -> str | None:
    """Why `config` cannot run `node`'s table pass (it lacks TAB), or None."""
    if AluOp.TAB in config.alu_ops:
        return None
    return (f"{node.op} is a function of the 256 int8 values, which the ALU's lookup "
            f"table (TAB in alu_ops) computes in one pass; config {config.name} has no "
            f"table (alu_ops: {', '.join(sorted(op.name for op in config.alu_ops))})")


def table_entries(node: Node) -> np.ndarray:
    """The int32[256] entries of `node`'s table, index ``TABLE_OFFSETS[op] - x``; each fits the
table's signed `TABLE_BITS` (checked: AssertionError otherwise).
"""
    if node.op != "qgelu":
        raise ValueError(f"no table for {node.op} node {node.name!r}; tables exist for "
                         f"{', '.join(TABLE_OPS)}")
    # gelu_table is indexed by x + 128 = 255 - (127 - x): the table reversed.
    entries = gelu_table(node)[::-1].astype(np.int32)
    limit = 1 << (TABLE_BITS - 1)
    if entries.shape != (TABLE_ENTRIES,) or entries.min() < -limit or entries.max() >= limit:
        raise AssertionError(f"the table of {node.name!r} does not fit {TABLE_ENTRIES} "
                             f"entries of {TABLE_BITS} bits")
    return entries


def load_table(p, regions: dict, config: HardwareConfig):
    """The LOAD of TAB of the whole table from the arena's ``table`` region."""
    p.load(MemoryType.TAB, sram_base=0, dram_base=regions["table"].offset // TAB_ENTRY_BYTES,
           y_size=1, x_size=TABLE_ENTRIES, x_stride=TABLE_ENTRIES)


def table_load_cycles(config: HardwareConfig) -> int:
    """Cycles `load_table` adds before the first tile: its DMA writes one 32-bit entry a
    cycle (entries are narrower than the bus) and holds the shared read channel's beats
    while it does, so the first tile's operand loads wait behind it; its DRAM latency
    overlaps theirs. Measured on Verilator: a qgelu takes 224 to 258 cycles more than a
    ReLU of the same tiling (default config and block_out 32)."""
    return TABLE_ENTRIES
