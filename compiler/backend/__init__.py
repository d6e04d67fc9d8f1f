"""vdla back half: graph operators tensorized into vdla programs.

`lower_conv2d` turns one ``qconv2d``/``qdense`` node into a program plus the DRAM layout
it expects; `run_conv2d` runs it on a device (`vdla.runtime.open`); `Conv2dSchedule`
takes one or two virtual threads (``oc_nthread``/``h_nthread``). `lower_pool2d` and
`run_pool2d` do the same for ``max_pool2d``, ``qavg_pool2d`` and ``qglobal_avg_pool2d``
(`Pool2dSchedule`). `compile_model` compiles a whole quantized graph (those nodes on the
accelerator, the rest on the host) and `CompiledModel.session` runs it on a device,
returning outputs and per-op stats.
"""

from vdla.compiler.backend.conv2d import (Conv2dLayer, Conv2dSchedule, LoweredConv2d,
                                          lower_conv2d, run_conv2d)
from vdla.compiler.backend.model import (CompiledModel, CompiledOp, OpStats, RunResult,
                                         Session, check_feed, compile_model)
from vdla.compiler.backend.pool import (LoweredPool2d, Pool2dLayer, Pool2dSchedule,
                                        lower_pool2d, run_pool2d)

__all__ = ["CompiledModel", "CompiledOp", "Conv2dLayer", "Conv2dSchedule", "LoweredConv2d",
           "LoweredPool2d", "OpStats", "Pool2dLayer", "Pool2dSchedule", "RunResult", "Session",
           "check_feed", "compile_model", "lower_conv2d", "lower_pool2d", "run_conv2d",
           "run_pool2d"]
