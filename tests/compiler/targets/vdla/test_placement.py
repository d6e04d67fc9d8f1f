"""Activations in DRAM between ops: concat along channels with block-unaligned parts as
views (the readers follow a channel map), flatten as a view, and the host touching only
the model's edges. Every model is checked bit-exactly against the quantized reference."""

from __future__ import annotations

import numpy as np
import pytest

import vdla
from vdla.compiler import Graph, passes
from vdla.compiler.passes import quantize
from vdla.compiler.targets.model import compile_model
from vdla.compiler.targets.vdla import VdlaTarget
from vdla.compiler.targets.vdla.kernel import activation_regions
from vdla.compiler.targets.vdla.placement import plan_buffers, region_mover, relocate_to
from vdla.isa.relocate import relocate_encoded
from vdla.isa import EncodeError

from compiled_runs import run_bit_exact

CFG = vdla.HardwareConfig()
RNG = np.random.default_rng(11)


def conv(g: Graph, x: str, cin: int, cout: int, k: int = 1, name: str | None = None,
         groups: int = 1, relu: bool = True) -> str:
    w = g.add_constant(f"{name}_w", RNG.standard_normal((cout, cin // groups, k, k)) * 0.3)
    b = g.add_constant(f"{name}_b", RNG.standard_normal(cout) * 0.1)
    return g.add_node("conv2d", [x, w, b], name=name, pads=(k // 2,) * 4, groups=groups,
                      activation="relu" if relu else None)


def bn(g: Graph, x: str, c: int, name: str) -> str:
    params = [g.add_constant(f"{name}_scale", RNG.random(c) + 0.5),
              g.add_constant(f"{name}_bias", RNG.standard_normal(c) * 0.2),
              g.add_constant(f"{name}_mean", RNG.standard_normal(c) * 0.1),
              g.add_constant(f"{name}_var", RNG.random(c) + 0.5)]
    return g.add_node("batch_norm", [x] + params, name=name)


def dense_block(parts=(24, 40), grow: int = 12, grouped_reader: bool = False,
                batch: int = 1) -> Graph:
    """stem convs of `parts` channels -> concat (block-unaligned parts) -> batch norm
    (cannot fold after a concat: a depthwise 1x1 conv) -> ReLU -> max pool -> conv ->
    concat of the first concat and that conv (a concat as a concat's part) -> global
    average pool -> flatten -> dense. With `grouped_reader`, a grouped conv (groups 2)
    also reads the first concat."""
    g = Graph("dense_block")
    x = g.add_input("x", (batch, 8, 8, 8))
    stems = [conv(g, x, 8, c, 3, name=f"stem{i}") for i, c in enumerate(parts)]
    cat = g.add_node("concat", stems, name="cat1", axis=1)
    width = sum(parts)
    y = g.add_node("relu", [bn(g, cat, width, "bn1")], name="relu1")
    y = g.add_node("max_pool2d", [y], name="pool1", kernel=(3, 3), pads=(1, 1, 1, 1))
    y = conv(g, y, width, grow, 3, name="grow")
    cat2 = g.add_node("concat", [cat, y], name="cat2", axis=1)
    outs = [cat2]
    if grouped_reader:
        outs.append(conv(g, cat, width, 8, 1, name="grouped", groups=2))
    heads = []
    for i, t in enumerate(outs):
        c = g.tensors[t].shape[1]
        f = g.add_node("flatten", [g.add_node("global_avg_pool2d", [t], name=f"gap{i}")],
                       name=f"flatten{i}")
        w = g.add_constant(f"fc{i}_w", RNG.standard_normal((10, c)) * 0.2)
        heads.append(g.add_node("dense", [f, w, g.add_constant(f"fc{i}_b", np.zeros(10))],
                                name=f"fc{i}"))
    g.set_outputs(heads)
    return g.validate()


def quantized(graph: Graph, config=CFG) -> Graph:
    graph = passes.prepare(graph)
    samples = RNG.standard_normal((4,) + graph.tensors["x"].shape).astype(np.float32)
    mode = "multiply" if vdla.AluOp.MUL in config.alu_ops else "shift"
    return quantize(graph, {"x": samples}, mode)


def run(graph: Graph, config=CFG, backend: str = "functional"):
    feed = {"x": RNG.standard_normal(graph.tensors["x"].shape).astype(np.float32)}
    return run_bit_exact(graph, VdlaTarget(config, backend=backend), feed)


@pytest.mark.parametrize("parts", [(24, 40), (16, 32), (20, 12, 36), (3, 5)])
def test_concat_of_unaligned_parts_is_a_view(parts):
    """Every op on vdla but the edges' quantize/dequantize; bit-exact; the host wrote
    the input and read the logits only."""
    q = quantized(dense_block(parts))
    compiled, result = run(q)
    host = {op.op for op in compiled.ops_on("host")}
    assert host == {"quantize", "dequantize"}, compiled.partition.targets
    assert {op.op for op in compiled.ops_on("vdla")} >= {"concat", "flatten", "qconv2d",
                                                         "max_pool2d", "qdense"}
    moved = result.host_time()
    assert moved["between_transfers"] == 0
    assert {t.direction for t in result.transfers} == {"to_target", "to_host"}
    assert len(result.transfers) == 1 + len(q.outputs)
    plan = compiled.ops_on("vdla")[0].kernel.plan
    # The second concat's first part (the first concat, or its rescaled copy: the
    # quantizer's qadd) lies at the start of its buffer, with the first's channel map.
    cat1, cat2 = (q.node(n).outputs[0] for n in ("cat1", "cat2"))
    first = plan.placements[q.node("cat2").inputs[0]]
    assert (first.buffer, first.offset) == (cat2, 0)
    np.testing.assert_array_equal(first.positions(), plan.placements[cat1].positions())
    aligned = all(c % CFG.block_in == 0 for c in parts[:-1])
    assert plan.placements[cat1].identity == aligned
    if not aligned:   # each part starts at a block boundary: pad channels in between
        physical = sum(-(-c // 16) * 16 for c in parts)
        assert plan.placements[cat1].physical == physical > sum(parts)


@pytest.mark.parametrize("batch, config", [
    (3, CFG), (2, vdla.HardwareConfig(batch=2)), (3, vdla.HardwareConfig(batch=2))])
def test_batches_place_a_slice_per_batch_block(batch, config):
    """More than one batch block: each part of a concat is one run of elements per batch
    block of the buffer (and the host writes and reads it so)."""
    q = quantized(dense_block((24, 40), batch=batch), config)
    compiled, result = run(q, config)
    assert {op.op for op in compiled.ops_on("host")} == {"quantize", "dequantize"}
    assert result.host_time()["between_transfers"] == 0
    plan = compiled.ops_on("vdla")[0].kernel.plan
    cat2 = q.node("cat2").outputs[0]
    assert plan.buffers[cat2].batch_blocks == -(-batch // config.batch)


@pytest.mark.slow
def test_concat_views_on_verilator():
    q = quantized(dense_block((24, 40)))
    compiled, result = run(q, backend="verilator")
    assert result.host_time()["between_transfers"] == 0
    assert all(s.cycles == 0 for s in result.ops if s.op in ("concat", "flatten"))
    assert all(s.cycles > 0 for s in result.ops if s.target == "vdla"
               and s.op not in ("concat", "flatten"))


def test_verilator_runs_one_unaligned_concat():
    """Both backends run the views bit-exactly (a small block: a few seconds)."""
    q = quantized(dense_block((24, 8)))
    compiled, result = run(q, backend="verilator")
    assert {op.op for op in compiled.ops_on("host")} == {"quantize", "dequantize"}
    assert result.cycles > 0 and result.host_time()["between_bytes"] == 0


def test_a_grouped_reader_keeps_an_unaligned_concat_on_the_host():
    """A grouped convolution cannot follow a channel map: that concat runs on the host
    (its reason names the reader), the rest still on vdla, still bit-exact."""
    q = quantized(dense_block((24, 40), grouped_reader=True))
    compiled, result = run(q)
    reason = compiled.partition.reason("cat1")
    assert compiled.partition.target_of("cat1") == "host"
    assert "'grouped'" in reason and "channel map" in reason
    # The host produced cat1: it is written to vdla once for each reader there... once.
    written = [t for t in result.transfers if t.direction == "to_target"]
    assert len({t.tensor for t in written}) == len(written)


def int8_conv(g: Graph, x: str, cin: int, cout: int, name: str) -> str:
    w = g.add_constant(f"{name}_w", RNG.integers(-64, 64, (cout, cin, 1, 1)), "int8")
    return g.add_node("qconv2d", [x, w], name=name, shift=(8,))


def test_a_part_of_two_concats_that_are_not_prefixes():
    """A tensor has one place in DRAM: of two concats that need one tensor at different
    places, the later is planned first and the other runs on the host, saying why;
    bit-exact either way."""
    g = Graph("two")
    q = g.add_node("quantize", [g.add_input("x", (1, 8, 8, 8))], scale=0.05)
    a, b, c = (int8_conv(g, q, 8, 16, n) for n in "abc")
    ab = g.add_node("concat", [a, b], name="ab", axis=1)
    ca = g.add_node("concat", [c, a], name="ca", axis=1)
    g.set_outputs([g.add_node("dequantize", [int8_conv(g, y, 32, 16, f"r{i}")], scale=0.1)
                   for i, y in enumerate((ab, ca))])
    compiled, result = run(g.validate())
    assert compiled.partition.target_of("ca") == "vdla"
    assert compiled.partition.target_of("ab") == "host"
    assert f"{a!r} is placed in another concat's buffer" in compiled.partition.reason("ab")
    # The host's concat reads a, b from DRAM and writes its output for r0.
    assert {(t.tensor, t.direction) for t in result.transfers} >= {
        (a, "to_host"), (b, "to_host"), (ab, "to_target")}


#: block_out = 4 x block_in: activations in blocks of 32 channels, four inp elements a pixel.
WIDE_OUT = vdla.HardwareConfig(block_in=8, block_out=32)
#: block_in = 4 x block_out: activations in blocks of 32 channels, four out elements a pixel.
WIDE_IN = vdla.HardwareConfig(block_in=32, block_out=8, acc_buff_size=32768)


@pytest.mark.parametrize("config", [WIDE_OUT, WIDE_IN], ids=["1x8x32", "1x32x8"])
@pytest.mark.parametrize("parts", [(24, 40), (3, 5), (32, 64)])
def test_blocks_that_differ_keep_activations_in_dram(parts, config):
    """block_out = 4 x block_in (1x8x32) or the reverse (1x32x8): every activation in
    blocks of L = 32 channels (`activation_block`), concat parts at 32-channel
    boundaries, flatten and the dense layer reading it; bit-exact, nothing moved between
    two vdla ops."""
    q = quantized(dense_block(parts), config)
    compiled, result = run(q, config)
    assert {op.op for op in compiled.ops_on("host")} == {"quantize", "dequantize"}
    assert {op.op for op in compiled.ops_on("vdla")} >= {"concat", "flatten", "qconv2d",
                                                         "max_pool2d", "qdense"}
    assert result.host_time()["between_transfers"] == 0
    plan = compiled.ops_on("vdla")[0].kernel.plan
    cat1 = plan.placements[q.node("cat1").outputs[0]]
    assert cat1.physical == sum(-(-c // 32) * 32 for c in parts)
    assert all(b.elem_bytes == 32 for b in plan.buffers.values())


@pytest.mark.slow
@pytest.mark.parametrize("config", [WIDE_OUT, WIDE_IN], ids=["1x8x32", "1x32x8"])
def test_verilator_keeps_activations_in_dram_with_blocks_that_differ(config):
    """The same on Verilator, one small block (a few seconds once the model is built, but
    each config is a model of its own to build: with the slow tests; the functional
    tests above cover the programs, the hardware tests the block shapes)."""
    q = quantized(dense_block((24, 8)), config)
    compiled, result = run(q, config, backend="verilator")
    assert {op.op for op in compiled.ops_on("host")} == {"quantize", "dequantize"}
    assert result.cycles > 0 and result.host_time()["between_bytes"] == 0


def test_configs_with_no_shared_layout_repack_on_the_host_and_say_so():
    """batch 2 with blocks that differ: an inp element (2 x 16) is no slice of an out
    element (2 x 32), so activations do not stay in DRAM; each op's arena is packed."""
    config = vdla.HardwareConfig(batch=2, block_out=32)
    q = quantized(dense_block((16, 32), batch=2), config)
    compiled, result = run(q, config)
    assert compiled.partition.target_of("cat1") == "host"
    assert "block_in 16 != block_out 32" in compiled.partition.reason("cat1")
    host = result.host_time()
    # Every activation between two vdla ops went through the host.
    assert host["between_transfers"] > 0 and host["between_bytes"] > 0
    assert all(t.tensor in q.tensors for t in result.transfers)


def test_plan_refuses_a_config_with_no_shared_layout():
    config = vdla.HardwareConfig(batch=2, block_out=32)
    with pytest.raises(ValueError, match="batch 2 with block_in 16 != block_out 32"):
        plan_buffers(Graph("g"), [], config, {})


def test_bad_values_get_clear_errors():
    q = quantized(dense_block((24, 40)))
    target = VdlaTarget(CFG, backend="functional")
    with pytest.raises(TypeError, match="'cat1' is a view: it takes no schedule"):
        target.compile_op(q.node("cat1"), q, schedule={"tile_h": 1})
    compiled = compile_model(q, target)
    cat = q.node("cat1").outputs[0]
    with compiled.session() as session:
        vdla_session = session._sessions["vdla"]
        assert vdla_session.holds(cat) and not vdla_session.holds("nothing")
        with pytest.raises(ValueError, match=rf"tensor {cat!r} must be int8 of shape "
                                             r"\(1, 64, 8, 8\), not float32 \(1, 64, 8, 8\)"):
            vdla_session.put(cat, np.zeros((1, 64, 8, 8), np.float32))
        with pytest.raises(ValueError, match=r"not int8 \(1, 60, 8, 8\)"):
            vdla_session.put(cat, np.zeros((1, 60, 8, 8), np.int8))
        x = RNG.integers(-128, 128, (1, 64, 8, 8)).astype(np.int8)
        vdla_session.put(cat, x)          # the pad channels between the parts are skipped
        np.testing.assert_array_equal(vdla_session.fetch(cat), x)
        node = q.node("bn1")
        op = next(o for o in compiled.ops if o.name == "bn1")
        with pytest.raises(ValueError, match="lives in this session's DRAM; pass it as its "
                                             "DeviceValue"):
            vdla_session.run(op, node, [x] + [None] * (len(node.inputs) - 1))
    with pytest.raises(ValueError, match="session is closed"):
        vdla_session.fetch(cat)


@pytest.mark.parametrize("batch, config", [(1, CFG), (3, vdla.HardwareConfig(batch=2)),
                                           (2, vdla.HardwareConfig(batch=2, block_out=32))],
                         ids=["plan", "plan-batch-blocks", "arenas"])
def test_encoded_relocation_is_the_instructions_relocation(batch, config):
    """A session relocates each op's compiled words (`relocate_encoded`, no instruction
    rebuilt): byte for byte what relocating the instructions and encoding them gives,
    into the buffer plan's placements and into an arena alone (a config without a plan),
    at an arena address that moves every access."""
    q = quantized(dense_block((24, 40), batch=batch), config)
    compiled = compile_model(q, VdlaTarget(config, backend="functional"))
    arena, checked = 0x10_0000, 0
    for op in compiled.ops_on("vdla"):
        kernel, node = op.kernel, q.node(op.name)
        lowered = kernel.lowered
        if lowered is None:
            continue
        assert kernel.encoded == lowered.program.to_bytes()
        move, moved = None, {}
        if kernel.plan is not None:
            for region, tensor in activation_regions(lowered, node).items():
                p = kernel.plan.placements[tensor]
                moved[region] = (0x40_0000 + 0x1_0000 * len(moved), p,
                                 kernel.plan.buffers[p.buffer])
            move = region_mover(lowered.regions, moved)
            want = relocate_to(lowered.program, config, lowered.regions, arena, moved)
        else:
            want = lowered.relocate(arena)
        got = relocate_encoded(lowered.program, kernel.encoded, arena, config, move)
        assert got == want.to_bytes(), op.name
        assert got != kernel.encoded
        checked += 1
    assert checked >= 4
    op = next(op for op in compiled.ops_on("vdla") if op.kernel.lowered is not None)
    lowered = op.kernel.lowered
    with pytest.raises(EncodeError, match=r"dram_base=\d+ does not fit its 32-bit field"):
        relocate_encoded(lowered.program, op.kernel.encoded, 1 << 40, config)
    with pytest.raises(ValueError, match="the encoded program has 16 bytes"):
        relocate_encoded(lowered.program, op.kernel.encoded[:16], arena, config)
