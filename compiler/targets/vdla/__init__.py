"""The vdla target: the accelerator's back half, graph operators tensorized into vdla
programs, one module per op family.

The data flow through this folder, from `compile_model` to a program:

* `target`: `VdlaTarget`, the target interface. `supports` asks `support` what the
  accelerator runs by what a node is (the reasons reports show), then the op family
  what only its lowering knows; `compile_nodes` plans the activations' DRAM buffers
  (`placement`, with `channel_map` for concat and flatten views) and `compile_op` calls
  the family's lowering; sessions run the programs on a device. `tuning`: its tunable
  tasks (`ConvTask`); `estimate`: every op's cycles from the families' timing models,
  without lowering; `command_line`: its options and report lines (`VdlaCommandLine`).
* the op families, each holding its layer (a node as the accelerator sees it: sizes in
  blocks of the config, the ALU epilogue), its schedule (how a layer is tiled, whether
  a tiling fits the buffers), its timing model with the default chooser, and its
  emitter, whose dependency tokens `vdla.runtime.tokens` places:

  - convolutions (``qconv2d``, and ``qdense`` as a 1x1 convolution over a 1x1 image):
    `conv_layer` (`Conv2dLayer`, `Conv2dSchedule` with one or two virtual threads,
    `estimate_conv2d`, `choose_conv2d`, `alu_passes`), then `conv` (`lower_conv2d`, its
    micro-op table and emitter, `run_conv2d`);
  - grouped and depthwise convolutions: `grouped` (the spans of a grouped layer, the
    diagonal weight blocks of a depthwise one); the conv family lowers them;
  - pools: `pool` (`Pool2dLayer`, `Pool2dSchedule`, `estimate_pool2d`, `choose_pool2d`,
    `lower_pool2d`, `run_pool2d`);
  - standalone int8 ``relu`` and ``qadd``: `elementwise` (`ElementwiseLayer`,
    `ElementwiseSchedule`, `estimate_elementwise`, `choose_elementwise`,
    `lower_elementwise`, `run_elementwise`);
* `common`: what the families share: ISA limits, tiling arithmetic and the hardware
  facts of the timing models, micro-op tables interned by content, the DRAM arena,
  relocation, and `start_lowering`, the start of every lowering; `requant`: the ALU
  steps of a requantization and its clamp (with the ALU's REQ, one fused step).
"""

from vdla.compiler.targets.vdla.conv import LoweredConv2d, lower_conv2d, run_conv2d
from vdla.compiler.targets.vdla.conv_layer import Conv2dLayer, choose_conv2d
from vdla.compiler.targets.vdla.conv_schedule import Conv2dSchedule
from vdla.compiler.targets.vdla.timing import estimate_conv2d
from vdla.compiler.targets.vdla.elementwise import (ElementwiseLayer, ElementwiseSchedule,
                                                    LoweredElementwise, lower_elementwise,
                                                    run_elementwise)
from vdla.compiler.targets.vdla.pool import (LoweredPool2d, Pool2dLayer, Pool2dSchedule,
                                             choose_pool2d, estimate_pool2d, lower_pool2d,
                                             run_pool2d)
from vdla.compiler.targets.vdla.target import VdlaTarget
from vdla.compiler.targets.vdla.tuning import ConvTask

__all__ = ["Conv2dLayer", "Conv2dSchedule", "ConvTask", "LoweredConv2d", "LoweredPool2d",
           "Pool2dLayer", "Pool2dSchedule", "VdlaTarget", "choose_conv2d", "choose_pool2d",
           "estimate_conv2d", "estimate_pool2d", "lower_conv2d", "lower_pool2d",
           "run_conv2d", "run_pool2d", "ElementwiseLayer", "ElementwiseSchedule",
           "LoweredElementwise", "lower_elementwise", "run_elementwise"]
