"""Attention: causal scaled dot-product attention with a position scheme's bias and value
term, over the full sequence, a window, a KV cache, attention sinks at cache positions, and
rows that have positions of their own (``attend_rows``: documents packed into one training
row, left-padded prompts of different lengths).

Positions are explicit tensors everywhere: the scheme's hooks (``minilm.positions``) read them,
and the masks are built from them (``visible``), never from slice lengths.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from minilm.positions import PositionScheme
from minilm.positions.layers import LayerType, query_scale_factor

# Largest number of bias/mask entries (batch x heads x queries x keys) built at once; longer
# inputs are processed in chunks of queries so that the masks' memory grows linearly with length.
MASK_BUDGET = 1 << 24
QUERY_CHUNK = 256  # queries per chunk of the masked path (at most MASK_BUDGET mask entries)
WINDOW_CHUNK = 64  # at least this many queries per chunk under a layer's window (each over its band of keys)
WRITTEN_OUT_MAX = 256  # a compiled CPU pass over at most this many tokens writes causal attention out


def written_out_pays(q: torch.Tensor) -> bool:
    """Whether a full causal pass writes attention out (``attend_written_out``) instead of SDPA's causal
    kernel: in a compiled pass (``train.compile``) on the CPU over at most ``WRITTEN_OUT_MAX`` tokens, where
    inductor fuses the scale, the mask and the softmax around two matrix products. SDPA's CPU flash kernel
    took 44 of the main job's 143 ms a step on an EPYC without AMX, and the step written out ran 0.86x as
    long there (docs/benchmarks.md, "The main job's step"); the T x T scores keep it to short passes."""
    return q.device.type == "cpu" and q.shape[-2] <= WRITTEN_OUT_MAX and torch.compiler.is_compiling()


def visible(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    window: Optional[int] = None,
    sinks: int = 0,
    layer: Optional[LayerType] = None,
) -> torch.Tensor:
    """(Tq, Tk) True where a query may see a key: causal, and with a ``window`` W only the last
    W - ``sinks`` positions plus the first ``sinks`` ones (a pass's or a rolling cache's window);
    and within the ``layer``'s own window and chunk (``minilm.positions.layers``)."""
    distance = q_pos[:, None] - k_pos[None, :]
    allowed = distance >= 0
    if window is not None:
        band = distance < window - sinks
        allowed &= (band | (k_pos[None, :] < sinks)) if sinks else band
    if layer is not None and layer.window is not None:
        allowed &= distance < layer.window
    if layer is not None and layer.chunk is not None:
        allowed &= torch.floor(q_pos[:, None] / layer.chunk) == torch.floor(k_pos[None, :] / layer.chunk)
    return allowed


def attend(
    q,
    k,
    v,
    q_pos,
    k_pos,
    scheme: PositionScheme,
    *,
    cached: bool,
    window: Optional[int],
    sinks: int = 0,
    dropout_p: float = 0.0,
    padded: bool = False,
    need_weights: bool = False,
    documents: Optional[tuple] = None,
    layer: Optional[LayerType] = None,
    sink_logits: Optional[torch.Tensor] = None,
):
    """Causal scaled dot-product attention with the scheme's bias, for queries at ``q_pos``
    over keys at ``k_pos``. ``window`` W keeps only the keys of the last W - ``sinks``
    positions (q_pos - k_pos < W - sinks) and those of the first ``sinks`` positions.
    ``padded``: the keys include a static cache's empty slots, which only the mask hides.
    ``need_weights``: (output, weights (B, heads, Tq, Tk)), written out (SDPA returns none).
    ``documents``: (document of each query, of each key), (Tq,) and (Tk,) for one row or
    (B, Tq) and (B, Tk) for every row of the batch: a query sees only the keys of its own document.
    ``layer``: the layer's own window, chunk and soft-cap (``minilm.positions.layers``; None: none);
    ``sink_logits`` (heads,): its learned sinks."""
    Tq, Tk = q.shape[-2], k.shape[-2]
    masked = layer is not None and layer.masked
    fused = not (scheme.has_bias or scheme.has_value_term or need_weights or documents is not None)
    if fused and sink_logits is None and not (layer is not None and layer.softcap):
        if cached and Tq == 1:  # one new token sees every held key (a rolling cache holds only its window)
            # a static cache's empty slots are hidden, and what the layer's window or chunk hides
            # (the keys a cache of at most W slots holds without stream sinks are all within a window of W)
            if padded or (masked and (layer.chunk is not None or sinks or Tk > layer.window)):
                mask = visible(q_pos, k_pos, window, sinks, layer)
            else:
                mask = None
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        if not cached and window is None and not masked and not written_out_pays(q):
            # the full sequence: SDPA's causal kernel, no T x T scores
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    chunk, outputs, weights = queries_per_chunk(q, Tk), [], []
    reach = layer.window if layer is not None and layer.window is not None and not cached else None
    if reach is not None:  # a window's queries in chunks of about its width, each over its own band of keys
        width = max(reach, WINDOW_CHUNK)
        chunk = min(width, queries_per_chunk(q, min(Tk, width + reach)))  # a band holds < width + reach keys
    for start in range(0, Tq, chunk):
        end = min(start + chunk, Tq)
        qp, qc = q_pos[start:end], q[:, :, start:end]
        # without a cache the keys are the queries' own sequence: those after the chunk's last
        # query are never visible, so each chunk attends to a prefix (half the work overall); under a
        # layer's window W, those W or more tokens before its first query are not either (positions never
        # come closer than the tokens' order: rows restart them only at a document, which is masked)
        low = 0 if reach is None else max(0, start - reach + 1)
        kp, kc, vc = (k_pos, k, v) if cached else (k_pos[low:end], k[:, :, low:end], v[:, :, low:end])
        k_doc = None if documents is None else documents[1][..., low : low + len(kp)]
        if cached and not need_weights and not kp.is_meta:  # slots in no order: keep those the chunk can see
            held = held_for(qp, kp, layer)
            kp, kc, vc, k_doc = kp[held], kc[:, :, held], vc[:, :, held], None if k_doc is None else k_doc[..., held]
        allowed = visible(qp, kp, window, sinks, layer)
        if documents is not None:
            same = documents[0][..., start:end, None] == k_doc[..., None, :]
            allowed = allowed & (same if same.dim() == 2 else same[:, None])  # (B, 1, queries, keys) for a batch
        mask = allowed
        if scheme.has_bias:
            mask = torch.where(allowed, scheme.bias(qp, kp, qc).to(q.dtype), float("-inf"))
        out, w = attend_written_out(qc, kc, vc, mask, qp, kp, scheme, dropout_p, layer, sink_logits)
        outputs.append(out)
        if need_weights:  # keys outside a chunk's band were never visible: weight 0
            weights.append(F.pad(w, (low, Tk - low - w.shape[-1])))
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)
    return (out, torch.cat(weights, dim=2)) if need_weights else out


def held_for(q_pos: torch.Tensor, k_pos: torch.Tensor, layer: Optional[LayerType]) -> torch.Tensor:
    """(Tk,) True for the cached keys that some query at ``q_pos`` can see: none after the last query,
    and under the ``layer``'s window W none W or more before the first, under its chunks none before
    the first query's chunk. ``visible`` decides the rest; this only spares the scores of the others."""
    held = k_pos <= q_pos.max()
    if layer is not None and layer.window is not None:
        held &= k_pos > q_pos.min() - layer.window
    if layer is not None and layer.chunk is not None:
        held &= k_pos >= torch.floor(q_pos.min() / layer.chunk) * layer.chunk
    return held


def attend_in_cache(
    q,
    k,
    v,
    q_pos,
    k_pos,
    scheme: PositionScheme,
    *,
    context_len: int,
    window: int,
    sinks: int,
    expand,
    dropout_p: float = 0.0,
    layer: Optional[LayerType] = None,
    sink_logits: Optional[torch.Tensor] = None,
):
    """Attention over a window with ``sinks`` at their positions within the cache, as StreamingLLM
    does it (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks",
    section 3.2), for unrotated ``q`` at ``q_pos`` (ascending) and unrotated ``k`` (and ``v``,
    n_kv_head heads; ``expand`` repeats them for the query heads) at ``k_pos``.

    A query at p sees the sinks (keys at positions < sinks) and the keys j with
    0 <= p - j < window - sinks, numbered as the cache orders them: the sinks 0..sinks-1, the
    window after them and the query last. With shift = max(0, p - window + 1) the query sits
    at p - shift, a window key j at j - shift and sink s at s: distances within the window are
    unchanged, and the sinks stay window - 1 - s back however long the stream. Until a query's
    window is full (shift 0) that is plain attention at absolute positions, done for all such
    queries at once; after it every query has its own numbering and is attended alone, its
    keys rotated at their new positions (the cache holds them unrotated)."""
    shift = (q_pos - (window - 1)).clamp(min=0)
    plain = int((shift == 0).sum())
    outputs = []
    if plain:
        seen = k_pos <= q_pos[plain - 1]  # without a cache the keys run past these queries
        kp = k_pos[seen]
        qr, kr = rotate_apart(scheme, q[:, :, :plain], q_pos[:plain], k[:, :, seen], kp, context_len)
        outputs.append(
            attend(
                qr,
                expand(kr),
                expand(v[:, :, seen]),
                q_pos[:plain],
                kp,
                scheme,
                cached=True,
                window=window,
                sinks=sinks,
                dropout_p=dropout_p,
                layer=layer,
                sink_logits=sink_logits,
            )
        )
    for i in range(plain, len(q_pos)):
        p, s = q_pos[i], shift[i]
        seen = (k_pos < sinks) | ((k_pos <= p) & (p - k_pos < window - sinks))
        kp = torch.where(k_pos[seen] < sinks, k_pos[seen], k_pos[seen] - s)
        qp = (p - s).view(1)
        qr, kr = rotate_apart(scheme, q[:, :, i : i + 1], qp, k[:, :, seen], kp, context_len)
        outputs.append(
            attend(
                qr,
                expand(kr),
                expand(v[:, :, seen]),
                qp,
                kp,
                scheme,
                cached=True,
                window=None,
                dropout_p=dropout_p,
                layer=layer,
                sink_logits=sink_logits,
            )
        )
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


def rotate_apart(scheme: PositionScheme, q, q_pos, k, k_pos, context_len: int):
    """The scheme's rotation of queries at ``q_pos`` and of keys at other positions ``k_pos``
    (``rotate`` takes one set of positions for both)."""
    q_rotated, _ = scheme.rotate(q, q, q_pos, context_len)
    _, k_rotated = scheme.rotate(k, k, k_pos, context_len)
    return q_rotated, k_rotated


def queries_per_chunk(q: torch.Tensor, Tk: int) -> int:
    """Queries per chunk of the written-out path: at most QUERY_CHUNK, and at most MASK_BUDGET
    mask entries for the batch and heads of ``q`` over ``Tk`` keys."""
    return max(1, min(QUERY_CHUNK, MASK_BUDGET // (q.shape[0] * q.shape[1] * Tk)))


def attend_written_out(
    q,
    k,
    v,
    mask,
    q_pos,
    k_pos,
    scheme: PositionScheme,
    dropout_p: float,
    layer: Optional[LayerType] = None,
    sink_logits: Optional[torch.Tensor] = None,
) -> tuple:
    """(softmax(q k^T / sqrt(d) + mask) v, plus the scheme's ``value_term(weights)`` where it has
    one (SDPA returns no weights); the weights). ``mask`` is boolean (True: visible) or additive (-inf: hidden).
    The ``layer``'s soft-cap c makes the logits c tanh(z / c) before the mask and any bias is added
    (Gemma 2); ``sink_logits`` s (heads,) join each softmax's denominator, their weight dropped:
    exp(z_j) / (exp(s_h) + sum_i exp(z_i)) (GPT-OSS's learned sinks).
    Written out rather than SDPA with a mask, whose CPU fallback also checks every row for
    being fully masked (none is here: a query always sees itself) and is slower for it."""
    scores = (q @ k.transpose(-1, -2)).mul_(1.0 / math.sqrt(q.shape[-1]))
    if layer is not None and layer.softcap:
        scores = torch.tanh(scores / layer.softcap) * layer.softcap  # not in place: tanh keeps its output
    scores = scores.masked_fill_(~mask, float("-inf")) if mask.dtype == torch.bool else scores.add_(mask)
    if sink_logits is None:
        weights = torch.softmax(scores.float(), dim=-1)
    else:
        sinks = sink_logits.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores.float(), sinks], dim=-1), dim=-1)[..., :-1]
    weights = F.dropout(weights.to(v.dtype), p=dropout_p)
    out = weights @ v
    return (out + scheme.value_term(weights, q_pos, k_pos).to(v.dtype) if scheme.has_value_term else out), weights


def document_layout(idx: torch.Tensor, end_of_text: int) -> tuple:
    """(document index (B, T), position within the document (B, T)) of every token of ``idx``,
    rows of documents that each end with the ``end_of_text`` id: the id belongs to the document
    it closes, the token after it starts the next one at position 0. A row's first document
    starts at its first token (its true start may lie before the row, as in any packed window)."""
    ends = (idx == end_of_text).long()
    documents = ends.cumsum(1) - ends
    index = torch.arange(idx.shape[1], device=idx.device)
    begins = torch.zeros_like(ends, dtype=torch.bool)
    begins[:, 1:] = ends[:, :-1].bool()
    first = torch.where(begins, index, torch.zeros_like(index)).cummax(dim=1).values
    return documents, (index - first).float()


def row_layout(
    pos: torch.Tensor, documents: Optional[torch.Tensor], k_pos: torch.Tensor, offsets: Optional[torch.Tensor]
) -> tuple:
    """(query positions, key positions, query documents, key documents), each (B, ...), for
    ``attend_rows``, from the rows' positions ``pos`` (B, T). Without a cache the keys are the
    queries and ``documents`` (B, T) says where each token belongs. With a cache of left-padded rows
    (``offsets`` (B,): the padding before each row's first token) the keys sit at the cache's
    positions minus the row's offset; padding, at negative positions, is a document apart
    (it attends to itself, so that its rows stay finite, and nothing real attends to it)."""
    if offsets is None:
        return pos, pos, documents, documents
    k_rows = k_pos[None, :] - offsets[:, None]
    return pos, k_rows, (pos >= 0).long(), (k_rows >= 0).long()


def rotate_rows(scheme: PositionScheme, q, k, pos: torch.Tensor, context_len: int):
    """The scheme's rotation of q and k, each row b at its own positions ``pos[b]``."""
    pairs = [scheme.rotate(q[b : b + 1], k[b : b + 1], pos[b], context_len) for b in range(q.shape[0])]
    return torch.cat([qr for qr, _ in pairs]), torch.cat([kr for _, kr in pairs])


def attend_rows(
    q,
    k,
    v,
    layout: tuple,
    scheme: PositionScheme,
    *,
    cached: bool,
    window: Optional[int],
    dropout_p: float = 0.0,
    need_weights: bool = False,
    layer: Optional[LayerType] = None,
    sink_logits: Optional[torch.Tensor] = None,
):
    """``attend`` for rows that have positions and documents of their own (``row_layout``):
    each row alone, queries at its positions over its keys, a query seeing only the keys of its
    own document. A loop over rows keeps every scheme's hooks as they are (one row's positions);
    it serves documents whose positions restart (``data.document_mask: restart``) and batches of
    prompts of different lengths. Documents under shared positions need no loop: ``attend``
    masks them for the whole batch."""
    q_pos, k_pos, q_doc, k_doc = layout
    results = [
        attend(
            q[b : b + 1],
            k[b : b + 1],
            v[b : b + 1],
            q_pos[b],
            k_pos[b],
            scheme,
            cached=cached,
            window=window,
            dropout_p=dropout_p,
            need_weights=need_weights,
            documents=(q_doc[b], k_doc[b]),
            layer=layer,
            sink_logits=sink_logits,
        )
        for b in range(q.shape[0])
    ]
    if need_weights:
        return torch.cat([out for out, _ in results]), torch.cat([w for _, w in results])
    return torch.cat(results)


def scale_queries(q: torch.Tensor, pos: torch.Tensor, layer_type: LayerType) -> torch.Tensor:
    """q (B, heads, T, head_dim) times the layer's query scale at positions ``pos`` ((T,), or (B, T)
    for rows of their own; ``minilm.positions.layers.query_scale_factor``); q itself without one."""
    if layer_type.query_scale is None:
        return q
    factor = query_scale_factor(pos, layer_type.query_scale)
    return (q * (factor[:, None, :, None] if factor.dim() == 2 else factor[:, None])).to(q.dtype)
