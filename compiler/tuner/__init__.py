"""The tuner: search any target's schedule spaces against real measurements.

* `vdla.compiler.tuner.task`: `TuneTask`, the interface a target's tasks implement (space,
  default, estimate, features, measure, to and from a plain dict);
  a model's tasks come from its target (`Target.tasks(graph)`);
* `vdla.compiler.tuner.runner`: measuring schedules (`LocalRunner`: worker processes;
  `ExecutorRunner`: the executors of `vdla.execute`, Ray included; `InProcessRunner`:
  this process; `ReplayRunner`: from records);
* `vdla.compiler.tuner.search`: `PretrainedTuner` (the target's pretrained cost model,
  learning online), `ModelTuner` (gradient-boosted trees from scratch + simulated
  annealing), `RandomTuner`, `GridTuner`;
* `vdla.compiler.tuner.records`: `Records`, the SQLite measurement log, keyed by target,
  workload, platform and backend;
* `vdla.compiler.tuner.tune`: `tune_task`, the loop, and `best_schedules` for
  `compile_model`;
* `vdla.compiler.tuner.scheduler`: `tune_tasks`, one budget spent on a model's tasks
  where the model's cost falls most;
* `vdla.compiler.tuner.workload_tasks`: `tasks_from_workload`, the tasks of a named
  workload (``C8``, ``H,W,Cin,Cout,k,pad,stride``) for ``vdla tune --layer``, the
  training sets and the benches;
* the learned tuner (docs/architecture.md draws it): `dataset` measures training sets
  (``vdla dataset``; their plans: `vdla.compiler.training_sets`, one layer up since a
  plan loads models and names targets); `features` (each target's `FeatureSet`:
  the cost model's inputs); `rows` (a training set's rows, and the ranking figures that
  judge a model); `cost_model` (`CostModel`, trained across tasks and platforms, shipped
  per target as its pretrained model); `candidates` (the schedules a pretrained model
  ranks: a whole space, or a large one's sample widened around the model's best);
  `pretrained_chooser` (``vdla run --chooser pretrained``: the model's picks, measuring
  nothing), beside `search.PretrainedTuner` (``vdla tune --tuner pretrained``: the same
  model, corrected by measurements, its own task's and, through `correction`'s
  `SharedCorrection`, the other tasks' of the same run).

Nothing here names a target's schedule classes. ``vdla tune`` and ``vdla run --records``
are the command-line faces of this package.
"""

from vdla.compiler.tuner.measure import MeasureInput, MeasureResult
from vdla.compiler.tuner.records import Record, Records
from vdla.compiler.tuner.runner import (ExecutorRunner, InProcessRunner, LocalRunner,
                                        ReplayRunner)
from vdla.compiler.tuner.scheduler import ModelTuning, tune_tasks
from vdla.compiler.tuner.search import (GridTuner, ModelTuner, PretrainedTuner, RandomTuner,
                                        make_tuner)
from vdla.compiler.tuner.task import TuneTask
from vdla.compiler.tuner.tune import TuneResult, best_schedules, tune_task

__all__ = ["ExecutorRunner", "GridTuner", "InProcessRunner", "LocalRunner", "MeasureInput",
           "MeasureResult", "ModelTuner", "ModelTuning", "PretrainedTuner", "RandomTuner",
           "Record", "Records", "ReplayRunner", "TuneResult", "TuneTask", "best_schedules",
           "make_tuner", "tune_task", "tune_tasks"]
