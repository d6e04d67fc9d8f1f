"""Evaluating design points with the models: validity, whole-model cycles, resources.

    evaluator = Evaluator(spec)              # loads and quantizes the models once
    design = evaluator.design(params)        # the config (or why there is none) and key
    record = evaluator(params)               # the point's record (`vdla.dse.pareto`)

A point is the board's default config with the swept parameters replaced. It is
**invalid**, with its reason kept in the record, when the parameters make no
`HardwareConfig` (the config's own checks: ISA field widths, powers of two, ...), when
the board refuses it (its bus width, its block RAM), or when a model loses an op to the
host that the board's default config runs (its latency would leave that op out). A valid
point gets:

* **cycles** per model from the compiler's timing model (`VdlaTarget.estimate`, the
  default schedule chooser's picks, or with the spec's ``tune = N`` the best of N tuned
  schedules per convolution; the board's DRAM bandwidth), and their weighted
  sum; **accelerator_ms**, those cycles at the config's clock; **host_ms**, the weighted
  time of the ops the config leaves on the host (`vdla.dse.host.HostModel`: the host
  kernels' times, fitted on the CPU the record's ``host_model`` names); **latency_ms**,
  the two together (the host's ops and the accelerator's run one after another);
  **gemm_utilization**, the models' useful MACs over the weighted cycles times the
  core's peak MACs per cycle;
* **resources** from the part's `ResourceModel`, and whether they fit the part.

The record's key (`vdla.dse.store.point_key`) covers the config, the board, the models
(an ONNX file by its content) and the versions of what computes the figures, so a store
answers a point again only when the answer would be the same.
"""

from __future__ import annotations

import dataclasses
import hashlib
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import vdla
from vdla.boards import get as get_board
from vdla.compiler import pipeline, targets
from vdla.compiler.tuner import InProcessRunner, Records, best_schedules, tune_task
from vdla.config import HardwareConfig
from vdla.dse.host import HostModel
from vdla.dse.resources import ResourceModel, calibration_path
from vdla.dse.spec import SweepSpec, show_value
from vdla.dse.store import point_key

__all__ = ["Design", "Evaluator", "MODEL_VERSION", "make_evaluator"]

#: Bump when what an evaluation computes changes in a way the key does not show (4: a
#: transformer's dense layers run over the image of its rows, its attention head by head
#: where the blocks agree, a sequence's rows load as one DMA row; 5: latency_ms is the
#: accelerator's time plus the host ops' time, accelerator_ms the accelerator's alone).
MODEL_VERSION = 5


@dataclasses.dataclass(frozen=True)
class Design:
    """A point's config, or why it has none, and its store key."""

    params: Mapping[str, Any]
    config: HardwareConfig | None
    reason: str | None
    key: str


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


class Evaluator:
    """Evaluates points of one sweep (in one process; build one per worker).

    spec : the `SweepSpec` (or its `to_dict`)
    calibration : calibration images per model (the quantizer's; the default is the
        pipeline's)
    tune_records : the tuning records file the points' schedules are tuned into with
        ``spec.tune`` (shared by every worker and kept: records are per config and
        workload, so a point met again is not tuned again); default a temporary file
    host_model : what the host's ops cost (`HostModel`, or the path of a calibration
        file); default the committed calibration (`vdla.dse.host.HOST_CALIBRATION`)
    """

    def __init__(self, spec: SweepSpec | Mapping, *, calibration: int = 4,
                 tune_records: str | Path | None = None,
                 host_model: HostModel | str | Path | None = None):
        self.spec = spec if isinstance(spec, SweepSpec) else SweepSpec.from_dict(spec)
        self.board = get_board(self.spec.board)
        self.resource_model = ResourceModel.for_board(self.board)
        self.host_model = host_model if isinstance(host_model, HostModel) \
            else HostModel.load(host_model)
        self.capacity = self.board.part.capacity
        self.calibration = calibration
        self.tune_records = tune_records
        self._loaded = {}
        self._quantized = {}
        self._baseline = {}
        # A value that makes no config at all (a misspelt ALU op) is the sweep's error,
        # refused before any point is evaluated, not every point's invalid reason.
        self.spec.check_values(self.board.config)
        self._check_priced()
        calib = calibration_path(self.board.part.family)
        models = []
        for m in self.spec.models:
            # A bad model is the sweep's error, not every point's (points are stored).
            pipeline.check_model_spec(m.name)
            path = Path(m.name)
            ident = f"{m.name}@{_file_digest(path)}" if path.suffix == ".onnx" and path.exists() \
                else m.name
            models.append([ident, m.weight])
        self._key_parts = {"board": self.board.name, "models": models,
                           "calibration_images": calibration, "tune": self.spec.tune,
                           "versions": {"vdla": vdla.__version__, "model": MODEL_VERSION,
                                        "resource_calibration": _file_digest(calib),
                                        "host_model": self.host_model.digest}}

    def _check_priced(self) -> None:
        """ValueError when a parameter value brings an extension past VTA that the board's
        resource model cannot price (its family's calibration has no config with it):
        the sweep's error, before any point is evaluated, not every such point's."""
        base = self.board.config.to_dict()
        for name, values in self.spec.parameters.items():
            for value in values:
                try:
                    config = HardwareConfig.from_dict({**base, name: value})
                except (ValueError, TypeError):
                    continue   # check_values refused it, or it is a joint invalidity
                try:
                    self.resource_model.check_priced(config)
                except ValueError as exc:
                    raise ValueError(f"parameter {name} = {show_value(value)} on "
                                     f"{self.board.name}: {exc}") from None

    # --- the design -------------------------------------------------------------------

    def design(self, params: Mapping[str, Any]) -> Design:
        """The config of `params` on the board (or the reason there is none) and the key."""
        base = self.board.config.to_dict()
        try:
            config = HardwareConfig.from_dict({**base, **params})
            clock = config.clock_mhz
            config = self.board.apply(config)
            if "clock_mhz" in params:  # a swept clock overrides the board's
                config = dataclasses.replace(config, clock_mhz=clock)
            self.board.check_memory(config)
        except (ValueError, TypeError) as exc:
            key = point_key(params=_jsonable(params), **self._key_parts)
            return Design(dict(params), None, str(exc), key)
        return Design(dict(params), config, None,
                      point_key(config=config.to_dict(), **self._key_parts))

    # --- the models -------------------------------------------------------------------

    def _model(self, name: str):
        if name not in self._loaded:
            self._loaded[name] = pipeline.load_model(name, calibration=self.calibration,
                                                     note=None)
        return self._loaded[name]

    def _graph(self, name: str, target):
        """The model quantized for the target's requantization mode (cached per mode)."""
        mode = pipeline.requant_mode([target])
        if (name, mode) not in self._quantized:
            self._quantized[name, mode] = pipeline.quantize_for(self._model(name), target,
                                                                mode=mode)
        return self._quantized[name, mode]

    def _target(self, config: HardwareConfig):
        return targets.get("vdla", config=config, backend="functional",
                           dram=self.board.dram_timing(config))

    def baseline_ops(self, name: str) -> set[str]:
        """The ops of model `name` that the board's default config runs on the accelerator
        (an op the target rewrote, an attention split into its heads' products, by its
        own name: `OpEstimate.origin`)."""
        if name not in self._baseline:
            target = self._target(self.board.config)
            self._baseline[name] = {o.origin for o in target.estimate(self._graph(name, target))
                                    if o.target == "vdla"}
        return self._baseline[name]

    def host_provenance(self) -> dict:
        """Whose host the records' host_ms is: the CPU its kernels were timed on, the
        instruction set, numpy and the date of the calibration."""
        p = self.host_model.provenance
        return {k: p[k] for k in ("cpu", "isa", "cores", "numpy", "date") if k in p}

    # --- a point ----------------------------------------------------------------------

    def __call__(self, params: Mapping[str, Any]) -> dict:
        start = time.perf_counter()
        design = self.design(params)
        record = {"key": design.key, "params": _jsonable(params), "config": None,
                  "config_name": None, "valid": False, "reason": design.reason,
                  "objectives": None, "fits": None, "utilization": None, "models": {},
                  "confirmed": None, "seconds": 0.0}
        if design.config is not None:
            config = design.config
            record.update(config=config.to_dict(), config_name=config.name)
            try:
                record.update(self._evaluate(config))
            except ValueError as exc:
                record["reason"] = str(exc)
        record["seconds"] = round(time.perf_counter() - start, 4)
        return record

    def _tuned(self, graph, target) -> dict:
        """node -> the best schedule of ``spec.tune`` trials per convolution of `graph`,
        measured on the functional backend (outputs checked bit-exact, cycles from the
        timing model over the whole schedule space, searched by the tuner's cost model;
        Verilator per point is minutes, too slow for a sweep). Empty without tuning."""
        if not self.spec.tune:
            return {}
        if self.tune_records is None:
            self.tune_records = Path(tempfile.mkdtemp(prefix="vdla-sweep-")) / "tune.db"
        with Records(self.tune_records) as records, InProcessRunner("functional") as runner:
            for task in target.tasks(graph):
                tune_task(task, runner, trials=self.spec.tune, records=records,
                          seed=self.spec.seed, measure_default=True)
            return {name: s for name, (s, _) in
                    best_schedules(records, graph, target, "functional").items()}

    def _evaluate(self, config: HardwareConfig) -> dict:
        target = self._target(config)
        models, total_cycles, total_macs, total_host = {}, 0.0, 0.0, 0.0
        for m in self.spec.models:
            graph = self._graph(m.name, target)
            schedules = self._tuned(graph, target)
            # The graph the estimate's ops are nodes of (an attention split into its
            # heads' products): their shapes price the host's ops. Legalizing it again
            # finds nothing to split.
            graph = target.legalize(graph)
            ops = target.estimate(graph, schedules=schedules)
            # An op is lost when nothing of it runs here (a split attention's softmax
            # stays on the host beside its products; a whole one loses them all).
            here = {o.origin for o in ops if o.target == "vdla"}
            lost = [o for o in ops if o.target == "host" and o.origin not in here
                    and o.origin in self.baseline_ops(m.name)]
            if lost:
                raise ValueError(f"{m.name}: {len(lost)} op(s) that {self.board.name}'s "
                                 f"default config runs fall to the host, first {lost[0].name} "
                                 f"({lost[0].op}): {lost[0].reason}")
            cycles = sum(o.cycles for o in ops if o.cycles is not None)
            macs = sum(o.macs or 0 for o in ops)
            host = [o.name for o in ops if o.target == "host"]
            host_ms = self.host_model.seconds(graph, host) * 1e3
            accelerator_ms = cycles / (config.clock_mhz * 1e3)
            models[m.name] = {"weight": m.weight, "cycles": int(cycles), "macs": int(macs),
                              "ops_on_vdla": sum(o.target == "vdla" for o in ops),
                              "ops": len(ops), "accelerator_ms": accelerator_ms,
                              "host_ms": host_ms, "latency_ms": accelerator_ms + host_ms,
                              "gemm_utilization": macs / (cycles * config.macs_per_cycle)
                              if cycles else None}
            total_cycles += m.weight * cycles
            total_macs += m.weight * macs
            total_host += m.weight * host_ms
        resources = self.resource_model.predict(config)
        overflows = resources.overflows(self.capacity)
        accelerator_ms = total_cycles / (config.clock_mhz * 1e3)
        objectives = {"latency_ms": accelerator_ms + total_host,
                      "accelerator_ms": accelerator_ms, "host_ms": total_host,
                      "cycles": int(round(total_cycles)),
                      **resources.to_dict(),
                      "gemm_utilization": total_macs / (total_cycles * config.macs_per_cycle)
                      if total_cycles else None}
        family = self.board.family
        return {"valid": True, "reason": None, "objectives": objectives,
                "units": {"lut": family.lut_unit, "bram": family.bram_unit},
                "host_model": self.host_provenance(),
                "fits": not overflows,
                "utilization": {k: getattr(resources, k) / getattr(self.capacity, k)
                                for k in resources.KEYS},
                "models": models}


def make_evaluator(spec: Mapping, tune_records: str | None = None) -> Evaluator:
    """A worker's evaluator (`vdla.execute`: built once per worker process)."""
    return Evaluator(spec, tune_records=tune_records)


def _jsonable(params: Mapping[str, Any]) -> dict:
    """Parameters as JSON values (a frozenset of ALU ops becomes a sorted list of names)."""
    out = {}
    for k, v in params.items():
        if isinstance(v, (set, frozenset)):
            v = sorted(getattr(x, "name", str(x)) for x in v)
        elif isinstance(v, tuple):
            v = list(v)
        out[k] = v
    return out
