"""One node of a graph to its CPU kernel: the op's generator, with a schedule.

    kernel, schedule = node_kernel(node, graph, isa, threads=2)

Convolutions go to `vdla.compiler.targets.cpu.conv` (or `depthwise`, one input channel
per group, or `pointwise`, a schedule with vectors along output channels; a patch
embedding without a tuned schedule to `patches`), dense layers to `dense`, batched
matrix products to `matmul` (with a `MatmulSchedule`), every other op to `ops`. The target and its tuning tasks both lower nodes
through here, so what the tuner measures is what models run.
"""

from __future__ import annotations

from typing import Any

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu import amx, ops
from vdla.compiler.targets.cpu.blocked import blocked_kernel
from vdla.compiler.targets.cpu.conv import conv_kernel
from vdla.compiler.targets.cpu.dense import dense_kernel
from vdla.compiler.targets.cpu.dense_schedule import DenseSchedule, choose_dense
from vdla.compiler.targets.cpu.depthwise import depthwise_kernel
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import Kernel
from vdla.compiler.targets.cpu.machine import NOMINAL, MachineCosts
from vdla.compiler.targets.cpu.matmul import matmul_kernel
from vdla.compiler.targets.cpu.matmul_schedule import MatmulSchedule, MatmulShape, choose_matmul
from vdla.compiler.targets.cpu.patches import patches_kernel, runs_as_gemm
from vdla.compiler.targets.cpu.pointwise import pointwise_kernel
from vdla.compiler.targets.cpu.schedule import ConvSchedule, choose_conv
from vdla.compiler.targets.cpu.shapes import ConvShape, DenseShape
from vdla.compiler.targets.cpu.winograd import winograd_kernel

__all__ = ["GEMM_OPS", "node_kernel"]

#: The ops with schedules (the tuner's), and the schedule type of each.
GEMM_OPS = {"conv2d": ConvSchedule, "qconv2d": ConvSchedule,
            "dense": DenseSchedule, "qdense": DenseSchedule,
            "matmul": MatmulSchedule, "qmatmul": MatmulSchedule}


def node_kernel(node: Node, graph: Graph, isa: Isa, *, schedule: Any = None,
                threads: int = 2, nonnegative: bool | None = None,
                in_block: int = 0, band: bool = False,
                costs: MachineCosts = NOMINAL, bf16: bool = False) -> tuple[Kernel, Any]:
    """`node`'s kernel and the schedule it was generated with (None for an op without
    schedules).

    schedule : a `ConvSchedule` / `DenseSchedule` / `MatmulSchedule`, or None for the
        default chooser's; `ScheduleError` (a ValueError) names a knob that does not
        fit, TypeError a schedule of the wrong kind
    threads : the team the default chooser plans work items for
    nonnegative : overrides what the graph says of an int8 input's sign (a tuning task's
        one-node graph has no producer to ask)
    in_block : the layout the node's first input is produced in (0: plain); ops without
        schedules that read blocked inputs follow it (`ops.build`)
    band : a blocked direct convolution's C as a band of rows for a fused kernel
        (`blocked.blocked_kernel`, `vdla.compiler.targets.cpu.fusion`); ValueError for
        any other kernel
    costs : the machine the default chooser plans for (`machine.MachineModel.costs`)
    bf16 : float convolutions of one group, dense layers and batched products in
        bfloat16 on AMX tiles (`amx.qconv_kernel`, `amx.qdense_kernel`,
        `amx.qmatmul_kernel`: the bf16 precision), whatever a float32 schedule says;
        ValueError on an instruction set without tiles
    """
    inputs = tuple(t for t in node.inputs if t and not graph.tensors[t].is_constant)
    kind = GEMM_OPS.get(node.op)
    if kind is None:
        if schedule is not None:
            raise TypeError(f"node {node.name!r} ({node.op}) has no schedules on the CPU "
                            f"target; got {schedule!r}")
        return ops.build(node, graph, isa, in_block), None
    bf16 = bf16 and amx.runs_bf16(node)
    if bf16 and not isa.tiles:
        raise ValueError(f"bfloat16 kernels run on AMX tiles, and {isa.name} has none")
    if schedule is not None and not isinstance(schedule, kind):
        raise TypeError(f"node {node.name!r} ({node.op}) takes a {kind.__name__}, not "
                        f"{type(schedule).__name__}: {schedule!r}")
    if kind is MatmulSchedule:
        support = ops.supports(node, graph)    # its operands may be computed: no weights
        if not support.ok:
            raise ValueError(support.reason)
        schedule = schedule or choose_matmul(MatmulShape.from_node(node, graph), isa, costs)
        return matmul_kernel(node, graph, isa, schedule, bf16=bf16), schedule
    w = graph.constant(node.inputs[1])
    bias = graph.constant(node.input(2)) if node.input(2) else None
    if kind is DenseSchedule:
        shape = DenseShape.from_node(node, graph, nonnegative=nonnegative)
        schedule = schedule or choose_dense(shape, isa, costs)
        if bf16:
            return amx.qdense_kernel(shape, schedule.check(shape, isa), w, bias, node,
                                     inputs), schedule
        return dense_kernel(shape, schedule, w, bias, node, isa, inputs), schedule
    shape = ConvShape.from_node(node, graph, nonnegative=nonnegative)
    if bf16 and not band:       # bfloat16 on tiles, whatever a float32 record says
        return amx.qconv_kernel(shape, w, bias, node, inputs), None
    if schedule is None and not band and runs_as_gemm(shape, isa):
        # a ViT's patch embedding, or an int8 stem without VNNI: one GEMM of many rows
        # (`patches`), no schedule
        return patches_kernel(shape, node, graph, isa, inputs, costs), None
    schedule = schedule or choose_conv(shape, isa, threads, costs=costs)
    if band:
        if schedule.layout != "nchwc" or schedule.wino:
            raise ValueError(f"node {node.name!r}: only a blocked direct convolution runs "
                             f"as a band of a fused kernel, not {schedule!r}")
        return blocked_kernel(shape, schedule, w, bias, node, isa, inputs,
                              band=True), schedule
    if schedule.layout == "nchwc" and schedule.wino:
        return winograd_kernel(shape, schedule.check(shape, isa), w, bias, node,
                               inputs), schedule
    if schedule.layout == "nchwc":
        return blocked_kernel(shape, schedule, w, bias, node, isa, inputs), schedule
    if shape.depthwise:
        return depthwise_kernel(shape, schedule.check(shape, isa), w, bias, node,
                                inputs), schedule
    if schedule.lanes == "co":
        return pointwise_kernel(shape, schedule, w, bias, node, isa, inputs), schedule
    return conv_kernel(shape, schedule, w, bias, node, isa, inputs), schedule
