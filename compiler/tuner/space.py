"""A task's schedule space as the tuners see it: a sequence in a fixed order whose
schedules are found by position, and the knob grid that search moves on.

Most spaces are lists (the accelerator's few thousand tilings of a layer):
`ListSpace` indexes one with a dict. Some are far larger: the CPU target's register
tiles, cache tiles, loop orders and unrolls give a MobileNet-v1 layer up to 218,880
schedules and the model 1.4 million, whose enumeration alone took 2.5-4 s a process,
more than a fifth of the time its 64 measurements take. Those spaces are unions of
Cartesian products (one block per register tile, its cache tiles and loop orders
crossed), so `ProductSpace` keeps the blocks and computes a schedule from its position,
and a position from its schedule, without listing anything:

    space = ProductSpace(ConvSchedule, [Block({"vl": 16, "mr": 4, ...},
                                              (("tile_co", (4, 8)), ("tile_h", (1, 2, 4))))])
    space[5], space.position(schedule), space.grid().neighbours([5])

The order is the enumeration's (blocks in turn, the last axis fastest), so a space
listed and the same space as blocks agree index for index, and so do samples drawn from
either with one seed.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Any, Callable, Hashable, Iterator, Mapping, Sequence

import numpy as np

__all__ = ["Block", "KnobGrid", "ListSpace", "ProductSpace", "as_space", "knob_grid"]


class ListSpace(Sequence):
    """`schedules` (any sequence of hashable schedules) with a position for each."""

    def __init__(self, schedules: Sequence):
        self.schedules = schedules if isinstance(schedules, (list, tuple)) else list(schedules)
        self._at = {s: i for i, s in enumerate(self.schedules)}

    def __len__(self) -> int:
        return len(self.schedules)

    def __getitem__(self, i):
        return self.schedules[i]

    def __iter__(self) -> Iterator:
        return iter(self.schedules)

    def __contains__(self, schedule) -> bool:
        return schedule in self._at

    def position(self, schedule) -> int | None:
        """`schedule`'s index, or None when it is not in the space."""
        return self._at.get(schedule)

    def index(self, schedule, *args) -> int:
        at = self._at.get(schedule)
        if at is None:
            raise ValueError(f"{schedule!r} is not in the space")
        return at


@dataclasses.dataclass(frozen=True)
class Block:
    """One Cartesian product of a `ProductSpace`: `fixed` fields equal over the block,
    and `axes`, each field with its values in order (the last varies fastest)."""

    fixed: Mapping[str, Any]
    axes: tuple[tuple[str, tuple], ...]

    @property
    def size(self) -> int:
        return math.prod(len(values) for _, values in self.axes)


class ProductSpace(Sequence):
    """The schedules of `blocks` in turn, built by `make(**fields)`, never listed.

    make : builds a schedule from its fields (a dataclass, say)
    blocks : the products; every block fixes the same fields, with different values,
        and varies the others (ValueError otherwise)
    ranks : for fields whose values do not order themselves (strings), a function of a
        value giving its rank: the knob grid steps between neighbouring ranks
    """

    def __init__(self, make: Callable[..., Any], blocks: Sequence[Block], *,
                 ranks: Mapping[str, Callable[[Any], Any]] | None = None):
        self.make = make
        self.blocks = [b for b in blocks if b.size]
        names = {tuple(b.fixed) for b in self.blocks}
        if len(names) > 1:
            raise ValueError(f"the blocks fix different fields: {sorted(names)}")
        self.fixed_names = names.pop() if names else ()
        self._block = {}
        for k, b in enumerate(self.blocks):
            key = tuple(b.fixed.values())
            if key in self._block:
                raise ValueError(f"two blocks fix {dict(b.fixed)}")
            self._block[key] = k
        self._starts = list(np.cumsum([0] + [b.size for b in self.blocks]))
        # Each block's axis values -> their positions, for `position`.
        self._axis_at = [[{v: i for i, v in enumerate(values)} for _, values in b.axes]
                         for b in self.blocks]
        self.ranks = dict(ranks or {})
        self.names = self._names()

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __iter__(self) -> Iterator:
        for i in range(len(self)):
            yield self[i]

    def fields(self, i: int) -> dict[str, Any]:
        """The fields of the schedule at index `i`."""
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of a space of {len(self)}")
        k = bisect.bisect_right(self._starts, i) - 1
        block, rest = self.blocks[k], i - int(self._starts[k])
        found = dict(block.fixed)
        for name, values in reversed(block.axes):
            rest, j = divmod(rest, len(values))
            found[name] = values[j]
        return found

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        return self.make(**self.fields(i))

    def strata(self, key: Callable[[Mapping[str, Any]], Hashable]) -> list[np.ndarray]:
        """The space's indices grouped by `key` of each block's fixed fields, one array
        a group, in the order the groups first appear."""
        groups: dict[Hashable, list[np.ndarray]] = {}
        for block, start in zip(self.blocks, self._starts):
            groups.setdefault(key(block.fixed), []).append(
                np.arange(start, start + block.size, dtype=np.int64))
        return [np.concatenate(parts) for parts in groups.values()]

    def position_of(self, fields: Mapping[str, Any]) -> int | None:
        """The index of the schedule with `fields`, or None when none has them."""
        k = self._block.get(tuple(fields.get(n) for n in self.fixed_names))
        if k is None:
            return None
        at = 0
        for (name, values), lookup in zip(self.blocks[k].axes, self._axis_at[k]):
            j = lookup.get(fields.get(name))
            if j is None:
                return None
            at = at * len(values) + j
        return int(self._starts[k]) + at

    def position(self, schedule) -> int | None:
        """`schedule`'s index, or None when it is not in the space."""
        try:
            fields = {n: getattr(schedule, n) for n in self.names}
        except AttributeError:
            return None
        at = self.position_of(fields)
        # A field no block names (a constant of the schedule) must match too.
        return at if at is not None and self[at] == schedule else None

    def index(self, schedule, *args) -> int:
        at = self.position(schedule)
        if at is None:
            raise ValueError(f"{schedule!r} is not in the space")
        return at

    def __contains__(self, schedule) -> bool:
        return self.position(schedule) is not None

    def _names(self) -> tuple[str, ...]:
        """The fields the blocks name: in the schedule's own order where it is a
        dataclass (the order `TuneTask.knobs` gives its knobs), else fixed then axes."""
        names = (*self.fixed_names, *{n: None for b in self.blocks for n, _ in b.axes})
        if dataclasses.is_dataclass(self.make):
            order = [f.name for f in dataclasses.fields(self.make)]
            names = tuple(sorted(names, key=lambda n: order.index(n) if n in order
                                 else len(order)))
        return names

    def grid(self) -> "ProductGrid":
        return ProductGrid(self)


class ProductGrid:
    """A `ProductSpace`'s knob grid, as `candidates.KnobGrid` is a listed space's: each
    field a knob, its values ranked over the whole space, a schedule a point, and a
    neighbour one rank along one knob (when the space has a schedule there)."""

    def __init__(self, space: ProductSpace):
        self.space = space
        self.names = space.names
        values: dict[str, set] = {n: set() for n in self.names}
        for b in space.blocks:
            for n, v in b.fixed.items():
                values[n].add(v)
            for n, vs in b.axes:
                values[n].update(vs)
        self.values = [sorted(values[n], key=space.ranks.get(n, _natural))
                       for n in self.names]
        self.rank = [{v: r for r, v in enumerate(vs)} for vs in self.values]
        self.size = np.array([len(v) for v in self.values], dtype=np.int64)

    @property
    def dims(self) -> int:
        return len(self.names)

    def point(self, index: int) -> np.ndarray:
        """The grid point (one rank a knob) of the schedule at `index`."""
        fields = self.space.fields(int(index))
        return np.array([r[fields[n]] for n, r in zip(self.names, self.rank)],
                        dtype=np.int64)

    def at(self, point) -> int | None:
        """The index of the schedule at grid `point`, or None off the grid."""
        point = np.asarray(point, dtype=np.int64)
        if ((point < 0) | (point >= self.size)).any():
            return None
        return self.space.position_of({n: vs[int(p)] for n, vs, p in
                                       zip(self.names, self.values, point)})

    def neighbours(self, indices) -> np.ndarray:
        """The indices one step along one knob from any of `indices`, sorted."""
        found = set()
        for index in np.asarray(indices, dtype=np.int64).ravel():
            point = self.point(int(index))
            for d in range(self.dims):
                for delta in (-1, 1):
                    point[d] += delta
                    j = self.at(point)
                    point[d] -= delta
                    if j is not None:
                        found.add(j)
        return np.array(sorted(found), dtype=np.int64)


class KnobGrid:
    """A space's knob grid: each schedule a point (`TuneTask.knobs`, each knob's values
    ranked), looked up by a mixed-radix code of its point.

    task, space : the task and its schedules, in the space's order
    """

    def __init__(self, task, space: Sequence):
        knobs = np.array([task.knobs(s) for s in space], dtype=np.int64)
        self.coords = np.stack([np.unique(knobs[:, d], return_inverse=True)[1]
                                for d in range(knobs.shape[1])], axis=1)
        self.size = self.coords.max(axis=0) + 1
        self.radix = np.concatenate([[1], np.cumprod(self.size[:-1])]).astype(np.int64)
        codes = self.coords @ self.radix
        self.order = np.argsort(codes, kind="stable")
        self.codes = codes[self.order]

    @property
    def dims(self) -> int:
        return self.coords.shape[1]

    def point(self, index: int) -> np.ndarray:
        """The grid point (one rank a knob) of the schedule at `index`."""
        return self.coords[int(index)].copy()

    def at(self, point) -> int | None:
        """The space index of the schedule at grid `point` (one rank a knob), or None
        off the grid."""
        point = np.asarray(point, dtype=np.int64)
        if ((point < 0) | (point >= self.size)).any():
            return None
        code = int(point @ self.radix)
        at = int(np.searchsorted(self.codes, code))
        return int(self.order[at]) if at < len(self.codes) and self.codes[at] == code \
            else None

    def neighbours(self, indices: np.ndarray) -> np.ndarray:
        """The space indices one step along one knob from any of `indices`, sorted."""
        points = self.coords[np.asarray(indices, dtype=np.int64)]
        steps = []
        for d in range(points.shape[1]):
            for delta in (-1, 1):
                moved = points.copy()
                moved[:, d] += delta
                steps.append(moved)
        moved = np.concatenate(steps)
        moved = moved[((moved >= 0) & (moved < self.size)).all(axis=1)]
        codes = moved @ self.radix
        at = np.minimum(np.searchsorted(self.codes, codes), len(self.codes) - 1)
        return np.unique(self.order[at[self.codes[at] == codes]])


def _natural(value):
    return value


def as_space(schedules: Sequence) -> ListSpace | ProductSpace:
    """`schedules` as a space with positions: a `ProductSpace` or `ListSpace` as is,
    any other sequence indexed (`ListSpace`)."""
    if isinstance(schedules, (ListSpace, ProductSpace)):
        return schedules
    return ListSpace(schedules)


def knob_grid(task, space: Sequence):
    """The knob grid search moves on: a `ProductSpace`'s own (nothing listed), else a
    `KnobGrid` over the listed schedules' `TuneTask.knobs`."""
    if isinstance(space, ProductSpace):
        return space.grid()
    return KnobGrid(task, space)
