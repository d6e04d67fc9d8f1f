"""The graph-level layout choice: which layout each tuned layer's schedule writes, chosen
with its neighbours'.

The tuner measures each layer alone, with its input already in the layout its schedule
reads (`vdla.compiler.targets.cpu.tuning`), so a layer's fastest record may write a
layout its neighbours do not read: then the whole-graph runner converts between them
(`vdla.compiler.targets.cpu.program.plan_steps`), a pass over the tensor that no record
counts. `choose_layouts` weighs the two together. A model's cost is

    sum over nodes of the chosen record's cost  +  sum over the conversions the runner
    would place of `layout.conversion_ns`

and each tuned node may take its fastest record of every layout it was measured in
(plain, ``NCHW8c``, ``NCHW16c``, ...). The choice starts from every node's fastest and
moves a run of up to `MAX_RUN` consecutive tuned nodes at a time into one layout, the
move that lowers the model's cost most at each start, until no move does (a local
search, as TVM's graph tuner makes over layouts; a run, because two neighbours that
left their neighbours' layout together only come back together): every move is a real
saving, so it ends, and where no node's fastest record disagrees with its neighbours it
keeps them all, with nothing to pay. The search runs from the fastest records and from
every node in one layout, and the cheapest end wins: a model whose halves each lean to
another layout needs a move longer than any run to agree.

The conversions are those `plan_steps` places for the kernels the nodes would get, so
the count follows the runner exactly: pools and elementwise ops that follow their
producer's layout, tensors read by several consumers, graph inputs and outputs.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from vdla.compiler.ir.graph import DTYPES, Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.layout import PLAIN, conversion_ns
from vdla.compiler.targets.cpu.program import plan_steps

__all__ = ["choose_layouts", "layout_of", "model_cost"]

#: At most this many passes over the nodes (each pass that moves nothing ends the search
#: first).
MAX_PASSES = 8
#: A move puts up to this many consecutive tuned nodes in one layout: a single node
#: between two others of its own layout would trade one conversion for another.
MAX_RUN = 4


def layout_of(schedule: Any) -> int:
    """The layout a schedule's kernel writes: its vector width for a blocked
    convolution, `PLAIN` (0) otherwise."""
    return schedule.vl if getattr(schedule, "layout", "plain") != "plain" else PLAIN


def _by_layout(found: Sequence[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """The fastest (schedule, cost) of each layout among `found` (fastest first), in
    that order."""
    best: dict[int, tuple[Any, Any]] = {}
    for schedule, cost in found:
        best.setdefault(layout_of(schedule), (schedule, cost))
    return list(best.values())


def model_cost(graph: Graph, nodes: Sequence[Node], schedules: Mapping[str, Any],
               costs: Mapping[str, float], make_kernels: Callable, memo: dict
               ) -> tuple[float, int]:
    """(the model's cost in the records' unit, the conversions) with `schedules`: the
    nodes' `costs` plus `conversion_ns` of every conversion the runner would place."""
    kernels, _ = make_kernels(graph, nodes, schedules=schedules, memo=memo)
    total, count = float(sum(costs.values())), 0
    for step in plan_steps(graph, nodes, kernels):
        if step.node is None:
            (tensor, src), (_, dst) = step.reads[0], step.writes
            t = graph.tensors[tensor]
            total += conversion_ns(t.shape, np.dtype(DTYPES[t.dtype]).itemsize, src, dst)
            count += 1
    return total, count


def choose_layouts(graph: Graph, nodes: Sequence[Node],
                   options: Mapping[str, Sequence[tuple[Any, Any]]], make_kernels: Callable
                   ) -> dict[str, tuple[Any, Any]]:
    """node name -> (schedule, cost) for each node of `options` (its recorded schedules
    and costs, fastest first), the layouts chosen to lower the model's cost
    (`model_cost`). `nodes`: the nodes the program runs, in order; `make_kernels`:
    `CpuTarget.kernels`."""
    candidates = {name: _by_layout(found) for name, found in options.items() if found}
    fastest = {name: 0 for name in candidates}
    movable = [n.name for n in nodes if len(candidates.get(n.name, ())) > 1]
    if not movable:
        return {name: found[0] for name, found in candidates.items()}
    memo: dict = {}

    def cost(choice: Mapping[str, int]) -> float:
        schedules = {name: candidates[name][k][0] for name, k in choice.items()}
        costs = {name: float(candidates[name][k][1]) for name, k in choice.items()}
        return model_cost(graph, nodes, schedules, costs, make_kernels, memo)[0]

    # From the fastest records, and from every node in one layout (where it has one).
    starts = [fastest] + [{**fastest, **_move(movable, layout, candidates, fastest,
                                                 partial=True)}
                          for layout in sorted({layout_of(s) for name in movable
                                                for s, _ in candidates[name]})]
    found = [_descend(pick, movable, candidates, cost) for pick in starts]
    _, pick = min(found, key=lambda f: f[0])
    return {name: candidates[name][k] for name, k in pick.items()}


def _descend(pick: dict[str, int], movable: Sequence[str], candidates, cost
             ) -> tuple[float, dict[str, int]]:
    """Local search from `pick` (see the module docstring): its cost and picks."""
    pick, current = dict(pick), cost(pick)
    for _ in range(MAX_PASSES):
        moved = False
        for start in range(len(movable)):
            trials = []
            for length in range(1, MAX_RUN + 1):
                run = movable[start:start + length]
                if len(run) < length:
                    break
                for layout in {layout_of(s) for s, _ in candidates[run[0]]}:
                    move = _move(run, layout, candidates, pick)
                    if move:
                        trials.append((cost({**pick, **move}), length, move))
            if trials:
                best, _, move = min(trials, key=lambda t: t[:2])
                if best < current:
                    pick.update(move)
                    current, moved = best, True
        if not moved:
            break
    return current, pick


def _move(run: Sequence[str], layout: int, candidates, pick, *, partial: bool = False
          ) -> dict[str, int]:
    """The picks that put every node of `run` in `layout`: {} when one of them has no
    record in it (with `partial`: those are left as they are) or none changes."""
    move = {}
    for name in run:
        at = [k for k, (s, _) in enumerate(candidates[name]) if layout_of(s) == layout]
        if not at:
            if partial:
                continue
            return {}
        if at[0] != pick[name]:
            move[name] = at[0]
    return move
