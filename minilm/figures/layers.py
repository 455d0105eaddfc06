"""The figure of a model's layer design (``model.layers``): which keys each layer type lets a query see.

``layer_grids(types, length)`` computes, for each distinct layer type, the (query, key) visibility grid
over ``length`` positions with ``minilm.model.attention.visible`` itself, the mask the model's attention
applies, so the picture cannot drift from the code. ``plot_layers(types, path, length=...)`` draws one
panel per type, titled with its name, its layers and its settings, writes it through
``minilm.figures.canvas.save_figure`` and returns the path with the grids it drew.

matplotlib is an optional extra (``pip install -e ".[plot]"``). Figures are built with the
object-oriented API (``matplotlib.figure.Figure`` rendered by Agg), never pyplot.
"""

from __future__ import annotations

import math
import textwrap
from typing import NamedTuple

import torch

from minilm.figures.canvas import require_matplotlib, save_figure
from minilm.model.attention import visible
from minilm.positions import describe
from minilm.positions.layers import LayerType

MAX_COLUMNS = 4  # panels per row
TITLE_WIDTH = 46  # characters per line of a panel's title


class LayerFigure(NamedTuple):
    """What ``plot_layers`` wrote: the file, and each type's (length, length) grid of booleans as drawn."""

    path: str
    grids: dict  # type name -> visible(positions, positions, layer=type), first appearance first


def distinct_types(types: list) -> dict:
    """{type name: (its LayerType, the indices of its layers)}, in the order the types first appear."""
    found = {}
    for index, layer_type in enumerate(types):
        found.setdefault(layer_type.name, (layer_type, []))[1].append(index)
    return found


def layer_grids(types: list, length: int) -> dict:
    """{type name: (length, length) bool tensor}: True where a query at position p (row) may see the key
    at j (column) in a pass over positions 0..length-1, as ``visible`` computes it for that type."""
    positions = torch.arange(length, dtype=torch.float32)
    return {name: visible(positions, positions, layer=t) for name, (t, _) in distinct_types(types).items()}


def type_settings(layer_type: LayerType) -> str:
    """A layer type's settings in one line: its position, then each of window, chunk, learned sinks,
    soft-cap and query scaling that it sets."""
    parts = [f"position {describe(layer_type.position)}"]
    if layer_type.window is not None:
        parts.append(f"window {layer_type.window}")
    if layer_type.chunk is not None:
        parts.append(f"chunk {layer_type.chunk}")
    if layer_type.sinks:
        parts.append("learned sinks")
    if layer_type.softcap:
        parts.append(f"softcap {layer_type.softcap:g}")
    if layer_type.query_scale is not None:
        parts.append(f"query scale {query_scale_text(layer_type.query_scale)}")
    return ", ".join(parts)


def query_scale_text(scale: dict) -> str:
    """``beta=0.1 floor=8192 offset=1``: the three numbers of 1 + beta ln(1 + floor((p + offset) / floor))."""
    return " ".join(f"{key}={scale[key]:g}" for key in ("beta", "floor", "offset"))


def layer_list(indices: list) -> str:
    """``layers 0, 1, 2`` (``layer 3`` for one)."""
    return ("layer " if len(indices) == 1 else "layers ") + ", ".join(str(i) for i in indices)


def layers_figure(types: list, grids: dict, *, source: str = ""):
    """The figure of ``plot_layers`` for ``grids`` (``layer_grids``), not yet written."""
    Figure = require_matplotlib()
    kinds = distinct_types(types)
    columns = min(MAX_COLUMNS, len(kinds))
    rows = math.ceil(len(kinds) / columns)
    width = max(7.5, 4.3 * columns + 0.4)
    fig = Figure(figsize=(width, 4.8 * rows + 1.0), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).flatten()
    for ax, (name, (layer_type, indices)) in zip(axes, kinds.items()):
        title = [
            textwrap.fill(text, TITLE_WIDTH) for text in (f"{name}: {layer_list(indices)}", type_settings(layer_type))
        ]
        _draw_grid(ax, grids[name], "\n".join(title))
    for ax in axes[len(kinds) :]:
        ax.axis("off")
    length = next(iter(grids.values())).shape[0]
    origin = f"{source}: " if source else ""
    head = f"{origin}{len(types)} layers, {len(kinds)} layer type{'s' if len(kinds) > 1 else ''}"
    legend = f"dark: the keys each query sees over {length} positions, as minilm.model.attention.visible computes them"
    fig.suptitle(head + "\n" + textwrap.fill(legend, int(12 * width)), fontsize=11)
    return fig


def _draw_grid(ax, grid: torch.Tensor, title: str) -> None:
    """One type's grid: query positions down, key positions across, a visible key dark."""
    length = grid.shape[0]
    ax.imshow(grid.float().numpy(), cmap="Greys", vmin=0, vmax=1.25, interpolation="nearest")
    ax.set_title(title, fontsize=10)
    ax.set(xlabel="key position j", ylabel="query position p")
    seen = grid.sum(dim=1)
    ax.text(
        0.98,
        0.98,
        f"keys seen by the last query: {int(seen[-1])}\nmost by any query: {int(seen.max())}",
        transform=ax.transAxes,
        ha="right",
        va="top",
        fontsize=8,
        bbox={"facecolor": "white", "edgecolor": "grey", "alpha": 0.85},
    )
    if length <= 16:
        ax.set_xticks(range(length))
        ax.set_yticks(range(length))


def plot_layers(types: list, path: str, *, length: int, source: str = "") -> LayerFigure:
    """Draw one panel per distinct layer type of ``types`` (one ``LayerType`` per layer) showing the keys
    each query sees over ``length`` positions; ``source`` names the config in the title. Write the
    figure to ``path`` (an earlier file there is set aside, never replaced: ``save_figure(keep=True)``)
    and return it with the grids drawn."""
    require_matplotlib()
    grids = layer_grids(types, length)
    return LayerFigure(save_figure(layers_figure(types, grids, source=source), path, keep=True), grids)
