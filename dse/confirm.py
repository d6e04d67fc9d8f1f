"""Confirming points with the slow tools: Verilator cycles and yosys resources.

    confirmed = confirm(record, spec, log=print)     # the record's "confirmed" field

The sweep's figures come from models (`vdla.dse.evaluate`); the Pareto front is worth
minutes per point to check them. For each model of the sweep the point's config runs
the whole model on the cycle-accurate Verilator backend with the board's DRAM model
(through `vdla.compiler.pipeline.run_model`, so its outputs are also checked bit-exactly
against the quantized reference), and ``vdla estimate``'s yosys flow synthesizes the
config for the board's part (and, on the ECP5, nextpnr gives the Fmax). Both are cached
(the Verilator build by config, the synthesis by Verilog and tools), so confirming a
point again is quick.

The models' errors sit next to the measurements: relative for cycles, LUT, FF and BRAM
((model - measured) / measured), absolute for DSP (model - measured).
"""

from __future__ import annotations

import time
from typing import Callable, Mapping

from vdla.boards import get as get_board
from vdla.boards.estimate import estimate
from vdla.compiler import pipeline, targets
from vdla.config import HardwareConfig
from vdla.dse.spec import SweepSpec

__all__ = ["confirm", "model_errors"]


def model_errors(objectives: Mapping, cycles: float, resources: Mapping) -> dict:
    """The models' errors against the measurements (see the module docstring)."""
    def rel(model, measured):
        return None if model is None or not measured else (model - measured) / measured

    errors = {"cycles": rel(objectives.get("cycles"), cycles)}
    for key in ("lut", "ff", "bram"):
        errors[key] = rel(objectives.get(key), resources.get(key))
    errors["dsp"] = objectives.get("dsp") - resources.get("dsp")
    return errors


def confirm(record: Mapping, spec: SweepSpec, *, loaded: dict | None = None,
            log: Callable[[str], None] = lambda message: None) -> dict:
    """Measure a valid record's config with Verilator (every model) and yosys; returns
    its ``confirmed`` field. `loaded` caches the models between calls (name -> model)."""
    if not record.get("valid"):
        raise ValueError(f"point {record.get('key')} is invalid ({record.get('reason')}); "
                         "only valid points can be confirmed")
    board = get_board(spec.board)
    config = HardwareConfig.from_dict(record["config"])
    loaded = {} if loaded is None else loaded
    start = time.perf_counter()
    per_model, weighted, exact = {}, 0.0, True
    for m in spec.models:
        if m.name not in loaded:
            loaded[m.name] = pipeline.load_model(m.name, note=None)
        target = targets.get("vdla", config=config, backend="verilator",
                             dram=board.dram_timing(config), log=log)
        log(f"{config.name}: {m.name} on Verilator ...")
        outcome = pipeline.run_model(loaded[m.name], target)
        cycles = outcome.result.summary.get("vdla", {}).get("cycles")
        per_model[m.name] = {"cycles": cycles, "bit_exact": outcome.bit_exact}
        exact &= outcome.bit_exact
        weighted += m.weight * cycles
    verilator_s = time.perf_counter() - start
    log(f"{config.name}: yosys for {board.part.name} ...")
    synth = estimate(board, config, log=log)
    resources = synth.resources.to_dict()
    return {"cycles": int(round(weighted)), "models": per_model, "bit_exact": exact,
            "resources": resources, "fits": synth.fits, "fmax_mhz": synth.fmax_mhz,
            "tools": synth.tools, "verilator_seconds": round(verilator_s, 1),
            "yosys_seconds": round(synth.seconds, 1), "yosys_cached": synth.cached,
            "error": model_errors(record["objectives"], weighted, resources)}
