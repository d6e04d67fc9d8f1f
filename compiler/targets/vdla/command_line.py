"""What the vdla target tells the command line and its reports about itself: its options
(``--sim``, ``--config``, ``--board``) and how it is built from them, its schedules in a
few words, and the lines and notes of a run's report (the cycles at the config's clock,
the GEMM utilization, the board it is timed on).

`VdlaTarget` takes this as a base class (kept apart from the compiling and running in
`vdla.compiler.targets.vdla.target`); the hooks are those of `vdla.compiler.targets.base.
Target`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import vdla.runtime
from vdla.boards import get as get_board
from vdla.compiler.targets.options import ExtraColumn, TargetOption
from vdla.shipped import load_config

__all__ = ["DEFAULT_BACKEND", "VdlaCommandLine"]

#: The simulator a run uses without ``--sim``: the cycle-accurate one.
DEFAULT_BACKEND = "verilator"

_CONFIG_HELP = ("the accelerator's hardware config: a JSON file (vdla's keys or VTA's "
                "vta_config.json) or the name of a config shipped with vdla (`vdla config "
                "list`); default: VTA's default")


class VdlaCommandLine:
    """The command-line face of `VdlaTarget` (see the module docstring)."""

    cli_options = (
        TargetOption("--sim", "the accelerator's simulator (default verilator: "
                              "cycle-accurate; the first run builds the model)",
                     choices=vdla.runtime.BACKENDS, commands=("run",)),
        TargetOption("--config", _CONFIG_HELP, metavar="FILE",
                     commands=("run", "compare", "tune", "targets")),
        TargetOption("--board", "simulate the board's config, DRAM port and memory timing, "
                                "and report time at its clock (see `vdla boards`; --config "
                                "then names a config for the board)",
                     metavar="NAME", commands=("run", "compare")),
    )
    extra_columns = {"gemm_utilization": ExtraColumn("GEMM util")}

    @classmethod
    def from_cli(cls, options: Mapping[str, Any], *, precision: str = "int8",
                 log: Callable[[str], None] | None = None):
        """The accelerator of ``--config`` (a JSON file or a shipped config's name, as on
        every command: `vdla.shipped.resolve_config`; else VTA's default), on ``--sim``
        (default `DEFAULT_BACKEND`); with ``--board`` the board's config (``--config``
        applied to it) and, on Verilator, its DRAM timing."""
        spec, board = options.get("config"), options.get("board")
        config = load_config(spec) if spec else None
        backend = options.get("sim") or DEFAULT_BACKEND
        # Verilator's model build says what it is doing (a minute the first time).
        device_options = {"log": log} if log is not None and backend == "verilator" else {}
        if board is not None:
            board = get_board(board)
            config = board.apply(config)
            if backend == "verilator":      # the board's memory, on the timed model
                device_options["dram"] = board.dram_timing(config)
        return cls(config, backend=backend, board=board, **device_options)

    def describe_schedule(self, schedule: Mapping[str, Any]) -> str:
        """A convolution's ``h14 w56 ci4 co4`` (``oc2``/``ht2``: two virtual threads), a
        pool's ``h8 w56 c4``, an elementwise op's ``key=value`` pairs."""
        if not {"tile_h", "tile_w"} <= set(schedule):
            return " ".join(f"{k}={v}" for k, v in schedule.items())
        text = f"h{schedule['tile_h']} w{schedule['tile_w']}"
        if "tile_c" in schedule:    # a pool
            return text + f" c{schedule['tile_c']}"
        text += f" ci{schedule['tile_ci']} co{schedule['tile_co']}"
        if schedule.get("oc_nthread", 1) > 1:
            text += f" oc{schedule['oc_nthread']}"
        if schedule.get("h_nthread", 1) > 1:
            text += f" ht{schedule['h_nthread']}"
        return text

    def title(self) -> str:
        return f"config {self.config.name}, {self.device_backend or self.backend} backend"

    def time_note(self, summary: Mapping[str, Any]) -> str:
        board = "" if self.board is None else f" ({self.board.name})"
        return (f"cycles at {self.config.clock_mhz:g} MHz{board} (accelerator ops) + host "
                "wall time")

    def report_lines(self, summary: Mapping[str, Any]) -> list[str]:
        """The board it was timed on, the total cycles at the clock, the GEMM
        utilization of the whole model."""
        lines = []
        if self.board is not None:
            board, dram = self.board, self.board.dram_timing(self.config)
            lines.append(f"board: {board.name} ({board.part.name}) at {board.clock_mhz:g} MHz, "
                         f"DRAM {dram.bytes_per_cycle:g} bytes/cycle, {dram.read_latency}-cycle"
                         " read latency" + ("" if self.backend == "verilator"
                                            else " (the functional backend has no timing)"))
        if summary.get("cycles") is None:
            hint = "" if self.device_backend else "; use --sim verilator"
            lines.append(f"total cycles: - (the {summary.get('backend')} backend counts no "
                         f"cycles{hint})")
        else:
            lines.append(f"total cycles: {summary['cycles']:,} = "
                         f"{summary['seconds_at_clock'] * 1e3:.3f} ms at "
                         f"{summary['clock_mhz']:g} MHz")
        lines.append(self._utilization_line(summary))
        return lines

    def _utilization_line(self, summary: Mapping[str, Any]) -> str:
        """The whole model's GEMM utilization and what it counts."""
        if summary["gemm_utilization"] is None:
            why = (f"the {summary.get('backend')} backend counts no cycles"
                   if summary.get("cycles") is None else f"no op on {self.name} does useful MACs")
            return f"GEMM utilization: - ({why})"
        return (f"GEMM utilization: {summary['gemm_utilization']:.1%} = {summary['macs']:,} "
                f"useful MACs / ({summary['cycles']:,} cycles x {summary['macs_per_cycle']} "
                f"MACs/cycle); the cycles of the ops on {self.name} only, host ops excluded")
