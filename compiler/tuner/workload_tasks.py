"""The tuner's tasks of a named workload: one layer tuned on its own, without its model.

    [task] = tasks_from_workload("7,7,32,32,3,1,1", target)   # a synthetic convolution
    tasks_from_workload("C8", target)                          # ResNet-18's C8 layers
    reduced_tasks(target)                                      # C2/r ... C11/r

``vdla tune --layer``, the training sets (`vdla.compiler.training_sets`: their random
shapes) and the tuning benchmarks name workloads this way. A workload's graph comes
from the front half (`vdla.compiler.frontend.workloads`) and its tasks from the target
(`Target.tasks`), so this module sees the target only through that interface.
"""

from __future__ import annotations

import math

from vdla.compiler.frontend.workloads import (RESNET18, conv_matches, float_workload_graph,
                                              model_graph, parse_workload, workload_graph)

__all__ = ["REDUCED_LAYERS", "RESIDUAL_SUFFIX", "reduced_spec", "reduced_tasks",
           "tasks_from_workload"]

#: Appended to a named workload's task whose nodes add a residual (``C8+residual``).
RESIDUAL_SUFFIX = "+residual"
#: ResNet-18's layers that the tuning benchmarks shrink (`reduced_spec`): small enough
#: that a config's whole schedule space can be measured (``bench/tuner.py``, the
#: few-shot set ``bench/datasets/make_vdla_fewshot_v1.py``).
REDUCED_LAYERS = tuple(f"C{i}" for i in range(2, 12))


def reduced_spec(name: str) -> str:
    """ResNet-18's layer `name` (``C5``) with the image 4x smaller on each side (rounded
    up) and half the channels, its kernel, padding and stride kept, as a workload
    (``H,W,Cin,Cout,k,pad,stride``): ``C5/r`` is ``7,7,64,64,3,1,1``. KeyError for a name
    that is not one of ResNet-18's layers."""
    w = RESNET18[name]
    return (f"{math.ceil(w.h / 4)},{math.ceil(w.w / 4)},{w.cin // 2},{w.cout // 2},"
            f"{w.k},{w.pad},{w.stride}")


def reduced_tasks(target, layers=REDUCED_LAYERS) -> list:
    """The task of each of `layers` reduced (`reduced_spec`) on `target`, named
    ``C5/r``."""
    return [tasks_from_workload(reduced_spec(name), target)[0].with_name(f"{name}/r")
            for name in layers]


def tasks_from_workload(spec: str, target, *, precision: str = "int8") -> list:
    """The tasks (`TuneTask`) of a workload on `target` (a
    `vdla.compiler.targets.Target`), named after it.

    spec : a ResNet-18 workload name (``C5``, any case): the target's tasks of
        ResNet-18's own layers of that shape, epilogue included
        (`vdla.compiler.frontend.workloads.model_graph`, quantized for the target's first
        requantization mode, as ``vdla run`` does). One name may give several tasks: a
        task whose nodes all add a residual is named with `RESIDUAL_SUFFIX`
        (``C8+residual``), and a further task of the same name gets ``#2``, ``#3``.
        Or ``H,W,Cin,Cout,k,pad,stride[,groups]``: the one task of the synthetic
        one-node graph `workload_graph` builds (bias, per-tensor requantization shift,
        ReLU clamp), named `spec`; its records serve only a model layer with that same
        epilogue.
    target : the target whose tasks these are
    precision : ``int8``, or ``float32`` for a numbered workload on a target that runs
        floats (`float_workload_graph`: a float convolution with a bias and a ReLU)
    Raises ValueError naming what is wrong, or when the target cannot tune the workload."""
    name, workload = parse_workload(spec)
    if precision not in ("int8", "float32"):
        raise ValueError(f"a workload's precision is int8 or float32, not {precision!r}")
    if precision != "int8":
        if name in RESNET18:
            raise ValueError(f"workload {name} is ResNet-18's int8 layer; a float32 workload "
                             "is H,W,Cin,Cout,k,pad,stride[,groups]")
        target.check_precision(precision)
    if name not in RESNET18:
        graph = workload_graph(workload)[0] if precision == "int8" else \
            float_workload_graph(workload)
        tasks = target.tasks(graph)
        if len(tasks) != 1:
            why = "; ".join(s.reason for s in (target.supports(n, graph) for n in graph.nodes())
                            if not s.ok) or "it does not tune that op"
            raise ValueError(f"target {target.name!r} has no tunable task for workload "
                             f"{spec!r}: {why}")
        return [tasks[0].with_name(name)]
    graph = model_graph(target.requant_modes[0])
    found = []
    for task in target.tasks(graph):
        nodes = [graph.node(n) for n in task.nodes if conv_matches(graph.node(n), graph,
                                                                   workload)]
        if not nodes:
            continue
        # The suffix tells the epilogues apart, which is what makes these separate tasks.
        base = name + (RESIDUAL_SUFFIX if all(n.input(3) for n in nodes) else "")
        taken = sum(t.name == base or t.name.startswith(base + "#") for t in found)
        found.append(task.with_name(base if not taken else f"{base}#{taken + 1}"))
    if not found:
        raise ValueError(f"target {target.name!r} has no tunable task for workload {name} "
                         f"({workload}): it does not run that layer of ResNet-18")
    return found
