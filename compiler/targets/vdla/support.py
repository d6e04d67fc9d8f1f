"""What the accelerator runs, by what a node is: the reasons `vdla targets` and every
per-op report show.

`describe(node, graph, config)` answers from the node alone: integer GEMM (``qconv2d``,
grouped and depthwise too, and ``qdense``) with bias, requantization, residual add and
clamp on the vector ALU (MIN, MAX, ADD, SHR; MUL when the config has it); int8 max pooling (ALU MAX
over the window); average pooling (window sums on the GEMM core, then requantization on
the ALU); a standalone int8 ReLU or ``qadd`` (one `passes.fuse` could not fold into a
convolution's epilogue, or the quantizer's rescale or clip: an add of a zero constant):
identity-weight GEMMs widen the operands, the ALU requantizes, adds and clamps; on a
config with the ALU's lookup table, a ``qgelu`` (one TAB pass).
Requantization multipliers and shifts travel as ALU immediates, so they must fit its
signed field. `VdlaTarget.supports` adds what only the lowering knows (pads, dilation,
shapes, a schedule that fits the buffers).
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference.integer import POOL_MULTIPLIER_MAX
from vdla.compiler.targets.vdla.softmax import softmax_problem
from vdla.compiler.targets.vdla.table import TABLE_OPS, table_problem
from vdla.config import ISA_FIXED_WIDTHS, AluOp, HardwareConfig

__all__ = ["describe", "pool_weight_scale"]

# Ops with a clear host-side reason (anything not listed and not supported: generic).
_HOST_REASONS = {
    "quantize": "float -> int conversion runs on the host",
    "dequantize": "int -> float conversion runs on the host",
    "softmax": "softmax needs exp and division: no accelerator kernel",
    "qlayer_norm": ("qlayer_norm needs a row's sums across a vector's lanes and, once a "
                    "row, a 64-bit variance, a square root and a division; its steps per "
                    "entry are 32-bit ones, but the vector ALU has no kernel for the row's "
                    "statistics yet"),
    "gather": ("an embedding gather reads the table rows the token ids name, and a LOAD's "
               "address cannot come from data: the host gathers the rows"),
    "qattention": ("a qattention runs on the accelerator head by head, split into its "
                   "products, where block_in = block_out, its heads' features and keys are "
                   "whole blocks and the importer split and merges its heads "
                   "(`attention.splittable`); not this one"),
    "lrn": "local response normalization needs powers and division: no accelerator kernel",
    "pad": "standalone padding: the host pads (the accelerator pads only inside DMA loads)",
    "flatten": "reshaping is data movement the host does",
    "reshape": "reshaping is data movement the host does",
    "transpose": "transposition is data movement the host does",
    "concat": "concatenation is data movement the host does",
    "layout_transform": "packing to and from blocked layouts is done by the runtime on the "
                        "host side of the DMA, not by an accelerator instruction",
}


def _imm_range(config) -> tuple[int, int]:
    """Signed range of the ALU immediate, its width taken from the config's ALU
    instruction layout."""
    low, high = config.insn_field_widths()["ALU"]
    bits = dict(low + high).get("imm", ISA_FIXED_WIDTHS["imm"])
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _requant_problems(node: Node, config, multipliers, shifts) -> str | None:
    """Why the requantization given by the attributes named in `multipliers` and `shifts`
    cannot run on the ALU of `config`, or None when it can."""
    has_mul = AluOp.MUL in config.alu_ops
    for key in multipliers:
        if node.attrs.get(key) is not None and not has_mul:
            return (f"{key} is set (fixed-point requantization) but this config's ALU has "
                    f"no MUL (alu_ops: {', '.join(sorted(op.name for op in config.alu_ops))})")
    lo, hi = _imm_range(config)
    # Multipliers and shifts both travel as the ALU instruction's immediate.
    for key in tuple(multipliers) + tuple(shifts):
        value = node.attrs.get(key)
        if value is None:
            continue
        values = np.atleast_1d(np.asarray(value, dtype=np.int64))
        if values.size and (values.min() < lo or values.max() > hi):
            shown = int(values[0]) if values.size == 1 else \
                f"{int(values.min())}..{int(values.max())}"
            return (f"{key} {shown} does not fit the ALU's signed immediate [{lo}, {hi}]")
    return None


def pool_weight_scale(node: Node) -> int:
    """The int8 weight an average pool's window sum is taken with: its multiplier when
    that is one value in [1, 127] (an int8 weight: the GEMM core multiplies for free, and
    a config without MUL still runs it), else 1 (the multiplier, if any, is an ALU MUL)."""
    m = node.attrs.get("multiplier")
    if m is None:
        return 1
    values = np.unique(np.atleast_1d(np.asarray(m, dtype=np.int64)))
    return (int(values[0]) if values.size == 1 and 1 <= values[0] <= POOL_MULTIPLIER_MAX
            else 1)


def _identity_problem(what: str, config) -> str | None:
    """Why identity weight blocks cannot move `what`'s int8 input blocks into output
    blocks on `config` (None when they can)."""
    if config.block_out % config.block_in and config.block_in % config.block_out:
        return (f"{what} needs one of block_in ({config.block_in}) and block_out "
                f"({config.block_out}) to divide the other: identity weights map whole "
                "input blocks into an output block, or select output blocks from an input "
                "block")
    return None


def _int8_input(graph: Graph, node: Node) -> bool:
    return graph.tensors[node.inputs[0]].dtype == "int8"


def describe(node: Node, graph: Graph, config: HardwareConfig) -> tuple[bool, str]:
    """Whether the accelerator described by `config` runs `node` of `graph` by what the
    node is (its op, data type, requantization), and why or why not. The lowering's own
    checks (sizes, pads, a schedule that fits) come on top: `VdlaTarget.supports`."""
    op = node.op
    if op in ("qconv2d", "qdense"):
        problem = _requant_problems(node, config, ("multiplier", "residual_multiplier"),
                                    ("shift", "residual_shift"))
        if problem:
            return False, problem
        groups = int(node.attrs.get("groups", 1))
        channels = graph.tensors[node.inputs[0]].shape[1]
        what = ("convolution" if op == "qconv2d" and groups == 1 else
                "matrix product" if op == "qdense" else
                "depthwise convolution (diagonal weight blocks)" if groups == channels else
                f"grouped convolution (groups={groups}, per-group GEMMs)")
        extras = ["bias"] * bool(node.input(2)) + ["residual add"] * bool(node.input(3))
        return True, (f"int8 {what} on the GEMM core; "
                      + ", ".join(extras + ["requantization and clamp on the ALU"]))
    if op == "qmatmul":
        problem = _requant_problems(node, config, ("multiplier",), ("shift",))
        if problem:
            return False, problem
        return True, ("int8 product of two activations on the GEMM core, b's rows read "
                      "as weight blocks where they lie; requantization and clamp on the ALU")
    if op in ("relu", "qadd"):
        dtype = graph.tensors[node.inputs[0]].dtype
        if op == "relu" and dtype != "int8":
            return False, (f"{dtype} relu: the accelerator runs ReLU on int8 data only (a float "
                           "one is fused into its convolution or runs on the host)")
        problem = _identity_problem(f"standalone {op}", config)
        if problem:
            return False, problem
        if op == "relu":
            return True, ("int8 ReLU: an identity-weight GEMM widens the input, ALU MAX 0")
        problem = _requant_problems(node, config, ("a_multiplier", "b_multiplier"),
                                    ("a_shift", "b_shift"))
        if problem:
            return False, problem
        return True, ("int8 add: identity-weight GEMMs widen the operands; requantization, "
                      "add and clamp on the ALU")
    if op == "qsoftmax":
        problem = softmax_problem(node, graph, config)
        if problem:
            return False, f"qsoftmax on the host: {problem}"
        return True, ("int8 softmax down the rows of a transposed score matrix: the ALU's "
                      "reductions over rows (MAX, ADD), TAB for the exponentials, DIV for "
                      "the probabilities")
    if op in TABLE_OPS:
        problem = table_problem(node, config)
        if not problem and not _int8_input(graph, node):
            problem = f"{op} on {graph.tensors[node.inputs[0]].dtype}: int8 data only"
        if not problem:
            problem = _identity_problem(f"standalone {op}", config)
        if problem:
            return False, problem
        return True, (f"int8 {op}: an identity-weight GEMM widens the input, one ALU TAB "
                      "pass looks each value up in the table of its 256 results")
    if op in ("max_pool2d", "qavg_pool2d", "qglobal_avg_pool2d"):
        if not _int8_input(graph, node):
            return False, (f"{op} on {graph.tensors[node.inputs[0]].dtype}: the accelerator "
                           "pools int8 data only")
        problem = _identity_problem(f"{op}: pooling", config)
        if problem:
            return False, problem
        if op == "max_pool2d":
            return True, "int8 max pooling: ALU MAX over the window"
        # A per-tensor multiplier of at most 127 scales the GEMM core's identity weights
        # instead of needing the ALU's MUL (the quantizer's shift mode emits such).
        scaled = pool_weight_scale(node) > 1
        problem = _requant_problems(node, config, () if scaled else ("multiplier",),
                                    ("shift",))
        if problem:
            return False, problem
        return True, ("int8 average pooling: window sum on the GEMM core"
                      + (" (its weights scaled by the multiplier)" if scaled else "")
                      + ", requantization on the ALU")
    if op in _HOST_REASONS:
        return False, _HOST_REASONS[op]
    dtypes = {graph.tensors[i].dtype for i in node.inputs if i}
    if "float32" in dtypes:
        return False, f"float {op}: the accelerator computes on int8 data only"
    return False, f"no accelerator kernel for {op}"
