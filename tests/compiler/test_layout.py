"""Packed layouts: names, pack/unpack round trips with padding, pack_graph numerics."""

from __future__ import annotations

import numpy as np
import pytest

import vdla
from vdla.compiler import Graph, GraphError, run_reference, zoo
from vdla.compiler.ir.layout import pack, parse_layout, transform, transform_shape, unpack
from vdla.compiler.passes import pack_graph, prepare, quantize
from vdla.compiler.targets.vdla import VdlaTarget


#: block_in != block_out (smaller buffers keep the GEMM instruction within 128 bits).
MIXED = vdla.HardwareConfig(block_in=8, block_out=16, inp_buff_size=8192,
                            wgt_buff_size=131072)


def blocks(cfg: vdla.HardwareConfig) -> dict:
    """The block sizes pack_graph takes, from an accelerator config."""
    return {"batch": cfg.batch, "block_in": cfg.block_in, "block_out": cfg.block_out}


def naive_pack_nchw(x, b, c):
    """Element by element: out[n//b, ch//c, h, w, n%b, ch%c] = x[n, ch, h, w], zeros
    elsewhere."""
    n, ch, h, w = x.shape
    out = np.zeros((-(-n // b), -(-ch // c), h, w, b, c), x.dtype)
    for i in range(n):
        for j in range(ch):
            out[i // b, j // c, :, :, i % b, j % c] = x[i, j]
    return out


# --- names ---------------------------------------------------------------------------------

def test_parse_layout():
    p = parse_layout("NCHW1n16c")
    assert (p.base, p.outer, p.inner, p.packed, p.rank) == ("NCHW", 1, 16, True, 6)
    assert parse_layout("OI16o8i") == parse_layout("OI16o8i")
    assert parse_layout("OIHW").packed is False and parse_layout("OIHW").rank == 4
    assert parse_layout("NC4n8c").rank == 4


@pytest.mark.parametrize("name", ["NHWC", "NCHW16o16i", "OIHW1n16c", "NCHW0n16c", "", 5,
                                  "NCHW1n"])
def test_parse_layout_rejects(name):
    with pytest.raises(ValueError, match="layout"):
        parse_layout(name)


def test_transform_shape():
    assert transform_shape((1, 3, 5, 7), "NCHW", "NCHW1n16c") == (1, 1, 5, 7, 1, 16)
    assert transform_shape((3, 33, 5, 7), "NCHW", "NCHW2n16c") == (2, 3, 5, 7, 2, 16)
    assert transform_shape((2, 3, 5, 7, 2, 16), "NCHW2n16c", "NCHW") == (4, 48, 5, 7)
    assert transform_shape((2, 3, 5, 7, 2, 16), "NCHW2n16c", "NCHW", 33, 3) == (3, 33, 5, 7)
    assert transform_shape((1, 3, 5, 7, 1, 16), "NCHW1n16c", "NCHW1n8c", 20) == \
        (1, 3, 5, 7, 1, 8)
    assert transform_shape((20, 3, 3, 3), "OIHW", "OIHW16o16i") == (2, 1, 3, 3, 16, 16)
    assert transform_shape((5, 40), "OI", "OI4o16i") == (2, 3, 4, 16)


@pytest.mark.parametrize("shape, src, dst, match", [
    ((1, 3, 5, 7), "NCHW", "OIHW16o16i", "family"),
    ((1, 3, 5), "NCHW", "NCHW1n16c", "rank"),
    ((1, 1, 5, 7, 1, 8), "NCHW1n16c", "NCHW", "blocks"),
    ((1, 1, 5, 7, 1, 16), "NCHW1n16c", "NCHW", "channels"),
])
def test_transform_shape_rejects(shape, src, dst, match):
    kwargs = {"channels": 17} if match == "channels" else {}
    with pytest.raises(ValueError, match=match):
        transform_shape(shape, src, dst, **kwargs)


# --- arrays --------------------------------------------------------------------------------

@pytest.mark.parametrize("n, c, b, blk", [(1, 3, 1, 16), (1, 20, 1, 16), (3, 33, 2, 16),
                                          (2, 16, 1, 16), (5, 7, 4, 2)])
def test_pack_nchw_matches_naive_and_round_trips(n, c, b, blk):
    rng = np.random.default_rng(c)
    x = rng.integers(-128, 128, (n, c, 3, 2)).astype(np.int8)
    packed = pack(x, "NCHW", f"NCHW{b}n{blk}c")
    np.testing.assert_array_equal(packed, naive_pack_nchw(x, b, blk))
    assert packed.dtype == np.int8
    assert packed.shape == transform_shape(x.shape, "NCHW", f"NCHW{b}n{blk}c")
    back = unpack(packed, f"NCHW{b}n{blk}c", "NCHW", channels=c, batch=n)
    np.testing.assert_array_equal(back, x)
    # Without the sizes the zero padding stays.
    padded = unpack(packed, f"NCHW{b}n{blk}c", "NCHW")
    assert padded.shape[:2] == (-(-n // b) * b, -(-c // blk) * blk)
    np.testing.assert_array_equal(padded[:n, :c], x)
    assert not padded[n:].any() and not padded[:, c:].any()


def test_pack_weights_and_dense():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((20, 3, 3, 3)).astype(np.float32)
    p = pack(w, "OIHW", "OIHW16o16i")
    assert p.shape == (2, 1, 3, 3, 16, 16)
    for o in range(20):
        for i in range(3):
            np.testing.assert_array_equal(p[o // 16, i // 16, :, :, o % 16, i % 16], w[o, i])
    assert not p[1, 0, :, :, 4:].any() and not p[:, :, :, :, :, 3:].any()
    np.testing.assert_array_equal(unpack(p, "OIHW16o16i", "OIHW", channels=3, batch=20), w)
    x = rng.standard_normal((3, 33)).astype(np.float32)
    px = pack(x, "NC", "NC2n16c")
    assert px.shape == (2, 3, 2, 16)
    assert px[1, 2, 0, 0] == x[2, 32]
    np.testing.assert_array_equal(unpack(px, "NC2n16c", "NC", channels=33, batch=3), x)


def test_transform_between_blocks():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 20, 2, 2)).astype(np.float32)
    p16 = transform(x, "NCHW", "NCHW1n16c")
    p8 = transform(p16, "NCHW1n16c", "NCHW1n8c", channels=20)
    np.testing.assert_array_equal(p8, pack(x, "NCHW", "NCHW1n8c"))
    np.testing.assert_array_equal(transform(p8, "NCHW1n8c", "NCHW", channels=20), x)
    np.testing.assert_array_equal(transform(x, "NCHW", "NCHW"), x)


def test_pack_rejects_wrong_direction():
    x = np.zeros((1, 16, 2, 2))
    with pytest.raises(ValueError, match="plain layout to a blocked"):
        pack(x, "NCHW1n16c", "NCHW")
    with pytest.raises(ValueError, match="blocked layout to a plain"):
        unpack(x, "NCHW", "NCHW1n16c")


# --- the packing pass ----------------------------------------------------------------------

def chain_graph(rng, n=1, c=3, mid=20, out=33):
    """conv (3 -> 20, bias, relu) -> conv (20 -> 33, residual from a 1x1 conv) ->
    max_pool -> flatten -> dense (bias), all with channel counts off the blocks."""
    g = Graph("chain")
    x = g.add_input("x", (n, c, 6, 6))

    def const(name, shape):
        return g.add_constant(name, rng.standard_normal(shape).astype(np.float32) * 0.3)

    y1 = g.add_node("conv2d", [x, const("w1", (mid, c, 3, 3)), const("b1", (mid,))],
                    pads=(1, 1, 1, 1), activation="relu")
    sc = g.add_node("conv2d", [x, const("ws", (out, c, 1, 1))])
    y2 = g.add_node("conv2d", [y1, const("w2", (out, mid, 3, 3)), "", sc], pads=(1, 1, 1, 1),
                    activation="clip", clip_min=-0.5, clip_max=2.0)
    p = g.add_node("max_pool2d", [y2], kernel=(2, 2), strides=(2, 2))
    f = g.add_node("flatten", [p])
    d = g.add_node("dense", [f, const("wd", (10, out * 9)), const("bd", (10,))])
    g.set_outputs([d, y2])
    return g.validate()


@pytest.mark.parametrize("cfg", [vdla.HardwareConfig(),
                                 vdla.HardwareConfig(batch=2, block_in=8, block_out=16)],
                         ids=["default", "b2_i8_o16"])
@pytest.mark.parametrize("n", [1, 3])
def test_pack_graph_float_numerics(cfg, n):
    rng = np.random.default_rng(n)
    g = chain_graph(rng, n=n)
    before = {k: t.data.copy() for k, t in g.tensors.items() if t.is_constant}
    packed = pack_graph(g, **blocks(cfg))
    # The input graph is untouched.
    assert g.count_ops() == {"conv2d": 3, "max_pool2d": 1, "flatten": 1, "dense": 1}
    assert all(np.array_equal(g.tensors[k].data, v) for k, v in before.items())
    inputs = {"x": rng.standard_normal((n, 3, 6, 6)).astype(np.float32)}
    want, got = run_reference(g, inputs), run_reference(packed, inputs)
    for name in g.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
    for node in packed.nodes():
        if node.op in ("conv2d", "dense"):
            a = node.attrs
            assert a["data_layout"].endswith(f"{cfg.batch}n{cfg.block_in}c")
            assert a["kernel_layout"].endswith(f"{cfg.block_out}o{cfg.block_in}i")
            assert a["out_layout"].endswith(f"{cfg.batch}n{cfg.block_out}c")
            w = packed.tensors[node.inputs[1]]
            assert w.is_constant and w.layout == a["kernel_layout"]
            assert packed.tensors[node.outputs[0]].layout == a["out_layout"]
            if node.input(2):
                assert packed.tensors[node.input(2)].shape[0] % cfg.block_out == 0


def test_pack_graph_keeps_chains_packed():
    g = chain_graph(np.random.default_rng(5))
    packed = pack_graph(g, **blocks(vdla.HardwareConfig()))
    # One pack of x shared by two convs; conv -> conv stays packed (no transform between);
    # the second conv's output is unpacked once for max_pool and the graph output; dense
    # gets a pack after flatten and an unpack for the output.
    transforms = [n for n in packed.nodes() if n.op == "layout_transform"]
    assert len(transforms) == 4, packed.summary()
    conv2 = [n for n in packed.nodes() if n.op == "conv2d" and n.input(3)][0]
    assert packed.producer(conv2.inputs[0]).op == "conv2d"
    assert packed.producer(conv2.inputs[3]).op == "conv2d"
    # Different block_in and block_out: a single blocked -> blocked transform in between.
    packed = pack_graph(g, **blocks(MIXED))
    conv2 = [n for n in packed.nodes() if n.op == "conv2d" and n.input(3)][0]
    between = packed.producer(conv2.inputs[0])
    assert between.op == "layout_transform"
    assert (between.attrs["src"], between.attrs["dst"]) == ("NCHW1n16c", "NCHW1n8c")
    assert packed.producer(between.inputs[0]).op == "conv2d"


def test_pack_graph_leaves_grouped_conv():
    rng = np.random.default_rng(6)
    g = Graph("dw")
    x = g.add_input("x", (1, 4, 5, 5))
    y = g.add_node("conv2d", [x, g.add_constant("w", rng.standard_normal((4, 1, 3, 3)))],
                   groups=4, pads=(1, 1, 1, 1))
    z = g.add_node("conv2d", [y, g.add_constant("w2", rng.standard_normal((5, 4, 1, 1)))])
    g.set_outputs([z])
    packed = pack_graph(g, **blocks(vdla.HardwareConfig()))
    layouts = {n.name: n.attrs["data_layout"] for n in packed.nodes() if n.op == "conv2d"}
    assert layouts == {"conv2d": "NCHW", "conv2d_0": "NCHW1n16c"}
    inputs = {"x": rng.standard_normal((1, 4, 5, 5)).astype(np.float32)}
    np.testing.assert_allclose(run_reference(packed, inputs)[z], run_reference(g, inputs)[z],
                               rtol=1e-5, atol=1e-6)


def test_pack_graph_integer_exact():
    """An integer GEMM graph (hand-built qconv2d/qdense) computes the same integers packed,
    with per-channel requantization attributes padded along."""
    rng = np.random.default_rng(7)
    g = Graph("int")
    x = g.add_input("x", (1, 3, 5, 5), "int8")
    w1 = g.add_constant("w1", rng.integers(-128, 128, (20, 3, 3, 3)), "int8")
    b1 = g.add_constant("b1", rng.integers(-2000, 2000, (20,)), "int32")
    y1 = g.add_node("qconv2d", [x, w1, b1], pads=(1, 1, 1, 1),
                    shift=tuple(int(s) for s in rng.integers(6, 10, 20)), out_min=0)
    w2 = g.add_constant("w2", rng.integers(-128, 128, (33, 20, 1, 1)), "int8")
    y2 = g.add_node("qconv2d", [y1, w2], shift=(9,))
    f = g.add_node("flatten", [y2])
    wd = g.add_constant("wd", rng.integers(-128, 128, (7, 33 * 25)), "int8")
    d = g.add_node("qdense", [f, wd], shift=(12,))
    g.set_outputs([d, y2])
    g.validate()
    packed = pack_graph(g, **blocks(vdla.HardwareConfig()))
    assert len(packed.node("qconv2d").attrs["shift"]) == 32
    inputs = {"x": rng.integers(-128, 128, (1, 3, 5, 5)).astype(np.int8)}
    want, got = run_reference(g, inputs), run_reference(packed, inputs)
    for name in g.outputs:
        assert got[name].dtype == np.int8
        np.testing.assert_array_equal(got[name], want[name])


def test_packed_shape_inference_errors():
    g = Graph("bad")
    x = g.add_input("x", (1, 1, 4, 4, 1, 16))
    w = g.add_constant("w", np.zeros((1, 2, 3, 3, 16, 16), np.float32))
    with pytest.raises(GraphError, match="channels"):
        g.add_node("conv2d", [x, w], data_layout="NCHW1n16c", kernel_layout="OIHW16o16i",
                   out_layout="NCHW1n16c")
    w = g.add_constant("w1", np.zeros((1, 1, 3, 3, 16, 16), np.float32))
    with pytest.raises(GraphError, match="packed kernel_layout"):
        g.add_node("conv2d", [x, w], data_layout="NCHW1n16c")
    with pytest.raises(GraphError, match="not a NCHW layout"):
        g.add_node("conv2d", [x, w], data_layout="NC1n16c", kernel_layout="OIHW16o16i",
                   out_layout="NCHW1n16c")


def test_pack_graph_after_prepare_on_zoo_like_block():
    """prepare then pack: BN-folded, fused conv chain with batch 1 stays exact in float."""
    rng = np.random.default_rng(8)
    g = Graph("block")
    x = g.add_input("x", (1, 3, 6, 6))
    y = g.add_node("conv2d", [x, g.add_constant("w", rng.standard_normal((20, 3, 3, 3)))],
                   pads=(1, 1, 1, 1))
    params = [g.add_constant(k, v) for k, v in (("s", rng.random(20) + 0.5),
                                                ("b", rng.standard_normal(20)),
                                                ("m", rng.standard_normal(20)),
                                                ("v", rng.random(20) + 0.5))]
    y = g.add_node("relu", [g.add_node("batch_norm", [y] + params)])
    g.set_outputs([y])
    prepared = prepare(g)
    packed = pack_graph(prepared, **blocks(vdla.HardwareConfig()))
    inputs = {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)}
    np.testing.assert_allclose(run_reference(packed, inputs)[y],
                               run_reference(g, inputs)[y], rtol=1e-4, atol=1e-4)
    assert packed.count_ops() == {"layout_transform": 2, "conv2d": 1}


def test_pack_graph_computed_weights_and_bias():
    """Weights and bias that are graph inputs get a layout_transform and a pad node."""
    g = Graph("computed")
    x, w, b = g.add_input("x", (3, 20)), g.add_input("w", (5, 20)), g.add_input("b", (5,))
    y = g.add_node("dense", [x, w, b])
    g.set_outputs([y])
    packed = pack_graph(g, **blocks(vdla.HardwareConfig(batch=2)))
    assert packed.count_ops() == {"layout_transform": 3, "pad": 1, "dense": 1}
    dense = packed.node("dense")
    assert packed.tensors[dense.inputs[0]].shape == (2, 2, 2, 16)
    assert packed.tensors[dense.inputs[1]].shape == (1, 2, 16, 16)
    assert packed.tensors[dense.inputs[2]].shape == (16,)
    rng = np.random.default_rng(9)
    inputs = {k: rng.standard_normal(g.tensors[k].shape).astype(np.float32) for k in g.inputs}
    np.testing.assert_allclose(run_reference(packed, inputs)[y], run_reference(g, inputs)[y],
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cfg", [vdla.HardwareConfig(),
                                 vdla.HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR",
                                                              "MUL"}),
                                 vdla.HardwareConfig(batch=2, block_in=8, block_out=16)],
                         ids=["shift", "mul", "b2_i8_o16"])
def test_pack_graph_quantized_model_exact(cfg):
    """A zoo model quantized by `quantize` computes bit-identical integers when packed:
    its output and every plain tensor both graphs still have (the tensors between
    consecutive packed convs exist only packed)."""
    g = zoo.get("resnet18", image_size=32)
    rng = np.random.default_rng(10)
    calibration = {"input": rng.standard_normal((2, 3, 32, 32)).astype(np.float32)}
    q = quantize(g, calibration, VdlaTarget(cfg).requant_modes[0])
    packed = pack_graph(q, **blocks(cfg))
    assert all(n.attrs["data_layout"] != "NCHW" for n in packed.nodes() if n.op == "qconv2d")
    x = {"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}
    want, got = run_reference(q, x, keep=True), run_reference(packed, x, keep=True)
    compared = 0
    for name, t in q.tensors.items():
        if not t.is_constant and name in got:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
            compared += 1
    assert q.outputs[0] in got and compared >= 4


@pytest.mark.parametrize("blocks, message", [
    ({"batch": 0, "block_in": 16, "block_out": 16}, "batch must be a positive integer, not 0"),
    ({"batch": 1, "block_in": 16.0, "block_out": 16}, "block_in must be a positive integer"),
    ({"batch": 1, "block_in": 16, "block_out": True}, "block_out must be a positive integer"),
])
def test_pack_graph_refuses_bad_block_sizes(blocks, message):
    g = Graph("g")
    x = g.add_input("x", (1, 4, 5, 5))
    g.set_outputs([g.add_node("conv2d", [x, g.add_constant("w", np.ones((4, 4, 1, 1)))])])
    with pytest.raises(ValueError, match=message):
        pack_graph(g, **blocks)
