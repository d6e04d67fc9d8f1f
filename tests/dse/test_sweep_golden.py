"""The sweep's evaluation of a point is unchanged: ResNet-18 on the pynq-z1 at a few
points of bench/sweep_resnet18_pynq.toml's grid, evaluated now and compared exactly
with what the code computed before the timing model was split out of `conv_layer` and
made faster (`data/sweep_golden.json`).

The golden file holds, per point: its parameters; the record's validity, reason,
objectives (the accelerator's latency, cycles, resources), fit and utilization; and every node's
estimate (target, cycles, MACs and the default chooser's schedule). Every number must
be equal: the timing model and the chooser may only get faster, never different.

Regenerate (only when a change of the timing model's answers is intended, and say so
in the change): ``python3 tests/dse/test_sweep_golden.py --regen``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from vdla.dse.evaluate import Evaluator
from vdla.dse.spec import SweepSpec

GOLDEN = Path(__file__).resolve().parent / "data" / "sweep_golden.json"

#: The sweep's spec but its parameters (bench/sweep_resnet18_pynq.toml).
SPEC = {"board": "pynq-z1", "search": "grid",
        "objectives": ["latency_ms", "lut", "bram", "dsp"],
        "models": [{"name": "resnet18"}]}

_BASE = ["MIN", "MAX", "ADD", "SHR"]
#: Points spread over the grid: every block shape kind (equal, block_in > block_out
#: and the reverse), small and large buffers, with and without the ALU's MUL.
POINTS = [
    {"block_in": 8, "block_out": 8, "inp_buff_size": "16K", "wgt_buff_size": "64K",
     "acc_buff_size": "32K", "uop_buff_size": "16K", "alu_ops": _BASE},
    {"block_in": 16, "block_out": 16, "inp_buff_size": "32K", "wgt_buff_size": "128K",
     "acc_buff_size": "64K", "uop_buff_size": "32K", "alu_ops": _BASE + ["MUL"]},
    {"block_in": 32, "block_out": 8, "inp_buff_size": "64K", "wgt_buff_size": "256K",
     "acc_buff_size": "128K", "uop_buff_size": "16K", "alu_ops": _BASE},
    {"block_in": 8, "block_out": 32, "inp_buff_size": "64K", "wgt_buff_size": "128K",
     "acc_buff_size": "128K", "uop_buff_size": "32K", "alu_ops": _BASE + ["MUL"]},
]


def evaluate(params: dict) -> dict:
    """What the golden file holds of the point `params` (see the module docstring)."""
    # A one-point grid: the spec parses the values ("16K", ALU op names) as a sweep does.
    spec = SweepSpec.from_dict({**SPEC, "parameters": {k: [v] for k, v in params.items()}})
    (params,) = spec.points()
    evaluator = Evaluator(spec)
    record = evaluator(params)
    out = {k: record[k] for k in ("params", "valid", "reason", "objectives", "fits",
                                  "utilization", "models")}
    if record["valid"]:
        # The file pins the timing and resource models: the latency it holds is the
        # accelerator's. The host's time (this machine's host model) is added apart.
        objectives = dict(out["objectives"])
        host = objectives.pop("host_ms")
        assert objectives["latency_ms"] == objectives["accelerator_ms"] + host
        objectives["latency_ms"] = objectives.pop("accelerator_ms")
        out["objectives"] = objectives
        out["models"] = {name: {k: v for k, v in m.items()
                                if k not in ("accelerator_ms", "host_ms", "latency_ms")}
                         for name, m in out["models"].items()}
    design = evaluator.design(params)
    if design.config is not None:
        target = evaluator._target(design.config)
        graph = evaluator._graph("resnet18", target)
        out["ops"] = [[o.name, o.target, o.cycles, o.macs, o.schedule]
                      for o in target.estimate(graph)]
    return out


def _with_fresh_cache(fn):
    """Run `fn` with the default choosers' on-disk cache empty, so they search."""
    old = os.environ.get("VDLA_CACHE")
    with tempfile.TemporaryDirectory() as folder:
        os.environ["VDLA_CACHE"] = folder
        try:
            return fn()
        finally:
            if old is None:
                os.environ.pop("VDLA_CACHE", None)
            else:
                os.environ["VDLA_CACHE"] = old


def test_the_sweeps_evaluation_is_unchanged():
    golden = json.loads(GOLDEN.read_text())
    assert len(golden) == len(POINTS)
    got = _with_fresh_cache(lambda: [json.loads(json.dumps(evaluate(p))) for p in POINTS])
    for want, have in zip(golden, got):
        assert have["params"] == want["params"]
        assert have.get("ops") == want.get("ops"), f"per-node estimates of {want['params']}"
        assert have == want, f"the record of {want['params']}"


def main(argv: list[str]) -> int:
    if argv != ["--regen"]:
        print(f"usage: python3 {Path(__file__).name} --regen  (rewrites {GOLDEN.name})",
              file=sys.stderr)
        return 2
    data = _with_fresh_cache(lambda: [evaluate(p) for p in POINTS])
    GOLDEN.parent.mkdir(exist_ok=True)
    tmp = GOLDEN.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(GOLDEN)      # atomic: a reader never sees half a file
    print(f"wrote {GOLDEN} ({len(data)} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
