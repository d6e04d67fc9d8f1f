"""`vdla roofline MODEL`: the estimate's report (first line says ESTIMATE, a table and
totals per GPU, the side-by-side summary), --top, --json, --plot, and clear errors."""

from __future__ import annotations

import json

import pytest

from vdla.cli import main

PNG = b"\x89PNG\r\n\x1a\n"


def test_small_cnn_on_the_default_gpus(capsys):
    assert main(["roofline", "small_cnn"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ESTIMATE: roofline bounds from datasheet peaks")
    assert lines[1].startswith("small_cnn, batch 1, int8: the quantized graph, 9 kernels")
    text = "\n".join(lines)
    for name, title in (("h100-sxm", "NVIDIA H100 SXM5 80GB"),
                        ("a100-sxm", "NVIDIA A100 SXM4 80GB")):
        assert f"{name}: {title}: INT8 " in text
    assert text.count("  source: ") == 2 and text.count("  kernel  ") == 2
    rows = [line.split() for line in lines if line.startswith("  conv1 ")]
    assert len(rows) == 2 and all(r[1] == "qconv2d" and r[7] == "memory" for r in rows)
    assert "flatten" not in text
    assert text.count("  total: roofline ") == 2
    summary = lines[lines.index("GPU       roofline ms  with launches ms  compute-bound") + 1:]
    assert [line.split()[0] for line in summary] == ["h100-sxm", "a100-sxm"]
    assert all(line.split()[-1].endswith("/9") for line in summary)


def test_resnet18_on_two_gpus_with_json_and_plot(tmp_path, capsys):
    out, chart = tmp_path / "r.json", tmp_path / "r.png"
    assert main(["roofline", "resnet18", "--gpu", "H100-SXM,l4", "--top", "5",
                 "--json", str(out), "--plot", str(chart)]) == 0
    text = capsys.readouterr().out
    assert text.count("  ... 20 more") == 2 and f"wrote {out}, {chart}" in text
    assert "GPU       roofline ms" in text and "\nl4  " in text
    doc = json.loads(out.read_text())
    assert (doc["model"], doc["precision"], doc["batch"]) == ("resnet18", "int8", 1)
    assert doc["note"].startswith("ESTIMATE") and doc["launch_seconds_per_kernel"] == 3e-6
    assert list(doc["gpus"]) == ["h100-sxm", "l4"]
    for est in doc["gpus"].values():
        kernels = est["kernels"]
        assert len(kernels) == 25 and kernels[0]["op"] == "quantize"
        assert est["seconds"] == pytest.approx(sum(k["seconds"] for k in kernels))
        assert est["seconds_with_launch"] == pytest.approx(est["seconds"] + 25 * 3e-6)
        assert est["macs"] == pytest.approx(1.814e9, rel=1e-3)   # ResNet-18's 1.8 GMACs
        assert est["kernels_compute_bound"] + est["kernels_memory_bound"] == 25
    # The L4's 300 GB/s makes the same traffic take 11x longer than on the H100.
    assert doc["gpus"]["l4"]["seconds"] > 5 * doc["gpus"]["h100-sxm"]["seconds"]
    assert chart.read_bytes()[:8] == PNG and chart.stat().st_size > 20_000


def test_float16_uses_the_float_graph(capsys):
    assert main(["roofline", "small_cnn", "--gpu", "t4", "--precision", "float16"]) == 0
    text = capsys.readouterr().out
    assert "float16: the float graph" in text and "float16 ridge at" in text
    assert "quantize" not in text and "GPU       roofline" not in text   # one GPU


def test_unknown_gpu_and_bad_options_are_clear_errors(capsys):
    assert main(["roofline", "small_cnn", "--gpu", "h100-sxm,v100"]) == 1
    err = capsys.readouterr().err
    assert "--gpu: unknown GPU(s) v100; known GPUs: h100-sxm, h100-pcie, h200" in err
    assert main(["roofline", "small_cnn", "--top", "0"]) == 1
    assert "--top must be a positive integer" in capsys.readouterr().err
    assert main(["roofline", "nosuch"]) == 1
    assert "unknown model 'nosuch'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["roofline", "small_cnn", "--precision", "bf16"])
    assert exc.value.code == 2
    assert "--precision: invalid choice: 'bf16'" in capsys.readouterr().err
