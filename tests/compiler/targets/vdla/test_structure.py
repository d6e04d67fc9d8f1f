"""The vdla target's layout: one module per op family, so lowering one convolution reads
in its family's modules and the shared kernel, `common`, alone. (No function of the
compiler is too long to read: `tests/test_imports.py`.)"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import vdla
import vdla.compiler.targets.vdla as vdla_target
from gemm_graphs import conv_graph
from vdla.compiler.frontend.workloads import RESNET18, workload_graph
from vdla.compiler.targets.vdla import choose_conv2d, lower_conv2d

FOLDER = Path(vdla_target.__file__).resolve().parent
#: Modules of the target's folder that lowering one convolution may enter: its family's
#: (the layer and timing model, the emitter, what grouped convolutions and packed first
#: layers add, the depthwise window, the sequences a dense layer reads) and the shared
#: kernel.
CONV_FAMILY = {"conv_layer.py", "conv_schedule.py", "timing.py", "timing_pairs.py", "conv.py",
               "grouped.py", "tap_pack.py", "dw_window.py", "common.py", "requant.py",
               "sequence.py"}


def modules_entered(fn, *args) -> set[str]:
    """The modules of the target's folder (paths relative to it) whose code runs while
    `fn(*args)` runs: every Python function called, traced with `sys.settrace` (whose
    global trace function sees each call; returning None skips tracing its lines)."""
    entered, seen = set(), {}

    def trace(frame, event, arg):
        name = frame.f_code.co_filename
        if name not in seen:
            path = Path(name)
            seen[name] = (str(path.relative_to(FOLDER)) if path.is_absolute()
                          and path.is_relative_to(FOLDER) else None)
        if seen[name]:
            entered.add(seen[name])
        return None

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        fn(*args)
    finally:
        sys.settrace(previous)
    return entered


def resnet18_conv():
    graph, _ = workload_graph(RESNET18["C11"])
    return graph.node("conv"), graph


def residual_conv():
    graph, _ = conv_graph(np.random.default_rng(0), residual=True)
    return graph.node("conv"), graph


@pytest.mark.parametrize("config", [vdla.HardwareConfig(), vdla.HardwareConfig(block_out=32)],
                         ids=["default", "block_out32"])
@pytest.mark.parametrize("make", [resnet18_conv, residual_conv], ids=["resnet18_C11", "residual"])
def test_lowering_a_conv_stays_in_its_family(make, config, tmp_path, monkeypatch):
    node, graph = make()
    # The default chooser and its timing model run too: neither the in-process cache nor
    # the one on disk answers.
    monkeypatch.setenv("VDLA_CACHE", str(tmp_path))
    choose_conv2d.cache_clear()
    entered = modules_entered(lower_conv2d, node, graph, config)
    assert entered, "the tracer saw no module of the target"
    assert entered <= CONV_FAMILY, (
        f"lowering one conv walks {', '.join(sorted(entered - CONV_FAMILY))} besides its "
        f"op family's modules and the shared kernel ({', '.join(sorted(CONV_FAMILY))})")


def test_the_tracer_sees_every_module_entered():
    """The walk test can fail: a call that goes through more modules is counted."""
    node, graph = residual_conv()

    def wider():
        lower_conv2d(node, graph, vdla.HardwareConfig())
        vdla_target.pool.pool2d_layer   # an attribute: no call, not counted
        vdla_target.support.describe(node, graph, vdla.HardwareConfig())
        vdla_target.placement.resident(vdla.HardwareConfig())

    entered = modules_entered(wider)
    assert {"support.py", "placement.py"} <= entered
    assert not entered <= CONV_FAMILY
