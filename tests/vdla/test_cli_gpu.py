"""The GPU target from the command line: `vdla run --target gpu` (on Triton's interpreter
here: the run says its times are not GPU times; --gpu adds a roofline estimate),
`vdla compare` with its gpu and estimate columns, `vdla tune --target gpu`, and the
errors a user meets, the missing gpu extra first."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from vdla.cli import main
from vdla.compiler.targets.gpu import runtime

needs_triton = pytest.mark.skipif(not runtime.available(),
                                  reason=f"the gpu extra is not installed: {runtime.INSTALL}")


@needs_triton
def test_run_on_the_interpreter_with_a_roofline_estimate(tmp_path, capsys):
    report = tmp_path / "r.json"
    assert main(["run", "small_cnn", "--target", "gpu", "--gpu", "a100-sxm",
                 "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "these times are the interpreter's, not GPU times" in out
    assert "roofline estimate on a100-sxm:" in out and "roofline us (est.)" in out
    assert "bit-exact vs the quantized reference: yes" in out
    assert "128x16x32 w4 s2" in out          # conv1's default tile, compactly
    doc = json.loads(report.read_text())
    summary = doc["summary"]["gpu"]
    assert summary["mode"] == "interpreter" and summary["roofline_gpu"] == "a100-sxm"
    assert 0 < summary["roofline_seconds"] < summary["roofline_with_launch_seconds"]
    assert doc["options"] == {"device": "auto", "mode": "interpreter",
                              "float_dtype": "float32", "gpu": "a100-sxm"}


@needs_triton
def test_run_float16(capsys):
    assert main(["run", "digits_cnn", "--target", "gpu", "--precision", "float16"]) == 0
    assert "within 0.01 of the float reference: yes" in capsys.readouterr().out


@needs_triton
def test_compare_lists_every_target_with_matching_outputs(tmp_path, capsys):
    """Every target named: vdla, cpu, gpu (the interpreter here), its roofline estimate
    and host, all bit-exact and with the same outputs."""
    chart, out = tmp_path / "c.png", tmp_path / "c.json"
    assert main(["compare", "small_cnn", "--targets", "vdla,cpu,gpu,host", "--chart",
                 str(chart), "--json", str(out), "--threads", "1", "--gpu", "l4"]) == 0
    text = capsys.readouterr().out
    assert "on vdla, cpu, gpu, gpu est., host" in text
    assert "gpu (interpreter)" in text and "gpu est. (l4)" in text
    assert "ESTIMATE: roofline on NVIDIA L4" in text and "not GPU times" in text
    doc = json.loads(out.read_text())
    assert doc["outputs_identical"] is True
    assert list(doc["targets"]) == ["vdla", "cpu", "gpu", "gpu est.", "host"]
    for name, result in doc["targets"].items():
        assert result["bit_exact"], (name, result["mismatch"])
    gpu, estimate = doc["targets"]["gpu"], doc["targets"]["gpu est."]
    assert estimate["estimate"] and 0 < estimate["total_seconds"] < gpu["total_seconds"]
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_triton
def test_tune_needs_a_gpu_or_the_interpreter(tmp_path, capsys):
    records = str(tmp_path / "r.db")
    if not runtime.cuda_available():
        assert main(["tune", "digits_cnn", "--target", "gpu", "--trials", "2",
                     "--records", records]) == 1
        assert "--measure interpreter runs the search" in capsys.readouterr().err
    assert main(["tune", "digits_cnn", "--target", "gpu", "--trials", "2", "--records",
                 records, "--measure", "interpreter"]) == 0
    assert "interpreter measurements" in capsys.readouterr().out
    assert main(["run", "digits_cnn", "--target", "gpu", "--records", records]) == 0
    assert "from the records" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--target", "gpu", "--gpu", "h900"],
     "unknown GPU 'h900'; known GPUs: h100-sxm, h100-pcie, h200, a100-sxm, l4, t4, rtx-4090"),
    (["--target", "gpu", "--device", "tpu"],
     "device must be one of auto, cuda, interpreter, not 'tpu'"),
    (["--target", "gpu", "--sim", "functional"], "--sim applies to --target vdla"),
    (["--target", "cpu", "--gpu", "l4"], "--gpu applies to --target gpu, not to --target cpu"),
    (["--target", "vdla", "--device", "cuda"], "--device applies to --target gpu"),
    (["--target", "cpu", "--precision", "float16"], "precision float16 does not run on "
                                                   "target 'cpu' (it runs int8, float32)"),
])
@needs_triton
def test_run_errors(capsys, argv, message):
    assert main(["run", "digits_cnn", *argv]) == 1
    assert message in capsys.readouterr().err


@needs_triton
def test_compare_unknown_gpu(capsys):
    """Checked before any model runs."""
    assert main(["compare", "digits_cnn", "--targets", "vdla,gpu", "--gpu", "v100"]) == 1
    assert ("--gpu: unknown GPU 'v100'; known GPUs: h100-sxm, h100-pcie, h200, a100-sxm, l4, "
            "t4, rtx-4090") in capsys.readouterr().err


def test_a_gpu_option_without_the_gpu_target_says_how_to_add_it(capsys):
    """Without --targets, where the default targets leave the GPU target out (no CUDA
    GPU, or no gpu extra), its option is an error that says why and what to do."""
    if runtime.available() and runtime.auto_mode() == "cuda":
        pytest.skip("a CUDA GPU: the default targets hold gpu")
    assert main(["compare", "digits_cnn", "--gpu", "l4"]) == 1
    err = capsys.readouterr().err
    assert "--gpu applies to --target gpu, not to --target vdla, cpu, host (gpu is left " \
           "out: " in err
    if runtime.available():
        assert "name gpu in --targets to add it" in err


@needs_triton
def test_cuda_without_a_gpu(capsys):
    # This process runs Triton's interpreter (tests/conftest.py; fixed already if an
    # earlier test ran the target) ...
    assert main(["run", "digits_cnn", "--target", "gpu", "--device", "cuda"]) == 1
    err = capsys.readouterr().err
    assert ("TRITON_INTERPRET is set: unset it to run on the GPU" in err
            or "kernels on interpreter (Triton fixes that when it is first imported); run "
               "device 'cuda' in a new process" in err), err
    if runtime.cuda_available():
        return
    # ... a fresh one, without it, finds no GPU.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", "import sys; from vdla.cli import main; "
                           "sys.exit(main(['run', 'digits_cnn', '--target', 'gpu', "
                           "'--device', 'cuda']))"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stderr
    assert "PyTorch sees no CUDA GPU" in done.stderr


@pytest.fixture
def no_triton(monkeypatch):
    """Triton and PyTorch missing, as on a machine without the gpu extra."""
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("triton", "torch") else find(name, *a))


def test_without_the_gpu_extra(no_triton, tmp_path, capsys):
    assert main(["run", "digits_cnn", "--target", "gpu"]) == 1
    err = capsys.readouterr().err
    assert "--target gpu: the gpu target needs triton and torch, which are not installed: " \
           "pip install 'vdla[gpu]'" in err
    # compare: the default targets go on without the gpu column; asking for it is an error
    assert main(["compare", "digits_cnn", "--targets", "cpu,gpu"]) == 1
    assert "pip install 'vdla[gpu]'" in capsys.readouterr().err
    assert main(["compare", "digits_cnn", "--chart", str(tmp_path / "c.png"),
                 "--threads", "1"]) == 0
    captured = capsys.readouterr()
    assert "no gpu column (the gpu target needs triton and torch" in captured.err
    assert "on vdla, cpu, host" in captured.out
    # the targets are listed all the same
    assert main(["targets"]) == 0
    assert "gpu: a GPU: Triton kernels" in capsys.readouterr().out
