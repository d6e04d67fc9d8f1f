"""The vdla target: the accelerator's back half, graph operators tensorized into vdla
programs.

The data flow through this folder:

* `support`: what the accelerator runs, by what a node is (the reasons reports show);
* `layers`: a node as the accelerator sees it (`Conv2dLayer`, `Pool2dLayer`: sizes in
  blocks of the config, and the ALU epilogue);
* `schedules`: how a layer is tiled (`Conv2dSchedule` with one or two virtual threads,
  `Pool2dSchedule`) and whether a tiling fits the buffers; `uops`: the micro-op tables;
* `cost`: the analytical timing model and the default choosers next to it;
* `conv2d`, `pool`: the lowerings (`lower_conv2d`, `lower_pool2d`) into programs whose
  dependency tokens `vdla.runtime.tokens` places, and `run_conv2d` / `run_pool2d` to run
  one on a device;
* `elementwise`: standalone int8 ``relu`` and ``qadd`` (`lower_elementwise`,
  `run_elementwise`), with their timing model and default chooser;
* `target`: `VdlaTarget`, the target interface (supports, compile, sessions on a
  device); `tuning`: its tunable tasks (`ConvTask`).
"""

from vdla.compiler.targets.vdla.conv import LoweredConv2d, lower_conv2d, run_conv2d
from vdla.compiler.targets.vdla.cost import (choose_conv2d, choose_pool2d, estimate_conv2d,
                                             estimate_pool2d)
from vdla.compiler.targets.vdla.elementwise import (ElementwiseLayer, LoweredElementwise,
                                                    lower_elementwise, run_elementwise)
from vdla.compiler.targets.vdla.conv_layer import Conv2dLayer, Pool2dLayer
from vdla.compiler.targets.vdla.pool import LoweredPool2d, lower_pool2d, run_pool2d
from vdla.compiler.targets.vdla.schedules import (Conv2dSchedule, ElementwiseSchedule,
                                                  Pool2dSchedule)
from vdla.compiler.targets.vdla.target import VdlaTarget
from vdla.compiler.targets.vdla.tuning import ConvTask

__all__ = ["Conv2dLayer", "Conv2dSchedule", "ConvTask", "LoweredConv2d", "LoweredPool2d",
           "Pool2dLayer", "Pool2dSchedule", "VdlaTarget", "choose_conv2d", "choose_pool2d",
           "estimate_conv2d", "estimate_pool2d", "lower_conv2d", "lower_pool2d",
           "run_conv2d", "run_pool2d", "ElementwiseLayer", "ElementwiseSchedule",
           "LoweredElementwise", "lower_elementwise", "run_elementwise"]
