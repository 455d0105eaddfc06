"""What a model's attention looks at: ``attention_map(model, token_ids, tokenizer, path)``
draws the attention weights of every head of the last layer, as the model's own attention
returns them when asked (``model(ids, weights_of=layer)``). matplotlib is optional, as for
every figure (``minilm.figures.canvas``).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from minilm.figures.canvas import PlotError, require_matplotlib, save_figure

MAX_ATTENTION_TOKENS = 64  # attention maps show at most the last this many tokens


class AttentionCapture(NamedTuple):
    """The last layer's attention: ``weights`` (heads, T, T) for the first sequence, and what
    the attention module saw and returned (``x``, ``output``)."""

    weights: torch.Tensor
    x: torch.Tensor
    output: torch.Tensor


def attention_weights(
    model, token_ids, *, last_queries: Optional[int] = None, forward: Optional[dict] = None
) -> AttentionCapture:
    """Run ``model`` on ``token_ids`` (1-D) without a cache and take the softmax weights of every
    head of its last layer, as that layer's attention returns them. ``last_queries`` keeps only
    the rows of the last that many queries, (heads, last_queries, T); ``forward``: options of the
    forward pass (a generation's ``window``, ``sinks``, ``sink_positions``, ``context_len``)."""
    ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(1, -1)
    seen = {}

    def record(module, args, output):
        seen["x"], seen["output"] = args[0], output[0]

    hook = model.blocks[-1].attn.register_forward_hook(record)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            _, weights = model(ids.to(next(model.parameters()).device), weights_of=-1, **(forward or {}))
    finally:
        hook.remove()
        model.train(was_training)
    T = ids.shape[1]
    rows = slice(T - min(T, last_queries or T), T)
    return AttentionCapture(weights[0, :, rows].float().cpu(), seen["x"], seen["output"])


def _token_label(tokenizer, token_id: int, width: int = 8) -> str:
    text = tokenizer.decode([token_id])
    if not text.strip("\ufffd") and hasattr(tokenizer, "id_to_piece"):  # a lone byte of a character
        text = tokenizer.id_to_piece(token_id)
    text = text.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "\u2423") or f"#{token_id}"
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def attention_map(
    model, token_ids, tokenizer, path: str, *, max_tokens: int = MAX_ATTENTION_TOKENS, context=None, sinks=0, **kw
) -> str:
    """Draw the attention weights of each head in the last layer of ``model`` over ``token_ids``
    (prompt plus generated tokens), ticks labelled with ``tokenizer.decode`` of each token; write
    the figure to ``path`` (an earlier file there is set aside, never replaced: ``save_figure(keep=True)``)
    and return it. The model sees the whole sequence (its last position_limit() tokens for
    bounded schemes); the figure shows the last ``max_tokens``. ``context`` (a generation's window,
    with ``sinks`` and ``sink_positions``): the attention that window allows, as a generation without
    a cache computes it."""
    figure = attention_figure(model, token_ids, tokenizer, max_tokens=max_tokens, context=context, sinks=sinks, **kw)
    return save_figure(figure, path, keep=True)


def attention_figure(
    model, token_ids, tokenizer, *, max_tokens: int = MAX_ATTENTION_TOKENS, context=None, sinks=0, sink_positions=None
):
    """The figure of ``attention_map``, not yet written."""
    Figure = require_matplotlib()
    ids = [int(t) for t in (token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids)]
    if not ids:
        raise PlotError("attention_map needs at least one token")
    if max_tokens < 1:
        raise PlotError(f"max_tokens={max_tokens} is invalid: expected at least 1")
    notes, total = [], len(ids)
    limit = model.positions.position_limit()
    if limit is not None and len(ids) > int(limit):
        notes.append(f"model run on the last {int(limit)} of {len(ids)} tokens ({model.positions.kind} table limit)")
        ids = ids[-int(limit) :]
    forward = {}
    if limit is None and context is not None and (len(ids) > context or sinks):  # the generation's window
        forward = dict(window=context, sinks=sinks, sink_positions=sink_positions or "absolute", context_len=context)
        notes.append(f"attention in the generation's window of {context} tokens" + f", {sinks} sinks" * bool(sinks))
    shown = min(len(ids), max_tokens)
    weights = attention_weights(model, ids, last_queries=shown, forward=forward).weights[:, :, -shown:]
    if shown < len(ids):
        notes.append(f"showing the last {shown} of {len(ids)} tokens (rows may sum to < 1: earlier keys hidden)")
    labels = [_token_label(tokenizer, t) for t in ids[-shown:]]

    heads = weights.shape[0]
    cols = math.ceil(math.sqrt(heads))
    rows = math.ceil(heads / cols)
    cell = 2.0 + 0.11 * shown  # inches per head: room for one token label per row / column
    fig = Figure(figsize=(cols * cell + 1.2, rows * cell + 1.0), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    import matplotlib

    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#e8e8e8")
    causal = torch.ones(shown, shown, dtype=torch.bool).tril()
    vmax = float(weights.max())  # shared by all heads, so heads compare; see the colorbar
    fontsize = 9 if shown <= 24 else 7
    image = None
    for h, ax in enumerate(axes.flat):
        if h >= heads:
            ax.axis("off")
            continue
        shown_weights = weights[h].masked_fill(~causal, float("nan"))  # future keys: masked, grey
        image = ax.imshow(shown_weights.numpy(), cmap=cmap, vmin=0, vmax=vmax, interpolation="nearest")
        ax.set_title(f"head {h}", fontsize=11)
        bottom, left = h + cols >= heads, h % cols == 0  # token labels on the outer edges only
        ax.set_xticks(range(shown), labels if bottom else [], rotation=90, fontsize=fontsize)
        ax.set_yticks(range(shown), labels if left else [], fontsize=fontsize)
        if bottom:
            ax.set_xlabel("key (attended to)")
        if left:
            ax.set_ylabel("query")
    fig.colorbar(image, ax=axes, label="attention weight", shrink=0.6)
    layers = len(model.blocks)
    title = (
        f"attention of each head in the last layer (layer {layers} of {layers}), position {model.positions.kind}: "
        f"tokens {total - shown}..{total - 1} of {total}"
    )
    fig.suptitle("\n".join([title] + notes), fontsize=12)
    return fig
