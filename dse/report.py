"""Reports of a sweep: the front as tables, plots, one self-contained HTML page, JSON.

Every function takes design-point records, one JSON-ready dict per point:

    key : the store's key (hex), unique per point
    params : {name: value} of the swept parameters
    config, config_name : the `HardwareConfig` as a dict and its name (None if invalid)
    valid, reason : whether the point is a buildable design, and why not
    objectives : {objective: value} (`vdla.dse.pareto.OBJECTIVES`); None values if invalid
    fits : whether the point fits the part (None if invalid)
    utilization : {lut, ff, dsp, bram} shares of the part
    models : {model: {weight, cycles, accelerator_ms, host_ms, latency_ms,
        gemm_utilization}}
    host_model : whose host the host times are ({cpu, isa, numpy, date}; valid points)
    confirmed : None, or what Verilator and yosys measured for a front point:
        {cycles, resources: {lut, ff, dsp, bram}, fmax_mhz,
         error: {cycles, lut, ff, bram: (model - measured) / measured, dsp: model - measured}}
    units : optional {objective: unit} where the part's family decides (LUT6, RAMB36, ...)
    seconds : time spent evaluating the point
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from vdla._fileio import atomic_write
from vdla.dse.pareto import OBJECTIVES, check_objectives

__all__ = ["front_markdown", "front_table", "html_report", "invalid_reasons",
           "most_important_parameter", "plot", "to_json"]

#: Resources drawn against latency, one panel each.
PLOT_RESOURCES = ("lut", "bram", "dsp")
#: A colour parameter with at most this many values gets a legend, more a colorbar.
MAX_LEGEND_VALUES = 10
#: The objectives that are times (shown to 3 significant figures).
_TIMES = ("latency_ms", "accelerator_ms", "host_ms")


# --- which parameter matters ---------------------------------------------------------

def _group_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def most_important_parameter(records: Sequence[Mapping], params: Sequence[str],
                             objective: str = "latency_ms") -> str:
    """The swept parameter that explains most of the objective's spread over valid points.

    The measure is the correlation ratio eta² = (variance between the groups of points
    that share the parameter's value) / (total variance): 1 when the parameter alone
    sets the objective, 0 when it has no effect on the group means. It needs no order
    on the values (booleans and names work) and no model. Positive objectives are
    compared as logarithms, because parameters act on them by factors (twice the GEMM
    width, half the cycles). Ties, and sweeps where nothing varies, give the first of
    `params`.
    """
    check_objectives([objective])
    params = list(params)
    if not params:
        raise ValueError("no swept parameters to choose from")
    points = [r for r in records if r.get("valid") is True
              and (r.get("objectives") or {}).get(objective) is not None]
    values = np.array([float(r["objectives"][objective]) for r in points])
    if len(values) and np.all(values > 0):
        values = np.log(values)
    total = float(np.sum((values - values.mean()) ** 2)) if len(values) else 0.0
    best, best_eta2 = params[0], 0.0
    if total <= 0:
        return best
    for param in params:
        groups: dict[str, list[float]] = {}
        for r, v in zip(points, values):
            groups.setdefault(_group_key((r.get("params") or {}).get(param)), []).append(v)
        between = sum(len(g) * (np.mean(g) - values.mean()) ** 2 for g in groups.values())
        eta2 = float(between) / total
        if eta2 > best_eta2 + 1e-12:
            best, best_eta2 = param, eta2
    return best


# --- formatting ----------------------------------------------------------------------

def _units(records: Iterable[Mapping]) -> dict[str, str]:
    """The objectives' units: `OBJECTIVES`, overridden by the first record's "units"."""
    units = {name: o.unit for name, o in OBJECTIVES.items()}
    for r in records:
        if r.get("units"):
            units.update({k: v for k, v in r["units"].items() if v})
            break
    return units


def _header(name: str, units: Mapping[str, str]) -> str:
    label, unit = OBJECTIVES[name].label, units.get(name, "")
    if unit == "fraction":
        return label        # the cells carry the % sign
    return f"{label} {unit}" if unit and unit != label else label


def _count(name: str, value: float) -> str:
    """A count with thousands separators: whole units, except block RAMs, which come in
    halves (a RAMB36 holds two RAMB18) and keep one decimal when they have a fraction."""
    if name == "bram" and not float(value).is_integer():
        return f"{value:,.1f}"
    return f"{round(value):,}"


def _significant(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant figures, without exponents (1,234 keeps all four)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(digits - 1 - math.floor(math.log10(abs(value))), 0)
    return f"{value:,.{decimals}f}"


def _format_objective(name: str, value: Any, units: Mapping[str, str]) -> str:
    if value is None:
        return "-"
    if units.get(name) == "fraction":
        return f"{100 * value:.1f}%"
    if name in _TIMES:
        return _significant(value)
    return _count(name, value)


def _format_param(value: Any, common: frozenset = frozenset()) -> str:
    """A parameter value for a table: sizes of 1K and more in K or M (the buffers), a
    list (the ALU's ops) as its items that not every point has (`common`), joined."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and value >= 1024 and value & (value - 1) == 0:
        return f"{value >> 20}M" if value >= 1 << 20 else f"{value >> 10}K"
    if isinstance(value, (list, tuple)):
        return "+".join(str(v) for v in value if v not in common) or "-"
    return "-" if value is None else str(value)


def _common_items(records: Sequence[Mapping], param: str) -> frozenset:
    """The items every record's list value of `param` holds (shown once, in no row)."""
    values = [(r.get("params") or {}).get(param) for r in records]
    lists = [frozenset(v) for v in values if isinstance(v, (list, tuple))]
    return frozenset.intersection(*lists) if lists and len(lists) == len(values) else frozenset()


def _percent(error: Any) -> str:
    return "-" if error is None else f"{100 * error:+.1f}%"


def _difference(error: Any) -> str:
    return "-" if error is None else f"{error:+,.0f}"


def _point_name(record: Mapping) -> str:
    return record.get("config_name") or str(record.get("key", "?"))[:12]


def _best_first(front: Sequence[Mapping], name: str) -> list[Mapping]:
    sign = -1 if OBJECTIVES[name].direction == "maximize" else 1

    def key(r):
        value = (r.get("objectives") or {}).get(name)
        return (value is None, sign * value if value is not None else 0.0)

    return sorted(front, key=key)


def _with_split(front: Sequence[Mapping], objectives: Sequence[str]) -> list[str]:
    """The columns of `objectives`, with the latency's two parts after it (the
    accelerator's and the host's time) where the records have them and they are not
    objectives already."""
    split = any("host_ms" in (r.get("objectives") or {}) for r in front)
    out = []
    for name in objectives:
        out.append(name)
        if name == "latency_ms" and split:
            out += [n for n in ("accelerator_ms", "host_ms") if n not in objectives]
    return out


def _front_rows(front: Sequence[Mapping], params: Sequence[str],
                objectives: Sequence[str]) -> tuple[list[str], list[bool], list[list[str]]]:
    """The front's table as (headers, right-aligned per column, rows of cells), best
    first by the first objective. Confirmation columns appear when a point has them, and
    the accelerator's and the host's time after the latency (`_with_split`)."""
    objectives = check_objectives(objectives)
    units = _units(front)
    shown = _with_split(front, objectives)
    headers = ["config", *params, *(_header(n, units) for n in shown)]
    right = [False] + [True] * (len(params) + len(shown))
    confirmed = any(r.get("confirmed") for r in front)
    fmax = any((r.get("confirmed") or {}).get("fmax_mhz") is not None for r in front)
    if confirmed:
        headers += ["sim cycles", "syn LUT", "syn BRAM", "syn DSP",
                    "cycles err", "LUT err", "BRAM err", "DSP diff"]
        headers += ["Fmax MHz"] if fmax else []
        right += [True] * (8 + fmax)
    rows = []
    common = {p: _common_items(front, p) for p in params}
    for r in _best_first(front, objectives[0]):
        values = r.get("objectives") or {}
        row = [_point_name(r),
               *(_format_param((r.get("params") or {}).get(p), common[p]) for p in params),
               *(_format_objective(n, values.get(n), units) for n in shown)]
        if confirmed:
            c = r.get("confirmed") or {}
            resources, error = c.get("resources") or {}, c.get("error") or {}
            row += [_count("cycles", c["cycles"]) if c.get("cycles") is not None else "-",
                    *(_count(k, resources[k]) if resources.get(k) is not None else "-"
                      for k in ("lut", "bram", "dsp")),
                    _percent(error.get("cycles")), _percent(error.get("lut")),
                    _percent(error.get("bram")), _difference(error.get("dsp"))]
            if fmax:
                row.append("-" if c.get("fmax_mhz") is None else f"{c['fmax_mhz']:.1f}")
        rows.append(row)
    return headers, right, rows


def front_table(front: Sequence[Mapping], params: Sequence[str],
                objectives: Sequence[str]) -> str:
    """The front as a fixed-width table for the terminal, best first by the first
    objective; latency to 3 significant figures, counts with thousands separators,
    utilization in percent, and the confirmed values and the models' errors when the
    points were confirmed."""
    headers, right, rows = _front_rows(front, params, objectives)
    widths = [max(len(c) for c in column) for column in zip(headers, *rows)]

    def line(cells):
        return "  ".join(c.rjust(w) if r else c.ljust(w)
                         for c, w, r in zip(cells, widths, right)).rstrip()

    return "\n".join([line(headers), line("-" * w for w in widths),
                      *(line(row) for row in rows)]) + "\n"


def front_markdown(front: Sequence[Mapping], params: Sequence[str],
                   objectives: Sequence[str]) -> str:
    """The table of `front_table` as a GitHub Markdown table."""
    headers, right, rows = _front_rows(front, params, objectives)

    def line(cells):
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    rule = "|" + "|".join("---:" if r else "---" for r in right) + "|"
    return "\n".join([line(headers), rule, *(line(row) for row in rows)]) + "\n"


# --- invalid points ------------------------------------------------------------------

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def invalid_reasons(records: Sequence[Mapping]) -> list[tuple[str, int]]:
    """The invalid points' reasons grouped, most common first: [(example, count)].

    Reasons that differ only in their numbers (sizes, depths, config names) form one
    group, shown by the first reason seen in it.
    """
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for r in records:
        if r.get("valid") is True:
            continue
        reason = r.get("reason") or "(no reason given)"
        group = _NUMBER.sub("N", reason)
        counts[group] += 1
        examples.setdefault(group, reason)
    # Counter.most_common keeps first-seen order among equal counts: deterministic.
    return [(examples[group], n) for group, n in counts.most_common()]


# --- plots ---------------------------------------------------------------------------

def _staircase(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The points of (x, y) that no other beats in both (both smaller is better), by x."""
    order = np.lexsort((y, x))
    keep, best = [], math.inf
    for i in order:
        if y[i] < best:
            keep.append(i)
            best = y[i]
    return x[keep], y[keep]


def _confirmed_latency(record: Mapping) -> float:
    """The latency with Verilator's cycles in place of the timing model's: the
    accelerator's time scaled by their ratio, plus the host's time (which Verilator does
    not measure). Records without the split (before host time) are all accelerator."""
    o = record["objectives"]
    accelerator = o.get("accelerator_ms", o["latency_ms"])
    return (record["confirmed"]["cycles"] / o["cycles"] * accelerator
            + o["latency_ms"] - accelerator)


def _spans_decades(values: np.ndarray) -> bool:
    return len(values) > 1 and bool(np.all(values > 0)) and values.max() / values.min() > 20


def plot(records: Sequence[Mapping], front: Sequence[Mapping], out_dir: str | Path, *,
         color_by: str | None, part: Mapping | None = None, basename: str = "sweep",
         title: str | None = None, max_utilization: float = 1.0) -> list[Path]:
    """Draw latency against LUT, BRAM and DSP (three panels) and write PNG and SVG.

    Every valid point is a small dot coloured by its value of the swept parameter
    `color_by` (a legend for a few values, a colorbar for many; None, for a sweep in
    which no parameter varies: one colour and no such legend); the front's points are
    larger with black edges, and a step line joins those that are best in the panel's
    two axes. Invalid points are left out. `part` gives the part's capacity
    ({lut, ff, dsp, bram}, optionally "name"), drawn as a dashed line in each panel;
    `max_utilization` below 1 (the sweep's constraint: the share of each resource a
    point may use) adds a dash-dot line at that share of it, so the points between the
    two lines read as left out by the constraint, not by the part. Returns the paths written: ``out_dir/basename.png`` and ``.svg``.
    """
    # matplotlib is imported here: heavy (a second to load), and only plots need it.
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import BoundaryNorm, ListedColormap, LogNorm, Normalize  # heavy, as above
    from matplotlib.figure import Figure  # heavy, as above
    from matplotlib.lines import Line2D  # heavy, as above

    points = [r for r in records if r.get("valid") is True
              and all((r.get("objectives") or {}).get(k) is not None
                      for k in ("latency_ms", *PLOT_RESOURCES))]
    swept = {p for r in records for p in (r.get("params") or {})}
    if color_by is not None and color_by not in swept:
        raise ValueError(f"cannot colour by {color_by!r}: not a swept parameter; "
                         f"swept: {', '.join(sorted(swept)) or 'none'}")
    keys = {r.get("key") for r in front}
    on_front = [r for r in points if r.get("key") in keys]
    confirmed = [r for r in on_front if (r.get("confirmed") or {}).get("resources")
                 and r["confirmed"].get("cycles") and r["objectives"].get("cycles")]
    units = _units(records)

    colors = [(r.get("params") or {}).get(color_by) if color_by is not None else None
              for r in points]
    distinct = sorted(set(map(_group_key, colors)))
    numeric = all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in colors)
    if distinct and (len(distinct) <= MAX_LEGEND_VALUES or not numeric):
        # Few values (or names): one colour each, in the values' own order.
        ordered = sorted({_group_key(c): c for c in colors}.values(),
                         key=lambda c: (not numeric, c if numeric else _group_key(c)))
        palette = matplotlib.colormaps["tab10" if len(ordered) <= 10 else "tab20"]
        slot = {_group_key(c): i for i, c in enumerate(ordered)}
        color_values = np.array([slot[_group_key(c)] for c in colors], dtype=float)
        cmap = ListedColormap([palette(i % palette.N) for i in range(len(ordered))])
        norm = BoundaryNorm(np.arange(len(ordered) + 1) - 0.5, len(ordered))
        # Nothing to colour by: the one colour needs no legend entry.
        legend_values = ordered if color_by is not None else []
    else:
        color_values = np.array(colors, dtype=float)
        cmap = matplotlib.colormaps["viridis"]
        norm = (LogNorm if _spans_decades(color_values) else Normalize)(
            vmin=color_values.min() if len(color_values) else 0,
            vmax=color_values.max() if len(color_values) else 1)
        legend_values = None

    latency = np.array([r["objectives"]["latency_ms"] for r in points], dtype=float)
    capacity = dict(part or {})
    fig = Figure(figsize=(15, 5.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(PLOT_RESOURCES), sharey=True)
    scatter = None
    for ax, resource in zip(axes, PLOT_RESOURCES):
        x = np.array([r["objectives"][resource] for r in points], dtype=float)
        scatter = ax.scatter(x, latency, c=color_values, cmap=cmap, norm=norm, s=9,
                             alpha=0.75, linewidths=0, zorder=2)
        if on_front:
            fx = np.array([r["objectives"][resource] for r in on_front], dtype=float)
            fy = np.array([r["objectives"]["latency_ms"] for r in on_front], dtype=float)
            fc = color_values[[i for i, r in enumerate(points) if r.get("key") in keys]]
            sx, sy = _staircase(fx, fy)
            if len(sx) > 1:
                ax.step(sx, sy, where="post", color="black", linewidth=1.1, zorder=3)
            ax.scatter(fx, fy, c=fc, cmap=cmap, norm=norm, s=46, edgecolors="black",
                       linewidths=1.0, zorder=4)
        if confirmed:
            # Where Verilator and yosys put the confirmed points (the models' figures
            # are the circles they belong to).
            ax.scatter([r["confirmed"]["resources"][resource] for r in confirmed],
                       [_confirmed_latency(r) for r in confirmed],
                       marker="x", s=40, color="black", linewidths=1.4, zorder=5)
        if capacity.get(resource) is not None:
            ax.axvline(capacity[resource], color="firebrick", linestyle="--",
                       linewidth=1.2, zorder=1)
            if max_utilization < 1:
                ax.axvline(capacity[resource] * max_utilization, color="darkorange",
                           linestyle="-.", linewidth=1.2, zorder=1)
        if _spans_decades(x):
            ax.set_xscale("log")
        unit = units.get(resource)
        ax.set_xlabel(f"{OBJECTIVES[resource].label} ({unit})" if unit
                      else f"{OBJECTIVES[resource].label} (count)")
        ax.grid(True, which="major", alpha=0.3)
    if _spans_decades(latency):
        axes[0].set_yscale("log")
    axes[0].set_ylabel("latency (ms): accelerator + host")

    handles = []
    if legend_values is not None:
        common = _common_items(points, color_by)
        handles += [Line2D([], [], linestyle="", marker="o", markersize=6,
                           markerfacecolor=cmap(norm(i)), markeredgewidth=0,
                           label=f"{color_by} = {_format_param(v, common)}")
                    for i, v in enumerate(legend_values)]
    elif points:
        colorbar = fig.colorbar(scatter, ax=list(axes), label=color_by, pad=0.01)
        # Ticks at the swept values themselves (a sweep's sizes are powers of two, which
        # decade ticks miss), at most eight of them.
        values = sorted(set(color_values.tolist()))
        ticks = values[::math.ceil(len(values) / 8)]
        colorbar.ax.minorticks_off()
        colorbar.set_ticks(ticks, labels=[_format_param(int(v) if v.is_integer() else v)
                                          for v in ticks])
    if not points:
        axes[len(axes) // 2].text(0.5, 0.5, "no valid points", ha="center", va="center",
                                  transform=axes[len(axes) // 2].transAxes)
    handles.append(Line2D([], [], color="black", marker="o", markersize=7,
                          markerfacecolor="white", markeredgecolor="black",
                          label=f"Pareto front ({len(on_front)})"))
    if confirmed:
        handles.append(Line2D([], [], linestyle="", marker="x", color="black",
                              markeredgewidth=1.4,
                              label=f"measured: Verilator, yosys ({len(confirmed)})"))
    if any(capacity.get(k) is not None for k in PLOT_RESOURCES):
        handles.append(Line2D([], [], color="firebrick", linestyle="--",
                              label="part capacity"))
        if max_utilization < 1:
            handles.append(Line2D([], [], color="darkorange", linestyle="-.",
                                  label=f"max_utilization ({max_utilization:.0%})"))
    fig.legend(handles=handles, loc="outside right upper", fontsize="small", frameon=False)

    if title is None:
        models = list(dict.fromkeys(m for r in records for m in (r.get("models") or {})))
        title = f"vdla sweep: {', '.join(models) or 'no models'}"
        if capacity.get("name"):
            title += f" on {capacity['name']}"
        title += f" ({len(points)} valid points, {len(on_front)} on the front)"
    fig.suptitle(title)

    out_dir = Path(out_dir)
    written = []
    for fmt, options in (("png", {"dpi": 130}), ("svg", {})):
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt, **options)
        written.append(atomic_write(out_dir / f"{basename}.{fmt}", buffer.getvalue()))
    return written


# --- HTML and JSON -------------------------------------------------------------------

def _html_table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
                right: Sequence[bool] | None = None) -> str:
    right = right or [False] * len(headers)

    def cells(tag, values):
        return "".join(f'<{tag}{" class=num" if r else ""}>{html.escape(str(v))}</{tag}>'
                       for v, r in zip(values, right))

    body = "\n".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
    return f"<table>\n<tr>{cells('th', headers)}</tr>\n{body}\n</table>"


def _embed(path: Path) -> str:
    """One plot inline: SVG markup as is (less its XML prolog), PNG as a data URI."""
    if path.suffix.lower() == ".svg":
        text = path.read_text(encoding="utf-8")
        return text[text.index("<svg"):]
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<img alt="{html.escape(path.stem)}" '
            f'src="data:image/png;base64,{data}">')


def _summary_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:,.4g}"
    return str(value)


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f2f2f2; } td.num, th.num { text-align: right; }
dl.summary { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
dl.summary dt { font-weight: bold; } .plot img, .plot svg { max-width: 100%; height: auto; }
"""


def html_report(records: Sequence[Mapping], front: Sequence[Mapping], params: Sequence[str],
                objectives: Sequence[str], plots: Sequence[str | Path], *, title: str,
                summary: Mapping[str, Any]) -> str:
    """One self-contained HTML page: a summary, the plots inline, the front, and why the
    invalid points are invalid.

    The counts of points, valid points, points that fit and front points come from
    `records` and `front`; `summary` adds the rest in its own order (models, part,
    search, elapsed: any label -> value). Of plots that share a name (sweep.png and
    sweep.svg) the PNG is embedded, as a data URI: much smaller than SVG with thousands
    of points.
    """
    counts = {"points": len(records),
              "valid": sum(r.get("valid") is True for r in records),
              "fitting": sum(r.get("fits") is True for r in records),
              "on the front": len(front)}
    items = [*counts.items(), *((k.replace("_", " "), v) for k, v in summary.items())]
    summary_html = "\n".join(f"<dt>{html.escape(str(k))}</dt><dd>"
                             f"{html.escape(_summary_value(v))}</dd>" for k, v in items)
    chosen: dict[str, Path] = {}
    for p in map(Path, plots):
        if p.suffix.lower() == ".png" or p.stem not in chosen:
            chosen[p.stem] = p
    plots_html = "\n".join(f'<div class="plot">{_embed(p)}</div>' for p in chosen.values())
    headers, right, rows = _front_rows(front, params, objectives)
    reasons = invalid_reasons(records)
    reasons_html = (_html_table(["reason (an example)", "points"], reasons, [False, True])
                    if reasons else "<p>Every point is valid.</p>")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>{_STYLE}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<dl class="summary">
{summary_html}
</dl>
<h2>Plots</h2>
{plots_html or "<p>No plots.</p>"}
<h2>Pareto front</h2>
{_html_table(headers, rows, right)}
<h2>Invalid points</h2>
{reasons_html}
</body>
</html>
"""


def to_json(records: Sequence[Mapping], front: Sequence[Mapping], meta: Mapping) -> dict:
    """The sweep as one JSON-ready document: {"meta", "points", "front": [keys]}."""
    keys = {r.get("key") for r in records}
    missing = [r.get("key") for r in front if r.get("key") not in keys]
    if missing:
        raise ValueError(f"front points not among the records: {missing}")
    return {"meta": dict(meta), "points": list(records), "front": [r["key"] for r in front]}
