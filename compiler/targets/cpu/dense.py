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
from vdla.compiler.reference.integer import per_channel
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
    a = node.attrs
    params = Params()
    w = np.asarray(weights)
    w_off = params.add(_pack(shape, w, tile))

    def table(values, dtype) -> int:
        arr = np.zeros(o_padded, dtype)
        arr[:shape.o] = values
        return params.add(arr)

    if shape.int8:
        t, elem = f"vi{vl}", "int8_t"
        b = np.zeros(shape.o, np.int64) if bias is None else np.asarray(bias, np.int64)
        if shape.offset:
            b = b - 128 * w.astype(np.int64).sum(axis=1)
        offs = {"bias": table(b.astype(np.int32), np.int32),
                "mul": table(per_channel(a["multiplier"], shape.o, 0), np.int32),
                "shf": table(per_channel(a["shift"], shape.o), np.int32)}
        if shape.residual:
            offs["rmul"] = table(per_channel(a["residual_multiplier"], shape.o, 0), np.int32)
            offs["rshf"] = table(per_channel(a["residual_shift"], shape.o), np.int32)
        lim = params.add(np.array([a["out_min"], a["out_max"]], np.int32))
        dot = f"{t}_dot4vv_any" if shape.offset else f"{t}_dot4vv"
        flip = "0x80808080u" if shape.offset else "0u"
        steps = shape.k_padded // 4
        step = f"""
            uint32_t xw; memcpy(&xw, xr + 4 * c, 4);
            const {t} xv = {t}_bcast((int32_t)(xw ^ {flip}));
            for (int v = 0; v < {ov}; v++)
                acc[v] = {dot}(acc[v], xv, {t}_load(wt + ((size_t)c * {tile} + v * {vl}) * 4));"""
        epilogue = f"""
            {t} r = ({t})((vu{vl})acc[v] + (vu{vl}){t}_load(bias + o));
            r = {t}_rqv(r, {t}_load(mul + o), {t}_load(shf + o));"""
        if shape.residual:
            epilogue += f"""
            const {t} rv = n == {vl} ? {t}_from_s8(res + row + o) : {t}_from_s8_n(res + row + o, n);
            r = ({t})((vu{vl})r + (vu{vl}){t}_rqv(rv, {t}_load(rmul + o), {t}_load(rshf + o)));"""
        epilogue += f"""
            r = {t}_max({t}_min(r, {t}_bcast(lim[1])), {t}_bcast(lim[0]));
            if (n == {vl}) {t}_store_s8(y + row + o, r); else {t}_store_s8_n(y + row + o, r, n);"""
        tables = "".join(f"    const int32_t *restrict {k} = (const int32_t *)(params + {v});\n"
                         for k, v in offs.items())
        tables += f"    const int32_t *restrict lim = (const int32_t *)(params + {lim});\n"
        pad_x = "" if shape.k == shape.k_padded else """
        /* the last step's padding bytes read as x = 0 (weights there are 0 too) */"""
    else:
        t, elem = f"vf{vl}", "float"
        b = np.zeros(shape.o, np.float32) if bias is None else np.asarray(bias, np.float32)
        offs = {"bias": table(b, np.float32)}
        lo = a.get("clip_min") if shape.activation == "clip" else None
        hi = a.get("clip_max") if shape.activation == "clip" else None
        lim = params.add(np.array([-np.inf if lo is None else lo,
                                   np.inf if hi is None else hi], np.float32))
        steps = shape.k
        step = f"""
            const {t} xv = {t}_bcast(xr[c]);
            for (int v = 0; v < {ov}; v++)
                acc[v] += xv * {t}_load(wt + (size_t)c * {tile} + v * {vl});"""
        epilogue = f"""
            {t} r = acc[v] + {t}_load(bias + o);"""
        if shape.residual:
            epilogue += f"""
            r += n == {vl} ? {t}_load(res + row + o) : {t}_load_n(res + row + o, n);"""
        if shape.activation == "relu":
            epilogue += f"""
            r = {t}_max(r, ({t}){{0}});"""
        elif shape.activation == "clip":
            epilogue += f"""
            r = {t}_max({t}_min(r, {t}_bcast(lim[1])), {t}_bcast(lim[0]));"""
        epilogue += f"""
            if (n == {vl}) {t}_store(y + row + o, r); else {t}_store_n(y + row + o, r, n);"""
        tables = (f"    const float *restrict bias = (const float *)(params + {offs['bias']});\n"
                  f"    const float *restrict lim = (const float *)(params + {lim});\n")
        pad_x = ""
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
{tables}    (void)ws; (void)lim;
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
