"""The codes the GPU target's kernels branch on (``constexpr`` arguments): `lower` picks
them for a node, `kernels` reads them. Plain integers, so that `lower` needs no Triton.
"""

from __future__ import annotations

__all__ = ["ACTIVATIONS", "BINARY", "POOLS", "UNARY"]

#: A float GEMM's activation (`conv_gemm`'s ``ACT``), by the node's ``activation``.
ACT_NONE, ACT_RELU, ACT_CLIP = 0, 1, 2
ACTIVATIONS = {None: ACT_NONE, "relu": ACT_RELU, "clip": ACT_CLIP}
#: `pool2d`'s ``MODE``: max (int8 or float), int8 window sums requantized, float means.
POOL_MAX, POOL_QSUM, POOL_MEAN = 0, 1, 2
POOLS = (POOL_MAX, POOL_QSUM, POOL_MEAN)
#: `binary`'s ``OP``, by node op.
OP_QADD, OP_ADD, OP_MUL = 0, 1, 2
BINARY = {"qadd": OP_QADD, "add": OP_ADD, "mul": OP_MUL}
#: `unary`'s ``OP``, by node op.
OP_RELU, OP_CLIP, OP_QUANTIZE, OP_DEQUANTIZE = 0, 1, 2, 3
UNARY = {"relu": OP_RELU, "clip": OP_CLIP, "quantize": OP_QUANTIZE,
         "dequantize": OP_DEQUANTIZE}
