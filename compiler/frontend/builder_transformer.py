"""The transformer layers of `vdla.compiler.frontend.builder.GraphBuilder`.

They build the graph a torch export of a transformer becomes after vdla's ONNX import:
linear layers on 2-D views (reshape -> dense -> reshape), ``layer_norm`` and ``gelu``
nodes, and attention written out as matmul -> scale -> [+ mask] -> softmax -> matmul
(or the fused ``attention`` node). Weights follow BERT's and ViT's initializer:
N(0, 0.02^2) for linear layers and embeddings, zero biases, LayerNorm gamma 1 and beta 0.

`TransformerLayers` is a mixin: `GraphBuilder` holds the graph, the weight stream and
the calibration values its methods use (``_node``, ``_tensor``, ``_values``, ...).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from vdla.compiler.ir.tensor import DTYPES, GraphError
from vdla.compiler.reference.kernels_sequence import attention_scores, gelu

__all__ = ["TransformerLayers"]


def _positive(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise GraphError(f"{what} must be a positive int, not {value!r}")
    return int(value)


class TransformerLayers:
    """The transformer layers of `GraphBuilder` (see the module docstring)."""

    def constant(self, name: str, data, *, dtype: str | None = None) -> str:
        """A constant tensor that layers take like any other (embedding tables, the class
        token, position embeddings, masks, scalars); float data becomes float32. `name`
        must be unused. Returns `name`."""
        self._check_open()
        data = np.asarray(data)
        if dtype is None:
            dtype = "float32" if data.dtype.kind == "f" else str(data.dtype)
        if dtype not in DTYPES:
            raise GraphError(f"constant {name!r}: dtype {dtype!r} is not one of "
                             f"{', '.join(DTYPES)}")
        data = data.astype(DTYPES[dtype])
        name = self._name(name, "const")
        self.graph.add_constant(name, data, dtype)
        self._values[name] = data
        return name

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        """float32 N(0, std^2) values of `shape`, drawn from the weight stream (for
        weights made outside a layer: class tokens, position embeddings)."""
        w = self.rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(std)
        return w

    def _binary(self, op: str, a: str, b: str, name: str | None, fn) -> str:
        a, b = self._tensor(a), self._tensor(b)
        return self._node(op, [a, b], name, lambda: fn(self._values[a], self._values[b]))

    def _unary(self, op: str, x: str, name: str | None, fn, **attrs) -> str:
        x = self._tensor(x)
        return self._node(op, [x], name, lambda: fn(self._values[x]), **attrs)

    def sub(self, a: str, b: str, *, name: str | None = None) -> str:
        return self._binary("sub", a, b, name, np.subtract)

    def mul(self, a: str, b: str, *, name: str | None = None) -> str:
        return self._binary("mul", a, b, name, np.multiply)

    def div(self, a: str, b: str, *, name: str | None = None) -> str:
        return self._binary("div", a, b, name, np.divide)

    def matmul(self, a: str, b: str, *, name: str | None = None) -> str:
        """numpy matmul of two tensors (batched over the leading axes)."""
        return self._binary("matmul", a, b, name, np.matmul)

    def tanh(self, x: str, *, name: str | None = None) -> str:
        return self._unary("tanh", x, name, np.tanh)

    def gelu(self, x: str, *, approximate: str = "none", name: str | None = None) -> str:
        """GELU: ``approximate`` "none" (the erf form, torch.nn.GELU()) or "tanh" (GPT-2's)."""
        return self._unary("gelu", x, name, lambda v: gelu(v, approximate),
                           approximate=approximate)

    def cast(self, x: str, dtype: str, *, name: str | None = None) -> str:
        if dtype not in DTYPES:
            raise GraphError(f"cast: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        return self._unary("cast", x, name, lambda v: v.astype(DTYPES[dtype]), dtype=dtype)

    def reshape(self, x: str, shape: Sequence[int], *, name: str | None = None) -> str:
        """Reshape to `shape` (its axis 0 holds the batch, alone or merged with the axes
        after it: (N, S, D) -> (N * S, D) and back)."""
        x = self._tensor(x)
        shape = tuple(int(d) for d in shape)
        return self._node("reshape", [x], name,
                          lambda: self._values[x].reshape((-1,) + shape[1:]), shape=shape)

    def transpose(self, x: str, perm: Sequence[int], *, name: str | None = None) -> str:
        """Permute the axes; the batch axis stays first (perm[0] == 0)."""
        x = self._tensor(x)
        perm = tuple(int(p) for p in perm)
        if not perm or perm[0] != 0:
            raise GraphError(f"transpose: perm {perm} must keep the batch axis first")
        return self._node("transpose", [x], name,
                          lambda: self._values[x].transpose(perm), perm=perm)

    def _batched(self, v: np.ndarray) -> np.ndarray:
        # A constant with a leading axis of 1 seen as a whole calibration batch.
        return np.broadcast_to(v, (self._n,) + v.shape[1:]) if v.shape[0] == 1 else v

    def concat(self, xs: Sequence[str], *, axis: int, name: str | None = None) -> str:
        """Concatenate along `axis` (not the batch axis)."""
        xs = [self._tensor(x) for x in xs]
        rank = len(self._shape(xs[0]))
        if axis % rank == 0:
            raise GraphError("concat: the builder concatenates along a non-batch axis")
        return self._node("concat", xs, name, lambda: np.concatenate(
            [self._batched(self._values[x]) for x in xs], axis=axis), axis=axis)

    def expand(self, x: str, shape: Sequence[int], *, name: str | None = None) -> str:
        """Broadcast `x` to `shape` (a class token (1, 1, D) to the batch (N, 1, D))."""
        x = self._tensor(x)
        shape = tuple(int(d) for d in shape)
        return self._node("expand", [x], name, lambda: np.broadcast_to(
            self._values[x], (self._n,) + shape[1:]).copy(), shape=shape)

    def slice(self, x: str, axis: int, start: int, end: int, *,
              name: str | None = None) -> str:
        """``x[..., start:end, ...]`` on one non-batch `axis` (the class token: axis 1,
        0:1)."""
        x = self._tensor(x)
        shape = self._shape(x)
        axis %= len(shape)
        if axis == 0:
            raise GraphError("slice: the builder slices a non-batch axis")
        index = (slice(None),) * axis + (slice(start, end),)
        return self._node("slice", [x], name, lambda: self._values[x][index],
                          starts=(int(start),), ends=(int(end),), axes=(axis,), steps=(1,))

    def gather(self, data: str, indices: str, *, name: str | None = None) -> str:
        """Rows of `data` (axis 0) picked by the integer tensor `indices`: an embedding
        lookup (ONNX Gather)."""
        data, indices = self._tensor(data), self._tensor(indices)
        return self._node("gather", [data, indices], name,
                          lambda: np.take(self._values[data], self._values[indices], axis=0),
                          axis=0)

    def embedding(self, ids: str, num: int, dim: int, *, std: float = 0.02,
                  name: str) -> str:
        """torch.nn.Embedding(num, dim) looked up by token ids: a table ``name.weight``
        ~ N(0, std^2) and a gather node `name`."""
        table = self.constant(f"{name}.weight",
                              self.normal((_positive(num, "embedding rows"),
                                            _positive(dim, "embedding width")), std))
        return self.gather(table, ids, name=name)

    def linear(self, x: str, units: int, *, bias: bool = True, std: float = 0.02,
               weight: np.ndarray | None = None, name: str, output: str | None = None) -> str:
        """torch.nn.Linear(K, units) on the last axis of `x` (..., K): weights
        ``name.weight`` (units, K) ~ N(0, std^2) (or `weight`, a tied embedding table), bias
        ``name.bias`` zeros. A 2-D `x` is one dense node `name`; a higher rank is reshaped
        to (-1, K) (node ``name.in``), multiplied (``name``) and reshaped back
        (``name.out``). `output` names the returned tensor (default: that node's name)."""
        x = self._tensor(x)
        shape = self._shape(x)
        units = _positive(units, "linear units")
        node = self._name(name, "dense")
        if weight is None:
            w = self.normal((units, shape[-1]), std)
        else:
            w = np.asarray(weight, np.float32)
            if w.shape != (units, shape[-1]):
                raise GraphError(f"linear {node!r}: weight has shape {w.shape}, not "
                                 f"{(units, shape[-1])}")
        inputs = [self.reshape(x, (int(np.prod(shape[:-1])), shape[-1]), name=f"{node}.in")
                  if len(shape) != 2 else x, self._const(f"{node}.weight", w)]
        b = np.zeros(units, np.float32)
        if bias:
            inputs.append(self._const(f"{node}.bias", b))
        flat = inputs[0]
        y = self._node("dense", inputs, node, lambda: self._values[flat] @ w.T + b,
                       output=output if len(shape) == 2 else None)
        if len(shape) == 2:
            return y
        return self.reshape(y, shape[:-1] + (units,), name=output or f"{node}.out")

    def layer_norm(self, x: str, *, epsilon: float = 1e-5, name: str) -> str:
        """torch.nn.LayerNorm over the last axis: ``name.weight`` ones, ``name.bias``
        zeros."""
        x = self._tensor(x)
        d = self._shape(x)[-1]
        node = self._name(name, "layer_norm")
        gamma = self._const(f"{node}.weight", np.ones(d, np.float32))
        beta = self._const(f"{node}.bias", np.zeros(d, np.float32))

        def value():
            v = self._values[x].astype(np.float64)
            c = v - v.mean(axis=-1, keepdims=True)
            return c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + epsilon)
        return self._node("layer_norm", [x, gamma, beta], node, value,
                          epsilon=float(epsilon))

    def attention_heads(self, q: str, k: str, v: str, heads: int, *, mask: str | None = None,
                        causal: bool = False, scale_op: str = "mul", fused: bool = False,
                        name: str) -> str:
        """Multi-head scaled dot-product attention of projected q (N, S, D), k and v
        (N, T, D), with `heads` heads of D / heads; returns the heads merged again
        (N, S, D), before the output projection.

        Written out (the default), as an ONNX import of a torch model has it: each of q, k,
        v reshaped to (N, S, heads, Dh) and transposed to (N, heads, S, Dh) (k straight to
        (N, heads, Dh, T)), scores = matmul(q, k), then ``mul`` by 1/sqrt(Dh) (`scale_op`
        "mul", ViT and GPT) or ``div`` by sqrt(Dh) ("div", BERT), ``+ mask`` (an additive
        mask broadcastable to (N, heads, S, T)), ``+`` a constant causal mask (0 on and
        below the diagonal, -inf above) when `causal`, softmax over the keys, matmul with
        v. ``fused=True`` makes one `attention` node of the same meaning instead."""
        q, k, v = self._tensor(q), self._tensor(k), self._tensor(v)
        n, s, d = self._shape(q)
        t = self._shape(k)[1]
        heads = _positive(heads, "attention heads")
        if d % heads:
            raise GraphError(f"attention {name!r}: width {d} is not divisible by {heads} heads")
        if scale_op not in ("mul", "div"):
            raise GraphError(f"attention {name!r}: scale_op must be 'mul' or 'div', not "
                             f"{scale_op!r}")
        dh = d // heads
        qh = self.transpose(self.reshape(q, (n, s, heads, dh), name=f"{name}.q_heads"),
                            (0, 2, 1, 3), name=f"{name}.q_t")
        vh = self.transpose(self.reshape(v, (n, t, heads, dh), name=f"{name}.v_heads"),
                            (0, 2, 1, 3), name=f"{name}.v_t")
        kh = self.reshape(k, (n, t, heads, dh), name=f"{name}.k_heads")
        if fused:
            kh = self.transpose(kh, (0, 2, 1, 3), name=f"{name}.k_t")
            inputs = [qh, kh, vh] + ([self._tensor(mask)] if mask else [])
            scale = 1.0 / math.sqrt(dh)

            def value():
                sc = attention_scores(self._values[qh], self._values[kh], scale,
                                      self._values[mask] if mask else None, causal)
                e = np.exp(sc - sc.max(axis=-1, keepdims=True))
                return (e / e.sum(axis=-1, keepdims=True)) @ self._values[vh]
            ctx = self._node("attention", inputs, f"{name}.core", value, scale=scale,
                             causal=bool(causal))
        else:
            kh = self.transpose(kh, (0, 2, 3, 1), name=f"{name}.k_t")
            scores = self.matmul(qh, kh, name=f"{name}.scores")
            if scale_op == "mul":
                c = self.constant(f"{name}.scale", np.float32(1.0 / math.sqrt(dh)))
                scores = self.mul(scores, c, name=f"{name}.scaled")
            else:
                c = self.constant(f"{name}.scale", np.float32(math.sqrt(dh)))
                scores = self.div(scores, c, name=f"{name}.scaled")
            if mask:
                scores = self.add(scores, mask, name=f"{name}.masked")
            if causal:
                above = np.arange(t)[None, :] > np.arange(s)[:, None] + (t - s)
                bias = np.where(above, -np.inf, 0.0).astype(np.float32)[None, None]
                scores = self.add(scores, self.constant(f"{name}.causal_mask", bias),
                                  name=f"{name}.causal")
            probs = self.softmax(scores, axis=-1, name=f"{name}.probs")
            ctx = self.matmul(probs, vh, name=f"{name}.context")
        merged = self.transpose(ctx, (0, 2, 1, 3), name=f"{name}.merge_t")
        return self.reshape(merged, (n, s, d), name=f"{name}.merged")
