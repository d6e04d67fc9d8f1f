"""bench/sweep_extensions.py's replot of an earlier run's fronts (the sweep itself is the
bench script's job, most of an hour)."""

import json
from pathlib import Path

import pytest

from vdla import HardwareConfig

from script_loading import load_script

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    return load_script(ROOT / "bench" / "sweep_extensions.py")


def _point(lut, latency_ms, **params):
    config = HardwareConfig(**params)
    return {"config_name": config.name, "config": config.to_dict(),
            "objectives": {"lut": lut, "latency_ms": latency_ms}}


def test_replot_draws_the_fronts_of_a_fronts_file(tmp_path, capsys):
    fronts = {"resnet18": {"without": [_point(20_000, 90.0)],
                           "with": [_point(20_000, 90.0),
                                    _point(23_000, 83.0, alu_ops=["MIN", "MAX", "ADD",
                                                                  "SHR", "REQ"])]}}
    path = tmp_path / "fronts.json"
    path.write_text(json.dumps({"commit": "abc1234", "fronts": fronts}))
    out = tmp_path / "out"
    assert _bench().main(["--replot", str(path), "--out", str(out)]) == 0
    assert (out / "fronts.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "abc1234" in capsys.readouterr().out


def test_replot_names_a_missing_fronts_file(tmp_path, capsys):
    with pytest.raises(SystemExit):
        _bench().main(["--replot", str(tmp_path / "nope.json")])
    assert "no fronts file at" in capsys.readouterr().err
