"""Streaming evaluation as StreamingLLM does it (Xiao et al. 2023, "Efficient Streaming
Language Models with Attention Sinks", section 4.1 and figure 3): one long text, far longer
than the training length, scored at every token with four kinds of attention:

* ``full``: every earlier token (dense attention over the whole text);
* ``window``: the last W tokens only (a rolling cache of W slots, W = block_size by default),
  the paper's window attention, which collapses once the first tokens are evicted;
* ``sinks-absolute``: the first S tokens kept in view beside the last W - S, at their own
  positions, so a query at 10,000 sees them 10,000 back;
* ``sinks-cache``: the same tokens at their positions within the cache, as the paper places
  them (its section 3.2; ``minilm.model.attention.attend_in_cache``).

Each is one forward pass with the window's mask, which computes what a rolling cache fed one
token at a time computes (tests/test_streaming.py checks it against the cached decoder). The
text is the first ``tokens`` + 1 tokens of the checkpoint's validation split; the losses are
reported as means over bands of positions (W-wide at first, then doubling: [0, W), [W, 2W),
[2W, 4W), ...) and drawn against position. A set-up that a scheme cannot run is reported as
n/a with the reason: a bounded scheme (learned) has no rolling cache and no full attention
past its table; a scheme that adds positions to the embeddings (sinusoidal) cannot place the
sinks at cache positions.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch
from tqdm import tqdm

from minilm.checkpoints.loading import load_model
from minilm.common import MinilmError, autocast, markdown_table, resolve_device, resolve_dtype
from minilm.evaluation.lengths import validation_tokens
from minilm.evaluation.scoring import document_forward, token_losses
from minilm.figures.canvas import require_matplotlib, save_figure

SETUPS = ("full", "window", "sinks-absolute", "sinks-cache")
DEFAULT_MULTIPLE = 16  # the text is 16 x block_size tokens unless told
DEFAULT_SINKS = 4  # the paper's choice


class StreamError(MinilmError):
    """A bad streaming request; the message is one line for the user."""


@dataclass
class Stream:
    """One set-up on one model: the loss in nats at every position (None when not run, with the reason)."""

    label: str
    setup: str
    tokens: int
    window: int
    sinks: int
    losses: Optional[np.ndarray]
    reason: str = ""


def unavailable(model, setup: str, length: int, documents: bool = False) -> str:
    """Why ``model`` cannot run ``setup`` over ``length`` tokens ('' when it can); ``documents``: the model
    was trained with its documents masked (``data.document_mask``), which a window does not take."""
    if documents and setup != "full":
        return "n/a (documents masked, data.document_mask: a window does not take the mask)"
    limit = model.positions.position_limit()
    if limit is not None and (setup != "full" or length > limit):
        return f"n/a ({model.positions.kind} positions are bounded)"
    if setup == "sinks-cache" and model.positions.embeds:
        return f"n/a ({model.positions.kind} positions are in the embeddings)"
    if setup == "sinks-cache" and any(layer_type.masked for layer_type in model.layer_types):
        return "n/a (layers with windows of their own: sinks at absolute positions only)"
    return ""


@torch.no_grad()
def stream_losses(
    model,
    tokens: torch.Tensor,
    setup: str,
    *,
    window: int,
    sinks: int,
    dtype: Optional[torch.dtype] = None,
    documents: Optional[dict] = None,
) -> np.ndarray:
    """The loss in nats of each of tokens[1:] after the tokens before it, under ``setup``
    (one of SETUPS) with a ``window`` of W tokens of which ``sinks`` are the first ones; ``documents``
    (``scoring.document_forward``) masks the documents in the full set-up, as training and
    ``evaluate`` do."""
    if setup not in SETUPS:
        raise StreamError(f"setup={setup!r} is invalid: expected one of {', '.join(SETUPS)}")
    x, y = tokens[None, :-1], tokens[None, 1:]
    forward = dict(documents or {})
    if setup != "full":
        forward = dict(
            window=window,
            context_len=window,
            sinks=0 if setup == "window" else sinks,
            sink_positions="cache" if setup == "sinks-cache" else "absolute",
        )
    device = next(model.parameters()).device
    model.eval()
    with autocast(device, dtype):
        losses = token_losses(model, x.to(device), y.to(device), **forward)
    return losses[0].double().cpu().numpy()


def stream_checkpoint(
    path: str,
    overrides: Sequence[str] = (),
    *,
    tokens: Optional[int] = None,
    window: Optional[int] = None,
    sinks: int = DEFAULT_SINKS,
    label: Optional[str] = None,
    dtype: str = "float32",
    device: str = "auto",
    quiet: bool = False,
) -> list:
    """Every set-up of SETUPS on one checkpoint (``load_model`` with ``overrides``): a list of
    ``Stream``. ``tokens`` scored tokens (default 16 x block_size), ``window`` default block_size.
    A progress bar over the set-ups on stderr unless ``quiet``."""
    device = resolve_device(device)
    compute_dtype = resolve_dtype(dtype, device, setting="--dtype")
    model, tokenizer, config, state = load_model(path, overrides, device=device)
    block = config.model.block_size
    window = block if window is None else window
    tokens = DEFAULT_MULTIPLE * block if tokens is None else tokens
    for name, value, low in (("--stream-tokens", tokens, 2), ("--max-context", window, 1), ("--sink-tokens", sinks, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise StreamError(f"{name}={value!r} is invalid: expected an integer >= {low}")
    if sinks >= window:
        raise StreamError(f"--sink-tokens={sinks} leaves no room in a window of {window}: expected fewer than {window}")
    val = validation_tokens(config, tokenizer, quiet=quiet)
    if len(val) < tokens + 1:
        raise StreamError(
            f"{state['path']}: the validation split has {len(val):,} tokens, fewer than the "
            f"{tokens + 1:,} a stream of {tokens:,} needs: lower --stream-tokens"
        )
    text = torch.from_numpy(np.asarray(val[: tokens + 1], dtype=np.int64))
    label = label or state["path"]
    documents = document_forward(config.data, tokenizer.eos_id)  # the model's documents masked, as it trained
    out = []
    for setup in tqdm(SETUPS, desc=f"stream {label}", unit="set-up", disable=quiet, file=sys.stderr, leave=False):
        reason = unavailable(model, setup, tokens, documents=bool(documents))
        losses = (
            None
            if reason
            else stream_losses(model, text, setup, window=window, sinks=sinks, dtype=compute_dtype, documents=documents)
        )
        out.append(Stream(label, setup, tokens, window, sinks, losses, reason))
    return out


def bands(n: int, window: int) -> list:
    """[start, end) bands of positions 0..n-1: [0, W), [W, 2W), [2W, 4W), ... (the last cut at n)."""
    edges, end = [0], window
    while edges[-1] < n:
        edges.append(min(end, n))
        end *= 2
    return list(zip(edges[:-1], edges[1:]))


def band_table(streams: Sequence[Stream]) -> str:
    """A markdown table of one model's streams (one text, one window): a row per set-up, the
    mean loss (nats) in every band of positions."""
    if len({(s.label, s.tokens, s.window) for s in streams}) != 1:
        raise StreamError(
            "band_table takes the streams of one model (one text and one window): make one table per model"
        )
    spans = bands(streams[0].tokens, streams[0].window)
    rows = []
    for s in streams:
        cells = [s.reason or f"{s.losses[a:b].mean():.3f}" for a, b in spans]
        rows.append([s.label, describe_setup(s)] + cells)
    return markdown_table(["model", "attention"] + [f"{a:,}-{b - 1:,}" for a, b in spans], rows)


def describe_setup(s: Stream) -> str:
    return {
        "full": "full",
        "window": f"window {s.window}",
        "sinks-absolute": f"window {s.window}, {s.sinks} sinks at absolute positions",
        "sinks-cache": f"window {s.window}, {s.sinks} sinks at cache positions",
    }[s.setup]


def smoothed(losses: np.ndarray, width: int) -> tuple:
    """(bin centres, mean loss) over consecutive bins of ``width`` positions, the last one the rest
    (shorter), so that every position is drawn, a text shorter than one bin as one point."""
    starts = np.arange(0, len(losses), width)
    ends = np.minimum(starts + width, len(losses))
    means = np.array([losses[a:b].mean() for a, b in zip(starts, ends)])
    return (starts + ends) / 2, means


def plot_streams(streams: Sequence[Stream], path: str) -> str:
    """PNG of the loss against position, one panel per model, one line per set-up (means over
    bins of W/4 positions); a dotted line at the window. Needs matplotlib."""
    Figure = require_matplotlib()
    labels = list(dict.fromkeys(s.label for s in streams))
    fig = Figure(figsize=(7.5, 3.6 * len(labels)))
    styles = {
        "full": ("tab:red", "-"),
        "window": ("tab:orange", "--"),
        "sinks-absolute": ("tab:blue", "-."),
        "sinks-cache": ("tab:green", "-"),
    }
    for i, label in enumerate(labels):
        ax = fig.add_subplot(len(labels), 1, i + 1)
        window = next(s.window for s in streams if s.label == label)
        for s in (s for s in streams if s.label == label and s.losses is not None):
            x, y = smoothed(s.losses, max(1, s.window // 4))
            colour, style = styles[s.setup]
            marker = "o" if len(x) < 3 else None  # a short text's few points still show
            ax.plot(x, y, color=colour, linestyle=style, marker=marker, label=describe_setup(s))
            ax.axvline(s.window, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("position in the text (tokens); dotted: the window")
        ax.set_ylabel(f"loss (nats), mean over {max(1, window // 4)} positions")
        ax.set_title(f"{label}: streaming loss", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path, keep=True)


def band_rows(streams: Sequence[Stream]) -> list:
    """CSV rows: model, set-up, window, sinks, band start, band end, mean loss (empty when not run)."""
    rows = []
    for s in streams:
        for a, b in bands(s.tokens, s.window):
            mean = "" if s.losses is None else f"{s.losses[a:b].mean():.6g}"
            rows.append(
                {
                    "model": s.label,
                    "setup": s.setup,
                    "window": s.window,
                    "sinks": s.sinks,
                    "start": a,
                    "end": b,
                    "loss": mean,
                    "ppl": "" if not mean else f"{math.exp(float(mean)):.6g}",
                }
            )
    return rows
