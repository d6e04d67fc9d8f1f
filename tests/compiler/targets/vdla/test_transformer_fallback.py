"""The accelerator target on a quantized transformer block too small to split its
attention into heads of whole blocks: its int8 dense layers run on the GEMM core (the
reshapes and the Q/K/V slices as views), the transformer ops it has no kernel for
(gather, qlayer_norm, qattention, qgelu, ...) fall back to the host with a reason, and
the whole model stays bit-exact against the integer reference."""

from __future__ import annotations

import numpy as np
import pytest

import vdla
from vdla.compiler import run_reference
from vdla.compiler.passes import fusion_counts, prepare, quantize
from vdla.compiler.passes.partition import HOST
from vdla.compiler.targets import compile_model
from vdla.compiler.targets.vdla import VdlaTarget

from transformer_blocks import block_graph, feed

CFG = vdla.HardwareConfig()


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "attention_mask"])
def test_transformer_block_falls_back_to_the_host_bit_exactly(masked):
    rng = np.random.default_rng(0)
    prepared = prepare(block_graph(masked))
    counts = fusion_counts(prepared)
    assert counts["layer_norm"] == 2 and counts["attention"] == 1 and counts["qkv"] == 1
    samples = [feed(rng, masked) for _ in range(4)]
    quantized = quantize(prepared, samples, "shift")
    target = VdlaTarget(CFG)
    compiled = compile_model(quantized, target)
    device = vdla.runtime.open(CFG, backend="functional")
    inputs = feed(rng, masked)
    result = compiled.session(device).run(inputs)
    want = run_reference(quantized, inputs)
    for name, value in want.items():
        np.testing.assert_array_equal(result.outputs[name], value)
    where = {s.name: s for s in result.ops}
    ops = {s.op for s in result.ops}
    assert {"qattention", "qlayer_norm", "qdense"} <= ops
    on_vdla = {s.op for s in result.ops if s.target == "vdla"}
    assert on_vdla == {"qdense", "reshape", "slice"}   # dense layers (Q/K/V merged), views
    for stat in where.values():
        if stat.target == HOST:
            assert stat.reason, f"{stat.name} ({stat.op}) fell back without a reason"
    for op in ("qattention", "qlayer_norm", "gather"):
        for stat in (s for s in result.ops if s.op == op):
            assert stat.target == HOST and op in stat.reason
