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
(`Target.precisions`: the GPU target's option), checked within `FLOAT16_TOLERANCE`;
``bf16`` compiles it for a target that runs its convolutions and matrix products in
bfloat16 (the CPU target's AMX tiles), checked within `TOLERANCES`' bf16 entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from vdla.compiler.frontend import zoo
from vdla.compiler.frontend.datasets import digits_split, model_inputs, random_inputs
from vdla.compiler.ir.graph import Graph
from vdla.compiler.passes.prepare import prepare
from vdla.compiler.passes.quantize import quantize
from vdla.compiler.reference import check_inputs, run_reference
# The tolerances live with the reference (the targets' tuning tasks check with them too);
# the pipeline's names for them stay.
from vdla.compiler.reference.tolerance import (FLOAT16_TOLERANCE, FLOAT_TOLERANCE,
                                               TOLERANCES, relative_error)
from vdla.compiler.targets import op_parallel
from vdla.compiler.targets.base import Progress, Target
from vdla.compiler.targets.model import CompiledModel, RunResult, compile_model
from vdla.compiler.tuner.pretrained_chooser import pretrained_schedules
from vdla.compiler.tuner.tune import best_schedules
from vdla._keys import Package
from vdla._memo import remembered_object
from vdla.execute import make_executor

__all__ = ["CHOOSERS", "CHOOSER_ALIASES", "FLOAT16_TOLERANCE", "FLOAT_TOLERANCE",
           "LoadedModel", "Outcome", "PRECISIONS", "TOLERANCES", "check", "check_model_spec",
           "compile_for", "graph_for", "load_model", "quantize_for", "relative_error",
           "requant_mode", "run_model"]

#: What `run_model` compiles: the quantized graph, or the prepared float graph.
PRECISIONS = ("int8", "float32", "float16", "bf16")
#: Who picks the schedules the records do not give (`compile_for`): the target's own
#: chooser, or its pretrained cost model (the one ``vdla tune --tuner pretrained``
#: starts from: `vdla.compiler.tuner.pretrained_chooser`). The last are old names, still
#: taken so that existing commands and records keep working (`CHOOSER_ALIASES`).
CHOOSERS = ("default", "pretrained", "learned")
#: An old chooser name -> the name it now has.
CHOOSER_ALIASES = {"learned": "pretrained"}


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
               note: Callable[[str], None] | None = _print_note,
               inputs: str | os.PathLike | None = None) -> LoadedModel:
    """The model `spec` with `calibration` samples and one input.

    spec : a zoo name or a path to an .onnx file
    seed : seeds the inputs; digits_cnn and vit_digits calibrate on training images and
        run on test images from index `seed`, other models use seeded standard-normal
        inputs (token ids: inside their embedding table; masks: ones;
        `datasets.model_inputs`)
    calibration : the number of calibration samples (each a whole batch)
    batch : the batch size. A zoo model is built with it; an ONNX model's dynamic
        (symbolic or unknown) batch dimension gets it, and an ONNX model that fixes
        another batch is an error. None: the zoo's batch 1, a dynamic batch set to 1.
    note : called with each note about what loading chose for the user (the value a
        dynamic dimension got), which `LoadedModel.notes` also keeps; the default prints
        it on stderr as ``vdla: NOTE``; None keeps quiet
    inputs : an .npz file holding one array per graph input, by name: the input a run
        uses instead of the generated one (`read_inputs`); the calibration samples stay
        the generated ones
    ValueError naming what is wrong (unknown model, missing file, no inputs, bad
    counts, a batch the ONNX model fixes otherwise)."""
    model = _load_model(spec, seed=seed, calibration=calibration, batch=batch, note=note)
    if inputs is None:
        return model
    return dataclasses.replace(model, feed=read_inputs(model.graph, inputs),
                               input_note=f"the arrays of {Path(inputs).name}")


def read_inputs(graph: Graph, path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of the .npz file `path`, one per input of `graph` by name, checked
    against the graph's inputs (`check_inputs`: names, shapes, dtypes; a token id
    outside its embedding table is refused when the gather runs). The file is a user's:
    read without pickles. ValueError naming the file and what is wrong."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: np.asarray(data[name]) for name in data.files}
    except FileNotFoundError:
        raise ValueError(f"--input {path}: no such file") from None
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"--input {path}: not a readable .npz file of arrays ({e})") from None
    try:
        return check_inputs(graph, arrays)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--input {path}: {e}") from None


def _load_model(spec: str, *, seed: int, calibration: int, batch: int | None,
                note: Callable[[str], None] | None) -> LoadedModel:
    """`load_model` without its ``inputs``."""
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
        # second for ResNet-50), the same every time. Keyed on the trained models'
        # files too: retraining one rebuilds it.
        shipped = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                   for p in zoo.SHIPPED_WEIGHTS if p.is_file()}
        graph = remembered_object("zoo", spec, {"batch": batch or 1, "shipped": shipped},
                                  lambda: zoo.get(spec, batch=batch or 1),
                                  check=lambda value: isinstance(value, Graph),
                                  code=zoo.get)
    if not graph.inputs:
        raise ValueError(f"{spec}: the model has no inputs")
    for message in notes if note is not None else ():
        note(message)
    if len(graph.inputs) > 1 or graph.tensors[graph.inputs[0]].dtype != "float32":
        # Token ids inside their embedding table's rows, masks of ones (model_inputs).
        samples, feed, which = model_inputs(graph, seed=seed, calibration=calibration)
        return LoadedModel(spec, graph, samples, feed, which, tuple(notes))
    name = graph.inputs[0]
    shape = graph.tensors[name].shape
    if spec in ("digits_cnn", "vit_digits"):     # models trained on the digits split
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
                 mode: str | None = None, integer_nonlinear: bool = True) -> Graph:
    """`model` quantized on its calibration samples (`quantize` prepares it first: BN
    folding, fusion), for `mode` (default: `requant_mode` of `targets`).

    Remembered on disk (`vdla._memo`, ``$VDLA_CACHE/quantized``): calibrating runs the
    float reference on every sample (about a second for ResNet-18), and a model run
    again quantizes the same. The key is the float graph's `Graph.fingerprint`, the
    calibration samples' bytes, the mode, and the code of `quantize` (its module and
    every project module it imports: the passes, the IR) and of the reference package,
    whose kernels are reached through its registry, not imported by name.
    `integer_nonlinear` False keeps softmax, LayerNorm, GELU and attention in float on the
    host (`quantize`'s option of that name), to compare with their integer definitions."""
    targets = [targets] if isinstance(targets, Target) else list(targets)
    mode = mode or requant_mode(targets)
    key = {"graph": model.graph.fingerprint(), "mode": mode,
           "calibration": _arrays_digest(model.calibration),
           "integer_nonlinear": bool(integer_nonlinear)}
    return remembered_object("quantized", "graph", key,
                             lambda: quantize(model.graph, model.calibration, mode,
                                              integer_nonlinear=integer_nonlinear),
                             check=lambda value: isinstance(value, Graph),
                             code=(quantize, Package("vdla.compiler.reference")))


def reference_of(graph: Graph, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor of `graph`'s reference run on `feed` (`run_reference` with
    ``keep=True``), remembered on disk like the quantized graph (`quantize_for`): a model
    checked again is checked against the same reference (ResNet-50's takes about a
    second). The key is the graph's fingerprint, the feed's bytes and the code of the
    reference package (its kernels are reached through its registry)."""
    return remembered_object("reference", "values",
                             {"graph": graph.fingerprint(), "feed": _arrays_digest(feed)},
                             lambda: run_reference(graph, feed, keep=True),
                             check=lambda value: isinstance(value, dict),
                             code=Package("vdla.compiler.reference"))


def _arrays_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 of named arrays: each name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        digest.update(f"{name} {a.dtype} {a.shape}\0".encode() + a.tobytes())
    return digest.hexdigest()


def graph_for(model: LoadedModel, targets: Target | Sequence[Target], *,
              precision: str = "int8", mode: str | None = None,
              integer_nonlinear: bool = True) -> Graph:
    """The graph a run of `model` at `precision` compiles: `quantize_for`'s (int8, with
    `integer_nonlinear`) or the prepared float graph (float32 and float16: BN folding,
    fusion, as the quantizer starts). ValueError for a precision one of `targets` does
    not run (`Target.precisions`: float16 needs a target that stores floats as
    float16)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not "
                         f"{precision!r}")
    listed = [targets] if isinstance(targets, Target) else list(targets)
    for target in listed:
        target.check_precision(precision)
    if precision != "int8":
        return prepare(model.graph)
    return quantize_for(model, targets, mode=mode, integer_nonlinear=integer_nonlinear)


def compile_for(quantized: Graph, target: Target, *, records: Any = None,
                backend: str | None = None, progress: Progress | None = None,
                chooser: str = "default") -> tuple[CompiledModel, dict]:
    """`quantized` compiled for `target`, with the best schedule the tuning `records` (a
    `vdla.compiler.tuner.Records`, or None) hold for each of its tunable nodes (measured
    on `backend`, default each task's first measurement backend), and for the others the
    `chooser`'s: ``default``, the target's own; ``pretrained``, what the target's
    pretrained cost model ranks first (`pretrained_schedules`; the default where it has
    none; ``learned`` is its old name, `CHOOSER_ALIASES`). Returns
    (the compiled model, node name -> schedule taken from the records)."""
    if chooser not in CHOOSERS:
        raise ValueError(f"chooser must be one of {', '.join(CHOOSERS)}, not {chooser!r}")
    recorded = {}
    if records is not None:
        recorded = {name: s for name, (s, _) in
                    best_schedules(records, quantized, target, backend).items()}
    chooser = CHOOSER_ALIASES.get(chooser, chooser)
    chosen = pretrained_schedules(quantized, target) if chooser == "pretrained" else {}
    schedules = {**chosen, **recorded}      # the records win
    key = target.compile_key()
    if key is None:
        return compile_model(quantized, target, schedules=schedules, progress=progress), \
            recorded
    # Remembered on disk ($VDLA_CACHE/compiled): emitting a model's tens of thousands of
    # instructions in Python takes seconds (ResNet-50: about two), and a model run again
    # compiles the same programs. The key is the quantized graph's fingerprint, what the
    # target says decides its programs, the schedules and the code of the whole compiler
    # (and what it imports: the ISA, the runtime's program builder, the config): the
    # target's lowerings are reached through the target object, not imported here.
    start = time.perf_counter()
    compiled = remembered_object(
        "compiled", "model", {"graph": quantized.fingerprint(), "target": key,
                              "schedules": schedules},
        lambda: compile_model(quantized, target, schedules=schedules, progress=progress),
        check=lambda value: isinstance(value, CompiledModel),
        code=(compile_model, Package("vdla.compiler")))
    # The caller's graph and target (equal to the remembered ones), and this call's time;
    # the remembered graph where the target rewrote it (`Target.legalize`: its ops are
    # other nodes than the caller's graph has).
    graph = quantized if {op.name for op in compiled.ops} == set(quantized.nx) \
        else compiled.graph
    return dataclasses.replace(compiled, graph=graph, target=target,
                               compile_seconds=time.perf_counter() - start), recorded


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
        graph, as the target rewrote it (`Target.legalize`; its ops are the run's)
    compiled : the `CompiledModel`
    schedules : node name -> schedule taken from the records
    result : the run's `RunResult` (every tensor in ``result.values``)
    reference : every tensor of the reference run of the graph before the target's
        rewriting (the outputs are checked against it)
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
              chooser: str = "default", integer_nonlinear: bool = True) -> Outcome:
    """The whole chain: `model` (a `LoadedModel`, or a spec for `load_model`) quantized
    for `target` (or `mode`; at ``precision="float32"`` or ``"float16"`` prepared, not
    quantized), compiled (with `records`' best schedules, the others by `chooser`, as in
    `compile_for`), run once on its feed (on
    `device` if given, else the target's own), and checked against the reference:
    bit-exactly for int8, within `TOLERANCES` for the float precisions.

    With `jobs` > 1 or `ray` (a Ray address, `vdla.execute`), the ops the target lets
    run apart are run in parallel, fed from the reference (`op_parallel`; `chain`: in
    runs of consecutive ops, one a worker), and the model's run replays them: the same
    cycles, outputs and report as one after another. `integer_nonlinear` as in
    `quantize_for`."""
    model = load_model(model) if isinstance(model, str) else model
    start = time.perf_counter()
    graph = graph_for(model, target, precision=precision, mode=mode,
                      integer_nonlinear=integer_nonlinear)
    quantize_seconds = time.perf_counter() - start
    compiled, schedules = compile_for(graph, target, records=records,
                                      progress=compile_progress, chooser=chooser)
    reference = replayed = parallel = None
    start = time.perf_counter()
    if (jobs > 1 or ray) and target.parallel_ops(compiled.ops_on(target.name)):
        # The ops are fed from the reference of the graph compiled (a target may have
        # rewritten it, `Target.legalize`: its tensors are the ops' operands).
        reference = reference_of(compiled.graph, model.feed)
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
        simulate_seconds = sum(s.wall_seconds for s in result.ops if s.target == target.name)
    if reference is None or compiled.graph is not graph:
        reference = reference_of(graph, model.feed)    # the outputs checked: the graph's own
    tolerance = TOLERANCES.get(precision)
    ok, mismatch = check(result.values, reference, graph, tolerance=tolerance)
    error = max((relative_error(result.values[n], reference[n]) for n in graph.outputs),
                default=0.0)
    return Outcome(model, target, compiled.graph, compiled, schedules, result, reference, ok,
                   mismatch, quantize_seconds, precision, error, run_seconds, parallel,
                   simulate_seconds)
