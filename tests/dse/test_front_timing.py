"""bench/front_timing.py's choice of configs from an extensions sweep's fronts (the Verilator
runs themselves are the bench script's job, minutes a config)."""

import json
from pathlib import Path

import pytest

from vdla import HardwareConfig

from script_loading import load_script

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    return load_script(ROOT / "bench" / "front_timing.py")


def _point(lut, **params):
    # The extensions sweep's buffers: 128 KiB of weights, 64 KiB of accumulators.
    config = HardwareConfig(**{"wgt_buff_size": 131072, "acc_buff_size": 65536, **params})
    return {"config_name": config.name, "config": config.to_dict(),
            "objectives": {"lut": lut, "latency_ms": 1.0}}


def test_one_config_per_combination_the_fastest(tmp_path):
    bench = _bench()
    req = ["MIN", "MAX", "ADD", "SHR", "REQ"]
    fronts = {"resnet18": {
        "without": [_point(11_000, block_out=8, dram_bus_width=128)],
        "with": [_point(11_000, block_out=8, dram_bus_width=128),
                 _point(13_000, block_out=8, alu_ops=req, dram_bus_width=128),
                 _point(22_000, alu_ops=req, dram_bus_width=128),
                 # The DSP limit changes no cycle: the same combination as REQ alone.
                 _point(30_000, block_in=8, block_out=32, alu_ops=req, gemm_dsp_limit=64,
                        dram_bus_width=128)]},
        "mobilenet_v1": {"without": [], "with": [
            _point(16_000, block_in=8, dw_taps=3, dram_bus_width=128)]}}
    path = tmp_path / "fronts.json"
    path.write_text(json.dumps({"board": "pynq-z1", "fronts": fronts}))
    configs = bench.front_configs(path)
    assert [bench.combination(c) for c in configs] == ["bus128", "dw3-bus128", "req-bus128"]
    assert [c.block_out for c in configs] == [8, 16, 32]      # the most LUTs of each
    # The board is applied: the 128-bit bus is bridged to the pynq-z1's port at 150 MHz.
    assert all(c.dram_bytes_per_cycle == 12 for c in configs)


def test_the_default_config_is_its_own_combination():
    assert _bench().combination(HardwareConfig()) == "-"


def test_a_missing_fronts_file_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        _bench().main([str(tmp_path / "nope.json")])
    assert "nope.json" in capsys.readouterr().err


def test_bad_arguments_are_named(tmp_path, capsys):
    bench = _bench()
    with pytest.raises(SystemExit):
        bench.main(["--config", "vta-plus", "--jobs", "0"])
    assert "--jobs must be 1 or more, not 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main([])
    assert "give either FRONTS.json or --config" in capsys.readouterr().err
