"""Spaces the tuners see (`vdla.compiler.tuner.space`): a listed one, and the CPU's
products that are never listed, which must agree with their enumeration index for
index, position for position and neighbour for neighbour."""

import dataclasses

import numpy as np
import pytest

from vdla.compiler import pipeline, targets
from vdla.compiler.targets.cpu.dense_schedule import dense_space
from vdla.compiler.targets.cpu.schedule import ConvSchedule, conv_space
from vdla.compiler.tuner.search import GridTuner, ModelTuner, RandomTuner
from vdla.compiler.tuner.space import Block, KnobGrid, ListSpace, ProductSpace, knob_grid


@pytest.fixture(scope="module")
def cpu_tasks():
    """small_cnn's CPU tasks (widest instruction set, one thread) and MobileNet-v1's
    first depthwise and pointwise layers: a plain, a depthwise, a pointwise with
    channel lanes, and a dense space."""
    cpu = targets.get("cpu").platforms(1)[0]
    small = cpu.tasks(pipeline.graph_for(pipeline.load_model("small_cnn"), cpu))
    mobile = cpu.tasks(pipeline.graph_for(pipeline.load_model("mobilenet_v1"), cpu,
                                          precision="float32"))
    pick = [t for t in small if t.conv][:2] + [next(t for t in small if not t.conv)]
    pick += [next(t for t in mobile if t.conv and t.shape.depthwise),
             next(t for t in mobile if t.conv and t.shape.pointwise)]
    return pick


def listed(task):
    shape, isa = task.shape, task._isa
    return list(conv_space(shape, isa) if task.conv else dense_space(shape, isa))


def test_a_product_space_is_its_enumeration(cpu_tasks):
    for task in cpu_tasks:
        space, want = task.space(), listed(task)
        assert isinstance(space, ProductSpace) and len(space) == len(want)
        rng = np.random.default_rng(0)
        for i in rng.choice(len(want), min(len(want), 300), replace=False):
            assert space[int(i)] == want[int(i)]
            assert space.position(want[int(i)]) == int(i) == space.index(want[int(i)])
        assert space[-1] == want[-1] and space[:3] == want[:3]
        assert task.default_schedule() in space


def test_a_schedule_not_in_the_space_has_no_position(cpu_tasks):
    task = cpu_tasks[0]
    space = task.space()
    inside = space[0]
    for outside in (dataclasses.replace(inside, tile_h=10_000),
                    dataclasses.replace(inside, mr=99), "not a schedule"):
        assert space.position(outside) is None and outside not in space
        with pytest.raises(ValueError, match="is not in the space"):
            space.index(outside)
    with pytest.raises(IndexError, match="out of a space of"):
        space[len(space)]


def test_the_product_grid_is_the_listed_knob_grid(cpu_tasks):
    """Neighbours one knob rank away, as `KnobGrid` finds them over the listed
    schedules and `TuneTask.knobs`."""
    for task in cpu_tasks:
        space = task.space()
        listed_grid, grid = KnobGrid(task, listed(task)), knob_grid(task, space)
        assert grid.dims == listed_grid.dims
        rng = np.random.default_rng(1)
        starts = rng.choice(len(space), min(len(space), 40), replace=False)
        assert grid.neighbours(starts).tolist() == listed_grid.neighbours(starts).tolist()
        for i in starts[:10]:
            assert np.array_equal(grid.point(int(i)), listed_grid.point(int(i)))
            assert grid.at(grid.point(int(i))) == int(i)
        assert grid.at(np.full(grid.dims, -1)) is None


def test_blocks_must_fix_the_same_fields_once():
    axes = (("tile_h", (1, 2)),)
    with pytest.raises(ValueError, match="fix different fields"):
        ProductSpace(ConvSchedule, [Block({"vl": 8}, axes), Block({"mr": 1}, axes)])
    with pytest.raises(ValueError, match="two blocks fix"):
        ProductSpace(ConvSchedule, [Block({"vl": 8}, axes), Block({"vl": 8}, axes)])


def test_a_list_is_a_space_with_positions():
    space = ListSpace(("a", "b", "c"))
    assert space.position("b") == 1 and space.position("z") is None and "c" in space
    assert list(space) == ["a", "b", "c"] and space[2] == "c"


def test_the_tuners_run_on_a_space_they_never_list(cpu_tasks, monkeypatch):
    """The grid, random and from-scratch tuners on a MobileNet-v1 pointwise layer's
    product space: proposals are distinct, unmeasured, in the space, and nothing lists
    the space (iterating it fails here)."""
    task = cpu_tasks[-1]
    space = task.space()
    # Tens of thousands of schedules on every instruction set (about 21,000 with AVX2's
    # 8 lanes, more with AVX-512's 16): too many to list for each proposal.
    assert len(space) > 10_000

    def refuse(self):
        raise AssertionError("the space was listed")

    monkeypatch.setattr(ProductSpace, "__iter__", refuse)
    for tuner in (GridTuner(task, space), RandomTuner(task, space, seed=2),
                  ModelTuner(task, space, seed=2, chains=8, steps=10)):
        seen = set()
        for round_ in range(3):
            batch = tuner.propose(6)
            assert len(batch) == 6 and not set(batch) & seen
            assert all(tuner.position(s) is not None for s in batch)
            seen |= set(batch)
            tuner.update(batch, [1000 + 50 * k - 10 * round_ for k in range(6)])
        assert len(tuner.measured) == 18
    assert tuner.expected_best() > 0 and tuner.model is not None


def test_a_product_space_splits_into_strata_by_its_blocks():
    space = ProductSpace(dict, [
        Block({"layout": "plain", "mr": 1}, (("tile_h", (1, 2)), ("tile_co", (8, 16)))),
        Block({"layout": "nchwc", "mr": 1}, (("tile_h", (1, 2, 4)),)),
        Block({"layout": "plain", "mr": 2}, (("tile_h", (1,)),))])
    strata = space.strata(lambda fixed: fixed["layout"])
    assert [list(s) for s in strata] == [[0, 1, 2, 3, 7], [4, 5, 6]]
    assert {space[int(i)]["layout"] for i in strata[1]} == {"nchwc"}


def test_the_random_tuner_draws_the_cpu_strata_in_turn(cpu_tasks):
    """A CPU convolution's random order takes its plain, blocked and Winograd schedules in
    turn (`CpuTask.strata`): the blocked ones are a minority of a pointwise space (a tenth
    with AVX-512's 16 lanes, about a third with AVX2's 8), half of the first draws; each
    stratum once in all, and the order the same for a seed."""
    task = cpu_tasks[-1]                         # MobileNet-v1's first pointwise layer
    space = task.space()
    order = RandomTuner(task, space, seed=3).order
    assert sorted(order) == list(range(len(space)))
    first = [space[int(i)].layout for i in order[:12]]
    assert first == ["plain", "nchwc"] * 6
    assert np.array_equal(order, RandomTuner(task, space, seed=3).order)
    assert sum(s.layout != "plain" for s in space[::97]) < len(space[::97]) / 2
    dense = next(t for t in cpu_tasks if not t.conv)
    assert dense.strata(dense.space()) is None
