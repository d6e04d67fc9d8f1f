"""What compiling an op for the accelerator gives: its kernel (the lowered program, the
data written once per session, the model's buffer plan), and which of its arena's
regions hold activations. Shared by the target (`target`), which makes kernels, and the
session (`session`), which runs them."""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.vdla.conv import LoweredConv2d
from vdla.compiler.targets.vdla.elementwise import LoweredElementwise
from vdla.compiler.targets.vdla.placement import BufferPlan
from vdla.compiler.targets.vdla.pool import LoweredPool2d

__all__ = ["VdlaKernel", "activation_regions"]


@dataclasses.dataclass(frozen=True, eq=False)
class VdlaKernel:
    """A compiled op on the accelerator: the lowered program (`LoweredConv2d` or
    `LoweredPool2d`, `LoweredElementwise`; None for a view: concat, flatten, reshape),
    the arena regions written once per session ({region: array}), and the model's
    `BufferPlan` (shared by all its ops; None where activations do not stay in DRAM);
    ``estimated_cycles``, the timing model's cycles for its schedule (a parallel run
    dispatches the longest ops first); ``encoded``, the program's instruction words
    (encoded once, when compiled: a session relocates them, `relocate.relocate_encoded`)."""

    lowered: LoweredConv2d | LoweredPool2d | LoweredElementwise | None
    static: Mapping[str, np.ndarray]
    plan: BufferPlan | None = dataclasses.field(default=None, repr=False)
    macs: int | None = None    # the node's useful MACs where the lowered layer has pads
    estimated_cycles: int | None = None
    encoded: bytes | None = dataclasses.field(default=None, repr=False)

    @property
    def useful_macs(self) -> int:
        return self.macs if self.macs is not None else self.lowered.layer.macs


def activation_regions(lowered, node: Node, static=()) -> dict[str, str]:
    """The arena regions of `lowered` (of graph node `node`) that hold activations:
    {region: tensor name} (input, an int8 residual, a qmatmul's streamed b, elementwise
    operands, output), but those in `static` (a kernel's data written once: a qmatmul's
    constant a)."""
    if isinstance(lowered, LoweredElementwise):
        regions = {f"input{i}": node.inputs[i] for i in lowered.layer.inputs}
    else:
        regions = {"input": node.inputs[0]}
    if isinstance(lowered, LoweredConv2d) and lowered.layer.has_residual:
        regions["residual"] = node.inputs[3]
    if isinstance(lowered, LoweredConv2d) and lowered.layer.streamed:
        regions["weights"] = node.inputs[1]
    regions["output"] = node.outputs[0]
    return {region: tensor for region, tensor in regions.items() if region not in static}
