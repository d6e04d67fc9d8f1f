"""The ``amx`` instruction set: its tile kernels (`vdla.compiler.targets.cpu.amx`, int8
``qmatmul``, ``qdense`` and ``qconv2d``) bit-exact against the integer reference, and
what it takes to run it.

This project's hosts (AMD EPYC) have no AMX, so the kernels run on `vdla_cpu.h`'s
software model of the tiles (``-DVDLA_AMX_MODEL``), which follows Intel's documented
semantics and faults where the hardware would (checked first, against numpy, on tile
shapes the kernels never use). Where AMX runs, every kernel case also runs natively, and
the model is compared with the instructions (skipped here, saying so). The real
instructions' build of every kernel is compiled here either way (``objdump`` shows the
tile instructions). Shapes: M, N and K not multiples of 16 or 64, one row, batches with
broadcast operands, a B shared by every batch, transposed B, residuals, extreme
operands over 4096 products; convolutions 1 x 1 (the direct rows) and k x k (im2col),
strided, dilated, padded, a 3-channel stem, batches, residuals; one and two threads; a
whole ResNet-18 and a quantized transformer."""

from __future__ import annotations

import ctypes
import dataclasses
import shutil
import subprocess

import numpy as np
import pytest

from vdla.compiler import run_reference
from vdla.compiler.ir.tensor import DTYPES
from vdla.compiler.targets.cpu import amx
from vdla.compiler.targets.cpu.build import build_library, machine_features
from vdla.compiler.targets.cpu.isa import ISAS, detect, get as get_isa, tiles_granted
from vdla.compiler.targets.cpu.layout import kernel_inputs, kernel_output
from vdla.compiler.targets.cpu.library import HEADER, build_kernels, call, header_text, load
from vdla.compiler.targets.cpu.lower import node_kernel
from vdla.compiler.targets.cpu.target import CpuTarget

from .test_transformer_ops import extreme_dense, extreme_qmatmul, graph

AMX = get_isa("amx")
NATIVE = AMX.refusal(machine_features())
#: Where the kernels run: on the model always, natively where AMX runs.
RUNS = ["model", pytest.param("native", marks=pytest.mark.skipif(
    NATIVE is not None, reason=f"AMX does not run here ({NATIVE}); the model runs the "
                               "tile kernels instead"))]

# --- the instruction set ----------------------------------------------------------------------


def test_the_amx_isa():
    """AVX-512 VNNI's vector code plus tiles: first in the order `detect` tries, its
    vector ops VNNI's, its flags the tile instructions' (which gcc accepts on any x86)."""
    assert list(ISAS)[0] == "amx"
    assert (AMX.lanes, AMX.registers, AMX.int8, AMX.tiles) == ((16, 8), 32, "amx", True)
    assert AMX.vector_int8 == "vnni" and get_isa("avx512vnni").vector_int8 == "vnni"
    assert not any(get_isa(n).tiles for n in ("avx512vnni", "avx2", "portable"))
    assert {"-mamx-tile", "-mamx-int8"} <= set(AMX.flags)
    assert set(AMX.requires) == {"avx512f", "avx512vnni", "amx_tile", "amx_int8"}
    assert amx.modelled(AMX).flags == AMX.flags + ("-DVDLA_PORTABLE", amx.MODEL_FLAG)
    with pytest.raises(ValueError, match="avx2 has no tile kernels"):
        amx.modelled(get_isa("avx2"))


def test_this_machine_says_why_it_does_not_run_amx():
    """The compiler's macros and the OS's grant decide; `--isa amx` on a machine without
    it is an error that says which (on an AMX machine: `detect` takes it)."""
    features = machine_features()
    flags = open("/proc/cpuinfo").read() if NATIVE is not None else ""
    if NATIVE is None:
        assert detect().name == "amx" and tiles_granted()
        return
    assert detect().name != "amx" and not AMX.runs_on(features)
    with pytest.raises(ValueError, match=r"CpuTarget: amx does not run here: "):
        CpuTarget(isa="amx").isa
    if "amx_tile" not in flags:
        assert not features.amx_tile
        assert NATIVE.startswith("this machine has no AMX: its C compiler's -march=native")
        # with the CPU's flags reported, the OS's answer decides (here: a real refusal,
        # the request arch_prctl(ARCH_REQ_XCOMP_PERM) fails on a CPU without tiles)
        claimed = dataclasses.replace(features, avx512f=True, avx512vnni=True,
                                      amx_tile=True, amx_int8=True)
        assert not tiles_granted()
        assert AMX.refusal(claimed).startswith("the OS refused the tile state: arch_prctl")


# --- the model, against the documented semantics ------------------------------------------------

#: C: one tdpbssd on tiles of the shapes given: C (m rows x nb bytes) loaded, times A (m x
#: kb) and B (kb / 4 x nb), stored; `bad` 1: B's bytes per row unequal to C's, 2: a tile
#: twice (both on the model only: the assembler refuses a tile named twice). Faults
#: (vdla_fail on the model) are counted.
_PROBE = """#include "vdla_cpu.h"
static int faults;
void vdla_fail(const char *prefix, long long value, const char *suffix) {
    (void)prefix; (void)value; (void)suffix; faults++;
}
int probe(int m, int kb, int nb, const int8_t *a, const int8_t *b, int32_t *c, int bad) {
    unsigned char config[64] = {0};
    config[0] = 1;       /* tile 0: C (m x nb bytes), 1: A (m x kb), 2 and 3: B */
    config[16] = (unsigned char)nb; config[18] = (unsigned char)kb;
    config[20] = (unsigned char)nb; config[22] = (unsigned char)(bad ? nb + 4 : nb);
    config[48] = config[49] = (unsigned char)m; config[50] = (unsigned char)(kb / 4);
    config[51] = (unsigned char)(kb / 4);
    faults = 0;
    _tile_loadconfig(config);
    _tile_loadd(0, c, 64);
    _tile_loadd(1, a, 64);
#ifdef VDLA_AMX_MODEL    /* the instructions take constant, distinct tiles: the faults only here */
    if (bad == 2) _tile_dpbssd(0, 1, 1);
    if (bad) { _tile_loadd(3, b, 64); _tile_dpbssd(0, 1, 3); } else
#endif
    { _tile_loadd(2, b, 64); _tile_dpbssd(0, 1, 2); }
    _tile_stored(0, c, 64);
    _tile_release();
    return faults;
}
"""


def probe(kind: str):
    """`_PROBE` built on the model or (where AMX runs) natively; vdla_fail counts faults."""
    flags = amx.modelled(AMX).flags if kind == "model" else AMX.flags
    lib = build_library({HEADER: header_text(), "probe.c": _PROBE}, name=f"amx_probe_{kind}",
                        flags=flags, openmp=False).load()
    lib.probe.argtypes = [ctypes.c_int] * 3 + [ctypes.c_void_p] * 3 + [ctypes.c_int]
    return lib


def _spec(c, a, b):
    """C += A B as Intel's pseudocode for tdpbssd reads: dword (m, n) plus the signed
    products of A's row m, bytes 4k + i, and B's row k, bytes 4n + i, modulo 2**32."""
    m, kb = a.shape
    nb = c.shape[1]
    sums = c.astype(np.int64) + a.astype(np.int64) @ b.reshape(kb // 4, nb, 4).transpose(
        0, 2, 1).reshape(kb, nb).astype(np.int64)
    return ((sums + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.int32)


@pytest.mark.parametrize("kind", RUNS)
@pytest.mark.parametrize("m, kb, nb", [(16, 64, 16), (5, 20, 3), (1, 4, 1), (11, 64, 7)])
def test_the_model_computes_what_intel_documents(kind, m, kb, nb):
    """Partial tiles (rows and bytes per row below 16 x 64), extreme bytes, and a C near
    the int32 bounds so that the sums wrap: the tile past its rows and bytes untouched,
    the rest the documented sums (and natively, the instruction's)."""
    lib = probe(kind)
    rng = np.random.default_rng(m * kb)
    a = np.zeros((16, 64), np.int8)
    b = np.zeros((16, 64), np.int8)
    a[:m, :kb] = rng.choice([-128, -127, -1, 0, 1, 127], (m, kb))
    b[:kb // 4, :4 * nb] = rng.choice([-128, -127, -1, 0, 1, 127], (kb // 4, 4 * nb))
    c = np.full((16, 16), 7, np.int32)
    c[:m, :nb] = rng.choice([2 ** 31 - 9, -2 ** 31 + 5, 0, 123], (m, nb))
    want = c.copy()
    want[:m, :nb] = _spec(c[:m, :nb], a[:m, :kb], b[:kb // 4, :4 * nb])
    got = c.copy()
    assert lib.probe(m, kb, 4 * nb, a.ctypes.data, b.ctypes.data, got.ctypes.data, 0) == 0
    np.testing.assert_array_equal(got, want)
    assert (want != c).any()                         # the probe computes something


def test_the_model_faults_where_the_instructions_would():
    """tdpbssd with B's bytes per row unequal to C's, or a tile twice: faults (reported,
    the instruction skipped) on the model, as #UD on the hardware."""
    lib = probe("model")
    a, b, c = (np.ones((16, 64), np.int8), np.ones((16, 64), np.int8),
               np.zeros((16, 16), np.int32))
    assert lib.probe(4, 8, 12, a.ctypes.data, b.ctypes.data, c.ctypes.data, 1) == 1
    assert (c == 0).all()
    assert lib.probe(4, 8, 12, a.ctypes.data, b.ctypes.data, c.ctypes.data, 2) == 2


# --- the kernels --------------------------------------------------------------------------------

QMATMUL = {  # (a, b, transpose_b, multiplier, shift)
    "tiny": ((5, 7), (7, 9), False, None, (6,)),
    "one_row": ((1, 1, 1, 64), (1, 1, 64, 16), False, 77, (12,)),
    "edges_t": ((2, 3, 17, 65), (2, 3, 33, 65), True, 3001, (17,)),
    "broadcast": ((1, 3, 6, 8), (2, 1, 8, 16), False, None, (7,)),
    "shared_b": ((3, 40, 130), (130, 50), False, 77, (12,)),
    "blocks_t": ((2, 32, 64), (2, 32, 64), True, None, (8,)),
    "team": ((1, 2, 48, 200), (1, 2, 200, 31), False, None, (9,)),
}
QDENSE = {  # (n, k, o, residual)
    "one_row": (1, 37, 11, False), "residual": (3, 8, 9, True), "tiles": (16, 64, 16, False),
    "edges": (33, 130, 50, True), "wide": (40, 768, 96, False)}
QCONV = {  # conv_graph's arguments: whole 64-channel steps, the rows read in place
    "3x3": dict(c=64, h=9, w=9, o=24, k=3, stride=1, pad=1),
    "team_3x3": dict(c=64, h=14, w=14, o=70, k=3, stride=1, pad=1, multiply=True),
    "1x1": dict(n=2, c=128, h=5, w=7, o=40, k=1, stride=1, pad=0),
    "1x1_s2": dict(c=64, h=8, w=8, o=33, k=1, stride=2, pad=0),
    "wide_s2": dict(c=64, h=7, w=75, o=40, k=3, stride=2, pad=1),     # rows of 32 + 6
    "residual": dict(n=2, c=64, h=6, w=6, o=50, k=3, stride=1, pad=1, residual=True,
                     multiply=True),
    "dilated": dict(c=128, h=11, w=10, o=8, k=3, stride=1, pad=2, dilation=2),
    "even_k": dict(c=64, h=6, w=9, o=16, k=2, stride=1, pad=1),
    "stem": dict(c=3, h=20, w=22, o=64, k=7, stride=2, pad=3),          # a row a step
    "stem_dilated": dict(n=2, c=4, h=11, w=10, o=128, k=3, stride=1, pad=2, dilation=2),
}
EXTREME = {"qmatmul_extreme_t0": lambda: extreme_qmatmul(False, m=5),
           "qmatmul_extreme_t1": lambda: extreme_qmatmul(True, m=17),
           "qdense_extreme": lambda: extreme_dense("alternating", 4093, n=17, o=40)}


def _qmatmul(case):
    a, b, tb, mult, shift = QMATMUL[case]
    return graph("qmatmul", [(a, "int8"), (b, "int8")], transpose_b=tb, multiplier=mult,
                 shift=shift, out_min=-100, out_max=120)


def _qdense(case):
    n, k, o, residual = QDENSE[case]
    rng = np.random.default_rng(n + k + o)
    w = rng.integers(-128, 128, (o, k)).astype(np.int8)
    bias = rng.integers(-9000, 9000, o).astype(np.int32)
    ins = [((n, k), "int8"), w, bias] + ([((n, o), "int8")] if residual else [])
    extra = dict(shift=(8,), residual_shift=0) if residual else dict(multiplier=(3001,),
                                                                     shift=(20,))
    return graph("qdense", ins, **extra)


def _qconv(case):
    from gemm_graphs import conv_graph
    return conv_graph(np.random.default_rng(len(case)), dtype="int8", **QCONV[case])


CASES = {**{f"qmatmul_{c}": (lambda c=c: _qmatmul(c)) for c in QMATMUL},
         **{f"qdense_{c}": (lambda c=c: _qdense(c)) for c in QDENSE},
         **{f"qconv_{c}": (lambda c=c: _qconv(c)) for c in QCONV}, **EXTREME}
_MADE: dict = {}


def made(kind: str):
    """Every case's graph, feed, reference output and AMX kernel, and their library
    (built once per kind)."""
    if kind not in _MADE:
        isa = amx.modelled(AMX) if kind == "model" else AMX
        cases = {}
        for name, make in CASES.items():
            g, feed = make()
            kernel, _ = node_kernel(g.nodes()[0], g, isa, threads=2)
            cases[name] = (g, feed, run_reference(g, feed)[g.outputs[0]], kernel)
        lib = load(build_kernels([c[3] for c in cases.values()], isa, name=f"test_amx_{kind}"))
        _MADE[kind] = (cases, lib)
    return _MADE[kind]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("kind", RUNS)
def test_tile_kernels_match_the_reference(kind, name, threads):
    cases, lib = made(kind)
    g, feed, want, kernel = cases[name]
    assert kernel.checks and "tdpbssd" not in kernel.body
    assert ("vdla_amx_taps_block(" if name.startswith("qconv") else "vdla_amx_block(") \
        in kernel.body
    lib.vdla_set_threads(threads)
    raw, plain = kernel_output(kernel, want.shape, DTYPES[g.tensors[g.outputs[0]].dtype])
    raw.fill(99)
    call(lib, kernel, kernel_inputs(kernel, [feed[n] for n in kernel.inputs]), raw,
         threads=threads)
    assert lib.vdla_error() is None
    np.testing.assert_array_equal(plain(raw), want)
    if kernel.out_block:                 # a convolution's NCHW64c: zero past O
        assert kernel.out_block == 64 and raw.shape[1] == -(-want.shape[1] // 64)
        assert (raw[:, -1, ..., want.shape[1] - 64 * (raw.shape[1] - 1):] == 0).all()


@pytest.mark.parametrize("kind", RUNS)
def test_a_patch_embedding_runs_on_tiles(kind):
    """A ViT's int8 stem (a convolution whose kernel is its stride) is the dense layers'
    GEMM (`patches`): on amx, the tile kernel inside it, reporting like it."""
    from gemm_graphs import conv_graph
    isa = amx.modelled(AMX) if kind == "model" else AMX
    g, feed = conv_graph(np.random.default_rng(3), dtype="int8", n=2, c=3, h=18, w=20,
                         o=40, k=4, stride=4, pad=0)
    kernel, schedule = node_kernel(g.nodes()[-1], g, isa, threads=2)
    assert schedule is None and kernel.checks and "vdla_amx_block" in kernel.body
    want = run_reference(g, feed)[g.outputs[0]]
    lib = load(build_kernels([kernel], isa, name=f"test_amx_patches_{kind}"))
    lib.vdla_set_threads(2)
    out = np.full(want.shape, 99, np.int8)
    call(lib, kernel, [feed[n] for n in kernel.inputs], out, threads=2)
    np.testing.assert_array_equal(out, want)


def test_the_team_is_the_schedules_knob():
    """Large enough products start the team (work items of 32 x 32 outputs); the
    schedule's other knobs do not change the tile kernels."""
    cases, _ = made("model")
    assert cases["qmatmul_team"][3].items == 2 * 2 * 1
    assert cases["qdense_wide"][3].items == 2 * 3
    assert cases["qmatmul_tiny"][3].items == 1
    assert cases["qconv_team_3x3"][3].items == 14 * 4     # (output row, 32 of 128 channels)
    assert cases["qconv_1x1_s2"][3].items == 1


def test_the_instructions_build_compiles_here():
    """The kernels with the real tile intrinsics (no model) compile on any x86 host (gcc's
    -mamx-* flags); their library holds the tile instructions. Not run here."""
    cases, _ = made("model")
    kernels = [node_kernel(g.nodes()[0], g, AMX, threads=2)[0] for g, *_ in cases.values()]
    build = build_kernels(kernels, AMX, name="test_amx_instructions")
    if shutil.which("objdump") is None:
        pytest.skip("no objdump to read the library's instructions")
    text = subprocess.run(["objdump", "-d", str(build.path)], capture_output=True,
                          text=True, check=True).stdout
    for instruction in ("ldtilecfg", "tilezero", "tileloadd", "tdpbssd", "tilestored",
                        "tilerelease"):
        assert instruction in text, instruction


@pytest.mark.skipif(tiles_granted(), reason="the OS grants this process the tile state")
def test_a_refused_tile_state_is_an_error_not_a_fault():
    """The real instructions' build, called where the OS refuses the tile state: the kernel
    asks (c/runtime.c), runs no tile instruction and reports why; asked again, the same."""
    cases, _ = made("model")
    g, feed, want, _ = cases["qdense_edges"]
    kernel = node_kernel(g.nodes()[0], g, AMX, threads=2)[0]
    lib = load(build_kernels([kernel], AMX, name="test_amx_refused"))
    for _ in range(2):
        with pytest.raises(ValueError, match=r"the OS refused this process the AMX tile state "
                                             r"\(arch_prctl ARCH_REQ_XCOMP_PERM: errno \d+\)"):
            call(lib, kernel, [feed[n] for n in kernel.inputs], np.empty_like(want))


def test_ops_without_tiles_run_the_vnni_code():
    """Under amx, a layer that is not an int8 GEMM is the avx512vnni code, text for
    text (a depthwise int8 convolution, a float one, a float dense layer, an int8
    convolution whose channels are not whole 64-byte steps); the tile kernels differ,
    and an int8 convolution given a schedule (a tuned record) is the vector code."""
    from gemm_graphs import conv_graph
    vnni = get_isa("avx512vnni")
    for kw in (dict(c=16, o=16, groups=16), dict(dtype="float32"), dict(c=3)):
        g, _ = conv_graph(np.random.default_rng(0), **kw)
        node = g.nodes()[-1]
        assert node_kernel(node, g, AMX)[0].body == node_kernel(node, g, vnni)[0].body
    g, _ = conv_graph(np.random.default_rng(0), c=64)
    node = g.nodes()[-1]
    tiles, schedule = node_kernel(node, g, AMX)
    assert schedule is None and "vdla_amx_taps_block(" in tiles.body
    vector, schedule = node_kernel(node, g, vnni)
    assert node_kernel(node, g, AMX, schedule=schedule)[0].body == vector.body
    fg, _ = graph("dense", [((4, 9), "float32"), np.ones((5, 9), np.float32)])
    assert node_kernel(fg.nodes()[0], fg, AMX)[0].body == \
        node_kernel(fg.nodes()[0], fg, vnni)[0].body
    qg, _ = _qdense("tiles")
    assert node_kernel(qg.nodes()[0], qg, AMX)[0].body != \
        node_kernel(qg.nodes()[0], qg, vnni)[0].body


def run_whole(graph, feed, isa, *, bf16: bool = False):
    """`graph` compiled by a CPU target on `isa` (2 threads; `bf16`: that precision) and
    run once on `feed` by the target's session (the whole-graph runner): (the compiled
    model, the outputs). Every node runs on the CPU target."""
    from vdla.compiler import pipeline
    compiled, _ = pipeline.compile_for(graph, CpuTarget(isa=isa, threads=2, bf16=bf16))
    assert all(op.target == "cpu" for op in compiled.ops)
    with compiled.session() as session:
        return compiled, session.run(feed).outputs


def tiled(compiled, *blocks: str) -> list[str]:
    """The ops of `compiled` whose kernel runs on tiles (`blocks`: the block functions,
    by default the int8 ones: copied rows, or a convolution's read in place)."""
    blocks = blocks or ("vdla_amx_block(", "vdla_amx_taps_block(")
    return [op.name for op in compiled.ops if any(b in op.kernel.kernel.body for b in blocks)]


@pytest.mark.parametrize("kind", RUNS)
def test_a_quantized_transformer_runs_whole(kind):
    """gpt_mini quantized, every node compiled for amx (its dense layers on tiles, the
    rest the vector code) into one program: the whole-graph runner's output is the
    reference's, bit for bit."""
    from vdla.compiler.frontend import zoo
    from vdla.compiler.passes import quantize
    g = zoo.get("gpt_mini", seq_len=8, num_classes=64)
    rng = np.random.default_rng(0)
    feeds = [{"input_ids": rng.integers(0, 64, (1, 8)).astype(np.int64)} for _ in range(3)]
    g = quantize(g, feeds[:2], "shift")
    compiled, out = run_whole(g, feeds[2], amx.modelled(AMX) if kind == "model" else AMX)
    assert len(tiled(compiled)) >= 4
    np.testing.assert_array_equal(out[g.outputs[0]], run_reference(g, feeds[2])[g.outputs[0]])


@pytest.mark.parametrize("kind", RUNS)
def test_a_quantized_resnet_runs_whole(kind):
    """ResNet-18 quantized (at 32 x 32), compiled for amx: every convolution on tiles, its
    rows read in place (the 3-channel stem a kernel row a step, the 3 x 3s, the 1 x 1
    shortcuts of stride 2, the residual adds in their epilogues), and the classifier on
    tiles too; the whole-graph runner's output is the reference's, bit for bit."""
    from vdla.compiler.frontend import zoo
    from vdla.compiler.passes import quantize
    g = zoo.get("resnet18", image_size=32, num_classes=10)
    rng = np.random.default_rng(0)
    feeds = [{"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}
             for _ in range(3)]
    g = quantize(g, feeds[:2], "shift")
    compiled, out = run_whole(g, feeds[2], amx.modelled(AMX) if kind == "model" else AMX)
    convs = {n.name for n in g.nodes() if n.op == "qconv2d"}
    assert len(convs) == 20 and convs <= set(tiled(compiled, "vdla_amx_taps_block("))
    assert "logits" in tiled(compiled)
    np.testing.assert_array_equal(out[g.outputs[0]], run_reference(g, feeds[2])[g.outputs[0]])
