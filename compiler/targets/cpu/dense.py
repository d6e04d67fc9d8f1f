"""Dense layers (``dense``, ``qdense``) compiled to C.

    shape = DenseShape.from_node(node, graph)        # vdla.compiler.targets.cpu.shapes
    kernel = dense_kernel(shape, schedule, weights, bias, node, isa, inputs)

Vectors run along the output features: a vector of accumulators is ``vl`` consecutive
outputs of one row, which is how the plain (N, O) output stores them, so the epilogue
works on whole vectors with per-lane requantization tables. Each reduction step
broadcasts one input value (int8: four, as a 32-bit word) and loads ``ov`` weight
vectors from weights packed ``[output tile][k][ov * vl]`` (int8:
``[output tile][k / 4][ov * vl][4]``). A batch-1 dense layer reads every weight once:
it runs at the speed of memory, and the schedule only decides how many output vectors
share each broadcast input.

int8 follows `vdla.compiler.targets.cpu.conv`: an input not known to be non-negative is
read as ``x + 128`` and the bias absorbs ``-128 · sum(w)``.
"""

from __future__ import annotations


import numpy as np

from vdla.compiler.ir.tensor import Node
from vdla.compiler.targets.cpu.epilogue import (Epilogue, Lanes, Operands, table_pointers,
                                               tables)
from vdla.compiler.targets.cpu.shapes import DenseShape
from vdla.compiler.targets.cpu.isa import Isa
from vdla.compiler.targets.cpu.kernel import SIGNATURE, Kernel, Params
from vdla.compiler.targets.cpu.schedule import DenseSchedule

__all__ = ["dense_kernel"]


def _pack(shape: DenseShape, w: np.ndarray, tile: int) -> np.ndarray:
    op = -(-shape.o // tile) * tile
    wp = np.zeros((op, shape.k_padded), w.dtype)
    wp[:shape.o, :shape.k] = w
    if shape.int8:
        wp = wp.reshape(op // tile, tile, shape.k_padded // 4, 4).transpose(0, 2, 1, 3)
    else:
        wp = wp.reshape(op // tile, tile, shape.k).transpose(0, 2, 1)
    return np.ascontiguousarray(wp)


def dense_kernel(shape: DenseShape, schedule: DenseSchedule, weights: np.ndarray,
                 bias: np.ndarray | None, node: Node, isa: Isa,
                 inputs: tuple[str, ...]) -> Kernel:
    """The `Kernel` of dense layer `shape` with `schedule` (checked on `isa`)."""
    s = schedule.check(shape, isa)
    vl, ov = s.vl, s.ov
    tile = vl * ov
    tiles = -(-shape.o // tile)
    o_padded = tiles * tile
    params = Params()
    w = np.asarray(weights)
    w_off = params.add(_pack(shape, w, tile))
    offsets = tables(shape, node, w, bias, params, o_padded)
    ep = Epilogue.of(shape, vl)
    t = ep.t
    if shape.int8:
        elem = "int8_t"
        dot = f"{t}_dot4vv_any" if shape.offset else f"{t}_dot4vv"
        flip = "0x80808080u" if shape.offset else "0u"
        steps = shape.k_padded // 4
        step = f"""
            uint32_t xw; memcpy(&xw, xr + 4 * c, 4);
            const {t} xv = {t}_bcast((int32_t)(xw ^ {flip}));
            for (int v = 0; v < {ov}; v++)
                acc[v] = {dot}(acc[v], xv, {t}_load(wt + ((size_t)c * {tile} + v * {vl}) * 4));"""
        pad_x = "" if shape.k == shape.k_padded else """
        /* the last step's padding bytes read as x = 0 (weights there are 0 too) */"""
    else:
        elem = "float"
        steps = shape.k
        step = f"""
            const {t} xv = {t}_bcast(xr[c]);
            for (int v = 0; v < {ov}; v++)
                acc[v] += xv * {t}_load(wt + (size_t)c * {tile} + v * {vl});"""
        pad_x = ""
    epilogue = "".join("\n            " + line for line in ep.statements(
        "acc[v]", Operands.lanes(ep, "o"), "y + row + o", res="res + row + o",
        lanes=Lanes("first", "n"), var="r"))
    pointers = table_pointers(shape, offsets)
    x_row = "xq" if shape.int8 and shape.k != shape.k_padded else "x + (size_t)b * " + str(shape.k)
    copy = (f"""
        {elem} xq[{shape.k_padded}] = {{0}};
        memcpy(xq, x + (size_t)b * {shape.k}, {shape.k});{pad_x}"""
            if shape.int8 and shape.k != shape.k_padded else "")
    res_decl = (f"const {elem} *restrict res = (const {elem} *)in[1];" if shape.residual
                else "")
    body = f"""
/* {shape.dtype} dense {shape.describe()}; schedule {s.to_dict()} */
void NAME{SIGNATURE} {{
    const {elem} *restrict x = (const {elem} *)in[0];
    {res_decl}
    {elem} *restrict y = ({elem} *)out_;
    const {elem} *restrict wp = (const {elem} *)(params + {w_off});
{pointers}    (void)ws; (void)lim;
    #pragma omp parallel for collapse(2) schedule(static) if({0 if s.parallel == "none" else 1})
    for (int b = 0; b < {shape.n}; b++)
    for (int ot = 0; ot < {tiles}; ot++) {{{copy}
        const {elem} *restrict xr = (const {elem} *)({x_row});
        const {elem} *restrict wt = wp + (size_t)ot * {tile * shape.k_padded};
        const size_t row = (size_t)b * {shape.o};
        {t} acc[{ov}];
        for (int v = 0; v < {ov}; v++) acc[v] = ({t}){{0}};
        #pragma GCC unroll {s.unroll}
        for (int c = 0; c < {steps}; c++) {{{step}
        }}
        for (int v = 0; v < {ov}; v++) {{
            const int o = ot * {tile} + v * {vl};
            if (o >= {shape.o}) break;
            const int n = vdla_min({vl}, {shape.o} - o);{epilogue}
        }}
    }}
}}
"""
    return Kernel(body, params.blob(), inputs, 0, 0, shape.macs,
                  items=1 if s.parallel == "none" else shape.n * tiles)
