"""Packed tensor layouts: the accelerator's blocked formats and the pass that uses them.

The GEMM core multiplies a ``batch x block_in`` tile of inputs by a ``block_out x
block_in`` tile of weights, so its DRAM tensors are stored in blocks of those sizes
(VTA's layouts). Layout names:

===================  ===============================  ====================================
name                 shape                            holds
===================  ===============================  ====================================
``NCHW``             (N, C, H, W)                     activations (plain)
``NCHW{b}n{c}c``     (N/b, C/c, H, W, b, c)           activations, packed
``NC``               (N, C)                           dense activations (plain)
``NC{b}n{c}c``       (N/b, C/c, b, c)                 dense activations, packed
``OIHW``             (O, I, kH, kW)                   conv weights (plain)
``OIHW{o}o{i}i``     (O/o, I/i, kH, kW, o, i)         conv weights, packed
``OI``               (O, I)                           dense weights (plain)
``OI{o}o{i}i``       (O/o, I/i, o, i)                 dense weights, packed
===================  ===============================  ====================================

Packing pads the first two plain axes (N and C, or O and I) with zeros up to multiples
of their blocks; unpacking crops them back when told the original sizes (``batch`` for
axis 0, ``channels`` for axis 1) and keeps the padding otherwise.

`vdla.compiler.passes.pack.pack_graph` rewrites a graph's GEMM operators into this packed
form with ``layout_transform`` nodes at the boundaries; `run_reference` executes the
packed operators with the same plain kernels (see `vdla.compiler.reference`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

__all__ = ["Layout", "pack", "parse_layout", "plain_layout", "round_up", "transform",
           "transform_shape", "unpack"]

# Plain layout -> (letter of the outer block, letter of the inner block).
_FAMILIES = {"NCHW": ("n", "c"), "NC": ("n", "c"), "OIHW": ("o", "i"), "OI": ("o", "i")}
_PATTERN = re.compile(r"^(NCHW|NC|OIHW|OI)(?:(\d+)([a-z])(\d+)([a-z]))?$")
_KNOWN = "NCHW, NC, OIHW, OI, NCHW{b}n{c}c, NC{b}n{c}c, OIHW{o}o{i}i, OI{o}o{i}i"


@dataclass(frozen=True)
class Layout:
    """A parsed layout name: `base` is the plain layout (``NCHW``, ``NC``, ``OIHW``,
    ``OI``); `outer` and `inner` are the block sizes of its axes 0 and 1 (None for the
    plain layout itself)."""

    name: str
    base: str
    outer: int | None = None
    inner: int | None = None

    @property
    def packed(self) -> bool:
        return self.outer is not None

    @property
    def rank(self) -> int:
        """Rank of a tensor in this layout."""
        return len(self.base) + (2 if self.packed else 0)

    @property
    def plain(self) -> "Layout":
        return Layout(self.base, self.base)


def parse_layout(name: str | Layout) -> Layout:
    """Parse a layout name (see the module docstring); raise ValueError naming the
    allowed forms for anything else."""
    if isinstance(name, Layout):
        return name
    m = _PATTERN.match(name) if isinstance(name, str) else None
    if m is None:
        raise ValueError(f"unknown layout {name!r}; known forms: {_KNOWN}")
    base, outer, outer_letter, inner, inner_letter = m.groups()
    if outer is None:
        return Layout(name, base)
    if (outer_letter, inner_letter) != _FAMILIES[base]:
        o, i = _FAMILIES[base]
        raise ValueError(f"layout {name!r}: {base} blocks are written {base}{{x}}{o}{{y}}{i}")
    if int(outer) < 1 or int(inner) < 1:
        raise ValueError(f"layout {name!r}: block sizes must be >= 1")
    return Layout(name, base, int(outer), int(inner))


def plain_layout(name: str | Layout) -> str:
    """The plain layout of `name`'s family (``NCHW16n16c`` -> ``NCHW``)."""
    return parse_layout(name).base


def round_up(value: int, block: int) -> int:
    return -(-value // block) * block


def _check_same_family(src: Layout, dst: Layout):
    if src.base != dst.base:
        raise ValueError(f"cannot transform layout {src.name!r} to {dst.name!r}: a layout "
                         f"only converts within its family ({src.base} and its blocked forms)")


def _plain_shape(shape, layout: Layout) -> tuple[int, ...]:
    """The padded plain shape of a tensor of `shape` in `layout`."""
    shape = tuple(int(d) for d in shape)
    if len(shape) != layout.rank:
        raise ValueError(f"a tensor in layout {layout.name!r} has rank {layout.rank}, "
                         f"not shape {shape}")
    if not layout.packed:
        return shape
    if shape[-2:] != (layout.outer, layout.inner):
        raise ValueError(f"a tensor in layout {layout.name!r} ends with blocks "
                         f"({layout.outer}, {layout.inner}), not shape {shape}")
    return (shape[0] * layout.outer, shape[1] * layout.inner) + shape[2:-2]


def _crop_sizes(padded: tuple[int, ...], batch, channels) -> tuple[int, int]:
    a0, a1 = padded[0], padded[1]
    for what, value, limit in (("batch", batch, a0), ("channels", channels, a1)):
        if value is not None and not 1 <= int(value) <= limit:
            raise ValueError(f"{what}={value} must be between 1 and the padded size {limit}")
    return (a0 if batch is None else int(batch)), (a1 if channels is None else int(channels))


def transform_shape(shape, src, dst, channels=None, batch=None) -> tuple[int, ...]:
    """The shape of a tensor of `shape` in layout `src` after transforming it to `dst`.

    `channels` and `batch` are the unpadded sizes of plain axes 1 and 0 (C and N, or I
    and O of weights): with them a packed tensor is cropped back; without them its
    padding stays. Raises ValueError for unknown layouts, layouts of different families
    and shapes that do not fit `src`."""
    src, dst = parse_layout(src), parse_layout(dst)
    _check_same_family(src, dst)
    plain = _plain_shape(shape, src)
    a0, a1 = _crop_sizes(plain, batch, channels)
    plain = (a0, a1) + plain[2:]
    if not dst.packed:
        return plain
    return (round_up(a0, dst.outer) // dst.outer, round_up(a1, dst.inner) // dst.inner) \
        + plain[2:] + (dst.outer, dst.inner)


def pack(array: np.ndarray, src, dst) -> np.ndarray:
    """Pack a plain-layout `array` (layout `src`) into the blocked layout `dst`, padding
    axes 0 and 1 with zeros to multiples of the blocks."""
    src, dst = parse_layout(src), parse_layout(dst)
    _check_same_family(src, dst)
    if src.packed or not dst.packed:
        raise ValueError(f"pack converts a plain layout to a blocked one, not {src.name!r} "
                         f"to {dst.name!r} (use transform)")
    array = np.asarray(array)
    _plain_shape(array.shape, src)
    a0, a1 = array.shape[:2]
    p0, p1 = round_up(a0, dst.outer), round_up(a1, dst.inner)
    if (p0, p1) != (a0, a1):
        array = np.pad(array, [(0, p0 - a0), (0, p1 - a1)] + [(0, 0)] * (array.ndim - 2))
    rest = array.shape[2:]
    blocked = array.reshape((p0 // dst.outer, dst.outer, p1 // dst.inner, dst.inner) + rest)
    # (A0/o, o, A1/i, i, *rest) -> (A0/o, A1/i, *rest, o, i)
    k = len(rest)
    order = (0, 2) + tuple(range(4, 4 + k)) + (1, 3)
    return np.ascontiguousarray(blocked.transpose(order))


def unpack(array: np.ndarray, src, dst, channels=None, batch=None) -> np.ndarray:
    """Unpack a blocked `array` (layout `src`) to the plain layout `dst`, cropping axis 1
    to `channels` and axis 0 to `batch` when given (else the zero padding is kept)."""
    src, dst = parse_layout(src), parse_layout(dst)
    _check_same_family(src, dst)
    if not src.packed or dst.packed:
        raise ValueError(f"unpack converts a blocked layout to a plain one, not {src.name!r} "
                         f"to {dst.name!r} (use transform)")
    array = np.asarray(array)
    plain = _plain_shape(array.shape, src)
    k = array.ndim - 4
    # (A0/o, A1/i, *rest, o, i) -> (A0/o, o, A1/i, i, *rest)
    order = (0, array.ndim - 2, 1, array.ndim - 1) + tuple(range(2, 2 + k))
    out = array.transpose(order).reshape(plain)
    a0, a1 = _crop_sizes(plain, batch, channels)
    return np.ascontiguousarray(out[:a0, :a1])


def transform(array: np.ndarray, src, dst, channels=None, batch=None) -> np.ndarray:
    """Convert `array` from layout `src` to `dst` (plain or blocked, same family),
    cropping to `channels`/`batch` on the way when given (see `transform_shape`)."""
    src, dst = parse_layout(src), parse_layout(dst)
    transform_shape(np.shape(array), src, dst, channels, batch)     # validates everything
    array = np.asarray(array)
    if src.packed:
        array = unpack(array, src, src.plain, channels, batch)
    elif channels is not None or batch is not None:
        a0, a1 = _crop_sizes(array.shape, batch, channels)
        array = array[:a0, :a1]
    return pack(array, src.plain, dst) if dst.packed else np.ascontiguousarray(array)
