"""Build float graphs with seeded weights, one layer call at a time.

`GraphBuilder` writes `vdla.compiler.ir.ops` nodes into a `Graph` and makes their weights:
conv and dense weights are He-normal (``N(0, 2 / fan_in)``), float32, drawn from
``np.random.default_rng(seed)`` in call order, so a seed fixes every weight.

Batch norm initialization is data-dependent: the builder runs every layer eagerly on a
seeded random *calibration batch* (standard-normal pixels, its own generator, so it does
not shift the weights' random stream) and sets each BN's running mean and variance to the
per-channel statistics its input actually has on that batch. gamma (U[0.5, 1.5], or
U[0.2, 0.5] for `batch_norm(..., residual_branch=True)`) and beta (N(0, 0.2)) are random,
so the normalized output of every BN is about ``N(beta, gamma^2)`` per channel however
deep the network: no inf/NaN, no collapse, and BN folding sees parameters far from 1/0.
Real ResNets keep the last BN of a residual branch small (torchvision even offers gamma
= 0) so the sum over blocks grows slowly; ``residual_branch`` does the same.

The calibration batch has `calibration_batch` images (default: enough that the deepest
feature maps of a network that downsamples by 32 still see >= 16 positions per channel);
its statistics, hence the BN parameters, depend on the input's spatial size but not on
the graph's batch. Variances are floored at 1e-3 of the layer's mean variance so a channel
that happens to be constant on the calibration batch is not amplified without bound.

Transformer layers (`linear`, `layer_norm`, `gelu`, `embedding`, `attention_heads`, and
the shape operators between them) build the form an ONNX import of a torch.nn
transformer takes, with BERT's and ViT's initializer (N(0, 0.02^2) linear weights and
embeddings, zero biases, LayerNorm gamma 1 and beta 0); integer inputs (token ids,
attention masks) come from ``input(..., dtype="int64")``.

Example::

    b = GraphBuilder("tiny", seed=1)
    x = b.input("input", (1, 3, 32, 32))
    y = b.relu(b.batch_norm(b.conv(x, 16, 3, padding=1)))
    logits = b.dense(b.flatten(b.global_avg_pool(y)), 10, name="logits")
    graph = b.build([logits])
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from vdla.compiler.frontend.builder_transformer import TransformerLayers
from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.ops import get_op
from vdla.compiler.ir.tensor import DTYPES, GraphError, Node
from vdla.compiler.reference.numerics import conv2d_accumulate, pool2d_windows

__all__ = ["GraphBuilder"]

#: Minimum positions per channel the calibration batch should give a feature map that is
#: 32 times smaller than the input (the deepest stage of ResNet and MobileNet).
_CALIBRATION_POSITIONS = 16


def _pair(value, what: str) -> tuple[int, int]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value), int(value)
    try:
        a, b = value
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (a, b)):
            return int(a), int(b)
    except (TypeError, ValueError):
        pass
    raise GraphError(f"{what} must be an int or a pair of ints, not {value!r}")


def _pads(padding, what: str = "padding") -> tuple[int, int, int, int]:
    """An int, (pad_h, pad_w), or (top, left, bottom, right) -> 4 pads."""
    if isinstance(padding, (tuple, list)) and len(padding) == 4:
        if all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in padding):
            return tuple(int(p) for p in padding)
        raise GraphError(f"{what} must hold ints, not {padding!r}")
    ph, pw = _pair(padding, what)
    return ph, pw, ph, pw


def _positive(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise GraphError(f"{what} must be a positive int, not {value!r}")
    return int(value)


# The calibration pass runs the reference's conv and window helpers in float32: the
# calibration batch is not the graph's batch, so shape-bound reference kernels (flatten)
# cannot run it whole, and float32 BLAS keeps building resnet50 fast.


class GraphBuilder(TransformerLayers):
    """Builds a float `Graph` layer by layer with seeded weights (see the module docstring).

    name : the graph's name
    seed : seeds ``np.random.default_rng`` for every weight (keyword-only)
    calibration_batch : images in the batch that sets BN statistics (None: enough for
        >= 16 positions per channel after 32x downsampling, computed at `input`)
    eager : run every layer on the calibration batch as it is added (True); False skips
        it, for models without batch norm (the transformers), which then build faster

    Every layer method takes tensor names and returns the output tensor's name. `name`
    names the node and its output tensor (an error if either is taken); without it a
    unique name is made from the op. Weights are constants named ``<node>.weight``,
    ``<node>.bias``, BN's ``<node>.{weight,bias,running_mean,running_var}``.
    """

    def __init__(self, name: str, *, seed: int = 0, calibration_batch: int | None = None,
                 eager: bool = True):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise GraphError(f"seed must be a non-negative int, not {seed!r}")
        if calibration_batch is not None:
            calibration_batch = _positive(calibration_batch, "calibration_batch")
        self.graph = Graph(name)
        self.seed = int(seed)
        self.rng = np.random.default_rng(self.seed)
        # A separate stream for the calibration images: they must not shift the weights.
        self._data_rng = np.random.default_rng([self.seed, 0x0CA1])
        self._calibration_batch = calibration_batch
        self._values: dict[str, np.ndarray] = {}     # tensor -> its calibration value
        self._n = 1                     # the calibration batch, once an input is made
        self._eager = bool(eager)
        self._built = False

    # --- plumbing ------------------------------------------------------------------------

    def _check_open(self):
        if self._built:
            raise GraphError(f"graph {self.graph.name!r} is already built; make a new "
                             "GraphBuilder for another graph")

    def _tensor(self, x: str) -> str:
        self._check_open()
        if not isinstance(x, str) or x not in self._values:
            raise GraphError(f"{x!r} is not a tensor made by this builder (the latest are "
                             f"{list(self._values)[-5:]})")
        return x

    def _name(self, name: str | None, op: str) -> str:
        if name is None:
            return self.graph.unique_name(op)
        if not isinstance(name, str) or not name:
            raise GraphError(f"name must be a non-empty string, not {name!r}")
        if name in self.graph.tensors or name in self.graph.nx:
            raise GraphError(f"name {name!r} is already used in graph {self.graph.name!r}")
        return name

    def _node(self, op: str, inputs: list[str], name: str | None, value, *,
              output: str | None = None, **attrs) -> str:
        """Add node `op` and its output, both named `name` (the output `output` when
        given); `value()` computes the output on the calibration batch, once the node is
        known to fit its inputs."""
        self._check_open()
        node = self._name(name, op)
        out = node if output is None else self._name(output, op)
        # Check the shapes before inserting, so a refused layer leaves no half-made node.
        opdef = get_op(op)
        trial = Node(node, op, list(inputs), [out], opdef.normalize_attrs(attrs, node))
        opdef.check_arity(trial)
        opdef.infer(self.graph, trial)
        # A node and its single output share the name: readable graphs, unique tensors.
        out = self.graph.add_node(op, inputs, [out], name=node, **attrs)
        shape = self.graph.tensors[out].shape
        if not self._eager:
            self._values[out] = None
            return out
        v = value()
        if v.shape[1:] != tuple(shape[1:]):          # the batch axis differs by design
            raise GraphError(f"internal: calibration value of {out!r} has shape "
                             f"{v.shape}, the graph says {shape}")
        self._values[out] = np.ascontiguousarray(v, dtype=DTYPES[self.graph.tensors[out].dtype])
        return out

    def _const(self, name: str, data: np.ndarray) -> str:
        return self.graph.add_constant(name, np.asarray(data, np.float32))

    def _he_normal(self, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        w = self.rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(math.sqrt(2.0 / fan_in))
        return w

    def _shape(self, x: str) -> tuple[int, ...]:
        return self.graph.tensors[x].shape

    # --- layers --------------------------------------------------------------------------

    def input(self, name: str, shape: Sequence[int], *, dtype: str = "float32",
              high: int | None = None) -> str:
        """Declare a graph input of `shape` (NCHW for images; (N, S) for token ids);
        returns `name`. `dtype` float32 (default), int64 or int32: an integer input's
        calibration values are uniform in [0, `high`) (token ids below the vocabulary
        size), or all ones without `high` (an attention mask that attends everywhere)."""
        self._check_open()
        shape = tuple(shape)
        if not shape or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool)
                                and d >= 1 for d in shape):
            raise GraphError(f"input {name!r}: shape must be positive ints, not {shape!r}")
        if dtype not in ("float32", "int64", "int32"):
            raise GraphError(f"input {name!r}: dtype must be float32, int64 or int32, not "
                             f"{dtype!r}")
        if high is not None and (dtype == "float32" or isinstance(high, bool)
                                 or not isinstance(high, (int, np.integer)) or high < 1):
            raise GraphError(f"input {name!r}: high ({high!r}) must be a positive int, and "
                             "only integer inputs take it")
        self._name(name, "input")
        self.graph.add_input(name, shape, dtype)
        n = self._calibration_batch
        if n is None:
            # Enough images that a map 32x smaller keeps _CALIBRATION_POSITIONS positions.
            spatial = 1
            for d in shape[2:]:
                spatial *= max(1, d // 32)
            n = max(1, math.ceil(_CALIBRATION_POSITIONS / spatial)) if len(shape) > 2 else 64
        self._n = n
        if not self._eager:
            value = None
        elif dtype == "float32":
            value = self._data_rng.standard_normal((n,) + shape[1:], dtype=np.float32)
        elif high is None:
            value = np.ones((n,) + shape[1:], DTYPES[dtype])
        else:
            value = self._data_rng.integers(0, int(high), (n,) + shape[1:]).astype(DTYPES[dtype])
        self._values[name] = value
        return name

    def conv(self, x: str, out_channels: int, kernel, *, stride=1, padding=0, groups: int = 1,
             bias: bool = False, name: str | None = None) -> str:
        """2-D convolution of NCHW `x`: `kernel`, `stride` int or (h, w); `padding` int,
        (h, w) or (top, left, bottom, right); He-normal OIHW weights; optional bias
        (small random values). Returns the output tensor."""
        x = self._tensor(x)
        if len(self._shape(x)) != 4:
            raise GraphError(f"conv: input {x!r} must be 4-D NCHW, not {self._shape(x)}")
        c = self._shape(x)[1]
        out_channels = _positive(out_channels, "conv out_channels")
        groups = _positive(groups, "conv groups")
        kh, kw = _pair(kernel, "conv kernel")
        strides = _pair(stride, "conv stride")
        pads = _pads(padding, "conv padding")
        if min(kh, kw, *strides) < 1 or min(pads) < 0:
            raise GraphError(f"conv: kernel {(kh, kw)} and stride {strides} must be >= 1, "
                             f"padding {pads} >= 0")
        if c % groups or out_channels % groups:
            raise GraphError(f"conv: groups={groups} must divide the input channels ({c}) "
                             f"and out_channels ({out_channels})")
        node = self._name(name, "conv")
        ig = c // groups
        w = self._he_normal((out_channels, ig, kh, kw), ig * kh * kw)
        inputs = [x, self._const(f"{node}.weight", w)]
        b = None
        if bias:
            b = (0.1 * self.rng.standard_normal(out_channels)).astype(np.float32)
            inputs.append(self._const(f"{node}.bias", b))

        def value():
            y = conv2d_accumulate(self._values[x], w, strides, pads, (1, 1), groups,
                                  dtype=np.float32)
            return y if b is None else y + b[None, :, None, None]
        return self._node("conv2d", inputs, node, value, strides=strides, pads=pads,
                          groups=groups)

    def batch_norm(self, x: str, *, epsilon: float = 1e-5, residual_branch: bool = False,
                   name: str | None = None) -> str:
        """Batch norm over axis 1 of `x` in inference form. Running mean/var are `x`'s
        per-channel statistics on the calibration batch; gamma, beta random (see the
        module docstring; `residual_branch` picks the smaller gamma range)."""
        x = self._tensor(x)
        shape = self._shape(x)
        if len(shape) < 2:
            raise GraphError(f"batch_norm: input {x!r} needs a channel axis, not shape {shape}")
        if not epsilon > 0:
            raise GraphError(f"batch_norm: epsilon must be > 0, not {epsilon!r}")
        c = shape[1]
        if not self._eager:
            raise GraphError(f"batch_norm: its statistics come from the calibration batch; "
                             f"graph {self.graph.name!r} is built with eager=False")
        node = self._name(name, "bn")
        lo, hi = (0.2, 0.5) if residual_branch else (0.5, 1.5)
        gamma = self.rng.uniform(lo, hi, c).astype(np.float32)
        beta = (0.2 * self.rng.standard_normal(c)).astype(np.float32)
        v = self._values[x].astype(np.float64)
        axes = (0,) + tuple(range(2, v.ndim))
        mean = v.mean(axis=axes)
        var = v.var(axis=axes)
        var = np.maximum(var, 1e-3 * max(float(var.mean()), 1e-12)).astype(np.float32)
        mean = mean.astype(np.float32)
        inputs = [x] + [self._const(f"{node}.{k}", d) for k, d in
                        (("weight", gamma), ("bias", beta), ("running_mean", mean),
                         ("running_var", var))]
        bshape = (1, c) + (1,) * (v.ndim - 2)
        inv = gamma / np.sqrt(var.astype(np.float64) + epsilon)
        return self._node("batch_norm", inputs, node,
                          lambda: (v - mean.reshape(bshape)) * inv.reshape(bshape)
                          + beta.reshape(bshape), epsilon=float(epsilon))

    def relu(self, x: str, *, name: str | None = None) -> str:
        x = self._tensor(x)
        return self._node("relu", [x], name, lambda: np.maximum(self._values[x], 0))

    def relu6(self, x: str, *, name: str | None = None) -> str:
        """ReLU6 as ``clip(x, 0, 6)``."""
        x = self._tensor(x)
        return self._node("clip", [x], name or self.graph.unique_name("relu6"),
                          lambda: np.clip(self._values[x], 0, 6), min=0.0, max=6.0)

    def add(self, a: str, b: str, *, name: str | None = None) -> str:
        """Elementwise sum (numpy broadcasting over the non-batch axes)."""
        a, b = self._tensor(a), self._tensor(b)
        return self._node("add", [a, b], name, lambda: self._values[a] + self._values[b])

    def _pool(self, op: str, x: str, kernel, stride, padding, name, **attrs) -> str:
        x = self._tensor(x)
        if len(self._shape(x)) != 4:
            raise GraphError(f"{op}: input {x!r} must be 4-D NCHW, not {self._shape(x)}")
        kernel = _pair(kernel, f"{op} kernel")
        strides = kernel if stride is None else _pair(stride, f"{op} stride")
        pads = _pads(padding, f"{op} padding")
        if min(*kernel, *strides) < 1 or min(pads) < 0:
            raise GraphError(f"{op}: kernel {kernel} and stride {strides} must be >= 1, "
                             f"padding {pads} >= 0")
        def value():
            xv = self._values[x]
            if op == "max_pool2d":
                return pool2d_windows(xv, kernel, strides, pads, value=-np.inf).max(axis=(4, 5))
            sums = pool2d_windows(xv, kernel, strides, pads).sum(axis=(4, 5), dtype=np.float32)
            if attrs["count_include_pad"]:
                return sums / (kernel[0] * kernel[1])
            ones = np.ones((1, 1) + xv.shape[2:], np.float32)
            return sums / pool2d_windows(ones, kernel, strides, pads).sum(axis=(4, 5))
        return self._node(op, [x], name or self.graph.unique_name(op.split("_")[0] + "pool"),
                          value, kernel=kernel, strides=strides, pads=pads, **attrs)

    def max_pool(self, x: str, kernel, stride=None, padding=0, *,
                 name: str | None = None) -> str:
        """Max pooling (stride defaults to the kernel; padding never wins the max)."""
        return self._pool("max_pool2d", x, kernel, stride, padding, name)

    def avg_pool(self, x: str, kernel, stride=None, padding=0, *,
                 count_include_pad: bool = False, name: str | None = None) -> str:
        """Average pooling (stride defaults to the kernel)."""
        return self._pool("avg_pool2d", x, kernel, stride, padding, name,
                          count_include_pad=bool(count_include_pad))

    def global_avg_pool(self, x: str, *, name: str | None = None) -> str:
        """(N, C, H, W) -> (N, C, 1, 1) mean."""
        x = self._tensor(x)
        if len(self._shape(x)) != 4:
            raise GraphError(f"global_avg_pool: input {x!r} must be 4-D NCHW, not "
                             f"{self._shape(x)}")
        return self._node("global_avg_pool2d", [x], name or self.graph.unique_name("gap"),
                          lambda: self._values[x].mean(axis=(2, 3), keepdims=True))

    def flatten(self, x: str, *, name: str | None = None) -> str:
        """(N, ...) -> (N, prod(...))."""
        x = self._tensor(x)
        v = self._values[x]
        return self._node("flatten", [x], name, lambda: v.reshape(v.shape[0], -1), axis=1)

    def dense(self, x: str, units: int, *, bias: bool = True, name: str | None = None) -> str:
        """Fully connected layer on 2-D `x` (N, K): He-normal (units, K) weights and a
        small random bias."""
        x = self._tensor(x)
        shape = self._shape(x)
        if len(shape) != 2:
            raise GraphError(f"dense: input {x!r} must be 2-D (N, features), not {shape}; "
                             "flatten it first")
        units = _positive(units, "dense units")
        node = self._name(name, "dense")
        w = self._he_normal((units, shape[1]), shape[1])
        inputs = [x, self._const(f"{node}.weight", w)]
        b = np.zeros(units, np.float32)
        if bias:
            b = (0.1 * self.rng.standard_normal(units)).astype(np.float32)
            inputs.append(self._const(f"{node}.bias", b))
        return self._node("dense", inputs, node, lambda: self._values[x] @ w.T + b)

    def softmax(self, x: str, *, axis: int = -1, name: str | None = None) -> str:
        x = self._tensor(x)

        def value():
            v = self._values[x].astype(np.float64)
            e = np.exp(v - v.max(axis=axis, keepdims=True))
            return e / e.sum(axis=axis, keepdims=True)
        return self._node("softmax", [x], name, value, axis=axis)

    # --- finishing -----------------------------------------------------------------------

    def calibration_value(self, x: str) -> np.ndarray:
        """The value tensor `x` had on the calibration batch (for tests and debugging)."""
        if self._built:
            raise GraphError("calibration values are dropped by build()")
        if not self._eager:
            raise GraphError("calibration values are not computed with eager=False")
        return self._values[self._tensor(x)]

    def build(self, outputs: str | Sequence[str]) -> Graph:
        """Set the graph's outputs, drop unused nodes, validate and return the `Graph`.
        The builder cannot be used afterwards."""
        self._check_open()
        if isinstance(outputs, str):
            outputs = [outputs]
        outputs = [self._tensor(o) for o in outputs]
        if not outputs:
            raise GraphError("build() needs at least one output tensor")
        self.graph.set_outputs(outputs)
        self.graph.prune()
        self.graph.metadata.update(builder_seed=self.seed)
        self._values.clear()
        self._built = True
        return self.graph.validate()
