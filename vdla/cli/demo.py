"""``vdla demo``: one blocked GEMM on the simulated accelerator, checked against numpy
(the smaller first look at the main job)."""

from __future__ import annotations

import sys
import time

import numpy as np

import vdla.runtime
from vdla.cli.common import CONFIG_HELP, CliError, load_config
from vdla.runtime.kernels import blocked_gemm, blocked_gemm_reference

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    demo = sub.add_parser("demo", help="run a blocked GEMM on the simulated accelerator and "
                                       "check it against numpy")
    demo.add_argument("--m", type=int, default=256, help="rows of A and C (default 256)")
    demo.add_argument("--n", type=int, default=256, help="rows of B, columns of C (default 256)")
    demo.add_argument("--k", type=int, default=64, help="reduction length (default 64)")
    demo.add_argument("--shift", type=int, default=8, choices=range(32), metavar="S",
                      help="requantization shift 0..31 (default 8)")
    demo.add_argument("--threads", type=int, default=2, choices=(1, 2),
                      help="virtual threads (default 2)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--backend", choices=vdla.runtime.BACKENDS, default="verilator",
                      help="simulator (default verilator; the first run builds the model)")
    demo.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    demo.set_defaults(func=run)


def run(args) -> int:
    config = load_config(args.config)
    for name in ("m", "n", "k"):
        if getattr(args, name) < 1:
            raise CliError(f"--{name} must be a positive integer, not {getattr(args, name)}")
    rng = np.random.default_rng(args.seed)
    a = rng.integers(-128, 128, size=(args.m, args.k), dtype=np.int8)
    b = rng.integers(-128, 128, size=(args.n, args.k), dtype=np.int8)
    shift = args.shift
    backend = args.backend
    where = {"functional": "the functional simulator",
             "verilator": "the cycle-accurate Verilator model"}[backend]
    print(f"blocked GEMM {args.m}x{args.n}x{args.k} (int8, >>{shift}, clip to int8) on "
          f"{where}, config {config.name}, {args.threads} virtual thread(s)")
    with vdla.runtime.open(config, backend=backend) as dev:
        start = time.perf_counter()
        out, stats, program = blocked_gemm(dev, a, b, shift=shift, virtual_threads=args.threads)
        seconds = time.perf_counter() - start
    expected = blocked_gemm_reference(a, b, shift)
    mismatches = int(np.count_nonzero(out != expected))
    print(f"  instructions       {len(program)}")
    if backend == "verilator":
        cycles = stats["cycles"]
        macs = args.m * args.n * args.k
        print(f"  cycles             {cycles}  ({cycles / config.clock_mhz:.1f} us at "
              f"{config.clock_mhz:g} MHz)")
        print(f"  GEMM utilization   {macs / (cycles * config.macs_per_cycle):.1%}  (useful MACs "
              "over cycles x MACs per cycle)")
        for key in ("load_busy", "compute_busy", "store_busy", "stall_load_compute",
                    "dram_bytes_read", "dram_bytes_written"):
            print(f"  {key:<18} {stats[key]}")
        print(f"  wall time          {seconds * 1e3:.1f} ms ({cycles / stats['wall_seconds']:,.0f} "
              "simulated cycles/s)")
    else:
        for key in ("gemm_uops", "gemm_macs", "alu_uops", "dram_bytes_read",
                    "dram_bytes_written"):
            print(f"  {key:<18} {stats.get(key, 0)}")
        print(f"  wall time          {seconds * 1e3:.1f} ms ({stats['gemm_macs'] / seconds / 1e9:.2f} "
              "G simulated MAC/s, including set-up)")
    if mismatches:
        print(f"FAIL: {mismatches} of {out.size} outputs differ from numpy", file=sys.stderr)
        return 1
    print(f"OK: all {out.size} outputs match numpy bit-exactly")
    return 0
