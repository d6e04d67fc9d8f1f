"""Instruction and micro-op types of the vdla ISA (VTA's, plus an optional ALU MUL)."""

from __future__ import annotations

import dataclasses
import enum
import operator

from vdla.config import TABLE_ENTRIES, AluOp, HardwareConfig

__all__ = ["Opcode", "MemoryType", "Module", "AluOp", "Insn", "Load", "Store", "Gemm",
           "Alu", "Finish", "Uop", "DEP_FLAGS", "lacked_op", "memory_geometry"]


class Opcode(enum.IntEnum):
    """Instruction opcodes, bits 2:0 of every instruction."""

    LOAD = 0
    STORE = 1
    GEMM = 2
    FINISH = 3
    ALU = 4


class MemoryType(enum.IntEnum):
    """The SRAM a LOAD writes or a STORE reads (``memory_type``, bits 9:7)."""

    UOP = 0
    WGT = 1
    INP = 2
    ACC = 3
    OUT = 4
    TAB = 5    # the ALU's lookup table (a config with TAB), 32-bit entries


def memory_geometry(config: HardwareConfig) -> dict[MemoryType, tuple[int, int]]:
    """(element bytes, depth in elements) of every memory type on `config`: the one
    place that says how big a LOAD's or STORE's element is and how many an SRAM holds
    (TAB's entries are 32-bit in DRAM; the table keeps their low `TABLE_BITS`; a config
    without TAB has none, depth 0)."""
    c = config
    return {MemoryType.UOP: (c.uop_bytes, c.uop_depth),
            MemoryType.WGT: (c.wgt_elem_bytes, c.wgt_depth),
            MemoryType.INP: (c.inp_elem_bytes, c.inp_depth),
            MemoryType.ACC: (c.acc_elem_bytes, c.acc_depth),
            MemoryType.OUT: (c.out_elem_bytes, c.out_depth),
            MemoryType.TAB: (4, TABLE_ENTRIES if AluOp.TAB in c.alu_ops else 0)}


def lacked_op(insn: "Insn", config: HardwareConfig) -> AluOp | None:
    """The optional ALU op `insn` needs and `config` lacks, else None: an ALU
    instruction's own op, or TAB for a LOAD of TAB (the table exists only with it)."""
    if isinstance(insn, Alu) and insn.alu_opcode not in config.alu_ops:
        return insn.alu_opcode
    if (isinstance(insn, Load) and insn.memory_type == MemoryType.TAB
            and AluOp.TAB not in config.alu_ops):
        return AluOp.TAB
    return None


class Module(enum.Enum):
    """The three decoupled modules; each instruction is routed to exactly one."""

    LOAD = "load"
    COMPUTE = "compute"
    STORE = "store"


#: Dependency flags every instruction carries, in bit order (bits 3 to 6).
DEP_FLAGS = ("pop_prev", "pop_next", "push_prev", "push_next")


def _check_int(kind: str, name: str, value, *, signed: bool = False) -> int:
    # Anything integer-like (numpy integers too) is welcome; bools and floats are not.
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{kind}.{name} must be an integer, not {value!r}")
    value = operator.index(value)
    if not signed and value < 0:
        raise ValueError(f"{kind}.{name} must be non-negative, not {value}")
    return value


def _check_flag(kind: str, name: str, value) -> bool:
    # bools, numpy bools and the integers 0 and 1; not floats or strings.
    if not (isinstance(value, bool) or hasattr(type(value), "__index__")
            or type(value).__name__ in ("bool", "bool_")):
        raise TypeError(f"{kind}.{name} is a flag (0/1 or bool), not {value!r}")
    if value not in (0, 1):
        raise ValueError(f"{kind}.{name} is a flag (0/1 or bool), not {value!r}")
    return bool(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Insn:
    """Fields shared by every instruction: the four dependency-token flags.

    A module pops the named token queue(s) before it executes an instruction and pushes
    after: ``prev`` is the module before it in load → compute → store, ``next`` the one after.
    """

    pop_prev: bool = False
    pop_next: bool = False
    push_prev: bool = False
    push_next: bool = False

    opcode = None  # set by each subclass
    _signed_fields = ()  # fields holding two's-complement values

    def __post_init__(self):
        # A compiled model builds tens of thousands of instructions: plain bools and
        # ints, the common case, are checked in place; anything else is converted.
        values = self.__dict__
        for name, check in _field_checks(type(self)):
            value = values[name]
            if check is _FLAG:
                if value is not True and value is not False:
                    object.__setattr__(self, name, _check_flag(type(self).__name__, name,
                                                               value))
            elif type(value) is not int or (check is _UNSIGNED and value < 0):
                object.__setattr__(self, name, _check_int(
                    type(self).__name__, name, value, signed=check is _SIGNED))

    @property
    def module(self) -> Module:
        """The module this instruction is routed to."""
        return Module.COMPUTE

    def fields(self) -> dict:
        """All fields as a plain dict (enums stay enums)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


#: How `Insn.__post_init__` checks a field: a flag, an unsigned or a signed integer.
_FLAG, _UNSIGNED, _SIGNED = "flag", "unsigned", "signed"
_FIELD_CHECKS: dict[type, tuple[tuple[str, str], ...]] = {}


def _field_checks(cls: type) -> tuple[tuple[str, str], ...]:
    """(field, check) of instruction class `cls`'s fields, in order; the enum fields
    (`memory_type`, `alu_opcode`) are coerced by their own classes."""
    checks = _FIELD_CHECKS.get(cls)
    if checks is None:
        checks = tuple((f.name, _FLAG if f.type in ("bool", bool) else
                        _SIGNED if f.name in cls._signed_fields else _UNSIGNED)
                       for f in dataclasses.fields(cls)
                       if f.name not in ("memory_type", "alu_opcode"))
        _FIELD_CHECKS[cls] = checks
    return checks


def _coerce_enum(kind: str, name: str, enum_type, value, allowed):
    if type(value) is enum_type and value in allowed:
        return value
    # A name or an integer; a float or bool would otherwise match a value by equality.
    if not isinstance(value, str) and (isinstance(value, bool)
                                       or not hasattr(type(value), "__index__")):
        raise TypeError(f"{kind}.{name} must be a {enum_type.__name__}, its name or its "
                        f"integer value, not {value!r}")
    try:
        member = enum_type[value.upper()] if isinstance(value, str) else enum_type(value)
    except (KeyError, ValueError):
        member = None
    if member not in allowed:
        names = ", ".join(f"{m.name} ({m.value})" for m in allowed)
        raise ValueError(f"{kind}.{name} must be one of {names}, not {value!r}")
    return member


@dataclasses.dataclass(frozen=True, kw_only=True)
class _MemInsn(Insn):
    memory_type: MemoryType = MemoryType.INP
    sram_base: int = 0
    dram_base: int = 0
    y_size: int = 0
    x_size: int = 0
    x_stride: int = 0
    y_pad_0: int = 0
    y_pad_1: int = 0
    x_pad_0: int = 0
    x_pad_1: int = 0

    _memory_types = ()  # the memory types this instruction accepts

    def __post_init__(self):
        object.__setattr__(self, "memory_type", _coerce_enum(
            type(self).__name__, "memory_type", MemoryType, self.memory_type, self._memory_types))
        super().__post_init__()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Load(_MemInsn):
    """LOAD: copy a 2-D block from DRAM into an SRAM, adding zero padding.

    Reads `y_size` rows of `x_size` elements, rows `x_stride` elements apart, starting at
    element `dram_base` (elements of `memory_type`'s size); writes them densely from
    `sram_base` with `y_pad_0`/`y_pad_1` zero rows above/below and `x_pad_0`/`x_pad_1`
    zero elements left/right of each row. `x_size` 0 moves no data (a dependency-only
    no-op). INP and WGT loads run on the load module; UOP, ACC and TAB loads on compute.
    """

    opcode = Opcode.LOAD
    _memory_types = (MemoryType.UOP, MemoryType.WGT, MemoryType.INP, MemoryType.ACC,
                     MemoryType.TAB)

    @property
    def module(self) -> Module:
        if self.memory_type in (MemoryType.INP, MemoryType.WGT):
            return Module.LOAD
        return Module.COMPUTE


@dataclasses.dataclass(frozen=True, kw_only=True)
class Store(_MemInsn):
    """STORE: copy `y_size` × `x_size` out-buffer elements from `sram_base` to DRAM.

    Rows land `x_stride` elements apart from element `dram_base`; padding fields must be 0.
    """

    memory_type: MemoryType = MemoryType.OUT
    opcode = Opcode.STORE
    _memory_types = (MemoryType.OUT,)

    def __post_init__(self):
        super().__post_init__()
        for name in ("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1"):
            if getattr(self, name):
                raise ValueError(f"Store.{name} must be 0 (a store does not pad), "
                                 f"not {getattr(self, name)}")

    @property
    def module(self) -> Module:
        return Module.STORE


@dataclasses.dataclass(frozen=True, kw_only=True)
class _LoopInsn(Insn):
    reset_reg: bool = False
    uop_bgn: int = 0
    uop_end: int = 0
    iter_out: int = 0
    iter_in: int = 0
    dst_factor_out: int = 0
    dst_factor_in: int = 0
    src_factor_out: int = 0
    src_factor_in: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gemm(_LoopInsn):
    """GEMM: ``for o < iter_out: for i < iter_in: for u in uop_bgn..uop_end-1``
    ``acc[dst] += inp[src] · wgt[wgt]ᵀ`` (zero instead when `reset_reg`), where each
    index is the micro-op's field + o·*_factor_out + i·*_factor_in. The result narrowed
    to 8 bits is also written to the out buffer at dst.

    `dw` (only on a config with `HardwareConfig.dw_taps` = T > 0; r = block_out /
    block_in = `dw_column_rows`) makes it a *depthwise window* GEMM. The core keeps a
    window of T columns of r inp rows. The first micro-op of each pass over
    uop_bgn..uop_end-1 loads the whole window, rows src .. src + T·r - 1 (T·r cycles);
    every later one shifts it by a column, dropping the oldest r rows and reading rows
    src + (T-1)·r .. src + T·r - 1 (r cycles). With that window W (rows 0 .. T·r-1):

        acc[dst][b][n] += sum over k < block_in of wgt[wgt][n][k] · X[b][n][k]
        X[b][n][k] = W[(k // 2)·r + n // block_in][b][c(n) + k % 2]   for k < 2T
                   = W[T·r - 1][b][k]                                   for k >= 2T

    where c(n) = (n - n % 2) % block_in: weight column 2t + p of lane n multiplies input
    channel c(n) + p of tap t, and the columns past 2T multiply the last row read as a
    plain GEMM would (so the hardware needs no gate there). A depthwise layer's weights
    put lane n's tap t in column 2t + n % 2 and zeros everywhere else, so lane n sums
    the T taps of its own channel: T MACs per lane per micro-op. (Lanes 2j and 2j+1 read the same input there, which keeps the core's
    packed multiplier pairs.) When each micro-op's src is the previous one's plus r,
    the window is simply inp[src + t·r + h] for tap t and row h.
    """

    wgt_factor_out: int = 0
    wgt_factor_in: int = 0
    dw: bool = False
    opcode = Opcode.GEMM


@dataclasses.dataclass(frozen=True, kw_only=True)
class Alu(_LoopInsn):
    """ALU: the GEMM loop nest, with ``acc[dst] = op(acc[dst], imm or acc[src])``.

    `alu_opcode` is an `AluOp`; `imm` is a signed 16-bit immediate used when `use_imm`.
    The result narrowed to 8 bits is also written to the out buffer at dst.
    """

    alu_opcode: AluOp = AluOp.MIN
    use_imm: bool = False
    imm: int = 0
    opcode = Opcode.ALU
    _signed_fields = ("imm",)

    def __post_init__(self):
        object.__setattr__(self, "alu_opcode", _coerce_enum(
            "Alu", "alu_opcode", AluOp, self.alu_opcode, tuple(AluOp)))
        super().__post_init__()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Finish(Insn):
    """FINISH: ends the program (runs on the compute module, then raises done)."""

    opcode = Opcode.FINISH


@dataclasses.dataclass(frozen=True)
class Uop:
    """A micro-op: indices into the acc (`dst`), inp or acc (`src`) and wgt (`wgt`) SRAMs."""

    dst: int
    src: int
    wgt: int = 0

    def __post_init__(self):
        for name in ("dst", "src", "wgt"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:   # else already what the check gives
                object.__setattr__(self, name, _check_int("Uop", name, value))


#: Instruction class of each opcode.
INSN_TYPES = {Opcode.LOAD: Load, Opcode.STORE: Store, Opcode.GEMM: Gemm,
              Opcode.FINISH: Finish, Opcode.ALU: Alu}
