"""Whole quantized models on the accelerator: compile once, run many times.

    compiled = compile_model(quantized_graph, config)          # lower every GEMM node
    with compiled.session(vdla.runtime.open(config, backend="verilator")) as session:
        result = session.run({"input": x})                     # outputs + per-op stats

`compile_model` walks the graph in topological order. Every ``qconv2d``/``qdense`` node
is lowered with `lower_conv2d`, every pool (``max_pool2d`` on int8, ``qavg_pool2d``,
``qglobal_avg_pool2d``) with `lower_pool2d`, each with its schedule from `schedules`,
else the default chooser; their weights, constants and micro-ops are packed once. A node
the back half cannot lower (the lowering raises ValueError: groups, dilation, pads >=
kernel, a multiplier without the MUL, float data, a schedule that does not fit) becomes
a host op with that message as its reason. Every other node is a host op: it runs the
numpy reference kernel (`vdla.compiler.reference.KERNELS`), so host ops are bit-exact
by construction; its reason is the one `vdla.compiler.partition.vdla_supports` gives,
the single description of what the back half runs.

A `Session` allocates DRAM for every vdla op's arena and program once and writes the
static data (micro-ops, constant rows, weights) once; each `Session.run` writes only the
activations each op reads, runs the op's program, and reads its output back. The ops
run one after the other: the host packs and unpacks activations between them (its
NCHW <-> NCHW{b}n{c}c conversion is the host side of the DMA, as on a board).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Mapping

import numpy as np

from vdla.compiler.backend.conv2d import Conv2dSchedule, LoweredConv2d, lower_conv2d
from vdla.compiler.backend.pool import POOL_OPS, LoweredPool2d, Pool2dSchedule, lower_pool2d
from vdla.compiler.graph import DTYPES, Graph, Node
from vdla.compiler.partition import vdla_supports
from vdla.compiler.reference import check_inputs as check_feed
from vdla.config import HardwareConfig

__all__ = ["CompiledModel", "CompiledOp", "OpStats", "RunResult", "Session", "check_feed",
           "compile_model"]

VDLA = "vdla"
HOST = "host"

#: Ops the back half lowers to vdla programs (the rest run on the host).
_GEMM_OPS = ("qconv2d", "qdense")
_LOWERED_OPS = _GEMM_OPS + POOL_OPS

Progress = Callable[[int, int, str], None]


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledOp:
    """One node of a compiled model.

    name, op : the graph node's name and operator
    target : ``"vdla"`` (a lowered program) or ``"host"`` (the reference kernel)
    reason : why it runs there (for a host op: what the back half lacks)
    lowered : the `LoweredConv2d` or `LoweredPool2d` of a vdla op, else None
    static : a vdla op's arena regions written once per session ({region: array})
    compile_seconds : wall time spent lowering and packing it
    """

    name: str
    op: str
    target: str
    reason: str
    lowered: LoweredConv2d | LoweredPool2d | None = None
    static: Mapping[str, np.ndarray] | None = None
    compile_seconds: float = 0.0

    @property
    def schedule(self) -> dict | None:
        """The vdla op's schedule as a dict (tile_h, tile_w, tile_ci, tile_co,
        oc_nthread, h_nthread; a pool's tile_h, tile_w, tile_c), or None for a host op."""
        return dataclasses.asdict(self.lowered.schedule) if self.lowered is not None else None


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledModel:
    """A quantized graph compiled for `config`: `ops` in execution (topological) order,
    and the total `compile_seconds`. `session(device)` runs it."""

    graph: Graph
    config: HardwareConfig
    ops: tuple[CompiledOp, ...]
    compile_seconds: float

    @property
    def vdla_ops(self) -> list[CompiledOp]:
        return [op for op in self.ops if op.target == VDLA]

    @property
    def host_ops(self) -> list[CompiledOp]:
        return [op for op in self.ops if op.target == HOST]

    def session(self, device) -> "Session":
        """A `Session` of this model on `device` (a `vdla.runtime.Device` of the same
        config); it allocates and writes the static DRAM contents now."""
        return Session(self, device)


def _check_plain_layouts(graph: Graph):
    packed = [(name, t.layout) for name, t in graph.tensors.items() if t.layout]
    if packed:
        name, layout = packed[0]
        raise ValueError(f"compile_model takes a graph in plain layouts (NCHW, NC, OIHW), as "
                         f"quantize returns it; tensor {name!r} has layout {layout!r} "
                         f"({len(packed)} packed tensor(s)): the back half packs by itself, "
                         "do not pack_graph first")


def _lower(node: Node, graph: Graph, config: HardwareConfig,
           schedule) -> tuple[LoweredConv2d | LoweredPool2d, dict, str]:
    """Lower a GEMM or pool node and pack its static data: (lowered, static data, what
    runs where); ValueError when it cannot run on vdla."""
    if node.op in POOL_OPS:
        lowered = lower_pool2d(node, graph, config, schedule)
        what = ("int8 max pooling: ALU MAX over the window" if node.op == "max_pool2d" else
                "int8 average pooling: window sum on the GEMM core, requantization on the "
                "ALU")
        return lowered, lowered.static_data(), what
    weights = graph.constant(node.inputs[1])
    bias_name = node.input(2)
    bias = graph.constant(bias_name) if bias_name else None
    # The arena holds the weights and bias written once: computed ones would need a
    # host-to-DRAM copy per run, which this back half does not do.
    if weights is None:
        raise ValueError(f"{node.op} node {node.name!r}: its weights {node.inputs[1]!r} are "
                         "computed at run time; the back half needs constant weights")
    if bias_name and bias is None:
        raise ValueError(f"{node.op} node {node.name!r}: its bias {bias_name!r} is computed "
                         "at run time; the back half needs a constant bias")
    lowered = lower_conv2d(node, graph, config, schedule)
    what = "convolution" if node.op == "qconv2d" else "matrix product"
    return (lowered, lowered.static_data(weights, bias),
            f"int8 {what} on the GEMM core, epilogue on the ALU")


def compile_model(graph: Graph, config: HardwareConfig, *,
                  schedules: Mapping[str, Conv2dSchedule] | None = None,
                  progress: Progress | None = None) -> CompiledModel:
    """Compile quantized `graph` for `config`.

    graph : a quantized `Graph` in plain layouts (as `vdla.compiler.quantize` returns it;
        not modified)
    config : the `vdla.HardwareConfig` the programs are encoded for
    schedules : node name -> `Conv2dSchedule` (qconv2d/qdense nodes) or `Pool2dSchedule`
        (pool nodes) for the nodes that should not use the default chooser
    progress : called as each node starts, with (nodes done, total nodes, node name)
    Returns a `CompiledModel`. A GEMM or pool node that cannot be lowered becomes a host
    op whose reason is the lowering's message. Raises ValueError for a packed graph or a
    schedule naming a node that is not a GEMM or pool node of the graph, TypeError for
    wrong argument types (a Pool2dSchedule for a GEMM node, and the reverse).
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"compile_model: graph must be a vdla.compiler.Graph, not "
                        f"{type(graph).__name__}")
    if not isinstance(config, HardwareConfig):
        raise TypeError(f"compile_model: config must be a vdla.HardwareConfig, not "
                        f"{type(config).__name__}")
    _check_plain_layouts(graph)
    nodes = graph.nodes()
    schedules = dict(schedules or {})
    lowered_ops = {n.name: n.op for n in nodes if n.op in _LOWERED_OPS}
    unknown = sorted(set(schedules) - set(lowered_ops))
    if unknown:
        raise ValueError(f"compile_model: schedules name {unknown}, which are not qconv2d/"
                         f"qdense/pool nodes of graph {graph.name!r} (those are: "
                         f"{', '.join(sorted(lowered_ops)) or 'none'})")
    for name, schedule in schedules.items():
        kind = Pool2dSchedule if lowered_ops[name] in POOL_OPS else Conv2dSchedule
        if not isinstance(schedule, kind):
            raise TypeError(f"compile_model: the schedule of {name!r} ({lowered_ops[name]}) "
                            f"must be a {kind.__name__}, not {type(schedule).__name__}")
    start = time.perf_counter()
    ops = []
    for i, node in enumerate(nodes):
        if progress is not None:
            progress(i, len(nodes), node.name)
        t0 = time.perf_counter()
        if node.op in _LOWERED_OPS:
            try:
                lowered, static, what = _lower(node, graph, config, schedules.get(node.name))
            except ValueError as exc:
                ops.append(CompiledOp(node.name, node.op, HOST, str(exc),
                                      compile_seconds=time.perf_counter() - t0))
                continue
            ops.append(CompiledOp(node.name, node.op, VDLA, what, lowered, static,
                                  time.perf_counter() - t0))
        else:
            ops.append(CompiledOp(node.name, node.op, HOST,
                                  vdla_supports(node, graph, config)[1],
                                  compile_seconds=time.perf_counter() - t0))
    return CompiledModel(graph, config, tuple(ops), time.perf_counter() - start)


# --- running -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class OpStats:
    """What one op of a run did.

    name, op, target, reason : as in `CompiledOp`
    schedule : the vdla op's schedule as a dict, None on the host
    cycles : accelerator cycles (Verilator backend), None on functional or the host
    gemm_utilization : useful MACs / (cycles x MACs per cycle), None without cycles or
        without useful MACs (pools)
    dram_bytes : bytes the accelerator read plus wrote, None on the host
    macs : useful multiply-accumulates of a vdla op (0 for a pool), None on the host
    wall_seconds : host wall time of the op (writes, run, read back; or the kernel)
    """

    name: str
    op: str
    target: str
    reason: str
    schedule: dict | None
    cycles: int | None
    gemm_utilization: float | None
    dram_bytes: int | None
    macs: int | None
    wall_seconds: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RunResult:
    """The result of `Session.run`.

    outputs : graph output name -> array
    ops : one `OpStats` per op, in execution order
    cycles : sum of the vdla ops' cycles (None on a backend without cycles)
    seconds_at_clock : cycles at the config's clock (None without cycles)
    wall_seconds : host wall time of the whole run
    values : every tensor of the run (only with ``run(..., keep=True)``), else None
    """

    outputs: dict[str, np.ndarray]
    ops: tuple[OpStats, ...]
    cycles: int | None
    seconds_at_clock: float | None
    wall_seconds: float
    values: dict[str, np.ndarray] | None = None


@dataclasses.dataclass
class _Placed:
    """A vdla op placed in DRAM: its arena and its relocated program."""

    arena: int
    insn_addr: int
    insn_count: int


class Session:
    """A compiled model resident on a device.

    compiled : a `CompiledModel`
    device : a `vdla.runtime.Device` opened for ``compiled.config``
    Allocates every vdla op's arena and program and writes the static data now;
    `run(feed)` runs the model; `close()` (or leaving a ``with`` block) frees the DRAM.
    The device stays open: its owner closes it.
    """

    def __init__(self, compiled: CompiledModel, device):
        if not isinstance(compiled, CompiledModel):
            raise TypeError(f"Session: compiled must be a CompiledModel, not "
                            f"{type(compiled).__name__}")
        config = getattr(device, "config", None)
        if config != compiled.config:
            raise ValueError(f"Session: the model is compiled for config "
                             f"{compiled.config.name}; the device has "
                             f"{getattr(config, 'name', config)!r}")
        self.compiled, self.device = compiled, device
        self._placed: dict[str, _Placed] = {}
        self._allocated: list[int] = []
        try:
            for op in compiled.vdla_ops:
                self._placed[op.name] = self._place(op)
        except BaseException:
            self.close()
            raise

    def _place(self, op: CompiledOp) -> _Placed:
        lowered, dev = op.lowered, self.device
        arena = dev.alloc(lowered.arena_bytes)
        self._allocated.append(arena)
        for region, array in op.static.items():
            if array.nbytes:
                dev.write(arena + lowered.regions[region].offset, array)
        insn_addr, count = dev.load_program(lowered.relocate(arena))
        self._allocated.append(insn_addr)
        return _Placed(arena, insn_addr, count)

    @property
    def closed(self) -> bool:
        return self.device is None

    def close(self):
        """Free the session's DRAM (idempotent)."""
        device, self.device = self.device, None
        if device is not None:
            for addr in self._allocated:
                device.free(addr)
        self._allocated, self._placed = [], {}

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc):
        self.close()

    def run(self, feed: Mapping[str, np.ndarray], *, progress: Progress | None = None,
            keep: bool = False) -> RunResult:
        """Run the model once.

        feed : graph input name -> array (checked like `run_reference`'s inputs)
        progress : called as each op starts, with (ops done, total ops, op name)
        keep : also return every intermediate tensor in `RunResult.values`
        Returns a `RunResult`. Raises ValueError for a bad feed or a closed session, and
        the simulator's errors (`vdla.sim.SimError`) for a program that cannot complete.
        """
        if self.closed:
            raise ValueError("Session.run: the session is closed")
        from vdla.compiler.reference import KERNELS, _load_extensions
        _load_extensions()
        graph, config = self.compiled.graph, self.compiled.config
        values = check_feed(graph, feed)
        for name, t in graph.tensors.items():
            if t.is_constant:
                values[name] = t.data
        stats, total_cycles, has_cycles = [], 0, True
        ops = self.compiled.ops
        start = time.perf_counter()
        for i, op in enumerate(ops):
            if progress is not None:
                progress(i, len(ops), op.name)
            node = graph.node(op.name)
            t0 = time.perf_counter()
            if op.target == VDLA:
                y, run_stats = self._run_vdla(op, node, values)
                cycles = run_stats.get("cycles")
                has_cycles &= cycles is not None
                total_cycles += int(cycles or 0)
                macs = op.lowered.layer.macs
                util = (macs / (int(cycles) * config.macs_per_cycle) if cycles and macs
                        else None)
                dram = int(run_stats["dram_bytes_read"]) + int(run_stats["dram_bytes_written"])
                results = [y]
            else:
                fn = KERNELS.get(op.op)
                if fn is None:
                    raise ValueError(f"node {op.name!r}: no host kernel for op {op.op!r}")
                results = fn(node, [values[t] if t else None for t in node.inputs], graph)
                cycles = util = dram = macs = None
            for out, value in zip(node.outputs, results):
                values[out] = np.asarray(value).astype(DTYPES[graph.tensors[out].dtype],
                                                       copy=False)
            stats.append(OpStats(op.name, op.op, op.target, op.reason, op.schedule,
                                 None if cycles is None else int(cycles), util, dram, macs,
                                 time.perf_counter() - t0))
        wall = time.perf_counter() - start
        cycles = total_cycles if has_cycles and self.compiled.vdla_ops else None
        return RunResult({name: values[name] for name in graph.outputs}, tuple(stats), cycles,
                         None if cycles is None else cycles / (config.clock_mhz * 1e6), wall,
                         values if keep else None)

    def _run_vdla(self, op: CompiledOp, node: Node, values: dict) -> tuple[np.ndarray, dict]:
        lowered, dev, placed = op.lowered, self.device, self._placed[op.name]
        if isinstance(lowered, LoweredPool2d):
            data = lowered.input_data(values[node.inputs[0]])
        else:
            residual = values[node.input(3)] if node.input(3) else None
            data = lowered.input_data(values[node.inputs[0]], residual)
        for region, array in data.items():
            if array.nbytes:
                dev.write(placed.arena + lowered.regions[region].offset, array)
        run_stats = dev.run(placed.insn_addr, placed.insn_count)
        out = lowered.regions["output"]
        return lowered.unpack_output(dev.read(placed.arena + out.offset, out.nbytes)), run_stats
