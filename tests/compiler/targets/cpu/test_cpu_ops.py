"""The CPU target's non-GEMM kernels (`vdla.compiler.targets.cpu.ops`) against the
reference, on one-node graphs, on every instruction set this machine runs (amx and
avx512vnni where the machine has them, avx2, portable): pools (odd sizes, kernels 1-3, strides,
pads, ceil mode, count_include_pad, windows wholly in the padding, batch 2), global
pools, qadd (both requantization modes, per-tensor and per-channel, shifts from -31 to
31, the quantizer's constant (1,) operand, broadcast operands), float add/mul with
broadcasting, relu, clip, quantize (ties, saturation, infinities), dequantize,
concat on every axis, flatten and reshape. int8 results, quantize, dequantize and the
float ops that round once (max pool, relu, clip, add, mul, the copies) must match byte
for byte; the float averages within 1e-6 of the largest output (NaN where the reference
has 0 / 0). Also ResNet's max pool timing, and what the module refuses, and why.

All cases of one ISA are built into one library (one compile, cached by content hash)."""

from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest

from vdla.compiler import Graph, run_reference
from vdla.compiler.ir.tensor import DTYPES
from vdla.compiler.targets.cpu import ops
from vdla.compiler.targets.cpu.build import machine_features
from vdla.compiler.targets.cpu.isa import get as get_isa
from vdla.compiler.targets.cpu.library import (aligned_empty, build_kernels, call, function,
                                               load)

from op_cases import CASES, S, one_node, qadd

THREADS = 2
ISAS = [pytest.param(name, marks=pytest.mark.skipif(
            not get_isa(name).runs_on(machine_features()),
            reason=f"{name} does not run here: {get_isa(name).refusal(machine_features())}"))
        for name in ("amx", "avx512vnni", "avx2", "portable")]


def test_concat_of_one_tensor_twice_reads_it_once():
    g = Graph("twice")
    x = g.add_input("x", (2, 3), "int8")
    g.set_outputs([g.add_node("concat", [x, x], name="op", axis=0)])
    assert ops.build(g.nodes()[0], g, get_isa("portable")).inputs == ("x",)


# --- running -----------------------------------------------------------------------------

_GRAPHS: dict[str, tuple[Graph, dict, dict]] = {}


def graph_of(name: str) -> tuple[Graph, dict, np.ndarray]:
    """The case's graph, feed and reference output (made once)."""
    if name not in _GRAPHS:
        g, feed = CASES[name]()
        with np.errstate(invalid="ignore"):      # 0 / 0: an average over padding only
            _GRAPHS[name] = (g, feed, run_reference(g, feed)[g.outputs[0]])
    return _GRAPHS[name]


_LIBRARIES: dict[str, tuple[ctypes.CDLL, dict]] = {}


def library(isa_name: str):
    """Every case's kernel for `isa_name`, built into one library (cached)."""
    if isa_name not in _LIBRARIES:
        isa = get_isa(isa_name)
        kernels = {}
        for name in CASES:
            g = graph_of(name)[0]
            node = g.nodes()[0]
            assert ops.supports(node, g).ok, ops.supports(node, g).reason
            kernels[name] = ops.build(node, g, isa)
        lib = load(build_kernels(list(kernels.values()), isa, name="test_cpu_ops"))
        _LIBRARIES[isa_name] = (lib, kernels)
    return _LIBRARIES[isa_name]


def run_kernel(lib, kernel, g: Graph, feed: dict) -> np.ndarray:
    t = g.tensors[g.outputs[0]]
    out = np.empty(t.shape, DTYPES[t.dtype])
    return call(lib, kernel, [feed[n] for n in kernel.inputs], out, threads=THREADS)


EXACT_FLOAT = ("quantize", "dequantize", "max_pool2d", "relu", "clip", "add", "mul", "concat",
               "flatten", "reshape")


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("isa_name", ISAS)
def test_kernel_matches_reference(isa_name, name):
    g, feed, ref = graph_of(name)
    lib, kernels = library(isa_name)
    lib.vdla_set_threads(THREADS)
    out = run_kernel(lib, kernels[name], g, feed)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    op = g.nodes()[0].op
    if ref.dtype != np.float32 or op in EXACT_FLOAT:
        np.testing.assert_array_equal(out, ref)
        assert out.tobytes() == ref.tobytes()          # signed zeros too
    else:
        # within 1e-6 of the largest output; NaN where the reference has NaN (an average
        # over a window wholly in the padding: 0 / 0)
        largest = float(np.nanmax(np.abs(ref))) if not np.isnan(ref).all() else 0.0
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-6 * largest, equal_nan=True)


@pytest.mark.skipif(not get_isa("avx2").runs_on(machine_features()),
                    reason="the bound is AVX2 code's: this machine's compiler does not offer "
                           "avx2")
def test_resnet_max_pool_is_fast():
    """ResNet's 3x3 stride-2 max pool over 1x64x112x112. On 2 threads it takes about
    30 us (int8) and 40 us (float32) on the 2-core machine it was written on; checked
    here on one thread (about 60 and 80 us there), as the best of many single calls
    against a loose bound, because a test machine may be shared: a team of two threads
    waits for a busy second core."""
    isa = get_isa("avx2")
    for dtype in ("int8", "float32"):
        g, feed = one_node("max_pool2d", [((1, 64, 112, 112), dtype)], np.random.default_rng(0),
                           kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
        kernel = ops.build(g.nodes()[0], g, isa)
        lib = load(build_kernels([kernel], isa, name="test_cpu_ops_pool"))
        lib.vdla_set_threads(1)
        fn = function(lib, kernel)
        x = feed["x0"]
        out = np.empty((1, 64, 56, 56), x.dtype)
        pointers = (ctypes.c_void_p * 1)(x.ctypes.data)
        scratch = aligned_empty(64)
        args = (pointers, out.ctypes.data, scratch.ctypes.data, scratch.ctypes.data)
        fn(*args)
        best = float("inf")
        for _ in range(300):
            t0 = time.perf_counter()
            fn(*args)
            best = min(best, time.perf_counter() - t0)
        np.testing.assert_array_equal(out, run_reference(g, feed)[g.outputs[0]])
        assert best < 0.4e-3, f"{dtype} max pool took {best * 1e6:.0f} us on one thread"


# --- refusals ------------------------------------------------------------------------------

def test_unsupported_cases_say_why():
    rng = np.random.default_rng(0)

    def reason(g):
        node = g.nodes()[0]
        support = ops.supports(node, g)
        assert not support.ok
        with pytest.raises(ValueError) as raised:
            ops.build(node, g, get_isa("portable"))
        assert str(raised.value) == support.reason
        return support.reason

    g, _ = one_node("relu", [((2, 8), "float32")], rng)
    g.tensors["x0"].layout = "NC1n8c"
    assert "packed layout 'NC1n8c'" in reason(g)
    g, _ = one_node("lrn", [((1, 2, 3, 3), "float32")], rng)
    r = reason(g)
    assert "do not run 'lrn'" in r and "max_pool2d" in r
    g, _ = one_node("relu", [((2, 8), "int32")], rng)
    assert "int32" in reason(g) and "int8 or float32" in reason(g)
    g, _ = one_node("max_pool2d", [((1, 2, 5, 5), "int32")], rng, kernel=(2, 2))
    assert "int32" in reason(g)
    # float32 add/mul with any other broadcast run in the sequence module's strided loops
    for op, shapes in (("add", ((2, 3, 4, 5), (1, 1, 4, 5))), ("mul", ((2, 1, 1, 1),
                                                                       (1, 3, 1, 1)))):
        g, _ = one_node(op, [(shape, "float32") for shape in shapes], rng)
        assert ops.supports(g.nodes()[0], g).ok
    g, _ = one_node("add", [((2, 3, 4, 5), "int32"), ((1, 1, 4, 5), "int32")], rng)
    assert "int32" in reason(g)
    g, _ = one_node("add", [((2, 3), "int8"), ((2, 3), "int8")], rng)
    assert "float32" in reason(g)
    g, _ = qadd((S, "int8"), (S, "int8"), a_shift=32)
    assert "shift 32 is outside" in reason(g)
    g, _ = qadd((S, "int8"), ((1,), "int8"), b_shift=(1, 2, 3, 4, 5))
    assert "per-channel" in reason(g) or "channel axis" in reason(g)
    g, _ = qadd((S, "int8"), (S, "int8"), out_min=10, out_max=5)
    assert "out_min 10" in reason(g)
    g, _ = qadd((S, "int8"), ((5, 6, 7), "int8"), b_shift=(1,) * 6)
    assert "not the output's channel axis" in reason(g)
    g, _ = one_node("quantize", [((4,), "float32")], rng, scale=0.5, dtype="uint8")
    assert "'int8'" in reason(g)
    g, _ = one_node("concat", [((2, 3), "int8"), ((2, 3), "float32")], rng, axis=0)
    assert "mixes float32 and int8" in reason(g)
    g, _ = one_node("max_pool2d", [((1, 1, 2, 20000), "float32")], rng, kernel=(1, 1))
    assert "on the stack" in reason(g)
