"""Synthesize a set of configs with yosys: the data the sweep's resource model is fitted to.

Usage: python scripts/calibrate_resources.py [--board pynq-z1] [--only NAME ...] [--list]

The design-space sweep (`vdla.dse`) cannot call yosys per point (the default config takes
4 to 14 minutes on two cores; docs/tool-facts.md, yosys), so it predicts LUT, FF, DSP and
BRAM with an analytical model of the generated hardware (`vdla.dse.resources`) whose
per-family coefficients are fitted to real synthesis results. This script makes those
results: it runs `vdla.boards.estimate.estimate` (the flow `vdla estimate` uses, cached in
``~/.cache/vdla/estimates``) on each config of `CONFIGS` for the board's part, and writes
``dse/calibration/<part>.json``: for each config its parameters, yosys's cell counts and
the four resources, with the tools' versions and the time each synthesis took. The file is
rewritten atomically after every config, so an interrupted run keeps what finished and a
second run continues (finished syntheses come from the estimate cache).

The configs span what a sweep varies: the GEMM core's shape (batch x block_in x
block_out), every buffer's size, the optional ALU multiplier. They need not fit the part
(synthesis counts what they would use), only pass the quick on-chip memory check.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from vdla import HardwareConfig
from vdla._fileio import atomic_write
from vdla.boards import get as get_board
from vdla.boards.estimate import estimate
from vdla.config import AluOp, REQUIRED_ALU_OPS

K = 1024
MUL = REQUIRED_ALU_OPS | {AluOp.MUL}

#: name -> HardwareConfig keyword arguments (the board's bus width and clock are applied).
CONFIGS = {
    "b1_8x8_small": dict(block_in=8, block_out=8, inp_buff_size=16 * K, wgt_buff_size=64 * K,
                         acc_buff_size=64 * K, uop_buff_size=16 * K),
    "b1_8x16": dict(block_in=8, block_out=16, inp_buff_size=32 * K, wgt_buff_size=128 * K,
                    acc_buff_size=64 * K, uop_buff_size=16 * K),
    "b1_16x8_mul": dict(block_in=16, block_out=8, inp_buff_size=16 * K, wgt_buff_size=64 * K,
                        acc_buff_size=32 * K, uop_buff_size=8 * K, alu_ops=MUL),
    "b2_8x8": dict(batch=2, block_in=8, block_out=8, inp_buff_size=32 * K,
                   wgt_buff_size=64 * K, acc_buff_size=64 * K, uop_buff_size=16 * K),
    "b1_16x16_mul_small": dict(inp_buff_size=16 * K, wgt_buff_size=128 * K,
                               acc_buff_size=64 * K, uop_buff_size=16 * K, alu_ops=MUL),
    "b1_32x8": dict(block_in=32, block_out=8, inp_buff_size=32 * K, wgt_buff_size=128 * K,
                    acc_buff_size=32 * K, uop_buff_size=16 * K),
    "b1_8x32": dict(block_in=8, block_out=32, inp_buff_size=16 * K, wgt_buff_size=128 * K,
                    acc_buff_size=128 * K, uop_buff_size=16 * K),
    "b1_16x16_default": dict(),
    "b2_16x16": dict(batch=2, inp_buff_size=32 * K, wgt_buff_size=128 * K,
                     acc_buff_size=128 * K, uop_buff_size=32 * K),
}


def calibration_path(part: str) -> Path:
    return Path(__file__).resolve().parent.parent / "dse" / "calibration" / f"{part}.json"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--board", default="pynq-z1", help="board whose part is calibrated")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=sorted(CONFIGS),
                        help="synthesize only these configs (the file keeps the others)")
    parser.add_argument("--list", action="store_true", help="list the configs and stop")
    args = parser.parse_args(argv)
    board = get_board(args.board)
    configs = {name: board.apply(HardwareConfig(dram_bus_width=board.dram_bus_width, **kwargs))
               for name, kwargs in CONFIGS.items()}
    if args.list:
        for name, config in configs.items():
            print(f"{name:<22} {config.name}")
        return 0
    path = calibration_path(board.part.name)
    data = json.loads(path.read_text()) if path.exists() else {}
    points = data.get("points", {})
    todo = args.only or list(configs)
    start = time.perf_counter()
    for i, name in enumerate(todo, 1):
        config = configs[name]
        print(f"[{i}/{len(todo)}] {name} ({config.name}) ...", flush=True)
        result = estimate(board, config, log=lambda message: print("  " + message, flush=True))
        points[name] = {"config": config.to_dict(), "config_name": config.name,
                        "cells": result.cells, "resources": result.resources.to_dict(),
                        "seconds": round(result.seconds, 1), "tools": result.tools}
        print(f"  {result.resources.to_dict()} in {result.seconds:.0f} s"
              + (" (cached)" if result.cached else ""), flush=True)
        data = {"part": board.part.name, "family": board.family.name,
                "flow": board.family.yosys, "board": board.name,
                "script": "scripts/calibrate_resources.py", "tools": result.tools,
                "points": dict(sorted(points.items()))}
        atomic_write(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
    print(f"wrote {path} ({len(points)} configs) in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
