"""vdla back half: graph operators tensorized into vdla programs.

`lower_conv2d` turns one ``qconv2d`` node into a program plus the DRAM layout it expects;
`run_conv2d` runs it on a device (`vdla.runtime.open`); `Conv2dSchedule` takes one or two
virtual threads (``oc_nthread``/``h_nthread``). `compile_model` compiles a whole quantized
graph (GEMM nodes on the accelerator, the rest on the host) and `CompiledModel.session`
runs it on a device, returning outputs and per-op stats.
"""

from vdla.compiler.backend.conv2d import (Conv2dLayer, Conv2dSchedule, LoweredConv2d,
                                          lower_conv2d, run_conv2d)
from vdla.compiler.backend.model import (CompiledModel, CompiledOp, OpStats, RunResult,
                                         Session, check_feed, compile_model)

__all__ = ["CompiledModel", "CompiledOp", "Conv2dLayer", "Conv2dSchedule", "LoweredConv2d",
           "OpStats", "RunResult", "Session", "check_feed", "compile_model", "lower_conv2d",
           "run_conv2d"]
