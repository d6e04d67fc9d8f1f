"""``vdla verilog``: the accelerator's Verilog and a manifest; with ``--board``, also the
board's wrapper, constraints and vendor project script."""

from __future__ import annotations

import json
import sys
import time

from vdla.boards.project import generate as generate_board
from vdla.cli.common import CONFIG_HELP, board_config, load_config, log
from vdla.hw.verilog import generate

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    verilog = sub.add_parser("verilog", help="write the accelerator's Verilog and a manifest "
                                             "(config, register map, ports)")
    verilog.add_argument("-o", "--output", required=True, metavar="DIR", help="output folder")
    verilog.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    verilog.add_argument("--board", metavar="NAME",
                         help="also write the board's wrapper, constraints, vendor project "
                              "script and manifest (see `vdla boards`; default config: the "
                              "board's)")
    verilog.set_defaults(func=run)


def run(args) -> int:
    if args.board:
        return _board_files(args)
    config = load_config(args.config)
    print(f"vdla: generating Verilog for {config.name} ...", file=sys.stderr)
    start = time.perf_counter()
    paths = generate(config, args.output)
    info = json.loads(paths["manifest"].read_text())
    print(f"{paths['verilog']}  (top {info['top']}, {len(info['ports'])} ports, "
          f"{paths['verilog'].stat().st_size // 1024} KiB)")
    print(f"{paths['manifest']}  (config, register map, ports)")
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


def _board_files(args) -> int:
    board, config = board_config(args.board, args.config)
    log(f"generating {board.name} ({board.part.name}) files for {config.name} ...")
    start = time.perf_counter()
    paths = generate_board(board, config, args.output)
    info = json.loads(paths["manifest.json"].read_text())
    print(f"{args.output}: {board.title}, {board.part.name}, {config.name} at "
          f"{board.clock_mhz:g} MHz, registers at {board.register_base:#010x}")
    for name, path in sorted(paths.items()):
        print(f"  {name:<24}{path.stat().st_size:>10,} bytes")
    print(f"wrapper {info['wrapper']['top']} ({len(info['wrapper']['ports'])} ports, "
          f"{board.family.vendor} naming). The vendor scripts are untested on hardware.")
    log(f"done in {time.perf_counter() - start:.1f} s")
    return 0
