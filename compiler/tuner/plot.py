"""Tuning curves: the tuned ops' cost against measurements, one line a strategy.

    tuning_curves({"pretrained + scheduler": (1, costs), ...}, "curve.png",
                  title="resnet18 on 1x16x16...", unit="cycles")

`vdla tune --plot` draws its own run; ``bench/tuner_transfer.py`` overlays the
strategies it compares. A curve is (the trial its first cost follows, the costs after
each trial, None while some task has no measured cost); it is drawn as a step line of
the best so far, with a dotted line where given a `reference` (a long run's result).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Mapping, Sequence

from vdla._fileio import atomic_write

__all__ = ["tuning_curves"]


def tuning_curves(curves: Mapping[str, tuple[int, Sequence[float | None]]],
                  path: str | Path, *, title: str, unit: str,
                  reference: Mapping[str, float] | None = None,
                  ylabel: str | None = None) -> Path:
    """Plot `curves` (name -> (first trial, costs)) and write a PNG at `path`
    (atomically). `reference`: label -> a cost drawn as a dotted horizontal line.
    `ylabel` replaces "tuned ops' cost (unit)" (for curves of another quantity, such as
    a speedup). ValueError when no curve has a cost."""
    # heavy: matplotlib, only to plot
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # heavy, as above
    from matplotlib.ticker import FuncFormatter  # heavy, as above

    figure = Figure(figsize=(7.0, 4.2), dpi=120)
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    drawn = 0
    for name, (first, costs) in curves.items():
        points = [(first + i, c) for i, c in enumerate(costs) if c is not None]
        if not points:
            continue
        xs, ys = zip(*points)
        ax.step(xs, ys, where="post", label=name, linewidth=1.6)
        drawn += 1
    if not drawn:
        raise ValueError("no curve has a cost to plot")
    for label, value in (reference or {}).items():
        ax.axhline(value, linestyle=":", color="0.3", linewidth=1.2)
        ax.annotate(label, (1.0, value), xycoords=("axes fraction", "data"),
                    xytext=(-4, 3), textcoords="offset points", ha="right", fontsize=8,
                    color="0.3")
    ax.set_xlabel("measurements")
    ax.set_ylabel(ylabel or f"tuned ops' cost ({unit})")
    if ylabel is None:
        # Whole numbers with separators: matplotlib's offset notation (+8.555e6) hides
        # them.
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    atomic_write(Path(path), buffer.getvalue())
    return Path(path)
