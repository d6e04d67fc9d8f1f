"""The accelerator as a target: which nodes it runs, compiling them, and running them on a
device (the functional simulator, the cycle-accurate Verilator model, or a board).

    target = VdlaTarget(config, backend="verilator")     # or get("vdla", config=...)
    compiled = compile_model(quantized, target)          # vdla.compiler.targets.model
    with compiled.session() as session:                  # opens a device of `backend`
        result = session.run({"input": x})

`VdlaTarget.supports` is the one decision of what runs here: what the node is
(`vdla.compiler.targets.vdla.support.describe`), then what only the lowering knows
(pads, dilation, constant weights, a schedule that fits the buffers). Every node it
accepts is lowered with `lower_conv2d`, `lower_pool2d` or `lower_elementwise` (the
schedule from the tuner's records, else the timing model's pick), and its weights,
constants and micro-ops are packed once.

A session allocates DRAM for every op's arena and program and writes the static data
once; each run writes only the activations an op reads, runs its program and reads its
output back. The ops run one after the other: the host packs and unpacks activations
between them (its NCHW <-> NCHW{b}n{c}c conversion is the host side of the DMA, as on a
board).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

import vdla.runtime
from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.base import CompiledOp, OpRun, OpStats, Support, Target, TargetSession
from vdla.compiler.targets.vdla.conv2d import LoweredConv2d, lower_conv2d
from vdla.compiler.targets.vdla.cost import choose_pool2d
from vdla.compiler.targets.vdla.elementwise import (ELEMENTWISE_OPS, LoweredElementwise,
                                                    choose_elementwise, elementwise_layer,
                                                    lower_elementwise)
from vdla.compiler.targets.vdla.estimate import estimate_graph
from vdla.compiler.targets.vdla.layers import POOL_OPS, conv2d_layer, pool2d_layer
from vdla.compiler.targets.vdla.pool import LoweredPool2d, lower_pool2d
from vdla.compiler.targets.vdla.schedules import (Conv2dSchedule, ElementwiseSchedule,
                                                  Pool2dSchedule)
from vdla.compiler.targets.vdla.support import describe
from vdla.compiler.targets.vdla.tuning import BACKENDS as TUNE_BACKENDS
from vdla.compiler.targets.vdla.tuning import conv_tasks
from vdla.config import AluOp, HardwareConfig

__all__ = ["GEMM_OPS", "VdlaKernel", "VdlaTarget"]

#: The integer GEMM ops the accelerator runs (pools: `POOL_OPS`).
GEMM_OPS = ("qconv2d", "qdense")


@dataclasses.dataclass(frozen=True, eq=False)
class VdlaKernel:
    """A compiled op on the accelerator: the lowered program (`LoweredConv2d` or
    `LoweredPool2d`, `LoweredElementwise`) and the arena regions written once per session
    ({region: array})."""

    lowered: LoweredConv2d | LoweredPool2d | LoweredElementwise
    static: Mapping[str, np.ndarray]


class VdlaTarget(Target):
    """The accelerator described by `config`.

    config : the `vdla.HardwareConfig` programs are encoded for (default: VTA's default)
    backend : the device a session opens when it is given none: ``functional`` or
        ``verilator`` (`vdla.runtime.BACKENDS`)
    device_options : passed to `vdla.runtime.open` (for example ``dram=`` a board's
        `DramTiming`, ``log=``)
    """

    name = "vdla"
    description = ("the accelerator: int8 GEMM core and vector ALU over on-chip SRAMs, "
                   "simulated (functional or Verilator) or on a board")
    measure_backends = TUNE_BACKENDS
    simulated = True      # (or a board, whose ops still report the simulator-side wall)

    def __init__(self, config: HardwareConfig | None = None, *, backend: str = "verilator",
                 **device_options):
        config = HardwareConfig() if config is None else config
        if not isinstance(config, HardwareConfig):
            raise TypeError(f"VdlaTarget: config must be a vdla.HardwareConfig, not "
                            f"{type(config).__name__}")
        if backend not in vdla.runtime.BACKENDS:
            raise ValueError(f"VdlaTarget: unknown backend {backend!r}; available: "
                             f"{', '.join(vdla.runtime.BACKENDS)}")
        self.config, self.backend, self.device_options = config, backend, dict(device_options)

    @property
    def requant_modes(self) -> tuple[str, ...]:
        # A multiplier needs the ALU's MUL; shifts run on every config.
        return ("multiply", "shift") if AluOp.MUL in self.config.alu_ops else ("shift",)

    def options(self) -> dict:
        dram = self.device_options.get("dram")
        return {"config": self.config.name, "backend": self.backend,
                "clock_mhz": self.config.clock_mhz,
                "dram": None if dram is None else dataclasses.asdict(dram)}

    def capabilities(self) -> list[tuple[str, str]]:
        c = self.config
        mul = "with" if AluOp.MUL in c.alu_ops else "without"
        return [
            ("qconv2d", f"any groups (per-group GEMMs; depthwise with diagonal weight "
                        f"blocks), pads up to the kernel size - 1 and 15; on the "
                        f"{c.batch}x{c.block_in}x{c.block_out} GEMM core, bias, "
                        f"requantization ({mul} MUL), residual add and clamp on the ALU"),
            ("qdense", "as a 1x1 convolution over a 1x1 image"),
            ("max_pool2d", "int8: ALU MAX over the window"),
            ("qavg_pool2d", "window sums on the GEMM core, requantization on the ALU"),
            ("qglobal_avg_pool2d", "as an average pool over the whole image"),
            ("relu", "standalone, on int8: an identity-weight GEMM widens it, ALU MAX 0"),
            ("qadd", f"standalone: two int8 activations of one shape (no broadcasting) or "
                     f"one and a zero constant (rescale, clip); identity-weight GEMMs widen "
                     f"them, requantization ({mul} MUL), add and clamp on the ALU"),
        ]

    def check_graph(self, graph: Graph) -> None:
        packed = [(name, t.layout) for name, t in graph.tensors.items() if t.layout]
        if packed:
            name, layout = packed[0]
            raise ValueError(f"the vdla target takes a graph in plain layouts (NCHW, NC, OIHW), "
                             f"as quantize returns it; tensor {name!r} has layout {layout!r} "
                             f"({len(packed)} packed tensor(s)): the back half packs by "
                             "itself, do not pack_graph first")

    # --- what runs here -----------------------------------------------------------------

    def supports(self, node: Node, graph: Graph) -> Support:
        ok, reason = describe(node, graph, self.config)
        if not ok:
            return Support(False, reason)
        try:
            self._check_lowerable(node, graph)
        except ValueError as exc:
            return Support(False, str(exc))
        return Support(True, reason)

    def _check_lowerable(self, node: Node, graph: Graph):
        """What only the lowering knows; ValueError naming the problem. A convolution has
        a schedule that fits when its smallest tiling fits (a larger tile never needs
        less of any buffer), which is cheap to check; the pool's default chooser is
        quicker than counting the smallest tiling's micro-ops (one tile per output
        entry), and it is cached for the compilation that follows."""
        if node.op in POOL_OPS:
            layer, _, _ = pool2d_layer(node, graph, self.config)
            choose_pool2d(layer, self.config)
            return
        if node.op in ELEMENTWISE_OPS:   # shapes, a zero constant, a schedule that fits
            layer, _ = elementwise_layer(node, graph, self.config)
            choose_elementwise(layer, self.config)
            return
        # The arena holds the weights and bias written once: computed ones would need a
        # host-to-DRAM copy per run, which this back half does not do.
        if graph.constant(node.inputs[1]) is None:
            raise ValueError(f"{node.op} node {node.name!r}: its weights {node.inputs[1]!r} are "
                             "computed at run time; the back half needs constant weights")
        if node.input(2) and graph.constant(node.input(2)) is None:
            raise ValueError(f"{node.op} node {node.name!r}: its bias {node.input(2)!r} is "
                             "computed at run time; the back half needs a constant bias")
        layer, _ = conv2d_layer(node, graph, self.config)
        Conv2dSchedule(1, 1, 1, 1).check(layer, self.config)

    # --- compiling -----------------------------------------------------------------------

    def compile_op(self, node: Node, graph: Graph, schedule: Any = None) -> CompiledOp:
        kind = (Pool2dSchedule if node.op in POOL_OPS else
                ElementwiseSchedule if node.op in ELEMENTWISE_OPS else Conv2dSchedule)
        if schedule is not None and not isinstance(schedule, kind):
            raise TypeError(f"the schedule of {node.name!r} ({node.op}) must be a "
                            f"{kind.__name__}, not {type(schedule).__name__}")
        if node.op in POOL_OPS:
            lowered = lower_pool2d(node, graph, self.config, schedule)
            static = lowered.static_data()
        elif node.op in ELEMENTWISE_OPS:
            lowered = lower_elementwise(node, graph, self.config, schedule)
            static = lowered.static_data()
        else:
            lowered = lower_conv2d(node, graph, self.config, schedule)
            bias = graph.constant(node.input(2)) if node.input(2) else None
            static = lowered.static_data(graph.constant(node.inputs[1]), bias)
        return CompiledOp(node.name, node.op, self.name, "",
                          dataclasses.asdict(lowered.schedule), VdlaKernel(lowered, static))

    # --- running -------------------------------------------------------------------------

    def open_session(self, graph: Graph, ops: Sequence[CompiledOp],
                     device: Any = None) -> "VdlaSession":
        return VdlaSession(self, graph, ops, device)

    # --- estimating ----------------------------------------------------------------------

    def estimate(self, graph: Graph, *, schedules: Mapping[str, Any] | None = None) -> list:
        """The timing model's cycles of every node of `graph` this target would run,
        without lowering (`vdla.compiler.targets.vdla.estimate.estimate_graph`; a design
        sweep's figure per point): a list of `OpEstimate` in graph order."""
        return estimate_graph(graph, self, schedules=schedules)

    # --- tuning --------------------------------------------------------------------------

    def tasks(self, graph: Graph) -> list:
        return conv_tasks(graph, self)


@dataclasses.dataclass
class _Placed:
    """An op placed in DRAM: its arena and its relocated program."""

    arena: int
    insn_addr: int
    insn_count: int


class VdlaSession(TargetSession):
    """The accelerator's ops of a compiled model resident on a device.

    target : the `VdlaTarget`
    graph : the compiled graph
    ops : its `CompiledOp` s on this target
    device : an open `vdla.runtime.Device` of the target's config, or None to open one
        of the target's backend (closed with the session; a given one stays open)
    Allocates every op's arena and program and writes the static data now.
    """

    def __init__(self, target: VdlaTarget, graph: Graph, ops: Sequence[CompiledOp],
                 device: Any = None):
        self.target, self.graph = target, graph
        config = target.config
        if device is not None and getattr(device, "config", None) != config:
            raise ValueError(f"the model is compiled for config {config.name}; the device has "
                             f"{getattr(getattr(device, 'config', None), 'name', device)!r}")
        self._own = device is None
        self.device = device if device is not None else vdla.runtime.open(
            config, backend=target.backend, **target.device_options)
        self._placed: dict[str, _Placed] = {}
        self._allocated: list[int] = []
        try:
            for op in ops:
                self._placed[op.name] = self._place(op.kernel)
        except BaseException:
            self.close()
            raise

    def _place(self, kernel: VdlaKernel) -> _Placed:
        lowered, dev = kernel.lowered, self.device
        arena = dev.alloc(lowered.arena_bytes)
        self._allocated.append(arena)
        for region, array in kernel.static.items():
            if array.nbytes:
                dev.write(arena + lowered.regions[region].offset, array)
        insn_addr, count = dev.load_program(lowered.relocate(arena))
        self._allocated.append(insn_addr)
        return _Placed(arena, insn_addr, count)

    def close(self):
        device, self.device = self.device, None
        if device is None:
            return
        for addr in self._allocated:
            device.free(addr)
        self._allocated, self._placed = [], {}
        if self._own:
            device.close()

    def run(self, op: CompiledOp, node: Node, args) -> OpRun:
        if self.device is None:
            raise ValueError("the vdla session is closed")
        lowered, dev, placed = op.kernel.lowered, self.device, self._placed[op.name]
        if isinstance(lowered, LoweredPool2d):
            data = lowered.input_data(args[0])
        elif isinstance(lowered, LoweredElementwise):
            data = lowered.input_data(*args)   # a zero constant operand is not written
        else:
            data = lowered.input_data(args[0], args[3] if len(args) > 3 else None)
        for region, array in data.items():
            if array.nbytes:
                dev.write(placed.arena + lowered.regions[region].offset, array)
        stats = dev.run(placed.insn_addr, placed.insn_count)
        out = lowered.regions["output"]
        y = lowered.unpack_output(dev.read(placed.arena + out.offset, out.nbytes))
        cycles = stats.get("cycles")
        macs = lowered.layer.macs
        config = self.target.config
        util = macs / (int(cycles) * config.macs_per_cycle) if cycles and macs else None
        return OpRun([y], None if cycles is None else int(cycles), macs,
                     int(stats["dram_bytes_read"]) + int(stats["dram_bytes_written"]),
                     {"gemm_utilization": util})

    def summary(self, stats: Sequence[OpStats]) -> dict:
        """The backend; the total cycles of this target's ops (None on a backend without
        cycles) and their time at the config's clock; ``macs``, the useful MACs of its
        ops (the layers' own sizes, no block padding; pools do none); and
        ``gemm_utilization``, those MACs over the total cycles times the GEMM core's peak
        MACs per cycle (batch x block_in x block_out). The cycles are every program's on
        the accelerator, pools and epilogues included; ops on the host and the host's
        packing between ops are not counted. None without cycles or MACs."""
        config = self.target.config
        cycles = [s.cycles for s in stats]
        total = None if not cycles or None in cycles else int(sum(cycles))
        macs = sum(s.macs or 0 for s in stats)
        util = macs / (total * config.macs_per_cycle) if total and macs else None
        return {"backend": None if self.device is None else self.device.backend,
                "cycles": total, "clock_mhz": config.clock_mhz,
                "seconds_at_clock": None if total is None else total / (config.clock_mhz * 1e6),
                "macs": macs, "macs_per_cycle": config.macs_per_cycle,
                "gemm_utilization": util}
