"""Single conv2d workloads: ResNet-18's benchmark layers (as in VTA's benchmark; the table
is in docs/tool-facts.md), the model graph they are found in, and a synthetic one-node graph for any
workload.

A workload is (H, W, Cin, Cout, k, pad, stride[, groups]), batch 1. `parse_workload` reads
a name (``C5``), the seven numbers (``"28,28,128,128,3,1,1"``) or eight with the groups
(``"28,28,128,128,3,1,1,128"``: depthwise, one channel a group). A dense (fully
connected) workload is ``dense:IN,OUT[,BATCH]`` (`DenseWorkload`), as a classifier's last
layer (``dense:512,1000``) or a transformer's linear layer over its tokens
(``dense:768,3072,128``). A batched product of two activations is
``matmul:M,K,N[,BATCH]`` (`MatmulWorkload`), as attention's scores of 12 heads
(``matmul:128,64,128,12``); ``matmul_t:M,K,N[,BATCH]`` is the same product with b
stored transposed, (BATCH, N, K), as ``a @ b^T`` (the form the accelerator runs:
b's rows are its weight blocks).

A *named* workload (``C1``..``C11``) is ResNet-18's own layer, epilogue included:
`model_graph` is the zoo's ResNet-18 quantized exactly as ``vdla run resnet18`` quantizes
it (the same seeded calibration samples, `random_inputs`, with `vdla run`'s default seed
and count), and `conv_matches` picks its ``qconv2d`` nodes of a workload's shape. A
target's tuning key includes the epilogue (requantization, ReLU, residual add), so
records tuned on these nodes are the ones ``vdla run resnet18 --records`` looks up. One
name can be several nodes with different epilogues (C8 with a ReLU, and with a residual
add before the ReLU).

`workload_graph` builds a *synthetic* graph with one ``qconv2d`` (or ``qdense``,
``qmatmul``) node for any workload:
random int8 weights, an int32 bias, a per-tensor requantization shift and a ReLU clamp,
and a random int8 input. Its epilogue is its own (a quantized model shifts per channel),
so what is tuned on it serves only a model layer with that same epilogue.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from vdla.compiler.frontend import zoo
from vdla.compiler.frontend.builder import GraphBuilder
from vdla.compiler.frontend.datasets import random_inputs
from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.ops import conv_output_size
from vdla.compiler.ir.tensor import Node
from vdla.compiler.passes.prepare import prepare
from vdla.compiler.passes.quantize import quantize

__all__ = ["MODEL", "MODEL_CALIBRATION", "MODEL_SEED", "RESNET18", "ConvWorkload",
           "DenseWorkload", "MatmulWorkload", "conv_matches", "float_workload_graph", "model_graph", "parse_workload",
           "workload_graph"]

#: The model whose layers the names C1..C11 are.
MODEL = "resnet18"
#: How `model_graph` calibrates it: ``vdla run``'s defaults (``--seed 0``,
#: ``--calibration 4``). A run with other values may quantize a layer's epilogue
#: differently (a residual's rescaling step), and then its workload key differs.
MODEL_SEED = 0
MODEL_CALIBRATION = 4


class ConvWorkload(NamedTuple):
    h: int
    w: int
    cin: int
    cout: int
    k: int
    pad: int
    stride: int
    groups: int = 1

    @property
    def macs(self) -> int:
        ho = conv_output_size(self.h, self.k, self.stride, self.pad, self.pad)
        wo = conv_output_size(self.w, self.k, self.stride, self.pad, self.pad)
        return ho * wo * self.cout * (self.cin // self.groups) * self.k * self.k

    def spec(self) -> str:
        """The workload as `parse_workload` reads it (the groups only when not 1)."""
        return ",".join(map(str, self if self.groups != 1 else self[:7]))


class DenseWorkload(NamedTuple):
    """A fully connected layer: `batch` rows of `cin` features to `cout`."""

    cin: int
    cout: int
    batch: int = 1

    #: What a dense workload's text starts with (`parse_workload`).
    PREFIX = "dense:"

    @property
    def macs(self) -> int:
        return self.batch * self.cin * self.cout

    def spec(self) -> str:
        """The workload as `parse_workload` reads it (the batch only when not 1)."""
        return self.PREFIX + ",".join(map(str, self if self.batch != 1 else self[:2]))


class MatmulWorkload(NamedTuple):
    """A batched product of two activations: `batch` products of (`m`, `k`) @ (`k`,
    `n`); with `transpose_b`, b is stored (`n`, `k`) and the product is ``a @ b^T``."""

    m: int
    k: int
    n: int
    batch: int = 1
    transpose_b: bool = False

    #: What a product workload's text starts with (`parse_workload`), and a product's
    #: with b transposed.
    PREFIX = "matmul:"
    PREFIX_T = "matmul_t:"

    @property
    def macs(self) -> int:
        return self.batch * self.m * self.k * self.n

    def spec(self) -> str:
        """The workload as `parse_workload` reads it (the batch only when not 1)."""
        sizes = self[:4] if self.batch != 1 else self[:3]
        return (self.PREFIX_T if self.transpose_b else self.PREFIX) + ",".join(map(str, sizes))


#: ResNet-18's conv workloads C1-C11 (H, W, Cin, Cout, k, pad, stride), batch 1.
RESNET18: dict[str, ConvWorkload] = {name: ConvWorkload(*shape) for name, shape in {
    "C1": (224, 224, 3, 64, 7, 3, 2),
    "C2": (56, 56, 64, 64, 3, 1, 1),
    "C3": (56, 56, 64, 128, 3, 1, 2),
    "C4": (56, 56, 64, 128, 1, 0, 2),
    "C5": (28, 28, 128, 128, 3, 1, 1),
    "C6": (28, 28, 128, 256, 3, 1, 2),
    "C7": (28, 28, 128, 256, 1, 0, 2),
    "C8": (14, 14, 256, 256, 3, 1, 1),
    "C9": (14, 14, 256, 512, 3, 1, 2),
    "C10": (14, 14, 256, 512, 1, 0, 2),
    "C11": (7, 7, 512, 512, 3, 1, 1),
}.items()}


def parse_workload(spec: str) -> tuple[str, ConvWorkload | DenseWorkload | MatmulWorkload]:
    """(name, workload) from a ResNet-18 workload name (``C5``, any case),
    ``H,W,Cin,Cout,k,pad,stride[,groups]``, ``dense:IN,OUT[,BATCH]`` or
    ``matmul:M,K,N[,BATCH]`` (``matmul_t:``: b transposed). Raises ValueError naming
    what is wrong."""
    text = str(spec).strip()
    if text.upper() in RESNET18:
        return text.upper(), RESNET18[text.upper()]
    if text.lower().startswith(MatmulWorkload.PREFIX_T):
        w = _parse_sizes(text, MatmulWorkload, MatmulWorkload.PREFIX_T)
        return text.lower(), w._replace(transpose_b=True)
    for kind in (DenseWorkload, MatmulWorkload):
        if text.lower().startswith(kind.PREFIX):
            return text.lower(), _parse_sizes(text, kind)
    parts = text.split(",")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (7, 8):
        raise ValueError(f"workload {spec!r} is neither a ResNet-18 workload name "
                         f"({', '.join(RESNET18)}) nor H,W,Cin,Cout,k,pad,stride[,groups] "
                         "(7 or 8 integers)")
    w = ConvWorkload(*values)
    if min(w.h, w.w, w.cin, w.cout, w.k, w.stride, w.groups) < 1 or w.pad < 0:
        raise ValueError(f"workload {spec!r}: sizes, kernel, stride and groups must be >= 1 "
                         "and the pad >= 0")
    if w.cin % w.groups or w.cout % w.groups:
        raise ValueError(f"workload {spec!r}: {w.groups} groups do not divide {w.cin} input "
                         f"and {w.cout} output channels")
    if (w.h + 2 * w.pad - w.k) < 0 or (w.w + 2 * w.pad - w.k) < 0:
        raise ValueError(f"workload {spec!r}: a {w.k}x{w.k} kernel does not fit the padded "
                         f"{w.h}x{w.w} input")
    return text, w


def _parse_sizes(text: str, kind, prefix: str | None = None):
    """A `DenseWorkload` or `MatmulWorkload` (`kind`) from its text: its `prefix` (the
    kind's own by default), then its fields' sizes, the last (the batch) optional."""
    prefix = prefix or kind.PREFIX
    try:
        values = [int(p) for p in text[len(prefix):].split(",")]
    except ValueError:
        values = []
    fields = ["IN", "OUT", "BATCH"] if kind is DenseWorkload else ["M", "K", "N", "BATCH"]
    if len(values) not in (len(fields) - 1, len(fields)):
        raise ValueError(f"workload {text!r}: a {prefix[:-1]} workload is "
                         f"{prefix}{','.join(fields[:-1])}[,{fields[-1]}] "
                         f"({len(fields) - 1} or {len(fields)} integers)")
    if min(values) < 1:
        raise ValueError(f"workload {text!r}: the sizes and the batch must be >= 1")
    return kind(*values)


@functools.lru_cache(maxsize=4)
def model_graph(mode: str) -> Graph:
    """The zoo's ResNet-18 (`MODEL`) quantized for requantization `mode` (``"shift"`` or
    ``"multiply"``: a target's ``requant_modes[0]``) as ``vdla run resnet18`` quantizes
    it: calibrated on `random_inputs` with `MODEL_SEED` and `MODEL_CALIBRATION`, the
    pipeline's defaults. Building and calibrating it takes seconds, so it is made once
    per process and mode; callers share the graph and must not modify it."""
    graph = zoo.get(MODEL)
    name = graph.inputs[0]
    samples, _ = random_inputs(graph.tensors[name].shape, seed=MODEL_SEED,
                               calibration=MODEL_CALIBRATION)
    return quantize(graph, {name: samples}, mode)


def conv_matches(node: Node, graph: Graph, workload: ConvWorkload) -> bool:
    """Whether `node` of quantized `graph` is a plain (NCHW, OIHW, undilated) batch-1
    ``qconv2d`` computing `workload`'s shape and groups, whatever its epilogue."""
    w, a = workload, node.attrs
    if node.op != "qconv2d" or a.get("groups", 1) != w.groups:
        return False
    if (a.get("data_layout", "NCHW"), a.get("kernel_layout", "OIHW")) != ("NCHW", "OIHW"):
        return False
    if tuple(a.get("dilations", (1, 1))) != (1, 1):
        return False
    x, weights = (graph.tensors[name].shape for name in node.inputs[:2])
    return (tuple(x) == (1, w.cin, w.h, w.w)
            and tuple(weights) == (w.cout, w.cin // w.groups, w.k, w.k)
            and tuple(a["strides"]) == (w.stride, w.stride)
            and tuple(a["pads"]) == (w.pad,) * 4)


def workload_graph(workload: ConvWorkload | DenseWorkload | MatmulWorkload, *, seed: int = 0,
                   shift: int = 10, relu: bool = True) -> tuple[Graph, dict[str, np.ndarray]]:
    """A synthetic graph with one qconv2d node ``conv`` (a `DenseWorkload`: one qdense
    node ``dense``; a `MatmulWorkload`: one qmatmul node ``matmul`` of int8 inputs "a"
    and "b", its shift set from `shift` and k so that its outputs spread over int8)
    computing `workload`, and a feed {"x": int8 input} ({"a", "b"}).

    workload : the shape
    seed : seeds the int8 weights in [-8, 8), the int32 bias and the input
    shift : the per-tensor requantization shift (small weights keep the outputs spread
        over int8 at shift 10, so a wrong accumulation shows in the result)
    relu : clamp at 0 (ReLU) rather than at -128
    Its epilogue is its own, not a model's (see the module docstring)."""
    rng = np.random.default_rng(seed)
    if isinstance(workload, DenseWorkload):
        return _dense_graph(workload, rng, shift, relu)
    if isinstance(workload, MatmulWorkload):
        return _matmul_graph(workload, rng, shift, relu)
    w = workload
    g = Graph(f"conv_{w.h}x{w.w}_{w.cin}_{w.cout}_k{w.k}p{w.pad}s{w.stride}"
              + (f"g{w.groups}" if w.groups != 1 else ""))
    x = g.add_input("x", (1, w.cin, w.h, w.w), "int8")
    weights = g.add_constant("w", rng.integers(-8, 8, (w.cout, w.cin // w.groups, w.k, w.k))
                             .astype(np.int8), "int8")
    bias = g.add_constant("b", rng.integers(-2000, 2000, (w.cout,)).astype(np.int32), "int32")
    groups = {"groups": w.groups} if w.groups != 1 else {}
    y = g.add_node("qconv2d", [x, weights, bias], name="conv", strides=(w.stride, w.stride),
                   pads=(w.pad,) * 4, shift=(shift,), out_min=0 if relu else -128,
                   out_max=127, **groups)
    g.set_outputs([y])
    feed = {"x": rng.integers(-128, 128, (1, w.cin, w.h, w.w)).astype(np.int8)}
    return g, feed


def _dense_graph(w: DenseWorkload, rng, shift: int, relu: bool
                 ) -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph(f"dense_{w.cin}_{w.cout}" + (f"_n{w.batch}" if w.batch != 1 else ""))
    x = g.add_input("x", (w.batch, w.cin), "int8")
    weights = g.add_constant("w", rng.integers(-8, 8, (w.cout, w.cin)).astype(np.int8), "int8")
    bias = g.add_constant("b", rng.integers(-2000, 2000, (w.cout,)).astype(np.int32), "int32")
    y = g.add_node("qdense", [x, weights, bias], name="dense", shift=(shift,),
                   out_min=0 if relu else -128, out_max=127)
    g.set_outputs([y])
    return g, {"x": rng.integers(-128, 128, (w.batch, w.cin)).astype(np.int8)}


def _matmul_graph(w: MatmulWorkload, rng, shift: int, relu: bool
                  ) -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph(f"matmul_{w.m}_{w.k}_{w.n}" + (f"_b{w.batch}" if w.batch != 1 else "")
              + ("_t" if w.transpose_b else ""))
    a = g.add_input("a", (w.batch, w.m, w.k), "int8")
    b = g.add_input("b", (w.batch, w.n, w.k) if w.transpose_b else (w.batch, w.k, w.n),
                    "int8")
    transposed = {"transpose_b": True} if w.transpose_b else {}
    # A product of two uniform int8 spreads by about 2**12.4, a sum of k of them by
    # sqrt(k) more: shift 10 - 4 + log2(k) / 2 leaves about 2**6 to 2**7 of it.
    y = g.add_node("qmatmul", [a, b], name="matmul",
                   shift=(shift - 4 + (w.k.bit_length() - 1) // 2,),
                   out_min=0 if relu else -128, out_max=127, **transposed)
    g.set_outputs([y])
    return g, {n: rng.integers(-128, 128, g.tensors[n].shape).astype(np.int8)
               for n in ("a", "b")}


def float_workload_graph(workload: ConvWorkload | DenseWorkload | MatmulWorkload, *,
                         seed: int = 0) -> Graph:
    """A synthetic float32 graph computing `workload`: one ``conv2d`` (or ``dense``) with
    He-normal weights and a small bias, then a ReLU, prepared as a float model is
    (`prepare`: the ReLU fused into the convolution), so that its one tunable node has a
    float model layer's epilogue; a `MatmulWorkload` is one ``matmul`` node of inputs "a"
    and "b". `seed` seeds the weights."""
    if isinstance(workload, MatmulWorkload):
        w = workload
        if w.transpose_b:    # the float graph's matmul has no transposed operand
            raise ValueError(f"workload {w.spec()!r}: a float32 product is "
                             "matmul:M,K,N[,BATCH] (b not transposed)")
        g = Graph(f"matmul_{w.m}_{w.k}_{w.n}_b{w.batch}_f32")
        a = g.add_input("a", (w.batch, w.m, w.k), "float32")
        b = g.add_input("b", (w.batch, w.k, w.n), "float32")
        g.set_outputs([g.add_node("matmul", [a, b], name="matmul")])
        return g
    if isinstance(workload, DenseWorkload):
        b = GraphBuilder(f"dense_{workload.cin}_{workload.cout}_f32", seed=seed)
        x = b.input("x", (workload.batch, workload.cin))
        return prepare(b.build(b.relu(b.dense(x, workload.cout, name="dense"), name="relu")))
    w = workload
    b = GraphBuilder(f"conv_{w.h}x{w.w}_{w.cin}_{w.cout}_k{w.k}p{w.pad}s{w.stride}"
                     + (f"g{w.groups}" if w.groups != 1 else "") + "_f32", seed=seed)
    x = b.input("x", (1, w.cin, w.h, w.w))
    y = b.conv(x, w.cout, w.k, stride=w.stride, padding=w.pad, groups=w.groups, bias=True,
               name="conv")
    return prepare(b.build(b.relu(y, name="relu")))
