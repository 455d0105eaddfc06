"""Where every figure of minilm is written: ``require_matplotlib`` (a one-line error naming
the extra to install), ``have_matplotlib`` (for callers that skip figures without it),
``save_figure`` (the format from the extension, directories created, opaque PNGs as RGB)
and ``log2_axes`` (the length axes of perplexity figures).

matplotlib is an optional extra (``pip install -e ".[plot]"``). Figures are built with the
object-oriented API (``matplotlib.figure.Figure`` rendered by Agg), never pyplot, so nothing
needs a display and no global backend is switched.
"""

from __future__ import annotations

import importlib.util
import io
import os
from typing import Sequence

from minilm.common import MinilmError, WriteError, atomic_write

DPI = 100
INSTALL_HINT = 'plotting needs matplotlib: pip install -e ".[plot]"'


class PlotError(MinilmError):
    """A figure cannot be drawn or written; the message is one line for the user."""


def require_matplotlib():
    """matplotlib's Figure, or a one-line PlotError saying what to install."""
    try:
        import matplotlib  # noqa: F401  (imported first so a blocked matplotlib fails here)
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError(INSTALL_HINT) from None
    return Figure


def save_figure(fig, path: str, dpi: int = DPI, keep: bool = False) -> str:
    """Write ``fig`` to ``path`` (format from the extension, e.g. .png), whole or not at all
    (``keep``: an earlier file there is set aside, not replaced); return the path."""
    ext = check_figure_path(path)
    buffer = io.BytesIO()
    if ext == "png":  # figures are opaque: an RGB PNG is the same picture, ~10% smaller than RGBA
        from PIL import Image  # a dependency of matplotlib

        rendered = io.BytesIO()
        fig.savefig(rendered, format="png", dpi=dpi)
        rendered.seek(0)
        with Image.open(rendered) as image:
            image.convert("RGB").save(buffer, format="png")
    else:
        fig.savefig(buffer, format=ext, dpi=dpi)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    except OSError as exc:
        raise WriteError(path, str(exc.strerror or exc)) from None
    atomic_write(path, buffer.getvalue(), keep=keep)  # whole or not at all; a failure is one WriteError
    return path


def check_figure_path(path: str) -> str:
    """The image format of ``path`` (its extension), or a PlotError before any work is done."""
    Figure = require_matplotlib()
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    supported = Figure().canvas.get_supported_filetypes()
    if ext not in supported:
        raise PlotError(f"cannot write {path!r}: unknown image format {ext!r}; valid: {', '.join(sorted(supported))}")
    return ext


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def log2_axes(ax, xs: Sequence, log_y: bool) -> None:
    """A log2 x axis ticked at ``xs`` (plain numbers), a log y axis when ``log_y``, a light grid."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(xs)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="both", alpha=0.3)
