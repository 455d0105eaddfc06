"""The study's figures (``minilm.study.report``): means over seeds as lines, 95% intervals as
bands, and retrieval accuracy as length x depth heatmaps.

Each figure is a PNG written with matplotlib's object API (no pyplot, no display); callers
check ``minilm.figures.canvas.have_matplotlib()`` first. A series is (label, [(x, Interval)]);
a band is drawn where the interval exists (two seeds or more). Every series label has its own
colour, line style and marker (``style``), the same in every figure, so the sixteen kinds stay
apart in print and in greyscale; within a panel no two series share a colour.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from minilm.figures.canvas import log2_axes, require_matplotlib, save_figure
from minilm.study.ablation import GROUPS, reference_of
from minilm.study.claims import cell_interval, mean_accuracy, position_curves
from minilm.study.designs import scratch_labels
from minilm.study.extension import LABEL_NAMES, extension_labels
from minilm.study.stats import interval

DPI = 90
# 20 colours (tab20's dark half, then its light half: a light colour shares a dark one's hue 10 labels on,
# where line style and marker differ), 4 line styles and 3 markers: 60 looks before one repeats, and the
# sixteen kinds from scratch, drawn together, have a colour each. A series' look depends on its label only,
# never on its rank.
COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#c7c7c7",
    "#dbdb8d",
    "#9edae5",
)
LINES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^")
ORDER = (
    "sinusoidal",
    "learned",
    "rope",
    "alibi",
    "t5",
    "none",
    "kerple",
    "fire",
    "xpos",
    "shaw",
    "randomized",
    "rnope-swa",
    "nope-last",
    "p-rope",
    "sinks",
    "nope-qscale",
    "no scaling",
    "PI (linear)",
    "NTK-aware",
    "YaRN",
    "llama3",
    "dynamic NTK",
    "learned + PI",
    "sinusoidal + PI",
    "rope, training kept at L",
)


def _seeds(study) -> str:
    """How many seeds a figure's means are over: the plan's, and more on the rows its claim seeds trained."""
    n, extra = len(study.plan["seeds"]), study.extra_seeds
    return f"{n} seeds" + (f" ({n + len(extra)} on the rows the claims read)" if extra else "")


def style(label: str) -> dict:
    """matplotlib keywords (color, linestyle, marker) of one series label, fixed for every figure."""
    index = ORDER.index(label) if label in ORDER else len(ORDER) + sum(map(ord, label))
    return {
        "color": COLOURS[index % len(COLOURS)],
        "linestyle": LINES[index % len(LINES)],
        "marker": MARKERS[index % len(MARKERS)],
    }


def _draw(ax, series: Sequence, dashed=(), markers: bool = True, ranked: bool = False) -> None:
    """``ranked``: looks by the series' rank in this panel (panels whose labels are their own)."""
    for rank, (label, points) in enumerate(series):
        points = [(x, ci) for x, ci in points if ci is not None]
        if not points:
            continue
        xs = [x for x, _ in points]
        look = (
            style(label)
            if not ranked
            else {
                "color": COLOURS[rank % len(COLOURS)],
                "linestyle": LINES[rank % len(LINES)],
                "marker": MARKERS[rank % len(MARKERS)],
            }
        )
        if label in dashed:
            look["linestyle"] = "--"
        if not markers:
            look["marker"] = None
        (line,) = ax.plot(xs, [ci.mean for _, ci in points], markersize=3, label=label, **look)
        if all(ci.half_width is not None for _, ci in points):
            ax.fill_between(
                xs,
                [ci.low for _, ci in points],
                [ci.high for _, ci in points],
                color=line.get_color(),
                alpha=0.18,
                linewidth=0,
            )


def _wide(panels) -> bool:
    values = [ci.mean for _, series in panels for _, points in series for _, ci in points if ci is not None]
    return bool(values) and max(values) > 10 * min(values)


def length_figure(
    panels: Sequence, path: str, title: str, train_length: int, dashed=(), own_series: bool = False
) -> str:
    """Perplexity against evaluation length, one panel per (panel title, series); ``own_series``:
    each panel has series of its own (a legend each, looks by rank), else one legend for all."""
    Figure = require_matplotlib()
    fig = Figure(figsize=(6.0 * len(panels), 4.8))
    wide = _wide(panels)
    for index, (name, series) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), index + 1)
        _draw(ax, series, dashed, ranked=own_series)
        log2_axes(ax, [x for _, points in series for x, _ in points], wide)
        ax.axvline(train_length, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("evaluation length (tokens); dotted: training length")
        ax.set_ylabel("validation perplexity" + (" (log scale)" if wide else ""))
        ax.set_title(name, fontsize=10)
        if index == 0 or own_series:
            ax.legend(fontsize=7, ncol=1 if own_series else 2)
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


def position_figure(panels: Sequence, path: str, title: str, train_length: int) -> str:
    """Mean loss against position in the segment (bins), one panel per (panel title, series)."""
    Figure = require_matplotlib()
    fig = Figure(figsize=(6.4 * len(panels), 4.8))
    for index, (name, series) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), index + 1)
        _draw(ax, series, markers=False)
        furthest = max([x for _, points in series for x, _ in points], default=2)
        log2_axes(ax, [2**k for k in range(int(furthest).bit_length())], False)
        ax.axvline(train_length, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("position in the segment (tokens, bin centre); dotted: training length")
        ax.set_ylabel("mean loss (nats per token)")
        ax.set_title(name, fontsize=10)
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path, dpi=DPI)


def heatmap_figure(panels: Sequence, path: str, title: str, columns: int = 4) -> str:
    """Accuracy heatmaps, one panel per (title, lengths, depths, {(length, depth): accuracy from 0 to 1, or None}):
    depth down, length across, each cell annotated with its accuracy in percent; grey where not run."""
    Figure = require_matplotlib()
    columns = min(columns, len(panels))
    rows = (len(panels) + columns - 1) // columns
    fig = Figure(figsize=(3.3 * columns, 2.9 * rows + 0.6))
    for index, (name, lengths, depths, cells) in enumerate(panels):
        ax = fig.add_subplot(rows, columns, index + 1)
        grid = np.array([[np.nan if cells.get((t, d)) is None else cells[(t, d)] for t in lengths] for d in depths])
        ax.set_facecolor("#d9d9d9")
        image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        for i, d in enumerate(depths):
            for j, t in enumerate(lengths):
                value = grid[i, j]
                ax.text(
                    j,
                    i,
                    "n/a" if np.isnan(value) else f"{100 * value:.0f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if not np.isnan(value) and value > 0.6 else "white",
                )
        ax.set_xticks(range(len(lengths)), [str(t) for t in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
        ax.set_xlabel("context length (tokens)", fontsize=8)
        ax.set_ylabel("needle depth", fontsize=8)
        ax.set_title(name, fontsize=9)
    fig.subplots_adjust(hspace=0.65, wspace=0.35, right=0.86)
    fig.colorbar(image, ax=fig.axes, shrink=0.8, label="exact-match accuracy")
    fig.suptitle(title)
    return save_figure(fig, path, dpi=DPI)


# --------------------------------------------------------------------------- the study's figures


def _series(cells, section, labels, lengths, mode, step=None, names=None) -> list:
    return [
        (
            (names or {}).get(label, label),
            [(t, cell_interval(cells, section, label, t, mode, step=step)) for t in lengths],
        )
        for label in labels
    ]


def _position_series(cells, section, labels, length, step=None, names=None, bin_width=1) -> list:
    """(label, [(bin centre, Interval over seeds of the bin's mean loss)]) from the nonoverlapping cells."""
    out = []
    for label in labels:
        curves = position_curves(cells, section, label, length, step)
        if curves:
            out.append(
                (
                    (names or {}).get(label, label),
                    [
                        (i * bin_width + (bin_width + 1) / 2, interval([curve[i] for curve in curves]))
                        for i in range(min(map(len, curves)))
                    ],
                )
            )
    return out


def study_figures(study) -> dict:
    """Every figure of a study's report, named after what it shows: {key: file name}."""
    if study.plan["experiment"] == "ablation":
        return _ablation_figures(study)
    plan, cells, L = study.plan, study.cells, study.L
    modes, ext, seeds = plan["eval"]["modes"], plan["extension"], _seeds(study)
    lengths = [int(m * L) for m in plan["eval"]["multiples"]]
    path = lambda name: os.path.join(study.out, name)  # noqa: E731
    out = {
        "lengths": length_figure(
            [(mode, _series(cells, "scratch", scratch_labels(plan), lengths, mode)) for mode in modes],
            path("perplexity-by-length.png"),
            f"trained at L = {L} tokens: perplexity against length, mean and 95% interval over {seeds}",
            L,
        )
    }
    longest, last, bin_width = max(lengths), ext["curve_steps"][-1], plan["eval"]["position_bin"]
    labels = extension_labels(plan, text_only=False)  # the text-only twins are in the report's tables
    names = {m: LABEL_NAMES[m] for m in labels}
    panels = [
        (
            f"every scheme, trained at L = {L}",
            _position_series(cells, "scratch", scratch_labels(plan), longest, bin_width=bin_width),
        )
    ]
    if int(max(ext["curve_multiples"]) * L) >= longest:
        panels.append(
            (
                f"extended to {int(ext['factor'] * L)}, after {last} fine-tuning steps",
                _position_series(cells, "extension", labels, longest, step=last, names=names, bin_width=bin_width),
            )
        )
    out["positions"] = position_figure(
        panels,
        path("loss-by-position.png"),
        f"mean loss at each position of "
        f"{longest}-token segments (bins of {bin_width}; mean and 95% interval over "
        f"{seeds})",
        L,
    )
    steps = ext["curve_steps"]
    curves = [
        (
            f"at {int(m * L)} tokens ({m:g}L)",
            [
                (
                    names[method],
                    [(s, cell_interval(cells, "extension", method, int(m * L), modes[0], step=s)) for s in steps],
                )
                for method in labels
            ],
        )
        for m in ext["curve_multiples"]
    ]
    out["extension"] = curve_figure(
        curves,
        path("extension-perplexity-by-step.png"),
        f"extended from {L} to {int(ext['factor'] * L)}: {modes[0]} perplexity "
        f"against fine-tuning steps (mean, 95% interval)",
    )
    r, rows = plan["retrieval"], study.retrieval
    probe_lengths = [int(m * L) for m in r["multiples"]]

    def grid(section, label, when=None):
        return {(t, d): mean_accuracy(rows, section, label, t, d, when) for t in probe_lengths for d in r["depths"]}

    out["retrieval"] = heatmap_figure(
        [(kind, probe_lengths, r["depths"], grid("scratch", kind)) for kind in scratch_labels(plan)],
        path("retrieval-by-length-and-depth.png"),
        f"retrieval accuracy (%), trained at L = {L}; mean over {seeds}",
    )
    out["extension_retrieval"] = heatmap_figure(
        [
            (f"{names[m]}, {when}", probe_lengths, r["depths"], grid("extension", m, when))
            for m in labels
            for when in ("before", "after")
        ],
        path("extension-retrieval-by-length-and-depth.png"),
        f"retrieval accuracy (%) extended to "
        f"{int(ext['factor'] * L)}: before (zero-shot) and after {last} fine-tuning steps",
        columns=2,
    )
    return {name: os.path.basename(p) for name, p in out.items()}


def _ablation_figures(study) -> dict:
    """One panel per group of the ablation: each of its variants and references against length."""
    plan, cells, L = study.plan, study.cells, study.L
    variants, mode = plan["ablation"]["variants"], plan["eval"]["modes"][0]
    lengths = [int(m * L) for m in plan["ablation"]["multiples"]]
    panels = []
    for group in plan["ablation"]["groups"]:
        names = [n for n, v in variants.items() if v["group"] == group]
        labels = list(dict.fromkeys(n for name in names for n in (reference_of(variants, name), name)))
        panels.append(
            (
                GROUPS[group],
                _series(
                    cells,
                    "ablation",
                    labels,
                    lengths,
                    mode,
                    names={n: f"{variants[n]['scheme']}, {variants[n]['condition']}" for n in labels},
                ),
            )
        )
    figure = length_figure(
        panels,
        os.path.join(study.out, "ablation-perplexity-by-length.png"),
        f"ablations, trained at L = {L}: {mode} perplexity against length (mean, 95% interval "
        f"over {len(plan['seeds'])} seeds)",
        L,
        own_series=True,
    )
    return {"ablation": os.path.basename(figure)}
