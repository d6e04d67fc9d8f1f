"""The CPU target's attention reading its heads in place (`head_views`): which chains of
slice, reshape and transpose it takes and which it leaves, and that the whole-graph
runner (the in-place kernel, the chain's nodes left out) gives the op-by-op session's
bytes (every node's own kernel) and the reference's (float within tolerance, int8 bit
for bit), on hand-made graphs of two sequences and on the zoo's transformers."""

from __future__ import annotations

import numpy as np
import pytest

from vdla.compiler import Graph, run_reference
from vdla.compiler.targets.cpu.head_views import head_views
from vdla.compiler.targets.model import compile_model

H, D, S, B = 3, 8, 5, 2
F = np.float32


def _graph(slice_steps: int = 1, perm=(0, 2, 1, 3), expose: str = "", merge: bool = True,
           sources: str = "packed") -> Graph:
    """Two sequences of S tokens: a (B * S, 3 * H * D) projection output (or, with
    `sources` "separate", three (B, S, H * D) inputs), sliced into q, k and v, reshaped
    to (B, S, H, D) and transposed to heads; the attention's output merged back to
    (B * S, H * D). `expose` makes one intermediate tensor a graph output too."""
    g = Graph("heads")
    outs = []
    if sources == "packed":         # (with a strided slice: every other column)
        x = g.add_input("x", (B * S, 3 * slice_steps * H * D))
        width = slice_steps * H * D
        cols = [g.add_node("slice", [x], name=f"{n}_slice", starts=(i * width,),
                           ends=((i + 1) * width,), axes=(1,), steps=(slice_steps,))
                for i, n in enumerate("qkv")]
    else:
        cols = [g.add_input(n, (B, S, H * D)) for n in "qkv"]
    heads = []
    for n, c in zip("qkv", cols):
        r = g.add_node("reshape", [c], name=f"{n}_heads", shape=(B, S, H, D))
        heads.append(g.add_node("transpose", [r], name=f"{n}_t", perm=perm))
    y = g.add_node("attention", heads, name="attn", scale=D ** -0.5, causal=False)
    if merge:
        m = g.add_node("transpose", [y], name="merge", perm=(0, 2, 1, 3))
        y = g.add_node("reshape", [m], name="flat", shape=(B * S, H * D))
    outs.append(y)
    if expose:
        outs.append(g.tensors[g.node(expose).outputs[0]].name)
    g.set_outputs(outs)
    return g


def _feed(g: Graph) -> dict:
    rng = np.random.default_rng(3)
    return {n: rng.standard_normal(g.tensors[n].shape).astype(F) for n in g.inputs}


def _views(g: Graph):
    node = g.node("attn")
    return head_views(g, node, {n.name for n in g.nodes()})


def _both_paths(g: Graph, target, feed: dict):
    """`g` compiled for `target`: the whole-graph runner's steps, and its outputs and the
    op-by-op session's on `feed`."""
    compiled = compile_model(g, target)
    with compiled.session() as session:
        whole = session.run_graph(feed).outputs
        alone = session.run(feed).outputs
    return compiled.ops[0].kernel.program.steps, whole, alone


def test_a_packed_projection_is_read_in_place_and_the_merge_written():
    views, absorbed, output = _views(_graph())
    assert [(v.source, v.start, v.row) for v in views[:3]] == [
        ("x", 0, 3 * H * D), ("x", H * D, 3 * H * D), ("x", 2 * H * D, 3 * H * D)]
    assert (views[3].start, views[3].row) == (0, H * D) and output == views[3].source
    assert set(absorbed) == {f"{n}_{s}" for n in "qkv" for s in ("slice", "heads", "t")} \
        | {"merge"}


@pytest.mark.parametrize("change, operands, merged", [
    ({"sources": "separate"}, [("q", 0, H * D), ("k", 0, H * D), ("v", 0, H * D)], True),
    ({"slice_steps": 2}, [("q_slice_out", 0, H * D), ("k_slice_out", 0, H * D),
                          ("v_slice_out", 0, H * D)], True),  # a strided slice stays
    ({"perm": (0, 2, 3, 1)}, [], True),                       # no heads-first transpose
    ({"expose": "k_t"}, "k", True),                           # k's heads are an output
    ({"expose": "q_heads"}, "q", True),
    ({"merge": False}, [("x", 0, 3 * H * D), ("x", H * D, 3 * H * D),
                        ("x", 2 * H * D, 3 * H * D)], False),
])
def test_chains_taken_and_left(change, operands, merged):
    views, absorbed, _ = _views(_graph(**change))
    if isinstance(operands, str):               # all but this one read in place
        kept = "qkv".index(operands)
        assert views[kept] is None and all(v is not None for v in views[:3] if v is not
                                           views[kept])
        assert not any(a.startswith(operands + "_") for a in absorbed)
    elif not operands:
        assert views[:3] == (None, None, None)
    else:
        assert [(v.source, v.start, v.row) for v in views[:3]] == operands
    assert (views[3] is not None) == merged and ("merge" in absorbed) == merged


@pytest.mark.parametrize("change", [{}, {"sources": "separate"}, {"slice_steps": 2},
                                    {"expose": "k_t"}, {"merge": False},
                                    {"perm": (0, 2, 3, 1)}])
def test_whole_graph_run_matches_the_op_by_op_one(best, change):
    g = _graph(**change)
    feed = _feed(g)
    steps, whole, alone = _both_paths(g, best, feed)
    attn = next(s for s in steps if s.name == "attn")
    assert set(attn.fused) == set(_views(g)[1])
    assert not {s.name for s in steps} & set(attn.fused)
    want = run_reference(g, feed)
    for name in g.outputs:
        np.testing.assert_array_equal(whole[name], alone[name])
        np.testing.assert_allclose(whole[name], want[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, precision", [("vit_digits", "float32"), ("vit_digits", "int8"),
                                             ("bert_tiny", "float32"), ("bert_tiny", "int8")])
def test_zoo_transformers_read_every_attention_in_place(best, name, precision):
    """Every attention of the zoo's small transformers reads q, k and v from the packed
    projection and writes the merged heads; int8 bit for bit the reference."""
    from vdla.compiler import pipeline
    model = pipeline.load_model(name, calibration=2, note=None)
    graph = pipeline.graph_for(model, best, precision=precision)
    feed = dict(model.feed)
    steps, whole, alone = _both_paths(graph, best, feed)
    attentions = [s for s in steps if s.node is not None and "attention" in s.node.op]
    assert attentions and all(len(s.fused) == 10 for s in attentions)
    want = run_reference(graph, feed)
    for out in graph.outputs:
        np.testing.assert_array_equal(whole[out], alone[out])
        if precision == "int8":
            np.testing.assert_array_equal(whole[out], want[out])
        else:
            assert pipeline.relative_error(whole[out], want[out]) <= pipeline.FLOAT_TOLERANCE
