"""The target interface: what every back half offers the rest of vdla.

TVM's lesson, one graph and many targets: the front half hands every target the same
quantized `Graph`; a target says which nodes it runs (and why not the others), compiles
them, and runs them. Nothing outside a target's folder names its classes: the pipeline,
the CLI and the tuner see only this interface.

A target (`Target`):

* has a `name` (``vdla``, ``host``, ...) and says which requantization modes it runs
  (`requant_modes`, best first: the front half quantizes for one of them);
* says whether it runs a node (`supports` -> `Support`: yes or no, and why). Nodes it
  refuses fall back to the host target (the numpy reference kernels): that rule lives
  in `vdla.compiler.targets.model.compile_model`, not in any back half;
* compiles the nodes it runs (`compile_nodes`, or one at a time `compile_op`) into
  `CompiledOp` s, with a schedule per node where it has them;
* runs them in a `TargetSession` (`open_session`), which reports per-op figures
  (`OpRun`: cycles, MACs, bytes where the target has them, and its own extras);
* offers tunable tasks (`tasks`, see `vdla.compiler.tuner.task.TuneTask`);
* may write a compiled model as something that runs without vdla (`export`);
* describes itself to the command line (`vdla.compiler.targets.options`): its own
  options and how it is built from them (`cli_options`, `from_cli`), whether it can run
  here (`unavailable`), the machine it runs on (`machine`, `machine_lines`), its
  schedules in a few words (`describe_schedule`), the measurement backends it refuses
  here (`check_measure`), and what its reports say (`title`, `report_lines`,
  `time_note`, `column_label`, `extra_columns`, `estimate_column`). The CLI compares no
  target name.

`OpStats` is the per-op report every target fills the same way: name, op, target,
reason, schedule, wall seconds, then cycles, MACs and bytes where the target has them
(None otherwise), `extra` for figures only one target has, and the op's device time:
`device_seconds` with what it is (`device_time`: the accelerator's cycles at its
clock, a GPU's CUDA-event time, or the host's wall time).
"""

from __future__ import annotations

import abc
import dataclasses
import time
from typing import Any, Callable, ClassVar, Mapping, NamedTuple, Sequence

import numpy as np

from vdla.compiler.ir.graph import Graph, Node
from vdla.compiler.targets.options import EstimateColumn, ExtraColumn, TargetOption

__all__ = ["WALL", "CompiledOp", "DeviceValue", "GraphRun", "OpRun", "OpStats", "Progress",
           "Support", "Target", "TargetSession", "Transfer"]

#: Called as each node starts: (nodes done, total nodes, node name).
Progress = Callable[[int, int, str], None]
#: `OpStats.device_time` of an op whose device time is the host's wall time.
WALL = "wall"


class Support(NamedTuple):
    """A target's answer about one node: does it run it, and why (or why not)."""

    ok: bool
    reason: str


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledOp:
    """One node of a compiled model.

    name, op : the graph node's name and operator
    target : the name of the target that runs it
    reason : why it runs there (the partition's reason; for a fallback: why the primary
        target refused it)
    schedule : the schedule as a plain dict, or None where the target has none
    kernel : the target's own compiled form (a lowered program, a function, ...); opaque
        to everything but the target's session
    compile_seconds : wall time spent compiling it
    """

    name: str
    op: str
    target: str
    reason: str
    schedule: dict | None = None
    kernel: Any = None
    compile_seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class OpRun:
    """What a target session reports for one run of one op.

    outputs : one array per output of the node, in its order
    cycles : device cycles, where the target counts them
    macs : useful multiply-accumulates, where the target reports them
    bytes : bytes moved to and from the target's memory, where it counts them
    extra : figures only this target has (JSON values); ``view: True`` marks an op that
        moved no data (its output is its input, seen another way)
    device_seconds : the op's time on the device, where the target has one of its own
        (cycles at the clock, a GPU's event time); None: its wall time
    device_time : what `device_seconds` is, in a few words (``cycles at 100 MHz``)
    """

    outputs: Sequence[np.ndarray]
    cycles: int | None = None
    macs: int | None = None
    bytes: int | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    device_seconds: float | None = None
    device_time: str | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class DeviceValue:
    """A tensor that stays in a target session's memory (the accelerator's DRAM) between
    the ops that write and read it: what `TargetSession.run` returns for an output it
    keeps, and is given for an input it holds. Only a host op or a model output makes
    the model session read it back (`TargetSession.fetch`)."""

    session: "TargetSession"
    tensor: str


@dataclasses.dataclass(frozen=True)
class Transfer:
    """Activations the host moved between its memory and a target's during a run.

    tensor : the tensor moved
    target : the target whose memory it went to or came from
    direction : ``to_target`` (packed and written) or ``to_host`` (read and unpacked)
    op : the op that needed it (``""``: the model's outputs)
    bytes : bytes moved
    seconds : host wall time of the move (packing, DMA, unpacking)
    between : True when the move sits between two ops of targets other than the host
        (a target op's output read back although no host op needs it, or written to a
        target again): the repacking that keeping activations in place avoids
    """

    tensor: str
    target: str
    direction: str
    op: str
    bytes: int
    seconds: float
    between: bool = False


class GraphRun(NamedTuple):
    """A whole graph run in one call (`TargetSession.run_graph`): the graph's outputs by
    name, each op's wall time measured inside the program (op name -> seconds), and the
    time of each step the program adds between ops (a CPU layout conversion's name ->
    seconds; empty for most targets)."""

    outputs: dict[str, np.ndarray]
    op_seconds: dict[str, float]
    layout_seconds: dict[str, float] = {}


@dataclasses.dataclass(frozen=True)
class OpStats:
    """One op of a run, with the fields every target fills.

    name, op, target, reason, schedule : as in `CompiledOp`
    wall_seconds : host wall time of the op (writes, run, read-back; or the kernel)
    cycles, macs, bytes : as in `OpRun` (None where the target has no such figure)
    extra : the target's own figures (vdla: ``gemm_utilization``)
    device_seconds : the op's device time (`OpRun.device_seconds`, else `wall_seconds`)
    device_time : what it is (`OpRun.device_time`, else `WALL`)
    """

    name: str
    op: str
    target: str
    reason: str
    schedule: dict | None
    wall_seconds: float
    cycles: int | None = None
    macs: int | None = None
    bytes: int | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    device_seconds: float = 0.0
    device_time: str = WALL

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["extra"] = dict(self.extra)
        return d


class TargetSession(abc.ABC):
    """A target's compiled ops, ready to run (device memory allocated, static data
    written). `run` one op at a time, in the model's order; `close` frees everything."""

    @abc.abstractmethod
    def run(self, op: CompiledOp, node: Node, args: list[np.ndarray | None]) -> OpRun:
        """Run compiled `op` (of graph node `node`) on its inputs `args` (one per node
        input, None for an absent optional input; a `DeviceValue` for a tensor the
        session `holds`). An output may come back as a `DeviceValue` of this session."""

    def holds(self, tensor: str) -> bool:
        """Whether `tensor` lives in this session's memory between ops (the model session
        then hands it to `run` as a `DeviceValue`, writing it with `put` first when no op
        of this session produced it). False by default: every value is an array."""
        return False

    def put(self, tensor: str, value: np.ndarray) -> int:
        """Write the host's `value` of held `tensor` into this session's memory; returns
        the bytes written."""
        raise ValueError(f"{type(self).__name__} holds no tensors (put {tensor!r})")

    def fetch(self, tensor: str) -> np.ndarray:
        """The value of held `tensor`, read back to the host."""
        raise ValueError(f"{type(self).__name__} holds no tensors (fetch {tensor!r})")

    def replay(self, op: CompiledOp, node: Node, ran: OpRun) -> OpRun:
        """Take `ran`, the run of `op` in another session of the same compiled model (its
        outputs as arrays; `vdla.compiler.targets.op_parallel`), as its run here: the
        `OpRun` that `run` would have returned, with the outputs this session holds
        written into its memory. The default, for a session that holds no tensors, hands
        `ran` back."""
        return ran

    def drain_transfers(self) -> list["Transfer"]:
        """The host transfers this session made inside `run` since the last call (a
        session that packs every op's operands itself reports them here); none by
        default."""
        return []

    def run_graph(self, feed: Mapping[str, np.ndarray]) -> "GraphRun | None":
        """The graph run in one call, for a session that holds every node and runs them
        as one program (the CPU target's compiled runner); None otherwise (the default).
        `feed` has been checked (`ModelSession.run_graph`)."""
        return None

    def summary(self, stats: Sequence[OpStats]) -> dict:
        """Totals of one run for reports (JSON values), from its ops' `stats`."""
        return {}

    def close(self) -> None:
        """Free what the session holds (idempotent)."""


class Target(abc.ABC):
    """A back half (see the module docstring). Subclasses set `name` and implement
    `supports`, `compile_op` (or `compile_nodes`) and `open_session`."""

    #: The name users pick it by (``--target NAME``) and reports show.
    name: ClassVar[str]
    #: One line for `vdla targets`.
    description: ClassVar[str] = ""
    #: How its tasks can be measured by the tuner, the default first (none: not tunable).
    measure_backends: ClassVar[tuple[str, ...]] = ()
    #: Whether its ops' wall time is a simulator's rather than the device's own (reports
    #: then give no throughput from it).
    simulated: ClassVar[bool] = False
    #: Its own command-line options (``vdla run --target NAME ...``), see `from_cli`.
    cli_options: ClassVar[tuple[TargetOption, ...]] = ()
    #: How the figures it puts in `OpStats.extra` show in the per-op table (key ->
    #: column); a figure not listed shows under its key.
    extra_columns: ClassVar[Mapping[str, ExtraColumn]] = {}

    def compile_key(self) -> dict | None:
        """What, besides the graph and the schedules, decides what this target compiles
        (plain JSON data), for remembering compiled models on disk
        (`vdla.compiler.pipeline.compile_for`); None (the default): never remembered."""
        return None

    def parallel_ops(self, ops: Sequence[CompiledOp]) -> list[CompiledOp]:
        """Of its compiled `ops`, those a parallel run may run apart, each in a session of
        its own fed its inputs (`vdla.compiler.targets.op_parallel`): ops whose outputs
        and counters depend on their inputs alone. None by default: the ops run in
        order in one session."""
        return []

    def op_cost(self, op: CompiledOp) -> float | None:
        """How long `op` (one of `parallel_ops`) runs, in any unit the target's ops share,
        or None when the target cannot tell: a parallel run hands out the longest tasks
        first, so that no worker is left with a long one at the end. None by default
        (tasks go out in graph order)."""
        return None

    @classmethod
    def from_cli(cls, options: Mapping[str, Any], *, precision: str = "int8",
                 log: Callable[[str], None] | None = None) -> "Target":
        """The target built from its command-line `options` (each of `cli_options` this
        command takes, by `TargetOption.dest`: the value given, or None) for a run at
        `precision` (``int8``, ``float32``, ``float16``; the caller checks that the target
        runs it, `check_precision`); `log` takes progress lines. ValueError naming the
        option for a bad value. The default takes no options."""
        return cls()

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this target cannot run on this machine (an optional dependency missing,
        with how to install it), or None when it can."""
        return None

    @classmethod
    def left_out_by_default(cls) -> str | None:
        """Why a comparison that names no targets (``vdla compare`` without
        ``--targets``) leaves this target out, or None when it joins: by default, only
        when it cannot run here (`unavailable`)."""
        return cls.unavailable()

    @property
    def precisions(self) -> tuple[str, ...]:
        """What a run of this target can compile (`vdla.compiler.pipeline.PRECISIONS`):
        the quantized graph, and the float graph in float32 by default."""
        return ("int8", "float32")

    def check_precision(self, precision: str) -> None:
        """ValueError when this target does not run `precision`."""
        if precision not in self.precisions:
            raise ValueError(f"precision {precision} does not run on target {self.name!r} "
                             f"(it runs {', '.join(self.precisions)})")

    def describe_schedule(self, schedule: Mapping[str, Any]) -> str:
        """One of this target's schedules (as a plain dict) in a few words, for tables."""
        return " ".join(f"{k}={v}" for k, v in schedule.items())

    def check_measure(self, backend: str) -> None:
        """ValueError when this target's tasks cannot be measured on `backend` here (not
        one of `measure_backends`, or a device this machine lacks)."""
        if not self.measure_backends:
            raise ValueError(f"target {self.name!r} has no tunable ops")
        if backend not in self.measure_backends:
            raise ValueError(f"--measure {backend!r} is not one of target {self.name!r}'s "
                             f"measurement backends: {', '.join(self.measure_backends)}")

    def title(self) -> str:
        """Its settings in a few words, for the first line of a run's report."""
        return f"target {self.name}"

    def column_label(self, summary: Mapping[str, Any]) -> str:
        """Its column's heading in ``vdla compare``, given its run's `summary`."""
        return self.name

    def time_note(self, summary: Mapping[str, Any]) -> str:
        """What its ops' device times are, given its run's `summary` (``vdla compare``)."""
        return "wall time on this machine"

    def report_lines(self, summary: Mapping[str, Any]) -> list[str]:
        """Lines a run's report prints after the per-op table, from its `summary`
        (totals, where the kernels ran); none by default."""
        return []

    def estimate_column(self) -> EstimateColumn | None:
        """A column of estimates ``vdla compare`` shows beside this target's measured
        one (the GPU target's roofline on a named GPU), or None."""
        return None

    def machine(self, *, use_cache: bool = True,
                log: Callable[[str], None] | None = None) -> dict | None:
        """The machine this target's code runs on, as JSON values, for `vdla targets`
        (the CPU target's machine model: its caches, instruction sets and measured
        throughput), or None (the default): a target that describes none. `use_cache`
        False measures again what a target caches; `log` takes progress lines."""
        return None

    def machine_lines(self, machine: Mapping[str, Any]) -> list[str]:
        """`machine` (what `machine` returned) as lines for people; none by default."""
        return []

    @property
    def requant_modes(self) -> tuple[str, ...]:
        """The requantization modes (`vdla.compiler.passes.quantize.MODES`) whose
        integer ops this target runs, best first."""
        return ("multiply", "shift")

    @abc.abstractmethod
    def supports(self, node: Node, graph: Graph) -> Support:
        """Whether this target runs `node` of `graph`, and why (or why not)."""

    def capabilities(self) -> list[tuple[str, str]]:
        """(op, what it runs of it) for the ops this target can run, for `vdla targets`."""
        return []

    def options(self) -> dict:
        """This target's settings as JSON values, for reports (config, backend, ...)."""
        return {}

    def on_device(self, device: Any) -> "Target":
        """This target for `device`, an open device of another machine (`vdla run
        --remote`: a board's accelerator): the same options on the device's platform.
        ValueError by default: a target that runs on no such device."""
        raise ValueError(f"target {self.name!r} runs on no remote device; --remote runs "
                         "on an accelerator's")

    def platforms(self, count: int, *, seed: int = 0) -> list["Target"]:
        """`count` targets like this one on as many platforms, for a training set that
        spans them (`vdla.compiler.tuner.dataset`): the accelerator's hardware configs,
        say. ValueError by default: a target without platforms to draw."""
        raise ValueError(f"target {self.name!r} has no platforms to draw for a training set")

    def platform_params(self) -> dict:
        """What this target's platform is, as JSON values, for a training set's manifest:
        `options` by default."""
        return self.options()

    @classmethod
    def from_platform(cls, params: Mapping[str, Any]) -> "Target":
        """The target `platform_params` described (a training set's manifest names its
        platforms so). ValueError by default: a target without platforms."""
        raise ValueError(f"target {cls.name!r} has no platforms to rebuild from a manifest")

    def check_graph(self, graph: Graph) -> None:
        """Raise ValueError for a graph this target cannot take at all (before
        partitioning); by default every graph is fine."""

    def legalize(self, graph: Graph) -> Graph:
        """`graph` rewritten into the ops this target runs, computing the same outputs
        bit for bit (the accelerator splits a fused attention into its products and
        softmax); by default `graph` itself. `compile_model` compiles what this returns."""
        return graph

    def choose_schedules(self, graph: Graph, options: Mapping[str, Sequence[tuple[Any, Any]]]
                         ) -> dict[str, tuple[Any, Any]]:
        """node name -> the (schedule, cost) to compile it with, from `options`: each
        tuned node's recorded schedules with their costs, fastest first
        (`vdla.compiler.tuner.best_schedules`). The default takes each node's fastest; a
        target whose nodes' schedules interact (the CPU's layouts: neighbours that
        disagree pay for a conversion) weighs them together."""
        return {name: found[0] for name, found in options.items() if found}

    def compile_op(self, node: Node, graph: Graph, schedule: Any = None) -> CompiledOp:
        """Compile one node this target `supports`; `schedule` is one of this target's
        schedules (from the tuner's records) or None for its default. Raise ValueError
        for a schedule that does not fit and TypeError for one of the wrong kind."""
        raise NotImplementedError(f"target {self.name!r} compiles no single ops")

    def compile_nodes(self, graph: Graph, nodes: Sequence[Node], *,
                      schedules: Mapping[str, Any], progress: Progress | None = None,
                      start: int = 0, total: int | None = None) -> list[CompiledOp]:
        """Compile `nodes` (all of which this target supports) of `graph`, in order.
        The default compiles them one by one with `compile_op`; a target that plans
        across nodes (layouts agreed between producer and consumer, one instruction
        stream for a run of ops) overrides this. `progress` is called as each node
        starts, counting from `start` of `total`."""
        ops = []
        total = len(nodes) if total is None else total
        for i, node in enumerate(nodes):
            if progress is not None:
                progress(start + i, total, node.name)
            t0 = time.perf_counter()
            op = self.compile_op(node, graph, schedules.get(node.name))
            ops.append(dataclasses.replace(op, compile_seconds=time.perf_counter() - t0))
        return ops

    @abc.abstractmethod
    def open_session(self, graph: Graph, ops: Sequence[CompiledOp],
                     device: Any = None) -> TargetSession:
        """A session running `ops` (this target's ops of one compiled model of `graph`).
        `device` is an already open device to run on (a `vdla.runtime.Device` for the
        accelerator); None lets the target open its own."""

    def export(self, compiled: Any, out_dir: Any, *, example: Any = None,
               exact: bool = True) -> Any:
        """Write `compiled` (a `CompiledModel` of this target) into folder `out_dir` as
        something that runs without vdla (the CPU target: a C project with a Makefile)
        and return the folder's path. `example` ({tensor name: array} of every graph
        input and output, or None) is a worked example to write beside it, where the
        form has a place for one; `exact`: whether the written form reproduces its
        outputs byte for byte. Targets without such a form raise ValueError."""
        raise ValueError(f"target {self.name!r} has no stand-alone form to write")

    def tasks(self, graph: Graph) -> list:
        """The tunable tasks (`vdla.compiler.tuner.task.TuneTask`) of quantized `graph`
        on this target: one per distinct workload. None by default."""
        return []

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({options})"
