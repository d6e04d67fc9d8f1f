"""An analytical resource model of the generated hardware, calibrated against yosys.

    model = ResourceModel.for_part("xc7z020clg400-1")
    model.predict(config)        # Resources(lut=..., ff=..., dsp=..., bram=...)

A sweep cannot synthesize each point (minutes each; docs/tool-facts.md, yosys), so it
predicts what ``vdla estimate`` (yosys) would count, from the structure `vdla.hw`
generates for a `HardwareConfig`:

* **BRAM** is counted, not fitted: every on-chip memory (the uop, inp, wgt, acc and out
  buffers, and the three command queues of 128-bit instructions) is tiled with the
  block RAM's aspect ratios (a RAMB36 holds 512 x 64, 1K x 32, 2K x 16, 4K x 8, 8K x 4,
  16K x 2 or 32K x 1 data bits; a RAMB18 half of that) and the cheapest tiling is taken,
  as yosys's memory mapping does. The write lanes are bus words (the DMA fills an
  element one bus word at a time), so the byte enables never force narrower tiles. A
  fitted constant absorbs what the sum misses (a half RAMB36 in the default config).
* **DSP** is counted: the GEMM core's multipliers (two int8 products share one DSP48E1 when
  block_out is even, `vdla.hw.compute`), plus, with the ALU's MUL, the DSPs of one
  32 x 32 multiplier per ALU lane; the DSPs per such multiplier are read off the
  calibration data (they must be the same integer on every calibrated config).
* **LUT** and **FF** are linear in the sizes that generate logic (the GEMM core's MACs,
  the ALU's lanes, the SRAM data widths the DMA engines and read paths multiplex, the
  MUL lanes), with coefficients fitted by non-negative least squares to the calibration
  data (`CALIBRATION_DIR`, made by ``scripts/calibrate_resources.py`` with the yosys
  version it records).

The errors of the fit on its own data are kept with the model (`fit_errors`), and the
sweep's confirmation step reports the error on the points it synthesizes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Mapping

import numpy as np

from vdla.boards.board import Resources
from vdla.config import AluOp, INSN_BITS, HardwareConfig

__all__ = ["CALIBRATION_DIR", "ResourceModel", "bram_tiles", "calibrated_parts", "features"]

#: Where the calibration data lives (one JSON file per part).
CALIBRATION_DIR = Path(__file__).resolve().parent / "calibration"

#: (depth, data bits) aspect ratios of one RAMB36 (Xilinx 7-series and UltraScale+).
_RAMB36 = ((512, 64), (1024, 32), (2048, 16), (4096, 8), (8192, 4), (16384, 2), (32768, 1))
#: The multiplier bits of one ALU lane with MUL (int32 x int32).
_MUL_BITS = 32


def bram_tiles(depth: int, width: int) -> float:
    """RAMB36 of the cheapest tiling of a `depth` x `width`-bit memory, RAMB18s counting
    half. A RAMB18 has the RAMB36's aspect ratios at half the depth, except that its
    widest mode is 512 x 32: there is no 256 x 64 (a shallow, 64-bit-wide memory takes
    whole RAMB36s or two RAMB18s side by side)."""
    best = math.inf
    for d, w in _RAMB36:
        options = [(1.0, d, w), (0.5, d // 2, w) if d > 512 else (0.5, d, w // 2)]
        for blocks, block_depth, block_width in options:
            n = math.ceil(width / block_width) * math.ceil(depth / block_depth) * blocks
            best = min(best, n)
    return best


def _memories(c: HardwareConfig) -> dict[str, tuple[int, int]]:
    """name -> (depth, data bits) of every memory that maps to block RAM."""
    return {"uop": (c.uop_depth, c.uop_bits), "inp": (c.inp_depth, c.inp_elem_bytes * 8),
            "wgt": (c.wgt_depth, c.wgt_elem_bytes * 8), "acc": (c.acc_depth, c.acc_elem_bytes * 8),
            "out": (c.out_depth, c.out_elem_bytes * 8),
            **{f"{q}_queue": (c.cmd_queue_depth, INSN_BITS) for q in ("load", "compute", "store")}}


def counted_bram(c: HardwareConfig) -> float:
    return sum(bram_tiles(d, w) for d, w in _memories(c).values())


def gemm_dsps(c: HardwareConfig) -> int:
    """DSPs of the GEMM core: one per pair of products when block_out is even."""
    products = c.batch * c.block_in * c.block_out
    return products // 2 if c.block_out % 2 == 0 else products


def features(c: HardwareConfig) -> dict[str, float]:
    """The sizes LUT and FF counts are linear in (`ResourceModel` fits a coefficient to
    each): a constant; the GEMM core's MACs (adder trees, product registers); the ALU's
    lanes (accumulator-wide min/max/add/shift); the SRAM data bits the DMA engines
    write and the compute pipeline reads; the ALU lanes with a multiplier."""
    mul = AluOp.MUL in c.alu_ops
    return {"const": 1.0,
            "macs": float(c.batch * c.block_in * c.block_out),
            "alu_lanes": float(c.batch * c.block_out),
            "sram_bits": float(c.inp_elem_bytes * 8 + c.wgt_elem_bytes * 8
                               + c.acc_elem_bytes * 8 + c.out_elem_bytes * 8),
            "mul_lanes": float(c.batch * c.block_out) if mul else 0.0}


def calibrated_parts() -> list[str]:
    return sorted(p.stem for p in CALIBRATION_DIR.glob("*.json"))


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


@dataclasses.dataclass(frozen=True)
class ResourceModel:
    """The resource model of one part, fitted to its calibration data.

    part : the part name (the calibration file's stem)
    family : its family (`vdla.boards.board.FAMILIES`)
    lut, ff : feature name -> coefficient
    bram_offset : RAMB36 that the counted tiling misses (fitted constant)
    mul_dsps : DSPs of one ALU lane's multiplier
    tools : the versions of the tools the calibration ran
    fit_errors : the fit's relative error per resource on each calibration config
    """

    part: str
    family: str
    lut: Mapping[str, float]
    ff: Mapping[str, float]
    bram_offset: float
    mul_dsps: int
    tools: Mapping[str, str]
    points: int
    fit_errors: Mapping[str, Mapping[str, float]]

    @classmethod
    @functools.cache
    def for_part(cls, part: str) -> "ResourceModel":
        """The model of `part`, fitted to ``CALIBRATION_DIR/<part>.json``; ValueError
        naming the calibrated parts and how to calibrate another."""
        path = CALIBRATION_DIR / f"{part}.json"
        if not path.exists():
            known = ", ".join(calibrated_parts()) or "none"
            raise ValueError(f"no resource model for part {part!r} (calibrated: {known}); "
                             "run `python scripts/calibrate_resources.py --board BOARD` with "
                             "a board on that part to make one")
        return cls.fit(json.loads(path.read_text()))

    @classmethod
    def fit(cls, data: Mapping) -> "ResourceModel":
        """Fit to a calibration document (``scripts/calibrate_resources.py``'s JSON)."""
        points = list(data["points"].values())
        if len(points) < 3:
            raise ValueError(f"{data.get('part')}: {len(points)} calibration points; the "
                             "model needs at least 3")
        configs = [HardwareConfig.from_dict(p["config"]) for p in points]
        measured = [p["resources"] for p in points]
        names = list(features(configs[0]))
        a = np.array([[features(c)[n] for n in names] for c in configs])
        coef = {}
        for key in ("lut", "ff"):
            b = np.array([m[key] for m in measured], dtype=float)
            coef[key] = dict(zip(names, _nnls(a, b).tolist()))
        offsets = [m["bram"] - counted_bram(c) for c, m in zip(configs, measured)]
        bram_offset = float(np.median(offsets))
        mul_dsps = set()
        for c, m in zip(configs, measured):
            lanes = features(c)["mul_lanes"]
            if lanes:
                extra = m["dsp"] - gemm_dsps(c)
                mul_dsps.add(extra / lanes)
        if len(mul_dsps) > 1:
            raise ValueError(f"{data.get('part')}: the ALU multiplier's DSPs per lane differ "
                             f"between calibration configs ({sorted(mul_dsps)}): the DSP "
                             "count is no longer structural; update vdla.dse.resources")
        model = cls(part=data["part"], family=data["family"], lut=coef["lut"], ff=coef["ff"],
                    bram_offset=bram_offset,
                    mul_dsps=int(mul_dsps.pop()) if mul_dsps else _default_mul_dsps(),
                    tools=dict(data.get("tools", {})), points=len(points), fit_errors={})
        errors = {}
        for name, c, m in zip(data["points"], configs, measured):
            p = model.predict(c)
            errors[name] = {k: (getattr(p, k) - m[k]) / m[k] if m[k] else 0.0
                            for k in Resources.KEYS}
        return dataclasses.replace(model, fit_errors=errors)

    def predict(self, config: HardwareConfig) -> Resources:
        """LUT, FF, DSP and BRAM of `config` as yosys would count them on this part."""
        f = features(config)
        lut = sum(self.lut[n] * v for n, v in f.items())
        ff = sum(self.ff[n] * v for n, v in f.items())
        dsp = gemm_dsps(config) + self.mul_dsps * int(f["mul_lanes"])
        bram = max(0.0, counted_bram(config) + self.bram_offset)
        return Resources(lut=round(lut), ff=round(ff), dsp=dsp, bram=bram)

    def describe(self) -> str:
        worst = {k: max(abs(e[k]) for e in self.fit_errors.values()) for k in Resources.KEYS}
        return (f"resource model of {self.part}: fitted to {self.points} yosys runs "
                f"({', '.join(f'{k}={v}' for k, v in self.tools.items())}); worst fit error "
                + ", ".join(f"{k.upper()} {100 * v:.1f}%" for k, v in worst.items()))


def _default_mul_dsps() -> int:
    """DSP48E1 (25 x 18) tiles of a 32 x 32 multiplier, for calibrations without MUL."""
    return math.ceil(_MUL_BITS / 25) * math.ceil(_MUL_BITS / 18)
