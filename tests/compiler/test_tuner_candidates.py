"""The candidates a pretrained model ranks: a whole space, or a large space's sample
widened around the model's best on the knob grid (`vdla.compiler.tuner.candidates`)."""

import numpy as np
import pytest

from vdla.compiler import pipeline, targets
from vdla.compiler.tuner.candidates import Candidates
from vdla.compiler.tuner.space import KnobGrid
from vdla.compiler.tuner.pretrained_chooser import pretrained_choice
from vdla.compiler.tuner.search import PretrainedTuner


@pytest.fixture(scope="module")
def conv():
    """small_cnn's second convolution on the CPU (the widest instruction set, one
    thread): a space of 38,240 schedules."""
    cpu = targets.get("cpu").platforms(1)[0]
    tasks = cpu.tasks(pipeline.graph_for(pipeline.load_model("small_cnn"), cpu))
    task = [t for t in tasks if t.conv][1]
    assert task.pretrained() is not None
    return task, task.space()


def test_a_knob_step_reaches_the_schedules_one_knob_away(conv):
    task, space = conv
    grid = KnobGrid(task, space)
    start = np.array([0, len(space) // 2])
    found = grid.neighbours(start)
    assert len(found) and 0 not in grid.neighbours(np.array([0]))
    # Every schedule is its own point of the grid.
    assert len({tuple(point) for point in grid.coords.tolist()}) == len(space)
    for i in found:
        steps = np.abs(grid.coords[i] - grid.coords[start]).sum(axis=1)
        assert (steps == 1).any()          # one knob, one step, from one of the starts
    # Every schedule one step away is found: brute force over the space.
    want = [i for i in range(len(space))
            if (np.abs(grid.coords[i] - grid.coords[start]).sum(axis=1) == 1).any()]
    assert found.tolist() == want


def test_a_small_space_is_ranked_whole(conv):
    task, space = conv
    found = Candidates(task, task.pretrained(), space, pool=len(space))
    assert found.whole and found.index.tolist() == list(range(len(space)))
    before = found.prior.copy()
    found.climb(found.prior)                      # nothing to widen
    assert np.array_equal(found.prior, before)


def test_a_large_space_is_sampled_and_widened_around_the_best(conv):
    task, space = conv
    model = task.pretrained()
    found = Candidates(task, model, space, pool=64, seed=3)
    assert not found.whole and len(found.index) == 64
    assert Candidates(task, model, space, pool=64, seed=3).index.tolist() == \
        found.index.tolist()                      # seeded
    sampled_best = found.prior.min()
    found.climb(found.prior)
    assert len(found.index) > 64 and found.prior.min() <= sampled_best
    # Rows added by the climb are ranked as the model ranks them directly.
    fs = task.feature_set
    for r in (64, len(found.index) - 1):
        x = fs.vector(task.transfer_features(space[int(found.index[r])]))
        assert np.allclose(found.features[r], x)
        assert np.isclose(found.prior[r], model.predict(x[None])[0])
    rows = found.add([int(found.index[5]), 0, 1])
    assert rows[0] == 5 and found.add([0])[0] == rows[1]    # added once
    # From a sample of 5% of the space, the climb ends within a few percent of the
    # model's best over the whole space.
    whole = Candidates(task, model, space, pool=len(space))
    wider = Candidates(task, model, space, pool=len(space) // 20)
    wider.climb(wider.prior)
    assert 2 ** (wider.prior.min() - whole.prior.min()) < 1.05


def test_the_pretrained_tuner_searches_past_its_sample(conv):
    task, space = conv
    tuner = PretrainedTuner(task, space, pool=16)
    seen = set()
    for round_ in range(4):
        batch = tuner.propose(8)
        assert len(batch) == 8 and not set(batch) & seen
        seen |= set(batch)
        tuner.update(batch, [1000 + 10 * round_ + k for k in range(8)])
    # A schedule measured outside the candidates (the records, the default) joins them.
    outside = next(s for s in space if s not in seen and tuner.position(s) not in tuner.found.row)
    tuner.update([outside], [500])
    assert tuner.position(outside) in tuner.found.row
    assert tuner.predicted_cost(outside) > 0 and tuner.expected_best() > 0
    # Past the sample and its neighbourhoods, it goes on into the rest of the space.
    assert len(tuner.propose(len(space))) == len(space) - len(seen) - 1


def test_the_pretrained_chooser_ranks_a_sampled_space(conv):
    task, space = conv
    whole = pretrained_choice(task, pool=len(space))
    sampled = pretrained_choice(task, pool=len(space) // 20)
    assert whole in space and sampled in space
    model = task.pretrained()
    x = np.array([task.feature_set.vector(task.transfer_features(s)) for s in (whole, sampled)])
    whole_cost, sampled_cost = model.predict(x)
    assert whole_cost <= sampled_cost < whole_cost + np.log2(1.05)
