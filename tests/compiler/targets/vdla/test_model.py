"""The vdla target, whole models: `compile_model` + `ModelSession.run` on the functional
and Verilator backends match the integer reference (`run_reference` on the quantized graph)
bit-exactly; nodes the back half cannot lower fall back to the host with their reason;
the digits CNN keeps its quantized accuracy; per-op stats and feed errors."""

from __future__ import annotations

import time

import numpy as np
import pytest

import vdla
from vdla.compiler import passes, quantize, run_reference, zoo
from vdla.compiler.passes.partition import partition
from vdla.compiler.targets import CompiledModel, RunResult, compile_model
from vdla.compiler.targets.vdla import (Conv2dSchedule, Pool2dSchedule, VdlaTarget,
                                        lower_conv2d)
from vdla.compiler.frontend.builder import GraphBuilder
from vdla.compiler.frontend.datasets import digits_split
from vdla.compiler.passes import pack_graph

CFG = vdla.HardwareConfig()
TARGET = VdlaTarget(CFG)


def open_device(backend: str):
    return vdla.runtime.open(CFG, backend=backend, **(
        {"log": lambda message: None} if backend == "verilator" else {}))


def quantized_zoo(name: str, seed: int = 0, calibration: int = 4):
    """(quantized graph, rng) of zoo model `name`, calibrated on seeded normal inputs."""
    graph = passes.prepare(zoo.get(name))
    shape = graph.tensors["input"].shape
    rng = np.random.default_rng(seed)
    samples = rng.standard_normal((calibration,) + shape).astype(np.float32)
    return quantize(graph, {"input": samples}, "shift"), rng


def assert_bit_exact(quantized, result: RunResult, feed):
    want = run_reference(quantized, feed)
    assert list(result.outputs) == quantized.outputs
    for name, value in want.items():
        assert result.outputs[name].dtype == value.dtype
        np.testing.assert_array_equal(result.outputs[name], value)


@pytest.fixture(scope="module")
def digits():
    return digits_split()


@pytest.fixture(scope="module")
def digits_quantized(digits):
    """The trained digits CNN quantized as its accuracy test does: calibrated on the first
    64 training images, one sample each (calibration never sees the test split)."""
    return quantize(passes.prepare(zoo.get("digits_cnn")), {"input": digits[0][:64, None]}, "shift")


@pytest.fixture(scope="module")
def digits_compiled(digits_quantized):
    return compile_model(digits_quantized, TARGET)


# --- bit-exact models ---------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["functional", "verilator"])
def test_digits_bit_exact_and_its_stats(digits, digits_quantized, digits_compiled, backend):
    compiled = digits_compiled
    assert [op.target for op in compiled.ops] == [
        "host", "vdla", "vdla", "vdla", "vdla", "vdla", "vdla", "host"]
    assert [op.op for op in compiled.ops_on("vdla")] == (["qconv2d"] * 2 + ["max_pool2d", "qconv2d"]
                                                   + ["flatten", "qdense"])
    with open_device(backend) as dev, compiled.session(dev) as session:
        for image in digits[2][:4]:   # one session, several runs: static data written once
            feed = {"input": image[None]}
            result = session.run(feed)
            assert_bit_exact(digits_quantized, result, feed)
    ops = {s.name: s for s in result.ops}
    assert [s.name for s in result.ops] == [op.name for op in compiled.ops]
    for s, op in zip(result.ops, compiled.ops):
        assert (s.op, s.target, s.reason) == (op.op, op.target, op.reason)
        assert s.wall_seconds >= 0
        if s.target == "host":
            assert s.schedule is s.cycles is s.bytes is s.macs is None and s.extra == {}
            continue
        assert s.schedule == op.schedule
        if s.op == "flatten":   # a view of its input's DRAM buffer: no program
            assert s.schedule is None and (s.cycles, s.macs, s.bytes) == (0, 0, 0)
            assert s.extra == {"gemm_utilization": None, "view": True} and "view" in s.reason
            continue
        if s.op == "max_pool2d":   # pooling does no useful MACs: no GEMM utilization
            assert set(s.schedule) == {"tile_h", "tile_w", "tile_c"}
            assert s.macs == 0 and s.extra["gemm_utilization"] is None
            assert "ALU MAX" in s.reason and s.bytes > 0
            continue
        assert set(s.schedule) == {
            "tile_h", "tile_w", "tile_ci", "tile_co", "oc_nthread", "h_nthread"}
        assert s.macs == op.kernel.useful_macs > 0
        # The accelerator reads at least its weights and writes at least its output.
        assert s.bytes >= (op.kernel.lowered.regions["weights"].nbytes
                                + op.kernel.lowered.regions["output"].nbytes)
        if backend == "functional":
            assert s.cycles is None and s.extra["gemm_utilization"] is None
        else:
            assert isinstance(s.cycles, int) and s.cycles > 0
            assert 0 < s.extra["gemm_utilization"] <= 1
            assert s.extra["gemm_utilization"] == pytest.approx(
                s.macs / (s.cycles * CFG.macs_per_cycle))
    assert ops["input_quantize"].reason == "float -> int conversion runs on the host"
    summary = result.summary["vdla"]
    assert summary["backend"] == backend and set(result.summary) == {"vdla", "host"}
    if backend == "functional":
        assert result.cycles is summary["cycles"] is summary["seconds_at_clock"] is None
    else:
        assert result.cycles == summary["cycles"] == sum(s.cycles for s in result.ops if s.cycles)
        assert summary["seconds_at_clock"] == pytest.approx(result.cycles / (CFG.clock_mhz * 1e6))
    # The host wrote the quantized image and read the logits: nothing in between.
    assert [(t.tensor, t.direction, t.between) for t in result.transfers] == [
        (compiled.graph.node("input_quantize").outputs[0], "to_target", False),
        (compiled.graph.node("logits_dequantize").inputs[0], "to_host", False)]
    assert result.wall_seconds >= sum(s.wall_seconds for s in result.ops)


def test_small_cnn_bit_exact_on_functional():
    quantized, rng = quantized_zoo("small_cnn")
    compiled = compile_model(quantized, TARGET)
    assert [op.op for op in compiled.ops_on("vdla")] == [
        "qconv2d", "max_pool2d", "qconv2d", "max_pool2d", "qconv2d", "qavg_pool2d", "flatten",
        "qdense"]
    feed = {"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}
    with open_device("functional") as dev, compiled.session(dev) as session:
        assert_bit_exact(quantized, session.run(feed), feed)


def test_resnet18_bit_exact_on_functional():
    """The whole ResNet-18 (20 convolutions, 8 with a residual, the max pool, the global
    average pool and the classifier) on the accelerator; a few seconds on the functional
    backend. (Its global average pool divides by 49: shift-only quantization gives it a
    7-bit multiplier, which its identity weights carry.)"""
    quantized, rng = quantized_zoo("resnet18", calibration=2)
    start = time.perf_counter()
    compiled = compile_model(quantized, TARGET)
    compile_seconds = time.perf_counter() - start
    lowered = [n.name for n in quantized.nodes()
               if n.op in ("qconv2d", "qdense", "max_pool2d", "qglobal_avg_pool2d")]
    gemm = [n for n in lowered if quantized.node(n).op in ("qconv2d", "qdense")]
    lowered = [n.name for n in quantized.nodes() if n.name in lowered or n.op == "flatten"]
    assert len(gemm) == 21 and [op.name for op in compiled.ops_on("vdla")] == lowered
    assert {op.op for op in compiled.ops_on("host")} == {"quantize", "dequantize"}
    assert sum(bool(quantized.node(n).input(3)) for n in gemm) == 8   # residual adds
    assert compiled.compile_seconds <= compile_seconds
    feed = {"input": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}
    with open_device("functional") as dev, compiled.session(dev) as session:
        result = session.run(feed)
    assert_bit_exact(quantized, result, feed)
    # Activations stay in DRAM from op to op: the host moves the input and the logits.
    host = result.host_time()
    assert host["transfers"] == 2 and host["between_transfers"] == host["between_bytes"] == 0
    print(f"resnet18 functional: compile {compile_seconds:.2f} s, run {result.wall_seconds:.2f} s")


def test_resnet18_bit_exact_on_verilator():
    """The whole ResNet-18 on the cycle-accurate backend (about 11 M cycles, 10-15 s)."""
    quantized, rng = quantized_zoo("resnet18", seed=1, calibration=2)
    compiled = compile_model(quantized, TARGET)
    feed = {"input": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}
    with open_device("verilator") as dev, compiled.session(dev) as session:
        result = session.run(feed)
    assert_bit_exact(quantized, result, feed)
    convs = [s for s in result.ops if s.op == "qconv2d"]
    assert all(s.target == "vdla" and 0 < s.extra["gemm_utilization"] <= 1 for s in convs)
    # The 3x3 layers without a residual run at >= 80% GEMM utilization.
    plain_3x3 = [s for s in convs if quantized.tensors[quantized.node(s.name).inputs[1]]
                 .shape[2:] == (3, 3) and not quantized.node(s.name).input(3)]
    assert len(plain_3x3) >= 8 and min(s.extra["gemm_utilization"] for s in plain_3x3) >= 0.8


@pytest.mark.parametrize("backend", [
    "functional", pytest.param("verilator", marks=pytest.mark.slow)])
def test_resnet50_bit_exact(backend):
    """ResNet-50 (53 convolutions: 1x1 bottlenecks, 16 residual adds). The functional run
    covers the lowering of every layer; the Verilator run (28 M cycles, about 30 s) is
    marked slow."""
    quantized, rng = quantized_zoo("resnet50", calibration=1)
    compiled = compile_model(quantized, TARGET)
    # 53 convolutions, both pools, the flatten (a view), the classifier
    assert len(compiled.ops_on("vdla")) == 57
    feed = {"input": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}
    with open_device(backend) as dev, compiled.session(dev) as session:
        assert_bit_exact(quantized, session.run(feed), feed)


def test_digits_accuracy_on_the_whole_test_split(digits, digits_quantized, digits_compiled):
    """Every one of the 450 test images on the accelerator: the predictions are the
    quantized reference's, image by image, and within 1.5 points of the float model."""
    _, _, x_test, y_test = digits
    batched = zoo.get("digits_cnn", batch=len(x_test))
    (float_logits,) = run_reference(batched, {"input": x_test}).values()
    float_acc = float((float_logits.argmax(axis=1) == y_test).mean())
    vdla_pred, ref_pred = [], []
    with open_device("functional") as dev, digits_compiled.session(dev) as session:
        for image in x_test:
            feed = {"input": image[None]}
            (got,) = session.run(feed).outputs.values()
            (want,) = run_reference(digits_quantized, feed).values()
            np.testing.assert_array_equal(got, want)
            vdla_pred.append(int(got.argmax()))
            ref_pred.append(int(want.argmax()))
    vdla_acc = float((np.array(vdla_pred) == y_test).mean())
    ref_acc = float((np.array(ref_pred) == y_test).mean())
    print(f"digits: float {float_acc:.2%}, quantized reference {ref_acc:.2%}, "
          f"vdla {vdla_acc:.2%}")
    assert vdla_acc == ref_acc
    assert float_acc >= 0.95 and vdla_acc >= float_acc - 0.015


@pytest.mark.parametrize("model", ["digits_cnn", "small_cnn", "resnet18", "mobilenet_v1"])
def test_partition_plans_what_compile_model_does(model):
    """`partition` with the target's `supports` is the one decision: `compile_model`
    places every node where the partition does, with its reason."""
    quantized, _ = quantized_zoo(model, calibration=1)
    compiled = compile_model(quantized, TARGET)
    plan = partition(quantized, TARGET).targets
    assert {op.name: op.target for op in compiled.ops} == {n: t for n, (t, _) in plan.items()}
    for op in compiled.ops_on("host"):
        assert op.reason == plan[op.name][1]


# --- host fallback ---------------------------------------------------------------------------

def mixed_model():
    """A quantized CNN whose 3rd conv has pads >= kernel (beyond the back half), between
    convs it does lower (the 2nd one grouped); returns (quantized graph, feed)."""
    b = GraphBuilder("mixed", seed=3)
    x = b.input("input", (1, 8, 10, 10))
    y = b.relu(b.conv(x, 16, 3, padding=1, bias=True, name="conv_a"))
    y = b.relu(b.conv(y, 16, 3, padding=1, groups=4, bias=True, name="grouped"))
    y = b.relu(b.conv(y, 20, 1, padding=1, bias=True, name="pad_ge_kernel"))
    y = b.relu(b.conv(y, 24, 3, stride=2, padding=1, bias=True, name="conv_b"))
    logits = b.dense(b.flatten(b.global_avg_pool(y)), 10, name="logits")
    graph = passes.prepare(b.build([logits]))
    rng = np.random.default_rng(5)
    samples = rng.standard_normal((4, 1, 8, 10, 10)).astype(np.float32)
    feed = {"input": rng.standard_normal((1, 8, 10, 10)).astype(np.float32)}
    return quantize(graph, {"input": samples}, "shift"), feed


def test_nodes_the_back_half_cannot_lower_run_on_the_host():
    quantized, feed = mixed_model()
    compiled = compile_model(quantized, TARGET)
    ops = {op.name: op for op in compiled.ops}
    assert ops["pad_ge_kernel"].target == "host"
    assert "must be smaller than the kernel" in ops["pad_ge_kernel"].reason
    assert ops["pad_ge_kernel"].kernel is not None and ops["pad_ge_kernel"].schedule is None
    assert {ops[n].target for n in ("conv_a", "grouped", "conv_b", "logits")} == {"vdla"}
    assert "groups=4, per-group GEMMs" in ops["grouped"].reason
    # A 6x6 global pool (count 36) is int8 in shift mode too, with a 7-bit multiplier.
    assert ops["gap"].op == "qglobal_avg_pool2d"
    assert 1 <= quantized.node("gap").attrs["multiplier"] <= 127
    with open_device("functional") as dev, compiled.session(dev) as session:
        result = session.run(feed)
    assert_bit_exact(quantized, result, feed)
    stats = {s.name: s for s in result.ops}
    assert stats["pad_ge_kernel"].target == "host" and stats["pad_ge_kernel"].bytes is None
    assert stats["conv_b"].bytes > 0


def test_schedules_are_used_and_one_that_does_not_fit_is_refused():
    quantized, feed = mixed_model()
    small = Conv2dSchedule(tile_h=3, tile_w=4, tile_ci=1, tile_co=1, oc_nthread=2)
    huge = Conv2dSchedule(tile_h=64, tile_w=64, tile_ci=1, tile_co=1)
    tiny = vdla.HardwareConfig(acc_buff_size=4096)   # acc: 64 entries
    with pytest.raises(ValueError, match="does not fit"):
        lower_conv2d(quantized.node("conv_a"), quantized, tiny, huge)
    compiled = compile_model(quantized, TARGET, schedules={"conv_b": small})
    assert compiled.ops[[op.name for op in compiled.ops].index("conv_b")].schedule == {
        "tile_h": 3, "tile_w": 4, "tile_ci": 1, "tile_co": 1, "oc_nthread": 2, "h_nthread": 1}
    with open_device("functional") as dev, compiled.session(dev) as session:
        assert_bit_exact(quantized, session.run(feed), feed)
    # A schedule is the user's (or the records') choice: one that does not fit is an
    # error, not a silent move to the host (the partition decided what runs where).
    with pytest.raises(ValueError, match="does not fit config"):
        compile_model(quantized, VdlaTarget(tiny), schedules={"conv_a": huge})
    tiny_compiled = compile_model(quantized, VdlaTarget(tiny))
    assert next(op for op in tiny_compiled.ops if op.name == "conv_a").target == "vdla"
    with vdla.runtime.open(tiny) as dev, tiny_compiled.session(dev) as session:
        assert_bit_exact(quantized, session.run(feed), feed)


def test_progress_reports_every_op(digits_quantized, digits_compiled, digits):
    seen = []
    compiled = compile_model(digits_quantized, TARGET, progress=lambda *a: seen.append(a))
    names = [n.name for n in digits_quantized.nodes()]
    # Compiling reports every node once, counting up (the target's nodes, then the
    # host's); running reports them in execution order.
    assert [(i, total) for i, total, _ in seen] == [(i, len(names)) for i in range(len(names))]
    assert sorted(n for _, _, n in seen) == sorted(names)
    seen.clear()
    with open_device("functional") as dev, compiled.session(dev) as session:
        session.run({"input": digits[2][:1]}, progress=lambda *a: seen.append(a))
    assert seen == [(i, len(names), n) for i, n in enumerate(names)]


# --- sessions and errors ---------------------------------------------------------------------

def test_session_frees_its_dram_and_refuses_to_run_closed(digits_compiled, digits):
    with open_device("functional") as dev:
        before = dev.allocator.bytes_in_use
        session = digits_compiled.session(dev)
        vdla_ops = digits_compiled.ops_on("vdla")
        arenas = sum(op.kernel.lowered.arena_bytes for op in vdla_ops if op.kernel.lowered)
        buffers = vdla_ops[0].kernel.plan.nbytes    # the activations' DRAM buffers
        assert dev.allocator.bytes_in_use >= before + arenas + buffers
        session.close()
        assert dev.allocator.bytes_in_use == before
        session.close()   # idempotent
        with pytest.raises(ValueError, match="session is closed"):
            session.run({"input": digits[2][:1]})


def test_bad_feeds(digits_compiled):
    with open_device("functional") as dev, digits_compiled.session(dev) as session:
        with pytest.raises(ValueError, match=r"missing input\(s\) \['input'\].*\(1, 1, 8, 8\)"):
            session.run({})
        with pytest.raises(ValueError, match=r"unknown input\(s\) \['x'\]"):
            session.run({"input": np.zeros((1, 1, 8, 8), np.float32), "x": 1})
        with pytest.raises(ValueError, match=r"'input' has shape \(1, 8, 8\); the graph "
                                             r"expects \(1, 1, 8, 8\)"):
            session.run({"input": np.zeros((1, 8, 8), np.float32)})
        with pytest.raises(ValueError, match="dtype <U1; expected a number"):
            session.run({"input": np.full((1, 1, 8, 8), "a")})
        with pytest.raises(TypeError, match="feed must be a dict"):
            session.run([np.zeros((1, 1, 8, 8), np.float32)])


def test_schedule_of_the_wrong_kind_is_refused(digits_quantized):
    pool = next(n.name for n in digits_quantized.nodes() if n.op == "max_pool2d")
    conv = next(n.name for n in digits_quantized.nodes() if n.op == "qconv2d")
    with pytest.raises(TypeError, match=r"\(max_pool2d\) must be a Pool2dSchedule, not "
                                        "Conv2dSchedule"):
        compile_model(digits_quantized, TARGET, schedules={pool: Conv2dSchedule(1, 1, 1, 1)})
    with pytest.raises(TypeError, match=r"\(qconv2d\) must be a Conv2dSchedule, not "
                                        "Pool2dSchedule"):
        compile_model(digits_quantized, TARGET, schedules={conv: Pool2dSchedule(1, 1, 1)})


def test_bad_arguments(digits_quantized, digits_compiled):
    with pytest.raises(ValueError, match=r"schedules name \['nope'\]"):
        compile_model(digits_quantized, TARGET, schedules={"nope": Conv2dSchedule(1, 1, 1, 1)})
    conv = "/features/features.0/Conv"
    with pytest.raises(TypeError, match="must be a Conv2dSchedule, not dict"):
        compile_model(digits_quantized, TARGET, schedules={conv: {"tile_h": 1}})
    with pytest.raises(TypeError, match="target must be a vdla.compiler.targets.Target"):
        compile_model(digits_quantized, CFG)
    with pytest.raises(ValueError, match="plain layouts.*pack_graph"):
        compile_model(pack_graph(digits_quantized, batch=1, block_in=16, block_out=16), TARGET)
    other = vdla.HardwareConfig(acc_buff_size=4096)
    with vdla.runtime.open(other) as dev:
        with pytest.raises(ValueError, match=f"compiled for config {CFG.name}.*{other.name}"):
            digits_compiled.session(dev)
    assert isinstance(digits_compiled, CompiledModel)


def test_a_tiny_config_compiles_everything_it_supports():
    """`supports` is the one decision: on a config with 8 accumulator entries every node
    it accepts compiles (with the narrow tiles that fit), and the model is bit-exact."""
    tiny = VdlaTarget(vdla.HardwareConfig(acc_buff_size=512), backend="functional")
    quantized, rng = quantized_zoo("small_cnn", calibration=2)
    compiled = compile_model(quantized, tiny)
    convs = [op for op in compiled.ops if op.op == "qconv2d"]
    on_vdla = [op for op in convs if op.target == "vdla"]
    assert on_vdla and all(op.schedule["tile_h"] * op.schedule["tile_w"] <= 8
                           for op in on_vdla)
    # The rest do not fit even as 1x1x1x1 tiles (their constant rows fill the acc buffer).
    assert all("does not fit config" in op.reason for op in convs if op.target == "host")
    feed = {"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}
    with compiled.session() as session:
        assert_bit_exact(quantized, session.run(feed), feed)
