"""`vdla compare MODEL --onnxruntime` on a transformer: the zoo's bert_tiny (token ids and
an attention mask) on the CPU target with host fallback, beside onnxruntime's faster
float32 and faster int8 of its transformer paths, grouped as the targets' ops are."""

from __future__ import annotations

import json

from vdla.cli import main


def test_bert_tiny_beside_onnxruntimes_transformer_paths(tmp_path, capsys):
    chart, out = tmp_path / "c.png", tmp_path / "c.json"
    assert main(["compare", "bert_tiny", "--targets", "cpu", "--threads", "1",
                 "--onnxruntime", "--runs", "2", "--chart", str(chart),
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "onnxruntime fp32 (ref.)" in text and "onnxruntime int8 (ref.)" in text
    assert "the fastest of its float32 ways (fp32 " in text
    assert "the fastest of its int8 ways (int8-qdq-u8 " in text
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(out.read_text())
    assert doc["outputs_identical"] and doc["targets"]["cpu"]["bit_exact"]
    # vdla's own columns group the transformer's ops: no "other".
    assert {"dense", "attention", "norm", "embedding"} <= set(doc["targets"]["cpu"]["groups"])
    assert "other" not in doc["targets"]["cpu"]["groups"]
    fp32, int8 = doc["targets"]["onnxruntime fp32"], doc["targets"]["onnxruntime int8"]
    # Every onnxruntime way was built and timed (its optimizer, both quantizations), and
    # the column is the faster.
    assert set(fp32["options"]["variants_seconds"]) == {"fp32", "fp32-opt"}
    assert set(int8["options"]["variants_seconds"]) == {"int8-qdq-u8", "int8-dynamic"}
    for column in (fp32, int8):
        times = column["options"]["variants_seconds"]
        assert times[column["options"]["variant"]] == min(times.values())
        assert column["reference"] and column["bit_exact"] is None
        assert column["groups"]["dense"] > 0 and column["groups"]["norm"] > 0
        assert "other" not in column["groups"], column["groups"]
    assert fp32["max_error"] < 1e-4
    assert 0 < int8["max_error"] < 1.0                   # its own quantization
