"""The hardware extensions past VTA, each declared once: `EXTENSIONS`.

An extension is a `vdla.HardwareConfig` field (or, for the ALU's REQ, one optional
member of a field) that adds to VTA's hardware: off by default, so the default config's
hardware and ISA stay VTA's. Its declaration here says everything generic code needs:
the config field, its type, default and validation, the suffix it adds to the config's
name, the instruction bits it adds, one line on what it does, and which modules
implement it. Generic code reads this registry instead of naming an extension: the
config's `extensions` list, name and validation, the encoder's and the validator's
refusal of an instruction bit the config lacks, the device's "lacking extensions" check,
the resource calibration's and the benches' loops over extensions, the cost-model
inputs, and the table of docs/hardware.md (a test keeps it equal to `markdown_table`).

What necessarily implements an extension (the Amaranth hardware, the functional
simulator, the compiler's lowering, the timing and resource models) still names its
field; `Extension.implemented_in` lists those modules, which are the files one touches
to add an extension (docs/hardware.md, "Adding a hardware extension").

This module imports only the standard library and never `vdla.config` (which imports
it): the functions here take any object with the config's fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

__all__ = ["EXTENSIONS", "Extension", "InsnBits", "by_field", "by_key", "insn_bits",
           "lacking_extensions", "markdown_table"]


@dataclasses.dataclass(frozen=True)
class InsnBits:
    """An instruction field an extension adds, present only on a config that has it.

    layout : the instruction layout (``"GEMM"``, ``"ALU"``) whose first group it ends
    field : the field's name, also the attribute of the `vdla.isa` instruction
    width : its width in bits
    """

    layout: str
    field: str
    width: int


def _check_flag(config: Any, field: str) -> bool:
    value = getattr(config, field)
    if not isinstance(value, bool):
        raise ValueError(f"HardwareConfig.{field} must be true or false, not {value!r}")
    return value


def _check_count(config: Any, field: str, what: str) -> int:
    value = getattr(config, field)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"HardwareConfig.{field} must be a non-negative integer (0: "
                         f"{what}), not {value!r}")
    return value


def _check_alu_hold(config: Any) -> bool:
    return _check_flag(config, "alu_hold")


def _check_div_pipeline(config: Any) -> bool:
    """The pipelined divider replaces the DIV engine, so it needs DIV among the ALU ops."""
    value = _check_flag(config, "div_pipeline")
    if value and not any(op.name == "DIV" for op in config.alu_ops):
        raise ValueError(
            "HardwareConfig.div_pipeline=True needs DIV in alu_ops (it pipelines the DIV "
            f"engine); alu_ops are {', '.join(sorted(op.name for op in config.alu_ops))}")
    return value


def _check_dw_taps(config: Any) -> int:
    """The depthwise window's taps: each takes two of the core's block_in multiplier
    columns, and a window column is the block_out channels of one pixel, whole inp rows."""
    taps = _check_count(config, "dw_taps", "no depthwise window")
    if not taps:
        return taps
    if not 2 <= taps <= config.block_in // 2:
        raise ValueError(
            f"HardwareConfig.dw_taps={taps} is out of range for block_in={config.block_in}: "
            f"each tap takes two of the core's block_in multiplier columns, so 2 to "
            f"{config.block_in // 2} taps are allowed (or 0 for none)")
    if config.block_out % config.block_in:
        raise ValueError(
            f"HardwareConfig.dw_taps={taps} needs block_out ({config.block_out}) to be a "
            f"multiple of block_in ({config.block_in}): a window column is the block_out "
            f"channels of one pixel, block_out / block_in whole inp rows")
    return taps


def _check_gemm_dsp_limit(config: Any) -> int:
    """A limit at or past the core's multipliers leaves no pair to build from LUTs: the
    same hardware as none, so it is stored as 0 (one name for one design)."""
    limit = _check_count(config, "gemm_dsp_limit", "no limit")
    return 0 if limit >= config.gemm_multipliers else limit


@dataclasses.dataclass(frozen=True)
class Extension:
    """One hardware extension past VTA.

    key : its short name, the stem of its name suffix (``req``, ``hold``, ``dw``, ``dsp``)
    title : what docs and tables call it (``REQ``, ``depthwise window``)
    field : the `HardwareConfig` field that holds it
    kind : ``"alu_op"`` (an optional member of ``alu_ops``, named `alu_op`), ``"flag"``
        (a bool: the suffix is `key`) or ``"count"`` (an int, 0 for none: the suffix is
        `key` followed by the value, ``dw3``)
    description : one line: what it adds to the hardware
    example : a value that turns it on (for the benches' with/without loops and the docs)
    check : validates the field on a config being built (ValueError naming the value and
        what is allowed) and returns the value to store; None: checked elsewhere (REQ,
        with the other ALU ops)
    alu_op : for ``"alu_op"``, the `vdla.config.AluOp` member's name
    insn_bits : the instruction fields it adds (`InsnBits`), on a config that has it
    in_programs : whether a program compiled for a config with it may depend on it (its
        ISA, semantics or timing); False when only synthesis differs (the DSP limit):
        a device lacking such an extension is not said to lack what the program needs
    config_doc : the docs/config.md wording of the allowed values
    changes : what it changes in the hardware (the docs table's column)
    compiler : what the compiler does with it (the docs table's column)
    cost_input : the input it gives the learned cost models of accelerator schedules
        (`vdla.compiler.targets.vdla.features.CONV2D`), as (name, description, how):
        how is ``"value"`` (its setting as a number) or ``"present"`` (1 when the config
        has it); None: none (REQ's effect reaches them through the timing model's
        estimate). Renaming or reordering these changes the feature set a trained model
        was fitted to, so an extension added later appends its input at the end
    identifiers : the words that name it in the source (its field first): what
        scripts/extension_footprint.py counts
    implemented_in : the modules that implement it and so name its field: the hardware,
        the simulators, the compiler's lowering, the timing and resource models
    requires : the key of the extension it builds on (the pipelined divider: ``div``),
        or None: turning it on (`with_`) turns that one on too, and turning that one off
        (`without`) turns it off too, since a config cannot have it alone
    """

    key: str
    title: str
    field: str
    kind: str
    description: str
    example: Any
    check: Callable[[Any], Any] | None
    alu_op: str | None = None
    insn_bits: tuple[InsnBits, ...] = ()
    in_programs: bool = True
    config_doc: str = ""
    changes: str = ""
    compiler: str = ""
    cost_input: tuple[str, str, str] | None = None
    identifiers: tuple[str, ...] = ()
    implemented_in: tuple[str, ...] = ()
    requires: str | None = None

    # --- reading a config ---------------------------------------------------------------

    def value(self, config: Any) -> Any:
        """Its setting on `config`: True/False for an ALU op or a flag, the count else."""
        if self.kind == "alu_op":
            return any(op.name == self.alu_op for op in config.alu_ops)
        return getattr(config, self.field)

    def present(self, config: Any) -> bool:
        """Whether `config` has it."""
        return bool(self.value(config))

    def short(self, config: Any) -> str | None:
        """Its short name on `config`, also the suffix it adds to the config's name
        (``req``, ``hold``, ``dw3``, ``dsp220``); None when `config` lacks it."""
        value = self.value(config)
        if not value:
            return None
        return f"{self.key}{value}" if self.kind == "count" else self.key

    def what(self, config: Any) -> str:
        """A few words for it as `config` has it, for messages: ``the ALU's REQ``,
        ``alu_hold``, ``the depthwise window, dw_taps=3``."""
        if self.kind == "alu_op":
            return f"the ALU's {self.alu_op}"
        if self.kind == "flag":
            return self.field
        return f"the {self.title}, {self.field}={self.value(config)}"

    def cost_value(self, config: Any) -> float:
        """Its `cost_input` on `config`, as a float (only for an extension with one)."""
        how = self.cost_input[2]
        return float(self.value(config) if how == "value" else self.present(config))

    def needs(self) -> str:
        """What a config must set to have it, for messages: ``dw_taps > 0``."""
        if self.kind == "alu_op":
            return f"{self.alu_op} in alu_ops"
        return f"{self.field} > 0" if self.kind == "count" else f"{self.field}=true"

    # --- changing a config --------------------------------------------------------------

    def without(self, config: Any) -> dict[str, Any]:
        """The field changes (for `HardwareConfig.replace`) that remove it from `config`."""
        changes = {}
        for other in EXTENSIONS:   # those built on it go first (the pipelined divider)
            if other.requires == self.key and other.present(config):
                changes.update(other.without(config))
        if self.kind == "alu_op":
            return changes | {self.field: frozenset(op for op in config.alu_ops
                                                    if op.name != self.alu_op)}
        return changes | {self.field: False if self.kind == "flag" else 0}

    def with_(self, config: Any, value: Any = None) -> dict[str, Any]:
        """The field changes that give `config` it: `value`, or `example` when None (and
        the extension it `requires`)."""
        if self.kind == "alu_op":
            return {self.field: frozenset(op.name for op in config.alu_ops) | {self.alu_op}}
        changes = by_key(self.requires).with_(config) if self.requires else {}
        return changes | {self.field: self.example if value is None else value}


_HW = "hw/compute.py"
_TIMING = "compiler/targets/vdla/timing.py (timing model)"
_RESOURCES = "dse/resources.py (resource model)"

#: Every extension, in the order of their name suffixes (after MUL's ``-mul``, which
#: predates them and is one of the ALU ops, not an extension).
EXTENSIONS: tuple[Extension, ...] = (
    Extension(
        key="req", title="REQ", field="alu_ops", kind="alu_op", alu_op="REQ",
        description="an ALU op that ends a requantization in one pass: shift, clamp, "
                    "write the out buffer, clear the accumulator",
        example=True, check=None,
        config_doc='`"REQ"` in `alu_ops`',
        changes="an ALU op: shift, clamp to [lo, hi] (int8 bounds in the operand word), "
                "write the out buffer, clear the accumulator",
        compiler="ends every convolution's epilogue with one REQ instead of SHR, MAX and "
                 "MIN, and resets each thread's accumulators once instead of every tile",
        identifiers=("REQ",),
        implemented_in=(_HW, "sim/functional_alu.py", "sim/verilator/ (the C++ model)",
                        "compiler/targets/vdla/requant.py", "compiler/targets/vdla/conv.py",
                        _TIMING,
                        _RESOURCES)),
    Extension(
        key="tab", title="table", field="alu_ops", kind="alu_op", alu_op="TAB",
        description="an ALU op that looks each lane up in a 256-entry table a LOAD of TAB "
                    "fills: functions of an int8 value (GELU, exponentials) in one pass",
        example=True, check=None,
        config_doc='`"TAB"` in `alu_ops`',
        changes="a 256-entry table of 18-bit signed entries per lane, filled by a LOAD of "
                "TAB (memory type 5); an ALU op: each lane becomes table[(operand - "
                "acc[dst]) mod 256]",
        compiler="runs qgelu on the accelerator as one table pass (the 256 values of the "
                 "int8 GELU) instead of on the host, and with DIV the softmax's "
                 "exponentials",
        identifiers=("TAB", "TABLE_ENTRIES", "TABLE_BITS"),
        implemented_in=(_HW, "hw/table.py", "isa/insn.py (LOAD of TAB)", "sim/functional.py",
                        "sim/functional_alu.py", "sim/validate.py",
                        "compiler/targets/vdla/table.py", "compiler/targets/vdla/softmax.py",
                        _TIMING, _RESOURCES)),
    Extension(
        key="div", title="divide", field="alu_ops", kind="alu_op", alu_op="DIV",
        description="an ALU op that divides each lane by the operand's and saturates at "
                    "127: a softmax's probabilities",
        example=True, check=None,
        config_doc='`"DIV"` in `alu_ops`',
        changes="a divider per lane of 7 quotient bits, one bit a cycle; an ALU op: each "
                "lane becomes min(max(acc[dst], 0) // operand, 127) (127 where the operand "
                "is not positive)",
        compiler="with TAB, runs an attention's softmax (causal or none) on the accelerator, "
                 "down the rows of the scores' transpose: reductions over rows, the "
                 "exponentials by TAB, the probabilities by one DIV by the row's sum",
        identifiers=("DIV", "DIV_MAX"),
        implemented_in=(_HW, "hw/divider.py", "sim/functional_alu.py",
                        "compiler/targets/vdla/softmax.py",
                        "compiler/targets/vdla/attention.py", _TIMING, _RESOURCES)),
    Extension(
        key="divp", title="pipelined divider", field="div_pipeline", kind="flag",
        description="the DIV engine is a pipelined divider: DIV micro-ops by an immediate "
                    "or a held operand issue one a cycle",
        example=True, check=_check_div_pipeline, in_programs=False, requires="div",
        config_doc='true or false (true needs `"DIV"` in `alu_ops`)',
        changes="the DIV engine is a pipeline of the 8 restoring steps per lane, with a "
                "scoreboard of the rows in flight: a DIV micro-op by an immediate or a "
                "held row issues every cycle (by acc rows every second), its result "
                "written 8 cycles after its write stage",
        compiler="nothing to do: the results are the same; the timing model counts the "
                 "pipelined DIV's cycles",
        identifiers=("div_pipeline",),
        implemented_in=(_HW, "hw/divider_pipeline.py", "compiler/targets/vdla/softmax.py "
                        "(DIV cycles)", _RESOURCES)),
    Extension(
        key="hold", title="hold", field="alu_hold", kind="flag",
        description="a vector ALU instruction with one micro-op holds its operand row and "
                    "issues one micro-op a cycle",
        example=True, check=_check_alu_hold,
        config_doc="true or false",
        changes="a vector ALU instruction with one micro-op whose src stays put in the "
                "inner loop reads its operand row once per outer iteration and issues a "
                "micro-op per cycle",
        compiler="nothing to do: the epilogue's per-channel passes already have that shape; "
                 "the timing model counts one cycle per entry",
        cost_input=("alu_hold", "1 when the config holds the ALU's src operand (`alu_hold`)",
                    "value"),
        identifiers=("alu_hold",),
        implemented_in=(_HW, "sim/functional_alu.py", "compiler/targets/vdla/common.py "
                        "(ALU cycles)", _TIMING,
                        _RESOURCES)),
    Extension(
        key="dw", title="depthwise window", field="dw_taps", kind="count",
        description="the GEMM core's depthwise window: each lane multiplies its own channel "
                    "by dw_taps kernel taps along a row",
        example=3, check=_check_dw_taps,
        insn_bits=(InsnBits("GEMM", "dw", 1),),
        config_doc="0, or 2 to block_in / 2 (block_out a multiple of block_in)",
        changes="a GEMM with the `dw` bit keeps a window of `dw_taps` pixel columns in "
                "registers, slides it a column (block_out / block_in inp rows) per "
                "micro-op and feeds each lane its own channel's taps: `dw_taps` useful MACs "
                "per lane and micro-op",
        compiler="lowers depthwise convolutions to window GEMMs that walk each output row "
                 "along x, one micro-op per output pixel and kernel row",
        cost_input=("dw_taps", "the depthwise window's taps (0: none)", "value"),
        identifiers=("dw_taps", "dw_column_rows", "dw_window_rows", "dw_pass_cycles"),
        implemented_in=(_HW, "hw/dw_window.py", "hw/gemm_forms.py", "hw/top.py",
                        "isa/insn.py (the dw bit's semantics)", "sim/functional.py",
                        "sim/validate.py (the window's reach)",
                        "sim/verilator/build.py (the C++ model)",
                        "compiler/targets/vdla/dw_window.py",
                        _RESOURCES)),
    Extension(
        key="dsp", title="DSP limit", field="gemm_dsp_limit", kind="count",
        description="the GEMM core's multiplier pairs past this many are shifted adds in "
                    "LUTs, not DSP slices",
        example=220, check=_check_gemm_dsp_limit, in_programs=False,
        config_doc="0 (no limit) or a positive integer",
        changes="the GEMM core's multiplier pairs (products, with `dsp_pack` off) past the "
                "limit are shifted adds in LUTs (`vdla.hw.compute.lut_product`), not DSP "
                "slices",
        compiler="nothing: results and cycles are the same; a core wider than the part's "
                 "DSPs can fit it",
        cost_input=("dsp_limited", "1 when the GEMM core's DSP budget makes some products "
                    "from LUTs", "present"),
        identifiers=("gemm_dsp_limit", "gemm_lut_multipliers"),
        implemented_in=(_HW, "hw/gemm_forms.py", "dse/resource_rules.py",
                        _RESOURCES)),
)

_BY_KEY = {ext.key: ext for ext in EXTENSIONS}
_BY_FIELD = {ext.field: ext for ext in EXTENSIONS}


def by_key(key: str) -> Extension:
    """The extension whose short name is `key` (``req``, ``hold``, ``dw``, ``dsp``)."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise ValueError(f"unknown hardware extension {key!r}; known: "
                         f"{', '.join(_BY_KEY)}") from None


def by_field(field: str) -> Extension | None:
    """The extension `HardwareConfig.field` holds, or None (``alu_ops`` gives REQ)."""
    return _BY_FIELD.get(field)


def insn_bits(layout: str) -> tuple[tuple[Extension, InsnBits], ...]:
    """The extensions' instruction fields of `layout`, whether or not a config has them."""
    return tuple((ext, bits) for ext in EXTENSIONS for bits in ext.insn_bits
                 if bits.layout == layout)


def lacking_extensions(has: Any, lacks: Any) -> list[tuple[str, str]]:
    """The optional ALU ops and the extensions a program may depend on (those
    ``in_programs``) that config `has` has and config `lacks` lacks, each as (short name,
    what it is: `Extension.short` and ``what``), such as ``("req", "the ALU's REQ")`` or
    ``("hold", "alu_hold")``. The optional ALU ops come first (MUL among them, which
    predates the extensions), then the other extensions in the registry's order; `lacks`
    lacks a counted one (the depthwise window's taps) unless it has the same count.
    Both the simulators' device check and the board's bitstream check say this."""
    found = [(op.name.lower(), f"the ALU's {op.name}")
             for op in sorted(has.alu_ops - lacks.alu_ops)]
    for ext in EXTENSIONS:
        # An ALU-op extension is among the ops above.
        if ext.in_programs and ext.kind != "alu_op" and ext.present(has) \
                and ext.value(has) != ext.value(lacks):
            found.append((ext.short(has), ext.what(has)))
    return found


def markdown_table() -> str:
    """The table of docs/hardware.md ("Extensions past VTA"), one row per extension; a
    test keeps the page's table equal to it."""
    rows = ["| extension | config | name | what it changes | what the compiler does with it |",
            "|---|---|---|---|---|"]
    for ext in EXTENSIONS:
        config = (f'`"{ext.alu_op}"` in `{ext.field}`' if ext.kind == "alu_op"
                  else f"`{ext.field}`")
        suffix = f"-{ext.key}{ext.example}" if ext.kind == "count" else f"-{ext.key}"
        rows.append(f"| {ext.title} | {config} | `{suffix}` | {ext.changes} | "
                    f"{ext.compiler} |")
    return "\n".join(rows)
