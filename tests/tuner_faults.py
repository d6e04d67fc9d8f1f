"""Measurement functions that fail on purpose, for the tuner's robustness tests.

They run in the tuner's worker processes (`LocalRunner(measure=...)`), which get them
pickled, so they live in a module the workers can import by name. Each fails on some
schedules, in the ways a real measurement can (the process dies, the lowering raises,
the simulator never returns), and measures every other schedule for real with the
task's own `measure`."""

import os
import time


def faulty_measure(task, schedule, context, *, data=None, backend=None):
    if (schedule.tile_h, schedule.tile_w) == (1, 1):
        os._exit(3)                       # the worker dies mid-measurement
    if (schedule.tile_h, schedule.tile_w) == (2, 2):
        raise RuntimeError("injected failure")
    if (schedule.tile_h, schedule.tile_w) == (1, 2) and schedule.h_nthread == 1:
        time.sleep(3600)                  # hangs: the wall-clock limit kills the worker
    return task.measure(schedule, context, data=data, backend=backend)


def dying_measure(task, schedule, context, *, data=None, backend=None):
    """`faulty_measure` without the hang: for runners with no wall-clock limit."""
    if (schedule.tile_h, schedule.tile_w) == (1, 1):
        os._exit(3)
    if (schedule.tile_h, schedule.tile_w) == (2, 2):
        raise RuntimeError("injected failure")
    return task.measure(schedule, context, data=data, backend=backend)


def hanging_measure(task, schedule, context, *, data=None, backend=None):
    """A measurement that never returns (for the tests of killed and interrupted
    runners)."""
    time.sleep(3600)
