"""Depthwise and pointwise convolutions fused into one kernel
(`vdla.compiler.targets.cpu.fusion`): the whole-graph runner's fused bands give the
unfused kernels' outputs to the bit, on every instruction set, and fuse only the pairs
where the depthwise output would leave the cache."""

from __future__ import annotations

import numpy as np
import pytest

from vdla.compiler import Graph, pipeline
from vdla.compiler.targets.cpu import amx, fusion
from vdla.compiler.targets.cpu.shapes import ConvShape
from vdla.compiler.targets.model import compile_model

from gemm_graphs import assert_matches


def dw_pw_graph(rng, *, dtype: str, c: int = 24, h: int = 13, w: int = 56, o: int = 40,
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
    """On tiles, an int8 pointwise layer of whole 64-channel steps is a tile GEMM on
    plain tensors: nothing fuses, and the outputs are still the reference's."""
    g, feed = dw_pw_graph(np.random.default_rng(7), **case)
    compiled = compile_model(g, cpu)
    program = _program(compiled)
    fused = [s for s in program.steps if s.fused]
    tiles = cpu.isa.tiles and amx.reads_in_place(ConvShape.from_node(g.node("pw"), g))
    assert [(s.fused, s.name) for s in fused] == ([] if tiles else [(("dw",), "pw")])
    assert [s.name for s in program.steps if s.node is not None] == (
        ["dw", "pw"] if tiles else ["pw"])
    with compiled.session() as session:
        whole = session.run_graph(feed)
        alone = session.run(feed).outputs       # each node's own kernel, one at a time
    for name, value in whole.outputs.items():
        np.testing.assert_array_equal(value, alone[name])
    assert_matches(g, whole.outputs, feed)
    assert (whole.op_seconds["dw"] == 0.0) != tiles and whole.op_seconds["pw"] > 0


def test_only_pairs_whose_depthwise_output_nobody_else_reads_fuse(best, fuse_all):
    rng = np.random.default_rng(3)
    g, _ = dw_pw_graph(rng, dtype="float32", share=True)
    assert not [s for s in _program(compile_model(g, best)).steps if s.fused]
    g, _ = dw_pw_graph(rng, dtype="float32")
    plain = {n.name: None for n in g.nodes()}
    from vdla.compiler.targets.cpu.schedule import choose_conv
    plain["pw"] = choose_conv(ConvShape.from_node(g.node("pw"), g), best.isa, best.team,
                              blocked=False)
    program = _program(compile_model(g, best, schedules=plain))
    assert not [s for s in program.steps if s.fused]      # the pointwise layer is plain


#: MobileNet-v1's depthwise outputs, float32 bytes: features.0 is 112 x 112 x 32, .1 a
#: stride-2 layer to 56 x 56 x 64, .2 56 x 56 x 128, .4 28 x 28 x 256 (.3 and the rest
#: smaller); their pointwise weights are 256 KB or less
_MOBILENET_DW_BYTES = {"features.0": 112 * 112 * 32 * 4, "features.1": 56 * 56 * 64 * 4,
                       "features.2": 56 * 56 * 128 * 4, "features.4": 28 * 28 * 256 * 4}


@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_mobilenet_fuses_its_large_planes_only(best, precision):
    """The default thresholds: MobileNet-v1's pairs whose depthwise output (an image) is
    half the machine's L2 or more (512 KB of a 1 MiB L2: the 112x112 and 56x56 planes,
    and 28x28 at stride 1; of a 2 MiB L2 the two of 1.6 MB and more; int8's are four
    times smaller, none); the model's outputs are the unfused ones."""
    floor = best.costs.l2_bytes(fusion.MIN_BYTES)
    pairs = [p for p, size in _MOBILENET_DW_BYTES.items()
             if precision == "float32" and size >= floor]
    assert precision == "int8" or pairs, "the largest plane fuses on any L2 up to 6 MiB"
    model = pipeline.load_model("mobilenet_v1", note=None)
    graph = pipeline.graph_for(model, best, precision=precision)
    compiled = compile_model(graph, best)
    fused = [(s.fused, s.name) for s in _program(compiled).steps if s.fused]
    assert fused == [((f"{p}.dw.conv",), f"{p}.pw.conv") for p in pairs]
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

    g, _ = dw_pw_graph(np.random.default_rng(2), dtype="float32")
    node = g.node("pw")
    plain = choose_conv(ConvShape.from_node(node, g), best.isa, best.team, blocked=False)
    with pytest.raises(ValueError, match="only a blocked direct convolution runs as a band"):
        node_kernel(node, g, best.isa, schedule=plain, band=True)


# --- a convolution and the max pool after it ------------------------------------------------

def conv_pool_graph(rng, *, dtype: str, c: int = 16, h: int = 23, w: int = 30, o: int = 24,
                    k: int = 3, pool: tuple[int, int, int] = (3, 2, 1), residual: bool = False):
    """x -> k x k convolution of stride 1 (ReLU; a residual input with `residual`) ->
    max pool (window, stride, pad = `pool`) -> y."""
    g = Graph("convpool")
    f32 = dtype == "float32"
    x = g.add_input("x", (1, c, h, w), dtype)

    def data(shape):
        return (rng.standard_normal(shape).astype(np.float32) if f32
                else rng.integers(-128, 128, shape).astype(np.int8))

    feed = {"x": data((1, c, h, w))}
    bias = (g.add_constant("b", rng.standard_normal(o).astype(np.float32), dtype) if f32
            else g.add_constant("b", rng.integers(-3000, 3000, o).astype(np.int32), "int32"))
    attrs = ({"activation": "relu"} if f32 else
             {"shift": tuple(int(s) for s in rng.integers(6, 12, o)), "out_min": 0,
              "out_max": 127})
    extra = ()
    if residual:
        extra = (g.add_input("r", (1, o, h, w), dtype),)
        feed["r"] = data((1, o, h, w))
        if not f32:
            attrs["residual_shift"] = 1
    y = g.add_node("conv2d" if f32 else "qconv2d",
                   [x, g.add_constant("w", data((o, c, k, k)), dtype), bias, *extra],
                   name="conv", strides=(1, 1), pads=(k // 2,) * 4, dilations=(1, 1),
                   groups=1, **attrs)
    window, stride, pad = pool
    z = g.add_node("max_pool2d", [y], name="pool", kernel=(window, window),
                   strides=(stride, stride), pads=(pad,) * 4)
    g.set_outputs([z])
    return g, feed


POOL_CASES = [dict(dtype=d, pool=p, residual=r) for d in ("int8", "float32")
              for p in ((3, 2, 1), (2, 2, 0), (3, 1, 1), (5, 3, 2)) for r in (False, True)]


@pytest.mark.parametrize("case", POOL_CASES,
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_a_fused_convolution_and_pool_give_the_unfused_kernels_outputs(cpu, fuse_all, case):
    """Bands of one pooled row, in rounds of a team of two: every band's windows reach
    into the band before it (window 3 and 5) or not (window 2), and the outputs are the
    unfused kernels' to the bit on every instruction set."""
    g, feed = conv_pool_graph(np.random.default_rng(11), **case)
    compiled = compile_model(g, cpu, schedules={"conv": _conv_schedule(g, cpu), "pool": None})
    program = _program(compiled)
    assert [(s.fused, s.name) for s in program.steps if s.fused] == [(("conv",), "pool")]
    with compiled.session() as session:
        whole = session.run_graph(feed)
        alone = session.run(feed).outputs
    for name, value in whole.outputs.items():
        np.testing.assert_array_equal(value, alone[name])
    assert_matches(g, whole.outputs, feed)
    assert whole.op_seconds["conv"] == 0.0 and whole.op_seconds["pool"] > 0


def test_the_pooled_bands_own_every_convolution_row_once(best, fuse_all):
    """Band k computes convolution rows own[k] to own[k + 1]: together every row, each
    once, and each band's up to the last row its pooled windows reach."""
    g, _ = conv_pool_graph(np.random.default_rng(4), dtype="float32", h=23)
    kernel = fusion.pooled_kernel(g, g.node("conv"), g.node("pool"),
                                  _conv_schedule(g, best), best.isa, 2)
    line = next(x for x in kernel.body.splitlines() if "_own[" in x and "static" in x)
    own = [int(v) for v in line.split("{")[1].split("}")[0].split(",")]
    assert own[0] == 0 and own[-1] == 23 and own == sorted(own)
    # 12 pooled rows in bands of one: pooled row k - 1's window ends before conv row 2k
    assert own[1:-1] == [2 * k for k in range(1, 12)]


def _conv_schedule(g, target):
    """The default chooser's blocked schedule for node "conv", direct (Winograd does not
    run in bands)."""
    import dataclasses

    from vdla.compiler.targets.cpu.schedule import choose_conv
    schedule = choose_conv(ConvShape.from_node(g.node("conv"), g), target.isa, target.team)
    assert schedule.layout == "nchwc"
    return dataclasses.replace(schedule, wino=0)


@pytest.mark.parametrize("precision, pairs", [("float32", [(("conv1",), "maxpool")]),
                                              ("int8", [])])
def test_resnet_fuses_its_stem_and_pool_where_the_stem_is_blocked(best, precision, pairs):
    """ResNet-18's stem (112x112x64) and its max pool fuse in float32, where the default
    chooser blocks the stem; int8's stem is a plain kernel (three input channels) and
    runs alone. The model's outputs are the unfused ones."""
    model = pipeline.load_model("resnet18", note=None)
    graph = pipeline.graph_for(model, best, precision=precision)
    compiled = compile_model(graph, best)
    assert [(s.fused, s.name) for s in _program(compiled).steps if s.fused] == pairs
    with compiled.session() as session:
        whole = session.run_graph(model.feed)
        alone = session.run(model.feed).outputs
    for name, value in whole.outputs.items():
        np.testing.assert_array_equal(value, alone[name])
