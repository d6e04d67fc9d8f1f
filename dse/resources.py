"""An analytical resource model of the generated hardware, calibrated against yosys.

    model = ResourceModel.for_board(get_board("zcu104"))   # or .for_part / .for_family
    model.predict(config)        # Resources(lut=..., ff=..., dsp=..., bram=...)

A sweep cannot synthesize each point (minutes each; docs/tool-facts.md, yosys), so it
predicts what ``vdla estimate`` would count, from the structure `vdla.hw` generates for
a `HardwareConfig`. There is one model per FPGA **family** (`vdla.boards.board.FAMILIES`),
fitted to ``CALIBRATION_DIR/<family>.json``: yosys's flow depends on the family, not on
the part's size (``synth_xilinx -family xcup`` is the same run for the xczu3eg and the
xczu7ev), so the family's file serves all its parts; it records the board and part it
was run for. A part is looked up through the boards that use it (`family_of`).

* **BRAM** and **DSP** are counted with the family's rules (`vdla.dse.resource_rules`):
  every memory tiled with the family's block RAM modes, and the hard-multiplier cells
  yosys makes of the GEMM core's multipliers and the ALU's, read off the calibration
  data and counted as ``vdla estimate`` counts them. A fitted constant absorbs what the
  block RAM tiling misses (the median over the calibration points); DSP is exact.
* **LUT** and **FF** are linear in the sizes that generate logic (`features`: the GEMM
  core's MACs, the ALU's lanes, the SRAM data widths the DMA engines and read paths
  multiplex, the multiplier lanes), with coefficients fitted by non-negative least
  squares to the calibration data (made by ``scripts/calibrate_resources.py``, which
  records the tools' versions). On the ECP5 they are nextpnr's packed counts, as
  ``vdla estimate`` reports them for a design that fits.
* **Extensions past VTA** (`vdla.extensions`; `extension_terms`: the ALU's REQ, per ALU
  lane; ``alu_hold``, a constant; LUT-built multiplier pairs; the depthwise window, per
  lane and tap; the lookup table, per lane and its DMA; the divide, per lane, and its
  pipeline, per lane) add LUT and
  FF terms fitted to what each adds in the calibration data:
  every calibration config with extensions is paired with the same config without them,
  and the terms are fitted by non-negative least squares to the differences, so the base
  model's error at that config does not leak into an extension's price and the base
  coefficients stay those of the configs without extensions. A family whose calibration
  has no config with an extension cannot price it: `ResourceModel.predict` refuses such a config, naming the
  command that calibrates it (`ResourceModel.unpriced`).
* **One product per DSP** (`dsp_pack` off; the default packs two products that share
  an input into one multiplier) is priced the same way, per pair of products
  (``unpacked_pairs``, `pack_pairs`): what the unpacked config changes in LUTs and FFs
  from the same config packed (the low product's borrow and the wider adder-tree input
  that packing adds, and how yosys maps the trees around them), fitted by least squares
  with its sign (it is a saving); its DSPs are counted from the single product's cells
  (`vdla.dse.resource_rules.DspCells`). A family whose calibration has no unpacked
  config cannot price one.
* **A DRAM bus other than the port's** (a wider bus bridged to the port, `Board.apply`)
  is priced the same way, per bit above the port's width (``wide_bus``, `bus_pairs`):
  the base terms are fitted to the configs on the calibration board's port
  (`ResourceModel.bus_width`), which every board of the family has, so the term counts
  the bits a config's bus has above its board's port (64 to 128 on the 7-series, 128 to
  256 on the UltraScale+). A calibration point on a wide bus may have been synthesized on
  another board of the family (one whose port can bridge it): the pairs are matched as
  hardware (`HardwareConfig.hardware`), which the board does not change.

The errors of the fit on its own data are kept with the model (`fit_errors`), and the
sweep's confirmation step reports the error on the points it synthesizes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Mapping

import numpy as np

from vdla.boards.board import FAMILIES, Board, Resources
from vdla.boards.catalog import BOARDS
from vdla.config import AluOp, HardwareConfig
from vdla.extensions import EXTENSIONS
from vdla.dse.resource_rules import (XILINX_BRAM, DspCells, gemm_multipliers, memories,
                                     mul_lanes, rules_for, unpacked)

__all__ = ["CALIBRATION_DIR", "MIN_POINTS", "ResourceModel", "bram_tiles", "bus_pairs",
           "calibrated_families",
           "calibrated_parts", "calibration_path", "counted_bram", "extension_pairs",
           "extension_terms", "family_of", "features", "gemm_dsps", "pack_pairs",
           "TERM_EXTENSIONS", "unpacked_pairs", "without_extensions"]

#: Where the calibration data lives (one JSON file per family: ``<family>.json``).
CALIBRATION_DIR = Path(__file__).resolve().parent / "calibration"


def bram_tiles(depth: int, width: int) -> float:
    """RAMB36 of the cheapest tiling of a `depth` x `width`-bit memory on Xilinx, RAMB18s
    counting half (`vdla.dse.resource_rules.XILINX_BRAM`)."""
    return XILINX_BRAM.tiles(depth, width)


def counted_bram(c: HardwareConfig, family: str = "zynq-7000") -> float:
    """Block RAMs of `c`'s memories tiled with `family`'s rules."""
    return rules_for(family).counted_bram(c)


def gemm_dsps(c: HardwareConfig) -> int:
    """DSP48s of the GEMM core on Xilinx: one per pair of products with `dsp_pack`, one
    per product without (either way, less those built from LUTs past `gemm_dsp_limit`)."""
    return gemm_multipliers(c)


def unpacked_pairs(c: HardwareConfig) -> float:
    """Pairs of products of `c`'s GEMM core on hard multipliers one product each
    (`dsp_pack` off): the ``unpacked_pairs`` term; 0 for a packed config."""
    if not unpacked(c):
        return 0.0
    return (c.macs_per_cycle - c.gemm_lut_products) / 2


def features(c: HardwareConfig) -> dict[str, float]:
    """The sizes LUT and FF counts are linear in (`ResourceModel` fits a coefficient to
    each): a constant; the GEMM core's MACs (adder trees, product registers); the ALU's
    lanes (accumulator-wide min/max/add/shift); the SRAM data bits the DMA engines
    write and the compute pipeline reads; the ALU lanes with a multiplier."""
    return {"const": 1.0,
            "macs": float(c.batch * c.block_in * c.block_out),
            "alu_lanes": float(c.batch * c.block_out),
            "sram_bits": float(c.inp_elem_bytes * 8 + c.wgt_elem_bytes * 8
                               + c.acc_elem_bytes * 8 + c.out_elem_bytes * 8),
            "mul_lanes": float(mul_lanes(c))}


def extension_terms(c: HardwareConfig) -> dict[str, float]:
    """How much of each extension past VTA `c` has (a LUT/FF term each, fitted to what
    the extension adds to the same config without it; `TERM_EXTENSIONS` says whose): ``req_lanes``, the ALU lanes with REQ
    (each lane gets two int8 comparisons and muxes for the clamp and a mux that writes 0
    to the accumulator; the shift is there already), and ``alu_hold``, 1 with alu_hold
    (a few control flip-flops and a capture enable on the src operand register, the
    same whatever the core's size), and ``lut_pairs``, the GEMM core's multiplier pairs
    built from LUTs past `gemm_dsp_limit` (two 8 x 8 products of shifted adds each, packed
    or not: `HardwareConfig.gemm_lut_products` / 2; the
    DSPs they leave are counted by `vdla.dse.resource_rules.gemm_multipliers`), and
    ``dw_window``, batch · block_out · dw_taps for the depthwise window: its registers
    hold dw_taps columns of block_out channels (8 bits each), and a 2:1 multiplexer
    picks each multiplier input of the 2·dw_taps window columns, one per product pair,
    which is the same count (batch · block_out/2 pairs · 2·dw_taps columns), and the
    ALU's lookup table (TAB) in two: ``tab_lanes``, the ALU lanes with TAB (each lane's
    copy of the table, 256 × 18 bits of LUT RAM: 24 RAM64M on the 7-series, with the
    multiplexer of its four 64-entry quarters; the 8-bit index subtractor; one more input on
    the result multiplexer), and ``tab_dma``, 1 with TAB (the third compute DMA that fills
    the table and its share of the read port: mostly flip-flops, the same whatever the
    core's size), and ``div_lanes``, the ALU lanes with DIV (`vdla.hw.divider`: each
    lane's restoring divider, a 32-bit subtractor, a 31-bit remainder and divisor and an
    8-bit shift register, and one more input on the write port's multiplexers; the issue
    gate's few counters are in the per-lane figure), and ``divp_lanes``, the ALU lanes
    with the pipelined divider (`div_pipeline`, `vdla.hw.divider_pipeline`: each lane's
    8 stages of a subtractor and the registers of a remainder, a divisor and a shift
    register, in place of the sequential divider that ``div_lanes`` prices; the
    scoreboard's comparators are in the per-lane figure)."""
    table = AluOp.TAB in c.alu_ops
    return {"req_lanes": float(c.batch * c.block_out if AluOp.REQ in c.alu_ops else 0),
            "alu_hold": 1.0 if c.alu_hold else 0.0,
            "lut_pairs": c.gemm_lut_products / 2,
            "dw_window": float(c.batch * c.block_out * c.dw_taps),
            "tab_lanes": float(c.batch * c.block_out if table else 0),
            "tab_dma": 1.0 if table else 0.0,
            "div_lanes": float(c.batch * c.block_out if AluOp.DIV in c.alu_ops else 0),
            "divp_lanes": float(c.batch * c.block_out if c.div_pipeline else 0)}


#: Each `extension_terms` term: the extension it prices (its `vdla.extensions` key) and
#: what one unit of it is, for tables; a test keeps every extension priced by a term (the
#: table by two: its lanes and its DMA).
TERM_EXTENSIONS = {"req_lanes": ("req", "REQ per ALU lane"), "alu_hold": ("hold", "alu_hold"),
                   "lut_pairs": ("dsp", "LUT-built pair"),
                   "dw_window": ("dw", "dw window per lane and tap"),
                   "tab_lanes": ("tab", "table per ALU lane"),
                   "tab_dma": ("tab", "table DMA"),
                   "div_lanes": ("div", "divider per ALU lane"),
                   "divp_lanes": ("divp", "divider pipeline per ALU lane")}


def without_extensions(c: HardwareConfig) -> HardwareConfig:
    """`c` without any extension past VTA (the config an extension's cost is measured
    against)."""
    for ext in EXTENSIONS:     # one at a time: the ALU ops' extensions share alu_ops
        c = c.replace(**ext.without(c))
    return c


def calibration_path(family: str) -> Path:
    return CALIBRATION_DIR / f"{family}.json"


#: Calibration configs without extensions past VTA a family needs: two more than the
#: base LUT/FF model has features (the extension terms are fitted to the differences
#: that configs with extensions make, `extension_pairs`).
MIN_POINTS = len(features(HardwareConfig())) + 2


def _has_extensions(config: Mapping) -> bool:
    return any(extension_terms(HardwareConfig.from_dict(config)).values())


def _is_base(config: Mapping) -> bool:
    """Whether a calibration config is one the base LUT/FF terms can be fitted to: no
    extension past VTA, packed."""
    return not _has_extensions(config) and HardwareConfig.from_dict(config).dsp_pack


def extension_pairs(points: Mapping[str, Mapping]) -> list[tuple[str, str]]:
    """(config with extensions, the same config without them) for each calibration point
    (name -> point, as in a calibration file) with extensions past VTA; ValueError naming
    a point whose config without extensions is not calibrated (their cost would be
    unknown)."""
    # As hardware, as `bus_pairs`: a point may have been synthesized on another board of
    # the family, or recorded before its board gave the DRAM's bandwidth (platform fields).
    bases = {HardwareConfig.from_dict(p["config"]).hardware(): name
             for name, p in points.items() if not _has_extensions(p["config"])}
    pairs = []
    for name, point in points.items():
        config = HardwareConfig.from_dict(point["config"])
        if any(extension_terms(config).values()):
            base = without_extensions(config).hardware()
            if base not in bases:
                raise ValueError(f"calibration config {name!r} ({config.name}) has extensions "
                                 f"past VTA but its config without them ({base.name}) is not "
                                 "calibrated: the extensions' cost is what they add to it; "
                                 "calibrate that config too (scripts/calibrate_resources.py)")
            pairs.append((name, bases[base]))
    return pairs


def _base_bus_width(configs) -> int:
    """The DRAM bus most of `configs` have (a family's calibration: its board's port)."""
    widths = [c.dram_bus_width for c in configs]
    return max(sorted(set(widths)), key=widths.count)


def pack_pairs(points: Mapping[str, Mapping]) -> list[tuple[str, str]]:
    """(config with one product per DSP, the same config packed) for each calibration
    point (name -> point) with `dsp_pack` off; ValueError naming a point whose packed
    counterpart is not calibrated (what unpacking changes is measured against it)."""
    configs = {HardwareConfig.from_dict(p["config"]).hardware(): name
               for name, p in points.items()}
    pairs = []
    for config, name in configs.items():
        if unpacked(config):
            base = config.replace(dsp_pack=True)
            if base not in configs:
                raise ValueError(f"calibration config {name!r} ({config.name}) has one "
                                 f"product per DSP but the same config packed ({base.name}) "
                                 "is not calibrated: unpacking's cost is what it changes "
                                 "there; calibrate that config too "
                                 "(scripts/calibrate_resources.py)")
            pairs.append((name, configs[base]))
    return sorted(pairs)


def bus_pairs(points: Mapping[str, Mapping], bus_width: int) -> list[tuple[str, str]]:
    """(config with another DRAM bus than `bus_width`, the same config with it) for each
    calibration point (name -> point) whose bus differs; ValueError naming a point whose
    counterpart is not calibrated. A bus wider than the port (bridged, `Board.apply`)
    widens the DMA engines' word registers and the paths between bus words and SRAM
    rows: the ``wide_bus`` term, per bit, is fitted to what it adds."""
    # As hardware: the board gives a bridged bus more bytes a cycle (a platform field).
    configs = {HardwareConfig.from_dict(p["config"]).hardware(): name
               for name, p in points.items()}
    pairs = []
    for config, name in configs.items():
        if config.dram_bus_width != bus_width:
            base = config.replace(dram_bus_width=bus_width).hardware()
            if base not in configs:
                raise ValueError(f"calibration config {name!r} ({config.name}) has a "
                                 f"{config.dram_bus_width}-bit DRAM bus but the same config "
                                 f"with the family's {bus_width} bits ({base.name}) is not "
                                 "calibrated: the bus's cost is what it adds to it; calibrate "
                                 "that config too (scripts/calibrate_resources.py)")
            pairs.append((name, configs[base]))
    return sorted(pairs)


def calibrated_families() -> list[str]:
    """The families with a complete calibration file (at least `MIN_POINTS` configs
    without extensions past VTA; a file with fewer is a calibration run not finished
    yet)."""
    found = []
    for path in CALIBRATION_DIR.glob("*.json"):
        points = json.loads(path.read_text()).get("points", {}).values()
        if path.stem in FAMILIES and sum(_is_base(p["config"])
                                         for p in points) >= MIN_POINTS:
            found.append(path.stem)
    return sorted(found)


def family_of(part: str) -> str | None:
    """The family of a part that one of vdla's boards uses (None for any other part)."""
    return next((b.part.family for b in BOARDS.values() if b.part.name == part), None)


def calibrated_parts() -> list[str]:
    """The boards' parts whose family has a calibration."""
    families = set(calibrated_families())
    return sorted({b.part.name for b in BOARDS.values() if b.part.family in families})


def _nnls(a: np.ndarray, b: np.ndarray, iters: int = 2000) -> np.ndarray:
    """Non-negative least squares by projected coordinate descent (a handful of columns;
    scipy is not a dependency). Columns are scaled first so one step size suits all."""
    scale = np.maximum(np.abs(a).max(axis=0), 1e-12)
    a_s = a / scale
    x = np.maximum(np.linalg.lstsq(a_s, b, rcond=None)[0], 0)
    gram, rhs = a_s.T @ a_s, a_s.T @ b
    for _ in range(iters):
        for j in range(len(x)):
            if gram[j, j] > 0:
                x[j] = max(0.0, x[j] + (rhs[j] - gram[j] @ x) / gram[j, j])
    return x / scale


def _calibrate_hint(family: str) -> str:
    return (f"run `python scripts/calibrate_resources.py --family {family}` to make one "
            "(see docs/sweeps.md)")


@dataclasses.dataclass(frozen=True)
class ResourceModel:
    """The resource model of one family, fitted to its calibration data.

    family : the family (`vdla.boards.board.FAMILIES`; the calibration file's stem)
    part : the part the calibration ran for (yosys's counts do not depend on it)
    lut, ff : feature name -> coefficient (`features`, and the `extension_terms` the
        calibration has configs with)
    bram_offset : block RAMs that the counted tiling misses (fitted constant)
    dsp_cells : the hard-multiplier cells of each multiplier (`DspCells`)
    tools : the versions of the tools the calibration ran
    fit_errors : the fit's relative error per resource on each calibration config
    bus_width : the DRAM bus of the configs the base terms are fitted to (the family's
        board's port); the ``wide_bus`` term, where the calibration has it, prices each
        bit a config's bus differs by (`bus_pairs`)
    """

    part: str
    family: str
    lut: Mapping[str, float]
    ff: Mapping[str, float]
    bram_offset: float
    dsp_cells: DspCells
    tools: Mapping[str, str]
    points: int
    fit_errors: Mapping[str, Mapping[str, float]]
    bus_width: int = 64

    @classmethod
    def for_family(cls, family: str) -> "ResourceModel":
        """The model of `family`, fitted to ``CALIBRATION_DIR/<family>.json``; ValueError
        naming the calibrated families and how to calibrate another."""
        return cls._load(family)

    @classmethod
    @functools.cache
    def _load(cls, family: str) -> "ResourceModel":
        path = calibration_path(family)
        if not path.exists():
            known = ", ".join(calibrated_families()) or "none"
            what = (f"family {family!r}" if family in FAMILIES
                    else f"family {family!r} (not one of vdla's: {', '.join(FAMILIES)})")
            raise ValueError(f"no resource model for {what}; calibrated families: {known}; "
                             + _calibrate_hint(family))
        return cls.fit(json.loads(path.read_text()))

    @classmethod
    def for_part(cls, part: str) -> "ResourceModel":
        """The model of `part`'s family (a part of one of vdla's boards)."""
        family = family_of(part)
        if family is None:
            known = ", ".join(calibrated_families()) or "none"
            raise ValueError(f"no resource model for part {part!r}: no board of vdla uses it, "
                             f"so its family is unknown (calibrated families: {known}); add "
                             "a board on that part (boards/catalog.py) and calibrate its "
                             "family with `python scripts/calibrate_resources.py --board "
                             "BOARD`")
        try:
            return cls.for_family(family)
        except ValueError as exc:
            raise ValueError(f"no resource model for part {part!r}: {exc}") from None

    @classmethod
    def for_board(cls, board: Board) -> "ResourceModel":
        """The model of `board`'s family; ValueError naming the board and its part."""
        try:
            return cls.for_family(board.part.family)
        except ValueError as exc:
            raise ValueError(f"no resource model for {board.name} ({board.part.name}): "
                             f"{exc}") from None

    @classmethod
    def fit(cls, data: Mapping) -> "ResourceModel":
        """Fit to a calibration document (``scripts/calibrate_resources.py``'s JSON): the
        base LUT/FF terms and the block RAM offset to the configs without extensions past
        VTA, the extension terms to what they add (`extension_pairs`), the DSP cells to
        all."""
        family = data["family"]
        rules = rules_for(family)
        named = list(data["points"].items())
        configs = {name: HardwareConfig.from_dict(p["config"]) for name, p in named}
        measured = {name: p["resources"] for name, p in named}
        bus_width = _base_bus_width(configs.values())
        base = [name for name, _ in named if not any(extension_terms(configs[name]).values())
                and configs[name].dram_bus_width == bus_width
                and not unpacked(configs[name])]
        if len(base) < MIN_POINTS:
            raise ValueError(f"{family}: {len(base)} calibration configs without extensions "
                             f"past VTA; the model needs at least {MIN_POINTS}, two more "
                             f"than its LUT/FF features: finish the calibration with `python "
                             f"scripts/calibrate_resources.py --family {family}`")
        names = list(features(configs[base[0]]))
        a = np.array([[features(configs[n])[k] for k in names] for n in base])
        coef = {}
        for key in ("lut", "ff"):
            b = np.array([measured[n][key] for n in base], dtype=float)
            coef[key] = dict(zip(names, _nnls(a, b).tolist()))
        pairs = extension_pairs(data["points"])
        if pairs:
            # Only the terms some config has: an extension no config has stays unpriced.
            terms = [t for t in extension_terms(configs[pairs[0][0]])
                     if any(extension_terms(configs[n])[t] for n, _ in pairs)]
            a = np.array([[extension_terms(configs[n])[t] for t in terms] for n, _ in pairs])
            for key in ("lut", "ff"):
                b = np.array([measured[n][key] - measured[m][key] for n, m in pairs], float)
                coef[key].update(zip(terms, _nnls(a, b).tolist()))
        wide = bus_pairs(data["points"], bus_width)
        if wide:
            a = np.array([[configs[n].dram_bus_width - bus_width] for n, _ in wide], float)
            for key in ("lut", "ff"):
                b = np.array([measured[n][key] - measured[m][key] for n, m in wide], float)
                coef[key]["wide_bus"] = float(np.linalg.lstsq(a, b, rcond=None)[0][0])
        packs = pack_pairs(data["points"])
        if packs:
            a = np.array([[unpacked_pairs(configs[n])] for n, _ in packs])
            for key in ("lut", "ff"):
                b = np.array([measured[n][key] - measured[m][key] for n, m in packs], float)
                coef[key]["unpacked_pairs"] = float(np.linalg.lstsq(a, b, rcond=None)[0][0])
        offsets = [measured[n]["bram"] - rules.counted_bram(configs[n]) for n in base]
        # Every config, those with extensions too: one that made yosys use a hard
        # multiplier would make their cells differ, and the fit refuses that.
        dsp_cells = DspCells.derive(rules.dsp_prefixes,
                                    [(name, configs[name], p["cells"]) for name, p in named])
        model = cls(part=data["part"], family=family, lut=coef["lut"], ff=coef["ff"],
                    bram_offset=float(np.median(offsets)), dsp_cells=dsp_cells,
                    tools=dict(data.get("tools", {})), points=len(named), fit_errors={},
                    bus_width=bus_width)
        errors = {}
        for name, c in configs.items():
            p, m = model.predict(c), measured[name]
            errors[name] = {k: (getattr(p, k) - m[k]) / m[k] if m[k] else 0.0
                            for k in Resources.KEYS}
        return dataclasses.replace(model, fit_errors=errors)

    def unpriced(self, config: HardwareConfig) -> list[str]:
        """The extensions past VTA of `config` (`extension_terms`) this family's
        calibration has no config with, so cannot price."""
        missing = [t for t, v in extension_terms(config).items() if v and t not in self.lut]
        if unpacked_pairs(config) and ("unpacked_pairs" not in self.lut
                                       or self.dsp_cells.single is None):
            missing.append("one product per DSP (dsp_pack off)")
        if config.dram_bus_width != self.bus_width and "wide_bus" not in self.lut:
            missing.append(f"a {config.dram_bus_width}-bit DRAM bus (calibrated: "
                           f"{self.bus_width} bits)")
        return missing

    def check_priced(self, config: HardwareConfig) -> None:
        """ValueError naming the extensions of `config` this model cannot price
        (`unpriced`) and the command that calibrates them."""
        missing = self.unpriced(config)
        if missing:
            raise ValueError(
                f"the {self.family} resource model cannot price {', '.join(missing)} "
                f"({config.name}): its calibration has no config with it; add one to "
                "EXTENSION_CONFIGS (UNPACKED_CONFIGS for dsp_pack) in "
                "scripts/calibrate_resources.py and run `python "
                f"scripts/calibrate_resources.py --family {self.family}`")

    @property
    def rules(self):
        return rules_for(self.family)

    @property
    def mul_dsps(self) -> float:
        """DSPs of one ALU lane's multiplier alone."""
        return self.rules.dsp(self.dsp_cells.mul)

    def predict(self, config: HardwareConfig) -> Resources:
        """LUT, FF, DSP and BRAM of `config` as ``vdla estimate`` would count them;
        ValueError when `config` has an extension past VTA the calibration cannot
        price."""
        self.check_priced(config)
        f = {**features(config), **{t: v for t, v in extension_terms(config).items() if v}}
        if config.dram_bus_width != self.bus_width:
            f["wide_bus"] = float(config.dram_bus_width - self.bus_width)
        if unpacked_pairs(config):
            f["unpacked_pairs"] = unpacked_pairs(config)
        lut = sum(self.lut[n] * v for n, v in f.items())
        ff = sum(self.ff[n] * v for n, v in f.items())
        dsp = self.rules.dsp(self.dsp_cells.cells(config))
        bram = max(0.0, self.rules.counted_bram(config) + self.bram_offset)
        return Resources(lut=round(lut), ff=round(ff), dsp=dsp, bram=bram)

    def describe(self) -> str:
        worst = {k: max(abs(e[k]) for e in self.fit_errors.values()) for k in Resources.KEYS}
        return (f"resource model of {self.family} (calibrated on {self.part}): fitted to "
                f"{self.points} runs ({', '.join(f'{k}={v}' for k, v in self.tools.items())}); "
                "worst fit error "
                + ", ".join(f"{k.upper()} {100 * v:.1f}%" for k, v in worst.items()))
