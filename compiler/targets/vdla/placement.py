"""Where a compiled model's activations live in DRAM: one buffer per tensor, in the
accelerator's blocked layout, from the op that writes it to every op that reads it.

Every op reads and writes activations in one layout, ``NCHW{batch}n{L}c`` with L =
`activation_block` (``max(block_in, block_out)``; the blocks are powers of two, so the
smaller divides L): a producer's STOREs are exactly what its consumer's LOADs expect, so
the tensor can stay where the producer put it. Where block_out = r * block_in, a pixel of
an L-block is r inp elements, which a consumer's LOAD brings contiguously (its micro-ops
index the inp buffer ``pixel * r + j``); where block_in = r * block_out, a producer
STOREs each out element to its place in the pixel (x_size 1, x_stride r). With batch > 1
and blocks that differ no layout serves both (an inp element is batch x block_in, an out
element batch x block_out), so activations are not `resident` there and the host packs
each op's operands (`common.pack_activation`). `plan_buffers` decides, once per compiled
model:

* a `Buffer` per tensor that is not a view, sized for its blocked form;
* a `Placement` per tensor: its buffer, where in each batch block it starts and how many
  elements (``batch x L`` vectors) it spans there, and which physical channel holds
  each logical one (None: channel c at position c);
* *views*, which cost no data movement: a ``concat`` along channels is one buffer whose
  parts are placed one after another at channel-block boundaries (the producers STORE
  straight into their slices; a part that does not fill its last block leaves pad
  channels in between, which the channel map skips), and a ``flatten``/``reshape`` to
  (N, C*H*W) is its input's buffer read as a dense layer's input (its channel map is the
  blocked order of the features).

An op's program is emitted for an arena of its own; `relocate_to` moves every LOAD/STORE
of an activation region (input, residual, output) into its tensor's placement and
everything else into the op's arena. The host writes a placement (`pack_placed`) only
for a tensor no accelerator op produces (a model input after ``quantize``, a host op's
output) and reads one (`unpack_placed`) only for a host op or a model output.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.targets.vdla.common import (activation_block, ceil_div, pack_activation,
                                               unpack_activation)
from vdla.compiler.targets.vdla.sequence import image_shape, pixel_rows, sequence_rows
from vdla.isa.relocate import relocate
from vdla.config import HardwareConfig
from vdla.isa import Program

__all__ = ["Buffer", "BufferPlan", "Placement", "VIEW_OPS", "activation_block",
           "concat_conflicts",
           "concat_view_problem", "flatten_view_problem", "plan_buffers", "region_mover",
           "relocate_to", "resident", "slice_view_problem", "view_problem"]

#: Ops that are views of a buffer on the accelerator (no program; no data moves).
VIEW_OPS = ("concat", "flatten", "reshape", "slice")


def resident(config: HardwareConfig) -> bool:
    """Whether activations can stay in DRAM between ops on `config`: always with batch 1
    (producers and consumers share the `activation_block` layout), and with a larger
    batch when the blocks agree. With batch > 1 and blocks that differ, an inp element
    (batch x block_in) is no part of an out element (batch x block_out) or the reverse,
    so the host repacks every activation between ops there."""
    return config.block_in == config.block_out or config.batch == 1


def not_resident(config: HardwareConfig) -> str:
    """Why activations cannot stay in DRAM on `config` (see `resident`)."""
    return (f"activations cannot stay in DRAM: batch {config.batch} with block_in "
            f"{config.block_in} != block_out {config.block_out} (an inp element of batch x "
            "block_in channels is no slice of an out element, nor the reverse; use batch 1 "
            "or equal blocks)")


@dataclasses.dataclass(frozen=True)
class Buffer:
    """A DRAM buffer of activations: `batch_blocks` slices of `elems` elements each (an
    element is one ``batch x block`` int8 vector of `elem_bytes` bytes)."""

    name: str
    batch_blocks: int
    elems: int
    elem_bytes: int

    @property
    def nbytes(self) -> int:
        return self.batch_blocks * self.elems * self.elem_bytes


@dataclasses.dataclass(frozen=True, eq=False)
class Placement:
    """Where one tensor lives: elements [`offset`, `offset` + `elems`) of every batch
    block's slice of buffer `buffer`. `shape` is the tensor's plain shape (N, C, H, W) or
    (N, K); `physical` its padded channel count (a multiple of the block) and `channels`
    the physical position of each logical channel (None: the identity). `sequence`: a
    sequence, (S, D) or (1, S, D), laid out as the image (1, D, S, 1) of its rows
    (`vdla.compiler.targets.vdla.sequence`)."""

    buffer: str
    offset: int
    elems: int
    shape: tuple[int, ...]
    physical: int
    channels: np.ndarray | None = None
    sequence: bool = False

    @property
    def identity(self) -> bool:
        return self.channels is None

    def positions(self) -> np.ndarray:
        """The physical position of every logical channel."""
        if self.channels is not None:
            return self.channels
        return np.arange(self.shape[-1] if self.sequence else self.shape[1])


def _placement(shape, buffer: str, offset: int, config: HardwareConfig,
               channels: np.ndarray | None = None, physical: int | None = None,
               sequence: bool = False) -> Placement:
    block = activation_block(config)
    image = image_shape(shape) if sequence else shape
    physical = physical if physical is not None else ceil_div(image[1], block) * block
    plane = int(np.prod(image[2:])) if len(image) > 2 else 1
    if channels is not None and np.array_equal(channels, np.arange(image[1])):
        channels = None
    return Placement(buffer, offset, physical // block * plane, tuple(shape), physical,
                     channels, sequence)


@dataclasses.dataclass(frozen=True, eq=False)
class BufferPlan:
    """The buffers of a compiled model's accelerator tensors and every tensor's
    placement (see the module docstring). `views` names the view nodes."""

    config: HardwareConfig
    buffers: dict[str, Buffer]
    placements: dict[str, Placement]
    views: frozenset[str]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())

    def __repr__(self) -> str:
        return (f"BufferPlan({len(self.buffers)} buffers of {self.nbytes:,} bytes for "
                f"{len(self.placements)} tensors, {len(self.views)} views)")

    def pack_placed(self, tensor: str, x: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """`x` (the tensor's plain int8 value) as the bytes the host writes:
        [(byte offset in the buffer, bytes)], one run per batch block (one in all when
        the tensor fills its buffer)."""
        p, c = self.placements[tensor], self.config
        x = np.asarray(x)
        if x.shape != p.shape or x.dtype != np.int8:
            raise ValueError(f"tensor {tensor!r} must be int8 of shape {p.shape}, not "
                             f"{x.dtype} {x.shape}")
        if p.sequence:
            x4 = x.reshape(sequence_rows(x.shape)).T[None, :, :, None]
        else:
            x4 = x.reshape(x.shape[0], x.shape[1], -1, 1) if x.ndim == 2 else x
        if p.channels is not None:           # scatter to the physical positions
            full = np.zeros((x4.shape[0], p.physical) + x4.shape[2:], np.int8)
            full[:, p.channels] = x4
            x4 = full
        blocked = pack_activation(x4, c, c.block_in, channels=p.physical)
        runs = self.read_runs(tensor)
        slices = blocked.reshape(len(runs), -1)    # one run per batch block, or one in all
        return [(offset, data) for (offset, _), data in zip(runs, slices)]

    def read_runs(self, tensor: str) -> list[tuple[int, int]]:
        """[(byte offset in the buffer, bytes)] of `tensor`: one run per batch block, or
        one in all when the tensor fills its buffer."""
        p = self.placements[tensor]
        buf = self.buffers[p.buffer]
        if p.offset == 0 and p.elems == buf.elems:
            return [(0, buf.nbytes)]
        return [((nb * buf.elems + p.offset) * buf.elem_bytes, p.elems * buf.elem_bytes)
                for nb in range(buf.batch_blocks)]

    def unpack_placed(self, tensor: str, raw: list[np.ndarray]) -> np.ndarray:
        """The tensor's plain int8 value from the bytes of `read_runs` (in order)."""
        p, c = self.placements[tensor], self.config
        rest = p.shape[2:] if len(p.shape) == 4 else (1, 1)
        data = np.concatenate([np.asarray(r, np.uint8).reshape(-1) for r in raw])
        n = self.buffers[p.buffer].batch_blocks * c.batch
        if p.sequence:
            rows = sequence_rows(p.shape)[0]
            x = unpack_activation(data, c, c.block_in, (1, p.physical, rows, 1), p.physical)
            return np.ascontiguousarray(x[0, p.positions(), :, 0].T.reshape(p.shape))
        x = unpack_activation(data, c, c.block_in, (n, p.physical) + tuple(rest), p.physical)
        x = x[:p.shape[0], p.positions()]
        return np.ascontiguousarray(x.reshape(p.shape))


# --- views ---------------------------------------------------------------------------------

def _activation(graph: Graph, name: str) -> str | None:
    """Why tensor `name` cannot be an accelerator activation (None when it can)."""
    t = graph.tensors[name]
    if t.is_constant:
        return f"{name!r} is a constant"
    if t.dtype != "int8":
        return f"{name!r} is {t.dtype}"
    if len(t.shape) not in (2, 3, 4) or (len(t.shape) == 3 and t.shape[0] != 1):
        return (f"{name!r} has shape {tuple(t.shape)} (NCHW, NC and sequences (1, S, D) "
                "are placed)")
    return None


def concat_view_problem(node, graph: Graph, config: HardwareConfig) -> str | None:
    """Why concat `node` cannot be a view of one buffer by itself (None when it can):
    rank-4 int8 activations along channels, each input distinct. Whether its parts can
    also be placed (a tensor in two concats) is `plan_buffers`' question."""
    if not resident(config):
        return not_resident(config)
    if len(set(node.inputs)) != len(node.inputs):
        return "concat of one tensor twice: a tensor has one place in DRAM"
    for name in node.inputs:
        problem = _activation(graph, name)
        if problem:
            return f"input {problem}"
    shape = graph.tensors[node.outputs[0]].shape
    if len(shape) == 2 and pixel_rows(graph, node.outputs[0], config):
        return _sequence_concat_problem(node, graph, config)
    if len(shape) != 4 or int(node.attrs.get("axis", 1)) % 4 != 1:
        return f"concat along axis {node.attrs.get('axis')} of rank {len(shape)}: only " \
               "channels (axis 1) of NCHW tensors or features of a sequence (S, D) are a " \
               "view of one buffer"
    return None


def _sequence_concat_problem(node, graph: Graph, config: HardwareConfig) -> str | None:
    """Why concat `node` of (S, D) sequences (distinct int8 activations) along their
    features cannot be a view: each part but the last fills whole channel blocks (a
    sequence's buffer has no channel map), every part a sequence of its own."""
    block = activation_block(config)
    if int(node.attrs.get("axis", 1)) % 2 != 1:
        return "a concat of sequences is a view along their features (axis 1) only"
    for name in node.inputs:
        if not pixel_rows(graph, name, config):
            return f"input {name!r} is not a sequence"
    for name in node.inputs[:-1]:
        if graph.tensors[name].shape[1] % block:
            return (f"input {name!r} has {graph.tensors[name].shape[1]} features, not whole "
                    f"channel blocks of {block}: the next part would not start on one")
    return None


def slice_view_problem(node, graph: Graph, config: HardwareConfig) -> str | None:
    """Why slice `node` cannot be a view of its input's buffer (None when it can): whole
    channel blocks of a sequence's features, (S, D) or (1, S, D), with step 1 (its rows
    lie in those blocks one after another)."""
    if not resident(config):
        return not_resident(config)
    src, name = graph.tensors[node.inputs[0]].shape, node.inputs[0]
    problem = _activation(graph, name)
    if problem:
        return f"input {problem}"
    if len(src) not in (2, 3) or not pixel_rows(graph, name, config):
        return f"input {name!r} {tuple(src)} is not a sequence"
    # The IR has checked the slice: axes distinct and in range, bounds within the axis.
    a = node.attrs
    axes = list(a["axes"]) or list(range(len(a["starts"])))
    steps = list(a["steps"]) or [1] * len(axes)
    if axes != [len(src) - 1] or steps != [1]:
        return (f"slice along axes {tuple(axes)} (steps {tuple(steps)}): only a sequence's "
                "features, step 1, are a view of its buffer")
    block, features = activation_block(config), src[-1]
    start, end = int(a["starts"][0]), int(a["ends"][0])
    if start % block or (end % block and end != features):
        return (f"slice of features {start}..{end}: not whole channel blocks of {block} "
                "(a view starts and ends on a block boundary, or at the end)")
    return None


def view_problem(node, graph: Graph, config: HardwareConfig) -> str | None:
    """Why view op `node` (`VIEW_OPS`) cannot be a view by itself (None when it can)."""
    if node.op == "concat":
        return concat_view_problem(node, graph, config)
    if node.op == "slice":
        return slice_view_problem(node, graph, config)
    return flatten_view_problem(node, graph, config)


def flatten_view_problem(node, graph: Graph, config: HardwareConfig) -> str | None:
    """Why flatten/reshape `node` cannot be a view of its input's buffer (None when it
    can): an int8 NCHW (or NC) tensor to (N, C*H*W)."""
    if not resident(config):
        return not_resident(config)
    problem = _activation(graph, node.inputs[0])
    if problem:
        return f"input {problem}"
    src = graph.tensors[node.inputs[0]].shape
    dst = graph.tensors[node.outputs[0]].shape
    if 3 in (len(src), len(dst)) or pixel_rows(graph, node.inputs[0], config):
        # A sequence's (S, D) and (1, S, D) are one image of its rows (a single row's
        # bytes are the same in either layout).
        alike = pixel_rows(graph, node.inputs[0], config) == \
            pixel_rows(graph, node.outputs[0], config)
        if len(src) in (2, 3) and len(dst) in (2, 3) and \
                sequence_rows(src) == sequence_rows(dst) and (alike or src[-2] == 1):
            return None
        return (f"{node.op} {tuple(src)} -> {tuple(dst)}: a sequence (the image of its "
                "rows) is a view only as (S, D) <-> (1, S, D)")
    if len(dst) != 2 or dst[0] != src[0] or (len(src) == 2 and dst != src):
        return f"{node.op} {tuple(src)} -> {tuple(dst)}: only (N, ...) -> (N, rest) is a view"
    return None


# --- planning -------------------------------------------------------------------------------

def plan_buffers(graph: Graph, nodes, config: HardwareConfig,
                 activations: dict[str, list[str]], carries_map=None) -> BufferPlan:
    """The buffers and placements of the tensors `activations` names (node name -> the
    activation tensors it reads and writes), for `nodes` (the accelerator's nodes of
    `graph`, in order; concat/flatten/reshape among them are views, and every concat
    must be one `concat_conflicts` lets through). The output of a node for which
    `carries_map(node)` holds (a per-channel op) gets its input's channel map."""
    if not resident(config):
        raise ValueError(f"config {config.name}: {not_resident(config)}")
    views = [n for n in nodes if n.op in VIEW_OPS]
    concats = [n for n in views if n.op == "concat"]
    placed, buffers, conflicts = _place_concats(graph, concats, config, carries_map)
    if conflicts:
        name, why = next(iter(conflicts.items()))
        raise ValueError(f"concat node {name!r} cannot be a view: {why}")
    for node in nodes:
        src = None
        for name in activations.get(node.name, ()):
            if name in node.outputs and src is None and carries_map is not None \
                    and carries_map(node):
                src = next((placed[t] for t in node.inputs if t in placed), None)
            if name not in placed and not (node.op in ("flatten", "reshape", "slice")
                                           and name == node.outputs[0]):
                mapped = src is not None and name in node.outputs and not src.identity
                placed[name] = _new_buffer(name, graph.tensors[name].shape, config, buffers,
                                           src.channels if mapped else None,
                                           src.physical if mapped else None,
                                           pixel_rows(graph, name, config))
        if node.op == "slice":
            placed[node.outputs[0]] = _sliced(placed[node.inputs[0]], node,
                                              graph.tensors[node.outputs[0]].shape, config)
        if node.op in ("flatten", "reshape"):
            src, shape = placed[node.inputs[0]], graph.tensors[node.outputs[0]].shape
            sequence = src.sequence or len(shape) == 3
            placed[node.outputs[0]] = (dataclasses.replace(src, shape=tuple(shape),
                                                           sequence=True)
                                       if sequence else _flattened(src, shape, config))
    return BufferPlan(config, buffers, placed, frozenset(n.name for n in views))


def concat_conflicts(graph: Graph, concats, config: HardwareConfig,
                     carries_map=None) -> dict[str, str]:
    """Concat node name -> why it cannot be a view, for those of `concats` whose parts
    are already placed elsewhere by a later concat (a tensor has one place in DRAM).
    Repeated without the refused ones until none is refused, so that `plan_buffers` of
    the others succeeds."""
    concats, refused = list(concats), {}
    while True:
        conflicts = _place_concats(graph, [n for n in concats if n.name not in refused],
                                   config, carries_map)[2]
        if not conflicts:
            return refused
        refused.update(conflicts)


def _new_buffer(name: str, shape, config, buffers, channels=None, physical=None,
                sequence: bool = False) -> Placement:
    p = _placement(shape, name, 0, config, channels, physical, sequence)
    buffers[name] = Buffer(name, 1 if sequence else ceil_div(shape[0], config.batch), p.elems,
                           config.batch * activation_block(config))
    return p


def _place_concats(graph, concats, config, carries_map=None):
    """Place `concats` latest first, so a concat whose parts begin a later concat's (a
    DenseNet block's growing feature map) is a view of the later one's buffer: (placed,
    buffers, {concat: why not} for those whose parts were placed elsewhere already; those
    are left unplaced)."""
    placed: dict[str, Placement] = {}
    buffers: dict[str, Buffer] = {}
    conflicts: dict[str, str] = {}
    block = activation_block(config)
    # Each concat's channel map, from its parts' (innermost first), so that a concat
    # placed as a later concat's part already has the room its own parts need; a
    # per-channel op between them (the quantizer's rescale) passes the map on.
    maps: dict[str, tuple[np.ndarray, int]] = {}
    names = {n.name for n in concats}
    for node in graph.nodes():
        if node.name in names:
            parts = _concat_parts(graph, node, config, maps)
            maps[node.outputs[0]] = (np.concatenate([start + ch for start, ch, _ in parts]),
                                     sum(phys for _, _, phys in parts))
        elif carries_map is not None and carries_map(node):
            src = next((t for t in node.inputs if t in maps), None)
            if src is not None:
                maps[node.outputs[0]] = maps[src]
    for node in reversed(list(concats)):
        out, shape = node.outputs[0], graph.tensors[node.outputs[0]].shape
        # A sequence's channel block holds its rows (`_sequence_concat_problem`).
        seq = len(shape) == 2 and pixel_rows(graph, out, config)
        plane = shape[0] if seq else int(np.prod(shape[2:]))
        parts = _concat_parts(graph, node, config, maps)
        channels = np.concatenate([start + ch for start, ch, _ in parts])
        physical = sum(phys for _, _, phys in parts)
        have = [placed.get(name) for name in node.inputs]
        base = placed.get(out)
        if base is None and all(have):
            # Every part is placed: a view when they lie one after another in one buffer.
            first = have[0]
            base = Placement(first.buffer, first.offset, physical // block * plane,
                             tuple(shape), physical,
                             None if np.array_equal(channels, np.arange(shape[1]))
                             else channels, seq)
        if base is not None and base.physical != physical:
            conflicts[node.name] = (f"its output {out!r} is placed in a buffer with "
                                    f"{base.physical} channels for its {physical}")
            continue
        wants = [] if base is None else [
            _placement(graph.tensors[name].shape, base.buffer,
                       base.offset + start // block * plane, config, ch, phys, seq)
            for name, (start, ch, phys) in zip(node.inputs, parts)]
        if base is None and any(have):
            name = next(n for n, h in zip(node.inputs, have) if h is not None)
            conflicts[node.name] = (f"input {name!r} is placed in another concat's buffer "
                                    "already")
            continue
        bad = [name for name, h, w in zip(node.inputs, have, wants)
               if h is not None and (h.buffer, h.offset) != (w.buffer, w.offset)]
        if bad:
            conflicts[node.name] = (f"input {bad[0]!r} is placed in another concat's buffer "
                                    "already")
            continue
        if base is None:
            base = _new_buffer(out, shape, config, buffers, channels, physical, seq)
            wants = [_placement(graph.tensors[name].shape, out, start // block * plane,
                                config, ch, phys, seq)
                     for name, (start, ch, phys) in zip(node.inputs, parts)]
        placed[out] = base
        for name, want in zip(node.inputs, wants):
            placed.setdefault(name, want)
    return placed, buffers, conflicts


def _concat_parts(graph, node, config, maps) -> list[tuple[int, np.ndarray, int]]:
    """Per input of concat `node`: (its first physical channel in the concat, the
    physical position of each of its channels, its physical channels). `maps` holds
    the (positions, physical channels) of inputs that are concats themselves; any other
    input fills whole blocks from its first."""
    parts, start = [], 0
    for name in node.inputs:
        c = graph.tensors[name].shape[1]
        block = activation_block(config)
        ch, phys = maps.get(name, (np.arange(c), ceil_div(c, block) * block))
        parts.append((start, ch, phys))
        start += phys
    return parts


def _sliced(src: Placement, node, shape, config: HardwareConfig) -> Placement:
    """The placement of a slice of whole channel blocks of sequence `src`
    (`slice_view_problem`): its blocks, each of the sequence's rows."""
    block = activation_block(config)
    rows = sequence_rows(src.shape)[0]
    start = int(node.attrs["starts"][0])
    physical = ceil_div(shape[-1], block) * block
    return Placement(src.buffer, src.offset + start // block * rows, physical // block * rows,
                     tuple(shape), physical, None, True)


def _flattened(src: Placement, shape, config: HardwareConfig) -> Placement:
    """The placement of (N, C*H*W) read from `src` (N, C, H, W) in place: feature
    ``c*H*W + p`` sits at ``(block(c) * H*W + p) * block + lane(c)`` of the dense
    layer's input blocks."""
    block = activation_block(config)
    plane = int(np.prod(src.shape[2:])) if len(src.shape) > 2 else 1
    pos = src.positions()
    blocks, lanes = pos // block, pos % block
    features = ((blocks[:, None] * plane + np.arange(plane)[None, :]) * block
                + lanes[:, None]).reshape(-1)
    channels = None if np.array_equal(features, np.arange(shape[1])) else features
    return Placement(src.buffer, src.offset, src.elems, tuple(shape), src.physical * plane,
                     channels)


# --- relocation -----------------------------------------------------------------------------

def relocate_to(program: Program, config: HardwareConfig, regions: dict, arena: int,
                moved: dict[str, tuple[int, Placement, Buffer]]) -> Program:
    """`program` (emitted for an arena at address 0 with `regions`) with every LOAD/STORE
    of a region in `moved` ({region: (buffer byte address, placement, buffer)}) inside
    its tensor's placement, and every other one in the arena at byte address `arena`
    (`relocate.relocate`). Raises ValueError for an access that would not stay inside one
    batch block's slice (the placement could not hold it as one DMA)."""
    return relocate(program, arena, config, region_mover(regions, moved))


def region_mover(regions: dict, moved: dict[str, tuple[int, Placement, Buffer]]):
    """The ``move`` of `relocate.relocate` (and `relocate.relocate_encoded`) that
    `relocate_to` relocates with: an access of a region in `moved` goes to its tensor's
    placement, any other stays in the arena."""
    spans = sorted((r.offset, r.offset + r.nbytes, name) for name, r in regions.items()
                   if r.nbytes)

    def move(insn, size: int) -> int | None:
        byte = insn.dram_base * size
        name = next((n for lo, hi, n in spans if lo <= byte < hi), None)
        return None if name not in moved else _moved(insn, size, regions[name], *moved[name])

    return move


def _moved(insn, size: int, region, address: int, p: Placement, buf: Buffer) -> int:
    # In bytes: an access moves inp or out elements (batch x block_in or block_out
    # channels), a buffer counts activation-block elements (batch x L); a qmatmul's
    # LOAD WGT moves weight blocks of L consecutive rows of a sequence's channel block
    # (`conv_layer.matmul_problem`), which must start on a weight block's boundary.
    eb = buf.elem_bytes
    first = insn.dram_base * size - region.offset
    last = first + ((insn.y_size - 1) * insn.x_stride + insn.x_size) * size - 1
    nb, rest = divmod(first, p.elems * eb)
    if last // (p.elems * eb) != nb and (p.offset, p.elems) != (0, buf.elems):
        raise ValueError(f"a {insn.memory_type.name} access of bytes {first}..{last} crosses "
                         f"a batch block ({p.elems} elements each) of buffer {buf.name!r}")
    byte = address + (nb * buf.elems + p.offset) * eb + rest
    if (eb % size if size <= eb else byte % size) or address % min(size, eb):
        raise ValueError(f"{insn.memory_type.name} access of {size}-byte elements into a buffer "
                         f"of {eb}-byte elements at {byte:#x}")
    return byte // size
