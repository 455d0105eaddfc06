"""One layer's computation, written once, as functions of its parts: the blocks of
``minilm.model.gpt`` call them with parts read from their modules at every call, and the eager
decode step (``minilm.generation.lean``) with parts read once per generation (plain tensors and
functions: no module lookups per step). The two compute the same thing in the same order.

``ForwardPass`` is what every layer reads of one call of the model. ``self_attention`` is a
layer's attention: q, k and v of the projection (``split_heads``), the layer's value embedding,
its query scale, the cache write and attention over what the layer sees (``minilm.model.attention``:
shared positions, rows of their own, or sinks at cache positions), then the output projection.
``block`` is the residual block around it and the MLP (``feed_forward``).
"""

from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple, Optional

import torch

from minilm.model.attention import attend, attend_in_cache, attend_rows, rotate_rows, row_layout, scale_queries
from minilm.model.cache import KVCache
from minilm.model.functional import activation
from minilm.positions import PositionScheme
from minilm.positions.layers import LayerType


class ForwardPass(NamedTuple):
    """What every block's attention needs to know of one forward pass: the new tokens'
    positions, the position scheme as this pass asks it (``PositionScheme.start``), the KV cache
    (or None), the attention window and sinks, the context length (what dynamic scaling reads)
    and the layer whose attention weights to hand back (None: no layer's)."""

    pos: torch.Tensor
    scheme: PositionScheme
    cache: Optional[KVCache]
    window: Optional[int]
    sinks: int
    context_len: int
    weights_of: Optional[int] = None
    renumbered: bool = False  # attention sinks at their positions within the cache (``attend_in_cache``)
    documents: Optional[torch.Tensor] = None  # (B, T): the document of each token (``data.document_mask``)
    values: Optional[list] = None  # model.value_embeddings: per layer, (B, T, n_kv_head * head_dim) added to v
    schemes: tuple = ()  # model.layers: each layer's position scheme (empty: ``scheme`` in every layer)

    @property
    def per_row(self) -> bool:
        """Whether rows have positions of their own (``attend_rows``); documents under shared
        positions are masked for the whole batch at once."""
        return self.pos.dim() == 2


class AttentionParts(NamedTuple):
    """What one layer's attention computes with (``CausalSelfAttention.parts``)."""

    qkv: Callable  # x -> the q/k/v projection, (B, T, (n_head + 2 n_kv_head) head_dim)
    proj: Callable  # the attention's output projection
    q_norm: Optional[Callable]  # model.qk_norm: the RMSNorm of each query head, else None
    k_norm: Optional[Callable]
    n_head: int
    n_kv_head: int
    head_dim: int
    layer_type: LayerType  # the layer's window, chunk, sinks, soft-cap and query scale
    sink_logits: Optional[torch.Tensor]  # learned sinks (``sinks: learned``), else None
    dropout_p: float  # attention dropout of this pass (0 in evaluation)
    norm_span: str = "head"  # model.qk_norm_span: q_norm and k_norm over each head, or over the whole projection


class BlockParts(NamedTuple):
    """What one block computes with (``Block.parts``)."""

    ln_1: Optional[Callable]  # the norm on the attention's input (None: ``sublayer_norms: post``)
    attention: Callable  # (x, layer, fp) -> the attention output, or (output, weights) for fp.weights_of
    ln_2: Optional[Callable]  # and on the MLP's
    mlp: Callable
    drop: Optional[Callable]  # the residual dropout (None where it does nothing: evaluation, or p = 0)
    parallel: bool  # model.parallel_residual
    post_attn_norm: Optional[Callable] = None  # the norm on the attention's output (``sandwich``, ``post``), else None
    post_mlp_norm: Optional[Callable] = None  # and on the MLP's


def split_heads(projected, parts: AttentionParts, fp: ForwardPass, scheme: PositionScheme, rotated: bool):
    """q (B, n_head, T, head_dim) and k, v (B, n_kv_head, T, head_dim) of the q/k/v projection's output
    (B, T, (n_head + 2 n_kv_head) head_dim); with ``qk_norm`` q and k normalised (each head's, or with
    ``norm_span`` projection all of q's and all of k's at once, before the split). q and k are rotated by
    ``scheme`` (the layer's) at the pass's positions where ``rotated``; not where rows have positions of
    their own (``self_attention`` rotates them row by row) or sinks are renumbered (``attend_in_cache``
    rotates the keys at every step). Without qk-norm they are rotated as the one stack the projection makes of them
    (``rotate_stacked``: half the calls of two rotations for rope)."""
    B, T, _ = projected.shape
    if parts.q_norm is not None and parts.norm_span == "projection":  # normalised before the heads are split
        q_width, k_width = parts.n_head * parts.head_dim, parts.n_kv_head * parts.head_dim
        q, k, v = projected.split([q_width, k_width, k_width], dim=-1)
        projected = torch.cat([parts.q_norm(q), parts.k_norm(k), v], dim=-1)
        parts = parts._replace(q_norm=None, k_norm=None)
    heads = projected.view(B, T, -1, parts.head_dim).transpose(1, 2)
    qk, v = heads[:, : -parts.n_kv_head], heads[:, -parts.n_kv_head :]
    n_head = parts.n_head
    if parts.q_norm is not None:
        q, k = parts.q_norm(qk[:, :n_head]), parts.k_norm(qk[:, n_head:])
        return (*scheme.rotate(q, k, fp.pos, fp.context_len), v) if rotated else (q, k, v)
    if rotated:
        return (*scheme.rotate_stacked(qk, n_head, fp.pos, fp.context_len), v)
    return qk[:, :n_head], qk[:, n_head:], v


def expand_heads(kv: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, n_kv_head, T, d) -> (B, n_head, T, d): each k/v head repeated for its group of queries."""
    groups = n_head // kv.shape[1]
    return kv if groups == 1 else kv.repeat_interleave(groups, dim=1)


def self_attention(x, layer: int, fp: ForwardPass, parts: AttentionParts):
    """The attention output of layer ``layer`` for x (B, T, d_model); with ``fp.weights_of == layer``
    the pair (output, attention weights (B, n_head, T, keys))."""
    B, T, _ = x.shape
    scheme = fp.schemes[layer] if fp.schemes else fp.scheme
    per_row = fp.per_row
    q, k, v = split_heads(parts.qkv(x), parts, fp, scheme, not (per_row or fp.renumbered))
    if fp.values is not None:  # before the cache write: the cache holds the values attention reads
        v = v + fp.values[layer].view(B, T, -1, parts.head_dim).transpose(1, 2)
    if per_row:
        q, k = rotate_rows(scheme, q, k, fp.pos, fp.context_len)
    q = scale_queries(q, fp.pos, parts.layer_type)
    k_pos, window, sinks, cache = fp.pos, fp.window, fp.sinks, fp.cache
    if cache is not None:
        k, v, k_pos = cache.update(layer, k, v)
        window, sinks = (cache.capacity, cache.sinks) if cache.rolling else (None, 0)
    need_weights = fp.weights_of == layer
    q_in, n_head = q.to(k.dtype), parts.n_head  # a float32 cache under a half-precision model: attention in float32
    if not (per_row or fp.renumbered):
        y = attend(
            q_in,
            expand_heads(k, n_head),
            expand_heads(v, n_head),
            fp.pos,
            k_pos,
            scheme,
            cached=cache is not None,
            window=window,
            sinks=sinks,
            dropout_p=parts.dropout_p,
            padded=cache is not None and cache.static,
            need_weights=need_weights,
            documents=None if fp.documents is None else (fp.documents, fp.documents),
            layer=parts.layer_type,
            sink_logits=parts.sink_logits,
        )
    else:
        settings = {"layer": parts.layer_type, "sink_logits": parts.sink_logits, "dropout_p": parts.dropout_p}
        if per_row:
            layout = row_layout(fp.pos, fp.documents, k_pos, None if cache is None else cache.offsets)
            k, v = expand_heads(k, n_head), expand_heads(v, n_head)
            cached = cache is not None
            y = attend_rows(
                q_in, k, v, layout, scheme, cached=cached, window=window, need_weights=need_weights, **settings
            )
        else:  # sinks renumbered: the keys are rotated at every step, before they are repeated for the queries
            expand = partial(expand_heads, n_head=n_head)
            y = attend_in_cache(
                q_in,
                k,
                v,
                fp.pos,
                k_pos,
                scheme,
                context_len=fp.context_len,
                window=window,
                sinks=sinks,
                expand=expand,
                **settings,
            )
    y, weights = y if need_weights else (y, None)
    out = parts.proj(y.to(q.dtype).transpose(1, 2).reshape(B, T, -1))
    return (out, weights) if need_weights else out


def feed_forward(x, fc: Callable, proj: Callable, kind: str):
    """The MLP: proj(activation(fc(x))), the activation by ``model.mlp`` (``functional.activation``)."""
    return proj(activation(kind, fc(x)))


def block(x, layer: int, fp: ForwardPass, parts: BlockParts):
    """A block's output: x + attention(ln_1(x)), then + mlp(ln_2(.)) of that sum; with ``parallel``
    both read the block input; with post-norms each sublayer's output is normalised before it is
    added (``sublayer_norms``: sandwich, Gemma 2, beside the pre-norms; post, OLMo 2, without them).
    With ``fp.weights_of == layer`` the pair (output, the attention's weights)."""
    attended = parts.attention(x if parts.ln_1 is None else parts.ln_1(x), layer, fp)
    need_weights = fp.weights_of == layer
    attended, weights = attended if need_weights else (attended, None)
    if parts.post_attn_norm is not None:
        attended = parts.post_attn_norm(attended)
    attended = dropped(attended, parts.drop)
    h = x if parts.parallel else x + attended
    fed = parts.mlp(h if parts.ln_2 is None else parts.ln_2(h))
    if parts.post_mlp_norm is not None:
        fed = parts.post_mlp_norm(fed)
    out = (x + attended if parts.parallel else h) + dropped(fed, parts.drop)
    return (out, weights) if need_weights else out


def dropout(module: torch.nn.Dropout) -> Optional[Callable]:
    """``module``, or None where it would do nothing (evaluation, or p = 0): a decode step saves the calls."""
    return module if module.training and module.p else None


def dropped(x: torch.Tensor, drop: Optional[Callable]) -> torch.Tensor:
    """``drop(x)``, or x where there is no dropout (``dropout``)."""
    return x if drop is None else drop(x)
