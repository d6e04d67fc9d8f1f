"""The cases of VTA's instruction tests, each against numpy: on the functional simulator
(ids ``default``, ``b2x8x32``) and again differentially (``default-differential``, ...)
on a `DifferentialDevice` pairing a fresh functional reference with the candidate backend
of `differential.CANDIDATE`, which also compares the two backends' DRAM after each run.
"""

import itertools

import numpy as np
import pytest

import vdla
from vdla import AluOp
from vdla.isa import MemoryType, Uop
from vdla.runtime import COMPUTE, LOAD, STORE, ProgramBuilder
from vdla.runtime.kernels import GemmSchedule, blocked_gemm, blocked_gemm_reference
from differential import B2X8X32, CANDIDATE, pair_with
from vdla_testing import load_acc_insn, put, reference_alu_op, run_acc_program

CONFIGS = {
    "default": vdla.HardwareConfig(),
    "b2x8x32": B2X8X32,
}

DRAM_SIZE = 1 << 24
#: Device id -> (config name, whether differential).
DEVICES = {name: (name, False) for name in CONFIGS} | {
    f"{name}-differential": (name, True) for name in CONFIGS}


@pytest.fixture(scope="module")
def candidates():
    """The candidate device of a config name, opened on first use and kept for the module
    (a Verilator model is built once per config)."""
    opened = {}

    def get(name):
        if name not in opened:
            opened[name] = vdla.runtime.open(CONFIGS[name], backend=CANDIDATE, dram_size=DRAM_SIZE)
        return opened[name]

    yield get
    for device in opened.values():
        device.close()


@pytest.fixture(params=list(DEVICES))
def dev(request, candidates):
    name, differential = DEVICES[request.param]
    if differential:
        device = pair_with(candidates(name))
    else:
        device = vdla.runtime.open(CONFIGS[name], backend="functional", dram_size=DRAM_SIZE)
    with device as d:
        yield d


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def _acc_shape(c, n):
    return (n, c.batch, c.block_out)


def test_save_load_out(dev, rng):
    """int32 tile -> LOAD ACC -> ALU SHR 0 -> STORE: the out buffer keeps the low 8 bits."""
    c = dev.config
    n = 24
    data = rng.integers(-2**31, 2**31, size=_acc_shape(c, n), dtype=np.int64).astype(np.int32)
    src = put(dev, data)
    out_addr = dev.alloc(n * c.out_elem_bytes)
    uop_addr = put(dev, np.frombuffer(vdla.isa.encode_uops([Uop(0, 0)], c), np.uint8))
    p = ProgramBuilder(c)
    p.load(MemoryType.UOP, dram_base=uop_addr // c.uop_bytes, y_size=1, x_size=1, x_stride=1)
    p.load(**load_acc_insn(c, src, y_size=1, x_size=n, x_stride=n))
    p.alu(AluOp.SHR, use_imm=True, imm=0, uop_bgn=0, uop_end=1, iter_out=n, iter_in=1,
          dst_factor_out=1)
    p.dep_push(COMPUTE, STORE)
    p.dep_pop(COMPUTE, STORE)
    p.store(dram_base=out_addr // c.out_elem_bytes, y_size=1, x_size=n, x_stride=n)
    p.dep_push(STORE, COMPUTE)
    p.dep_pop(STORE, COMPUTE)
    stats = dev.run(*dev.load_program(p.finish()))
    got = dev.read(out_addr, n * c.out_elem_bytes).view(np.int8).reshape(data.shape)
    np.testing.assert_array_equal(got, data.astype(np.int8))  # numpy's cast truncates
    assert stats["load_bytes_acc"] == data.nbytes
    assert stats["store_bytes_out"] == n * c.out_elem_bytes
    assert stats["alu_uops"] == n


PADS = list(itertools.product((0, 1, 2), repeat=4))[::5] + [(0, 0, 0, 0), (3, 1, 0, 2), (1, 1, 1, 1)]


@pytest.mark.parametrize("pads", [tuple(p) for p in itertools.product((0, 2), repeat=4)]
                         + [(1, 3, 2, 1), (0, 1, 3, 0)], ids=str)
def test_padded_load_acc(dev, rng, pads):
    """Every combination of y_pad_0/y_pad_1/x_pad_0/x_pad_1 on a strided 2-D load."""
    c = dev.config
    y0, y1, x0, x1 = pads
    rows, cols, stride = 3, 4, 6
    full = rng.integers(-2**31, 2**31, size=(rows, stride) + _acc_shape(c, 1)[1:],
                        dtype=np.int64).astype(np.int32)
    addr = put(dev, full)
    n = (y0 + rows + y1) * (x0 + cols + x1)

    def body(p, _):
        p.load(**load_acc_insn(c, addr, y_size=rows, x_size=cols, x_stride=stride,
                               y_pad_0=y0, y_pad_1=y1, x_pad_0=x0, x_pad_1=x1))

    got = run_acc_program(dev, [], body, n)
    expected = np.pad(full[:, :cols], ((y0, y1), (x0, x1), (0, 0), (0, 0)))
    np.testing.assert_array_equal(got, expected.reshape(got.shape))


@pytest.mark.parametrize("pads", [tuple(p) for p in itertools.product((0, 1), repeat=4)], ids=str)
def test_padded_load_inp(dev, rng, pads):
    """Padded INP loads, read back through a GEMM with identity weights."""
    c = dev.config
    y0, y1, x0, x1 = pads
    rows, cols, stride = 2, 3, 5
    data = rng.integers(-128, 128, size=(rows, stride, c.batch, c.block_in), dtype=np.int8)
    inp_addr = put(dev, data)
    # wgt[o, i] = 1 where i == o (mod block_in): acc lane o = inp lane (o mod block_in).
    eye = (np.arange(c.block_out)[:, None] % c.block_in == np.arange(c.block_in)).astype(np.int8)
    wgt_addr = put(dev, eye[None])
    n = (y0 + rows + y1) * (x0 + cols + x1)

    def body(p, _):
        p.load(MemoryType.INP, dram_base=inp_addr // c.inp_elem_bytes, y_size=rows,
               x_size=cols, x_stride=stride, y_pad_0=y0, y_pad_1=y1, x_pad_0=x0, x_pad_1=x1)
        p.load(MemoryType.WGT, dram_base=wgt_addr // c.wgt_elem_bytes, y_size=1, x_size=1,
               x_stride=1)
        p.dep_push(LOAD, COMPUTE)
        p.dep_pop(LOAD, COMPUTE)
        # uop 0 is (0, 0, 0): reset then accumulate acc[e] = inp[e] · eyeᵀ for every e.
        p.gemm(reset_reg=True, uop_bgn=0, uop_end=1, iter_out=n, iter_in=1, dst_factor_out=1)
        p.gemm(uop_bgn=0, uop_end=1, iter_out=n, iter_in=1, dst_factor_out=1, src_factor_out=1)

    got = run_acc_program(dev, [Uop(0, 0, 0)], body, n)
    padded = np.pad(data[:, :cols], ((y0, y1), (x0, x1), (0, 0), (0, 0))).reshape(n, c.batch, c.block_in)
    expected = padded[:, :, np.arange(c.block_out) % c.block_in].astype(np.int32)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("threads", [1, 2])
def test_blocked_gemm(dev, rng, threads):
    """A 256x256x64 GEMM in several tiles, with one and with two virtual threads."""
    a = rng.integers(-128, 128, size=(256, 64), dtype=np.int8)
    b = rng.integers(-128, 128, size=(256, 64), dtype=np.int8)
    c = dev.config
    sched = GemmSchedule(tile_m=64 // c.batch, tile_n=128 // c.block_out, virtual_threads=threads)
    out, stats, program = blocked_gemm(dev, a, b, shift=9, schedule=sched)
    np.testing.assert_array_equal(out, blocked_gemm_reference(a, b, 9))
    assert stats["gemm_macs"] == 256 * 256 * 64
    tiles = (256 // 64) * (256 // 128)
    assert stats["store_insns"] == tiles
    if threads == 2:  # the two threads alternate between the SRAM halves
        sram_bases = {insn.sram_base for insn in program if insn.opcode.name == "LOAD"
                      and insn.memory_type == MemoryType.INP}
        assert sram_bases == {0, c.inp_depth // 2}


def test_blocked_gemm_odd_shapes(dev, rng):
    """Sizes that are not block multiples are zero-padded; edge tiles are smaller."""
    a = rng.integers(-128, 128, size=(37, 50), dtype=np.int8)
    b = rng.integers(-128, 128, size=(45, 50), dtype=np.int8)
    sched = GemmSchedule(tile_m=5, tile_n=2, virtual_threads=2)
    out, _, _ = blocked_gemm(dev, a, b, shift=4, schedule=sched)
    np.testing.assert_array_equal(out, blocked_gemm_reference(a, b, 4))


def _alu_case(dev, rng, op, use_imm, imm=0, a=None, b=None):
    c = dev.config
    n = 16
    if a is None:
        a = rng.integers(-2**31, 2**31, size=_acc_shape(c, n), dtype=np.int64).astype(np.int32)
    if b is None:
        b = rng.integers(-2**31, 2**31, size=_acc_shape(c, n), dtype=np.int64).astype(np.int32)
    addr = put(dev, np.concatenate([a, b]))

    def body(p, _):
        p.load(**load_acc_insn(c, addr, y_size=1, x_size=2 * n, x_stride=2 * n))
        p.alu(op, use_imm=use_imm, imm=imm, uop_bgn=0, uop_end=1, iter_out=n, iter_in=1,
              dst_factor_out=1, src_factor_out=1)

    got = run_acc_program(dev, [Uop(0, n)], body, n)
    operand = np.full(a.shape, imm) if use_imm else b
    expected = np.vectorize(lambda x, y: reference_alu_op(op, int(x), int(y)),
                            otypes=[np.int64])(a, operand).astype(np.int32)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("op", [AluOp.MIN, AluOp.MAX, AluOp.ADD, AluOp.MUL])
@pytest.mark.parametrize("imm", [-32768, -7, 0, 3, 32767])
def test_alu_immediate(dev, rng, op, imm):
    if op not in dev.config.alu_ops:
        pytest.skip("config without MUL")
    _alu_case(dev, rng, op, use_imm=True, imm=imm)


@pytest.mark.parametrize("op", list(AluOp))
def test_alu_vector(dev, rng, op):
    if op not in dev.config.alu_ops:
        pytest.skip("config without MUL")
    if op == AluOp.SHR:  # shift amounts over the whole signed 6-bit range, both directions
        b = rng.integers(-32, 32, size=_acc_shape(dev.config, 16)).astype(np.int32)
        _alu_case(dev, rng, op, use_imm=False, b=b)
    else:
        _alu_case(dev, rng, op, use_imm=False)


@pytest.mark.parametrize("imm", [0, 1, 5, 31, -1, -4, -31, -32, 63, -33])
def test_alu_shift_immediate_both_directions(dev, rng, imm):
    """SHR is arithmetic; a negative amount shifts left (bits past 31 are lost)."""
    _alu_case(dev, rng, AluOp.SHR, use_imm=True, imm=imm)


def test_alu_shift_known_values(dev):
    c = dev.config
    a = np.full(_acc_shape(c, 16), -1000, np.int32)
    a[1::2] = 0x40000001
    # SHR 3 of -1000 is -125 (arithmetic, rounds toward -inf); SHR -2 of 0x40000001 wraps.
    _alu_case(dev, None, AluOp.SHR, use_imm=True, imm=3, a=a, b=np.zeros_like(a))
    _alu_case(dev, None, AluOp.SHR, use_imm=True, imm=-2, a=a, b=np.zeros_like(a))
    assert reference_alu_op(AluOp.SHR, -1000, 3) == -125
    assert reference_alu_op(AluOp.SHR, 0x40000001, -2) == 4


def test_alu_mul_absent_is_an_error():
    """Without MUL in the config, the builder refuses it and the simulator rejects it."""
    cfg = vdla.HardwareConfig()
    mul = vdla.isa.Alu(alu_opcode=AluOp.MUL, use_imm=True, imm=3, uop_end=1, iter_out=1, iter_in=1)
    with pytest.raises(ValueError, match="alu_opcode=MUL"):
        ProgramBuilder(cfg).append(mul)
    sim = vdla.sim.FunctionalSimulator(cfg, np.zeros(1 << 16, np.uint8))
    with pytest.raises(vdla.sim.ProgramError, match="instruction 0 .*MUL is not in this config"):
        sim.run([mul, vdla.isa.Finish()])


def test_relu(dev, rng):
    """ReLU on int8 outputs as VTA does it: MAX 0, then MIN 127."""
    c = dev.config
    n = 32
    a = rng.integers(-1000, 1000, size=_acc_shape(c, n)).astype(np.int32)
    addr = put(dev, a)

    def body(p, _):
        p.load(**load_acc_insn(c, addr, y_size=1, x_size=n, x_stride=n))
        loop = dict(uop_bgn=0, uop_end=1, iter_out=n, iter_in=1, dst_factor_out=1)
        p.alu(AluOp.MAX, use_imm=True, imm=0, **loop)
        p.alu(AluOp.MIN, use_imm=True, imm=127, **loop)

    got = run_acc_program(dev, [Uop(0, 0)], body, n)
    np.testing.assert_array_equal(got, np.clip(a, 0, 127))


def test_shift_and_scale(dev, rng):
    """Rounding requantization: ADD 2**(s-1), then SHR s."""
    c = dev.config
    n, s = 32, 6
    a = rng.integers(-2**20, 2**20, size=_acc_shape(c, n)).astype(np.int32)
    addr = put(dev, a)

    def body(p, _):
        p.load(**load_acc_insn(c, addr, y_size=1, x_size=n, x_stride=n))
        loop = dict(uop_bgn=0, uop_end=1, iter_out=n, iter_in=1, dst_factor_out=1)
        p.alu(AluOp.ADD, use_imm=True, imm=1 << (s - 1), **loop)
        p.alu(AluOp.SHR, use_imm=True, imm=s, **loop)

    got = run_acc_program(dev, [Uop(0, 0)], body, n)
    np.testing.assert_array_equal(got, (a + (1 << (s - 1))) >> s)


def test_alu_chained_reads_keep_sequential_order(dev, rng):
    """Micro-ops reading what earlier micro-ops of the same instruction wrote (a running
    sum and a reduction into one element) see those writes, as the hardware does."""
    c = dev.config
    n = 12
    a = rng.integers(-1000, 1000, size=_acc_shape(c, n)).astype(np.int32)
    addr = put(dev, np.concatenate([a, a]))

    def body(p, _):
        p.load(**load_acc_insn(c, addr, y_size=1, x_size=2 * n, x_stride=2 * n))
        # acc[k] += acc[k-1] for k = 1..n-1: a prefix sum in place.
        p.alu(AluOp.ADD, uop_bgn=0, uop_end=1, iter_out=n - 1, iter_in=1,
              dst_factor_out=1, src_factor_out=1)
        # acc[n] = max(acc[n], acc[n+k]) for k = 1..n-1: a max reduction into one element.
        p.alu(AluOp.MAX, uop_bgn=1, uop_end=2, iter_out=n - 1, iter_in=1, src_factor_out=1)

    got = run_acc_program(dev, [Uop(1, 0), Uop(n, n + 1)], body, 2 * n)
    np.testing.assert_array_equal(got[:n], np.cumsum(a, axis=0))
    np.testing.assert_array_equal(got[n], a.max(axis=0))
