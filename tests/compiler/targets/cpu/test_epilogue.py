"""The one epilogue of the CPU target's convolution and dense kernels
(`vdla.compiler.targets.cpu.epilogue`): its statements per precision, step by step, its
errors, and every accumulating kernel compiled for an instruction set this machine's
compiler targets but the machine cannot run (the other tests run each kernel, bit-exact
against the references, on every set the machine runs)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vdla.compiler.targets.cpu import isa as cpu_isa
from vdla.compiler.targets.cpu.build import machine_features
from vdla.compiler.targets.cpu.epilogue import ALL, Epilogue, Lanes, Operands
from vdla.compiler.targets.cpu.library import build_kernels
from vdla.compiler.targets.cpu.lower import node_kernel
from vdla.compiler.targets.cpu.schedule import conv_space
from vdla.compiler.targets.cpu.shapes import ConvShape

from gemm_graphs import conv_graph, dense_graph


# --- the statements -----------------------------------------------------------------------------

def test_int8_is_bias_requantization_residual_clamp_store():
    """The reference's steps in its order, the additions on uint32 lanes; each of the
    output's and the residual's requantizers as asked."""
    ep = Epilogue(8, True, residual=True, rq=("rqp", "rqv"))
    lines = ep.statements("s", Operands.lanes(ep, "c"), "y + i", res="res + i",
                          lanes=Lanes("first", "n"))
    assert lines == [
        "vi8 a = (vi8)((vu8)s + (vu8)vi8_load(bias + c));",
        "a = vi8_rqp(a, vi8_load(mul + c), vi8_load(shf + c));",
        "a = (vi8)((vu8)a + (vu8)vi8_rqv(n == 8 ? vi8_from_s8(res + i) : "
        "vi8_from_s8_n(res + i, n), vi8_load(rmul + c), vi8_load(rshf + c)));",
        "a = vi8_max(vi8_min(a, vi8_bcast(lim[1])), vi8_bcast(lim[0]));",
        "if (n == 8) vi8_store_s8(y + i, a); else vi8_store_s8_n(y + i, a, n);"]


def test_one_channel_per_vector_reads_scalars():
    """A plain convolution's vector holds one channel's pixels: its constants are that
    channel's scalars, requantized by ``rq``; the masked lanes are a grid's columns."""
    ep = Epilogue(16, True, rq=("rq", "rq"))
    lines = ep.statements("s", Operands.channel(ep, "ch"), "y + o", lanes=Lanes("keep", "k"),
                          var="v")
    assert lines == ["vi16 v = (vi16)((vu16)s + (uint32_t)bias[ch]);",
                     "v = vi16_rq(v, mul[ch], shf[ch]);",
                     "v = vi16_max(vi16_min(v, vi16_bcast(lim[1])), vi16_bcast(lim[0]));",
                     "vi16_store_s8_keep(y + o, v, k);"]


@pytest.mark.parametrize("activation, step", [
    (None, None),
    ("relu", "a = vf8_max(a, (vf8){0});"),
    ("clip", "a = vf8_max(vf8_min(a, hi), lo);"),
    ("gelu", "a = a * 0.5f * (1.0f + vf8_erf(a * 0.7071067811865476f));"),
    ("gelu_tanh", "a = a * 0.5f * (1.0f + vf8_tanh(0.7978845608028654f * (a + 0.044715f * a "
                  "* a * a)));")])
def test_float32_is_bias_residual_activation_store(activation, step):
    ep = Epilogue(8, False, residual=True, activation=activation)
    ops = Operands(bias="b", lo="lo", hi="hi")
    lines = ep.statements("s", ops, "y + i", res="r + i", lanes=ALL)
    assert lines == (["vf8 a = s + b;", "a += vf8_load(r + i);"] + ([step] if step else [])
                     + ["vf8_store(y + i, a);"])


@pytest.mark.parametrize("make, message", [
    (lambda: Epilogue(12, False), "12 lanes: allowed \\[8, 16\\]"),
    (lambda: Epilogue(8, False, activation="swish"), "'swish'"),
    (lambda: Epilogue(8, True, activation="relu"), "None for int8"),
    (lambda: Epilogue(8, True, rq=("rqx", "rqv")), "'rqx'"),
    (lambda: Lanes("some", "n"), "'some': allowed 'all', 'first', 'keep'"),
    (lambda: Lanes("first"), "'first' with count ''"),
    (lambda: Epilogue(8, False, residual=True).statements(
        "s", Operands("b", "lo", "hi"), "y"), "res \\(its C pointer\\) is required"),
])
def test_errors_name_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# --- compiled for an instruction set this machine cannot run ------------------------------------

#: Per instruction set, the flags that make the compiler write its instructions on a
#: machine without them (after ``-march=native``; the header's paths follow the macros
#: they define).
_CROSS = {"avx512vnni": ("-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512vnni",
                         "-mavx512vbmi2")}

#: Layers that take every epilogue path: int8 with and without a residual, grids with
#: dropped columns (3x3 with padding) and without (1x1), depthwise, float32 with each
#: activation.
_CONVS = [dict(residual=True, multiply=True), dict(k=1, pad=0, c=33, o=17, residual=True),
          dict(groups=24, c=24, o=24, residual=True),
          dict(dtype="float32", k=1, pad=0, c=33, o=17, residual=True, activation="clip"),
          dict(dtype="float32", c=16, o=16, h=8, w=10, activation="relu"),
          dict(dtype="float32", groups=17, c=17, o=17, residual=True)]


def _kernels(isa):
    """Each layer of `_CONVS` with the first schedule of each kind its space holds
    (layout, lanes, Winograd, vector width), and dense layers of both precisions."""
    kernels = []
    for i, case in enumerate(_CONVS):
        g, _ = conv_graph(np.random.default_rng(i), **case)
        if case.get("activation") == "clip":
            g.node("conv").attrs.update(clip_min=-0.5, clip_max=0.75)
        kinds = {}
        for s in conv_space(ConvShape.from_node(g.node("conv"), g), isa):
            kinds.setdefault((s.layout, s.lanes, s.wino, s.vl), s)
        kernels += [node_kernel(g.node("conv"), g, isa, schedule=s)[0] for s in kinds.values()]
    for dtype in ("int8", "float32"):
        g, _ = dense_graph(np.random.default_rng(0), dtype=dtype, residual=True)
        kernels.append(node_kernel(g.node("fc"), g, isa)[0])
    return kernels


@pytest.mark.parametrize("name", list(_CROSS))
def test_kernels_compile_for_a_set_this_machine_cannot_run(name):
    """Every generator's kernels for `name`, built with that set's instructions: the
    tests that run kernels skip a set the machine lacks, so this is what checks its C
    here (that it compiles; its results are checked where it runs)."""
    isa = cpu_isa.get(name)
    if isa.runs_on(machine_features()):
        pytest.skip(f"this machine runs {name}: the other tests run its kernels")
    kernels = _kernels(isa)
    texts = "".join(k.body for k in kernels)
    assert "vf16" in texts and "vi16" in texts and "vf8" in texts   # both vector widths
    cross = dataclasses.replace(isa, flags=isa.flags + _CROSS[name])
    assert build_kernels(kernels, cross).path.exists()
