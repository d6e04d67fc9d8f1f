"""Depthwise and pointwise convolutions fused into one kernel
(`vdla.compiler.targets.cpu.fusion`): the whole-graph runner's fused bands give the
unfused kernels' outputs to the bit, on every instruction set, and fuse only the pairs
where the depthwise output would leave the cache."""

from __future__ import annotations

import numpy as np
import pytest

from vdla.compiler import Graph, pipeline
from vdla.compiler.targets.cpu import fusion
from vdla.compiler.targets.model import compile_model

from gemm_graphs import assert_matches


def dw_pw_graph(rng, *, dtype: str, c: int = 24, h: int = 13, w: int = 60, o: int = 40,
                stride: int = 1, residual: bool = False, dw_min: int = 0, share: bool = False):
    """x -> 3x3 depthwise (stride `stride`, ReLU or clamp at `dw_min`) -> 1x1 pointwise
    (`o` outputs, a residual input with `residual`) -> y; with `share`, the depthwise
    output is a graph output too."""
    g = Graph("dwpw")
    f32 = dtype == "float32"
    x = g.add_input("x", (1, c, h, w), dtype)
    feed = {"x": rng.standard_normal((1, c, h, w)).astype(np.float32) if f32
            else rng.integers(-128, 128, (1, c, h, w)).astype(np.int8)}

    def conv(name, src, cin, cout, k, groups, stride, pad, out_min, extra=()):
        shape = (cout, cin // groups, k, k)
        wts = (rng.standard_normal(shape).astype(np.float32) if f32
               else rng.integers(-128, 128, shape).astype(np.int8))
        bias = (g.add_constant(f"{name}.b", rng.standard_normal(cout).astype(np.float32),
                               dtype) if f32 else
                g.add_constant(f"{name}.b", rng.integers(-3000, 3000, cout).astype(np.int32),
                               "int32"))
        attrs = ({"activation": "relu" if out_min == 0 else None} if f32 else
                 {"shift": tuple(int(s) for s in rng.integers(6, 12, cout)),
                  "out_min": out_min, "out_max": 127})
        if extra and not f32:
            attrs["residual_shift"] = 1
        return g.add_node("conv2d" if f32 else "qconv2d",
                          [src, g.add_constant(f"{name}.w", wts, dtype), bias, *extra],
                          name=name, strides=(stride, stride), pads=(pad,) * 4,
                          dilations=(1, 1), groups=groups, **attrs)

    mid = conv("dw", x, c, c, 3, c, stride, 1, dw_min)
    extra = ()
    if residual:
        ho = (h + 2 - 3) // stride + 1
        wo = (w + 2 - 3) // stride + 1
        extra = (g.add_input("r", (1, o, ho, wo), dtype),)
        feed["r"] = (rng.standard_normal((1, o, ho, wo)).astype(np.float32) if f32
                     else rng.integers(-128, 128, (1, o, ho, wo)).astype(np.int8))
    y = conv("pw", mid, c, o, 1, 1, 1, 0, -128, extra)
    g.set_outputs([y, mid] if share else [y])
    return g, feed


@pytest.fixture
def fuse_all(monkeypatch):
    """Every pair that may fuse does, whatever its size (the tests' planes are small)."""
    monkeypatch.setattr(fusion, "MIN_BYTES", 0)
    monkeypatch.setattr(fusion, "BAND_BYTES", 1)        # bands of one row: many of them


def _program(compiled):
    return compiled.ops[0].kernel.program


CASES = [dict(dtype=d, stride=s, residual=r, dw_min=m)
         for d in ("int8", "float32") for s in (1, 2) for r in (False, True)
         for m in ((0, -128) if d == "int8" else (0,))]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_a_fused_pair_gives_the_unfused_kernels_outputs(cpu, fuse_all, case):
    g, feed = dw_pw_graph(np.random.default_rng(7), **case)
    compiled = compile_model(g, cpu)
    program = _program(compiled)
    fused = [s for s in program.steps if s.fused]
    assert [(s.fused, s.name) for s in fused] == [("dw", "pw")]
    assert [s.name for s in program.steps if s.node is not None] == ["pw"]
    with compiled.session() as session:
        whole = session.run_graph(feed)
        alone = session.run(feed).outputs       # each node's own kernel, one at a time
    for name, value in whole.outputs.items():
        np.testing.assert_array_equal(value, alone[name])
    assert_matches(g, whole.outputs, feed)
    assert whole.op_seconds["dw"] == 0.0 and whole.op_seconds["pw"] > 0


def test_only_pairs_whose_depthwise_output_nobody_else_reads_fuse(best, fuse_all):
    rng = np.random.default_rng(3)
    g, _ = dw_pw_graph(rng, dtype="float32", share=True)
    assert not [s for s in _program(compile_model(g, best)).steps if s.fused]
    g, _ = dw_pw_graph(rng, dtype="float32")
    plain = {n.name: None for n in g.nodes()}
    from vdla.compiler.targets.cpu.schedule import choose_conv
    from vdla.compiler.targets.cpu.shapes import ConvShape
    plain["pw"] = choose_conv(ConvShape.from_node(g.node("pw"), g), best.isa, best.team,
                              blocked=False)
    program = _program(compile_model(g, best, schedules=plain))
    assert not [s for s in program.steps if s.fused]      # the pointwise layer is plain


@pytest.mark.parametrize("precision, pairs", [
    ("float32", ["features.0", "features.1", "features.2", "features.4"]), ("int8", [])])
def test_mobilenet_fuses_its_large_planes_only(best, precision, pairs):
    """The default thresholds: MobileNet-v1's pairs whose depthwise output (an image) is
    512 KB or more and whose pointwise weights are 256 KB or less (float32: the 112x112
    and 56x56 planes, and 28x28 at stride 1; int8's are four times smaller, none); the
    model's outputs are the unfused ones."""
    model = pipeline.load_model("mobilenet_v1", note=None)
    graph = pipeline.graph_for(model, best, precision=precision)
    compiled = compile_model(graph, best)
    fused = [(s.fused, s.name) for s in _program(compiled).steps if s.fused]
    assert fused == [(f"{p}.dw.conv", f"{p}.pw.conv") for p in pairs]
    with compiled.session() as session:
        whole = session.run_graph(model.feed)
        alone = session.run(model.feed).outputs
    for name, value in whole.outputs.items():
        np.testing.assert_array_equal(value, alone[name])


def test_a_target_without_fusion_runs_every_node(fuse_all):
    from vdla.compiler import targets

    g, _ = dw_pw_graph(np.random.default_rng(1), dtype="int8")
    compiled = compile_model(g, targets.get("cpu", threads=2, fuse=False))
    assert [s.name for s in _program(compiled).steps if s.node is not None] == ["dw", "pw"]
    with pytest.raises(ValueError, match="fuse must be True or False, not 'no'"):
        targets.get("cpu", fuse="no")


def test_only_a_blocked_direct_convolution_is_a_band(best):
    from vdla.compiler.targets.cpu.lower import node_kernel
    from vdla.compiler.targets.cpu.schedule import choose_conv
    from vdla.compiler.targets.cpu.shapes import ConvShape

    g, _ = dw_pw_graph(np.random.default_rng(2), dtype="float32")
    node = g.node("pw")
    plain = choose_conv(ConvShape.from_node(node, g), best.isa, best.team, blocked=False)
    with pytest.raises(ValueError, match="only a blocked direct convolution runs as a band"):
        node_kernel(node, g, best.isa, schedule=plain, band=True)
