"""The codes the GPU target's kernels branch on (``constexpr`` arguments): `lower` picks
them for a node, `kernels` reads them. Plain integers, so that `lower` needs no Triton.
"""

from __future__ import annotations

__all__ = ["ACTIVATIONS", "BINARY", "ELEMENTWISE", "POOLS", "REDUCES", "UNARY"]

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

# --- the sequence (transformer) kernels of `sequence_kernels` ------------------------------

#: `conv_gemm`'s float epilogue may also end in a GELU (a transformer's feed-forward dense).
ACT_GELU, ACT_GELU_TANH = 3, 4
ACTIVATIONS.update({"gelu": ACT_GELU, "gelu_tanh": ACT_GELU_TANH})
#: `nd_map`'s ``OP``: a strided copy (transpose, slice, expand, cast), a cast to bool,
#: the unary float functions, the binary arithmetic and comparisons, `where`, and a
#: 256-entry int8 table indexed by an int8 value (``x1[x0 + 128]``).
(E_COPY, E_TO_BOOL, E_NEG, E_SQRT, E_ERF, E_TANH, E_EXP, E_GELU, E_GELU_TANH, E_ADD, E_SUB,
 E_MUL, E_DIV, E_POW, E_POW_INT, E_EQUAL, E_LESS, E_GREATER, E_WHERE, E_TABLE) = range(20)
#: Elementwise ops by node op (cast, gelu and pow pick their code from their attributes
#: and operands).
ELEMENTWISE = {"neg": E_NEG, "sqrt": E_SQRT, "erf": E_ERF, "tanh": E_TANH, "exp": E_EXP,
               "add": E_ADD, "sub": E_SUB, "mul": E_MUL, "div": E_DIV, "pow": E_POW,
               "equal": E_EQUAL, "less": E_LESS, "greater": E_GREATER, "where": E_WHERE}
#: `reduce_rows`'s ``OP``, by node op.
R_SUM, R_MEAN, R_MAX = 0, 1, 2
REDUCES = {"reduce_sum": R_SUM, "reduce_mean": R_MEAN, "reduce_max": R_MAX}
