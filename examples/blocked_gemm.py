"""The DRAM image of blocked_gemm.asm, and the check of its result against numpy.

    python examples/blocked_gemm.py image gemm.dram          # A, B and the micro-ops
    vdla sim examples/blocked_gemm.asm --dram gemm.dram --dump after.dram
    python examples/blocked_gemm.py check after.dram         # C == clip((A . B^T) >> 6)

The image is generated rather than committed: its bytes follow from a seed, and the
layout below is the one blocked_gemm.asm's dram_base fields name.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from vdla.config import HardwareConfig
from vdla.isa import Uop, encode_uops

CONFIG = HardwareConfig()                 # VTA's default: 1 x 16 x 16, int8 x int8 -> int32
M, K, N, SHIFT = 2, 32, 32, 6
UOP_ADDR, A_ADDR, B_ADDR, C_ADDR = 0x000, 0x040, 0x100, 0x500
IMAGE_BYTES = C_ADDR + M * N              # C's bytes are in the image (zero) too


def operands(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A (M x K) and B (N x K), int8."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-128, 128, (M, K), dtype=np.int8),
            rng.integers(-128, 128, (N, K), dtype=np.int8))


def expected(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = clip((A . B^T) >> SHIFT, -128, 127) as int8, in plain numpy."""
    acc = a.astype(np.int32) @ b.astype(np.int32).T
    return np.clip(acc >> SHIFT, -128, 127).astype(np.int8)


def image(seed: int = 0) -> bytes:
    """The DRAM image: the micro-ops, A row-major, B as 16 x 16 blocks in (n, k) order."""
    a, b = operands(seed)
    block = CONFIG.block_in
    dram = np.zeros(IMAGE_BYTES, np.uint8)
    uops = np.frombuffer(encode_uops([Uop(dst=0, src=0, wgt=0), Uop(dst=0, src=1, wgt=1)],
                                     CONFIG), np.uint8)
    dram[UOP_ADDR:UOP_ADDR + len(uops)] = uops
    dram[A_ADDR:A_ADDR + a.size] = a.view(np.uint8).reshape(-1)
    # wgt element (n, k) is B[16n : 16n + 16, 16k : 16k + 16], row by row.
    blocks = b.reshape(N // block, block, K // block, block).transpose(0, 2, 1, 3)
    dram[B_ADDR:B_ADDR + b.size] = blocks.view(np.uint8).reshape(-1)
    return dram.tobytes()


def result(dump: bytes) -> np.ndarray:
    """C (M x N int8) from a DRAM dump (`vdla sim --dump`): out element 2m + n holds
    row m's columns 16n .. 16n + 15, so the four elements are C row-major."""
    return np.frombuffer(dump, np.int8)[C_ADDR:C_ADDR + M * N].reshape(M, N)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("image", "check"))
    parser.add_argument("path", help="image: the file to write; check: the DRAM dump")
    parser.add_argument("--seed", type=int, default=0, help="seeds A and B (default 0)")
    args = parser.parse_args(argv)
    if args.action == "image":
        Path(args.path).write_bytes(image(args.seed))
        print(f"wrote {args.path} ({IMAGE_BYTES} bytes): A {M}x{K}, B {N}x{K}, seed {args.seed}")
        return 0
    got, want = result(Path(args.path).read_bytes()), expected(*operands(args.seed))
    if not np.array_equal(got, want):
        print(f"C differs from numpy in {int((got != want).sum())} of {want.size} elements",
              file=sys.stderr)
        return 1
    print(f"C ({M}x{N}) equals clip((A . B^T) >> {SHIFT}) from numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
