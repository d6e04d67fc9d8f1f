"""``vdla boards``: the FPGA boards vdla targets."""

from __future__ import annotations

import json

from vdla.boards import BOARDS

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    boards = sub.add_parser("boards", help="list the FPGA boards vdla targets",
                            description="List the boards (part, clock, DRAM port, register "
                                        "window, part resources, default config).")
    boards.add_argument("--json", action="store_true", help="machine-readable output")
    boards.set_defaults(func=run)


def run(args) -> int:
    if args.json:
        print(json.dumps([b.to_dict() for b in BOARDS.values()], indent=2))
        return 0
    header = (f"{'board':<12}{'part':<22}{'family':<18}{'clock':>7}{'DRAM bus':>10}"
              f"{'registers':>12}{'LUT':>9}{'FF':>9}{'DSP':>6}{'BRAM':>6}  default config")
    print(header)
    for b in BOARDS.values():
        cap = b.part.capacity
        print(f"{b.name:<12}{b.part.name:<22}{b.part.family:<18}{b.clock_mhz:>4g} MHz"
              f"{b.dram_bus_width:>6} bit{b.register_base:>#12x}{cap.lut:>9,}{cap.ff:>9,}"
              f"{cap.dsp:>6,}{cap.bram:>6,}  {b.config.name}")
    print("LUT counts ALMs on the Cyclone V and LUT4s on the ECP5; BRAM counts RAMB36, M10K "
          "and 18 Kbit EBR blocks. `vdla verilog --board NAME -o DIR` writes a board's "
          "files; `vdla estimate --board NAME` synthesises it.")
    return 0
