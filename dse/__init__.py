"""Design-space sweeps over hardware parameters (``vdla sweep``).

A design point is a `vdla.HardwareConfig` on a board's part. Evaluating one runs in
tiers, because the slow tools are far too slow for hundreds of points
(docs/tool-facts.md, yosys): validity (a reason for every invalid point), then models
(whole-model cycles from the compiler's timing model, resources from an analytical model
calibrated against yosys), and, for the Pareto front only, confirmation with Verilator
and yosys.
"""
