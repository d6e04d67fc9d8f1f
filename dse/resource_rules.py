"""The counted part of the resource model: each family's block RAM tiling and DSP cells.

`vdla.dse.resources` fits LUT and FF; block RAM and DSP are *counted* from the structure
`vdla.hw` generates, with one rule per FPGA family (`RULES`), so that they follow the
counting of ``vdla estimate`` (`vdla.boards.estimate.count_resources`):

* **Block RAM.** Every on-chip memory (`memories`: the uop, inp, wgt, acc and out buffers
  and the three 128-bit command queues) is tiled with the family's block RAM modes
  (depth x data bits, parity bits included: yosys uses them as data), and the cheapest
  tiling is taken, as yosys's memory mapping does. A memory the DMA fills one bus word
  at a time has a write enable per bus word (its *lanes*); where a block's write enables
  are per 9-bit byte, each lane takes whole bytes (a 64-bit lane 8 of them, 72 bits; a
  128-bit lane 15, 135 bits; a 32-bit lane 4, 36 bits).

  - Xilinx (7-series and UltraScale+): RAMB36 of 512 x 72, 1K x 36, 2K x 18, 4K x 9,
    8K x 4, 16K x 2, 32K x 1; a RAMB18 of the same depths halved counts one half (its
    widest mode is 512 x 36: there is no 256 x 72). This reproduces yosys's count of
    every calibration config on both families, up to a constant: one RAMB36 more on the
    7-series for a small memory that UltraScale+ puts in LUT RAM (the fitted offset).
  - Cyclone V: M10K of 8K x 1, 4K x 2, 2K x 5, 1K x 10, 512 x 20, 256 x 40 (yosys's
    ``bram_m10k.txt``). yosys's M10K model has no byte enables, and yosys maps a memory
    with write lanes (inp, wgt, acc) into M10Ks two bits wide (4K x 2, or 8K x 1), about
    one block per two bits of width, four to five times what the widest mode would
    take (docs/boards.md); the other memories take the cheapest mode.
  - ECP5: an EBR (DP16KD, or PDPW16KD for the 36-bit mode) of 16K x 1, 8K x 2, 4K x 4,
    2K x 9, 1K x 18, 512 x 36 bits, with one enable per 9-bit byte.
* **DSP.** The GEMM core has `gemm_multipliers` multipliers (with `dsp_pack`, two int8
  products share one, `vdla.hw.gemm_forms.packed_products`: a 25-bit packed weight times
  the 8-bit input; without it, an 8 x 8 multiplier per product), and with the ALU's MUL
  each ALU lane has one 32 x 32 multiplier (its low 32 bits). yosys maps each of the
  three kinds to the same hard-multiplier cells every time; which cells (`DspCells`) is
  read off the calibration data by `DspCells.derive` (it refuses data where they differ
  between configs), and the cells
  are counted with ``vdla estimate``'s rule: DSP48E1/E2 one each, MULT18X18D one each,
  Cyclone V blocks with a 27x27 multiplier one, an 18x18 half and a 9x9 a third.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Mapping

from vdla.boards.estimate import count_resources
from vdla.config import AluOp, INSN_BITS, HardwareConfig

__all__ = ["BlockRam", "DspCells", "Memory", "RULES", "FamilyRules", "gemm_multipliers",
           "memories", "mul_lanes", "rules_for", "unpacked"]


@dataclasses.dataclass(frozen=True)
class Memory:
    """One on-chip memory: `depth` elements of `width` bits, written `lanes` bus words
    to an element (each lane with its own write enable)."""

    name: str
    depth: int
    width: int
    lanes: int = 1


def memories(c: HardwareConfig) -> list[Memory]:
    """Every memory of `c` that maps to block RAM (the DMA engines fill an element one
    bus word at a time: ``vdla.hw.dma.LoadDma.lanes``)."""
    bus_bytes = c.dram_bus_width // 8

    def lanes(elem_bytes: int) -> int:
        return max(1, elem_bytes // bus_bytes)

    # A command queue is an amaranth SyncFIFOBuffered: a memory one shallower than the
    # queue, plus its output register.
    return [Memory("uop", c.uop_depth, c.uop_bits, lanes(c.uop_bytes)),
            Memory("inp", c.inp_depth, c.inp_elem_bytes * 8, lanes(c.inp_elem_bytes)),
            Memory("wgt", c.wgt_depth, c.wgt_elem_bytes * 8, lanes(c.wgt_elem_bytes)),
            Memory("acc", c.acc_depth, c.acc_elem_bytes * 8, lanes(c.acc_elem_bytes)),
            Memory("out", c.out_depth, c.out_elem_bytes * 8),
            *(Memory(f"{q}_queue", c.cmd_queue_depth - 1, INSN_BITS)
              for q in ("load", "compute", "store"))]


def gemm_multipliers(c: HardwareConfig) -> int:
    """Hard multipliers of the GEMM core: one per pair of products with `dsp_pack`, else
    one per product (`HardwareConfig.gemm_multipliers`), less those built from LUTs past
    `gemm_dsp_limit`."""
    return c.gemm_multipliers - c.gemm_lut_multipliers


def unpacked(c: HardwareConfig) -> bool:
    """Whether `c`'s GEMM multipliers are single products of `dsp_pack` off (a core with
    block_out = 1 has no pair to pack either, but stores `dsp_pack` on: its products are
    counted with the pair's cells, as before the setting existed; on the Xilinx
    families both are one DSP48)."""
    return not c.dsp_pack


def mul_lanes(c: HardwareConfig) -> int:
    """ALU lanes with a 32 x 32 multiplier (none without the ALU's MUL)."""
    return c.batch * c.block_out if AluOp.MUL in c.alu_ops else 0


# --- block RAM --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BlockRam:
    """A family's block RAM as yosys maps memories into it.

    unit : the counted block's name (RAMB36, M10K, EBR)
    modes : (depth, data bits) of one block in each of its aspect ratios, parity bits
        included (yosys uses them as data)
    half_modes : (depth, data bits) of a half block (RAMB18), counted as 0.5; none
        elsewhere
    byte_bits : the bits of one write-enable byte in the modes at least that wide (9:
        eight data bits and a parity bit); a memory with write lanes gives each lane whole
        bytes, so a 128-bit lane takes 15 of them (135 bits), a 64-bit lane 8 (72 bits).
        None: the block has one write enable per port
    lane_modes : the only modes a memory with write lanes can use, where not all
        (Cyclone V: yosys maps such a memory into M10Ks of 4K x 2 or 8K x 1)
    """

    unit: str
    modes: tuple[tuple[int, int], ...]
    half_modes: tuple[tuple[int, int], ...] = ()
    byte_bits: int | None = None
    lane_modes: tuple[tuple[int, int], ...] | None = None

    def columns(self, width: int, lanes: int, block_width: int) -> int:
        """Blocks side by side that hold `width` bits written in `lanes` lanes."""
        if lanes > 1 and self.byte_bits and block_width >= self.byte_bits:
            lane = -(-width // lanes)
            nbytes = lanes * -(-lane // self.byte_bits)
            return -(-nbytes // (block_width // self.byte_bits))
        return -(-width // block_width)

    def tiles(self, depth: int, width: int, lanes: int = 1) -> float:
        """Blocks of the cheapest tiling of a `depth` x `width`-bit memory with `lanes`
        write lanes (half blocks counting 0.5)."""
        if depth <= 0 or width <= 0:
            return 0.0
        best = math.inf
        full = self.lane_modes if lanes > 1 and self.lane_modes else self.modes
        for blocks, modes in ((1.0, full), (0.5, self.half_modes)):
            for d, w in modes:
                best = min(best, blocks * self.columns(width, lanes, w) * math.ceil(depth / d))
        return best


_RAMB36 = ((512, 72), (1024, 36), (2048, 18), (4096, 9), (8192, 4), (16384, 2), (32768, 1))
#: RAMB18: the RAMB36's modes at half the depth, but no 256 x 72 (its widest is 512 x 36).
_RAMB18 = ((512, 36), (1024, 18), (2048, 9), (4096, 4), (8192, 2), (16384, 1))

XILINX_BRAM = BlockRam("RAMB36", _RAMB36, _RAMB18, byte_bits=9)
M10K = BlockRam("M10K", ((8192, 1), (4096, 2), (2048, 5), (1024, 10), (512, 20), (256, 40)),
                lane_modes=((8192, 1), (4096, 2)))
EBR = BlockRam("EBR", ((16384, 1), (8192, 2), (4096, 4), (2048, 9), (1024, 18), (512, 36)),
               byte_bits=9)


# --- DSP --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DspCells:
    """The hard-multiplier cells yosys makes of each kind of multiplier.

    gemm : cell type -> count for one GEMM multiplier of a packed pair (`dsp_pack`,
        `gemm_multipliers`)
    mul : cell type -> count for one ALU lane's 32 x 32 multiplier
    single : cell type -> count for one GEMM multiplier of a single product (`dsp_pack`
        off); None when no calibration config is unpacked (the model refuses such a
        config, `vdla.dse.resources.ResourceModel.unpriced`)
    """

    gemm: Mapping[str, int]
    mul: Mapping[str, int]
    single: Mapping[str, int] | None = None

    def cells(self, c: HardwareConfig) -> dict[str, int]:
        out: dict[str, int] = {}
        gemm = self.single if unpacked(c) else self.gemm
        for per, n in ((gemm or {}, gemm_multipliers(c)), (self.mul, mul_lanes(c))):
            for cell, k in per.items():
                if k * n:
                    out[cell] = out.get(cell, 0) + k * n
        return out

    @classmethod
    def derive(cls, prefixes: tuple[str, ...],
               points: Iterable[tuple[str, HardwareConfig, Mapping[str, int]]]) -> "DspCells":
        """The cells per multiplier from calibration points (name, config, yosys's cells):
        packed configs without MUL give the GEMM pair's, then those with MUL the lane's,
        then the unpacked configs (less their lanes' cells) a single product's.
        ValueError when a config's cells are not a whole number of the same
        per-multiplier cells: the DSP count would no longer be structural."""
        points = [(name, c, {k: v for k, v in cells.items() if k.startswith(prefixes)})
                  for name, c, cells in points]
        packed = [p for p in points if not unpacked(p[1])]
        gemm = _per_unit("GEMM multipliers", [(n, gemm_multipliers(c), cells)
                                              for n, c, cells in packed if not mul_lanes(c)])
        if gemm is None:
            raise ValueError("no calibration config without the ALU's MUL: the GEMM's "
                             "multiplier cells are unknown")
        mul = _per_unit("ALU multipliers", [(n, mul_lanes(c), _less(n, cells, gemm,
                                                                   gemm_multipliers(c)))
                                            for n, c, cells in packed if mul_lanes(c)])
        if mul is None:
            raise ValueError("no calibration config with the ALU's MUL: its multiplier "
                             "cells are unknown")
        single = _per_unit("single-product GEMM multipliers",
                           [(n, gemm_multipliers(c), _less(n, cells, mul, mul_lanes(c)))
                            for n, c, cells in points if unpacked(c)])
        return cls(gemm=gemm, mul=mul, single=single)

    def to_dict(self) -> dict:
        return {"gemm": dict(self.gemm), "mul": dict(self.mul),
                "single": None if self.single is None else dict(self.single)}


def _per_unit(what: str, rows) -> dict[str, int] | None:
    """The cells of one unit from (name, units, cells) rows, the same in every row; None
    when no row has a unit."""
    found = {}
    for name, units, cells in rows:
        if not units:
            continue
        if any(v % units for v in cells.values()):
            raise ValueError(f"{name}: {cells} is not {units} equal {what}")
        found[name] = {k: v // units for k, v in cells.items() if v}
    kinds = {tuple(sorted(v.items())) for v in found.values()}
    if len(kinds) > 1:
        raise ValueError(f"the cells of one of the {what} differ between calibration "
                         f"configs ({found}): the DSP count is no longer structural; "
                         "update vdla.dse.resource_rules")
    return dict(kinds.pop()) if kinds else None


def _less(name: str, cells: Mapping[str, int], per: Mapping[str, int],
          units: int) -> dict[str, int]:
    """`cells` less `units` times the cells `per` unit; ValueError when fewer."""
    left = dict(cells)
    for k, v in per.items():
        left[k] = left.get(k, 0) - v * units
    if any(v < 0 for v in left.values()):
        raise ValueError(f"{name}: fewer DSP cells {dict(cells)} than its other "
                         "multipliers need")
    return left


# --- the families -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FamilyRules:
    """What the model counts for one family (`vdla.boards.board.FAMILIES`)."""

    family: str
    bram: BlockRam
    dsp_prefixes: tuple[str, ...]
    """yosys cell types that are hard multipliers"""

    def counted_bram(self, c: HardwareConfig) -> float:
        return sum(self.bram.tiles(m.depth, m.width, m.lanes) for m in memories(c))

    def dsp(self, cells: Mapping[str, int]) -> float:
        """DSPs of hard-multiplier cells, counted as ``vdla estimate`` counts them."""
        return count_resources(self.family, dict(cells)).dsp


RULES = {rules.family: rules for rules in (
    FamilyRules("zynq-7000", XILINX_BRAM, ("DSP48",)),
    FamilyRules("zynq-ultrascale+", XILINX_BRAM, ("DSP48",)),
    FamilyRules("cyclone-v", M10K, ("MISTRAL_MUL",)),
    FamilyRules("ecp5", EBR, ("MULT18X18D", "MULT9X9D", "ALU54B")),
)}


def rules_for(family: str) -> FamilyRules:
    try:
        return RULES[family]
    except KeyError:
        raise ValueError(f"no resource counting rules for family {family!r}; known: "
                         f"{', '.join(RULES)}") from None
