"""Targets: one front half, many back halves behind one interface.

* `base`: the interface a target implements (`Target`: supports, compile, open a
  session, tunable tasks) and what it reports (`OpStats`);
* `model`: `compile_model(graph, target)`, which gives the target the nodes it supports
  and the host the rest, and the `ModelSession` that runs the result;
* `registry`: targets by name (`get("vdla", config=...)`, `register`, `names`);
* `options`: what a target tells the command line about itself (its options, columns);
* one folder per target: `vdla` (the accelerator), `host` (the numpy reference kernels,
  every other target's fallback: `HOST`), `cpu`, `gpu`.

Nothing outside a target's folder names its classes: the pipeline, the CLI and the
tuner go through this interface.
"""

from vdla.compiler.targets.base import (CompiledOp, OpRun, OpStats, Support, Target,
                                        TargetSession)
from vdla.compiler.targets.host import HOST
from vdla.compiler.targets.model import CompiledModel, ModelSession, RunResult, compile_model
from vdla.compiler.targets.options import EstimateColumn, ExtraColumn, TargetOption
from vdla.compiler.targets.registry import factory, get, names, register, unregister

__all__ = ["HOST", "CompiledModel", "CompiledOp", "EstimateColumn", "ExtraColumn",
           "TargetOption", "factory", "ModelSession", "OpRun", "OpStats", "RunResult",
           "Support", "Target", "TargetSession", "compile_model", "get", "names", "register",
           "unregister"]
