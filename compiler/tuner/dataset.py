"""Training sets for cost models that learn across layers and platforms: measured
schedules of many workloads on many platforms, kept in a records file with a manifest.

    platforms = targets.get("vdla").platforms(10, seed=0)   # one target per config
    plan = training_sets.dataset_plan(platforms[:8], held_out=platforms[8:],
                                      models=("resnet18", "mobilenet_v1"),
                                      shapes=random_shapes(16, seed=0), per_task=12)
    with Records("train.db") as db:
        manifest = generate(plan, db, backend="verilator", jobs=2)   # or ray="auto"

Each (platform, workload) task gets `tune_task` with the random tuner: its default
schedule and ``per_task - 1`` others drawn at random from its space, so the set covers
the space rather than only what a tuner would pick; the records resume a stopped run as
they resume tuning. A task whose space is empty on a platform (its tiles cannot fit the
buffers) is skipped and named in the manifest. The tasks are measured on the executors
of `vdla.execute` (local processes or a Ray cluster), one task an evaluation, and only
this process writes the records. The manifest (`Manifest`, JSON) gives the counts by
platform and workload, the platforms' parameters (with the versions of the tools that
measure them), what was held out, vdla's version and the time the generation took, so
a trained model can say what it learned from. The plan itself (which tasks, from which
models and shapes) is made by `vdla.compiler.training_sets.dataset_plan`.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import lzma
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import vdla
from vdla._buildcache import cache_root
from vdla._fileio import atomic_write
from vdla.compiler.frontend.workloads import ConvWorkload, DenseWorkload, MatmulWorkload
from vdla.compiler.tuner.measure import MeasureInput, one_line
from vdla.compiler.tuner.records import OK, Record, Records
from vdla.compiler.tuner.runner import InProcessRunner, prepare_tasks
from vdla.compiler.tuner.tune import tune_task
from vdla.execute import EvaluationError, Executor, make_executor

__all__ = ["BLOCKED_TOKENS", "DatasetPlan", "HEADS", "MAX_DRAWN_MACS", "Manifest",
           "PRODUCT_ROWS", "SIDE_BY_SIDE", "TOKENS", "generate", "local_records",
           "measure_again", "measure_side_by_side", "measuring_executor", "random_shapes"]

#: The planes (output side) and channels `random_shapes` draws from: image models'
#: layers, and with ``small=True`` layers shrunk as tuning benchmarks shrink them (a
#: quarter of the side, half the channels: ``bench/tuner.py``'s reduced layers), where a
#: schedule's fixed costs (loads before the first GEMM, the last store) weigh most.
SIDES = {False: (7, 14, 28, 56), True: (2, 4, 7, 14)}
CHANNELS = {False: (16, 256), True: (16, 128)}


#: Rows of a transformer's tokens `random_shapes` draws from (``tokens`` and
#: ``matmul``): a sentence of 16 to 256 tokens, ViT's 50 and 197, and for the products
#: also one to four rows (a decoder's step); and the products' batches (heads).
TOKENS = (16, 32, 50, 64, 128, 197, 256)
PRODUCT_ROWS = (1, 4) + TOKENS
HEADS = (1, 2, 4, 8, 12)
#: The depths and widths of the products with b transposed that `random_shapes` draws
#: (``matmul_t``): the accelerator reads b's rows as weight blocks, so both are whole
#: blocks (208 is ViT's 197 tokens padded to blocks of 16; a config of 32-lane blocks
#: leaves out what is not whole blocks of 32); one product a workload, as the
#: accelerator runs each head's.
BLOCKED_TOKENS = (16, 32, 64, 128, 208, 256)
#: The most multiply-adds a drawn dense layer of many rows or product has: larger ones
#: take seconds a schedule to measure on portable C, and the ranking is learned from
#: the shapes' ratios (a held-out BERT-base layer has 302 million).
MAX_DRAWN_MACS = {"tokens": 160_000_000, "matmul": 40_000_000}


def random_shapes(count: int, *, seed: int = 0, small: bool = False,
                  grouped: bool = False, dense: bool = False, tokens: bool = False,
                  matmul: bool = False, matmul_t: bool = False) -> list[str]:
    """`count` convolution workloads (``H,W,Cin,Cout,k,pad,stride[,groups]``) drawn at
    random from the sizes of image models' layers: planes of 7 to 56, 16 to 256 channels
    (with `small`: planes of 2 to 14, 16 to 128 channels), 1x1 and 3x3 kernels (same
    padding), strides 1 and 2. With `grouped`, grouped ones instead, from their own
    random stream (the plain draws stay what they were): half depthwise (one channel a
    group, 3x3 kernels, as MobileNet's), half with 2, 4 or 8 groups of at least 16
    channels (as ResNeXt's). With `dense`, fully connected layers instead
    (``dense:IN,OUT[,BATCH]``, their own stream too): 64 to 4,096 input features in steps of
    64 (a classifier's pooled features), 10 to 1,024 outputs, batch 1, 4 or 8. With
    `tokens`, dense layers of many rows (a transformer's linear layers over its
    `TOKENS`): 64 to 3,072 features each way in steps of 64. With `matmul`, batched
    products of two activations (``matmul:M,K,N,BATCH``: attention's scores and
    values): `HEADS` products of `PRODUCT_ROWS` rows, as deep and as wide as `TOKENS`.
    With `matmul_t`, single products with b transposed (``matmul_t:M,K,N``): `PRODUCT_ROWS`
    rows, as deep and as wide as `BLOCKED_TOKENS`. Each its own stream, at most
    `MAX_DRAWN_MACS`."""
    if dense:
        return _random_dense(count, seed)
    if matmul_t:
        return _random_products_t(count, seed)
    if tokens or matmul:
        return _random_gemm(count, seed, matmul)
    rng = np.random.default_rng([seed, 1] if grouped else seed)
    low, high = CHANNELS[small]
    shapes = []
    while len(shapes) < count:
        side = int(rng.choice(SIDES[small]))
        cin, cout = (int(16 * rng.integers(low // 16, high // 16 + 1)) for _ in range(2))
        k = int(rng.choice([1, 3]))
        stride = int(rng.choice([1, 2])) if side > 7 or (small and side > 2) else 1
        groups = 1
        if grouped and len(shapes) % 2 == 0:        # depthwise
            cout, k, groups = cin, 3, cin
        elif grouped:
            groups = int(rng.choice([2, 4, 8]))
            cin, cout = (max(c // (16 * groups), 1) * 16 * groups for c in (cin, cout))
        spec = ConvWorkload(side, side, cin, cout, k, k // 2, stride, groups).spec()
        if spec not in shapes:
            shapes.append(spec)
    return shapes


def _random_dense(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng([seed, 2])
    shapes: list[str] = []
    while len(shapes) < count:
        spec = DenseWorkload(int(64 * rng.integers(1, 65)), int(rng.integers(10, 1025)),
                             int(rng.choice([1, 1, 4, 8]))).spec()
        if spec not in shapes:
            shapes.append(spec)
    return shapes


def _random_gemm(count: int, seed: int, matmul: bool) -> list[str]:
    rng = np.random.default_rng([seed, 4 if matmul else 3])
    shapes: list[str] = []
    while len(shapes) < count:
        if matmul:
            w = MatmulWorkload(int(rng.choice(PRODUCT_ROWS)), int(rng.choice(TOKENS)),
                               int(rng.choice(TOKENS)), int(rng.choice(HEADS)))
        else:
            w = DenseWorkload(int(64 * rng.integers(1, 49)), int(64 * rng.integers(1, 49)),
                              int(rng.choice(TOKENS)))
        if w.macs <= MAX_DRAWN_MACS["matmul" if matmul else "tokens"] \
                and w.spec() not in shapes:
            shapes.append(w.spec())
    return shapes


def _random_products_t(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng([seed, 5])
    shapes: list[str] = []
    while len(shapes) < count:
        w = MatmulWorkload(int(rng.choice(PRODUCT_ROWS)), int(rng.choice(BLOCKED_TOKENS)),
                           int(rng.choice(BLOCKED_TOKENS)), transpose_b=True)
        if w.macs <= MAX_DRAWN_MACS["matmul"] and w.spec() not in shapes:
            shapes.append(w.spec())
    return shapes


@dataclasses.dataclass(frozen=True)
class DatasetPlan:
    """What a training set measures (`vdla.compiler.training_sets.dataset_plan` makes
    one from a target's platforms, models and shapes).

    tasks : every (platform, workload) task to measure (`TuneTask`)
    platforms : each platform's parameters by its name (`TuneTask.platform`; the held-out
        ones too), for the manifest
    models, shapes : what the tasks came from, for the manifest
    per_task : schedules measured per task, the default among them
    picked : schedules measured per task after those, chosen by the target's pretrained
        model (`PretrainedTuner`: its best-ranked, corrected by the task's measurements):
        where the model is wrong at the top of its ranking, which random schedules
        rarely show
    seed : seeds each task's random draw
    held_out_models, held_out_platforms : names kept out of the set (not measured),
        recorded in the manifest for the figures that test on them
    precision : what the models' layers compute (``int8``, ``float32``)
    rounds : how many times every schedule is measured in the end, each round a pass over
        the whole set after the last (wall times: a schedule's measurements minutes
        apart, under different noise; the rows take their median, and two rounds show
        how far two measurements of one schedule agree)
    side_by_side : then, for a target measured by wall time (`TuneTask.noisy`), every
        task's schedules measured again in turn, in this process, this many rounds
        (`TuneTask.side_by_side`: on the CPU, slots of a few milliseconds), each round's
        figure a row of the records: schedules compared under the same state of the
        machine, where whole measurements minutes apart compare the machine's moods
        (``docs/tuner.md``); 0 for none
    batch : schedules measured at once
    """

    tasks: Sequence[Any]
    platforms: Mapping[str, dict]
    models: Sequence[str] = ()
    shapes: Sequence[str] = ()
    per_task: int = 8
    seed: int = 0
    picked: int = 0
    held_out_models: Sequence[str] = ()
    held_out_platforms: Sequence[str] = ()
    precision: str = "int8"
    rounds: int = 1
    side_by_side: int = 0
    batch: int = 8

    def __post_init__(self):
        if isinstance(self.per_task, bool) or not isinstance(self.per_task, int) \
                or self.per_task < 1:
            raise ValueError(f"per_task must be a positive integer, not {self.per_task!r}")
        if isinstance(self.picked, bool) or not isinstance(self.picked, int) \
                or self.picked < 0:
            raise ValueError(f"picked must be a non-negative integer, not {self.picked!r}")
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) \
                or self.rounds < 1:
            raise ValueError(f"rounds must be a positive integer, not {self.rounds!r}")
        if isinstance(self.side_by_side, bool) or not isinstance(self.side_by_side, int) \
                or self.side_by_side < 0:
            raise ValueError(f"side_by_side must be a non-negative integer, not "
                             f"{self.side_by_side!r}")
        steady = sorted({t.target for t in self.tasks if not t.noisy})
        if self.side_by_side and steady:
            raise ValueError(f"side_by_side compares schedules measured by wall time; target "
                             f"{steady[0]!r} measures the same cost every time")
        clash = sorted(set(self.models) & set(self.held_out_models))
        if clash:
            raise ValueError(f"models both measured and held out: {clash}")
        held = [t.name for t in self.tasks if t.platform in self.held_out_platforms]
        if held:
            raise ValueError(f"tasks on held-out platforms: {held[:3]}")
        if not self.tasks:
            raise ValueError("a dataset needs tasks to measure")


@dataclasses.dataclass
class Manifest:
    """What a generation measured; `write` keeps it as JSON beside the records."""

    records: str
    target: str
    backend: str
    platforms: dict[str, dict]
    models: list[str]
    shapes: list[str]
    per_task: int
    seed: int
    held_out: dict[str, list]
    picked: int = 0
    precision: str = "int8"
    rounds: int = 1
    side_by_side: int = 0
    #: The digests of the models that chose the picked schedules (`CostModel.digest`).
    picked_by: list[str] = dataclasses.field(default_factory=list)
    counts: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    skipped: list[dict] = dataclasses.field(default_factory=list)
    measured: int = 0
    failed: int = 0
    seconds: float = 0.0
    complete: bool = False
    created: str = ""
    tools: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(sum(c.values()) for c in self.counts.values())

    def write(self, path: str | Path) -> None:
        atomic_write(Path(path), (json.dumps({**dataclasses.asdict(self),
                                              "total": self.total}, indent=1) + "\n").encode())


#: Called with (platform, task name, tasks done, tasks in all) after each task.
Progress = Callable[[str, str, int, int], None]


def measuring_executor(plan: DatasetPlan, backend: str, *, jobs: int = 1,
                       ray: str | None = None) -> Executor:
    """The executor `generate` measures `plan` on: `jobs` local processes (1: this
    process), or the Ray cluster at `ray` (``auto``, ``local``, ``host:port``), as
    `vdla.execute.make_executor` takes them; each worker a `_TaskMeasurer`. Made before
    the records are opened, a Ray address that answers nothing is an error (ValueError)
    before any file is written. Close it (a context manager) when done."""
    return make_executor(functools.partial(_TaskMeasurer, backend, plan.per_task,
                                           plan.picked, plan.seed, plan.batch),
                         jobs=jobs, ray=ray)


def generate(plan: DatasetPlan, records: Records, *, backend: str, jobs: int = 1,
             ray: str | None = None, executor: Executor | None = None,
             progress: Progress | None = None,
             checkpoint: Callable[[Manifest], None] | None = None,
             log: Callable[[str], None] = lambda message: None) -> Manifest:
    """Measure `plan` on `backend` into `records` and return its `Manifest` (not yet
    written). A run stopped part way and started again measures only what is missing.

    backend : the measurement backend (one of every task's `TuneTask.measure_backends`)
    jobs, ray : where the tasks are measured, as `vdla.execute.make_executor` takes them
        (``vdla sweep``'s, ``vdla tune --ray``'s and a parallel ``vdla run``'s executor):
        `jobs` local processes (1: this process), or the Ray cluster at `ray` (``auto``,
        ``local``, ``host:port``)
    executor : instead of `jobs` and `ray`, one `measuring_executor` made for this plan
        and backend (the caller closes it)
    progress : called after each task, in the order they finish
    checkpoint : called with the manifest so far after every task (``complete`` False
        until the last), so that a long run stopped part way still says what its
        records hold
    log : receives where the measurements run and the platforms' preparation

    Each task is one evaluation of the executor (`_TaskMeasurer`): its schedules drawn
    and measured in a worker, on a copy of the task's rows, and the new rows written to
    `records` here, so the records file has one writer and the draw of every task is
    the same as one job's (only the measured wall times differ). Why whole tasks, not
    single measurements: a training set is hundreds of small tasks (a few schedules
    each), so tasks keep every worker busy where one task's batch would not.
    The side-by-side rounds run in this process, one task after another: they compare a
    task's schedules under one state of the machine."""
    start = time.perf_counter()
    manifest = Manifest(
        records=str(getattr(records, "path", "")), target=plan.tasks[0].target,
        backend=backend,
        platforms={name: dict(params) for name, params in plan.platforms.items()},
        models=list(plan.models), shapes=list(plan.shapes), per_task=plan.per_task,
        seed=plan.seed, held_out={"models": list(plan.held_out_models),
                                  "platforms": list(plan.held_out_platforms)},
        picked=plan.picked, precision=plan.precision, rounds=plan.rounds,
        side_by_side=plan.side_by_side,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        tools={"vdla": vdla.__version__})
    work = list(plan.tasks)
    # Each platform once, here, before any worker starts.
    prepare_tasks(work, backend, set(), log)
    # What the records already hold for each task, so that every manifest written says
    # what they hold, not only what this run measured.
    for task in work:
        held = len({r.schedule_json for r in _held(records, task, backend)})
        if held:
            manifest.counts.setdefault(task.platform, {})[task.key] = held
    rounds = list(range(2, plan.rounds + 1))
    passes = 1 + len(rounds) + bool(plan.side_by_side)

    def note(task, label: str, done: int, finished_pass: int):
        manifest.seconds = round(time.perf_counter() - start, 1)
        manifest.complete = finished_pass == passes and done == len(work)
        if checkpoint is not None:
            checkpoint(manifest)
        if progress is not None:
            progress(task.platform, task.name + label, done, len(work))

    own = executor is None
    executor = measuring_executor(plan, backend, jobs=jobs, ray=ray) if own else executor
    try:
        log(f"measuring on {executor.describe()}")
        pending = [_Job("draw", task, ()) for task in work]
        for done, (job, found) in enumerate(_evaluate(executor, pending, records, backend), 1):
            _count_draw(manifest, job.task, found)
            note(job.task, "", done, 1)
        # Then the passes over the whole set: further rounds, then side by side.
        for index, r in enumerate(rounds, 2):
            pending = [_Job("again", task, (), rounds=r) for task in work]
            for done, (job, found) in enumerate(_evaluate(executor, pending, records, backend),
                                                1):
                manifest.measured += found.get("measured", 0)
                manifest.failed += found.get("failed", 0)
                note(job.task, f" (round {r})", done, index)
    finally:
        if own:
            executor.close()
    if plan.side_by_side:
        for done, task in enumerate(work, 1):
            rows = measure_side_by_side(task, backend, records, plan.side_by_side)
            manifest.measured += len(rows)
            note(task, " (side by side)", done, passes)
    _in_plan_order(manifest, work)
    return manifest


def _in_plan_order(manifest: Manifest, work: Sequence) -> None:
    """The manifest's counts and skipped tasks in the order of the plan's tasks, whatever
    order the tasks finished in (so that every number of jobs writes the same manifest)."""
    counts: dict[str, dict[str, int]] = {}
    for task in work:
        if task.key in manifest.counts.get(task.platform, {}):
            counts.setdefault(task.platform, {})[task.key] = \
                manifest.counts[task.platform][task.key]
    manifest.counts = counts
    order = {(t.platform, t.name): i for i, t in enumerate(work)}
    manifest.skipped.sort(key=lambda s: order.get((s["platform"], s["workload"]), len(order)))


def _held(records: Records, task, backend: str) -> list[Record]:
    """The task's rows on `backend` in `records`, oldest first."""
    return records.query(task.key, task.platform, backend, target=task.target)


def _count_draw(manifest: Manifest, task, found: dict) -> None:
    """Add one task's draw (`_TaskMeasurer.draw`'s answer) to `manifest`."""
    if "skipped" in found:
        manifest.skipped.append({"platform": task.platform, "workload": task.name,
                                 "why": found["skipped"]})
        return
    counts = manifest.counts.setdefault(task.platform, {})
    counts[task.key] = found["trials"]          # the records' and this run's
    manifest.measured += found["measured"]
    manifest.failed += found["failed"]
    if found.get("picked_by") and found["picked_by"] not in manifest.picked_by:
        manifest.picked_by.append(found["picked_by"])


#: Times a task is handed to a fresh worker after its worker died before it is skipped.
RETRIES = 1


@dataclasses.dataclass(frozen=True)
class _Job:
    """One evaluation of `generate`'s executor: ``draw`` a task's random (and picked)
    schedules, or measure its schedules ``again`` until each has `rounds` ok rows; `held`
    are the task's rows in the records (filled in when the job is sent)."""

    kind: str
    task: Any
    held: tuple[Record, ...]
    rounds: int = 0

    def __repr__(self) -> str:      # what an executor's error names
        return f"{self.kind} {self.task.platform}: {self.task.name}"


def _evaluate(executor, jobs: Sequence[_Job], records: Records, backend: str):
    """(job, its answer) as each of `jobs` finishes on `executor`, its new rows added to
    `records` first. A job whose worker died is sent again (`RETRIES` times), then
    answered as skipped; a job that raised in its worker raises here."""
    todo = list(range(len(jobs)))
    deaths = [0] * len(jobs)
    while todo:
        # The rows as the records hold them now: a job sent again starts from there.
        sent = [dataclasses.replace(jobs[i], held=tuple(_held(records, jobs[i].task,
                                                              backend)))
                for i in todo]
        finished = set()
        try:
            for j, found in executor.map_unordered(sent):
                if "raised" in found:
                    raise RuntimeError(f"measuring {sent[j]!r} failed in its worker:\n"
                                       f"{found['raised']}")
                records.add(*found.pop("rows", ()))
                finished.add(todo[j])
                yield sent[j], found
        except EvaluationError as exc:
            if exc.index is None:
                raise
            dead = todo[exc.index]
            deaths[dead] += 1
            if deaths[dead] > RETRIES:
                finished.add(dead)
                yield jobs[dead], {"skipped": f"its worker died {deaths[dead]} times: "
                                              f"{one_line(exc)}", "measured": 0, "failed": 0}
        todo = [i for i in todo if i not in finished]


class _TaskMeasurer:
    """What each worker of `generate`'s executor builds once: a runner measuring in the
    worker (`InProcessRunner`: the executor's processes are the parallelism; it keeps
    one measurement context per platform for the worker's life), and the plan's draw.

    backend, per_task, picked, seed, batch : the plan's (`DatasetPlan`)
    Called with a `_Job`, it copies the job's rows into a records file of its own, runs
    the job on it and answers with the rows it added (``rows``) and its counts; a task
    whose space is empty on its platform (nothing fits its buffers) answers
    ``skipped``, and any other exception ``raised`` (its traceback), which the parent
    raises."""

    def __init__(self, backend: str, per_task: int, picked: int, seed: int, batch: int):
        self.runner = InProcessRunner(backend)
        self.backend, self.per_task, self.picked = backend, per_task, picked
        self.seed, self.batch = seed, batch

    def __call__(self, job: _Job) -> dict:
        with tempfile.TemporaryDirectory(prefix="vdla-dataset-") as folder, \
                Records(Path(folder) / "task.db") as copy:
            copy.add(*job.held)
            try:
                found = self.draw(job.task, copy) if job.kind == "draw" else \
                    self.again(job.task, copy, job.rounds)
            except ValueError as exc:   # no schedule fits this platform
                return {"skipped": str(exc)}
            except Exception:  # noqa: BLE001 - the parent raises it, with this traceback
                return {"raised": traceback.format_exc()}
            found["rows"] = _held(copy, job.task, self.backend)[len(job.held):]
            return found

    def close(self) -> None:
        """Close the runner's measurement contexts (the executor calls this as the
        worker stops)."""
        self.runner.close()

    def draw(self, task, records: Records) -> dict:
        """The task's default and random schedules, then the picked ones, measured into
        `records` (`tune_task`, resuming from what they hold)."""
        # No confirmation rounds for wall-time tasks: a set wants many schedules, and
        # each measurement is already the median of many runs.
        results = [tune_task(task, self.runner, trials=self.per_task, records=records,
                             tuner="random", batch=self.batch, seed=self.seed, confirm=0)]
        picked_by = None
        if self.picked:
            results.append(tune_task(task, self.runner, trials=self.per_task + self.picked,
                                     records=records, tuner="pretrained", batch=self.batch,
                                     seed=self.seed, measure_default=False, confirm=0))
            model = task.pretrained()
            picked_by = model.digest if model is not None else None
        return {"trials": results[-1].trials, "measured": sum(len(r.history) for r in results),
                "failed": sum(r.failures for r in results), "picked_by": picked_by}

    def again(self, task, records: Records, rounds: int) -> dict:
        """`measure_again`'s measurements of the task, into `records`."""
        results = measure_again(task, self.runner, records, rounds)
        return {"measured": len(results), "failed": sum(not r.ok for r in results)}


def measure_again(task, runner, records: Records, rounds: int) -> list:
    """Measure again each schedule of `task` in `records` that has fewer than `rounds`
    ok measurements (one more each); the results, each added to `records`."""
    counts: dict[str, list] = {}
    for record in records.query(task.key, task.platform, runner.backend, target=task.target,
                                status=OK):
        counts.setdefault(record.schedule_json, []).append(record.schedule)
    inputs = [MeasureInput(task, task.schedule_from_dict(found[0]))
              for _, found in sorted(counts.items()) if len(found) < rounds]
    if not inputs:
        return []
    results = runner.measure(inputs)
    records.add(*(r.record(inp, runner.backend) for inp, r in zip(inputs, results)))
    return results


#: The counter a side-by-side row carries: its round (from 0).
SIDE_BY_SIDE = "side_by_side_round"


def measure_side_by_side(task, backend: str, records: Records, rounds: int) -> list:
    """Measure `task`'s schedules in `records` (its ok measurements on `backend`) in
    turn, `rounds` rounds (`TuneTask.side_by_side`), each round's figure of each schedule
    added as a row whose counters name the round (`SIDE_BY_SIDE`); the rows added. A
    task whose records already hold side-by-side rows is left as it is (a resumed run)."""
    found: dict[str, dict] = {}
    for record in records.query(task.key, task.platform, backend, target=task.target,
                                status=OK):
        if SIDE_BY_SIDE in record.counters:
            return []
        found.setdefault(record.schedule_json, record.schedule)
    if not found:
        return []
    schedules = [found[key] for key in sorted(found)]
    start = time.perf_counter()
    costs = task.side_by_side([task.schedule_from_dict(s) for s in schedules], rounds,
                              backend=backend)
    seconds = (time.perf_counter() - start) / costs.size
    rows = [Record(target=task.target, workload=task.key, config=task.platform,
                   backend=backend, schedule=schedule, cycles=int(round(cost)), status=OK,
                   counters={SIDE_BY_SIDE: r}, seconds=seconds)
            for r, row in enumerate(costs) for schedule, cost in zip(schedules, row)]
    records.add(*rows)
    return rows


def local_records(path: str | Path) -> Path:
    """A training set's records file to open: `path` where it exists, else `path` with
    ``.xz`` appended, decompressed once into vdla's cache (``cache_root()/datasets``,
    named by the compressed file's hash). A repository keeps its sets compressed:
    records repeat their workload keys row after row, and xz shrinks them about 19x.
    FileNotFoundError naming both paths when neither exists."""
    path = Path(path)
    if path.is_file():
        return path
    packed = path.with_name(path.name + ".xz")
    if not packed.is_file():
        raise FileNotFoundError(f"no records at {path} or {packed}")
    data = packed.read_bytes()
    out = cache_root() / "datasets" / f"{hashlib.sha256(data).hexdigest()[:16]}-{path.name}"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, lzma.decompress(data))
    return out
