"""examples/: the blocked GEMM assembly program with its DRAM image runs on `vdla sim`
and stores clip((A . B^T) >> 6), checked against numpy here (not the script's own
check), on both backends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vdla.cli import main

from script_loading import load_script

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _gemm_script():
    return load_script(EXAMPLES / "blocked_gemm.py")


@pytest.mark.parametrize("backend", ["functional", "verilator"])
def test_the_blocked_gemm_example_stores_what_numpy_computes(tmp_path, capsys, backend):
    script = _gemm_script()
    image, dump = tmp_path / "gemm.dram", tmp_path / "after.dram"
    image.write_bytes(script.image(seed=3))
    assert main(["sim", str(EXAMPLES / "blocked_gemm.asm"), "--dram", str(image),
                 "--dump", str(dump), "--backend", backend]) == 0
    out = capsys.readouterr().out
    assert "10 instructions at DRAM 0x600" in out
    a, b = script.operands(seed=3)
    assert a.shape == (2, 32) and b.shape == (32, 32)
    want = np.clip((a.astype(np.int64) @ b.astype(np.int64).T) >> 6, -128, 127)
    after = np.frombuffer(dump.read_bytes(), np.int8)
    np.testing.assert_array_equal(after[0x500:0x500 + 64].reshape(2, 32), want)
    # Everything but C is as the image left it (the loads read, nothing else written).
    before = np.frombuffer(image.read_bytes(), np.int8)
    np.testing.assert_array_equal(after[:0x500], before[:0x500])


def test_the_script_writes_the_image_and_checks_a_dump(tmp_path):
    """The commands examples/README.md gives, as a user types them."""
    image, dump = tmp_path / "gemm.dram", tmp_path / "after.dram"
    run = [sys.executable, str(EXAMPLES / "blocked_gemm.py")]
    subprocess.run([*run, "image", str(image)], check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "vdla", "sim", str(EXAMPLES / "blocked_gemm.asm"),
                    "--backend", "functional", "--dram", str(image), "--dump", str(dump)],
                   check=True, capture_output=True)
    check = subprocess.run([*run, "check", str(dump)], capture_output=True, text=True)
    assert check.returncode == 0 and "equals clip((A . B^T) >> 6)" in check.stdout
    wrong = bytearray(dump.read_bytes())
    wrong[0x500] ^= 1
    dump.write_bytes(bytes(wrong))
    check = subprocess.run([*run, "check", str(dump)], capture_output=True, text=True)
    assert check.returncode == 1 and "differs from numpy in 1 of 64" in check.stderr


def test_the_sweep_examples_latency_bound_does_what_its_comment_says(tmp_path, capsys):
    """examples/sweep_small_cnn.toml's comment: the bound takes the 1x8x8 cores (the
    slowest) off the front, every faster core shape stays on it, and 1x16x16 is the
    fastest. A change to the timing model that moves a shape across the bound fails
    here, not in a reader's run."""
    import json

    from vdla.dse.spec import SweepSpec

    spec_path = EXAMPLES / "sweep_small_cnn.toml"
    spec = SweepSpec.from_toml(spec_path)
    out = tmp_path / "out"
    assert main(["sweep", str(spec_path), "--out", str(out), "--no-plots"]) == 0
    capsys.readouterr()
    doc = json.loads((out / "sweep.json").read_text())
    valid = [p for p in doc["points"] if p["valid"] and p["fits"]]
    shape = lambda p: f"{p['params']['block_in']}x{p['params']['block_out']}"  # noqa: E731
    latency = {}
    for p in valid:
        latency.setdefault(shape(p), []).append(p["objectives"]["latency_ms"])
    assert set(latency) == {"8x8", "8x16", "16x8", "16x16"}
    assert min(latency["8x8"]) > spec.max_latency_ms
    faster = [v for s, vs in latency.items() if s != "8x8" for v in vs]
    assert max(faster) < spec.max_latency_ms
    on_front = {shape(p) for p in valid if p["key"] in doc["front"]}
    assert "8x8" not in on_front and "16x16" in on_front
    assert min(latency["16x16"]) == min(v for vs in latency.values() for v in vs)
