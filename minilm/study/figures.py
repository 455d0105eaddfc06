"""The study's figures (``minilm.study.report``): means over seeds as lines, 95% intervals as bands.

Each figure is a PNG written with matplotlib's object API (no pyplot, no display); callers
check ``minilm.figures.canvas.have_matplotlib()`` first. A series is (label, [(x, Interval)]);
a band is drawn where the interval exists (two seeds or more).
"""
from __future__ import annotations

from typing import Sequence

from minilm.figures.canvas import log2_axes, require_matplotlib, save_figure

DPI = 90


def _draw(ax, series: Sequence, dashed=()) -> None:
    for label, points in series:
        points = [(x, ci) for x, ci in points if ci is not None]
        if not points:
            continue
        xs = [x for x, _ in points]
        line, = ax.plot(xs, [ci.mean for _, ci in points], marker="o", markersize=3, label=label,
                        linestyle="--" if label in dashed else "-")
        if all(ci.half_width is not None for _, ci in points):
            ax.fill_between(xs, [ci.low for _, ci in points], [ci.high for _, ci in points],
                            color=line.get_color(), alpha=0.18, linewidth=0)


def _wide(panels) -> bool:
    values = [ci.mean for _, series in panels for _, points in series for _, ci in points if ci is not None]
    return bool(values) and max(values) > 10 * min(values)


def length_figure(panels: Sequence, path: str, title: str, train_length: int, dashed=()) -> str:
    """Perplexity against evaluation length, one panel per (panel title, series)."""
    Figure = require_matplotlib()
    fig = Figure(figsize=(6.0 * len(panels), 4.8))
    wide = _wide(panels)
    for index, (name, series) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), index + 1)
        _draw(ax, series, dashed)
        log2_axes(ax, [x for _, points in series for x, _ in points], wide)
        ax.axvline(train_length, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("evaluation length (tokens); dotted: training length")
        ax.set_ylabel("validation perplexity" + (" (log scale)" if wide else ""))
        ax.set_title(name, fontsize=10)
        if index == 0:
            ax.legend(fontsize=7, ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path, dpi=DPI)


def curve_figure(panels: Sequence, path: str, title: str) -> str:
    """Perplexity against fine-tuning steps, one panel per evaluation length. The x axis is
    symlog so that step 0 (no fine-tuning) sits at the left of 10, 25, 50, ..."""
    Figure = require_matplotlib()
    from matplotlib.ticker import NullFormatter, ScalarFormatter
    fig = Figure(figsize=(4.2 * len(panels), 4.4))
    for index, (name, series) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), index + 1)
        _draw(ax, series)
        steps = sorted({x for _, points in series for x, _ in points})
        ax.set_xscale("symlog", linthresh=max(1, min([s for s in steps if s > 0], default=1)))
        ax.set_xticks(steps)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        if _wide([(name, series)]):
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.set_xlabel("fine-tuning steps")
        ax.set_ylabel("validation perplexity")
        ax.set_title(name, fontsize=10)
        if index == 0:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path, dpi=DPI)

