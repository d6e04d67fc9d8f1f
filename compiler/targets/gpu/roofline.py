"""Roofline estimates of a graph's kernels on a GPU, from datasheet peaks alone.

A kernel can go no faster than its arithmetic at the GPU's peak rate, nor than its DRAM
traffic at the peak bandwidth; the roofline estimate is the larger of the two times::

    seconds = max(ops / peak(precision), bytes / bandwidth)

It is a lower bound on a kernel's time (an *estimate*, not a measurement): real kernels
reach a fraction of either peak, and this model ignores caches (data a kernel re-reads),
tails of small grids, and fusion across kernels. It needs no GPU and imports no GPU
library, so it answers "what would this model take on an H100?" anywhere.

    from vdla.compiler.targets.gpu import roofline
    result = roofline.estimate(graph, "h100-sxm")          # int8 for a quantized graph
    result.seconds, result.seconds_with_launch
    for k in result.kernels: k.name, k.bound, k.seconds

What a kernel counts (one kernel per graph node; the graph is the compiler's IR):

* **ops**: a GEMM (conv2d, dense, their quantized forms, matmul, qmatmul) does
  ``2 * macs`` operations on the tensor cores, at ``gpu.peak(precision)``; a float GEMM
  left in a quantized graph runs at the float32 peak. Attention (``attention``,
  ``qattention``) is two GEMMs, q @ k^T and p @ v, plus `SOFTMAX_OPS` per score on the
  same peak. Every other kernel runs on the CUDA cores at the FP32 peak: `ELEMENT_OPS`
  operations per output element for the ops with a formula there (softmax, LayerNorm,
  GELU, erf, ...; their integer forms as defined in
  `vdla.compiler.reference.integer_transformer`), one per window element for a pool, one
  per input element for a global pool or a reduction, else one per output element
  (elementwise ops, copies, quantize and dequantize, lrn).
* **bytes**: the minimum DRAM traffic: each distinct input (activations and weights)
  read once, each output written once, at the size of its dtype; at precision
  ``"float16"`` float32 tensors count 2 bytes (the graph is float32, the kernels would
  hold it in fp16). A gather or a slice reads only what it outputs (the table's rows,
  the slice), not the whole input; attention's scores stay on chip.
* **views** (flatten, reshape) are not kernels: they relabel a tensor's shape, move no
  data and launch nothing.
* **launches**: each kernel also costs `LAUNCH_SECONDS`, kept apart from the roofline
  (`ModelEstimate.seconds_with_launch` adds them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from vdla.compiler.ir.graph import Graph, Node
from vdla.compiler.ir.layout import parse_layout, transform_shape
from vdla.compiler.targets.gpu.gpus import PRECISIONS, Gpu, get as get_gpu

__all__ = ["ELEMENT_OPS", "GEMM_OPS", "KernelEstimate", "LAUNCH_SECONDS", "ModelEstimate",
           "SOFTMAX_OPS", "VIEW_OPS", "default_precision", "estimate", "estimate_node"]

#: Time to launch one kernel, an assumption: a CUDA launch costs a few microseconds of
#: host and driver time (2-5 us is the usual figure; a launch through a Python launcher
#: such as Triton's sits at the upper end, one captured in a CUDA graph at the lower).
#: At batch 1 it is comparable with a small kernel's roofline time, so it is reported.
LAUNCH_SECONDS = 3e-6
#: Operators that run as matrix multiplications on the tensor cores.
GEMM_OPS = frozenset({"conv2d", "qconv2d", "dense", "qdense", "matmul", "qmatmul",
                      "attention", "qattention"})
#: Operations per element of a row softmax: the max, the subtraction, the exp, the sum
#: and the division (the integer one: a table look-up in place of the exp, a division).
SOFTMAX_OPS = 5
#: CUDA-core operations per output element of the ops that take more than one: softmax
#: (`SOFTMAX_OPS`); LayerNorm (the mean's and the variance's sums, the centring, the
#: square, the scale and the shift: 8; the integer one the same with an integer square
#: root per row, negligible per element); GELU (erf's polynomial and the products,
#: about 10; the tanh form about as many; the integer one a table look-up); the unary
#: transcendental functions (a polynomial each, about 8) and pow (log, product, exp: 3).
ELEMENT_OPS = {"softmax": SOFTMAX_OPS, "qsoftmax": SOFTMAX_OPS, "layer_norm": 8,
               "qlayer_norm": 8, "gelu": 10, "qgelu": 1, "erf": 8, "tanh": 8, "exp": 8,
               "sqrt": 1, "pow": 3}
#: Reductions: one operation per input element, like a global pool.
_REDUCES = frozenset({"reduce_mean", "reduce_sum", "reduce_max"})
#: Ops that read only as much of their first input as they write (a gather's rows of its
#: table, a slice's window).
_READ_AS_WRITTEN = frozenset({"gather", "slice"})
#: Operators that only relabel a tensor's shape: no kernel, no cost.
VIEW_OPS = frozenset({"flatten", "reshape"})
# Pools: one operation per window element of each output; global pools read each input
# element once.
_WINDOW_POOLS = frozenset({"max_pool2d", "avg_pool2d", "qavg_pool2d"})
_GLOBAL_POOLS = frozenset({"global_avg_pool2d", "qglobal_avg_pool2d"})
# Bytes per element, by the IR's dtype names (`vdla.compiler.ir.tensor.DTYPES`).
_ELEMENT_BYTES = {"float32": 4, "int8": 1, "uint8": 1, "int32": 4, "int64": 8, "bool": 1}


@dataclass(frozen=True)
class KernelEstimate:
    """The roofline estimate of one kernel (one graph node).

    name, op : the node's name and operator
    precision : the precision whose peak its operations run at: the model's for a GEMM
        (float32 for a float GEMM in an int8 estimate), "float32" (the CUDA cores) for
        every other kernel
    macs : multiply-accumulates of a GEMM; 0 for other kernels
    ops : arithmetic operations (``2 * macs`` for a GEMM; see the module docstring)
    bytes : minimum DRAM traffic in bytes (inputs read once, outputs written once)
    compute_seconds : ``ops`` at the GPU's peak for `precision`
    memory_seconds : ``bytes`` at the GPU's DRAM bandwidth
    launch_seconds : the launch cost, `LAUNCH_SECONDS` (kept out of `seconds`)

    Derived: `seconds` (the roofline: the larger of compute and memory time), `bound`
    ("compute" or "memory", whichever is larger), `intensity` (ops per byte).
    """

    name: str
    op: str
    precision: str
    macs: int
    ops: int
    bytes: int
    compute_seconds: float
    memory_seconds: float
    launch_seconds: float = LAUNCH_SECONDS

    @property
    def seconds(self) -> float:
        """The roofline time: compute or memory, whichever takes longer (no launch)."""
        return max(self.compute_seconds, self.memory_seconds)

    @property
    def bound(self) -> str:
        """"compute" when the arithmetic takes at least as long as the traffic, else
        "memory"."""
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"

    @property
    def intensity(self) -> float:
        """Arithmetic intensity: operations per byte of DRAM traffic."""
        return self.ops / self.bytes if self.bytes else math.inf

    def to_dict(self) -> dict:
        return {"name": self.name, "op": self.op, "precision": self.precision,
                "macs": self.macs, "ops": self.ops, "bytes": self.bytes,
                "intensity": self.intensity, "compute_seconds": self.compute_seconds,
                "memory_seconds": self.memory_seconds, "seconds": self.seconds,
                "launch_seconds": self.launch_seconds, "bound": self.bound}


@dataclass(frozen=True)
class ModelEstimate:
    """The roofline estimate of a graph's kernels on one GPU.

    gpu : the `Gpu`
    precision : the precision of the estimate ("int8", "float16" or "float32")
    kernels : one `KernelEstimate` per kernel, in graph order (views left out)

    The totals are properties: `seconds` (the kernels' rooflines added up: kernels run
    one after another), `launch_seconds`, `seconds_with_launch`, `macs`, `ops`, `bytes`,
    and `compute_bound` (how many kernels are compute-bound).
    """

    gpu: Gpu
    precision: str
    kernels: tuple[KernelEstimate, ...]

    @property
    def seconds(self) -> float:
        return sum(k.seconds for k in self.kernels)

    @property
    def launch_seconds(self) -> float:
        return sum(k.launch_seconds for k in self.kernels)

    @property
    def seconds_with_launch(self) -> float:
        return self.seconds + self.launch_seconds

    @property
    def macs(self) -> int:
        return sum(k.macs for k in self.kernels)

    @property
    def ops(self) -> int:
        return sum(k.ops for k in self.kernels)

    @property
    def bytes(self) -> int:
        return sum(k.bytes for k in self.kernels)

    @property
    def compute_bound(self) -> int:
        return sum(k.bound == "compute" for k in self.kernels)

    def to_dict(self) -> dict:
        """The estimate as JSON-ready data: the GPU's figures, the totals, the kernels."""
        gpu = self.gpu
        return {"gpu": gpu.name, "title": gpu.title, "precision": self.precision,
                "peak_ops_per_second": gpu.peak(self.precision),
                "fp32_ops_per_second": gpu.peak("float32"),
                "bandwidth_bytes_per_second": gpu.bandwidth, "source": gpu.source,
                "seconds": self.seconds, "launch_seconds": self.launch_seconds,
                "seconds_with_launch": self.seconds_with_launch, "macs": self.macs,
                "ops": self.ops, "bytes": self.bytes, "kernels_compute_bound":
                self.compute_bound, "kernels_memory_bound": len(self.kernels)
                - self.compute_bound, "kernels": [k.to_dict() for k in self.kernels]}


def default_precision(graph: Graph) -> str:
    """"int8" for a quantized graph (one whose activations include int8 tensors), else
    "float32"."""
    quantized = any(t.dtype == "int8" and not t.is_constant for t in graph.tensors.values())
    return "int8" if quantized else "float32"


def estimate(graph: Graph, gpu: Gpu | str, precision: str | None = None,
             nodes: Iterable[str] | None = None) -> ModelEstimate:
    """The roofline estimate of `graph`'s kernels on `gpu`.

    graph : a `Graph` with inferred shapes (what the pipeline's quantize or prepare gives)
    gpu : a `Gpu`, or its name (`vdla.compiler.targets.gpu.gpus.names`)
    precision : "int8", "float16" or "float32"; None: `default_precision(graph)`
    nodes : node names to estimate (the ops a target runs), or None for every node;
        views among them are skipped like the others
    ValueError for an unknown GPU, precision or node name, naming the allowed ones.
    """
    gpu = gpu if isinstance(gpu, Gpu) else get_gpu(gpu)
    if precision is None:
        precision = default_precision(graph)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not "
                         f"{precision!r}")
    if nodes is None:
        order = graph.nodes()
    else:
        wanted = {nodes} if isinstance(nodes, str) else set(nodes)
        unknown = sorted(n for n in wanted if n not in graph.nx)
        if unknown:
            raise ValueError(f"graph {graph.name!r} has no node(s) "
                             f"{', '.join(map(repr, unknown))}; its nodes: "
                             f"{', '.join(n.name for n in graph.nodes())}")
        # One node (a target's per-op estimate) needs no topological sort of the graph.
        order = ([graph.node(n) for n in wanted] if len(wanted) == 1
                 else [n for n in graph.nodes() if n.name in wanted])
    kernels = tuple(estimate_node(graph, n, gpu, precision) for n in order
                    if n.op not in VIEW_OPS)
    return ModelEstimate(gpu, precision, kernels)


def estimate_node(graph: Graph, node: Node, gpu: Gpu, precision: str) -> KernelEstimate:
    """The roofline estimate of one node run as one kernel (see the module docstring;
    `estimate` checks `precision` and leaves views out)."""
    out_elements = sum(_elements(graph, t) for t in node.outputs)
    macs = _macs(graph, node, out_elements) if node.op in GEMM_OPS else 0
    if node.op in GEMM_OPS:
        ops = 2 * macs
        if node.op in ("attention", "qattention"):
            ops += SOFTMAX_OPS * _scores(graph, node)
        float_gemm = graph.tensors[node.inputs[0]].dtype == "float32"
        kernel_precision = "float32" if precision == "int8" and float_gemm else precision
    else:
        ops = _cuda_core_ops(graph, node, out_elements)
        kernel_precision = "float32"
    names = dict.fromkeys([t for t in node.inputs if t] + list(node.outputs))
    traffic = sum(_elements(graph, t) * _element_bytes(graph, t, precision) for t in names)
    if node.op in _READ_AS_WRITTEN:
        data = node.inputs[0]
        traffic += (out_elements - _elements(graph, data)) * _element_bytes(graph, data,
                                                                            precision)
    return KernelEstimate(node.name, node.op, kernel_precision, macs, ops, traffic,
                          compute_seconds=ops / gpu.peak(kernel_precision),
                          memory_seconds=traffic / gpu.bandwidth)


def _elements(graph: Graph, tensor: str) -> int:
    return math.prod(graph.tensors[tensor].shape)


def _element_bytes(graph: Graph, tensor: str, precision: str) -> int:
    dtype = graph.tensors[tensor].dtype
    # A float16 estimate holds the float graph's tensors in half precision.
    return 2 if precision == "float16" and dtype == "float32" else _ELEMENT_BYTES[dtype]


def _macs(graph: Graph, node: Node, out_elements: int) -> int:
    """Multiply-accumulates of a GEMM node: each output element sums over the
    reduction (a conv's I/groups x kH x kW, a dense's K, a matmul's last axis of a)."""
    if node.op in ("matmul", "qmatmul"):
        a = graph.tensors[node.inputs[0]].shape
        return out_elements * a[-1]
    if node.op in ("attention", "qattention"):
        d = graph.tensors[node.inputs[0]].shape[-1]
        dv = graph.tensors[node.inputs[2]].shape[-1]
        return _scores(graph, node) * (d + dv)
    weights = graph.tensors[node.inputs[1]].shape
    layout = parse_layout(node.attrs["kernel_layout"])
    # A packed weight tensor (OIHW16o16i, ...) holds the padded plain weights.
    plain = transform_shape(weights, layout, layout.base) if layout.packed else weights
    return out_elements * (math.prod(plain) // plain[0])


def _scores(graph: Graph, node: Node) -> int:
    """The scores of an attention node: batch x S queries x T keys."""
    out = graph.tensors[node.outputs[0]].shape
    t = graph.tensors[node.inputs[1]].shape[-2]
    return math.prod(out[:-1]) * t


def _cuda_core_ops(graph: Graph, node: Node, out_elements: int) -> int:
    """Operations of a kernel on the CUDA cores: one per window element of a pool's
    outputs, one per input element of a global pool or a reduction, `ELEMENT_OPS` per
    output element of the ops listed there, else one per output element."""
    if node.op in ELEMENT_OPS:
        return out_elements * ELEMENT_OPS[node.op]
    if node.op in _REDUCES:
        return _elements(graph, node.inputs[0])
    if node.op in _WINDOW_POOLS:
        kernel = node.attrs["kernel"]
        kernel = (kernel, kernel) if isinstance(kernel, int) else kernel
        return out_elements * math.prod(kernel)
    if node.op in _GLOBAL_POOLS:
        return _elements(graph, node.inputs[0])
    return out_elements
