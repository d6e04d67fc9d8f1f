"""One run of a compiled model, checked bit for bit against the integer reference: what
the accelerator target's model tests share."""

from __future__ import annotations

import numpy as np

from vdla.compiler import Graph, run_reference
from vdla.compiler.targets import compile_model


def run_bit_exact(graph: Graph, target, feed: dict):
    """`graph` compiled for `target` and run once on `feed`, every output equal to the
    reference's: (the compiled model, the run's result)."""
    compiled = compile_model(graph, target)
    with compiled.session() as session:
        result = session.run(feed)
    want = run_reference(graph, feed)
    for name in graph.outputs:
        np.testing.assert_array_equal(result.outputs[name], want[name])
    return compiled, result
