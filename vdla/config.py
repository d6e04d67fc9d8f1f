"""`HardwareConfig`: the one source of truth for the accelerator's parameters.

Every other number in vdla (SRAM depths, ISA field widths, element sizes in DRAM, the
name of a design) is derived here from a handful of parameters, the way VTA's
``Environment`` derives its constants from ``vta_config.json``.

Why this module is long: the class is the single source of truth for every derived
number, the extensions past VTA (declared in `vdla.extensions`) and their validation,
and the three document forms a config is read from (vdla's keys, VTA's ``LOG_*`` keys,
``vdla config show --json``); splitting any of them out would leave a second place that
knows the parameters.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from vdla._fileio import atomic_write
from vdla.extensions import EXTENSIONS, insn_bits

__all__ = ["AluOp", "EXTENSION_FLAGS", "HardwareConfig", "INSN_BITS", "ISA_FIXED_WIDTHS",
           "DIV_MAX", "PLATFORM_FIELDS", "TABLE_BITS", "TABLE_ENTRIES"]

#: Every instruction is one 128-bit word, fetched as such by the hardware.
INSN_BITS = 128

#: ISA fields whose width does not depend on the configuration (VTA 0.0.2's ``hw_spec.h``).
ISA_FIXED_WIDTHS = {
    "opcode": 3,
    "memory_type": 3,
    "sram_base": 16,
    "dram_base": 32,
    "y_size": 16,
    "x_size": 16,
    "x_stride": 16,
    "pad": 4,
    "iter": 14,
    "alu_opcode": 3,
    "imm": 16,
}


class AluOp(enum.IntEnum):
    """Vector ALU operations and their ``alu_opcode`` encodings.

    MIN, MAX, ADD and SHR are VTA's; MUL, REQ, TAB and DIV are vdla's optional additions
    (a config enables each). SHR is arithmetic and shifts left by the negated amount when the amount
    is negative. REQ ends a requantization in one pass: SHR, then a clamp to [lo, hi],
    written to the out buffer (the clamp makes its 8-bit narrowing exact), while the
    accumulator is cleared to zero, ready for the next tile without a reset pass. Its
    operand word holds the shift in bits 5:0 (as SHR's), lo in bits 15:8 and hi in bits
    23:16 (int8 each); with an immediate, hi is 127 (the 16-bit immediate holds the
    shift and lo). TAB looks each lane up in the table a LOAD of TAB filled: lane by lane,
    ``table[(operand - acc[dst]) mod TABLE_ENTRIES]``, an entry of TABLE_BITS bits
    sign-extended (exponentials and GELU, functions of an int8 value). DIV divides lane
    by lane and saturates at DIV_MAX: ``min(max(acc[dst], 0) // operand, DIV_MAX)``, and
    DIV_MAX where the operand is not positive (a softmax's probabilities: an exponential
    over the row's sum, int8).
    """

    MIN = 0
    MAX = 1
    ADD = 2
    SHR = 3
    MUL = 4
    REQ = 5
    TAB = 6
    DIV = 7


#: The largest quotient DIV gives (it saturates there): an int8 result, so that a
#: divider of 7 quotient bits suffices.
DIV_MAX = 127


#: The ALU's lookup table (TAB): its entries, indexed by the low 8 bits of a lane, and
#: each entry's width in bits, signed. 18 bits hold both an exponential in units of
#: 2**-16 (0 to 65536) and an int8 function value; a LOAD of TAB moves int32 entries and
#: keeps their low TABLE_BITS bits.
TABLE_ENTRIES = 256
TABLE_BITS = 18

#: ALU operations every configuration has; the others are optional.
REQUIRED_ALU_OPS = frozenset({AluOp.MIN, AluOp.MAX, AluOp.ADD, AluOp.SHR})


def _is_pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _log2(value: int) -> int:
    return value.bit_length() - 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class HardwareConfig:
    """Parameters of one accelerator design; frozen and validated at construction.

    Parameters (all keyword arguments; the defaults are VTA's default design):

    batch : int, power of two
        Rows of the GEMM core's input tile (the batch dimension of one micro-op).
    block_in : int, power of two
        Reduction length of the GEMM core (input channels per micro-op).
    block_out : int, power of two
        Output lanes of the GEMM core and of the vector ALU.
    inp_width, wgt_width : int
        Bits per input and weight element; 8 (int8) is supported.
    acc_width : int
        Bits per accumulator; 32 (int32) is supported.
    uop_buff_size, inp_buff_size, wgt_buff_size, acc_buff_size : int, power of two
        On-chip buffer sizes in bytes. The out buffer has the acc buffer's depth with
        8-bit elements.
    cmd_queue_depth : int
        Entries of each of the load, compute and store command queues.
    token_queue_depth : int
        Tokens each of the four dependency queues can hold.
    dram_bus_width : int
        Width in bits of the AXI4 data bus to DRAM (32 to 1024, power of two).
    alu_ops : frozenset of AluOp
        ALU operations the hardware implements; MIN, MAX, ADD and SHR always, MUL, REQ, TAB
        and DIV optional (REQ, TAB and DIV are extensions past VTA, `vdla.extensions`).
    gemm_dsp_limit : int
        An extension past VTA: the most hard multipliers (DSP slices) the GEMM core's
        packed form may use; its product pairs past the limit are built from LUT logic
        (shifted adds) instead, so a core wider than a part's DSP count can still fit it. 0 (the default): no limit.
        The results and the cycles are the same either way; only synthesis differs.
        It counts multipliers as `dsp_pack` builds them: product pairs when packed,
        single products when not.
    dsp_pack : bool
        Whether the GEMM core's hard multipliers each compute two int8 products that
        share an input (True, the default): a 25-bit packed weight holding both weights
        times the 8-bit input, one DSP48E1/E2 per pair (`vdla.hw.gemm_forms`), or one
        product each (False: one DSP per product, as VTA's core). Packing halves the
        DSPs and costs a few LUTs and carries per pair (the low product's borrow added
        back into the high one); results and cycles are the same either way, so, like
        the DSP limit, only synthesis differs (a sweep dimension). On by default because
        vdla's GEMM core has always been packed: every shipped config, calibration and
        figure assumes it. A core with block_out = 1 has no pair to pack; its
        `dsp_pack` is stored as True (one name per design). Off, the name ends in
        ``-unpacked``.
    alu_hold : bool
        An extension past VTA: a vector ALU instruction with one micro-op and
        ``src_factor_in == 0`` reads its operand row once per outer iteration and holds
        it, so it issues one micro-op per cycle instead of one every second cycle (the
        acc buffer has one read port). A micro-op of such an instruction that writes the
        row it reads does not change the operand the rest of its outer iteration uses.
    div_pipeline : bool
        An extension past VTA, with DIV in `alu_ops` only: the DIV engine is a pipelined
        divider (`vdla.hw.divider_pipeline`), one stage per restoring step and lane,
        instead of one divider per lane that takes a micro-op every 10 cycles. Independent
        DIV micro-ops by an immediate or a held operand (`alu_hold`) then issue one a
        cycle; results and the program-visible semantics are the same, only the cycles
        (and the flip-flops) differ. The name gets ``-divp``.
    dw_taps : int
        An extension past VTA: the GEMM core's *depthwise window* of this many kernel taps
        along a row (0, the default: none; else 2 to block_in / 2). A GEMM with its `dw`
        bit set multiplies each output lane's channel by the taps of a sliding window of
        input columns held in registers, instead of reducing over input channels, so a
        depthwise convolution does `dw_taps` useful MACs per lane and micro-op instead of
        one. Needs block_out a multiple of block_in (`dw_column_rows` inp rows make one
        column of a block_out-channel pixel). The semantics are `vdla.isa.Gemm`'s.
    clock_mhz : float
        Clock frequency used to report time; does not change the hardware.
    dram_bytes_per_cycle : float
        Bytes a cycle the DRAM gives the accelerator each way (a multiple of 1/8 from
        0.125 to 1024; 8, the default, is a 64-bit port at the accelerator's clock). Like
        the clock it belongs to the platform, not the hardware (`PLATFORM_FIELDS`): it is
        never in the name, and a board sets both (`vdla.boards.Board.apply`). The
        compiler's timing model and schedule choosers plan with it, and the Verilator
        backend's DRAM model defaults to it.
    """

    batch: int = 1
    block_in: int = 16
    block_out: int = 16
    inp_width: int = 8
    wgt_width: int = 8
    acc_width: int = 32
    uop_buff_size: int = 32 * 1024
    inp_buff_size: int = 32 * 1024
    wgt_buff_size: int = 256 * 1024
    acc_buff_size: int = 128 * 1024
    cmd_queue_depth: int = 512
    token_queue_depth: int = 512
    dram_bus_width: int = 64
    alu_ops: frozenset = REQUIRED_ALU_OPS
    alu_hold: bool = False
    div_pipeline: bool = False
    gemm_dsp_limit: int = 0
    dsp_pack: bool = True
    dw_taps: int = 0
    clock_mhz: float = 100.0
    dram_bytes_per_cycle: float = 8.0

    # --- validation -------------------------------------------------------------------

    def __post_init__(self):
        self._normalize_alu_ops()
        for field, low, high in (("batch", 1, 64), ("block_in", 1, 256), ("block_out", 1, 256)):
            self._check_pow2(field, low, high)
        for field, allowed in (("inp_width", (8,)), ("wgt_width", (8,)), ("acc_width", (32,))):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value not in allowed:
                raise ValueError(
                    f"HardwareConfig.{field} must be one of {allowed}, not {value!r} "
                    "(the simulators and the GEMM core implement int8 inputs and weights "
                    "with int32 accumulators)")
        for field in ("uop_buff_size", "inp_buff_size", "wgt_buff_size", "acc_buff_size"):
            self._check_pow2(field, 1, 1 << 26)
        for field, elem_bytes in (("uop_buff_size", self.uop_bytes),
                                  ("inp_buff_size", self.inp_elem_bytes),
                                  ("wgt_buff_size", self.wgt_elem_bytes),
                                  ("acc_buff_size", self.acc_elem_bytes)):
            depth = getattr(self, field) // elem_bytes
            if depth < 2:
                raise ValueError(
                    f"HardwareConfig.{field}={getattr(self, field)} holds {depth} element(s) "
                    f"of {elem_bytes} bytes; at least 2 are needed")
            if depth > 1 << ISA_FIXED_WIDTHS["sram_base"]:
                raise ValueError(
                    f"HardwareConfig.{field}={getattr(self, field)} gives a depth of {depth}, "
                    f"more than the 16-bit sram_base field can address (at most "
                    f"{1 << ISA_FIXED_WIDTHS['sram_base']} elements of {elem_bytes} bytes)")
        for field in ("cmd_queue_depth", "token_queue_depth"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or not 2 <= value <= 65536:
                raise ValueError(
                    f"HardwareConfig.{field} must be an integer from 2 to 65536, not {value!r}")
        self._check_pow2("dram_bus_width", 32, 1024)
        if not isinstance(self.dsp_pack, bool):
            raise ValueError(f"HardwareConfig.dsp_pack must be true or false, not "
                             f"{self.dsp_pack!r}")
        if self.block_out % 2:   # no pair to pack: the same hardware either way
            object.__setattr__(self, "dsp_pack", True)
        # Each extension validates its own field (`vdla.extensions`), and may normalize
        # it (a DSP limit past the core's multipliers is no limit: one name per design).
        for ext in EXTENSIONS:
            if ext.check is not None:
                object.__setattr__(self, ext.field, ext.check(self))
        if (not isinstance(self.clock_mhz, (int, float)) or isinstance(self.clock_mhz, bool)
                # Also NaN, infinity, and an int past the floats (math.isfinite would
                # raise OverflowError on one; the derived figures divide it as a float).
                or not 0 < self.clock_mhz <= sys.float_info.max):
            raise ValueError(
                f"HardwareConfig.clock_mhz must be a positive number (at most "
                f"{sys.float_info.max:.3g}), not {self.clock_mhz!r}")
        bpc = self.dram_bytes_per_cycle
        if (not isinstance(bpc, (int, float)) or isinstance(bpc, bool)
                or not 0.125 <= bpc <= 1024 or bpc * 8 != int(bpc * 8)):
            raise ValueError(f"HardwareConfig.dram_bytes_per_cycle must be a multiple of 1/8 "
                             f"from 0.125 to 1024, not {bpc!r}")
        if self.uop_bits > 64:
            raise ValueError(
                f"HardwareConfig {self._sizes()}: a micro-op needs {self.uop_bits} bits "
                "(dst + src + wgt index widths), more than 64; make the acc, inp or wgt "
                "buffer smaller or the blocks larger")
        self._check_isa_fits()

    def _check_pow2(self, field: str, low: int, high: int):
        value = getattr(self, field)
        if (not isinstance(value, int) or isinstance(value, bool) or not _is_pow2(value)
                or not low <= value <= high):
            raise ValueError(
                f"HardwareConfig.{field} must be a power of two from {low} to {high}, "
                f"not {value!r}")

    def _normalize_alu_ops(self):
        ops = self.alu_ops
        if isinstance(ops, (str, bytes)) or not hasattr(ops, "__iter__"):
            raise ValueError(
                f"HardwareConfig.alu_ops must be a collection of ALU operation names "
                f"({', '.join(op.name for op in AluOp)}), not {ops!r}")
        normalized = set()
        for op in ops:
            if isinstance(op, AluOp):
                normalized.add(op)
            elif isinstance(op, str) and op.upper() in AluOp.__members__:
                normalized.add(AluOp[op.upper()])
            else:
                raise ValueError(
                    f"HardwareConfig.alu_ops has unknown operation {op!r}; known: "
                    f"{', '.join(op.name for op in AluOp)}")
        missing = REQUIRED_ALU_OPS - normalized
        if missing:
            raise ValueError(
                f"HardwareConfig.alu_ops must include {', '.join(sorted(op.name for op in REQUIRED_ALU_OPS))}; "
                f"missing {', '.join(sorted(op.name for op in missing))}")
        object.__setattr__(self, "alu_ops", frozenset(normalized))

    def _check_isa_fits(self):
        for layout_name, widths in self.insn_field_widths().items():
            group_a, group_b = widths
            a_bits = sum(w for _, w in group_a)
            b_bits = sum(w for _, w in group_b)
            total = max(64, a_bits) + b_bits
            if total > INSN_BITS:
                raise ValueError(
                    f"HardwareConfig {self._sizes()}: the {layout_name} instruction needs "
                    f"{total} bits with these buffer depths, more than {INSN_BITS}; "
                    f"fields: {dict(group_a + group_b)}; make the acc, inp, wgt or uop "
                    "buffer smaller or the blocks larger")

    def _sizes(self) -> str:
        return (f"(batch={self.batch}, block_in={self.block_in}, block_out={self.block_out}, "
                f"uop_buff_size={self.uop_buff_size}, inp_buff_size={self.inp_buff_size}, "
                f"wgt_buff_size={self.wgt_buff_size}, acc_buff_size={self.acc_buff_size})")

    # --- element sizes (bytes of one SRAM element, also the unit of dram_base) ---------

    @property
    def inp_elem_bytes(self) -> int:
        """Bytes of one inp element: a batch × block_in tile of inputs."""
        return self.batch * self.block_in * self.inp_width // 8

    @property
    def wgt_elem_bytes(self) -> int:
        """Bytes of one wgt element: a block_out × block_in tile of weights."""
        return self.block_out * self.block_in * self.wgt_width // 8

    @property
    def acc_elem_bytes(self) -> int:
        """Bytes of one acc element: a batch × block_out tile of accumulators."""
        return self.batch * self.block_out * self.acc_width // 8

    @property
    def out_width(self) -> int:
        """Bits per out-buffer element (results narrowed from the accumulators)."""
        return self.inp_width

    @property
    def out_elem_bytes(self) -> int:
        """Bytes of one out element: a batch × block_out tile narrowed to out_width."""
        return self.batch * self.block_out * self.out_width // 8

    # --- depths -------------------------------------------------------------------------

    @property
    def inp_depth(self) -> int:
        return self.inp_buff_size // self.inp_elem_bytes

    @property
    def wgt_depth(self) -> int:
        return self.wgt_buff_size // self.wgt_elem_bytes

    @property
    def acc_depth(self) -> int:
        return self.acc_buff_size // self.acc_elem_bytes

    @property
    def out_depth(self) -> int:
        """The out buffer mirrors the acc buffer, one narrowed element per accumulator."""
        return self.acc_depth

    @property
    def out_buff_size(self) -> int:
        return self.out_depth * self.out_elem_bytes

    @property
    def uop_depth(self) -> int:
        return self.uop_buff_size // self.uop_bytes

    @property
    def log_inp_depth(self) -> int:
        return _log2(self.inp_depth)

    @property
    def log_wgt_depth(self) -> int:
        return _log2(self.wgt_depth)

    @property
    def log_acc_depth(self) -> int:
        return _log2(self.acc_depth)

    @property
    def log_uop_depth(self) -> int:
        return _log2(self.uop_depth)

    # --- micro-op format ----------------------------------------------------------------

    @property
    def uop_dst_bits(self) -> int:
        """Width of a micro-op's dst (an acc index)."""
        return self.log_acc_depth

    @property
    def uop_src_bits(self) -> int:
        """Width of a micro-op's src: an inp index for GEMM, an acc index for the ALU."""
        return max(self.log_inp_depth, self.log_acc_depth)

    @property
    def uop_wgt_bits(self) -> int:
        return self.log_wgt_depth

    @property
    def uop_bits(self) -> int:
        """Bits of one micro-op as stored: 32 as in VTA, 64 when the indices need more."""
        need = self.uop_dst_bits + self.uop_src_bits + self.uop_wgt_bits
        return 32 if need <= 32 else 64 if need <= 64 else need

    @property
    def uop_bytes(self) -> int:
        # Depends only on the acc/inp/wgt depths, so no circularity with uop_depth.
        return self.uop_bits // 8

    # --- instruction layouts ------------------------------------------------------------

    def insn_field_widths(self) -> dict[str, tuple[list[tuple[str, int]], list[tuple[str, int]]]]:
        """Field order and widths of each instruction layout, in two groups.

        The first group packs from bit 0 (opcode first); the second starts at bit 64 when
        the first fits in 64 bits (VTA's layout: the two halves are separate 64-bit words)
        and right after the first group otherwise. `vdla.isa` turns this into bit ranges.
        """
        w = ISA_FIXED_WIDTHS
        header = [("opcode", w["opcode"]), ("pop_prev", 1), ("pop_next", 1),
                  ("push_prev", 1), ("push_next", 1)]
        mem = (header + [("memory_type", w["memory_type"]), ("sram_base", w["sram_base"]),
                         ("dram_base", w["dram_base"])],
               [("y_size", w["y_size"]), ("x_size", w["x_size"]), ("x_stride", w["x_stride"]),
                ("y_pad_0", w["pad"]), ("y_pad_1", w["pad"]), ("x_pad_0", w["pad"]),
                ("x_pad_1", w["pad"])])
        loop = header + [("reset_reg", 1), ("uop_bgn", self.log_uop_depth),
                         ("uop_end", self.log_uop_depth + 1), ("iter_out", w["iter"]),
                         ("iter_in", w["iter"])]
        # An extension's bits (the depthwise window's dw) exist only where the hardware
        # has the extension, so the default layout stays VTA's.
        gemm = (loop + self._extension_bits("GEMM"), [("dst_factor_out", self.log_acc_depth), ("dst_factor_in", self.log_acc_depth),
                       ("src_factor_out", self.log_inp_depth), ("src_factor_in", self.log_inp_depth),
                       ("wgt_factor_out", self.log_wgt_depth), ("wgt_factor_in", self.log_wgt_depth)])
        # The ALU's src is an acc index, so its src factors have the acc depth's width
        # (VTA uses the inp depth's, which is the same number for its default config).
        alu = (loop + self._extension_bits("ALU"), [("dst_factor_out", self.log_acc_depth), ("dst_factor_in", self.log_acc_depth),
                      ("src_factor_out", self.log_acc_depth), ("src_factor_in", self.log_acc_depth),
                      ("alu_opcode", w["alu_opcode"]), ("use_imm", 1), ("imm", w["imm"])])
        finish = (header, [])
        return {"LOAD": mem, "STORE": mem, "GEMM": gemm, "ALU": alu, "FINISH": finish}

    def _extension_bits(self, layout: str) -> list[tuple[str, int]]:
        """The (field, width) pairs the extensions this config has add to the first
        group of `layout` (`vdla.extensions.InsnBits`), in registry order."""
        return [(bits.field, bits.width) for ext, bits in insn_bits(layout)
                if ext.present(self)]

    # --- names --------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """Short name, VTA-style: ``1x16x16_i8w8a32_15_15_18_17`` for the default.

        Parameters outside VTA's name that change the hardware are appended when they
        differ from the default: ``-mul``, then the extensions (`extensions`: ``-req``,
        ``-divp``, ``-hold``, ``-dw3``, ``-dsp220``), then ``-unpacked`` (`dsp_pack` off), ``-cq64``,
        ``-tq16``, ``-bus128``; the clock is not part of the hardware and never appears.
        """
        core = (f"{self.batch}x{self.block_in}x{self.block_out}_"
                f"i{self.inp_width}w{self.wgt_width}a{self.acc_width}_"
                f"{_log2(self.uop_buff_size)}_{_log2(self.inp_buff_size)}_"
                f"{_log2(self.wgt_buff_size)}_{_log2(self.acc_buff_size)}")
        default = _DEFAULT_EXTRAS
        extras = []
        if AluOp.MUL in self.alu_ops:
            extras.append("mul")
        extras += self.extensions
        if not self.dsp_pack:
            extras.append("unpacked")
        if self.cmd_queue_depth != default["cmd_queue_depth"]:
            extras.append(f"cq{self.cmd_queue_depth}")
        if self.token_queue_depth != default["token_queue_depth"]:
            extras.append(f"tq{self.token_queue_depth}")
        if self.dram_bus_width != default["dram_bus_width"]:
            extras.append(f"bus{self.dram_bus_width}")
        return "-".join([core] + extras)

    @property
    def extensions(self) -> tuple[str, ...]:
        """Short names of the extensions past VTA this config has (`vdla.extensions`), in
        the registry's order, each also a suffix of `name`: ``req`` (the ALU's REQ),
        ``hold`` (`alu_hold`), ``dw3`` (`dw_taps` = 3), ``dsp220`` (`gemm_dsp_limit`).
        MUL predates them and keeps its own ``mul`` suffix."""
        return tuple(s for s in (ext.short(self) for ext in EXTENSIONS) if s)

    @property
    def program_extensions(self) -> tuple[str, ...]:
        """The `extensions` a program compiled for this config may depend on (all but
        those that change only synthesis, like the DSP limit): what a device must have
        to run it, and what the older ``features`` key of data files listed."""
        return tuple(s for s in (ext.short(self) for ext in EXTENSIONS if ext.in_programs)
                     if s)

    @property
    def gemm_multipliers(self) -> int:
        """Multipliers of the GEMM core's synthesized form: one per pair of int8 products
        sharing an input (`vdla.hw.gemm_forms.packed_products`) with `dsp_pack` (block_out
        is then even), else one per product."""
        return self.macs_per_cycle // self.gemm_products_per_multiplier

    @property
    def gemm_products_per_multiplier(self) -> int:
        """Products one GEMM multiplier computes: 2 with `dsp_pack` (on an even
        block_out), else 1."""
        return 2 if self.dsp_pack and self.block_out % 2 == 0 else 1

    @property
    def dw_column_rows(self) -> int:
        """Inp rows in one column of the depthwise window: block_out / block_in (the
        block_out channels of one pixel; meaningful when `dw_taps` is set)."""
        return max(1, self.block_out // self.block_in)

    @property
    def dw_window_rows(self) -> int:
        """Inp rows the depthwise window holds: dw_taps columns of `dw_column_rows`."""
        return self.dw_taps * self.dw_column_rows

    def dw_pass_cycles(self, micro_ops: int) -> int:
        """Issue cycles of one pass of `micro_ops` dw GEMM micro-ops (`vdla.isa.Gemm`):
        the first loads the whole window (dw_window_rows), each later one a column."""
        return (micro_ops + self.dw_taps - 1) * self.dw_column_rows

    @property
    def gemm_lut_multipliers(self) -> int:
        """The GEMM core's multipliers (product pairs, or products without `dsp_pack`)
        built from LUTs (`gemm_dsp_limit`)."""
        return self.gemm_multipliers - self.gemm_dsp_limit if self.gemm_dsp_limit else 0

    @property
    def gemm_lut_products(self) -> int:
        """The GEMM core's int8 products built from LUTs (`gemm_dsp_limit`): each is
        `vdla.hw.gemm_forms.lut_product`, packed or not."""
        return self.gemm_lut_multipliers * self.gemm_products_per_multiplier

    @property
    def macs_per_cycle(self) -> int:
        """Peak multiply-accumulates per cycle of the GEMM core."""
        return self.batch * self.block_in * self.block_out

    def derived(self) -> dict[str, Any]:
        """Derived values, for display and for tools that should not recompute them."""
        return {
            "name": self.name,
            "inp_elem_bytes": self.inp_elem_bytes,
            "wgt_elem_bytes": self.wgt_elem_bytes,
            "acc_elem_bytes": self.acc_elem_bytes,
            "out_elem_bytes": self.out_elem_bytes,
            "uop_bits": self.uop_bits,
            "uop_depth": self.uop_depth,
            "inp_depth": self.inp_depth,
            "wgt_depth": self.wgt_depth,
            "acc_depth": self.acc_depth,
            "out_depth": self.out_depth,
            "out_buff_size": self.out_buff_size,
            "uop_fields": {"dst": self.uop_dst_bits, "src": self.uop_src_bits,
                           "wgt": self.uop_wgt_bits},
            "extensions": list(self.extensions),
            "macs_per_cycle": self.macs_per_cycle,
            "peak_gops": 2 * self.macs_per_cycle * self.clock_mhz / 1000,
        }

    # --- serialization ------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["alu_ops"] = sorted(op.name for op in self.alu_ops)
        return data

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """Return the config as JSON; with `path`, also write it there atomically."""
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        if path is not None:
            atomic_write(path, text.encode())
        return text

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "HardwareConfig":
        """Build from vdla's own keys (`to_dict`), from VTA's ``vta_config.json`` keys, or
        from the document ``vdla config show --json`` writes (``parameters``, with its
        ``derived`` values and ``insn_layouts`` checked against them).

        data : the mapping, as read from JSON
        Raises ValueError naming an unknown key, a bad value, or a derived value or
        instruction field that the parameters do not give.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a hardware config must be a JSON object, not {type(data).__name__}")
        if "parameters" in data:
            return cls._from_show_document(data)
        if any(isinstance(key, str) and key.startswith("LOG_") for key in data):
            return cls._from_vta_dict(data)
        return cls._from_fields(data)

    @classmethod
    def _from_fields(cls, data: Mapping[str, Any]) -> "HardwareConfig":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields, key=str)
        if unknown:
            raise ValueError(
                f"unknown hardware config key(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(sorted(fields))} (or VTA's LOG_* keys)")
        return cls(**data)

    @classmethod
    def _from_show_document(cls, data: Mapping[str, Any]) -> "HardwareConfig":
        """The config of a ``vdla config show --json`` document. The parameters define it;
        the derived values and layouts are redundant, so they must agree with it (a file
        edited in one place only is refused rather than half applied)."""
        unknown = sorted(set(data) - set(SHOW_DOCUMENT_KEYS), key=str)
        if unknown:
            raise ValueError(
                f"unknown key(s) {', '.join(map(repr, unknown))} next to 'parameters'; a "
                f"`vdla config show --json` document has {', '.join(SHOW_DOCUMENT_KEYS)}")
        params = data["parameters"]
        if not isinstance(params, Mapping):
            raise ValueError(f"'parameters' must be a JSON object of vdla's config keys, not "
                             f"{type(params).__name__}")
        config = cls._from_fields(params)
        if "derived" in data:
            _check_same("derived", _derived_of_older(data["derived"], config),
                        config.derived())
        if "insn_layouts" in data:
            _check_same("insn_layouts", data["insn_layouts"], config._insn_bit_ranges())
        return config

    def _insn_bit_ranges(self) -> dict[str, dict[str, str]]:
        """Each instruction field's bits (``"25:10"``, or ``"7"`` for one bit) as
        ``vdla config show`` prints them: `insn_field_widths` packed by the rule its
        docstring states, which `vdla.isa.layouts_for` implements (a test keeps the two
        equal; this module cannot import `vdla.isa`, which imports it)."""
        ranges = {}
        for kind, (group_a, group_b) in self.insn_field_widths().items():
            fields, lsb = {}, 0
            for group in (group_a, group_b):
                if group is group_b and group:
                    lsb = max(lsb, 64)
                for field, width in group:
                    fields[field] = f"{lsb + width - 1}:{lsb}" if width > 1 else f"{lsb}"
                    lsb += width
            ranges[kind] = fields
        return ranges

    @classmethod
    def _from_vta_dict(cls, data: Mapping[str, Any]) -> "HardwareConfig":
        def exp2(key):
            value = data[key]
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 32:
                raise ValueError(f"VTA config key {key} must be an integer from 0 to 31, "
                                 f"not {value!r}")
            return 1 << value

        keys = {"LOG_INP_WIDTH": "inp_width", "LOG_WGT_WIDTH": "wgt_width",
                "LOG_ACC_WIDTH": "acc_width", "LOG_BATCH": "batch",
                "LOG_UOP_BUFF_SIZE": "uop_buff_size", "LOG_INP_BUFF_SIZE": "inp_buff_size",
                "LOG_WGT_BUFF_SIZE": "wgt_buff_size", "LOG_ACC_BUFF_SIZE": "acc_buff_size",
                "LOG_BLOCK_IN": "block_in", "LOG_BLOCK_OUT": "block_out"}
        # Keys of vta_config.json that describe the target, not the design.
        ignored = {"TARGET", "HW_VER", "HW_CLK_TARGET", "LOG_OUT_WIDTH", "LOG_OUT_BUFF_SIZE"}
        kwargs: dict[str, Any] = {}
        for key in data:
            if key in keys:
                kwargs[keys[key]] = exp2(key)
            elif key == "LOG_BLOCK":
                kwargs.setdefault("block_in", exp2(key))
                kwargs.setdefault("block_out", exp2(key))
            elif key == "HW_FREQ":
                kwargs["clock_mhz"] = data[key]
            elif key not in ignored:
                raise ValueError(
                    f"unknown VTA config key {key!r}; known: "
                    f"{', '.join(sorted(set(keys) | ignored | {'LOG_BLOCK', 'HW_FREQ'}))}")
        return cls(**kwargs)

    @classmethod
    def from_json(cls, path_or_text: str | os.PathLike) -> "HardwareConfig":
        """Read a config from a JSON file (vdla's keys or VTA's) or a JSON string."""
        text = str(path_or_text)
        if isinstance(path_or_text, os.PathLike) or not text.lstrip().startswith("{"):
            path = Path(path_or_text)
            try:
                text = path.read_text()
            except OSError as exc:
                raise ValueError(f"cannot read hardware config {str(path)!r}: {exc.strerror}") from None
            where = f"hardware config {str(path)!r}"
        else:
            where = "hardware config JSON"
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where} is not valid JSON: {exc}") from None
        try:
            return cls.from_dict(data)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}: {exc}") from None

    def hardware(self) -> "HardwareConfig":
        """This config with its platform fields (`PLATFORM_FIELDS`: the clock and the
        DRAM's bandwidth) at their defaults: the same hardware, one key for its Verilog
        and its netlists."""
        return dataclasses.replace(self, **{f: _DEFAULT_EXTRAS[f] for f in PLATFORM_FIELDS})

    def replace(self, **changes) -> "HardwareConfig":
        """A copy with some parameters changed (validated like a new config)."""
        return dataclasses.replace(self, **changes)


_DEFAULT_EXTRAS = {f.name: f.default for f in dataclasses.fields(HardwareConfig)}

#: Fields that describe the platform the hardware runs on, not the hardware: never in
#: the name or the Verilog, set by a board (`HardwareConfig.hardware` resets them).
PLATFORM_FIELDS = ("clock_mhz", "dram_bytes_per_cycle")

#: The boolean extension fields past VTA and their short names (config name suffixes).
EXTENSION_FLAGS = {ext.field: ext.key for ext in EXTENSIONS if ext.kind == "flag"}


#: The top-level keys of the document ``vdla config show --json`` writes.
SHOW_DOCUMENT_KEYS = ("parameters", "derived", "insn_layouts")


def _derived_of_older(derived: Any, config: HardwareConfig) -> Any:
    """A ``derived`` object as an older vdla wrote it, in today's keys: the one place
    that reads the older ``features`` key, which listed the extensions a program may
    depend on (`HardwareConfig.program_extensions`; the DSP limit was not among them).
    It is checked here against that list and dropped, so that an older document still
    loads and a wrong one is still refused."""
    if not isinstance(derived, Mapping) or "features" not in derived:
        return derived
    derived = dict(derived)
    _check_same("derived.features", derived.pop("features"),
                list(config.program_extensions))
    return derived


def _check_same(where: str, given: Any, expected: Any) -> None:
    """ValueError naming the first entry of `given` (from a file) that differs from
    `expected` (what the parameters give); `where` is its path, like ``derived``. An
    entry the file leaves out is not checked (a document from an older vdla may lack a
    later one); one `expected` does not have is refused, never ignored."""
    if isinstance(expected, Mapping):
        if not isinstance(given, Mapping):
            raise ValueError(f"{where} must be a JSON object, not {given!r}")
        unknown = sorted(set(given) - set(expected), key=str)
        if unknown:
            raise ValueError(f"{where} has unknown field(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(expected)}")
        for key, value in given.items():
            _check_same(f"{where}.{key}", value, expected[key])
        return
    same = given == expected and type(given) is not bool
    if not same and isinstance(expected, float) and isinstance(given, (int, float)) \
            and not isinstance(given, bool):
        try:   # another JSON writer may round a float differently
            same = math.isclose(given, expected, rel_tol=1e-9)
        except OverflowError:
            pass
    if not same:
        raise ValueError(f"{where} is {given!r} in the file, but the parameters give "
                         f"{expected!r} (the derived values and layouts follow from "
                         "'parameters': after editing those, delete 'derived' and "
                         "'insn_layouts')")

