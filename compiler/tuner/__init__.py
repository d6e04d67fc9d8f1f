"""The tuner: search any target's schedule spaces against real measurements.

* `vdla.compiler.tuner.task`: `TuneTask`, the interface a target's tasks implement (space,
  default, estimate, features, measure, to and from a plain dict);
  a model's tasks come from its target (`Target.tasks(graph)`);
* `vdla.compiler.tuner.runner`: measuring schedules (`LocalRunner`: worker processes;
  `ExecutorRunner`: the executors of `vdla.execute`, Ray included; `InProcessRunner`:
  this process; `ReplayRunner`: from records);
* `vdla.compiler.tuner.search`: `ModelTuner` (gradient-boosted trees + simulated
  annealing), `RandomTuner`, `GridTuner`;
* `vdla.compiler.tuner.records`: `Records`, the SQLite measurement log, keyed by target,
  workload, platform and backend;
* `vdla.compiler.tuner.tune`: `tune_task`, the loop, and `best_schedules` for
  `compile_model`.

Nothing here names a target's schedule classes. ``vdla tune`` and ``vdla run --records``
are the command-line faces of this package.
"""

from vdla.compiler.tuner.measure import MeasureInput, MeasureResult
from vdla.compiler.tuner.records import Record, Records
from vdla.compiler.tuner.runner import (ExecutorRunner, InProcessRunner, LocalRunner,
                                        ReplayRunner)
from vdla.compiler.tuner.search import GridTuner, ModelTuner, RandomTuner, make_tuner
from vdla.compiler.tuner.task import TuneTask
from vdla.compiler.tuner.tune import TuneResult, best_schedules, tune_task

__all__ = ["ExecutorRunner", "GridTuner", "InProcessRunner", "LocalRunner", "MeasureInput",
           "MeasureResult", "ModelTuner", "RandomTuner", "Record", "Records", "ReplayRunner",
           "TuneResult", "TuneTask", "best_schedules", "make_tuner", "tune_task"]
