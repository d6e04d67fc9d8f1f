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

Activations stay in DRAM (`vdla.compiler.targets.vdla.placement`) on every config with
batch 1 and on every config whose blocks agree: `compile_nodes` plans one buffer per
tensor in the blocked layout (blocks of max(block_in, block_out) channels), concats along
channels and flattens are views of those buffers (no program), and every op's LOADs and
STOREs of activations are relocated into the placements. The session writes a tensor
only when no accelerator op produced it (a model input after ``quantize``, a host op's
output) and reads one back only for a host op or a model output: between two
accelerator ops the host does nothing. With batch > 1 and blocks that differ the session
packs every op's inputs into its own arena and unpacks its output after it, and reports
those moves as transfers between accelerator ops.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping, Sequence

import vdla.runtime
from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.base import CompiledOp, Progress, Support, Target
from vdla.compiler.targets.vdla.attention import split_attention
from vdla.compiler.targets.vdla.channel_map import carries_map, map_problem, physical_node
from vdla.compiler.targets.vdla.command_line import VdlaCommandLine
from vdla.compiler.targets.vdla.conv import lower_conv2d
from vdla.compiler.targets.vdla.conv_layer import conv2d_layer
from vdla.compiler.targets.vdla.conv_schedule import Conv2dSchedule
from vdla.compiler.targets.vdla.elementwise import (ELEMENTWISE_OPS, ElementwiseSchedule,
                                                    choose_elementwise, elementwise_layer,
                                                    lower_elementwise)
from vdla.compiler.targets.vdla.estimate import estimate_graph, estimate_node
from vdla.compiler.targets.vdla.export import export_model
from vdla.compiler.targets.vdla.kernel import VdlaKernel, activation_regions
from vdla.compiler.targets.vdla.placement import (VIEW_OPS, BufferPlan, concat_conflicts,
                                                  concat_view_problem, view_problem,
                                                  plan_buffers, resident)
from vdla.compiler.targets.vdla.platforms import sample_configs
from vdla.compiler.targets.vdla.row_padding import pad_sequences
from vdla.compiler.targets.vdla.softmax import (SoftmaxSchedule, choose_softmax,
                                                lower_softmax, softmax_layer)
from vdla.compiler.targets.vdla.pool import (POOL_OPS, Pool2dSchedule, choose_pool2d,
                                             lower_pool2d, pool2d_layer)
from vdla.compiler.targets.vdla.session import VdlaSession
from vdla.compiler.targets.vdla.support import describe
from vdla.compiler.targets.vdla.tap_pack import tap_packs
from vdla.compiler.targets.vdla.tuning import BACKENDS as TUNE_BACKENDS
from vdla.compiler.targets.vdla.tuning import conv_tasks
from vdla.config import AluOp, HardwareConfig
from vdla.sim.verilator.build import tool_versions

__all__ = ["GEMM_OPS", "VdlaKernel", "VdlaSession", "VdlaTarget", "activation_regions"]

#: The integer GEMM ops the accelerator runs (pools: `POOL_OPS`).
GEMM_OPS = ("qconv2d", "qdense", "qmatmul")


_VIEW_REASONS = {
    "concat": "a view: concat parts are written into slices of one DRAM buffer by their "
              "producers",
    "slice": "a view: whole channel blocks of the sequence's DRAM buffer, read in place",
    "flatten": "a view: the dense layer reads its input's DRAM buffer in place",
}


def _activations(graph: Graph, nodes: Sequence[Node]) -> dict[str, list[str]]:
    """Node name -> the activations it reads and writes, in order: its data input, a
    convolution's residual, elementwise operands, views' inputs, outputs (not weights,
    biases or other constants)."""
    def operands(n: Node) -> list[str]:
        if n.op == "qmatmul":      # both operands are activations
            return list(n.inputs[:2])
        return [n.inputs[0], n.input(3)] if n.op in GEMM_OPS else list(n.inputs)
    return {n.name: [t for t in operands(n) + list(n.outputs)
                     if t and not graph.tensors[t].is_constant] for n in nodes}


def _tap_packs(graph: Graph, nodes: Sequence[Node], config: HardwareConfig) -> dict:
    """Tensor -> `TapPack` of the host-written inputs that a convolution among `nodes`
    reads with kernel columns packed into channels (`vdla.compiler.targets.vdla.tap_pack`)."""
    packs = {}
    for node in nodes:
        # Only a host-written input can be packed: the layer (which the timing model
        # picks among the packings) is built for those convolutions alone.
        if node.op == "qconv2d" and tap_packs(node, graph, config):
            tp = conv2d_layer(node, graph, config)[0].packed
            if tp is not None:
                packs[node.inputs[0]] = tp
    return packs


def _planned_shapes(graph: Graph, nodes: Sequence[Node], config: HardwareConfig) -> Graph:
    """`graph`, or a copy of it whose tap-packed inputs have their packed shape: the
    shape their DRAM buffers hold (the host writes the packed form, `VdlaSession.put`)."""
    packs = _tap_packs(graph, nodes, config)
    if not packs:
        return graph
    planned = graph.copy()
    for name, tp in packs.items():
        t = planned.tensors[name]
        planned.tensors[name] = dataclasses.replace(t, shape=tp.packed_shape(t.shape[0],
                                                                             t.shape[2]))
    return planned


class VdlaTarget(VdlaCommandLine, Target):
    """The accelerator described by `config`.

    config : the `vdla.HardwareConfig` programs are encoded for (default: VTA's default)
    backend : the device a session opens when it is given none: ``functional`` or
        ``verilator`` (`vdla.runtime.BACKENDS`)
    board : the `vdla.boards.Board` the config is for, or None: reports name it (its
        config and memory timing are given as `config` and ``dram=``)
    device_options : passed to `vdla.runtime.open` (for example ``dram=`` a board's
        `DramTiming`, ``log=``)

    Its command-line options and report lines: `VdlaCommandLine`.
    """

    name = "vdla"
    description = ("the accelerator: int8 GEMM core and vector ALU over on-chip SRAMs, "
                   "simulated (functional or Verilator) or on a board")
    measure_backends = TUNE_BACKENDS
    simulated = True      # (or a board, whose ops still report the simulator-side wall)

    def __init__(self, config: HardwareConfig | None = None, *, backend: str = "verilator",
                 board: Any = None, **device_options):
        config = HardwareConfig() if config is None else config
        if not isinstance(config, HardwareConfig):
            raise TypeError(f"VdlaTarget: config must be a vdla.HardwareConfig, not "
                            f"{type(config).__name__}")
        if backend not in vdla.runtime.BACKENDS:
            raise ValueError(f"VdlaTarget: unknown backend {backend!r}; available: "
                             f"{', '.join(vdla.runtime.BACKENDS)}")
        self.config, self.backend, self.device_options = config, backend, dict(device_options)
        self.board = board
        # What a device of its own (`on_device`: a `vdla serve` at --remote) says it is
        # ("remote functional"); None: the session opens a `backend` device here.
        self.device_backend: str | None = None
        # (graph, its size, concat refusals, the views' plan) of the last graph asked about
        self._views_cache = None

    @property
    def requant_modes(self) -> tuple[str, ...]:
        # A multiplier needs the ALU's MUL; shifts run on every config.
        return ("multiply", "shift") if AluOp.MUL in self.config.alu_ops else ("shift",)

    def options(self) -> dict:
        # A run on a device of its own ran there, whatever `backend` says, and this
        # machine's memory timing (a board's DRAM on the local model) played no part in it.
        dram = None if self.device_backend else self.device_options.get("dram")
        return {"config": self.config.name, "backend": self.device_backend or self.backend,
                "clock_mhz": self.config.clock_mhz,
                "board": None if self.board is None else self.board.name,
                "dram": None if dram is None else dataclasses.asdict(dram)}

    def export(self, compiled, out_dir, *, example=None, exact: bool = True):
        """The model as a device script that plays on any device of this config, a
        board's included, without the compiler (`vdla.compiler.targets.vdla.export`):
        ``model.json`` and ``model.npz``, and with `example` its inputs and outputs as
        ``example.npz``. ValueError for a model with host ops between accelerator ops."""
        return export_model(compiled, out_dir, example)

    def on_device(self, device) -> "VdlaTarget":
        """This target on `device`'s config (the board's bitstream's), its options kept;
        its options and title name the device's backend (`device.backend`)."""
        target = VdlaTarget(device.config, backend=self.backend, **self.device_options)
        target.device_backend = device.backend
        return target

    def platforms(self, count: int, *, seed: int = 0) -> list["VdlaTarget"]:
        """Targets on `count` configs drawn from `CONFIG_SPACE` over this one's config
        (`sample_configs`), with this one's backend and options."""
        return [VdlaTarget(config, backend=self.backend, board=self.board,
                           **self.device_options)
                for config in sample_configs(count, seed=seed, base=self.config)]

    @classmethod
    def from_platform(cls, params) -> "VdlaTarget":
        try:
            config = HardwareConfig.from_dict(params["hardware"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"a vdla platform needs its hardware config, not {params!r}") \
                from exc
        return cls(config, backend=params.get("backend", "verilator"))

    def platform_params(self) -> dict:
        params = {**self.options(), "hardware": self.config.to_dict()}
        if self.backend == "verilator":
            params["tools"] = tool_versions()
        return params

    def capabilities(self) -> list[tuple[str, str]]:
        c = self.config
        mul = "with" if AluOp.MUL in c.alu_ops else "without"
        return [
            ("qconv2d", f"any groups (per-group GEMMs; depthwise with diagonal weight "
                        f"blocks), pads up to the kernel size - 1 and 15; on the "
                        f"{c.batch}x{c.block_in}x{c.block_out} GEMM core, bias, "
                        f"requantization ({mul} MUL), residual add and clamp on the ALU"),
            ("qdense", "as a 1x1 convolution over 1x1 images, or over the image of a "
                       "sequence's rows"),
            ("qmatmul", "a @ b^T of two int8 sequences as a dense layer whose weights are "
                        "b's rows, read where they lie (block_in = block_out, b's rows a "
                        "multiple of the block)"),
            ("max_pool2d", "int8: ALU MAX over the window"),
            ("qavg_pool2d", "window sums on the GEMM core, requantization on the ALU"),
            ("qglobal_avg_pool2d", "as an average pool over the whole image"),
            ("relu", "standalone, on int8: an identity-weight GEMM widens it, ALU MAX 0"),
            ("qadd", f"standalone: two int8 activations of one shape (no broadcasting) or "
                     f"one and a zero constant (rescale, clip); identity-weight GEMMs widen "
                     f"them, requantization ({mul} MUL), add and clamp on the ALU"),
        ] + ([("qgelu", "int8: an identity-weight GEMM widens it, one ALU TAB pass looks "
                        "each value up in the table of its 256 results")]
             if AluOp.TAB in c.alu_ops else [])

    def check_graph(self, graph: Graph) -> None:
        packed = [(name, t.layout) for name, t in graph.tensors.items() if t.layout]
        if packed:
            name, layout = packed[0]
            raise ValueError(f"the vdla target takes a graph in plain layouts (NCHW, NC, OIHW), "
                             f"as quantize returns it; tensor {name!r} has layout {layout!r} "
                             f"({len(packed)} packed tensor(s)): the back half packs by "
                             "itself, do not pack_graph first")

    def legalize(self, graph: Graph) -> Graph:
        """Sequences that self-attentions read padded to whole blocks
        (`vdla.compiler.targets.vdla.row_padding`), and the attentions the GEMM core can
        run head by head split into their products and softmax
        (`vdla.compiler.targets.vdla.attention`)."""
        return split_attention(pad_sequences(graph, self.config), self.config)

    # --- what runs here -----------------------------------------------------------------

    def supports(self, node: Node, graph: Graph) -> Support:
        if node.op in VIEW_OPS:
            problem = self._view_problem(node, graph)
            if problem:
                return Support(False, f"{node.op} on the host: {problem}")
            return Support(True, _VIEW_REASONS.get(node.op, _VIEW_REASONS["flatten"]))
        ok, reason = describe(node, graph, self.config)
        if not ok:
            return Support(False, reason)
        try:
            self._check_lowerable(node, graph)
        except ValueError as exc:
            return Support(False, str(exc))
        return Support(True, reason)

    def _view_problem(self, node: Node, graph: Graph) -> str | None:
        """Why `node` (concat, flatten, reshape) cannot be a view of DRAM buffers here."""
        if node.op != "concat":
            problem = view_problem(node, graph, self.config)
        else:
            problem = concat_view_problem(node, graph, self.config) or \
                self._concat_refusals(graph).get(node.name)
        if problem:
            return problem
        plan = self._graph_plan(graph)
        p = plan.placements.get(node.outputs[0]) if plan else None
        if p is not None and not p.identity:   # its readers must follow the channel map
            return map_problem(graph, node.outputs[0],
                               lambda reader: self.supports(reader, graph).ok)
        return None

    def _concat_refusals(self, graph: Graph) -> dict[str, str]:
        """Concat node -> why it cannot be a view (`concat_conflicts`), cached for the
        last graph asked about."""
        cache = self._views_cache
        size = (len(graph.nx), len(graph.tensors))
        if cache is None or cache[0] is not graph or cache[1] != size:
            concats = [n for n in graph.nodes() if n.op == "concat"
                       and concat_view_problem(n, graph, self.config) is None]
            refusals = concat_conflicts(graph, concats, self.config,
                                        lambda n: carries_map(n, graph))
            views = [n for n in graph.nodes() if n.op in VIEW_OPS and n.name not in refusals
                     and view_problem(n, graph, self.config) is None]
            # Channel maps flow through per-channel ops: plan with every node the
            # accelerator may run (by what it is; the lowering's checks are not needed).
            names = {n.name for n in views}
            nodes = [n for n in graph.nodes() if n.name in names
                     or (n.op not in VIEW_OPS and describe(n, graph, self.config)[0])]
            plan = plan_buffers(graph, nodes, self.config, _activations(graph, nodes),
                                lambda n: carries_map(n, graph)) if views else None
            cache = self._views_cache = (graph, size, refusals, plan)
        return cache[2]

    def _graph_plan(self, graph: Graph) -> BufferPlan | None:
        self._concat_refusals(graph)
        return self._views_cache[3]

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
        if node.op == "qsoftmax":        # down the rows, its buffers
            choose_softmax(softmax_layer(node, graph, self.config)[0], self.config)
            return
        # The arena holds the weights and bias written once: computed ones would need a
        # host-to-DRAM copy per run, which this back half does not do. (A qmatmul's b
        # is an activation, read where it lies: `conv_layer.matmul_problem`.)
        if node.op != "qmatmul" and graph.constant(node.inputs[1]) is None:
            raise ValueError(f"{node.op} node {node.name!r}: its weights {node.inputs[1]!r} are "
                             "computed at run time; the back half needs constant weights")
        if node.input(2) and graph.constant(node.input(2)) is None:
            raise ValueError(f"{node.op} node {node.name!r}: its bias {node.input(2)!r} is "
                             "computed at run time; the back half needs a constant bias")
        layer, _ = conv2d_layer(node, graph, self.config)
        Conv2dSchedule(1, 1, 1, 1).check(layer, self.config)

    # --- compiling -----------------------------------------------------------------------

    def compile_op(self, node: Node, graph: Graph, schedule: Any = None) -> CompiledOp:
        if node.op in VIEW_OPS:
            if schedule is not None:
                raise TypeError(f"{node.op} node {node.name!r} is a view: it takes no schedule")
            problem = self._view_problem(node, graph)
            if problem:
                raise ValueError(f"{node.op} node {node.name!r} cannot run on vdla: {problem}")
            return CompiledOp(node.name, node.op, self.name, "", None, VdlaKernel(None, {}))
        kind = (Pool2dSchedule if node.op in POOL_OPS else
                ElementwiseSchedule if node.op in ELEMENTWISE_OPS else
                SoftmaxSchedule if node.op == "qsoftmax" else Conv2dSchedule)
        if schedule is not None and not isinstance(schedule, kind):
            raise TypeError(f"the schedule of {node.name!r} ({node.op}) must be a "
                            f"{kind.__name__}, not {type(schedule).__name__}")
        if node.op in POOL_OPS:
            lowered = lower_pool2d(node, graph, self.config, schedule)
            static = lowered.static_data()
        elif node.op in ELEMENTWISE_OPS:
            lowered = lower_elementwise(node, graph, self.config, schedule)
            static = lowered.static_data()
        elif node.op == "qsoftmax":
            lowered = lower_softmax(node, graph, self.config, schedule)
            static = lowered.static_data()
            mask = graph.constant(node.input(1)) if node.input(1) else None
            if mask is not None and "input1" in lowered.regions:   # written once
                static = {**static, "input1": lowered.packed(mask)}
        else:
            lowered = lower_conv2d(node, graph, self.config, schedule)
            bias = graph.constant(node.input(2)) if node.input(2) else None
            weights = None if lowered.layer.streamed else graph.constant(node.inputs[1])
            static = lowered.static_data(weights, bias)
            a = graph.constant(node.inputs[0])
            if a is not None:      # a qmatmul's constant a: written once, as weights are
                static = {**static, "input": lowered.pack_input(a)}
        estimated = estimate_node(node, graph, self, lowered.schedule).cycles
        return CompiledOp(node.name, node.op, self.name, "",
                          dataclasses.asdict(lowered.schedule),
                          VdlaKernel(lowered, static, estimated_cycles=estimated,
                                     encoded=lowered.program.to_bytes()))

    def compile_nodes(self, graph: Graph, nodes: Sequence[Node], *,
                      schedules: Mapping[str, Any], progress: Progress | None = None,
                      start: int = 0, total: int | None = None) -> list[CompiledOp]:
        """Compile `nodes`. On a config whose activations stay in DRAM, first plan their
        buffers (`plan_buffers`; views need the plan, and are refused without it), then
        compile every node over its tensors' physical channels (`physical_node`: the
        same node unless a concat or flatten view gave one a channel map) and give every
        op the plan."""
        if not resident(self.config):
            return super().compile_nodes(graph, nodes, schedules=schedules,
                                         progress=progress, start=start, total=total)
        plan = plan_buffers(_planned_shapes(graph, nodes, self.config), nodes, self.config,
                            _activations(graph, nodes), lambda n: carries_map(n, graph))
        ops = []
        total = len(nodes) if total is None else total
        for i, node in enumerate(nodes):
            if progress is not None:
                progress(start + i, total, node.name)
            t0 = time.perf_counter()
            phys, scratch = physical_node(node, graph, plan.placements)
            op = self.compile_op(phys, scratch, schedules.get(node.name))
            kernel = dataclasses.replace(op.kernel, plan=plan)
            if phys is not node and node.op in GEMM_OPS:   # the layer's own MACs, no pads
                kernel = dataclasses.replace(
                    kernel, macs=conv2d_layer(node, graph, self.config)[0].macs)
            ops.append(dataclasses.replace(op, kernel=kernel,
                                           compile_seconds=time.perf_counter() - t0))
        return ops

    # --- running -------------------------------------------------------------------------

    def open_session(self, graph: Graph, ops: Sequence[CompiledOp],
                     device: Any = None) -> "VdlaSession":
        return VdlaSession(self, graph, ops, device)

    # --- estimating ----------------------------------------------------------------------

    def estimate(self, graph: Graph, *, schedules: Mapping[str, Any] | None = None) -> list:
        """The timing model's cycles of every node of `graph` this target would run,
        without lowering (`vdla.compiler.targets.vdla.estimate.estimate_graph`; a design
        sweep's figure per point): a list of `OpEstimate` in graph order."""
        return estimate_graph(self.legalize(graph), self, schedules=schedules)

    # --- tuning --------------------------------------------------------------------------

    def tasks(self, graph: Graph) -> list:
        return conv_tasks(self.legalize(graph), self)

    def compile_key(self) -> dict:
        """The whole config: every parameter can change a program. (The backend and the
        board change where it runs, not what is compiled.)"""
        return {"config": self.config.to_dict()}

    def parallel_ops(self, ops: Sequence[CompiledOp]) -> list[CompiledOp]:
        """Every op with a program: its cycles and outputs depend on its inputs alone (the
        session places each op at the same addresses, `_Placed`). Views run nothing."""
        return [op for op in ops if op.kernel is not None and op.kernel.lowered is not None]

    def op_cost(self, op: CompiledOp) -> float | None:
        """The timing model's cycles of the op's schedule."""
        return op.kernel.estimated_cycles
