"""What a model's attention looks at: ``attention_map(model, token_ids, tokenizer, path)``
draws the attention weights of every head of the last layer, recomputed exactly from the
input of that layer's attention (the model itself calls SDPA, which returns no weights).
matplotlib is optional, as for ``minilm.plots``.
"""
from __future__ import annotations

import inspect
import math
from typing import NamedTuple, Optional

import torch

from minilm.model import visible
from minilm.plots import PlotError, require_matplotlib, save_figure

MAX_ATTENTION_TOKENS = 64  # attention maps show at most the last this many tokens


class AttentionCapture(NamedTuple):
    """The last layer's attention, recomputed: ``weights`` (heads, T, T) for the first sequence,
    and what the attention module actually saw and returned (``x``, ``pos``, ``output``)."""
    weights: torch.Tensor
    x: torch.Tensor
    pos: torch.Tensor
    output: torch.Tensor


def attention_weights(model, token_ids, *, last_queries: Optional[int] = None) -> AttentionCapture:
    """Run ``model`` on ``token_ids`` (1-D) without a cache and recompute the softmax weights of
    every head of its last layer exactly: hooks capture the input of the last block's attention,
    then q, k come from its ``qkv``, the scheme's ``rotate`` and ``bias`` and the causal mask (the
    model itself calls SDPA, which returns no weights). ``last_queries`` keeps only the rows of
    the last that many queries, (heads, last_queries, T), so long sequences stay cheap."""
    ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(1, -1)
    attn = model.blocks[-1].attn
    signature = inspect.signature(attn.forward)
    seen = {}

    def before(module, args, kwargs):
        seen["call"] = signature.bind(*args, **kwargs).arguments

    def after(module, args, kwargs, output):
        seen["output"] = output

    hooks = [attn.register_forward_pre_hook(before, with_kwargs=True),
             attn.register_forward_hook(after, with_kwargs=True)]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(ids.to(next(model.parameters()).device))
            call = seen["call"]
            x, pos, scheme = call["x"], call["pos"], call["scheme"]
            T = x.shape[1]
            q, k, _v = attn.project(x)
            q, k = scheme.rotate(q, k, pos, call["context_len"])
            k = attn.expand(k)  # grouped-query attention: each key head serves its group of query heads
            rows = slice(T - min(T, last_queries or T), T)
            q, q_pos = q[0, :, rows].float(), pos[rows]
            scores = (q @ k[0].float().transpose(-1, -2)) / math.sqrt(attn.head_dim)
            if scheme.has_bias:
                bias = scheme.bias(q_pos, pos, q[None]).float()  # (heads, Tq, Tk), or (1, heads, Tq, Tk)
                scores = scores + (bias[0] if bias.dim() == 4 else bias)
            allowed = visible(q_pos, pos, call.get("window"), call.get("sinks", 0))
            weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return AttentionCapture(weights.cpu(), x, pos, seen["output"])


def _token_label(tokenizer, token_id: int, width: int = 8) -> str:
    text = tokenizer.decode([token_id])
    if not text.strip("\ufffd") and hasattr(tokenizer, "id_to_piece"):  # a lone byte of a character
        text = tokenizer.id_to_piece(token_id)
    text = text.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "\u2423") or f"#{token_id}"
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def attention_map(model, token_ids, tokenizer, path: str, *, max_tokens: int = MAX_ATTENTION_TOKENS) -> str:
    """Draw the attention weights of each head in the last layer of ``model`` over ``token_ids``
    (prompt plus generated tokens), ticks labelled with ``tokenizer.decode`` of each token; write
    the figure to ``path`` and return it. The model sees the whole sequence (its last
    position_limit() tokens for bounded schemes); the figure shows the last ``max_tokens``."""
    return save_figure(attention_figure(model, token_ids, tokenizer, max_tokens=max_tokens), path)


def attention_figure(model, token_ids, tokenizer, *, max_tokens: int = MAX_ATTENTION_TOKENS):
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
        ids = ids[-int(limit):]
    shown = min(len(ids), max_tokens)
    weights = attention_weights(model, ids, last_queries=shown).weights[:, :, -shown:]
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
    title = (f"attention of each head in the last layer (layer {layers} of {layers}), position {model.positions.kind}: "
             f"tokens {total - shown}..{total - 1} of {total}")
    fig.suptitle("\n".join([title] + notes), fontsize=12)
    return fig
