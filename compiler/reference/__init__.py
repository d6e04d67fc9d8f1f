"""The reference: numpy kernels that define the results every back half must produce.

* `run_reference(graph, inputs)` (`executor`): runs any graph, float or quantized;
  `check_inputs` checks a feed (the one check every target's session shares too);
* `integer`: the integer arithmetic of quantized graphs (``requantize``, ``wrap32``, the
  bounds), the definition back halves reproduce bit for bit;
* `registry`: ``KERNELS`` (op name -> kernel) and the ``@kernel`` decorator; the kernels
  themselves are in `kernels_float`, `kernels_sequence` (the float operators of
  transformers) and `kernels_int`, loaded here;
* `numerics`: windows and convolution sums the kernels share.
"""

# Loading the kernel modules registers every kernel before anything runs a graph.
from vdla.compiler.reference import (kernels_float, kernels_int,  # noqa: F401  (registers)
                                     kernels_sequence)
from vdla.compiler.reference.executor import check_inputs, run_reference
from vdla.compiler.reference.registry import KERNELS, kernel

__all__ = ["KERNELS", "check_inputs", "kernel", "run_reference"]
