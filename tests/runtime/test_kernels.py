"""Bad inputs of the hand-written blocked GEMM kernel get clear errors."""

import numpy as np
import pytest

import vdla
from vdla.runtime.kernels import BlockedGemm, GemmSchedule


@pytest.fixture
def dev():
    return vdla.runtime.open(dram_size=1 << 22)


A = np.zeros((32, 32), np.int8)


@pytest.mark.parametrize("a, b, kwargs, message", [
    (A, np.zeros((16, 31), np.int8), {}, r"needs a \(M, K\) and b \(N, K\); got \(32, 32\) and \(16, 31\)"),
    (A, np.zeros(32, np.int8), {}, "needs a"),
    (A.astype(np.int16), A, {}, "takes int8 operands, not int16"),
    (A, A, {"shift": 32}, "shift must be in 0..31, not 32"),
    (A, A, {"shift": -1}, "shift must be in 0..31, not -1"),
    (A, A, {"virtual_threads": 3}, "virtual_threads must be 1 or 2, not 3"),
    (A, A, {"schedule": GemmSchedule(0, 1)}, "tile_m and tile_n must be positive"),
    (np.zeros((4096, 32), np.int8), A, {"schedule": GemmSchedule(4096, 2)},
     r"GEMM tile 4096x2 .* does not fit config 1x16x16.*inp needs 8192 elements, 2048 available"),
])
def test_bad_inputs(dev, a, b, kwargs, message):
    with pytest.raises(ValueError, match=message):
        BlockedGemm(dev, a, b, **kwargs)
    assert dev.allocator.bytes_in_use == 0  # nothing left allocated


def test_default_schedule_fills_each_threads_share():
    cfg = vdla.HardwareConfig()
    s = GemmSchedule.default(cfg, mb=256, kb=4, nb=16, virtual_threads=2)
    assert (s.tile_m, s.tile_n) == (64, 16)  # acc: 64 x 16 = 1024 = half of 2048


def test_out_of_dram_frees_what_it_took():
    dev = vdla.runtime.open(dram_size=1 << 16)
    big = np.zeros((1024, 64), np.int8)
    with pytest.raises(vdla.runtime.OutOfMemory, match="cannot allocate"):
        BlockedGemm(dev, big[:640], big[:320])  # A and B fit, C does not
    assert dev.allocator.bytes_in_use == 0
