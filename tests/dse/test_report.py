"""vdla.dse.report: tables, plots, the HTML page and the JSON document of a sweep."""

import base64
import json
import random
import re

import pytest

from vdla.dse.pareto import pareto_front
from vdla.dse.report import (front_markdown, front_table, html_report, invalid_reasons,
                             most_important_parameter, plot, to_json)

PARAMS = ["block_in", "block_out", "inp_buff_size"]
OBJECTIVES = ["latency_ms", "lut", "bram", "dsp"]
PART = {"name": "xc7z020clg400-1", "lut": 53200, "ff": 106400, "dsp": 220, "bram": 140}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def synthetic(n=120, seed=0):
    """Points where the GEMM size drives latency (down) and LUTs (up); the buffer size
    drives BRAM only; some points are invalid."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        bi, bo = rng.choice([8, 16, 32]), rng.choice([8, 16, 32])
        buf = rng.choice([8192, 32768])
        params = {"block_in": bi, "block_out": bo, "inp_buff_size": buf}
        key = f"{i:06x}"
        if i % 10 == 9:
            records.append({"key": key, "params": params, "config": None,
                            "config_name": None, "valid": False,
                            "reason": f"inp_buff_size {buf} holds no tile of {bi * 64} bytes",
                            "objectives": dict.fromkeys(OBJECTIVES), "fits": None,
                            "models": {}, "confirmed": None})
            continue
        macs = bi * bo
        lut = 25 * macs * rng.uniform(0.9, 1.1) + 2000
        records.append({
            "key": key, "params": params, "config": {},
            "config_name": f"1x{bi}x{bo}_i8w8a32_{buf.bit_length() - 1}_15_18_17_{i}",
            "valid": True, "reason": None,
            "objectives": {"latency_ms": 1000 / macs * rng.uniform(0.9, 1.1), "lut": lut,
                           "bram": buf / 1024 + macs / 64 + rng.choice([0, 0.5]),
                           "dsp": macs // 2},
            "fits": lut < PART["lut"], "models": {"resnet18": {"weight": 1.0}},
            "confirmed": None})
    return records


def confirm(record):
    o = record["objectives"]
    record["confirmed"] = {
        "cycles": 123456, "resources": {"lut": 1000, "ff": 500, "dsp": o["dsp"], "bram": 10},
        "fmax_mhz": None, "error": {"cycles": -0.0123, "lut": 0.05, "ff": 0.0,
                                    "bram": 0.25, "dsp": -2}}


@pytest.fixture(scope="module")
def sweep():
    records = synthetic()
    front = pareto_front(records, OBJECTIVES)
    confirm(front[0])
    return records, front


def test_most_important_parameter_finds_the_driver():
    records = synthetic()
    # block_in and block_out matter equally to latency; the buffer size not at all.
    assert most_important_parameter(records, ["inp_buff_size", "block_in"]) == "block_in"
    assert most_important_parameter(records, ["inp_buff_size", "block_out"]) == "block_out"
    assert most_important_parameter(records, PARAMS, "bram") == "inp_buff_size"
    for r in records:
        r["params"]["noise"] = random.Random(r["key"]).random() < 0.5
    assert most_important_parameter(records, ["noise", "block_in"]) == "block_in"


def test_most_important_parameter_edge_cases():
    invalid = [r for r in synthetic() if not r["valid"]]
    assert most_important_parameter(invalid, PARAMS) == "block_in"   # nothing varies
    with pytest.raises(ValueError, match="no swept parameters"):
        most_important_parameter(synthetic(), [])
    with pytest.raises(ValueError, match="unknown objective 'area'"):
        most_important_parameter(synthetic(), PARAMS, "area")


def test_front_table(sweep):
    records, front = sweep
    text = front_table(front, PARAMS, OBJECTIVES)
    lines = text.splitlines()
    assert len(lines) == 2 + len(front)
    for r in front:
        assert r["config_name"] in text
    for column in ("latency ms", "LUT", "sim cycles", "cycles err", "LUT err", "BRAM err",
                   "DSP diff"):
        assert column in lines[0]
    confirmed = next(line for line in lines if front[0]["config_name"] in line)
    assert "-1.2%" in confirmed and "+5.0%" in confirmed and "+25.0%" in confirmed
    assert "123,456" in confirmed and re.search(r"\s-2$", confirmed)
    # Best latency first; the header and the rule line up.
    by_latency = sorted(front, key=lambda r: r["objectives"]["latency_ms"])
    assert [line.split()[0] for line in lines[2:]] == [r["config_name"] for r in by_latency]
    assert len(lines[0]) == len(lines[1])


def test_front_table_formats_values():
    record = {"key": "k", "params": {"block_in": 16, "alu_mul": True},
              "config_name": "cfg", "valid": True,
              "objectives": {"latency_ms": 12.3456, "cycles": 1234567, "lut": 19861.4,
                             "bram": 126.5, "gemm_utilization": 0.614},
              "confirmed": None}
    text = front_table([record], ["block_in", "alu_mul"],
                       ["latency_ms", "cycles", "lut", "bram", "gemm_utilization"])
    row = text.splitlines()[2].split()
    assert row == ["cfg", "16", "yes", "12.3", "1,234,567", "19,861", "126.5", "61.4%"]
    assert "sim cycles" not in text                  # nothing confirmed: no such columns


def test_front_markdown(sweep):
    records, front = sweep
    text = front_markdown(front, PARAMS, OBJECTIVES)
    lines = text.splitlines()
    assert lines[0].startswith("| config | block_in |") and "| DSP diff |" in lines[0]
    assert re.fullmatch(r"\|---(\|---:)+\|", lines[1])
    assert len(lines) == 2 + len(front)
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    for r in front:
        assert f"| {r['config_name']} |" in text


def test_invalid_reasons_group_by_text_without_numbers():
    records = [{"valid": False, "reason": "inp_buff_size 1024 holds no tile of 2048 bytes"},
               {"valid": False, "reason": "wgt_buff_size too small"},
               {"valid": False, "reason": "inp_buff_size 512 holds no tile of 4096 bytes"},
               {"valid": False, "reason": None},
               {"valid": True, "reason": None}]
    assert invalid_reasons(records) == [
        ("inp_buff_size 1024 holds no tile of 2048 bytes", 2),
        ("wgt_buff_size too small", 1), ("(no reason given)", 1)]
    assert invalid_reasons(records[4:]) == []


def test_plot_writes_png_and_svg(tmp_path, sweep):
    records, front = sweep
    paths = plot(records, front, tmp_path / "plots", color_by="block_in", part=PART)
    assert paths == [tmp_path / "plots/sweep.png", tmp_path / "plots/sweep.svg"]
    png = paths[0].read_bytes()
    assert png.startswith(PNG_SIGNATURE) and len(png) > 30_000
    svg = paths[1].read_text()
    assert "<svg" in svg and "</svg>" in svg and len(svg) > 30_000
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["sweep.png", "sweep.svg"]


def test_plot_draws_the_max_utilization_line_beside_the_capacity(tmp_path, sweep):
    records, front = sweep
    svg = plot(records, front, tmp_path, color_by="block_in", part=PART)[1].read_text()
    assert "part capacity" in svg and "max_utilization" not in svg
    svg = plot(records, front, tmp_path, color_by="block_in", part=PART,
               basename="limited", max_utilization=0.96)[1].read_text()
    assert "max_utilization (96%)" in svg


def test_plot_colorbar_names_and_no_points(tmp_path, sweep):
    records, front = sweep
    # Many numeric values: a colorbar.
    records = [dict(r, params=dict(r["params"], depth=2 ** (i % 14)))
               for i, r in enumerate(records)]
    paths = plot(records, front, tmp_path, color_by="depth", basename="many")
    assert paths[0].read_bytes().startswith(PNG_SIGNATURE)
    invalid = [r for r in records if not r["valid"]]
    paths = plot(invalid, [], tmp_path, color_by="block_in", basename="empty", part=PART)
    assert paths[0].name == "empty.png" and paths[0].stat().st_size > 10_000
    with pytest.raises(ValueError, match=r"cannot colour by 'colour'.*block_in"):
        plot(records, front, tmp_path, color_by="colour")


def test_plot_without_a_colour_parameter_for_a_sweep_where_nothing_varies(tmp_path, sweep):
    records, front = sweep
    one = [dict(records[0], params={"block_in": 16})]
    for color_by in (None, "block_in"):
        paths = plot(one, pareto_front(one, OBJECTIVES), tmp_path, color_by=color_by,
                     basename=f"one-{color_by}", part=PART)
        assert paths[0].read_bytes().startswith(PNG_SIGNATURE)
    paths = plot(records, front, tmp_path, color_by=None, basename="plain", part=PART)
    assert paths[0].read_bytes().startswith(PNG_SIGNATURE)


def test_html_report_is_self_contained(tmp_path, sweep):
    records, front = sweep
    paths = plot(records, front, tmp_path, color_by="block_in", part=PART)
    page = html_report(records, front, PARAMS, OBJECTIVES, paths, title="sweep <test>",
                       summary={"models": ["resnet18"], "part": PART["name"],
                                "search": "grid", "elapsed_s": 1.5})
    assert page.startswith("<!DOCTYPE html>") and "<title>sweep &lt;test&gt;</title>" in page
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)
    assert page.count("<table>") == 2
    for r in front:
        assert r["config_name"] in page
    # The PNG is embedded once, as a data URI holding the file itself.
    uris = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(uris) == 1 and base64.b64decode(uris[0]) == paths[0].read_bytes()
    valid = sum(r["valid"] for r in records)
    assert f"<dt>valid</dt><dd>{valid}</dd>" in page
    assert "<dt>elapsed s</dt><dd>1.5</dd>" in page and "<dd>resnet18</dd>" in page
    assert "holds no tile of" in page
    # An SVG alone is embedded as markup.
    page = html_report(records, front, PARAMS, OBJECTIVES, paths[1:], title="t", summary={})
    assert "<svg" in page and "<?xml" not in page and "data:image/png" not in page


def test_html_escapes_reasons():
    records = [{"key": "a", "valid": False, "reason": "<script>alert(1)</script>",
                "objectives": dict.fromkeys(OBJECTIVES)}]
    page = html_report(records, [], PARAMS, OBJECTIVES, [], title="t", summary={})
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "Every point is valid" not in page


def test_to_json(sweep):
    records, front = sweep
    document = to_json(records, front, {"part": PART["name"]})
    assert document["front"] == [r["key"] for r in front]
    assert document["points"] == records and document["meta"] == {"part": PART["name"]}
    assert json.loads(json.dumps(document)) == document
    with pytest.raises(ValueError, match="not among the records"):
        to_json(records[:1], front, {})


def test_front_table_splits_the_latency_into_accelerator_and_host():
    record = {"key": "k", "params": {"block_in": 16}, "config_name": "cfg", "valid": True,
              "objectives": {"latency_ms": 8.4988, "accelerator_ms": 4.70468,
                             "host_ms": 3.79412, "lut": 19861.4},
              "confirmed": None}
    lines = front_table([record], ["block_in"], ["latency_ms", "lut"]).splitlines()
    assert lines[0].split() == ["config", "block_in", "latency", "ms", "accelerator", "ms",
                                "host", "ms", "LUT"]
    assert lines[2].split() == ["cfg", "16", "8.50", "4.70", "3.79", "19,861"]
    # Named as objectives, they are not shown twice.
    text = front_table([record], ["block_in"], ["latency_ms", "host_ms", "lut"])
    assert text.splitlines()[0].count("host ms") == 1
