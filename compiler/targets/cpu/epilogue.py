"""The epilogue of the CPU target's convolution and dense kernels, written once: the C
that turns a vector of accumulated sums into stored outputs, and the constants it reads.

Every kernel that accumulates calls it: `conv` (plain convolutions), `pointwise`,
`depthwise`, `blocked` (its one-group and depthwise tiles), `winograd` and `dense`. So
the arithmetic after the sums, and the activation branch, exist in one place, and every
kernel computes the same bits from the same sums.

    rq = requantizers(shape, node)                      # int8: which requantizer
    offsets = tables(shape, node, weights, bias, params)   # the constants, in params
    ep = Epilogue.of(shape, vl, rq)
    lines = ep.statements("acc", Operands.lanes(ep, "chan"), "y + at", res="res + at")

What `Epilogue.statements` emits, one C statement per step, on a vector variable (``a``
unless `var` says otherwise; ``vi{vl}`` lanes for int8, ``vf{vl}`` for float32):

int8, step for step the integer reference's (`vdla.compiler.reference.integer`), the
additions on uint32 lanes, where wrap-around modulo 2**32 is defined:

1. the sums plus the bias (the bias table already holds ``-128 * sum(w)`` for an input
   read as ``x + 128``: `tables`);
2. requantization by the output's multiplier and shift, with one of `vdla_cpu.h`'s
   requantizers (`REQUANTIZERS`, chosen by `requantizers`): ``rq``, one multiplier and
   shift for every lane (a kernel whose vector holds one channel's pixels); ``rqp``,
   per-lane tables where every multiplier is nonzero and every shift in [1, 31] (five
   vector operations); ``rqv``, per-lane tables of any values (selects, about fifteen);
3. with a residual: its int8 lanes widened to int32, requantized by the residual's
   multiplier and shift, added;
4. the clamp to [``out_min``, ``out_max``];
5. the store: each lane's low byte (in range after the clamp).

float32 (float32 arithmetic, each step rounded once; numbered as int8's, which has
step 2 alone):

1. the sums plus the bias;
3. with a residual: the residual added;
4. the activation (`ACTIVATIONS`): none; ReLU, ``max(a, 0)``; clip, ``max(min(a, hi),
   lo)`` with an absent bound stored as an infinity (`tables`); GELU, ``a * 0.5 * (1 +
   erf(a / sqrt 2))`` or its tanh form (vector erf and tanh, a few ulps);
5. the store.

Which lanes are read and stored is the kernel's (`Lanes`): every lane, the first ``n``
(a row's or a layer's last vector), or the lanes of a mask (a plain convolution's grid
columns past the output's width, dropped and the rest packed together). How the
constants are read is the kernel's too (`Operands`): one channel per vector (scalars),
one channel per lane (vectors from the tables), or values the kernel loaded once.

Per instruction set (`vdla_cpu.h`; the same statements on every one, the header picks
the instructions, and every choice computes the same bits):

- AVX-512 (``avx512vnni``; 16 lanes, and 8 with AVX-512VL): min and max are one
  instruction each (``vpminsd``/``vpmaxsd``, ``vminps``/``vmaxps``); the int8 store
  narrows with ``vpmovdb``, the residual widens with ``vpmovsxbd``; the masked forms
  compress and expand in registers (``vpcompress``/``vpexpand``) where AVX-512 VBMI2
  is there too, else go lane by lane in C.
- AVX2 (``avx2``; 8 lanes): min and max on ``ymm``; the residual widens with
  ``vpmovsxbd`` too; the int8 store narrows with saturating packs (equal to the low
  byte for lanes already in [-128, 127], as every clamped lane is); the masked forms go
  lane by lane in C.
- portable (``portable``): GCC vector extensions only; min and max as a compare and a
  select, narrowing and widening lane by lane.

Float min and max are not NaN-propagating on any of them (x86's ``minps``/``maxps``
return the second operand when either is NaN, and the portable select does the same),
so ReLU and clip treat NaN alike everywhere.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vdla.compiler.ir.tensor import Node
from vdla.compiler.reference.integer import per_channel
from vdla.compiler.targets.cpu.kernel import Params

__all__ = ["ACTIVATIONS", "ALL", "Epilogue", "Lanes", "Operands", "REQUANTIZERS",
           "requantizers", "table_pointers", "tables"]

#: The activations a float32 kernel applies (``shape.activation``); GELU (erf or tanh
#: form, `vdla_cpu.h`'s vector erf and tanh) only in dense layers, where a transformer's
#: fused feed-forward layer ends in it.
ACTIVATIONS = (None, "relu", "clip", "gelu", "gelu_tanh")
#: `vdla_cpu.h`'s int8 requantizers: one multiplier and shift for every lane (scalar
#: operands), per-lane tables of multipliers nonzero and shifts in [1, 31], any tables.
REQUANTIZERS = ("rq", "rqp", "rqv")
#: The vector widths `vdla_cpu.h` defines (32-bit lanes).
_WIDTHS = (8, 16)


# --- the constants -------------------------------------------------------------------------

def requantizers(shape, node: Node) -> tuple[str, str]:
    """The requantizers of an int8 layer's output and residual read from per-lane tables:
    ``rqp`` where every channel has a multiplier and a shift in [1, 31] (5 vector
    operations), else ``rqv`` (any multiplier or shift, with selects: about 15). On
    ResNet-50's 1x1 layers of 64 input channels the epilogue took more instructions
    than the sums. `shape`: a `ConvShape` or `DenseShape`; float32 layers get ``rqv``
    (unused)."""
    a = node.attrs

    def fast(mul, shift) -> str:
        m, sh = per_channel(mul, shape.o, 0), per_channel(shift, shape.o)
        return "rqp" if (m != 0).all() and ((sh >= 1) & (sh <= 31)).all() else "rqv"

    if not shape.int8:
        return "rqv", "rqv"
    res = (fast(a.get("residual_multiplier"), a.get("residual_shift")) if shape.residual
           else "rqv")
    return fast(a.get("multiplier"), a.get("shift")), res


def tables(shape, node: Node, w: np.ndarray, bias, params: Params,
           padded: int | None = None) -> dict:
    """The epilogue's constants added to `params`: name -> byte offset.

    shape : a `ConvShape` or `DenseShape` (its dtype, output channels ``o``, residual,
        input offset and activation)
    node : the layer (its requantization attributes, or its clip bounds)
    w : its weights, output channels first (an int8 input read as ``x + 128`` moves
        ``-128 * sum(w)`` of each channel into its bias, modulo 2**32 like the sums)
    bias : its bias, or None (zeros)
    padded : the per-channel tables' length, the channels past the layer's zero (no
        bias, no multiplier, no shift), for kernels that load whole vectors of them

    int8: ``bias``, ``mul``, ``shf`` (and ``rmul``, ``rshf`` with a residual) per channel,
    int32; ``lim``, the clamp's [out_min, out_max]. float32: ``bias`` per channel and
    ``lim``, the clip's bounds (an absent one, or another activation: -inf, +inf).
    """
    a, o = node.attrs, shape.o
    out = {}

    def add(values: np.ndarray) -> int:
        if padded is not None:
            values = np.concatenate([values, np.zeros(padded - values.size, values.dtype)])
        return params.add(values)

    if shape.int8:
        b = np.zeros(o, np.int64) if bias is None else np.asarray(bias, np.int64)
        if shape.offset:
            # The input is stored as x + 128: sum((x + 128) w) - 128 sum(w) = sum(x w).
            b = b - 128 * np.asarray(w).reshape(o, -1).astype(np.int64).sum(axis=1)
        out["bias"] = add(b.astype(np.int32))     # wraps modulo 2**32, as the sum
        out["mul"] = add(per_channel(a["multiplier"], o, 0))
        out["shf"] = add(per_channel(a["shift"], o))
        if shape.residual:
            out["rmul"] = add(per_channel(a["residual_multiplier"], o, 0))
            out["rshf"] = add(per_channel(a["residual_shift"], o))
        out["lim"] = params.add(np.array([a["out_min"], a["out_max"]], np.int32))
    else:
        b = np.zeros(o, np.float32) if bias is None else np.asarray(bias, np.float32)
        out["bias"] = add(b)
        lo = a.get("clip_min") if shape.activation == "clip" else None
        hi = a.get("clip_max") if shape.activation == "clip" else None
        out["lim"] = params.add(np.array([-np.inf if lo is None else lo,
                                          np.inf if hi is None else hi], np.float32))
    return out


def table_pointers(shape, offsets: dict) -> str:
    """C declarations of pointers ``bias``, ``mul``, ``shf``, ``lim`` (and ``rmul``,
    ``rshf``) into ``params`` at `offsets` (`tables`); float32: ``bias`` and ``lim``."""
    if shape.int8:
        names = ["bias", "mul", "shf", "lim"] + (["rmul", "rshf"] if shape.residual else [])
        return "".join(f"    const int32_t *restrict {k} = (const int32_t *)(params + "
                       f"{offsets[k]});\n" for k in names)
    return "".join(f"    const float *restrict {k} = (const float *)(params + {offsets[k]});\n"
                   for k in ("bias", "lim"))


# --- the C -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Lanes:
    """Which lanes of a vector the epilogue reads (the residual) and stores.

    kind : ``all``: every lane; ``first``: the first `count` lanes (the whole-vector
        functions when `count` is the width, the ``_n`` ones, which never touch memory
        past the last lane, else); ``keep``: the lanes whose bit is set in `count`,
        packed together in memory (the ``_keep`` functions)
    count : ``first``: a C int expression; ``keep``: a C uint32 expression
    """

    kind: str = "all"
    count: str = ""

    def __post_init__(self):
        if self.kind not in ("all", "first", "keep"):
            raise ValueError(f"Lanes kind {self.kind!r}: allowed 'all', 'first', 'keep'")
        if (self.kind == "all") != (not self.count):
            raise ValueError(f"Lanes {self.kind!r} with count {self.count!r}: 'all' takes "
                             "no count, 'first' and 'keep' a C expression")

    def load(self, fn: str, ptr: str, vl: int) -> str:
        """C: `fn` (a whole-vector load, ``vf8_load`` or ``vi8_from_s8``) of these
        lanes at `ptr`, the others 0."""
        if self.kind == "all":
            return f"{fn}({ptr})"
        if self.kind == "keep":
            return f"{fn}_keep({ptr}, {self.count})"
        return f"{self.count} == {vl} ? {fn}({ptr}) : {fn}_n({ptr}, {self.count})"

    def store(self, fn: str, ptr: str, value: str, vl: int) -> str:
        """C: the statement storing these lanes of `value` at `ptr` with `fn` (a
        whole-vector store)."""
        if self.kind == "all":
            return f"{fn}({ptr}, {value});"
        if self.kind == "keep":
            return f"{fn}_keep({ptr}, {value}, {self.count});"
        return (f"if ({self.count} == {vl}) {fn}({ptr}, {value}); "
                f"else {fn}_n({ptr}, {value}, {self.count});")


#: Every lane.
ALL = Lanes()


@dataclasses.dataclass(frozen=True)
class Operands:
    """The C expressions by which an epilogue reads its constants (`tables`).

    bias : int8: a uint32 scalar or ``vu{vl}`` vector added to the sums' uint32 lanes;
        float32: a float or ``vf{vl}``
    lo, hi : ``v*{vl}`` vectors of the clamp's (int8) or clip's (float32) bounds
    mul, shf, rmul, rshf : int8: the output's and the residual's requantizer operands:
        int32 scalars for ``rq``, ``vi{vl}`` vectors for ``rqp`` and ``rqv``
    """

    bias: str
    lo: str
    hi: str
    mul: str = ""
    shf: str = ""
    rmul: str = ""
    rshf: str = ""

    @classmethod
    def channel(cls, ep: "Epilogue", chan: str) -> "Operands":
        """Channel `chan`'s constants as scalars (a vector of one channel's pixels,
        requantized with ``rq``), from `table_pointers`' pointers."""
        t = ep.t
        lim = dict(lo=f"{t}_bcast(lim[0])", hi=f"{t}_bcast(lim[1])")
        if not ep.int8:
            return cls(bias=f"bias[{chan}]", **lim)
        return cls(bias=f"(uint32_t)bias[{chan}]", mul=f"mul[{chan}]", shf=f"shf[{chan}]",
                   rmul=f"rmul[{chan}]", rshf=f"rshf[{chan}]", **lim)

    @classmethod
    def lanes(cls, ep: "Epilogue", chan: str) -> "Operands":
        """The constants of channels [`chan`, `chan` + vl) as vectors, one channel per
        lane, from `table_pointers`' pointers (tables padded to whole vectors)."""
        t = ep.t
        lim = dict(lo=f"{t}_bcast(lim[0])", hi=f"{t}_bcast(lim[1])")
        if not ep.int8:
            return cls(bias=f"{t}_load(bias + {chan})", **lim)
        return cls(bias=f"(vu{ep.vl}){t}_load(bias + {chan})", mul=f"{t}_load(mul + {chan})",
                   shf=f"{t}_load(shf + {chan})", rmul=f"{t}_load(rmul + {chan})",
                   rshf=f"{t}_load(rshf + {chan})", **lim)


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """One kernel's epilogue: what its C depends on.

    vl : lanes of a vector (8 or 16)
    int8 : int8 (requantization, clamp) or float32 (activation)
    residual : whether a residual is added
    activation : float32: one of `ACTIVATIONS`
    rq : int8: the output's and the residual's requantizers (`REQUANTIZERS`; per-lane
        tables: `requantizers`' choice)
    """

    vl: int
    int8: bool
    residual: bool = False
    activation: str | None = None
    rq: tuple[str, str] = ("rqv", "rqv")

    def __post_init__(self):
        if self.vl not in _WIDTHS:
            raise ValueError(f"epilogue of {self.vl} lanes: allowed {list(_WIDTHS)}")
        if self.activation not in ACTIVATIONS or (self.int8 and self.activation):
            raise ValueError(f"epilogue activation {self.activation!r}: allowed "
                             f"{list(ACTIVATIONS)} for float32, None for int8 (its clamp is "
                             "out_min and out_max)")
        bad = [r for r in self.rq if r not in REQUANTIZERS]
        if len(self.rq) != 2 or bad:
            raise ValueError(f"epilogue requantizers {self.rq!r}: two of "
                             f"{list(REQUANTIZERS)} (the output's, the residual's)")

    @classmethod
    def of(cls, shape, vl: int, rq: tuple[str, str] = ("rqv", "rqv")) -> "Epilogue":
        """The epilogue of `shape` (a `ConvShape` or `DenseShape`) on vectors of `vl`."""
        return cls(vl, shape.int8, shape.residual, shape.activation, rq)

    @property
    def t(self) -> str:
        """The C vector type of the outputs before the store."""
        return f"vi{self.vl}" if self.int8 else f"vf{self.vl}"

    # --- the steps, in order -----------------------------------------------------------------

    def start(self, acc: str, ops: Operands, var: str = "a") -> str:
        """C: declares `var`, the sums `acc` plus the bias (int8: modulo 2**32)."""
        t, u = self.t, f"vu{self.vl}"
        if self.int8:
            return f"{t} {var} = ({t})(({u}){acc} + {ops.bias});"
        return f"{t} {var} = {acc} + {ops.bias};"

    def requantize(self, ops: Operands, var: str = "a") -> str:
        """C (int8; float32: ""): `var` requantized by the output's multiplier and shift."""
        if not self.int8:
            return ""
        return f"{var} = {self.t}_{self.rq[0]}({var}, {ops.mul}, {ops.shf});"

    def add_residual(self, ops: Operands, res: str, lanes: Lanes = ALL,
                     var: str = "a") -> str:
        """C (none without a residual: ""): the residual's `lanes` at `res` added to
        `var`; int8: widened and requantized by the residual's multiplier and shift first,
        the sum modulo 2**32."""
        if not self.residual:
            return ""
        t, u = self.t, f"vu{self.vl}"
        if not self.int8:
            return f"{var} += {lanes.load(f'{t}_load', res, self.vl)};"
        value = f"{t}_{self.rq[1]}({lanes.load(f'{t}_from_s8', res, self.vl)}, " \
                f"{ops.rmul}, {ops.rshf})"
        return f"{var} = ({t})(({u}){var} + ({u}){value});"

    def bound(self, ops: Operands, var: str = "a") -> str:
        """C: int8, the clamp to [lo, hi]; float32, the activation ("" for none). The one
        place the target writes an activation's C."""
        t = self.t
        if self.int8 or self.activation == "clip":
            return f"{var} = {t}_max({t}_min({var}, {ops.hi}), {ops.lo});"
        if self.activation == "relu":
            return f"{var} = {t}_max({var}, ({t}){{0}});"
        if self.activation == "gelu":
            return f"{var} = {var} * 0.5f * (1.0f + {t}_erf({var} * 0.7071067811865476f));"
        if self.activation == "gelu_tanh":
            return (f"{var} = {var} * 0.5f * (1.0f + {t}_tanh(0.7978845608028654f * ({var} + "
                    f"0.044715f * {var} * {var} * {var})));")
        return ""

    def store(self, out: str, lanes: Lanes = ALL, var: str = "a") -> str:
        """C: `var`'s `lanes` stored at `out` (int8: each lane's low byte)."""
        fn = f"{self.t}_store_s8" if self.int8 else f"{self.t}_store"
        return lanes.store(fn, out, var, self.vl)

    def statements(self, acc: str, ops: Operands, out: str, *, res: str | None = None,
                   lanes: Lanes = ALL, var: str = "a") -> list[str]:
        """C statements that finish the vector of sums `acc` (a C expression) into
        variable `var` and store its `lanes` at `out` (a C pointer expression), the
        residual read at `res` (the same lanes). `ops`: how the constants are read."""
        if self.residual and res is None:
            raise ValueError("epilogue with a residual: res (its C pointer) is required")
        steps = [self.start(acc, ops, var), self.requantize(ops, var),
                 self.add_residual(ops, res or "", lanes, var), self.bound(ops, var),
                 self.store(out, lanes, var)]
        return [s for s in steps if s]
