"""Cycle counts of the accelerator's modules in Verilator (the issue's timing intent).

Runs the timing testbenches of the cocotb suite on the default config and prints what
they measured: GEMM and ALU instructions of N micro-ops (N + constant cycles; a vector
ALU operand takes two cycles per micro-op), and load, store and fetch throughput in bus
words per cycle against cocotbext-axi's AXI RAM.

    python3 bench/hw_timing.py [--config FILE]

The first run builds the Verilator models (about a minute); later runs reuse them.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

from vdla.shipped import load_config

# The testbenches and harnesses live with the tests. (vdla is imported first: the
# tests/vdla/ folder would otherwise pass for it.)
ROOT = Path(__file__).resolve().parents[1]
sys.path += [str(ROOT / "tests"), str(ROOT / "tests" / "hw")]

from cocotb_harness import build_root, run_cocotb  # noqa: E402

# The figures the timing testbenches log.
PATTERN = re.compile(r"INFO\s+\S+\s+(.*(?:retire to retire|took \d+ cycles|in \d+ cycles).*)")


def harnesses(cfg):
    from compute_harness import ComputeHarness
    from hw_harnesses import LoadHarness
    from store_fetch_harness import FetchHarness, StoreHarness
    return [
        ("compute", lambda: ComputeHarness(cfg), "compute_harness", "tb_compute",
         "one_micro_op_per_cycle"),
        ("load", lambda: LoadHarness(cfg), "load_harness", "tb_load", "one_bus_word_per_cycle"),
        ("store", lambda: StoreHarness(cfg), "store_harness", "tb_store", "one_bus_word_per_cycle"),
        ("fetch", lambda: FetchHarness(cfg), "fetch_harness", "tb_fetch", "fetch_rate"),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", metavar="FILE", help="hardware config JSON (default: VTA's)")
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    print(f"config {cfg.name}, bus {cfg.dram_bus_width} bits")
    build_root().mkdir(parents=True, exist_ok=True)   # a fresh checkout has none yet
    for module, make, toplevel, testbench, testcase in harnesses(cfg):
        print(f"\n{module}:", flush=True)
        with tempfile.TemporaryDirectory(dir=build_root()) as tmp:
            run_cocotb(make(), toplevel=toplevel, testbench=testbench, config=cfg,
                       testcase=testcase, tmp_path=Path(tmp))
            log = (Path(tmp) / "sim.log").read_text(errors="replace")
        for line in PATTERN.findall(log):
            print(f"  {line.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
