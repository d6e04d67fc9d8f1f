"""What the CPU target's generic kernels share (`vdla.compiler.targets.cpu.ops`):
the C types, when loops go parallel, the requantization tables and helper, the
parallel loop nest, and the checks that refuse a node with a reason."""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference.integer import QuantizationError, per_channel, requantize
from vdla.compiler.targets.cpu.kernel import Kernel, Params

#: Elementwise work (elements, or pool outputs x window taps) from which a loop is
#: shared by OpenMP threads: below it, starting the team costs more than it saves.
PARALLEL_MIN = 1 << 16
#: Bytes from which a copy is shared by OpenMP threads, and the piece each takes.
COPY_PARALLEL_MIN = 1 << 18
COPY_PIECE = 1 << 16
#: The most bytes of a pool's padded row buffer (it lives on each thread's stack).
POOL_ROW_MAX = 1 << 16

CTYPES = {"float32": "float", "int8": "int8_t", "uint8": "uint8_t", "int32": "int32_t",
           "int64": "int64_t", "bool": "uint8_t"}

OK = "generated C on the host CPU"

__all__ = ["COPY_PARALLEL_MIN", "COPY_PIECE", "CTYPES", "OK", "PARALLEL_MIN", "POOL_ROW_MAX",
           "RQ_HELPER", "Sources", "dtype_refusal", "indent", "is_per_channel", "kernel",
           "parallel_nest", "requant_attrs_refusal", "rq_refusal", "rq_tables", "size"]


# --- shared pieces -------------------------------------------------------------------------

def size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def indent(text: str, spaces: int) -> str:
    pad = " " * spaces
    return ("\n" + pad).join(text.splitlines())


class Sources:
    """Where a kernel reads its operands: computed tensors from ``in[k]`` (each distinct
    tensor once, in first-use order: `inputs`), constants from ``params``."""

    def __init__(self, graph: Graph, params: Params):
        self.graph, self.params = graph, params
        self.inputs: list[str] = []

    def pointer(self, name: str, ctype: str, data: np.ndarray | None = None) -> str:
        """A C expression: a ``const ctype *`` to tensor `name`'s elements. `data`
        replaces a constant's values (qadd's pre-requantized constants)."""
        if data is None:
            data = self.graph.constant(name)
        if data is not None:
            return f"(const {ctype} *)(params + {self.params.add(np.ascontiguousarray(data))})"
        if name not in self.inputs:
            self.inputs.append(name)
        return f"(const {ctype} *)in[{self.inputs.index(name)}]"


def kernel(body: str, params: Params, sources: Sources) -> Kernel:
    return Kernel(body, params.blob(), tuple(sources.inputs))


def rq_tables(multiplier, shift, count: int) -> np.ndarray:
    """Requantization parameters as four uint32 rows of `count`: multiplier (1 for
    none), left shift, rounding constant, right shift, so that ``NAME_rq`` needs no
    branch (the shift's sign picks left or right; multiplying by 1 changes nothing)."""
    m = per_channel(multiplier, count, 1).astype(np.int64)
    s = per_channel(shift, count).astype(np.int64)
    right = s > 0
    rounding = np.where(right, np.left_shift(1, np.maximum(s - 1, 0)), 0)
    return np.stack([m, np.where(right, 0, -s), rounding, np.where(right, s, 0)]
                    ).astype(np.uint32)


#: The requantization step of `vdla.compiler.reference.integer` from `rq_tables`' values.
RQ_HELPER = """
/* requantize: (a * m) << l, + r, >> s arithmetic (l = 0 or r = s = 0), modulo 2**32 */
static inline int32_t NAME_rq(int32_t a, uint32_t m, uint32_t l, uint32_t r, uint32_t s) {
    return (int32_t)((((uint32_t)a * m) << l) + r) >> s;
}
"""


def is_per_channel(multiplier, shift) -> bool:
    """Whether requantization parameters hold more than one value."""
    return np.size(shift) > 1 or (multiplier is not None and np.size(multiplier) > 1)


def rq_refusal(node: Node, multiplier, shift, shape) -> str | None:
    """Why the reference would refuse to requantize an operand of `shape` with these
    parameters along axis 1 (bounds, per-channel counts), or None."""
    probe = tuple(1 if k != 1 else d for k, d in enumerate(shape))
    try:
        requantize(np.zeros(probe, np.int32), multiplier, shift, axis=1)
    except QuantizationError as e:
        return f"{node.op} node {node.name!r}: {e}"
    return None


def parallel_nest(n: int, c: int, p: int, decls: list[str], stmt: str) -> str:
    """C loops over an (n, c, p) view: `decls` once per (n, c) (they may use ``n`` and
    ``c``), `stmt` per element (``base + j`` is its flat index). OpenMP shares the
    (n, c) pairs, or the innermost loop when there are few pairs."""
    big = n * c * p >= PARALLEL_MIN
    pairs = "#pragma omp parallel for collapse(2) schedule(static)\n" \
        if big and p > 1 and n * c >= 8 else ""
    inner_pragma = "#pragma omp parallel for schedule(static)\n" \
        if big and p > 1 and n * c < 8 else ""
    outer_pragma = "#pragma omp parallel for schedule(static)\n" \
        if big and p == 1 and n >= 8 else ""
    head = "\n".join(decls)
    if p > 1:
        inner = f"{inner_pragma}for (size_t j = 0; j < {p}; j++) {stmt}"
    else:
        inner = f"const size_t j = 0; {stmt}"
    return f"""{pairs or outer_pragma}for (int n = 0; n < {n}; n++)
for (int c = 0; c < {c}; c++) {{
    const size_t base = ((size_t)n * {c} + c) * {p};
    {indent(head, 4)}
    {indent(inner, 4)}
}}"""


# --- checks ------------------------------------------------------------------------------

def dtype_refusal(node: Node, graph: Graph, allowed: tuple[str, ...]) -> str | None:
    """None when every input and output of `node` has one dtype among `allowed`."""
    names = [t for t in node.inputs if t] + list(node.outputs)
    dtypes = sorted({graph.tensors[t].dtype for t in names})
    if len(dtypes) > 1:
        return (f"{node.op} node {node.name!r} mixes {' and '.join(dtypes)} tensors: the CPU "
                "target needs one dtype for its inputs and output")
    if dtypes[0] not in allowed:
        return (f"{node.op} node {node.name!r} on {dtypes[0]} tensors: the CPU target runs "
                f"it on {' or '.join(allowed)}")
    return None



def requant_attrs_refusal(node: Node, graph: Graph) -> str | None:
    shape = graph.tensors[node.inputs[0]].shape
    return rq_refusal(node, node.attrs["multiplier"], node.attrs["shift"], shape)


