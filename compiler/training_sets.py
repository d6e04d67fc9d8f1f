"""Training-set planning: which (platform, workload) tasks a training set measures, and
a measured set's rows again from its manifest.

    platforms = targets.get("vdla").platforms(10, seed=0)      # one target per config
    plan = dataset_plan(platforms[:8], held_out=platforms[8:], models=("resnet18",),
                        shapes=random_shapes(16, seed=0), per_task=12)
    rows, manifest = training_set("bench/datasets/vdla_v1.db.manifest.json")
    unseen_platforms(manifest)       # platforms a set never measured, to test on

`dataset_plan` makes the `DatasetPlan` that `vdla.compiler.tuner.dataset.generate`
measures (``vdla dataset``); `plan_from_manifest` makes it again from what a manifest
says, and `training_set` joins that plan's tasks to the set's records as rows
(`vdla.compiler.tuner.rows.training_rows`) for a cost model to learn from
(``scripts/train_cost_model.py``, ``bench/tuner_transfer.py``).

Why this is not under `vdla.compiler.tuner`: a plan loads the models it names and
quantizes them as a run does (`vdla.compiler.pipeline.graph_for`), and a manifest names
its target, found in the registry (`vdla.compiler.targets.registry`); the tuner sees
targets only through the task interface (tests/test_imports.py), so planning sits one
layer up, beside the pipeline, and the tuner keeps what measures and learns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from vdla.compiler.pipeline import graph_for, load_model
from vdla.compiler.targets import registry
from vdla.compiler.targets.base import Target
from vdla.compiler.tuner.dataset import DatasetPlan, local_records
from vdla.compiler.tuner.records import Records
from vdla.compiler.tuner.rows import Rows, training_rows
from vdla.compiler.tuner.workload_tasks import reduced_tasks, tasks_from_workload

__all__ = ["dataset_plan", "fewshot_set", "plan_from_manifest", "training_set",
           "unseen_platforms"]


def dataset_plan(platforms: Sequence[Target], *, held_out: Sequence[Target] = (),
                 models: Sequence[str] = (), shapes: Sequence[str] = (), per_task: int = 8,
                 seed: int = 0, held_out_models: Sequence[str] = (), picked: int = 0,
                 precision: str = "int8", rounds: int = 1, side_by_side: int = 0,
                 log: Callable[[str], None] = lambda message: None) -> DatasetPlan:
    """The `DatasetPlan` of a training set (`vdla.compiler.tuner.dataset`): the tasks of
    every tunable op of `models` and of every workload of `shapes` (as
    `tasks_from_workload` takes them) on each of `platforms` (targets, one a platform:
    `Target.platforms`); `held_out` platforms are named in the manifest and not measured.
    The models and the shapes run at `precision` (`graph_for`, `tasks_from_workload`).
    Every schedule is measured `rounds` times in the end, then each task's schedules
    `side_by_side` rounds in turn (`DatasetPlan`).
    A shape a platform cannot tune is left out, and `log` says so (once for each reason,
    the platforms it holds for counted)."""
    left_out: dict[str, int] = {}

    def tasks_of(target) -> list:
        tasks = []
        for name in models:
            tasks += target.tasks(graph_for(load_model(name), target, precision=precision))
        for spec in shapes:
            try:
                tasks += tasks_from_workload(spec, target, precision=precision)
            except ValueError as exc:
                reason = f"left out {spec}: {exc}"
                left_out[reason] = left_out.get(reason, 0) + 1
        return tasks

    measured = [(target, tasks_of(target)) for target in platforms]
    if platforms and not any(tasks for _, tasks in measured):
        raise ValueError(f"target {platforms[0].name!r} has no tunable {precision} op among "
                         f"the models and shapes given")
    # A held-out platform's name is its tasks' (`TuneTask.platform`), so it takes a task.
    kept_out = [(target, tasks_of(target)[:1]) for target in held_out]
    for reason, platforms_count in left_out.items():
        log(f"{reason} ({platforms_count} platform{'s' if platforms_count > 1 else ''})")
    return DatasetPlan(
        tasks=[task for _, tasks in measured for task in tasks],
        platforms={tasks[0].platform: target.platform_params()
                   for target, tasks in measured + kept_out if tasks},
        models=tuple(models), shapes=tuple(shapes), per_task=per_task, seed=seed,
        picked=picked, held_out_models=tuple(held_out_models), precision=precision,
        rounds=rounds, side_by_side=side_by_side,
        held_out_platforms=tuple(tasks[0].platform for _, tasks in kept_out if tasks))


def plan_from_manifest(manifest: Mapping[str, Any], *,
                       log: Callable[[str], None] = lambda message: None
                       ) -> tuple[DatasetPlan, list[Target]]:
    """The plan a training set's manifest (`Manifest`, as read from its JSON) was
    measured with, and the targets of its held-out platforms: its tasks again, for
    `vdla.compiler.tuner.rows.training_rows` to join with its records.

    Made once per process for each manifest (`_PLANS`, keyed on its JSON): making the
    tasks builds every workload's graph on every platform, about 6 s for a CPU set, and
    a training run asks for each manifest's plan more than once. `log` hears the first
    making only."""
    key = json.dumps(manifest, sort_keys=True)
    if key not in _PLANS:
        _PLANS[key] = _make_plan(manifest, log)
    return _PLANS[key]


#: `plan_from_manifest`'s plans made in this process, by manifest JSON.
_PLANS: dict[str, tuple[DatasetPlan, list[Target]]] = {}


def _make_plan(manifest: Mapping[str, Any], log: Callable[[str], None]
               ) -> tuple[DatasetPlan, list[Target]]:
    cls = type(registry.get(manifest["target"]))
    held = set(manifest["held_out"]["platforms"])
    platforms = {name: cls.from_platform(params)
                 for name, params in manifest["platforms"].items()}
    plan = dataset_plan([t for name, t in platforms.items() if name not in held],
                        held_out=[t for name, t in platforms.items() if name in held],
                        models=manifest["models"], shapes=manifest["shapes"],
                        per_task=manifest["per_task"], seed=manifest["seed"],
                        picked=manifest.get("picked", 0),
                        precision=manifest.get("precision", "int8"),
                        rounds=manifest.get("rounds", 1),
                        side_by_side=manifest.get("side_by_side", 0),
                        held_out_models=manifest["held_out"]["models"], log=log)
    return plan, [t for name, t in platforms.items() if name in held]


def training_set(manifest_path: str | Path, *, feature_set: str | None = None
                 ) -> tuple[Rows, dict]:
    """The rows (`vdla.compiler.tuner.rows.Rows`) of the training set whose manifest
    is at `manifest_path`, and the manifest. Its records file is the manifest's
    ``records`` path, relative to the working folder or, failing that, a file of that
    name beside the manifest, either one possibly compressed (`local_records`).
    `feature_set` (a name) keeps the tasks of that feature set only, for a set whose
    tasks have several (the CPU target's convolutions and dense layers). ValueError
    naming the file that cannot be read."""
    path = Path(manifest_path)
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"manifest {path}: {exc}") from None
    records = Path(manifest["records"])
    try:
        records = local_records(records if records.is_absolute() or records.is_file()
                                or Path(f"{records}.xz").is_file()
                                else path.parent / records.name)
    except FileNotFoundError as exc:
        raise ValueError(f"manifest {path}: its records {manifest['records']!r} are neither "
                         f"there nor beside it ({exc})") from None
    plan, _ = plan_from_manifest(manifest)
    tasks = [t for t in plan.tasks if feature_set is None
             or getattr(t.feature_set, "name", None) == feature_set]
    if not tasks:
        raise ValueError(f"manifest {path}: no task of feature set {feature_set!r}")
    with Records(records) as db:
        return training_rows(tasks, db, manifest["backend"]), manifest


def unseen_platforms(manifest: Mapping[str, Any], more: int = 2) -> list[Target]:
    """Platforms of the manifest's target that its training set never trained on: the
    target's default platform, the set's held-out platforms, and the next `more` of the
    set's own seeded draw (`Target.platforms`, the draw ``vdla dataset`` made the set's
    platforms with, `more` further). The few-shot and zero-shot figures test on them
    (``bench/tuner_transfer.py``, ``bench/datasets/make_vdla_fewshot_v1.py``).
    ValueError when one of them is a platform the set trained on."""
    default = registry.get(manifest["target"])

    def key(params: Mapping[str, Any]) -> str:
        # Read back as the target reads a platform, so that a field added to the
        # target's parameters since the set was measured takes its default on both
        # sides; the tools' versions are when it was measured, not which platform it is.
        params = type(default).from_platform(params).platform_params()
        return json.dumps({k: v for k, v in params.items() if k != "tools"}, sort_keys=True)

    named = {key(params): name for name, params in manifest["platforms"].items()}
    drawn = default.platforms(len(named) + more, seed=manifest["seed"])
    by_name = {named.get(key(t.platform_params())): t for t in drawn}
    held = manifest["held_out"]["platforms"]
    picked = [default] + [by_name[name] for name in held]
    picked += [t for t in drawn if key(t.platform_params()) not in named][:more]
    trained = set(named.values()) - set(held)
    clash = sorted(named[k] for k in {key(t.platform_params()) for t in picked}
                   if named.get(k) in trained)
    if clash:
        raise ValueError(f"platforms {clash} were trained on: they are not unseen")
    return picked


def fewshot_set(manifest_path: str | Path) -> list[tuple[Any, list]]:
    """The accelerator's few-shot set for the training set whose manifest is at
    `manifest_path` (``bench/datasets/vdla_v1.db.manifest.json``): each platform it never
    trained on (`unseen_platforms`) as (its config, ResNet-18's reduced layers ``C5/r``
    on it, `reduced_tasks`). ``bench/datasets/make_vdla_fewshot_v1.py`` measured it; the
    transfer and timing-model figures read it back."""
    training = json.loads(Path(manifest_path).read_text())
    return [(target.config, reduced_tasks(registry.get("vdla", config=target.config)))
            for target in unseen_platforms(training)]
