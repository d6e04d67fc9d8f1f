"""Import ONNX models into the compiler's graph IR.

`from_onnx(path_or_model, input_shapes=None, batch=None)` reads a model (a file path, its
bytes, or an `onnx.ModelProto`) and returns a validated `Graph` of the float operators of
`vdla.compiler.ir.ops`. It covers the layer operators of image classifiers over ONNX opsets
7 to 21, as torch's legacy exporter (opsets 9-17) and its dynamo exporter (18+) write
them: Conv, BatchNormalization, Relu, Clip, Add, Mul, Sum, MaxPool, AveragePool,
GlobalAveragePool, ReduceMean over H and W, Gemm, MatMul, Flatten, Reshape, Transpose,
Concat, Softmax, Pad, LRN; Dropout and Identity disappear (their outputs alias their
inputs). The ops of transformers (LayerNormalization, Gelu, Gather of token ids, Slice,
Split, Where, Erf, Pow, the reductions, ...) are converted by `converters_sequence`.
A model of opsets 1 to 6 is first upgraded to opset 7 with onnx's version converter
(`loader.upgrade`), with a `UserWarning` saying so (``vdla: warning: ...`` on the command
line) and ``metadata["onnx"]["upgraded_from"]`` set to its opset.

Exporters also emit small computations on shapes (``Shape -> Gather -> Unsqueeze ->
Concat -> Reshape`` for ``x.view(x.size(0), -1)``). Every tensor here has a static shape
(a symbolic or unknown input dimension becomes `batch` on the leading axis and 1
elsewhere, unless `input_shapes` says otherwise; ``metadata["onnx"]["dynamic_dims"]``
records each such choice), so any node whose inputs are all constants, or a ``Shape`` of
a computed tensor, is evaluated at import time with numpy and never reaches the graph.

Every failure is an `OnnxImportError` (a ValueError) naming the file, or the node (its
name, index and op type) and the attribute or input at fault.
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from vdla.compiler.frontend.onnx_import import converters_sequence  # noqa: F401  (registers)
from vdla.compiler.frontend.onnx_import.converters import CONVERTERS
from vdla.compiler.frontend.onnx_import.folding import FOLDERS, META_INPUTS
from vdla.compiler.frontend.onnx_import.loader import TESTED_OPSET, default_opset, load, upgrade
from vdla.compiler.frontend.onnx_import.nodes import (ELEM_TYPES, MIN_OPSET, OnnxImportError,
                                                      OnnxNode, check_schema, decode_attrs,
                                                      elem_type_name)
from vdla.compiler.ir.graph import Graph
from vdla.compiler.ir.tensor import DTYPES, GraphError

__all__ = ["Importer", "from_onnx", "supported_ops"]


def from_onnx(path_or_model, *, input_shapes: dict[str, tuple] | None = None,
              batch: int | None = None) -> Graph:
    """Import an ONNX model as a float `Graph`.

    path_or_model : a file path (str or os.PathLike), the serialized model (bytes), or an
        `onnx.ModelProto`.
    input_shapes : optional ``{input name: shape}`` for inputs with symbolic or missing
        dimensions (a dimension without a fixed value otherwise becomes 1, or `batch`);
        a dimension the model fixes must agree.
    batch : the value of a dynamic (symbolic or unknown) leading dimension of every input
        that `input_shapes` does not name (default 1). An input whose leading dimension
        the model fixes to another value is an error, not silently kept.

    Returns a validated graph whose tensors keep their ONNX names, whose outputs are the
    model's in ONNX order, and whose ``metadata["onnx"]`` holds the opset imported,
    ``upgraded_from`` (the model's own opset when it was older than `MIN_OPSET` and onnx's
    version converter upgraded it, with a warning; else None), the producer and
    ``dynamic_dims``: one ``{"input", "axis", "name", "value"}`` per dynamic input
    dimension (``name`` is its dim_param, or None when the model leaves it unknown;
    ``value`` the size it got).
    Raises `OnnxImportError` for an unreadable file, an unsupported operator or attribute,
    an opset older than `MIN_OPSET` that the version converter cannot upgrade, or a bad
    `input_shapes` or `batch`.
    """
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int)
                              or batch < 1):
        raise OnnxImportError(f"batch must be a positive integer, not {batch!r}")
    model, source = load(path_or_model)
    model, upgraded_from = upgrade(model, source)
    return Importer(model, source, input_shapes, batch, upgraded_from=upgraded_from).run()


def supported_ops() -> list[str]:
    """The ONNX op types `from_onnx` accepts (some only on constant inputs), sorted."""
    return sorted(set(CONVERTERS) | set(FOLDERS))


class Importer:
    def __init__(self, model, source: str, input_shapes, batch: int | None = None, *,
                 upgraded_from: int | None = None):
        self.model = model
        self.upgraded_from = upgraded_from           # the opset before `upgrade`, or None
        self.source = source
        self.input_shapes = dict(input_shapes or {})
        self.batch = batch
        self.dynamic_dims: list[dict] = []           # what each dynamic input dim became
        self.opset = self._opset()
        self.graph = Graph(model.graph.name or "onnx_model")
        self.consts: dict[str, np.ndarray] = {}      # ONNX name -> value known at import
        self.names: dict[str, str] = {}              # ONNX name -> graph tensor name
        self.const_tensors: dict[str, str] = {}      # ONNX name -> graph constant's name
        self.sequences: dict[str, list[str]] = {}    # ONNX sequence -> its ONNX tensors
        g = model.graph
        self.reserved = ({i.name for i in g.input} | {t.name for t in g.initializer}
                         | {o for n in g.node for o in n.output})
        self.used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
        self.preferred = self._preferred_names()

    def _opset(self) -> int:
        opset = default_opset(self.model, self.source)
        if opset < MIN_OPSET:      # from_onnx upgrades such models first (loader.upgrade)
            raise OnnxImportError(f"{self.source!r} uses opset {opset}; vdla imports opset "
                                  f"{MIN_OPSET} and later (tested up to {TESTED_OPSET})")
        return opset

    def _preferred_names(self) -> dict[str, str]:
        # An Identity/Dropout in front of a graph output would leave the output named after
        # the aliased tensor; name the tensor after the output instead.
        outputs = {o.name for o in self.model.graph.output}
        fixed = {i.name for i in self.model.graph.input} | \
            {t.name for t in self.model.graph.initializer} | outputs
        preferred: dict[str, str] = {}
        for node in reversed(self.model.graph.node):
            if node.op_type not in ("Identity", "Dropout") or not node.input or \
                    node.domain not in ("", "ai.onnx"):
                continue
            src, dst = node.input[0], node.output[0]
            if (dst in outputs or dst in preferred) and src not in fixed and \
                    src not in preferred:
                preferred[src] = preferred.get(dst, dst)
        return preferred

    # --- tensors ------------------------------------------------------------------------

    def fresh(self, base: str) -> str:
        """A graph tensor/node name starting with `base`, clear of every ONNX name."""
        base = base or "t"
        name, k = self.graph.unique_name(base), 0
        while name in self.reserved:
            k += 1
            name = self.graph.unique_name(f"{base}_{k}")
        return name

    def output_name(self, onnx_name: str) -> str:
        want = self.preferred.get(onnx_name, onnx_name)
        if want and want not in self.graph.tensors and want not in self.graph.nx:
            return want
        return self.graph.unique_name(want or "t")

    def known(self, onnx_name: str) -> bool:
        return onnx_name in self.consts or onnx_name in self.names or \
            onnx_name in self.sequences

    def const(self, onnx_name: str) -> np.ndarray | None:
        return self.consts.get(onnx_name) if onnx_name else None

    def shape(self, onnx_name: str) -> tuple[int, ...]:
        if onnx_name in self.consts:
            return tuple(self.consts[onnx_name].shape)
        return self.graph.tensors[self.names[onnx_name]].shape

    def tensor(self, node: OnnxNode, onnx_name: str) -> str:
        """The graph tensor for an ONNX value; constants become graph constants (once)."""
        if onnx_name in self.names:
            return self.names[onnx_name]
        if onnx_name in self.consts:
            return self.materialize(onnx_name, self.consts[onnx_name], node)
        node.fail(f"reads {onnx_name!r}, which no earlier node produces and which is neither "
                  "a graph input nor an initializer")

    def materialize(self, onnx_name: str, value: np.ndarray, node: OnnxNode | None, *,
                    derived: bool = False) -> str:
        """A graph constant holding `value`, named after `onnx_name`. The constant of an
        ONNX value is made once; a `derived` one (transposed or scaled weights) each time."""
        if not derived and onnx_name in self.const_tensors:
            return self.const_tensors[onnx_name]
        value = np.asarray(value)
        if value.dtype.kind == "f":
            value = value.astype(np.float32)
        elif value.dtype not in (np.int8, np.uint8, np.int32, np.int64, np.bool_):
            what = node.where() if node else f"graph output {onnx_name!r} of {self.source!r}"
            raise OnnxImportError(f"{what}: constant {onnx_name!r} has dtype {value.dtype}; "
                                  "graph constants are float32, int8, uint8, int32, int64 "
                                  "or bool")
        base = self.preferred.get(onnx_name, onnx_name) or "const"
        free = base not in self.graph.tensors and base not in self.graph.nx
        # An ONNX value keeps its own name; a derived one must not take a later value's.
        name = base if free and not derived else self.fresh(base)
        name = self.graph.add_constant(name, value)
        if not derived:
            self.const_tensors[onnx_name] = name
        return name

    def emit(self, node: OnnxNode, op: str, inputs: list[str], out: str | None = None,
             **attrs) -> str:
        """Add graph op `op`; `out` is the ONNX output it defines (None: an intermediate).
        Returns the graph name of the output."""
        name = self.output_name(out) if out else self.fresh(f"{node.name}_{op}")
        try:
            self.graph.add_node(op, inputs, [name], name=self.fresh(node.name), **attrs)
        except GraphError as exc:
            node.fail(str(exc))
        if out:
            self.names[out] = name
        return name

    def alias(self, out: str, source: str):
        if source in self.consts:
            self.consts[out] = self.consts[source]
        else:
            self.names[out] = self.names[source]

    # --- the walk ----------------------------------------------------------------------------

    def run(self) -> Graph:
        g = self.model.graph
        if len(g.sparse_initializer):
            raise OnnxImportError(f"{self.source!r} has sparse initializers, which vdla does "
                                  "not import")
        for init in g.initializer:
            try:
                self.consts[init.name] = numpy_helper.to_array(init)
            except (ValueError, TypeError, KeyError, OSError) as exc:   # KeyError: data_type
                raise OnnxImportError(f"cannot read initializer {init.name!r} of "
                                      f"{self.source!r} (truncated, or external data not "
                                      f"loaded): {exc}") from None
        self._add_inputs()
        for index, proto in enumerate(g.node):
            name = proto.name or f"{proto.op_type.lower()}_{index}"
            node = OnnxNode(index, proto.op_type, name, list(proto.input), list(proto.output),
                            {})
            if proto.domain not in ("", "ai.onnx"):
                node.fail(f"op domain {proto.domain!r} is not supported; vdla imports the "
                          f"default ONNX domain: {', '.join(supported_ops())}")
            # Malformed nodes fail here, with their name, not deep in a converter.
            check_schema(node, proto, self.opset)
            node.attrs = decode_attrs(proto, node)
            self._convert(node)
        outputs = []
        for out in g.output:
            if out.name in self.names:
                outputs.append(self.names[out.name])
            elif out.name in self.consts:
                outputs.append(self.materialize(out.name, self.consts[out.name], None))
            elif out.name in self.sequences:
                raise OnnxImportError(f"graph output {out.name!r} of {self.source!r} is a "
                                      "sequence; vdla's graphs output tensors")
            else:
                raise OnnxImportError(f"graph output {out.name!r} of {self.source!r} is not "
                                      "produced by any node (is the model truncated?)")
        self.graph.set_outputs(outputs)
        self.graph.prune()
        self.graph.metadata["onnx"] = {"opset": self.opset,
                                       "upgraded_from": self.upgraded_from,
                                       "producer": self.model.producer_name,
                                       "producer_version": self.model.producer_version,
                                       "dynamic_dims": self.dynamic_dims}
        try:
            return self.graph.validate()
        except GraphError as exc:
            raise OnnxImportError(f"the graph imported from {self.source!r} is not valid: "
                                  f"{exc}") from None

    def _add_inputs(self):
        g = self.model.graph
        names = [i.name for i in g.input if i.name not in self.consts]
        unknown = sorted(set(self.input_shapes) - set(names))
        if unknown:
            raise OnnxImportError(f"input_shapes names {unknown}, which are not inputs of "
                                  f"{self.source!r}; its inputs are {names}")
        for value in g.input:
            if value.name in self.consts:
                continue                      # an input with a default: a constant here
            if not value.type.HasField("tensor_type"):
                kind = value.type.WhichOneof("value") or "no type"
                raise OnnxImportError(f"graph input {value.name!r} is a {kind.replace('_', ' ')}, "
                                      "not a tensor; vdla imports tensor inputs")
            ttype = value.type.tensor_type
            dtype = ELEM_TYPES.get(ttype.elem_type)
            if dtype is None:
                raise OnnxImportError(
                    f"graph input {value.name!r} has element type "
                    f"{elem_type_name(ttype.elem_type)}; vdla imports float32, "
                    "int8, uint8, int32, int64 and bool inputs")
            dims = list(ttype.shape.dim) if ttype.HasField("shape") else None
            fixed = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                     for d in dims] if dims is not None else None
            given = self.input_shapes.get(value.name)
            if given is not None:
                given = tuple(int(d) for d in given)
                if min(given, default=1) < 1:
                    raise OnnxImportError(f"input_shapes[{value.name!r}] = {given} must have "
                                          "positive dimensions")
                if fixed is not None and (len(fixed) != len(given) or any(
                        f is not None and f != d for f, d in zip(fixed, given))):
                    model_shape = tuple(f if f is not None else "?" for f in fixed)
                    raise OnnxImportError(f"input_shapes[{value.name!r}] = {given} does not fit "
                                          f"the model's input shape {model_shape}")
                if self.batch is not None and given and given[0] != self.batch:
                    raise OnnxImportError(f"input_shapes[{value.name!r}] = {given} has batch "
                                          f"{given[0]}, but batch={self.batch}")
                shape = given
            elif fixed is None:
                raise OnnxImportError(f"graph input {value.name!r} has no shape in the model; "
                                      f"pass input_shapes={{{value.name!r}: (...)}}")
            else:
                if self.batch is not None and fixed and fixed[0] not in (None, self.batch):
                    model_shape = tuple(f if f is not None else "?" for f in fixed)
                    raise OnnxImportError(
                        f"graph input {value.name!r} of {self.source!r} has a fixed batch of "
                        f"{fixed[0]} (shape {model_shape}); batch {self.batch} can only set a "
                        f"dynamic batch dimension (export the model with a dynamic batch, or "
                        f"with batch {self.batch})")
                # The leading axis is the batch by the convention of image models.
                shape = tuple(f if f is not None else (self.batch or 1) if k == 0 else 1
                              for k, f in enumerate(fixed))
            name = self.output_name(value.name)
            self.graph.add_input(name, shape, dtype)
            self.names[value.name] = name
            for k, d in enumerate(dims or ()):
                if fixed[k] is None:
                    self.dynamic_dims.append({"input": value.name, "axis": k,
                                              "name": d.dim_param or None, "value": shape[k]})

    def _convert(self, node: OnnxNode):
        for i in node.inputs:
            if i and not self.known(i):
                node.fail(f"reads {i!r}, which no earlier node produces and which is neither a "
                          "graph input nor an initializer (nodes must be in topological order)")
        folder = FOLDERS.get(node.op)
        meta_only = META_INPUTS.get(node.op, ())
        if folder is not None and all(not i or i in self.consts or k in meta_only
                                      for k, i in enumerate(node.inputs)):
            args = [self._fold_arg(node, k, i) for k, i in enumerate(node.inputs)]
            try:
                results = folder(self, node, args)
            except OnnxImportError:
                raise
            except (ValueError, IndexError, TypeError, KeyError, RuntimeError,
                    MemoryError) as exc:   # numpy: past 32 dimensions, too big to allocate
                node.fail(f"cannot evaluate it on its constant inputs: {exc}")
            for out, value in zip(node.outputs, results):
                if out:
                    self.consts[out] = np.asarray(value)
            return
        converter = CONVERTERS.get(node.op)
        if converter is None:
            if folder is not None:
                computed = [i for i in node.inputs if i and i not in self.consts]
                node.fail(f"vdla imports {node.op} only on constant inputs (shape "
                          f"computations), but input {computed[0]!r} is computed by the model")
            node.fail(f"op type {node.op!r} is not supported; vdla imports "
                      f"{', '.join(supported_ops())}")
        try:
            converter(self, node)
        except OnnxImportError:
            raise
        except (ValueError, IndexError, TypeError, KeyError) as exc:
            # What check_schema cannot see (an attribute of another opset, a NaN shape)
            # still ends in an error naming the node, as for the folders above.
            node.fail(f"cannot import it ({type(exc).__name__}: {exc})")

    def _fold_arg(self, node, k, name):
        if not name:
            return None
        if name in self.consts:
            return self.consts[name]
        # An input of which only the shape and dtype count: a zero-strided stand-in.
        dtype = np.dtype(DTYPES[self.graph.tensors[self.names[name]].dtype])
        try:
            return np.broadcast_to(np.zeros((), dtype), self.shape(name))
        except ValueError as exc:         # more elements than numpy can index
            node.fail(f"input {k} ({name!r}, shape {self.shape(name)}) cannot be evaluated: "
                      f"{exc}")

    # --- helpers for converters -----------------------------------------------------------

    def unused(self, node: OnnxNode, k: int, what: str):
        """Fail when optional output `k` of `node` is read by anything."""
        out = node.outputs[k] if k < len(node.outputs) else ""
        if out and out in self.used:
            node.fail(f"its output {k} ({what}, {out!r}) is used; vdla imports inference "
                      "graphs where it is not")

    def const_input(self, node: OnnxNode, k: int, what: str) -> np.ndarray | None:
        """The value of optional input `k`, which must be a constant when present."""
        name = node.input(k)
        if not name:
            return None
        if name not in self.consts:
            node.fail(f"input {k} ({what}, {name!r}) must be a constant; it is computed by the "
                      "model")
        return self.consts[name]
