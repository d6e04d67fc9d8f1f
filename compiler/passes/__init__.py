"""Passes over the graph IR, in the order a model goes through them.

* `prepare`: shape inference, constant folding, BN and per-channel affine folding,
  fusion (`prepare` runs them all before quantization);
* `fuse_transformer`: transformer layers written out (LayerNorm, GELU, dense bias and
  GELU, Q/K/V projections, the attention core) as fused ops (`prepare` runs it);
* `quantize`: int8 quantization for a requantization mode;
* `pack`: GEMM operators in blocked layouts, for block sizes a target gives;
* `partition`: which nodes a target runs and which fall back to the host.

Every pass takes a `Graph` and returns a new one; its input is left untouched.
"""

from vdla.compiler.passes.fuse_transformer import fuse_transformer, fusion_counts
from vdla.compiler.passes.pack import pack_graph
from vdla.compiler.passes.partition import HOST, Partition, partition
from vdla.compiler.passes.prepare import (fold_batch_norm, fold_channel_affine,
                                          fold_constants, fuse, infer_shapes, prepare)
from vdla.compiler.passes.quantize import MODES, QuantizationError, quantize, quantize_error

__all__ = ["HOST", "MODES", "Partition", "QuantizationError", "fold_batch_norm",
           "fold_channel_affine", "fold_constants", "fuse", "fuse_transformer",
           "fusion_counts", "infer_shapes", "pack_graph",
           "partition", "prepare", "quantize", "quantize_error"]
