"""The float ONNX models vdla exports, in the forms torch's exporters write: what
onnxruntime's transformer optimizer (`vdla.compiler.baseline.optimize_transformer`)
matches. Its fusions (attention above all) look for the exporters' patterns, and vdla's
exporter writes linear layers on 2-D views and the attention mask as a reshape, so
`exporter_form` rewrites those first; `vdla.compiler.baseline.variants` does it before
the optimizer. onnx is imported inside the function: an optional dependency, heavy.
"""

from __future__ import annotations

import collections
import os

import numpy as np

__all__ = ["exporter_form"]


def exporter_form(fp32: str | os.PathLike, out: str | os.PathLike) -> dict[str, int]:
    """The float ONNX model at `fp32` rewritten, without changing what it computes, into
    the forms torch's exporters write, which onnxruntime's transformer optimizer matches
    (its attention fusion looks for them); written to `out`. Returns the rewrites' counts.

    * a linear layer that vdla's exporter writes on a 2-D view, Reshape (B, S, K) ->
      (B*S, K), Gemm (transB, a constant weight), Reshape back to (B, S, N), becomes
      MatMul (B, S, K) x (K, N) then Add of the bias (``linear``; a zero bias where it
      has none: the fusions look for the Add);
    * an attention mask cast to float and reshaped from (B, S) to (B, 1, 1, S) becomes
      two Unsqueezes of the integer mask, then the Cast (``mask``).

    Shapes come from ONNX's shape inference; a pattern whose shapes are not known is
    left as it is. The rewrites compute what the model computes."""
    import onnx  # heavy, and optional
    from onnx import helper, numpy_helper  # heavy, as above
    model = onnx.shape_inference.infer_shapes(onnx.load(str(fp32)))
    graph = model.graph
    # Unsqueeze takes its axes as an input from opset 13 (the mask's rewrite).
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    shapes = {}
    for v in [*graph.input, *graph.value_info, *graph.output]:
        dims = v.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[v.name] = [d.dim_value for d in dims]
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    readers = collections.defaultdict(list)
    for n in graph.node:
        for i in n.input:
            readers[i].append(n)
    nodes, dropped, counts = list(graph.node), set(), {"linear": 0, "mask": 0}
    replaced: dict[int, list] = {}        # id of the last node of a pattern -> new nodes

    def only_reader(tensor, node):
        return len(readers[tensor]) == 1 and readers[tensor][0] is node \
            and tensor not in {o.name for o in graph.output}

    for n in nodes:
        if n.op_type == "Gemm":
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            pre = producer.get(n.input[0])
            post = readers[n.output[0]][0] if len(readers[n.output[0]]) == 1 else None
            if (attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0
                    or attrs.get("beta", 1.0) != 1.0 or n.input[1] not in inits
                    or pre is None or pre.op_type != "Reshape" or post is None
                    or post.op_type != "Reshape" or not only_reader(pre.output[0], n)):
                continue
            x, y = pre.input[0], post.output[0]
            weight = numpy_helper.to_array(inits[n.input[1]])
            if attrs.get("transB", 0):
                weight = weight.T
            if x not in shapes or y not in shapes or len(shapes[x]) < 3 \
                    or shapes[y] != shapes[x][:-1] + [weight.shape[1]]:
                continue
            name = f"{n.input[1]}_matmul"
            graph.initializer.append(numpy_helper.from_array(
                np.ascontiguousarray(weight), name))
            bias = n.input[2] if len(n.input) > 2 and n.input[2] else None
            if bias is None:      # the fusions look for MatMul then Add: a zero bias
                bias = f"{n.input[1]}_zero_bias"
                graph.initializer.append(numpy_helper.from_array(
                    np.zeros(weight.shape[1], weight.dtype), bias))
            product = f"{n.output[0]}_matmul"
            new = [helper.make_node("MatMul", [x, name], [product], name=f"{n.name}_matmul"),
                   helper.make_node("Add", [product, bias], [y], name=f"{n.name}_bias")]
            dropped.update({id(pre), id(n)})
            replaced[id(post)] = new
            counts["linear"] += 1
        elif n.op_type == "Reshape" and n.input[0] in producer and opset >= 13:
            cast = producer[n.input[0]]
            mask = cast.input[0] if cast.op_type == "Cast" else None
            if (mask is None or not only_reader(cast.output[0], n) or mask not in shapes
                    or len(shapes[mask]) != 2 or n.output[0] not in shapes
                    or shapes[n.output[0]] != [shapes[mask][0], 1, 1, shapes[mask][1]]):
                continue
            axes = []
            for axis in (1, 2):
                axes.append(f"{n.name}_axis{axis}")
                graph.initializer.append(numpy_helper.from_array(np.array([axis], np.int64),
                                                                 axes[-1]))
            first, second = f"{n.name}_unsqueeze1", f"{n.name}_unsqueeze2"
            new = [helper.make_node("Unsqueeze", [mask, axes[0]], [first], name=first),
                   helper.make_node("Unsqueeze", [first, axes[1]], [second], name=second),
                   helper.make_node("Cast", [second], [n.output[0]], name=f"{n.name}_cast",
                                    to=next(a.i for a in cast.attribute if a.name == "to"))]
            dropped.add(id(cast))
            replaced[id(n)] = new
            counts["mask"] += 1
    kept = []
    for n in nodes:
        if id(n) in replaced:
            kept.extend(replaced[id(n)])
        elif id(n) not in dropped:
            kept.append(n)
    del graph.node[:]
    graph.node.extend(kept)
    used = {i for n in graph.node for i in n.input}
    keep_inits = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep_inits)
    del graph.value_info[:]               # the shapes are inferred again by who reads it
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    return counts
