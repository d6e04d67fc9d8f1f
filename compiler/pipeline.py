"""The end-to-end chain, written once: load -> prepare -> quantize -> compile -> run ->
check. The CLI (``vdla run``, ``vdla tune``), the benches and the tests call it.

    model = load_model("resnet18", seed=0, calibration=4)
    target = vdla.compiler.targets.get("vdla", config=config, backend="functional")
    outcome = run_model(model, target)               # compiled, run, checked
    outcome.bit_exact, outcome.result.cycles
    outcome = run_model(model, cpu, precision="float32")   # the float graph instead

Each step is also a function of its own (`load_model`, `quantize_for`, `compile_for`,
`check`), for callers that time or repeat one of them. `quantize_for` quantizes for the
requantization mode the targets share (`requant_mode`), so one quantized graph can run on
all of them and be compared.

Precision: ``int8`` (the default) compiles the quantized graph and checks it bit-exactly
against the integer reference; ``float32`` compiles the prepared float graph (BN folded,
ops fused: what the quantizer starts from) and checks it against the float reference
within `FLOAT_TOLERANCE` relative (max |difference| / max |reference|, per output), since
a target's float sums round differently from the reference's float64 ones; ``float16``
compiles the same float graph for a target that stores and multiplies it in float16
(`Target.precisions`: the GPU target's option), checked within `FLOAT16_TOLERANCE`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import vdla.config
import vdla.isa
import vdla.runtime
from vdla.compiler.frontend import zoo
from vdla.compiler.frontend.datasets import digits_split, random_inputs
from vdla.compiler.frontend.workloads import (RESNET18, conv_matches, float_workload_graph,
                                              model_graph, parse_workload, workload_graph)
from vdla.compiler.ir.graph import Graph
from vdla.compiler.passes.prepare import prepare
from vdla.compiler.passes.quantize import quantize
from vdla.compiler.reference import run_reference
# The tolerances live with the reference (the targets' tuning tasks check with them too);
# the pipeline's names for them stay.
from vdla.compiler.reference.tolerance import (FLOAT16_TOLERANCE, FLOAT_TOLERANCE,
                                               TOLERANCES, relative_error)
from vdla.compiler.targets import op_parallel, registry
from vdla.compiler.targets.base import Progress, Target
from vdla.compiler.targets.model import CompiledModel, RunResult, compile_model
from vdla.compiler.tuner.dataset import DatasetPlan, local_records
from vdla.compiler.tuner.learned import Rows, learned_schedules, training_rows
from vdla.compiler.tuner.records import Records
from vdla.compiler.tuner.tune import best_schedules
from vdla._memo import remembered_object
from vdla.execute import make_executor

__all__ = ["CHOOSERS", "FLOAT16_TOLERANCE", "FLOAT_TOLERANCE", "LoadedModel", "Outcome",
           "PRECISIONS", "TOLERANCES", "check", "check_model_spec", "compile_for", "graph_for",
           "dataset_plan", "load_model", "plan_from_manifest", "quantize_for",
           "relative_error", "requant_mode", "run_model", "tasks_from_workload",
           "training_set"]

#: What `run_model` compiles: the quantized graph, or the prepared float graph.
PRECISIONS = ("int8", "float32", "float16")
#: Who picks the schedules the records do not give (`compile_for`): the target's own
#: chooser, or its pretrained cost model.
CHOOSERS = ("default", "learned")
#: Appended to a named workload's task whose nodes add a residual (``C8+residual``).
RESIDUAL_SUFFIX = "+residual"


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A float model ready for the pipeline.

    name : what the user asked for (a zoo name or an .onnx path)
    graph : the float `Graph`
    calibration : input name -> calibration samples stacked on a leading axis
    feed : input name -> the one input a run uses
    input_note : where that input comes from, for reports
    notes : what loading decided for the user (a dynamic dimension's value), as printed
    """

    name: str
    graph: Graph
    calibration: Mapping[str, np.ndarray]
    feed: Mapping[str, np.ndarray]
    input_note: str
    notes: tuple[str, ...] = ()

    @property
    def batch(self) -> int:
        """The batch the model runs with: its input's leading dimension (1 for a scalar)."""
        shape = self.graph.tensors[self.graph.inputs[0]].shape
        return int(shape[0]) if shape else 1


def _print_note(message: str) -> None:
    # The commands' status-line format (`vdla.cli.common.log`, which this layer cannot
    # import); stderr, so stdout keeps only results.
    print(f"vdla: {message}", file=sys.stderr, flush=True)


def check_model_spec(spec: str) -> str:
    """`spec` as a string if it names a model `load_model` can load (a zoo name, or an
    existing .onnx file), without loading it; ValueError naming what is wrong."""
    spec = str(spec)
    if spec.lower().endswith(".onnx"):
        if not Path(spec).is_file():
            raise ValueError(f"ONNX file {spec!r} does not exist (MODEL is a zoo name: "
                             f"{', '.join(zoo.names())}, or a path to an .onnx file)")
    elif spec not in zoo.names():
        raise ValueError(f"unknown model {spec!r}; MODEL is a zoo name "
                         f"({', '.join(zoo.names())}) or a path to an .onnx file")
    return spec


def load_model(spec: str, *, seed: int = 0, calibration: int = 4, batch: int | None = None,
               note: Callable[[str], None] | None = _print_note) -> LoadedModel:
    """The model `spec` with `calibration` samples and one input.

    spec : a zoo name or a path to an .onnx file
    seed : seeds the inputs; digits_cnn calibrates on training images and runs on test
        images from index `seed`, other models use seeded standard-normal inputs
    calibration : the number of calibration samples (each a whole batch)
    batch : the batch size. A zoo model is built with it; an ONNX model's dynamic
        (symbolic or unknown) batch dimension gets it, and an ONNX model that fixes
        another batch is an error. None: the zoo's batch 1, a dynamic batch set to 1.
    note : called with each note about what loading chose for the user (the value a
        dynamic dimension got), which `LoadedModel.notes` also keeps; the default prints
        it on stderr as ``vdla: NOTE``; None keeps quiet
    ValueError naming what is wrong (unknown model, missing file, several inputs, bad
    counts, a batch the ONNX model fixes otherwise)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"the seed must be a non-negative integer, not {seed!r}")
    if isinstance(calibration, bool) or not isinstance(calibration, int) or calibration < 1:
        raise ValueError(f"the calibration sample count must be a positive integer, not "
                         f"{calibration!r}")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int)
                              or batch < 1):
        raise ValueError(f"the batch must be a positive integer, not {batch!r}")
    spec = check_model_spec(spec)
    notes: list[str] = []
    if spec.lower().endswith(".onnx"):
        # onnx is a heavy import that runs of built-in models do not need.
        from vdla.compiler.frontend.onnx_import import from_onnx
        graph = from_onnx(spec, batch=batch)
        notes = [_dynamic_note(d, batch) for d in graph.metadata["onnx"]["dynamic_dims"]]
    else:
        # Remembered on disk: building a zoo model draws its seeded weights (about a
        # second for ResNet-50), the same every time.
        graph = remembered_object("zoo", spec, {"batch": batch or 1},
                                  lambda: zoo.get(spec, batch=batch or 1),
                                  check=lambda value: isinstance(value, Graph),
                                  sources=_zoo_sources())
    if len(graph.inputs) != 1:
        raise ValueError(f"{spec}: the pipeline feeds models with one input; this one has "
                         f"{len(graph.inputs)} ({', '.join(graph.inputs)})")
    for message in notes if note is not None else ():
        note(message)
    name = graph.inputs[0]
    shape = graph.tensors[name].shape
    if spec == "digits_cnn":
        x_train, _, x_test, y_test = digits_split()
        n = shape[0]
        index = seed % len(x_test)
        picks = (index + np.arange(n)) % len(x_test)
        # Consecutive training images, n to a calibration sample (wrapping around).
        samples = x_train[np.arange(calibration * n) % len(x_train)].reshape(
            (calibration,) + shape)
        which = (f"test image {index} of the digits split (label {y_test[index]})" if n == 1
                 else f"{n} test images of the digits split from image {index}"
                      + (", wrapping around" if index + n > len(x_test) else "")
                      + f" (labels {', '.join(str(y) for y in y_test[picks])})")
        return LoadedModel(spec, graph, {name: samples}, {name: x_test[picks]}, which,
                           tuple(notes))
    # One generator for the pipeline and the named workloads (frontend.workloads), so a
    # tuned ResNet-18 layer has the epilogue `vdla run` compiles.
    samples, x = random_inputs(shape, seed=seed, calibration=calibration)
    return LoadedModel(spec, graph, {name: samples}, {name: x},
                       f"standard-normal input, seed {seed}"
                       + (f", batch {shape[0]}" if shape and shape[0] != 1 else ""),
                       tuple(notes))


def _dynamic_note(dim: Mapping[str, Any], batch: int | None) -> str:
    """The note for one dynamic input dimension the importer resolved
    (``metadata["onnx"]["dynamic_dims"]``)."""
    label = f" {dim['name']!r}" if dim["name"] else " (unnamed)"
    if dim["axis"] == 0:
        how = "" if batch is not None else " (vdla run --batch sets it)"
        return (f"input {dim['input']!r} has a dynamic batch dimension{label}; using batch "
                f"{dim['value']}{how}")
    return (f"input {dim['input']!r} has a dynamic dimension {dim['axis']}{label}; using "
            f"{dim['value']} (only the batch can be set: export the model with fixed sizes)")


def requant_mode(targets: Sequence[Target]) -> str:
    """The best requantization mode every target in `targets` runs: the first of the
    first target's modes that all support. ValueError when they share none."""
    common = [m for m in targets[0].requant_modes if all(m in t.requant_modes for t in targets)]
    if not common:
        modes = "; ".join(f"{t.name}: {', '.join(t.requant_modes)}" for t in targets)
        raise ValueError(f"the targets share no requantization mode ({modes})")
    return common[0]


def quantize_for(model: LoadedModel, targets: Target | Sequence[Target], *,
                 mode: str | None = None) -> Graph:
    """`model` quantized on its calibration samples (`quantize` prepares it first: BN
    folding, fusion), for `mode` (default: `requant_mode` of `targets`).

    Remembered on disk (`vdla._memo`, ``$VDLA_CACHE/quantized``): calibrating runs the
    float reference on every sample (about a second for ResNet-18), and a model run
    again quantizes the same. The key is the float graph's `Graph.fingerprint`, the
    calibration samples' bytes, the mode, and the sources of the passes, the reference
    and the IR."""
    targets = [targets] if isinstance(targets, Target) else list(targets)
    mode = mode or requant_mode(targets)
    key = {"graph": model.graph.fingerprint(), "mode": mode,
           "calibration": _arrays_digest(model.calibration)}
    return remembered_object("quantized", "graph", key,
                             lambda: quantize(model.graph, model.calibration, mode),
                             check=lambda value: isinstance(value, Graph),
                             sources=_quantizer_sources())


def reference_of(graph: Graph, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor of `graph`'s reference run on `feed` (`run_reference` with
    ``keep=True``), remembered on disk like the quantized graph (`quantize_for`): a model
    checked again is checked against the same reference (ResNet-50's takes about a
    second). The key is the graph's fingerprint, the feed's bytes and the sources."""
    return remembered_object("reference", "values",
                             {"graph": graph.fingerprint(), "feed": _arrays_digest(feed)},
                             lambda: run_reference(graph, feed, keep=True),
                             check=lambda value: isinstance(value, dict),
                             sources=_quantizer_sources())


def _arrays_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 of named arrays: each name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        digest.update(f"{name} {a.dtype} {a.shape}\0".encode() + a.tobytes())
    return digest.hexdigest()


@functools.cache
def _zoo_sources() -> tuple[Path, ...]:
    """The files whose code builds the zoo's models: the front half and the IR."""
    root = Path(__file__).resolve().parent
    return tuple(sorted(p for folder in ("frontend", "ir") for p in (root / folder).rglob("*.py")))


@functools.cache
def _quantizer_sources() -> tuple[Path, ...]:
    """The files whose code decides a quantized graph: the passes, the reference
    kernels and the IR."""
    root = Path(__file__).resolve().parent
    return tuple(sorted(p for folder in ("passes", "reference", "ir")
                        for p in (root / folder).rglob("*.py")))


def graph_for(model: LoadedModel, targets: Target | Sequence[Target], *,
              precision: str = "int8", mode: str | None = None) -> Graph:
    """The graph a run of `model` at `precision` compiles: `quantize_for`'s (int8) or
    the prepared float graph (float32 and float16: BN folding, fusion, as the quantizer
    starts). ValueError for a precision one of `targets` does not run
(`Target.precisions`: float16 needs a target that stores floats as float16)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not "
                         f"{precision!r}")
    listed = [targets] if isinstance(targets, Target) else list(targets)
    for target in listed:
        target.check_precision(precision)
    if precision != "int8":
        return prepare(model.graph)
    return quantize_for(model, targets, mode=mode)


def compile_for(quantized: Graph, target: Target, *, records: Any = None,
                backend: str | None = None, progress: Progress | None = None,
                chooser: str = "default") -> tuple[CompiledModel, dict]:
    """`quantized` compiled for `target`, with the best schedule the tuning `records` (a
    `vdla.compiler.tuner.Records`, or None) hold for each of its tunable nodes (measured
    on `backend`, default each task's first measurement backend), and for the others the
    `chooser`'s: ``default``, the target's own; ``learned``, what the target's pretrained
    cost model ranks first (`learned_schedules`; the default where it has none). Returns
    (the compiled model, node name -> schedule taken from the records)."""
    if chooser not in CHOOSERS:
        raise ValueError(f"chooser must be one of {', '.join(CHOOSERS)}, not {chooser!r}")
    recorded = {}
    if records is not None:
        recorded = {name: s for name, (s, _) in
                    best_schedules(records, quantized, target, backend).items()}
    chosen = learned_schedules(quantized, target) if chooser == "learned" else {}
    schedules = {**chosen, **recorded}      # the records win
    key = target.compile_key()
    if key is None:
        return compile_model(quantized, target, schedules=schedules, progress=progress), \
            recorded
    # Remembered on disk ($VDLA_CACHE/compiled): emitting a model's tens of thousands of
    # instructions in Python takes seconds (ResNet-50: about two), and a model run again
    # compiles the same programs. The key is the quantized graph's fingerprint, what the
    # target says decides its programs, the schedules and the compiler's sources.
    start = time.perf_counter()
    compiled = remembered_object(
        "compiled", "model", {"graph": quantized.fingerprint(), "target": key,
                              "schedules": schedules},
        lambda: compile_model(quantized, target, schedules=schedules, progress=progress),
        check=lambda value: isinstance(value, CompiledModel), sources=_compiler_sources())
    # The caller's graph and target (equal to the remembered ones), and this call's time.
    return dataclasses.replace(compiled, graph=quantized, target=target,
                               compile_seconds=time.perf_counter() - start), recorded


@functools.cache
def _compiler_sources() -> tuple[Path, ...]:
    """The files whose code decides a compiled model: the compiler, the ISA, the
    runtime's program builder and the config."""
    folders = [Path(__file__).resolve().parent]
    files = [p for folder in folders for p in folder.rglob("*.py")]
    for package in (vdla.isa, vdla.runtime):
        files += [p for folder in package.__path__ for p in Path(folder).glob("*.py")]
    return tuple(sorted(files + [Path(vdla.config.__file__)]))


def check(values: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
          graph: Graph, *, tolerance: float | None = None) -> tuple[bool, str]:
    """Whether every output of `graph` in `values` equals `reference` bit-exactly (and
    has its dtype), or with `tolerance` lies within it (`relative_error`); if not, which
    outputs differ and the first op whose output differs (both mappings hold every
    tensor: ``keep=True``)."""
    def differs(name: str) -> bool:
        a, b = values[name], reference[name]
        if tolerance is not None:
            return relative_error(a, b) > tolerance or a.dtype != b.dtype
        return not np.array_equal(a, b) or a.dtype != b.dtype

    bad = [name for name in graph.outputs if differs(name)]
    if not bad:
        return True, ""
    details = []
    for name in bad:
        a, b = values[name], reference[name]
        if tolerance is not None:
            details.append(f"output {name!r}: relative error {relative_error(a, b):.3g} "
                           f"(allowed {tolerance:g})")
        else:
            count = int(np.count_nonzero(a != b)) if a.shape == b.shape else a.size
            details.append(f"output {name!r}: {count} of {b.size} values differ")
    for node in graph.nodes():
        out = node.outputs[0]
        if out in values and differs(out):
            details.append(f"first differing op: {node.name!r} ({node.op})")
            break
    return False, "; ".join(details)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What `run_model` did.

    model : the `LoadedModel`
    target : the `Target`
    quantized : the graph compiled: the quantized graph, or at float32 the prepared float
        graph
    compiled : the `CompiledModel`
    schedules : node name -> schedule taken from the records
    result : the run's `RunResult` (every tensor in ``result.values``)
    reference : every tensor of the reference run of that graph
    bit_exact, mismatch : `check`'s answer (at float32: within `FLOAT_TOLERANCE`)
    quantize_seconds : wall time of prepare + quantize (at float32: prepare)
    precision : ``int8`` or ``float32``
    max_error : the largest `relative_error` of an output (0.0 when bit-exact)
    run_seconds : wall time of the run (a parallel run's: the reference that feeds it,
        the ops on the workers and the replay)
    parallel : where a parallel run's ops ran (``2 local processes``), or None
    simulate_seconds : wall time of the target's ops: a parallel run's phase on the
        workers, else the sum of the target's ops' wall times
    """

    model: LoadedModel
    target: Target
    quantized: Graph
    compiled: CompiledModel
    schedules: dict
    result: RunResult
    reference: dict
    bit_exact: bool
    mismatch: str
    quantize_seconds: float
    precision: str = "int8"
    max_error: float = 0.0
    run_seconds: float = 0.0
    parallel: str | None = None
    simulate_seconds: float = 0.0


def run_model(model: LoadedModel | str, target: Target, *, records: Any = None,
              mode: str | None = None, device: Any = None, precision: str = "int8",
              compile_progress: Progress | None = None,
              run_progress: Progress | None = None, jobs: int = 1,
              ray: str | None = None, chain: bool = False,
              chooser: str = "default") -> Outcome:
    """The whole chain: `model` (a `LoadedModel`, or a spec for `load_model`) quantized
    for `target` (or `mode`; at ``precision="float32"`` or ``"float16"`` prepared, not
    quantized), compiled (with `records`' best schedules, the others by `chooser`, as in
    `compile_for`), run once on its feed (on
    `device` if given, else the target's own), and checked against the reference:
    bit-exactly for int8, within `TOLERANCES` for the float precisions.

    With `jobs` > 1 or `ray` (a Ray address, `vdla.execute`), the ops the target lets
    run apart are run in parallel, fed from the reference (`op_parallel`; `chain`: in
    runs of consecutive ops, one a worker), and the model's run replays them: the same
    cycles, outputs and report as one after another."""
    model = load_model(model) if isinstance(model, str) else model
    start = time.perf_counter()
    graph = graph_for(model, target, precision=precision, mode=mode)
    quantize_seconds = time.perf_counter() - start
    compiled, schedules = compile_for(graph, target, records=records,
                                      progress=compile_progress, chooser=chooser)
    reference = replayed = parallel = None
    start = time.perf_counter()
    if (jobs > 1 or ray) and target.parallel_ops(compiled.ops_on(target.name)):
        reference = reference_of(graph, model.feed)
        with make_executor(op_parallel.worker_factory(compiled), jobs=jobs,
                           ray=ray) as executor:
            parallel = executor.describe()
            simulating = time.perf_counter()
            replayed = op_parallel.run_ops(compiled, reference, executor, chain=chain,
                                           progress=run_progress)
            simulate_seconds = time.perf_counter() - simulating
    with compiled.session(device) as session:
        result = session.run(model.feed, progress=None if replayed else run_progress,
                             keep=True, replayed=replayed)
    run_seconds = time.perf_counter() - start
    if reference is None:
        reference = reference_of(graph, model.feed)
        simulate_seconds = sum(s.wall_seconds for s in result.ops if s.target == target.name)
    tolerance = TOLERANCES.get(precision)
    ok, mismatch = check(result.values, reference, graph, tolerance=tolerance)
    error = max((relative_error(result.values[n], reference[n]) for n in graph.outputs),
                default=0.0)
    return Outcome(model, target, graph, compiled, schedules, result, reference, ok,
                   mismatch, quantize_seconds, precision, error, run_seconds, parallel,
                   simulate_seconds)


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
            raise ValueError(f"target {target.name!r} has no tunable task for workload "
                             f"{spec!r} ({workload}): it does not run that convolution")
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
    A shape a platform cannot tune is left out, and `log` says so."""
    def tasks_of(target) -> list:
        tasks = []
        for name in models:
            tasks += target.tasks(graph_for(load_model(name), target, precision=precision))
        for spec in shapes:
            try:
                tasks += tasks_from_workload(spec, target, precision=precision)
            except ValueError as exc:
                log(f"left out {spec}: {exc}")
        return tasks

    measured = [(target, tasks_of(target)) for target in platforms]
    if platforms and not any(tasks for _, tasks in measured):
        raise ValueError(f"target {platforms[0].name!r} has no tunable {precision} op among "
                         f"the models and shapes given")
    # A held-out platform's name is its tasks' (`TuneTask.platform`), so it takes a task.
    kept_out = [(target, tasks_of(target)[:1]) for target in held_out]
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
    `vdla.compiler.tuner.learned.training_rows` to join with its records."""
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
    """The rows (`vdla.compiler.tuner.learned.Rows`) of the training set whose manifest
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
