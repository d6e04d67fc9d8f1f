"""Partitioning hand-built quantized graphs between the accelerator and the host: what
`VdlaTarget.supports` accepts, and why it refuses the rest."""

from __future__ import annotations

import json

import numpy as np
import pytest

import vdla
from vdla.compiler import Graph
from vdla.compiler.passes.partition import HOST, partition
from vdla.compiler.targets.vdla import VdlaTarget

VDLA = "vdla"

NO_MUL = vdla.HardwareConfig()
WITH_MUL = vdla.HardwareConfig(alu_ops={"MIN", "MAX", "ADD", "SHR", "MUL"})


def int8(rng, *shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


def quantized_graph(multipliers: bool) -> Graph:
    """quantize -> qconv2d -> depthwise qconv2d -> qadd -> relu -> max_pool2d ->
    qavg_pool2d -> qglobal_avg_pool2d -> flatten -> qdense -> dequantize -> softmax,
    plus a layout_transform of the first conv's output. With `multipliers`, the
    requantizations use fixed-point multipliers (MUL), else shifts only."""
    rng = np.random.default_rng(3)
    m = (lambda v: v) if multipliers else (lambda v: None)
    g = Graph("q")
    x = g.add_input("x", (1, 16, 8, 8))
    q = g.add_node("quantize", [x], scale=0.05)
    w = g.add_constant("w", int8(rng, 16, 16, 3, 3), "int8")
    b = g.add_constant("b", rng.integers(-999, 999, 16), "int32")
    c1 = g.add_node("qconv2d", [q, w, b], name="conv", pads=(1, 1, 1, 1),
                    multiplier=m(tuple(range(100, 116))), shift=tuple(range(10, 26)))
    dw = g.add_node("qconv2d", [c1, g.add_constant("wdw", int8(rng, 16, 1, 3, 3), "int8")],
                    name="depthwise", groups=16, pads=(1, 1, 1, 1), shift=(8,))
    s = g.add_node("qadd", [c1, dw], a_multiplier=m(300), a_shift=9, b_shift=1)
    r = g.add_node("relu", [s])
    p = g.add_node("max_pool2d", [r], kernel=(2, 2), strides=(2, 2))
    a = g.add_node("qavg_pool2d", [p], kernel=(3, 3), pads=(1, 1, 1, 1),
                   multiplier=m(7282), shift=(16,))
    gp = g.add_node("qglobal_avg_pool2d", [a], shift=(4,))     # 16 elements: a pure shift
    f = g.add_node("flatten", [gp])
    d = g.add_node("qdense", [f, g.add_constant("wd", int8(rng, 10, 16), "int8")], shift=(7,))
    y = g.add_node("softmax", [g.add_node("dequantize", [d], scale=0.1)])
    lt = g.add_node("layout_transform", [c1], name="pack", src="NCHW", dst="NCHW1n16c")
    g.set_outputs([y, lt])
    return g.validate()


def test_shift_only_graph_without_mul():
    g = quantized_graph(multipliers=False)
    attrs_before = {n.name: dict(n.attrs) for n in g.nodes()}
    part = partition(g, VdlaTarget(NO_MUL))
    t = {n: target for n, (target, _) in part.targets.items()}
    assert t == {"quantize": HOST, "conv": VDLA, "depthwise": VDLA, "qadd": VDLA,
                 "relu": VDLA, "max_pool2d": VDLA, "qavg_pool2d": VDLA,
                 "qglobal_avg_pool2d": VDLA, "flatten": VDLA, "qdense": VDLA,
                 "dequantize": HOST, "softmax": HOST, "pack": HOST}
    assert "depthwise convolution (diagonal weight blocks)" in part.targets["depthwise"][1]
    assert "runtime" in part.targets["pack"][1]
    # An add or int8 ReLU that fusion left standalone runs on the vector ALU.
    assert "int8 add" in part.targets["qadd"][1]
    assert "int8 ReLU" in part.targets["relu"][1]
    assert part.summary() == {VDLA: 9, HOST: 4}
    # Node attributes are untouched; the assignment lives in the copy's metadata.
    assert {n.name: n.attrs for n in g.nodes()} == attrs_before
    assert {n.name: n.attrs for n in part.graph.nodes()} == attrs_before
    assert "partition" not in g.metadata
    assert part.graph.metadata["partition"]["conv"]["target"] == VDLA


@pytest.mark.parametrize("config, on_vdla", [(NO_MUL, False), (WITH_MUL, True)],
                         ids=["no_mul", "mul"])
def test_multipliers_need_mul(config, on_vdla):
    g = quantized_graph(multipliers=True)
    part = partition(g, VdlaTarget(config))
    for name in ("conv", "qavg_pool2d", "qadd"):
        target, reason = part.targets[name]
        assert target == (VDLA if on_vdla else HOST), (name, reason)
        if not on_vdla:
            assert "MUL" in reason and "multiplier" in reason
    # Shift-only nodes are on the accelerator either way; the rest stays on the host.
    for name in ("max_pool2d", "qglobal_avg_pool2d", "qdense", "relu", "depthwise"):
        assert part.target_of(name) == VDLA
    for name in ("quantize", "softmax", "pack"):
        assert part.target_of(name) == HOST


def test_shift_must_fit_the_alu_immediate():
    g = quantized_graph(multipliers=False)
    g.node("qdense").attrs["shift"] = (40000,)
    g.node("conv").attrs["shift"] = tuple([5] * 15 + [-40000])
    part = partition(g, VdlaTarget(WITH_MUL))
    for name in ("qdense", "conv"):
        target, reason = part.targets[name]
        assert target == HOST and "immediate [-32768, 32767]" in reason, reason
    assert "-40000..5" in part.targets["conv"][1]


def test_float_ops_go_to_host():
    g = Graph("f")
    x = g.add_input("x", (1, 3, 4, 4))
    y = g.add_node("conv2d", [x, g.add_constant("w", np.ones((4, 3, 1, 1), np.float32))])
    r = g.add_node("relu", [y])
    p = g.add_node("max_pool2d", [r], kernel=(2, 2))
    g.set_outputs([p])
    part = partition(g, VdlaTarget(NO_MUL))
    assert part.summary() == {VDLA: 0, HOST: 3}
    assert "float" in part.targets["conv2d"][1]
    assert "int8" in part.targets["max_pool2d"][1]


def test_pooling_runs_on_every_block_shape():
    g = Graph("p")
    x = g.add_input("x", (1, 32, 4, 4), "int8")
    g.set_outputs([g.add_node("max_pool2d", [x], kernel=(2, 2), strides=(2, 2))])
    assert partition(g, VdlaTarget(NO_MUL)).target_of("max_pool2d") == VDLA
    wide_in = VdlaTarget(vdla.HardwareConfig(block_in=32, block_out=16))
    assert partition(g, wide_in).target_of("max_pool2d") == VDLA


def test_partition_asks_any_target():
    """`partition` is the front half's one question to a target: any object with a name
    and `supports` answers it; a malformed answer is an error."""
    g = quantized_graph(multipliers=False)
    seen = []

    class OnlyDense:
        name = "dense_only"

        def supports(self, node, graph):
            seen.append((node.name, graph.tensors[node.outputs[0]].shape))
            return node.op == "qdense", f"custom: {node.op}"

    part = partition(g, OnlyDense())
    assert part.nodes_on("dense_only") == ["qdense"]
    assert part.targets["conv"] == (HOST, "custom: qconv2d")
    assert part.summary() == {"dense_only": 1, HOST: len(g.nodes()) - 1}
    assert len(seen) == len(g.nodes())

    class Broken(OnlyDense):
        def supports(self, node, graph):
            return True

    with pytest.raises(TypeError, match="must return"):
        partition(g, Broken())


def test_report_and_to_dict():
    g = quantized_graph(multipliers=True)
    part = partition(g, VdlaTarget(NO_MUL))
    text = part.report()
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["node", "op", "target", "reason"]
    assert len(lines) == 2 + len(g.nodes()) + 1
    depthwise = next(line for line in lines if line.startswith("depthwise"))
    assert "qconv2d" in depthwise and VDLA in depthwise and "diagonal" in depthwise
    softmax = next(line for line in lines if line.startswith("softmax"))
    assert HOST in softmax and "exp and division" in softmax
    assert lines[-1] == f"vdla: {part.summary()[VDLA]} nodes, host: {part.summary()[HOST]} nodes"
    d = json.loads(json.dumps(part.to_dict()))
    assert d["target"] == VDLA and d["graph"] == "q"
    assert [n["node"] for n in d["nodes"]] == [n.name for n in g.nodes()]
    assert d["summary"] == part.summary()
    with pytest.raises(KeyError, match="no node 'nope'"):
        part.target_of("nope")


def test_vdla_supports_directly():
    g = quantized_graph(multipliers=False)
    ok, reason = VdlaTarget(NO_MUL).supports(g.node("conv"), g)
    assert ok and "GEMM core" in reason and "bias" in reason


def test_bad_target_options_are_refused():
    with pytest.raises(TypeError, match="config must be a vdla.HardwareConfig, not dict"):
        VdlaTarget({"batch": 1})
    with pytest.raises(ValueError, match="unknown backend 'fpga'; available: functional, "
                                         "verilator"):
        VdlaTarget(NO_MUL, backend="fpga")
    assert VdlaTarget(WITH_MUL).requant_modes == ("multiply", "shift")
    assert VdlaTarget(NO_MUL).requant_modes == ("shift",)
