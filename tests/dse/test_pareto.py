"""vdla.dse.pareto: the front against a brute-force definition of dominance."""

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from vdla.dse.pareto import OBJECTIVES, dominates, pareto_front


def point(key, valid=True, **objectives):
    return {"key": key, "valid": valid, "reason": None if valid else "too big",
            "objectives": objectives}


def keys(records):
    return [r["key"] for r in records]


def test_objectives_directions():
    assert OBJECTIVES["gemm_utilization"].direction == "maximize"
    assert {name for name, o in OBJECTIVES.items() if o.direction == "minimize"} == {
        "latency_ms", "accelerator_ms", "host_ms", "cycles", "lut", "ff", "dsp", "bram"}
    direction, unit, label = OBJECTIVES["latency_ms"]
    assert (direction, unit, label) == ("minimize", "ms", "latency")


def test_front_of_two_objectives():
    records = [point("a", latency_ms=10, lut=100),
               point("b", latency_ms=5, lut=200),
               point("c", latency_ms=12, lut=150),     # dominated by a
               point("d", latency_ms=5, lut=250),      # dominated by b (equal latency)
               point("e", latency_ms=1, lut=1000)]
    assert keys(pareto_front(records, ["latency_ms", "lut"])) == ["a", "b", "e"]
    assert keys(pareto_front(records, ["lut"])) == ["a"]


def test_utilization_is_maximized():
    records = [point("low", latency_ms=10, gemm_utilization=0.2),
               point("high", latency_ms=10, gemm_utilization=0.9),
               point("fast", latency_ms=5, gemm_utilization=0.1)]
    assert keys(pareto_front(records, ["latency_ms", "gemm_utilization"])) == ["high", "fast"]
    assert dominates(records[1], records[0], ["latency_ms", "gemm_utilization"])
    assert not dominates(records[0], records[1], ["latency_ms", "gemm_utilization"])


def test_invalid_and_missing_values_are_skipped():
    records = [point("bad", valid=False, latency_ms=None, lut=None),
               point("better but invalid", valid=False, latency_ms=1, lut=1),
               point("no lut", latency_ms=0.5, lut=None),
               point("nan", latency_ms=float("nan"), lut=1),
               point("ok", latency_ms=10, lut=100)]
    assert keys(pareto_front(records, ["latency_ms", "lut"])) == ["ok"]
    assert not dominates(records[1], records[4], ["latency_ms", "lut"])
    assert not dominates(records[4], records[0], ["latency_ms", "lut"])
    assert pareto_front(records[:2], ["latency_ms"]) == []
    assert pareto_front([], ["latency_ms"]) == []


def test_ties_are_all_kept_in_input_order():
    records = [point("x", latency_ms=3, lut=30), point("t1", latency_ms=2, lut=20),
               point("t2", latency_ms=2, lut=20), point("y", latency_ms=1, lut=90)]
    assert keys(pareto_front(records, ["latency_ms", "lut"])) == ["t1", "t2", "y"]
    assert not dominates(records[1], records[2], ["latency_ms", "lut"])


def test_unknown_objective_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown objective 'power'.*latency_ms.*bram"):
        pareto_front([point("a", latency_ms=1)], ["latency_ms", "power"])
    with pytest.raises(ValueError, match="unknown objective"):
        dominates(point("a"), point("b"), ["area"])
    with pytest.raises(ValueError, match="no objectives"):
        pareto_front([], [])
    with pytest.raises(TypeError, match="list of names"):
        pareto_front([], "latency_ms")


NAMES = ["latency_ms", "lut", "dsp", "gemm_utilization"]
value = st.one_of(st.none(), st.integers(0, 6))  # few values: many ties and dominances


@st.composite
def records(draw):
    n = draw(st.integers(0, 40))
    return [{"key": str(i), "valid": draw(st.booleans()) or draw(st.booleans()),
             "objectives": {name: draw(value) for name in NAMES}} for i in range(n)]


@settings(max_examples=150, deadline=None)
@given(records(), st.integers(1, len(NAMES)), st.randoms(use_true_random=False))
def test_front_matches_the_definition(points, k, rng):
    names = rng.sample(NAMES, k)
    front = pareto_front(points, names)
    usable = [r for r in points if r["valid"]
              and all(r["objectives"][n] is not None for n in names)]
    on_front = {r["key"] for r in front}
    # Exactly the usable records that nothing dominates, in their original order.
    assert keys(front) == [r["key"] for r in usable
                           if not any(dominates(o, r, names) for o in usable)]
    for f, r in itertools.product(front, usable):
        assert not dominates(r, f, names)
    for r in usable:
        if r["key"] not in on_front:
            assert any(dominates(f, r, names) for f in front)
