"""The training workload of a profile-guided build of the Verilator model
(`vdla.sim.verilator.training` runs it in a child process, whose exit writes the
profiles).

    python -m vdla.sim.verilator.training_workload LIBRARY CONFIG_JSON

Blocked GEMMs of `vdla.runtime.kernels` with their requantization, with two and with
one virtual thread, each run three times on the instrumented `LIBRARY`, and checked
against numpy (a profile of a broken model would be worse than none).
"""

from __future__ import annotations

import json
import sys

import numpy as np

import vdla.runtime
from vdla.config import HardwareConfig
from vdla.runtime.kernels import BlockedGemm, blocked_gemm_reference


def run(library: str, config: HardwareConfig) -> None:
    rng = np.random.default_rng(0)
    k = 16 * config.block_in
    # About 180,000 and 60,000 cycles on the default config: long enough that the
    # steady state, not the start, sets the proportions.
    for m, n, threads in ((256 * config.batch, 32 * config.block_out, 2),
                          (128 * config.batch, 16 * config.block_out, 1)):
        a = rng.integers(-128, 128, (m, k), dtype=np.int8)
        b = rng.integers(-128, 128, (n, k), dtype=np.int8)
        with vdla.runtime.open(config, backend="verilator", dram_size=64 << 20,
                               library=library) as dev:
            with BlockedGemm(dev, a, b, shift=8, virtual_threads=threads) as gemm:
                for _ in range(3):
                    gemm.run()
                if not np.array_equal(gemm.result(), blocked_gemm_reference(a, b, 8)):
                    raise SystemExit("the training GEMM's result differs from numpy's")


def main(argv: list[str]) -> None:
    library, config = argv
    run(library, HardwareConfig.from_dict(json.loads(config)))


if __name__ == "__main__":
    main(sys.argv[1:])
