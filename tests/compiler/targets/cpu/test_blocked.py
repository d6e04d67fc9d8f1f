"""Blocked activation layouts (NCHW{vl}c) on the CPU target: the conversions, the
blocked convolution kernels on every instruction set against the references, the
knob's errors, and the whole-graph runner's conversions (only where a layout changes)."""

from __future__ import annotations

import numpy as np
import pytest

from vdla.compiler import pipeline, run_reference, targets
from vdla.compiler.ir.tensor import DTYPES
from vdla.compiler.targets.cpu import blocked, layout, ops
from vdla.compiler.targets.cpu.library import build_kernels, call, load
from vdla.compiler.targets.cpu.schedule import (ConvSchedule, ScheduleError, blocked_fits,
                                                choose_conv, input_block)
from vdla.compiler.targets.cpu.shapes import ConvShape
from vdla.compiler.targets.model import compile_model

from gemm_graphs import assert_matches, conv_graph
from op_cases import CASES

# --- conversions ------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, block", [((2, 37, 5, 3), 16), ((1, 8, 4, 4), 8),
                                          ((1, 3, 7, 9), 16)])
def test_numpy_round_trip_pads_with_zeros(shape, block):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    b = layout.to_blocked(x, block)
    assert b.shape == layout.block_shape(shape, block)
    np.testing.assert_array_equal(layout.from_blocked(b, shape[1]), x)
    padded = -(-shape[1] // block) * block - shape[1]
    if padded:
        assert not b[:, -1, ..., block - padded:].any()


@pytest.mark.parametrize("src, dst", [(0, 16), (16, 0), (8, 16), (16, 8), (0, 8), (8, 0),
                                      (0, 32), (32, 0), (0, 4), (64, 0), (16, 64),
                                      (64, 16), (64, 32), (8, 64), (24, 16)])
@pytest.mark.parametrize("dtype", ["int8", "float32", "int32"])
@pytest.mark.parametrize("shape", [(2, 21, 6, 5), (1, 37, 16, 2), (1, 64, 7, 9)],
                         ids=["x".join(map(str, s)) for s in ((2, 21, 6, 5), (1, 37, 16, 2),
                                                               (1, 64, 7, 9))])
def test_c_conversion_matches_numpy(cpu, src, dst, dtype, shape):
    """Every instruction set: whole 16-pixel tiles transposed in registers (32 and 63
    pixels: two and three of them, and a tail), a tail alone (30 pixels, with 21
    channels: a padded block), blocks of 4 to 64 (tiles of 4 to 16 lanes); blocked to
    blocked in runs of the smaller block (16 <-> 64: the VNNI and tile kernels'), or
    channel by channel where it does not divide the larger (24 -> 16)."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 50).astype(dtype)
    kernel = layout.convert_kernel(shape, dtype, src, dst)
    lib = load(build_kernels([kernel], cpu.isa))
    out = np.full(layout.block_shape(shape, dst), 99, dtype)   # padding must be rewritten
    call(lib, kernel, [layout.to_blocked(x, src)], out)
    np.testing.assert_array_equal(out, layout.to_blocked(x, dst))


def test_converting_to_the_same_layout_is_refused():
    with pytest.raises(ValueError, match="both NCHW16c"):
        layout.convert_kernel((1, 16, 2, 2), "float32", 16, 16)


# --- kernels ----------------------------------------------------------------------------------

def _run(target, g, feed, schedule):
    compiled = compile_model(g, target, schedules={"conv": schedule})
    with compiled.session() as session:
        outputs = session.run(feed).outputs
        whole = session.run_graph(feed)
    for name, value in whole.outputs.items():
        np.testing.assert_array_equal(value, outputs[name])
    return outputs, whole


DENSE = [dict(dtype="float32"),
         dict(dtype="float32", k=1, pad=0, residual=True, activation="relu", n=2),
         dict(dtype="float32", k=7, stride=2, pad=3, c=3, o=20, h=15, w=13),   # plain input
         dict(dtype="float32", k=3, pad=1, h=2, w=2, c=5, o=37, activation="clip"),
         dict(nonnegative=True, out_min=0),
         dict(nonnegative=True, residual=True, c=33, o=17, k=1, pad=0, multiply=True),
         dict(nonnegative=True, k=3, stride=2, pad=1, c=40, o=40, h=14, w=14),
         dict(nonnegative=True, dilation=2, k=3, pad=2, n=2, per_channel=False),
         # int8 inputs that may be negative: read as x + 128, corrected at the edges
         dict(),
         dict(k=3, stride=2, pad=1, c=40, o=40, h=14, w=14, residual=True),
         dict(k=1, pad=0, c=33, o=17, out_min=0),
         dict(k=5, pad=1, h=8, w=11, c=24, o=20, n=2),
         dict(dilation=2, k=3, pad=2, h=6, w=6)]
DEPTHWISE = [dict(groups=24, c=24, o=24, k=3, stride=2),
             dict(groups=24, c=24, o=24, dtype="float32", activation="relu"),
             dict(groups=40, c=40, o=40, k=5, pad=2, h=7, w=7),
             dict(groups=17, c=17, o=17, residual=True, n=2, dtype="float32"),
             dict(groups=17, c=17, o=17, residual=True, multiply=True)]


@pytest.mark.parametrize("case", DENSE + DEPTHWISE, ids=str)
def test_blocked_convolutions_on_every_isa(cpu, case):
    """Register tiles of one pixel up to whole rows, channel tails, the row's edge tiles,
    strides, dilation, residuals and activations: int8 bit-exact, float32 within the
    tolerance, op by op and in the whole-graph runner."""
    rng = np.random.default_rng(3)
    g, feed = conv_graph(rng, **case)
    if case.get("activation") == "clip":
        g.node("conv").attrs.update(clip_min=-0.5, clip_max=0.75)
    shape = ConvShape.from_node(g.node("conv"), g)
    vl = cpu.isa.lanes[0]
    tiles = [(1, 1), (4, 1), (7, 1), (12, 1)] if shape.depthwise else \
        [(1, 1), (4, 2), (5, 2), (3, 1), (12, 1)]
    for mr, nv in tiles:
        s = ConvSchedule(vl, mr, nv, nv * vl, max(1, shape.ho // 3), shape.cg_padded, "co",
                         2 if mr == 4 else 1, "all", "co", "nchwc")
        outputs, whole = _run(cpu, g, feed, s)
        assert_matches(g, outputs, feed)
        # The input and the residual come in plain, the output goes out plain.
        plain_input = input_block(shape, vl) == 1
        assert len(whole.layout_seconds) == (1 if plain_input else 2) + shape.residual


@pytest.mark.parametrize("change, message", [
    (dict(lanes="px"), "lanes must be 'co'"),
    (dict(layout="nhwc"), "layout='nhwc'"),
    (dict(tile_ci=4), "tile_ci must be 20"),
    (dict(tile_co=20), "multiple of nv \\* vl"),
    (dict(mr=20, nv=2), "registers"),
])
def test_blocked_knob_errors(best, change, message):
    g, _ = conv_graph(np.random.default_rng(0), dtype="float32")
    shape = ConvShape.from_node(g.node("conv"), g)
    vl = best.isa.lanes[0]
    base = dict(vl=vl, mr=4, nv=1, tile_co=vl, tile_h=3, tile_ci=shape.cg_padded,
                lanes="co", layout="nchwc")
    with pytest.raises(ScheduleError, match=message):
        ConvSchedule(**{**base, **change}).check(shape, best.isa)


@pytest.mark.parametrize("dtype, c, blocked", [("int8", 3, False), ("int8", 7, False),
                                             ("int8", 8, True), ("float32", 3, True)])
def test_the_space_blocks_int8_layers_only_from_8_input_channels(best, dtype, c, blocked):
    """The int8 stems' blocked kernels ran 3-4x slower than the plain ones, and the
    learned chooser picked them: the space holds the blocked layout for an int8
    one-group layer from `blocked_fits`' 8 input channels on, for float32 from 1."""
    from vdla.compiler.targets.cpu.schedule import conv_space

    g, _ = conv_graph(np.random.default_rng(0), dtype=dtype, c=c, o=16, h=8, w=8)
    shape = ConvShape.from_node(g.node("conv"), g)
    layouts = {s.layout for s in conv_space(shape, best.isa)}
    assert layouts == ({"plain", "nchwc"} if blocked else {"plain"})
    assert blocked_fits(shape, best.isa) == blocked


@pytest.mark.parametrize("case, message", [
    (dict(groups=2, c=14, o=10), "one group or a depthwise"),
    (dict(groups=8, c=8, o=16), "one output per channel"),
])
def test_blocked_refusals_name_the_layer(best, case, message):
    g, _ = conv_graph(np.random.default_rng(0), **case)
    shape = ConvShape.from_node(g.node("conv"), g)
    s = ConvSchedule(best.isa.lanes[0], 1, 1, best.isa.lanes[0], 1, shape.cg_padded,
                     lanes="co", layout="nchwc")
    with pytest.raises(ScheduleError, match=message):
        s.check(shape, best.isa)
    assert choose_conv(shape, best.isa).layout == "plain"


def test_schedule_dict_keeps_its_old_form_when_plain(best):
    g, _ = conv_graph(np.random.default_rng(0), dtype="float32", groups=2, c=14, o=10)
    plain = choose_conv(ConvShape.from_node(g.node("conv"), g), best.isa)
    assert "layout" not in plain.to_dict()
    assert ConvSchedule.from_dict(plain.to_dict()) == plain
    blocked = dict(plain.to_dict(), lanes="co", layout="nchwc")
    assert ConvSchedule.from_dict(blocked).layout == "nchwc"


# --- the program ------------------------------------------------------------------------------

@pytest.mark.parametrize("model, precision", [("small_cnn", "float32"), ("small_cnn", "int8"),
                                              ("mobilenet_v1", "float32")])
def test_a_model_converts_only_where_the_layout_changes(best, model, precision):
    """Blocked layers hand their outputs to each other unconverted: a conversion is
    placed where a plain op reads a blocked tensor or the other way round."""
    m = pipeline.load_model(model, note=None)
    graph = pipeline.graph_for(m, best, precision=precision)
    compiled = compile_model(graph, best)
    program = compiled.ops[0].kernel.program
    blocked = [n.name for n in program.nodes if program.kernels[n.name].out_block]
    assert blocked, "the default chooser should block some layers"
    for step in program.conversions:
        tensor, src, dst = step.reads[0][0], step.reads[0][1], step.writes[1]
        readers = [s for s in program.steps if (tensor, dst) in s.reads]
        assert src != dst and (readers or tensor in graph.outputs)
    with compiled.session() as session:
        whole = session.run_graph(m.feed)
        ref = session.run(m.feed).outputs
    assert set(whole.layout_seconds) == {s.name for s in program.conversions}
    for name, value in whole.outputs.items():
        np.testing.assert_array_equal(value, ref[name])


# --- pools that read blocked inputs ---------------------------------------------------------

POOL_CASES = [name for name in CASES
              if name.startswith(("max_pool2d", "global_avg_pool2d", "qglobal_avg_pool2d"))]


@pytest.mark.parametrize("name", POOL_CASES)
@pytest.mark.parametrize("block", [8, 16])
def test_pools_on_blocked_inputs_match_the_reference(best, name, block):
    """Max pools (every window, stride, padding and ceil mode of the op cases, windows
    wholly in the padding too) keep the blocked layout; global pools write plain."""
    g, feed = CASES[name]()
    node = g.nodes()[0]
    want = run_reference(g, feed)[g.outputs[0]]
    kernel = ops.build(node, g, best.isa, in_block=block)
    assert kernel.in_blocks == (block,)
    lib = load(build_kernels([kernel], best.isa))
    t = g.tensors[g.outputs[0]]
    out = np.empty(layout.block_shape(t.shape, kernel.out_block), DTYPES[t.dtype])
    call(lib, kernel, [layout.to_blocked(feed[node.inputs[0]], block)], out, threads=2)
    got = layout.from_blocked(out, t.shape[1]) if kernel.out_block else out
    if node.op == "global_avg_pool2d":
        np.testing.assert_allclose(got, want, rtol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", [dict(dtype="float32", c=3, o=64, k=7, stride=2, pad=3,
                                       h=30, w=30),
                                  dict(dtype="float32", c=64, o=64, h=56, w=56),
                                  dict(nonnegative=True, c=64, o=128, h=7, w=7),
                                  dict(groups=32, c=32, o=32, h=20, w=20)], ids=str)
def test_the_chooser_fits_every_isa(cpu, case):
    """The default's blocked register tile fits each instruction set's registers (a
    stem's 7x2 tile does not fit AVX2's, which takes 6x2)."""
    g, _ = conv_graph(np.random.default_rng(0), **case)
    shape = ConvShape.from_node(g.node("conv"), g)
    chosen = choose_conv(shape, cpu.isa, 2)
    assert chosen.layout == "nchwc"
    assert chosen.check(shape, cpu.isa) is chosen


# --- work items (what a thread count can get out of a kernel) ---------------------------------

@pytest.mark.parametrize("threads", [2, 16])
def test_kernels_count_their_work_items(threads):
    """`Kernel.items` is what each kernel's OpenMP loop shares: the blocked layers'
    channel tiles by row tiles, a serial layer's one; the chooser for more threads cuts
    rows until there are items for every thread (2 per thread)."""
    target = targets.get("cpu", threads=threads)
    m = pipeline.load_model("mobilenet_v1", note=None)
    graph = pipeline.graph_for(m, target, precision="int8")
    kernels, used = target.kernels(graph, graph.nodes(), schedules={})
    node = "features.12.dw.conv"             # 1024 channels, 7x7
    s = used[node]
    blocks = -(-1024 // s.vl)
    assert kernels[node].items == -(-blocks // (s.tile_co // s.vl)) * -(-7 // s.tile_h)
    for name, kernel in kernels.items():
        s = used[name]
        if getattr(s, "layout", "") == "nchwc" and s.parallel != "none":
            assert kernel.items >= 2 * threads or s.tile_h == 1, (name, kernel.items)
        elif s is not None and s.parallel == "none":
            assert kernel.items == 1, name


def test_the_plain_chooser_never_blocks(best):
    m = pipeline.load_model("mobilenet_v1", note=None)
    graph = pipeline.graph_for(m, best, precision="float32")
    for task in best.tasks(graph):
        if task.conv:
            assert choose_conv(task.shape, best.isa, 2, blocked=False).layout == "plain"
            assert (choose_conv(task.shape, best.isa, 2).layout == "nchwc") == \
                blocked_fits(task.shape, best.isa)


# --- Winograd F(2x2, 3x3) -----------------------------------------------------------------------

WINOGRAD = [dict(dtype="float32"),                                    # 9x9: odd, both edges
            dict(dtype="float32", h=8, w=10, c=33, o=17, pad=0),      # valid, channel tails
            dict(dtype="float32", h=7, w=7, residual=True, activation="relu", n=2),
            dict(dtype="float32", h=2, w=2, c=16, o=16, activation="clip"),
            dict(dtype="float32", h=14, w=14, c=8, o=40, bias=False)]


@pytest.mark.parametrize("case", WINOGRAD, ids=str)
def test_winograd_on_every_isa(cpu, case):
    """Winograd tiles at the image's edges and past odd sizes, channel tails, residuals,
    activations and batches, register tiles that do and do not divide a work item's
    tiles, both loop orders: within the float tolerance of the reference, op by op and
    in the whole-graph runner."""
    rng = np.random.default_rng(5)
    g, feed = conv_graph(rng, **case)
    if case.get("activation") == "clip":
        g.node("conv").attrs.update(clip_min=-0.5, clip_max=0.75)
    shape = ConvShape.from_node(g.node("conv"), g)
    vl = cpu.isa.lanes[0]
    top = -(-shape.o // vl) * vl
    for mr, tile_co, tile_h, order, unroll in [(1, vl, 2, "co", 1), (3, top, 3, "px", 2),
                                               (8, vl, shape.ho, "co", 1),
                                               (12, top, 4, "co", 2)]:
        s = ConvSchedule(vl, mr, 1, tile_co, min(tile_h, shape.ho), shape.cg_padded, order,
                         unroll, "all", "co", "nchwc", wino=2)
        outputs, _ = _run(cpu, g, feed, s)
        assert_matches(g, outputs, feed)


def test_winograd_weights_transform_back_to_the_convolution():
    """U = G g G^T, multiplied point by point with a tile's V = B^T d B and transformed
    back (A^T M A), is the 3x3 convolution of the 4x4 tile: F(2x2, 3x3) itself."""
    from vdla.compiler.targets.cpu.winograd import transform_weights
    rng = np.random.default_rng(0)
    g, d = rng.standard_normal((3, 3)), rng.standard_normal((4, 4))
    u = transform_weights(g.reshape(1, 1, 3, 3), 1).reshape(4, 4)
    bt = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]])
    at = np.array([[1, 1, 1, 0], [0, 1, -1, -1]])
    got = at @ (u * (bt @ d @ bt.T)) @ at.T
    want = [[np.sum(g * d[i:i + 3, j:j + 3]) for j in range(2)] for i in range(2)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case, change, message", [
    (dict(), dict(), "float32 3x3"),                                          # int8
    (dict(dtype="float32", stride=2), dict(), "stride 1"),
    (dict(dtype="float32", k=5, pad=2), dict(), "float32 3x3"),
    (dict(dtype="float32", c=3), dict(), "at least 8 input channels"),
    (dict(dtype="float32"), dict(nv=2, tile_co=2 * 16), "nv must be 1"),
    (dict(dtype="float32"), dict(wino=4), "allowed \\[0, 2\\]"),
    (dict(dtype="float32"), dict(layout="plain", lanes="px"), "layout must be 'nchwc'"),
])
def test_winograd_refusals_name_the_knob(best, case, change, message):
    g, _ = conv_graph(np.random.default_rng(0), nonnegative=True, **case)
    shape = ConvShape.from_node(g.node("conv"), g)
    vl = best.isa.lanes[0]
    base = dict(vl=vl, mr=4, nv=1, tile_co=vl, tile_h=2, tile_ci=shape.cg_padded,
                lanes="co", layout="nchwc", wino=2)
    if "tile_co" in change:
        change = dict(change, tile_co=change["nv"] * vl)
    with pytest.raises(ScheduleError, match=message):
        ConvSchedule(**{**base, **change}).check(shape, best.isa)


def test_the_chooser_picks_winograd_where_it_fits(best):
    m = pipeline.load_model("resnet18", note=None)
    for precision in ("float32", "int8"):
        graph = pipeline.graph_for(m, best, precision=precision)
        for task in best.tasks(graph):
            if task.conv:
                s = task.default_schedule()
                fits = precision == "float32" and task.shape.kh == 3 and task.shape.sh == 1
                assert bool(s.wino) == fits, task.describe()
                assert s.to_dict().get("wino", 0) == s.wino


# --- int8 stems as one GEMM ------------------------------------------------------------------

@pytest.mark.parametrize("case", [dict(n=1, c=3, h=23, w=19, o=20, k=7, stride=2, pad=3),
                                  dict(n=2, c=3, h=12, w=11, o=9, k=3, stride=2, pad=1),
                                  dict(n=1, c=3, h=15, w=13, o=40, k=3, stride=2, pad=1),
                                  dict(n=1, c=3, h=60, w=41, o=24, k=11, stride=4, pad=5),
                                  dict(n=1, c=4, h=9, w=10, o=8, k=3, stride=1, pad=2,
                                       dilation=2)], ids=str)
def test_an_int8_stem_with_a_signed_input_runs_as_one_gemm_without_vnni(cpu, case):
    """A few-channel int8 convolution whose input may be negative runs as its im2col
    rows times the weights (`patches.runs_as_gemm`) on an instruction set without VNNI,
    its windows overlapping and reaching into the padding; elsewhere (and with a
    non-negative input) the direct kernel. Bit-exact either way, one op and whole graph."""
    from vdla.compiler.targets.cpu.patches import runs_as_gemm
    g, feed = conv_graph(np.random.default_rng(5), **case)
    node = next(n for n in g.nodes() if n.op == "qconv2d")
    shape = ConvShape.from_node(node, g)
    gemm = cpu.isa.vector_int8 in ("maddubs", "portable")    # tiles: VNNI's code for 3 or 4
    assert shape.offset and runs_as_gemm(shape, cpu.isa) == gemm
    compiled = compile_model(g, cpu)
    assert (compiled.ops[-1].schedule is None) == gemm
    assert not any(t.nodes == (node.name,) for t in cpu.tasks(g)) or not gemm
    with compiled.session() as session:
        out = session.run(feed).outputs
        whole = session.run_graph(feed).outputs
    np.testing.assert_array_equal(out[g.outputs[0]], whole[g.outputs[0]])
    assert_matches(g, out, feed)
    relu = dict(case, nonnegative=True)
    g, _ = conv_graph(np.random.default_rng(5), **relu)
    node = next(n for n in g.nodes() if n.op == "qconv2d")
    assert not runs_as_gemm(ConvShape.from_node(node, g), cpu.isa)


@pytest.mark.parametrize("side, mr, width", [
    (7, 6, 49), (14, 6, 196),        # AVX2's 6-pixel tiles: 6 + 1 and 6 + 6 + 2 a row
    (28, 6, 28), (56, 6, 56),        # 30 and 60 slots a row: within the waste allowed
    (14, 14, 14), (7, 14, 49),       # AVX-512's 14-pixel tiles: rows, or the plane
    (14, 28, 28), (9, 4, 27)])
def test_a_flattened_plane_is_cut_in_rows_that_waste_least(side, mr, width):
    """A 1x1 layer keeps its rows unless a register tile wastes more than an eighth of
    its pixel slots there; then the plane is cut in rows of the width with the fewest
    tiles (the smallest such)."""
    g, _ = conv_graph(np.random.default_rng(0), dtype="float32", k=1, pad=0, h=side, w=side)
    shape = ConvShape.from_node(g.node("conv"), g)
    assert blocked._row_width(shape, mr) == width
    s = ConvSchedule(8, mr, 1, 8, side, shape.cg_padded, "co", 1, "all", "co", "nchwc")
    assert blocked.keeps_rows(shape, s) == (width == side)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_avx2_tiles_on_small_planes_match_the_reference(cpu, dtype):
    """The defaults' 6-pixel tiles over 14x14 and 7x7 pointwise planes cut in one row."""
    for side in (14, 7):
        g, feed = conv_graph(np.random.default_rng(side), dtype=dtype, k=1, pad=0, h=side,
                             w=side, c=24, o=40, residual=True, nonnegative=dtype == "int8")
        shape = ConvShape.from_node(g.node("conv"), g)
        vl = cpu.isa.lanes[0]
        s = ConvSchedule(vl, 6, 2, 4 * vl, side, shape.cg_padded, "px", 2, "all", "co",
                         "nchwc").check(shape, cpu.isa)
        outputs, _ = _run(cpu, g, feed, s)
        assert_matches(g, outputs, feed)
