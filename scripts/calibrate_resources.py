"""Synthesize a set of configs with yosys: the data the sweep's resource model is fitted to.

Usage: python scripts/calibrate_resources.py (--family F | --board B) [--only NAME ...]
                                             [--redo] [--list] [--confirm]
       python scripts/calibrate_resources.py --table

The design-space sweep (`vdla.dse`) cannot call yosys per point (the default config takes
4 to 14 minutes on two cores; docs/tool-facts.md, yosys), so it predicts LUT, FF, DSP and
BRAM with an analytical model of the generated hardware (`vdla.dse.resources`) whose
per-family coefficients are fitted to real synthesis results. This script makes those
results for one family: it runs `vdla.boards.estimate.estimate` (the flow `vdla estimate`
uses, cached in ``~/.cache/vdla/estimates``) on each of the family's configs
(`FAMILY_CONFIGS`) for the part of the family's calibration board (`FAMILY_BOARDS`, or
``--board``), and writes ``dse/calibration/<family>.json``: for each config its
parameters, yosys's cell counts and the four resources as ``vdla estimate`` reports them
(on the ECP5, nextpnr's packed counts), with the tools' versions and the time each run
took. yosys's flow depends on the family, not on the part's size, so one file serves all
the family's parts (the two Zynq UltraScale+ boards share the xczu3eg's run). A config
whose DRAM bus the calibration board's port cannot take (a wider bus, where that port has
no clock of its own to bridge it) runs on another board of the family with the same port
(`calibration_board`: the UltraScale+'s 256-bit bus on the ZCU104's part), and its point
names that board and part.

The file is rewritten atomically after every config, and a config already in it (the
same hardware) is not run again unless ``--redo``: an interrupted run keeps what finished,
and running the same command again continues where it stopped.

The configs span what a sweep varies: the GEMM core's shape (batch x block_in x
block_out), every buffer's size, the optional ALU multiplier, with at least two more
configs than the model has LUT/FF features; on the families that price the extensions
past VTA (`vdla.extensions`: REQ, alu_hold, the depthwise window, the DSP limit), some
of those configs again with extensions or a wider DRAM bus (`EXTENSION_CONFIGS`).
Synthesis time grows with the core, so the UltraScale+ leaves out the two largest of the
7-series' nine, and the Cyclone V and the ECP5, whose hard multipliers limit them to
small cores, use small ones (`SMALL_CONFIGS`).
They need not fit the part (synthesis counts what they would use), only pass the quick
on-chip memory check, except on the ECP5, where only a config that fits is placed and
routed, so every ECP5 config fits the LFE5U-85F and the data is nextpnr's throughout.

``--confirm`` synthesizes the family's `CONFIRM` points, which the model is not fitted
to, and records measured and predicted resources under "confirmed" in the same file;
``--table`` prints every family's fit, its confirmations and what each extension past VTA,
a wider bus and one product per DSP (`dsp_pack` off, `UNPACKED_CONFIGS`) cost by yosys
(the config with it minus the same config without) as Markdown (docs/sweeps.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from vdla import HardwareConfig
from vdla._fileio import atomic_write
from vdla.boards import BOARDS, Board, get as get_board
from vdla.boards.estimate import estimate
from vdla.config import AluOp, REQUIRED_ALU_OPS
from vdla.dse.resources import (TERM_EXTENSIONS, ResourceModel, bus_pairs, calibrated_families,
                                extension_pairs, extension_terms, pack_pairs, unpacked_pairs)

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


#: Small cores (up to 128 products), for the parts with fewer hard multipliers: every
#: one fits the ECP5's LFE5U-85F (156 MULT18X18D: a GEMM pair takes two, an ALU lane's
#: multiplier three), so nextpnr places each one there; on the Cyclone V (112 DSP
#: blocks) a sweep's fitting cores are this small too. Cheapest first.
SMALL_CONFIGS = {
    "s1_16x4": dict(block_in=16, block_out=4, inp_buff_size=8 * K, wgt_buff_size=32 * K,
                    acc_buff_size=16 * K, uop_buff_size=8 * K),
    "s1_8x8_mul": dict(block_in=8, block_out=8, inp_buff_size=8 * K, wgt_buff_size=32 * K,
                       acc_buff_size=32 * K, uop_buff_size=8 * K, alu_ops=MUL),
    "s1_8x8": dict(block_in=8, block_out=8, inp_buff_size=16 * K, wgt_buff_size=64 * K,
                   acc_buff_size=64 * K, uop_buff_size=16 * K),
    "s2_8x8": dict(batch=2, block_in=8, block_out=8, inp_buff_size=16 * K,
                   wgt_buff_size=32 * K, acc_buff_size=64 * K, uop_buff_size=16 * K),
    "s1_8x16": dict(block_in=8, block_out=16, inp_buff_size=16 * K, wgt_buff_size=64 * K,
                    acc_buff_size=64 * K, uop_buff_size=8 * K),
    "s1_16x8_mul": dict(block_in=16, block_out=8, inp_buff_size=8 * K, wgt_buff_size=32 * K,
                        acc_buff_size=32 * K, uop_buff_size=8 * K, alu_ops=MUL),
    "s1_16x8_big": dict(block_in=16, block_out=8, inp_buff_size=32 * K,
                        wgt_buff_size=128 * K, acc_buff_size=32 * K, uop_buff_size=16 * K),
}

#: The cheaper seven of `CONFIGS` (the two largest cores left out), cheapest first.
_SMALL = ["b1_16x8_mul", "b2_8x8", "b1_8x8_small", "b1_32x8", "b1_16x16_mul_small",
          "b1_8x16", "b1_8x32"]

REQ = REQUIRED_ALU_OPS | {AluOp.REQ}
TAB = REQUIRED_ALU_OPS | {AluOp.TAB}
DIV = REQUIRED_ALU_OPS | {AluOp.DIV}

#: family -> configs with the extensions past VTA: name -> (the family's base
#: config it adds them to, the fields it changes). The model prices an extension by what
#: it adds to the same config without it (`vdla.dse.resources.extension_terms`), so each
#: config is the base with extensions added, and the base must be in the family's set.
#: The smallest set that identifies the two terms (REQ per ALU lane, alu_hold a
#: constant) and checks their form: REQ alone and alu_hold alone on one base (each
#: term measured by itself), and both on a base with another ALU lane count (REQ's cost
#: per lane, and the two adding up). On the 7-series, both on the default config too:
#: that is pynq-z1's default config with both extensions (``vdla estimate``'s check that
#: it fits), and a second measurement of the sum on 16 lanes. The second bases are the
#: cheapest to synthesize of their family (1x16x8-mul: 8 lanes to the default's 16;
#: 1x16x4: 4 lanes to 1x8x8's 8).
EXTENSION_CONFIGS = {
    "zynq-7000": {"b1_16x16_default_req": ("b1_16x16_default", dict(alu_ops=REQ)),
                  "b1_16x16_default_hold": ("b1_16x16_default", dict(alu_hold=True)),
                  "b1_16x16_default_req_hold": ("b1_16x16_default",
                                                dict(alu_ops=REQ, alu_hold=True)),
                  "b1_16x8_mul_req_hold": ("b1_16x8_mul", dict(alu_ops=MUL | {AluOp.REQ},
                                                               alu_hold=True)),
                  # Half of the 32 multiplier pairs built from LUTs (gemm_dsp_limit): the
                  # LUTs of a LUT-built pair, which pynq-z1-plus uses 36 of.
                  "b1_8x8_small_dsp16": ("b1_8x8_small", dict(gemm_dsp_limit=16)),
                  # The depthwise window, per lane and tap: 4 taps of one row a column
                  # on 8 lanes, and 3 taps of two rows a column on 16 lanes (the shape
                  # of pynq-z1-plus's window, block_out = 2 block_in).
                  "b1_8x8_small_dw4": ("b1_8x8_small", dict(dw_taps=4)),
                  "b1_8x16_dw3": ("b1_8x16", dict(dw_taps=3)),
                  # The 128-bit DRAM bus bridged to the 64-bit HP port (pynq-z1-plus's):
                  # the wide_bus term, per bit, on an 8-lane and a 16-lane core.
                  "b1_16x8_mul_bus128": ("b1_16x8_mul", dict(dram_bus_width=128)),
                  "b1_16x16_default_bus128": ("b1_16x16_default", dict(dram_bus_width=128)),
                  # The ALU's lookup table (TAB): a LUT-RAM copy per lane and one DMA,
                  # on 8 and 16 lanes (the two terms, per lane and constant).
                  "b1_16x8_mul_tab": ("b1_16x8_mul", dict(alu_ops=MUL | {AluOp.TAB})),
                  "b1_16x16_default_tab": ("b1_16x16_default", dict(alu_ops=TAB)),
                  # The ALU's divide (DIV): a sequential divider per lane and the issue
                  # gate, on 8 and 16 lanes (one term, per lane).
                  "b1_16x8_mul_div": ("b1_16x8_mul", dict(alu_ops=MUL | {AluOp.DIV})),
                  "b1_16x16_default_div": ("b1_16x16_default", dict(alu_ops=DIV)),
                  # The pipelined divider (div_pipeline), per lane: pynq-z1-transformers
                  # (REQ, TAB, DIV, alu_hold) with it, whose other terms the points
                  # above price.
                  "b1_16x16_transformers_divp": ("b1_16x16_default", dict(
                      alu_ops=REQ | TAB | DIV, alu_hold=True, div_pipeline=True))},
    # The same terms on the cheapest of the family's seven bases: REQ alone and alu_hold
    # alone on 1x16x8-mul (8 lanes), both on 1x8x16 (16 lanes); the window with two inp
    # rows a column on 1x8x16 (block_out = 2 block_in, zcu104-plus's shape) and one row a
    # column on 1x8x8. REQ alone on 1x8x8 too: REQ measured 114 LUTs a lane beside the
    # ALU's MUL (1x16x8-mul) and 148 without it (1x8x16, with alu_hold), so a third
    # point without MUL, as the cores a sweep builds mostly are (it measured 131).
    "zynq-ultrascale+": {"b1_16x8_mul_req": ("b1_16x8_mul", dict(alu_ops=MUL | {AluOp.REQ})),
                         "b1_16x8_mul_hold": ("b1_16x8_mul", dict(alu_hold=True)),
                         "b1_8x8_small_req": ("b1_8x8_small", dict(alu_ops=REQ)),
                         "b1_8x16_req_hold": ("b1_8x16", dict(alu_ops=REQ, alu_hold=True)),
                         "b1_8x16_dw3": ("b1_8x16", dict(dw_taps=3)),
                         "b1_8x8_small_dw4": ("b1_8x8_small", dict(dw_taps=4)),
                         # The 256-bit bus bridged to the 128-bit HP port (zcu104-plus's):
                         # on 1x16x8 (an inp row is half a bus word) and 1x32x8 (an inp
                         # row is one bus word, as on a 1x32 core). The Ultra96-V2's port
                         # has no clock of its own to bridge a wider bus, so these run on
                         # the ZCU104's part (`calibration_board`).
                         "b1_16x8_mul_bus256": ("b1_16x8_mul", dict(dram_bus_width=256)),
                         "b1_32x8_bus256": ("b1_32x8", dict(dram_bus_width=256))},
    "cyclone-v": {"s1_8x8_req": ("s1_8x8", dict(alu_ops=REQ)),
                  "s1_8x8_hold": ("s1_8x8", dict(alu_hold=True)),
                  "s1_16x4_req_hold": ("s1_16x4", dict(alu_ops=REQ, alu_hold=True)),
                  "s1_8x16_dw3": ("s1_8x16", dict(dw_taps=3))},
}


#: family -> configs with one product per DSP (`dsp_pack` off), as `EXTENSION_CONFIGS`:
#: name -> (the packed base config, the fields it changes). The model prices unpacking
#: by what it changes in the same config packed (`vdla.dse.resources.pack_pairs`): the
#: DSP cells of a single product, and LUTs per pair. Two core sizes on each family (32
#: and 64 pairs: the term's form per pair).
UNPACKED_CONFIGS = {
    family: {"b1_16x8_mul_unpacked": ("b1_16x8_mul", dict(dsp_pack=False)),
             "b1_8x8_small_unpacked": ("b1_8x8_small", dict(dsp_pack=False))}
    for family in ("zynq-ultrascale+", "zynq-7000")}


def _with_extensions(configs: dict, extensions: dict) -> dict:
    """`configs` and, after them, each extension config (its base's arguments, changed)."""
    return {**configs, **{name: {**configs[base], **fields}
                          for name, (base, fields) in extensions.items()}}


#: family -> the board whose part is synthesized.
FAMILY_BOARDS = {"zynq-7000": "pynq-z1", "zynq-ultrascale+": "ultra96-v2",
                 "cyclone-v": "de10-nano", "ecp5": "ulx3s-85f"}
#: family -> its configs (name -> HardwareConfig keyword arguments).
FAMILY_CONFIGS = {
    "zynq-7000": _with_extensions(_with_extensions(CONFIGS, EXTENSION_CONFIGS["zynq-7000"]),
                                  UNPACKED_CONFIGS["zynq-7000"]),
    "zynq-ultrascale+": _with_extensions(
        _with_extensions({name: CONFIGS[name] for name in _SMALL},
                         EXTENSION_CONFIGS["zynq-ultrascale+"]),
        UNPACKED_CONFIGS["zynq-ultrascale+"]),
    "cyclone-v": _with_extensions(SMALL_CONFIGS, EXTENSION_CONFIGS["cyclone-v"]),
    "ecp5": SMALL_CONFIGS,
}


#: family -> points the model is *not* fitted to, synthesized by ``--confirm`` to check it:
#: name -> (board, fields replaced in the board's default config). Each is a point of a
#: small sweep over the board (docs/sweeps.md, "The resource model on each family").
CONFIRM = {
    "zynq-7000": {"pynq-z1_8x8": ("pynq-z1", dict(block_in=8, block_out=8,
                                                  wgt_buff_size=64 * K, acc_buff_size=32 * K)),
                  "pynq-z1_8x8_req_hold": ("pynq-z1", dict(block_in=8, block_out=8,
                                                           wgt_buff_size=64 * K,
                                                           acc_buff_size=32 * K, alu_ops=REQ,
                                                           alu_hold=True))},
    "zynq-ultrascale+": {"ultra96-v2_8x8": ("ultra96-v2", dict(block_in=8, block_out=8,
                                                               wgt_buff_size=64 * K,
                                                               acc_buff_size=32 * K)),
                         # One product per DSP on a core no unpacked config is based on.
                         "ultra96-v2_8x8_unpacked": ("ultra96-v2", dict(
                             block_in=8, block_out=8, wgt_buff_size=64 * K,
                             acc_buff_size=32 * K, dsp_pack=False)),
                         # A 2,048-MAC core with every extension but the DSP limit and the
                         # 256-bit bus bridged to the 128-bit HP port: each extension term
                         # and the bus term far out of the small cores they are fitted on.
                         "zcu104-plus": ("zcu104", dict(
                             block_in=32, block_out=64, inp_buff_size=64 * K,
                             wgt_buff_size=1024 * K, acc_buff_size=128 * K, alu_ops=REQ,
                             alu_hold=True, dw_taps=3, dram_bus_width=256))},
    # With both ALU extensions on a config none of the extension configs is based on:
    # the extension terms out of the data they were fitted to.
    "cyclone-v": {"de10-nano_default": ("de10-nano", {}),
                  "de10-nano_default_req_hold": ("de10-nano", dict(alu_ops=REQ,
                                                                   alu_hold=True))},
    "ecp5": {"ulx3s-85f_default": ("ulx3s-85f", {})},
}


def calibration_path(family: str) -> Path:
    return Path(__file__).resolve().parent.parent / "dse" / "calibration" / f"{family}.json"


def calibration_board(board: Board, config: HardwareConfig) -> Board:
    """The board `config` is synthesized on: `board` (the family's calibration board),
    or, for a bus its DRAM port cannot take (`Board.apply`: wider than a port without a
    clock of its own to bridge it), the first board of the same family and port width
    whose port can. yosys's run depends on the family and the Verilog only, neither of
    which the board changes (its clock and DRAM are platform fields), so the netlist is
    the one `board` would give.

    board : the family's calibration board (`FAMILY_BOARDS`)
    config : the config to synthesize
    """
    candidates = [board] + [b for b in BOARDS.values() if b.part.family == board.part.family
                            and b.dram_bus_width == board.dram_bus_width and b is not board]
    for candidate in candidates:
        try:
            candidate.apply(config)
        except ValueError:
            continue
        return candidate
    raise ValueError(f"no {board.part.family} board with {board.name}'s "
                     f"{board.dram_bus_width}-bit DRAM port takes {config.name}'s "
                     f"{config.dram_bus_width}-bit bus")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--table", action="store_true",
                       help="print the calibrated families' fits, confirmations and "
                            "extensions' costs as Markdown (docs/sweeps.md) and stop")
    which.add_argument("--family", choices=sorted(FAMILY_BOARDS),
                       help="family to calibrate (on its board's part, FAMILY_BOARDS)")
    which.add_argument("--board", help="calibrate this board's family on its part")
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="synthesize only these configs (the file keeps the others)")
    parser.add_argument("--redo", action="store_true",
                        help="run configs the file already has again")
    parser.add_argument("--list", action="store_true", help="list the configs and stop")
    parser.add_argument("--confirm", action="store_true",
                        help="synthesize the family's confirmation points (CONFIRM), which "
                             "the model is not fitted to, and record the model's errors")
    args = parser.parse_args(argv)
    if args.table:
        print(table())
        return 0
    board = get_board(args.board or FAMILY_BOARDS[args.family])
    family = board.part.family
    if args.confirm:
        return confirm(family, redo=args.redo)
    family_configs = FAMILY_CONFIGS[family]
    if args.only and set(args.only) - set(family_configs):
        parser.error(f"unknown configs for {family}: {sorted(set(args.only) - set(family_configs))}"
                     f"; known: {', '.join(family_configs)}")
    boards, configs = {}, {}
    for name, kwargs in family_configs.items():
        config = HardwareConfig(**{"dram_bus_width": board.dram_bus_width, **kwargs})
        boards[name] = calibration_board(board, config)
        configs[name] = boards[name].apply(config)
    if args.list:
        for name, config in configs.items():
            elsewhere = f" (on {boards[name].name})" if boards[name] is not board else ""
            print(f"{name:<22} {config.name}{elsewhere}")
        return 0
    path = calibration_path(family)
    data = json.loads(path.read_text()) if path.exists() else {}
    points = data.get("points", {})
    todo = args.only or list(configs)
    start = time.perf_counter()
    for i, name in enumerate(todo, 1):
        config = configs[name]
        done = points.get(name)
        # Compared as hardware (`HardwareConfig.hardware`): a file written before a field
        # was added (alu_hold) holds the same config without that field's default, and
        # one written before the board gave the DRAM's bandwidth holds another platform
        # field (which no netlist depends on).
        if (done and HardwareConfig.from_dict(done["config"]).hardware() == config.hardware()
                and not args.redo):
            print(f"[{i}/{len(todo)}] {name}: in {path.name} already", flush=True)
            continue
        print(f"[{i}/{len(todo)}] {name} ({config.name}) ...", flush=True)
        result = estimate(boards[name], config,
                          log=lambda message: print("  " + message, flush=True))
        if family == "ecp5" and result.fmax_mhz is None:
            print(f"  does not fit {board.part.name} (not placed): left out", flush=True)
            continue
        points[name] = {"config": config.to_dict(), "config_name": config.name,
                        "cells": result.cells, "resources": result.resources.to_dict(),
                        "seconds": round(result.seconds, 1), "tools": result.tools,
                        "fmax_mhz": result.fmax_mhz,
                        **({"board": boards[name].name, "part": boards[name].part.name}
                           if boards[name] is not board else {})}
        print(f"  {result.resources.to_dict()} in {result.seconds:.0f} s"
              + (" (cached)" if result.cached else ""), flush=True)
        data = {**data, "part": board.part.name, "family": family,
                "flow": board.family.yosys + (" + nextpnr-ecp5 (packed counts)"
                                              if family == "ecp5" else ""),
                "board": board.name, "script": "scripts/calibrate_resources.py",
                "tools": result.tools, "points": dict(sorted(points.items()))}
        atomic_write(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
    print(f"{path} holds {len(points)} configs ({time.perf_counter() - start:.0f} s)")
    return 0


def table() -> str:
    """The calibrated families' fits, confirmation points and extensions' costs, as
    Markdown tables."""
    fits = ["| family | calibrated on | configs | worst LUT fit error | FF | BRAM | DSP | "
            "DSP cells per GEMM pair / ALU multiplier / single product | tools | "
            "synthesis time |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    confirmed = ["| family | board | config | LUT model / measured | error | FF error | "
                 "DSP model / measured | BRAM model / measured |",
                 "|---|---|---|---|---|---|---|---|"]
    for family in calibrated_families():
        data = json.loads(calibration_path(family).read_text())
        model = ResourceModel.fit(data)
        worst = {k: max(abs(e[k]) for e in model.fit_errors.values())
                 for k in ("lut", "ff", "bram", "dsp")}
        seconds = [p["seconds"] for p in data["points"].values()]
        cells = " / ".join(", ".join(f"{n} {c}" for c, n in sorted(per.items())) if per
                           else "—" for per in (model.dsp_cells.gemm, model.dsp_cells.mul,
                                                model.dsp_cells.single))
        fits.append(f"| {family} | {data['board']} ({data['part']}) | {len(seconds)} | "
                    f"{100 * worst['lut']:.1f}% | {100 * worst['ff']:.1f}% | "
                    f"{100 * worst['bram']:.1f}% | {100 * worst['dsp']:.0f}% | {cells} | "
                    + ", ".join(f"{k} {v}" for k, v in sorted(data["tools"].items()))
                    + f" | {min(seconds):.0f}–{max(seconds):.0f} s |")
        for name, point in data.get("confirmed", {}).items():
            p, m, e = point["predicted"], point["resources"], point["error"]
            confirmed.append(
                f"| {family} | {point['board']} | {point['config_name']} | "
                f"{p['lut']:,} / {m['lut']:,} | {100 * e['lut']:+.1f}% | "
                f"{100 * e['ff']:+.1f}% | {p['dsp']:g} / {m['dsp']:g} | "
                f"{p['bram']:g} / {m['bram']:g} |")
    return ("\n".join(fits) + "\n\n" + "\n".join(confirmed) + "\n\n" + extension_table()
            + "\n\n" + bus_table() + "\n\n" + pack_table())


def _point_board(data: dict, name: str) -> str:
    """The board calibration point `name` of `data` (a calibration file) was synthesized
    on: its own where it names one (`calibration_board`), else the file's."""
    return data["points"][name].get("board", data["board"])


def _difference_table(column: str, pairs, term: str, amount, shown) -> str:
    """What one feature costs by yosys, family by family: for each pair (the config with
    the feature, the same config without) that ``pairs(points, model)`` finds in a
    family's calibration points, the measured difference beside the model's `term` times
    ``amount(config, model)``. `column` heads the feature's column and ``shown(config,
    model, amount)`` fills it."""
    rows = [f"| family | board | config | {column} | LUT | FF | DSP | BRAM | "
            "model: LUT / FF |", "|---|---|---|---|---|---|---|---|---|"]
    for family in calibrated_families():
        data = json.loads(calibration_path(family).read_text())
        model = ResourceModel.fit(data)
        points = data["points"]
        for name, base in pairs(points, model):
            config = HardwareConfig.from_dict(points[name]["config"])
            m, b = points[name]["resources"], points[base]["resources"]
            units = amount(config, model)
            rows.append(f"| {family} | {_point_board(data, name)} | {config.name} | "
                        f"{shown(config, model, units)} | "
                        f"{m['lut'] - b['lut']:+,} | {m['ff'] - b['ff']:+,} | "
                        f"{m['dsp'] - b['dsp']:+g} | {m['bram'] - b['bram']:+g} | "
                        f"{units * model.lut[term]:+,.0f} / "
                        f"{units * model.ff[term]:+,.0f} |")
    return "\n".join(rows)


def pack_table() -> str:
    """What one product per DSP (`dsp_pack` off) changes by yosys (the unpacked config
    minus the same config packed), next to the model's ``unpacked_pairs`` term."""
    return _difference_table("pairs", lambda points, model: pack_pairs(points),
                             "unpacked_pairs", lambda config, model: unpacked_pairs(config),
                             lambda config, model, pairs: f"{pairs:g}")


def bus_table() -> str:
    """What a DRAM bus wider than the board's port costs by yosys (the config on the wide
    bus minus the same config on the port's), next to the model's ``wide_bus`` term."""
    return _difference_table(
        "bus bits", lambda points, model: bus_pairs(points, model.bus_width), "wide_bus",
        lambda config, model: config.dram_bus_width - model.bus_width,
        lambda config, model, bits: f"{model.bus_width} → {config.dram_bus_width}")


def extension_table() -> str:
    """What each extension past VTA costs by yosys on each family with extension configs:
    the calibration measurements themselves (the config with the extension minus the
    same config without), next to the model's fitted terms for the same difference; one
    term column per `vdla.dse.resources.TERM_EXTENSIONS` term."""
    rows = ["| family | board | config | ALU lanes | LUT | FF | DSP | BRAM | "
            "model: LUT / FF |", "|---|---|---|---|---|---|---|---|---|"]
    terms = ["| family | " + " | ".join(f"{label}: LUT / FF"
                                         for _, label in TERM_EXTENSIONS.values()) + " |",
             "|---" * (1 + len(TERM_EXTENSIONS)) + "|"]
    for family in calibrated_families():
        data = json.loads(calibration_path(family).read_text())
        pairs = extension_pairs(data["points"])
        if not pairs:
            continue
        model = ResourceModel.fit(data)
        points = data["points"]
        for name, base in pairs:
            config = HardwareConfig.from_dict(points[name]["config"])
            m, b = points[name]["resources"], points[base]["resources"]
            f = extension_terms(config)
            fitted = {k: sum(getattr(model, k).get(t, 0.0) * v for t, v in f.items())
                      for k in ("lut", "ff")}
            rows.append(f"| {family} | {_point_board(data, name)} | {config.name} | "
                        f"{config.batch * config.block_out} | {m['lut'] - b['lut']:+,} | "
                        f"{m['ff'] - b['ff']:+,} | {m['dsp'] - b['dsp']:+g} | "
                        f"{m['bram'] - b['bram']:+g} | {fitted['lut']:+,.0f} / "
                        f"{fitted['ff']:+,.0f} |")
        terms.append(f"| {family} | " + " | ".join(
            " / ".join(f"{getattr(model, k)[t]:,.1f}" if t in getattr(model, k) else "—"
                       for k in ("lut", "ff")) for t in TERM_EXTENSIONS) + " |")
    return "\n".join(rows) + "\n\n" + "\n".join(terms)


def confirm(family: str, *, redo: bool = False) -> int:
    """Synthesize `family`'s `CONFIRM` points, compare them with the model's prediction
    and record both under "confirmed" in the family's calibration file (the fit ignores
    them)."""
    path = calibration_path(family)
    data = json.loads(path.read_text())
    model = ResourceModel.fit(data)
    confirmed = data.setdefault("confirmed", {})
    for name, (board_name, fields) in CONFIRM[family].items():
        board = get_board(board_name)
        config = board.apply(HardwareConfig.from_dict({**board.config.to_dict(), **fields}))
        done = confirmed.get(name)
        # Compared as hardware, as in main: a record may predate a field (alu_hold).
        if (done is None or redo
                or HardwareConfig.from_dict(done["config"]).hardware() != config.hardware()):
            print(f"{name} ({config.name}) on {board.part.name} ...", flush=True)
            result = estimate(board, config,
                              log=lambda message: print("  " + message, flush=True))
            done = {"board": board.name, "part": board.part.name,
                    "config": config.to_dict(), "config_name": config.name,
                    "cells": result.cells, "resources": result.resources.to_dict(),
                    "seconds": round(result.seconds, 1), "tools": result.tools,
                    "fmax_mhz": result.fmax_mhz}
        predicted = model.predict(config).to_dict()
        done["predicted"] = predicted
        done["error"] = {k: (predicted[k] - done["resources"][k]) / done["resources"][k]
                         for k in ("lut", "ff", "bram")}
        done["error"]["dsp"] = predicted["dsp"] - done["resources"]["dsp"]
        confirmed[name] = done
        e, m = done["error"], done["resources"]
        print(f"{name:<20} {config.name:<34} LUT {predicted['lut']:>6} vs {m['lut']:>6} "
              f"({100 * e['lut']:+.1f}%)  FF {predicted['ff']:>6} vs {m['ff']:>6} "
              f"({100 * e['ff']:+.1f}%)  DSP {predicted['dsp']:g} vs {m['dsp']:g}  "
              f"BRAM {predicted['bram']:g} vs {m['bram']:g}", flush=True)
        atomic_write(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
