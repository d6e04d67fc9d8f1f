"""A sweep over transformers: a point whose blocks leave attention whole on the host,
where the board's default config runs its heads' products, is invalid with the reason
(its latency would leave those products out), as a CNN's point that loses an op is."""

from __future__ import annotations

from vdla.dse.evaluate import make_evaluator


def test_a_point_that_loses_attentions_products_is_invalid():
    spec = {"board": "pynq-z1", "search": "grid", "objectives": ["latency_ms", "lut"],
            "models": [{"name": "bert_tiny"}],
            "parameters": {"block_in": [16], "block_out": [16, 32]}}
    evaluator = make_evaluator(spec)
    same = evaluator({"block_in": 16, "block_out": 16})
    assert same["valid"] and same["objectives"]["cycles"] > 0
    wide = evaluator({"block_in": 16, "block_out": 32})
    assert not wide["valid"]
    assert "fall to the host" in wide["reason"] and "qattention" in wide["reason"]
