"""vdla back half: graph operators tensorized into vdla programs.

`lower_conv2d` turns one ``qconv2d`` node into a program plus the DRAM layout it expects;
`run_conv2d` runs it on a device (`vdla.runtime.open`); `Conv2dSchedule` takes one or two
virtual threads (``oc_nthread``/``h_nthread``). Whole models and the other operators
come later.
"""

from vdla.compiler.backend.conv2d import (Conv2dLayer, Conv2dSchedule, LoweredConv2d,
                                          lower_conv2d, run_conv2d)

__all__ = ["Conv2dLayer", "Conv2dSchedule", "LoweredConv2d", "lower_conv2d", "run_conv2d"]
