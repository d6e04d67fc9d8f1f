"""bench/vdla_transformers.py end to end on bert_tiny (the functional simulator, the
timing model's cycles): its figures add up, it writes them, and it refuses bad
arguments by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from script_loading import load_script

BENCH = Path(__file__).resolve().parents[4] / "bench" / "vdla_transformers.py"


def test_bench_splits_a_transformer_between_accelerator_and_host(tmp_path, capsys):
    bench = load_script(BENCH)
    out = tmp_path / "figures.json"
    assert bench.main(["--models", "bert_tiny", "--calibration", "1", "--json",
                       str(out)]) == 0
    text = capsys.readouterr().out
    assert "bert_tiny: cycles from the timing model, bit-exact" in text
    assert "MAC bound" in text and "host qattention" in text
    figures = json.loads(out.read_text())
    assert figures["config"] and figures["machine"]["cpu"]
    r = figures["models"][0]
    # Every dense layer runs on the accelerator over the image of its rows: well above
    # the few percent of the row-by-row form.
    assert r["gemm_cycles"] > r["mac_bound"] > 0 and r["gemm_share_of_bound"] > 0.3
    assert {"qattention", "qlayer_norm", "qgelu"} <= set(r["host_ops"])
    assert "qdense" not in r["host_ops"] and r["attention_cycles"] == 0   # blocks differ
    assert r["end_to_end_ms"] == pytest.approx(r["accelerator_ms"] + r["host_ms"])
    assert 0 < r["accelerator_share"] < 1


@pytest.mark.parametrize("argv, message", [
    (["--models", "resnet18"], "--models: resnet18 is not a zoo transformer"),
    (["--calibration", "0"], "--calibration must be at least 1, not 0"),
    (["--config", "no-such-board"], "--config no-such-board"),
    (["--backend", "gpu"], "--backend: invalid choice: 'gpu'"),
])
def test_bench_refuses_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit):
        load_script(BENCH).main(argv)
    assert message in capsys.readouterr().err
