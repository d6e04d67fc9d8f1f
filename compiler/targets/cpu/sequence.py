"""The data movement and elementwise math of sequence models compiled to C: transpose,
slice, expand, gather, where, cast, comparisons, sub/div/pow (and add/mul with any
broadcast), unary math (sqrt, erf, tanh, exp, neg) and the reductions.

    if sequence_refusal(node, graph) is None:
        kernel = sequence_kernel(node, graph, isa)

Most of them are one loop nest over the output (`_strided`): every operand is read
through element strides per output axis (0 along a broadcast axis; a transpose's
permuted strides; a slice's start offset and stepped strides), with adjacent axes merged
where every operand allows it, so a transpose of (B, S, H, D) to (B, H, S, D) copies runs
of D and an expand is one broadcast read. OpenMP shares the outer index when the tensor
is large; the innermost loop has literal strides, which gcc vectorizes when they are 0
or 1.

``gather`` (an embedding lookup) copies one run per index, checking every index first:
an index outside [-n, n) is never read through; the kernel reports it with
``vdla_fail`` (``c/runtime.c``) with the message `vdla.compiler.ir.ops_sequence
.check_gather_indices` gives, writes zeros in its place, and the session or the runner
raises it as a ValueError (`Kernel.checks`).

Float math follows numpy on float32 values rounded once (add, sub, mul, div, neg,
comparisons, casts: the reference's float64 result rounds to the same float32);
``erf``/``tanh``/``exp`` use `vdla_cpu.h`'s vector functions (a few ulps), ``pow`` the C
library's ``powf`` (x * x for an exponent of 2), reductions sum in double.
"""

from __future__ import annotations

import numpy as np

from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import DTYPES, Node
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params
from vdla.compiler.targets.cpu.opbase import PARALLEL_MIN, CTYPES, Sources, size

__all__ = ["BROADCAST_OPS", "SEQUENCE_OPS", "sequence_kernel", "sequence_refusal"]

#: C types of the tensors these kernels move (bool: one byte, 0 or 1).
_TYPES = CTYPES
_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_COMPARE = {"equal": "==", "less": "<", "greater": ">"}
_UNARY_MATH = ("sqrt", "erf", "tanh", "exp")
_COPIES = ("transpose", "slice", "expand")
#: The ops of this module; `BROADCAST_OPS` also run here when the elementwise kernels of
#: `vdla.compiler.targets.cpu.elementwise` refuse their broadcast.
SEQUENCE_OPS = frozenset({"sub", "div", "pow", "neg", "where", "cast", "gather",
                          "reduce_mean", "reduce_sum", "reduce_max", *_COMPARE, *_UNARY_MATH,
                          *_COPIES})
BROADCAST_OPS = frozenset({"add", "mul"})


def _strides(shape) -> list[int]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return out[::-1]


def _broadcast_strides(shape, out) -> list[int]:
    """Element strides of an operand of `shape` read at every index of `out` (numpy
    broadcasting: 0 along an axis it lacks or has of size 1)."""
    shape = (1,) * (len(out) - len(shape)) + tuple(shape)
    return [0 if d == 1 and o != 1 else s for d, o, s in zip(shape, out, _strides(shape))]


def sequence_refusal(node: Node, graph: Graph) -> str | None:
    """Why `sequence_kernel` does not compile `node`, or None."""
    t = graph.tensors
    names = [n for n in node.inputs if n]
    dtypes = [t[n].dtype for n in names]
    out = t[node.outputs[0]]
    for name in names + list(node.outputs):
        if t[name].dtype not in _TYPES:
            return (f"{node.op} node {node.name!r}: tensor {name!r} is {t[name].dtype}; the "
                    f"CPU target moves {', '.join(_TYPES)}")
    if size(out.shape) == 0:
        return f"{node.op} node {node.name!r}: an empty output"
    if node.op in _UNARY_MATH or node.op in ("pow", "reduce_mean", "reduce_sum", "reduce_max") \
            or node.op in _BINARY:
        if set(dtypes) != {"float32"}:
            return (f"{node.op} node {node.name!r} on {'/'.join(sorted(set(dtypes)))}: the CPU "
                    "target computes it on float32")
    if node.op in _COMPARE and len(set(dtypes)) != 1:
        return f"{node.op} node {node.name!r} compares {dtypes[0]} with {dtypes[1]}"
    if node.op == "where" and (dtypes[0] != "bool" or dtypes[1] != dtypes[2]):
        return (f"where node {node.name!r}: condition {dtypes[0]}, values {dtypes[1]} and "
                f"{dtypes[2]}; the CPU target needs a bool condition and one value dtype")
    if node.op == "slice" and any(int(s) < 1 for s in node.attrs["steps"] or ()):
        return f"slice node {node.name!r}: steps {node.attrs['steps']}; the CPU target needs >= 1"
    return None


def sequence_kernel(node: Node, graph: Graph, isa: Isa) -> Kernel:
    """The kernel of a node `sequence_refusal` accepts."""
    if node.op == "gather":
        return _gather(node, graph)
    if node.op.startswith("reduce_"):
        return _reduce(node, graph)
    if node.op in _UNARY_MATH:
        return _unary_math(node, graph, isa)
    return _strided(node, graph)


# --- one loop nest over the output --------------------------------------------------------

def _operands(node: Node, graph: Graph) -> list[tuple[str, int, list[int]]]:
    """(tensor, base offset, strides per output axis) of each operand read."""
    t = graph.tensors
    out = t[node.outputs[0]].shape
    x = node.inputs[0]
    if node.op == "transpose":
        perm = node.attrs["perm"] or tuple(reversed(range(len(out))))
        st = _strides(t[x].shape)
        return [(x, 0, [st[p] for p in perm])]
    if node.op == "slice":
        shape = t[x].shape
        st = _strides(shape)
        a = node.attrs
        starts = [0] * len(shape)
        steps = [1] * len(shape)
        axes = a["axes"] or range(len(a["starts"]))
        for ax, b, s in zip(axes, a["starts"], a["steps"] or (1,) * len(a["starts"])):
            ax = int(ax) % len(shape)
            starts[ax], steps[ax] = int(b), int(s)
        return [(x, sum(b * s for b, s in zip(starts, st)), [s * k for s, k in zip(st, steps)])]
    return [(n, 0, _broadcast_strides(t[n].shape, out)) for n in node.inputs if n]


def _merge(out, operands):
    """`out` and every operand's strides with adjacent axes merged where every operand
    (and the contiguous output) steps through them as one; axes of size 1 dropped."""
    if not out:                              # a scalar: one run of one value
        return [1], [[0] for _ in operands]
    dims = [d for d in out]
    strides = [list(s) for _, _, s in operands]
    keep = [k for k, d in enumerate(dims) if d != 1] or [len(dims) - 1]
    dims = [dims[k] for k in keep]
    strides = [[s[k] for k in keep] for s in strides]
    k = len(dims) - 1
    while k > 0:
        if all(s[k - 1] == s[k] * dims[k] for s in strides):
            dims[k - 1:k + 1] = [dims[k - 1] * dims[k]]
            for s in strides:
                s[k - 1:k + 1] = [s[k]]
        k -= 1
    return dims, strides


def _value(node: Node, graph: Graph, reads: list[str]) -> str:
    """C: the output value from the operands' values `reads` (C expressions)."""
    op = node.op
    t_out = _TYPES[graph.tensors[node.outputs[0]].dtype]
    if op in _BINARY:
        return f"{reads[0]} {_BINARY[op]} {reads[1]}"
    if op in _COMPARE:
        return f"(uint8_t)({reads[0]} {_COMPARE[op]} {reads[1]})"
    if op == "pow":
        exponent = graph.constant(node.inputs[1])
        if exponent is not None and exponent.size == 1 and float(exponent.reshape(-1)[0]) == 2.0:
            return f"{reads[0]} * {reads[0]}"
        return f"powf({reads[0]}, {reads[1]})"
    if op == "neg":
        return f"({t_out})(-{reads[0]})"
    if op == "where":
        return f"{reads[0]} ? {reads[1]} : {reads[2]}"
    if op == "cast":
        src = graph.tensors[node.inputs[0]].dtype
        if node.attrs["dtype"] == "bool":
            return f"(uint8_t)({reads[0]} != 0)"
        if src == "float32" and np.dtype(DTYPES[node.attrs["dtype"]]).kind in "iu":
            return f"({t_out})truncf({reads[0]})"
        return f"({t_out})({reads[0]})"
    return reads[0]                          # the copies


def _strided(node: Node, graph: Graph) -> Kernel:
    t = graph.tensors
    out = t[node.outputs[0]].shape
    params = Params()
    sources = Sources(graph, params)
    operands = _operands(node, graph)
    dims, strides = _merge(out, operands)
    inner = dims[-1]
    outer = size(dims[:-1])
    ptrs, lines, reads = [], [], []
    for i, ((name, base, _), st) in enumerate(zip(operands, strides)):
        ctype = _TYPES[t[name].dtype]
        ptrs.append(f"const {ctype} *restrict p{i} = {sources.pointer(name, ctype)};")
        lines.append(f"size_t i{i} = {base}; (void)i{i}; (void)p{i};")
        reads.append(f"p{i}[i{i} + j * {st[-1]}]")
    decompose = []
    for k in range(len(dims) - 2, -1, -1):
        adds = " ".join(f"i{i} += q * {st[k]};" for i, st in enumerate(strides) if st[k])
        decompose.append(f"{{ const size_t q = r % {dims[k]}; r /= {dims[k]}; {adds} }}"
                         if adds else f"r /= {dims[k]};")
    t_out = _TYPES[t[node.outputs[0]].dtype]
    total = size(out)
    pragma = ("#pragma omp parallel for schedule(static)"
              if total >= PARALLEL_MIN and outer > 1 else "")
    body = f"""
/* {node.op} {[t[n].shape for n in node.inputs if n]} -> {out}: {outer} runs of {inner} */
void NAME{SIGNATURE} {{
    {" ".join(ptrs)}
    {t_out} *restrict Y = ({t_out} *)out_;
    (void)ws;
    {pragma}
    for (size_t o = 0; o < {outer}; o++) {{
        size_t r = o; (void)r;
        {" ".join(lines)}
        {" ".join(decompose)}
        {t_out} *restrict y = Y + o * {inner};
        for (size_t j = 0; j < {inner}; j++) y[j] = {_value(node, graph, reads)};
    }}
}}
"""
    return Kernel(body, params.blob(), tuple(sources.inputs),
                  items=outer if pragma else 1)


def _unary_math(node: Node, graph: Graph, isa: Isa) -> Kernel:
    """sqrt, erf, tanh, exp: one flat loop (input and output have one shape)."""
    vl = isa.lanes[0]
    v = f"vf{vl}"
    params = Params()
    sources = Sources(graph, params)
    x = sources.pointer(node.inputs[0], "float")
    total = size(graph.tensors[node.outputs[0]].shape)
    pragma = "#pragma omp parallel for schedule(static)" if total >= PARALLEL_MIN // 8 else ""
    if node.op == "sqrt":
        loop = f"""{pragma}
    for (size_t j = 0; j < {total}; j++) Y[j] = sqrtf(X[j]);"""
    else:
        fn = f"{v}_{node.op}"
        loop = f"""{pragma}
    for (size_t b = 0; b < {total // vl}; b++) {v}_store(Y + b * {vl}, {fn}({v}_load(X + b * {vl})));
    if ({total % vl})
        {v}_store_n(Y + {total // vl * vl}, {fn}({v}_load_n(X + {total // vl * vl}, {total % vl})), {total % vl});"""
    body = f"""
/* {node.op} of {total} float values */
void NAME{SIGNATURE} {{
    const float *restrict X = {x};
    float *restrict Y = (float *)out_;
    (void)ws;
    {loop}
}}
"""
    return Kernel(body, params.blob(), tuple(sources.inputs))


# --- reductions ----------------------------------------------------------------------------

def _reduce(node: Node, graph: Graph) -> Kernel:
    """reduce_mean / reduce_sum (in double) and reduce_max over any axes: one loop nest
    per output value over the reduced axes (the kept and the reduced axes each merged)."""
    t = graph.tensors
    shape = t[node.inputs[0]].shape
    axes = tuple(int(a) % len(shape) for a in node.attrs["axes"]) or tuple(range(len(shape)))
    st = _strides(shape)
    kept = [(shape[k], st[k]) for k in range(len(shape)) if k not in axes and shape[k] > 1]
    red = [(shape[k], st[k]) for k in range(len(shape)) if k in axes and shape[k] > 1]
    count = size([d for d, _ in red])
    params = Params()
    sources = Sources(graph, params)
    x = sources.pointer(node.inputs[0], "float")
    n_out = size([d for d, _ in kept])
    decompose = " ".join(f"{{ const size_t q = r % {d}; r /= {d}; base += q * {s}; }}"
                         for d, s in reversed(kept))
    loops, index = [], "base"
    for k, (d, s) in enumerate(red):
        loops.append(f"for (size_t r{k} = 0; r{k} < {d}; r{k}++)")
        index += f" + r{k} * {s}"
    maximum = node.op == "reduce_max"
    acc = "float a = -INFINITY;" if maximum else "double a = 0;"
    step = "a = a != a ? a : (v > a || v != v ? v : a);" if maximum else "a += v;"
    result = "a" if maximum else ("(float)(a / " + f"{count}.0)" if node.op == "reduce_mean"
                                  else "(float)a")
    pragma = ("#pragma omp parallel for schedule(static)"
              if n_out > 1 and n_out * count >= PARALLEL_MIN else "")
    body = f"""
/* {node.op} of {shape} over axes {axes}: {n_out} values of {count} */
void NAME{SIGNATURE} {{
    const float *restrict X = {x};
    float *restrict Y = (float *)out_;
    (void)ws;
    {pragma}
    for (size_t o = 0; o < {n_out}; o++) {{
        size_t r = o, base = 0; (void)r;
        {decompose}
        {acc}
        {" ".join(loops)} {{ const float v = X[{index}]; {step} }}
        Y[o] = {result};
    }}
}}
"""
    return Kernel(body, params.blob(), tuple(sources.inputs), items=n_out if pragma else 1)


# --- gather ----------------------------------------------------------------------------------

def _gather(node: Node, graph: Graph) -> Kernel:
    t = graph.tensors
    data, idx = node.inputs[0], node.inputs[1]
    shape = t[data].shape
    axis = int(node.attrs["axis"]) % len(shape)
    n = shape[axis]
    outer, inner = size(shape[:axis]), size(shape[axis + 1:])
    count = size(t[idx].shape)
    itemsize = np.dtype(DTYPES[t[data].dtype]).itemsize
    run = inner * itemsize
    params = Params()
    sources = Sources(graph, params)
    d_ptr = sources.pointer(data, "unsigned char")
    i_type = _TYPES[t[idx].dtype]
    i_ptr = sources.pointer(idx, i_type)
    # the message of vdla.compiler.ir.ops_sequence.check_gather_indices, around the value
    prefix = f"node {node.name!r} (gather): index "
    suffix = (f" in {idx!r} is outside [{-n}, {n}), the {n} entries of {data!r} along axis "
              f"{node.attrs['axis']}")
    pre = params.add(np.frombuffer(prefix.encode() + b"\0", np.uint8))
    suf = params.add(np.frombuffer(suffix.encode() + b"\0", np.uint8))
    pragma = ("#pragma omp parallel for schedule(static)"
              if outer * count * run >= 1 << 18 and outer * count > 1 else "")
    body = f"""
/* gather {shape} along axis {axis} at {count} indices: runs of {run} bytes */
void NAME{SIGNATURE} {{
    const unsigned char *restrict D = {d_ptr};
    const {i_type} *restrict I = {i_ptr};
    unsigned char *restrict Y = (unsigned char *)out_;
    (void)ws;
    {pragma}
    for (size_t w = 0; w < {outer * count}; w++) {{
        const size_t o = w / {count}, i = w % {count};
        long long v = (long long)I[i];
        unsigned char *restrict y = Y + w * {run};
        if (v < {-n} || v >= {n}) {{
            vdla_fail((const char *)(params + {pre}), v, (const char *)(params + {suf}));
            memset(y, 0, {run});
            continue;
        }}
        if (v < 0) v += {n};
        memcpy(y, D + (o * {n} + (size_t)v) * {run}, {run});
    }}
}}
"""
    return Kernel(body, params.blob(), tuple(sources.inputs),
                  items=outer * count if pragma else 1, checks=True)
