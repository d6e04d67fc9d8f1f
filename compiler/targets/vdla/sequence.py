"""Rows as pixels: how the accelerator lays out a sequence of vectors.

A transformer's activations are sequences: S token vectors of D features, ``(1, S, D)``
as the importer writes them and ``(S, D)`` where a dense layer reads them. Laid out as a
batch of S rows (``NC`` with N = S, one batch block per row), every dense layer would run
S matrix-vector products, each fetching the whole weight matrix again once it outgrows
the weight buffer: a BERT-base 768 x 768 layer of 128 rows reaches 2% of the GEMM core's
MAC bound on ``pynq-z1-plus``. On a batch-1 config the accelerator therefore lays a
sequence out as an *image*: S pixels of D channels, ``(1, D, S, 1)`` in the blocked
layout (``[D / L][S][L]``), and runs a dense layer over it as a 1x1 convolution whose
output-row tiles share every weight block they load (93% of the bound on that layer).

In that layout the L consecutive pixels of one channel block are one weight block's
rows: a sequence written by one op is a weight operand another can LOAD as it lies.

Which tensors are sequences (`pixel_rows`): on a batch-1 config, every int8 ``(1, S,
D)`` tensor, and every ``(N, K)`` tensor with N > 1 except a batch of rows: a ``flatten``
/``reshape`` of an NCHW feature map to (N, C*H*W) (its buffer is rows of features, read
in place) and what a dense layer, ReLU or add makes of one (a graph without those
producers names them in its metadata, `ROW_BATCHES`). A single row (N = 1) is both: its bytes
are the same either way, and it keeps the batch form.
"""

from __future__ import annotations

from vdla.compiler.ir.graph import Graph
from vdla.config import HardwareConfig

__all__ = ["ROW_BATCHES", "contiguous_rows", "image_shape", "pixel_rows", "sequence_rows"]

#: The `Graph.metadata` key of the tensors a graph declares batches of rows, where it
#: has no producers to tell (the scratch graph of `channel_map.physical_node`).
ROW_BATCHES = "vdla.row_batches"

#: Ops whose output has their first activation input's layout (a row batch stays one).
_FOLLOWS_INPUT = ("qdense", "relu", "qadd")


def pixel_rows(graph: Graph, name: str, config: HardwareConfig) -> bool:
    """Whether tensor `name` of `graph` is a sequence laid out as an image of its rows on
    `config` (the module docstring)."""
    if config.batch != 1 or name in graph.metadata.get(ROW_BATCHES, ()):
        return False
    seen = set()
    while name not in seen:
        seen.add(name)
        shape = graph.tensors[name].shape
        if len(shape) == 3:
            return shape[0] == 1
        if len(shape) != 2 or shape[0] == 1:
            return False
        node = graph.producer(name)
        if node is None:
            return True
        if node.op in ("flatten", "reshape"):
            src = graph.tensors[node.inputs[0]].shape
            if len(src) == 4:          # a feature map's flatten keeps its batch of rows
                return src[0] != shape[0]
            name = node.inputs[0]
            if len(src) == 3:
                continue
        elif node.op in _FOLLOWS_INPUT:
            name = next((t for t in node.inputs[:2] if t and graph.constant(t) is None),
                        node.inputs[0])
        else:
            return True
    return True


def sequence_rows(shape) -> tuple[int, int]:
    """(rows, features) of a sequence's plain shape, ``(S, D)`` or ``(1, S, D)``."""
    return int(shape[-2]), int(shape[-1])


def image_shape(shape) -> tuple[int, int, int, int]:
    """The image a sequence of plain shape `shape` is laid out as: (1, D, S, 1)."""
    rows, features = sequence_rows(shape)
    return 1, features, rows, 1


def contiguous_rows(w: int, tw: int, rows: int, pads: dict | None = None) -> bool:
    """Whether a DMA of `rows` rows of `tw` pixels of an image `w` pixels wide moves them
    as one row: an image one pixel wide (a sequence) without padding, whose
    rows lie one after another. (A wider image keeps a DMA row per image row even where
    a tile spans it: the recorded measurements the timing model is fitted on were made
    so.) Each DMA row is a read burst of its own, so a dense layer over a sequence whose
    tiles load their rows in one takes 6-10% fewer cycles on Verilator than row by row."""
    return w == 1 and tw == 1 and rows > 1 and not any((pads or {}).values())
