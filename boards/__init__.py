"""FPGA boards: definitions, board-level Verilog, constraints, vendor project scripts and
resource/Fmax estimates.

`catalog.get(name)` returns a `Board` (part, clock, DRAM port, register window and a
default `HardwareConfig` that fits); `project.generate(board, config, out_dir)` writes
the files for the board's vendor tool; `estimate.estimate(board, config)` synthesises
with yosys (and, for the ECP5, places and routes with nextpnr) and compares the
resources with the part's capacity.
"""

from vdla.boards.board import Board, Family, Part, Resources
from vdla.boards.catalog import BOARDS, get, names, runtime_hosts

__all__ = ["Board", "Family", "Part", "Resources", "BOARDS", "get", "names", "runtime_hosts"]
