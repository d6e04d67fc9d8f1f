"""vdla.dse.search.eta: the sweep's estimate of the time left."""

import pytest

from vdla.dse.search import ETA_MIN_POINTS, ETA_POINTS_PER_WORKER, eta


def test_eta_says_nothing_until_enough_points_are_done():
    # One worker: the first few points (start-up, instant invalid ones) say little.
    assert all(eta(n, 50, 10.0, 1) is None for n in range(ETA_MIN_POINTS))
    assert eta(ETA_MIN_POINTS, 50, 10.0, 1) is not None
    # Eight workers: each has finished its first point before anything is said.
    enough = ETA_POINTS_PER_WORKER * 8
    assert eta(enough - 1, 50, 10.0, 8) is None and eta(enough, 50, 10.0, 8) is not None
    assert eta(20, 10, 0.0, 1) is None                     # no time measured yet
    assert eta(0, 0, 0.0, 2) == 0.0                        # nothing left


def test_eta_is_the_completed_points_rate():
    # 10 points in 20 s on one worker: 90 more take 180 s.
    assert eta(10, 90, 20.0, 1) == pytest.approx(180.0)
    # The same rate from two workers (each point 4 s of a worker, two at once).
    assert eta(10, 90, 20.0, 2) == pytest.approx(180.0)
    # Twice the points in the same time: half the time left.
    assert eta(20, 90, 20.0, 2) == pytest.approx(90.0)


def test_eta_counts_the_parallel_workers():
    # 4 workers finished 8 points in 10 s: a point takes 5 s of a worker. The last 1 to
    # 4 points run at once and take a whole point's time, not a quarter of it.
    for remaining in (1, 2, 4):
        assert eta(8, remaining, 10.0, 4) == pytest.approx(5.0)
    assert eta(8, 5, 10.0, 4) == pytest.approx(10.0)
