"""The tuner: search each conv2d's schedule space against cycle-accurate simulation.

* `vdla.compiler.tuner.task`: `TuneTask` (one workload on one config), its schedule
  space and records key; tasks from a model or a workload spec;
* `vdla.compiler.tuner.runner`: measuring schedules (`LocalRunner`: worker processes on
  the Verilator or the fast functional backend; `ReplayRunner`: from records);
* `vdla.compiler.tuner.search`: `ModelTuner` (gradient-boosted trees + simulated
  annealing), `RandomTuner`, `GridTuner`;
* `vdla.compiler.tuner.records`: `Records`, the SQLite measurement log;
* `vdla.compiler.tuner.tune`: `tune_task`, the loop, and `best_schedules` for
  `compile_model`.

``vdla tune`` and ``vdla run --records`` are the command-line faces of this package.
"""

from vdla.compiler.tuner.records import Record, Records
from vdla.compiler.tuner.runner import LocalRunner, MeasureInput, MeasureResult, ReplayRunner
from vdla.compiler.tuner.search import GridTuner, ModelTuner, RandomTuner, make_tuner
from vdla.compiler.tuner.task import TuneTask, task_from_workload, tasks_from_graph
from vdla.compiler.tuner.tune import TuneResult, best_schedules, tune_task

__all__ = ["GridTuner", "LocalRunner", "MeasureInput", "MeasureResult", "ModelTuner",
           "RandomTuner", "Record", "Records", "ReplayRunner", "TuneResult", "TuneTask",
           "best_schedules", "make_tuner", "task_from_workload", "tasks_from_graph",
           "tune_task"]
