"""Held-out scoring, shared by the trainer's evaluations and ``minilm.evaluation.lengths``.

``token_losses`` is the one implementation of "sum of next-token losses": it turns the
final hidden states into logits in chunks of ``LOSS_CHUNK`` rows, so the T x vocab logits
of a long segment never exist at once. ``segments`` cuts a token stream into the segments of
the two evaluation modes (Press et al. 2022, "Train Short, Test Long", appendix B):

* ``nonoverlapping``: consecutive segments, each scored in full from position 0, so the
  average token sees T/2 tokens of context. This is what the ALiBi paper reports.
* ``sliding``: segments of T tokens that advance by ``stride`` tokens; only the last
  ``stride`` tokens of each segment are scored, so every scored token sees at least
  T - stride tokens of context (except in the first segment, which is scored in full,
  as in the usual sliding evaluation). Costs T / stride times more.
* ``fixed-stride``: the same with one stride S for every length (the PI and YaRN papers'
  protocol, S = 256 there): every scored token sees at least T - S tokens of context, so
  longer segments mean more context for every token, not only for the average one.

``score_many`` runs a model over the segments of several (length, mode) requests at
once and returns the mean nats per scored token of each; ``score`` is one request. A causal
model's output at a token depends only on the tokens before it, and (for a scheme whose
``prefix_invariant`` is True: all but those that read the sequence length, dynamic NTK and
LongRoPE) not on how far the segment goes on. So a segment's losses are those of the same
tokens inside any longer segment that starts at the same token, and ``score_many`` runs
each distinct segment start once, as far as the longest segment starting there reaches. A
non-overlapping segment of T at k*T is the start of the 2T segments there, and every sliding
segment (stride T/2) starts where a sliding segment of 2T or a segment of T/2 does: for
L, 2L, 4L and 8L in both modes the model sees 5 N token positions instead of 12 N.
The trainer's held-out numbers are ``heldout_loss`` over ``eval_batches``
(fixed random segments, the same at every evaluation) or ``split_batches`` (the whole
validation split in non-overlapping segments).
"""

from __future__ import annotations

import functools
import math
import sys
from typing import Optional

import torch
import torch.distributed
import torch.nn.functional as F
from tqdm import tqdm

from minilm.common import MinilmError, autocast
from minilm.data.batches import get_batch
from minilm.model.gpt import soft_cap

MODES = ("nonoverlapping", "sliding", "fixed-stride")
LOSS_CHUNK = 4096  # rows of hidden states turned into logits at once


class ScoringError(MinilmError):
    """A bad scoring request (mode, stride); the message is one line for the user."""


def token_losses(model, x: torch.Tensor, y: torch.Tensor, first: int = 0, **forward) -> torch.Tensor:
    """(B, T - first) float32 next-token cross-entropies in nats of targets ``y`` after inputs
    ``x``, at positions ``first`` onwards; the logits are formed ``LOSS_CHUNK`` rows at a time.
    ``forward``: options of the model's forward pass (``window``, ``sinks``, ...)."""
    return model(x, head=functools.partial(_chunked_losses, y=y[:, first:], first=first), **forward)


def _chunked_losses(
    hidden: torch.Tensor, weight: torch.Tensor, softcap: float, y: torch.Tensor, first: int
) -> torch.Tensor:
    """The cross-entropies of ``token_losses`` from the final hidden states, the head's weight
    and the model's logit soft-cap."""
    hidden = hidden[:, first:]
    rows, targets = hidden.reshape(-1, hidden.shape[-1]), y.reshape(-1)
    losses = [
        F.cross_entropy(
            soft_cap(F.linear(rows[i : i + LOSS_CHUNK], weight).float(), softcap),
            targets[i : i + LOSS_CHUNK],
            reduction="none",
        )
        for i in range(0, rows.shape[0], LOSS_CHUNK)
    ]
    return torch.cat(losses).view(hidden.shape[0], hidden.shape[1])


def segments(n: int, length: int, mode: str, stride: Optional[int] = None) -> list:
    """(begin, end, scored) for the targets 1..n: inputs are tokens[begin:end], targets
    tokens[begin+1:end+1], and the last ``scored`` of them count. Every target is scored once."""
    if mode == "nonoverlapping":
        return [(b, min(b + length, n), min(b + length, n) - b) for b in range(0, n, length)]
    if mode not in MODES:
        raise ScoringError(f"mode={mode!r} is invalid: valid: {', '.join(MODES)}")
    if mode == "fixed-stride" and stride is None:
        raise ScoringError("mode='fixed-stride' needs its stride (the same at every length), e.g. the training length")
    stride = stride or max(1, length // 2)
    if not 1 <= stride <= length:
        raise ScoringError(f"stride={stride} is invalid for length {length}: expected 1 <= stride <= length")
    out, previous, end = [], 0, min(length, n)
    while True:
        out.append((max(0, end - length), end, end - previous))
        if end == n:
            return out
        previous, end = end, min(end + stride, n)


@torch.no_grad()
def score(
    model,
    tokens: torch.Tensor,
    length: int,
    mode: str = "nonoverlapping",
    stride: Optional[int] = None,
    *,
    batch_tokens: int = 8192,
    dtype: Optional[torch.dtype] = None,
    progress=None,
) -> float:
    """Mean nats per target over targets 1..len(tokens)-1 with segments of ``length`` tokens."""
    return score_many(
        model, tokens, [(length, mode, stride)], batch_tokens=batch_tokens, dtype=dtype, progress=progress
    )[0]


def _runs(n: int, requests, shared: bool) -> dict:
    """(begin, end) of each stretch the model runs over -> the segments read from it, as
    (request index, segment end, scored targets). ``shared``: one stretch per segment start,
    to the furthest end of a segment starting there; else one per distinct segment."""
    reads: dict = {}
    for index, (length, mode, stride) in enumerate(requests):
        for begin, end, scored in segments(n, length, mode, stride):
            reads.setdefault(begin if shared else (begin, end), []).append((index, end, scored))
    return {(key if shared else key[0], max(end for _, end, _ in these)): these for key, these in reads.items()}


def document_forward(data_cfg, eot_id: Optional[int]) -> dict:
    """What every forward pass over a corpus needs under ``data.document_mask`` (training, held-out
    and length evaluation alike): the end-of-text id that closes each document, and whether
    positions restart there; nothing for ``none``."""
    if data_cfg.document_mask == "none":
        return {}
    return {"end_of_text": eot_id, "restart_positions": data_cfg.document_mask == "restart"}


@torch.no_grad()
def score_many(
    model,
    tokens: torch.Tensor,
    requests,
    *,
    batch_tokens: int = 8192,
    dtype: Optional[torch.dtype] = None,
    progress=None,
    by_position: Optional[list] = None,
    by_target: Optional[list] = None,
    forward: Optional[dict] = None,
) -> list:
    """Mean nats per target over targets 1..len(tokens)-1 for each request (length, mode,
    stride), computed in ``dtype`` autocast (None: float32); ``progress.update(segments)`` as
    it goes. Segments that start at the same token share one run of the model when the
    scheme is ``prefix_invariant`` (module docstring).

    ``by_position``: a list that receives, for each request, the mean nats at each position
    0..length-1 of its segments (a float64 tensor) for ``nonoverlapping`` requests (every
    segment scored from position 0) and None for the others. ``by_target``: a list that receives,
    for each request, a float64 tensor (n,) of the nats of every target as that request scores it,
    indexed by the position of its input (entry i: tokens[i + 1] predicted), e.g. a ``sliding``
    request's losses of each token with at most ``length`` tokens visible (every target is scored
    once by every request). ``forward`` goes to every forward pass (``document_forward``; a document
    mask keeps every segment's prefix its own, so segments still share runs)."""
    n = len(tokens) - 1
    targets = [torch.full((n,), math.nan, dtype=torch.float64) for _ in requests] if by_target is not None else None
    sums = [torch.zeros(r[0], dtype=torch.float64) if r[1] == "nonoverlapping" else None for r in requests]
    counts = [torch.zeros(r[0], dtype=torch.float64) if r[1] == "nonoverlapping" else None for r in requests]
    device = next(model.parameters()).device
    runs = _runs(n, requests, shared=all(scheme.prefix_invariant for scheme in model.schemes()))
    groups: dict = {}
    for begin, end in runs:  # stretches of one length go through the model together
        groups.setdefault(end - begin, []).append((begin, end))
    totals = [0.0] * len(requests)
    for size, group in groups.items():
        per_batch = max(1, batch_tokens // size)
        for i in range(0, len(group), per_batch):
            batch = group[i : i + per_batch]
            first = min(end - scored - span[0] for span in batch for _, end, scored in runs[span])
            x = torch.stack([tokens[b:e] for b, e in batch]).to(device)
            y = torch.stack([tokens[b + 1 : e + 1] for b, e in batch]).to(device)
            with autocast(device, dtype):
                losses = token_losses(model, x, y, first, **(forward or {}))
            losses = losses.double().cpu()
            cumulative = F.pad(losses.cumsum(dim=1), (1, 0)).tolist()  # [row][j]: positions < first + j
            for row, (begin, stop) in enumerate(batch):
                for index, end, scored in runs[(begin, stop)]:
                    hi = end - begin - first
                    totals[index] += cumulative[row][hi] - cumulative[row][hi - scored]
                    if targets is not None:
                        targets[index][end - scored : end] = losses[row, hi - scored : hi]
                    if sums[index] is not None:  # a nonoverlapping segment: scored from position 0 == first
                        sums[index][:hi] += losses[row, :hi]
                        counts[index][:hi] += 1
            if progress is not None:
                progress.update(sum(len(runs[span]) for span in batch))
    if by_target is not None:
        by_target.extend(targets)
    if by_position is not None:
        by_position.extend(None if total is None else total / count.clamp(min=1) for total, count in zip(sums, counts))
    return [total / n for total in totals]


@torch.no_grad()
def heldout_loss(
    model, batches, device, dtype, dist, lockstep: bool = False, progress: Optional[str] = None, **forward
) -> float:
    """Mean next-token loss (nats) over ``batches`` [(x, y), ...] in ``dtype`` autocast; under DDP
    (``dist``: rank, world, enabled, see ``minilm.training.distributed``) each rank takes a share.
    ``lockstep``: every rank runs the same number of forward passes (a model sharded by FSDP
    gathers its weights in each, with every rank), a rank past the end scoring batch 0 uncounted.
    ``forward`` goes to every forward pass (the documents of ``data.document_mask``). ``progress``: the
    description of a progress bar over the batches on stderr (None: no bar)."""
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # (sum of losses, tokens)
    if lockstep and getattr(getattr(model, "positions", None), "draws_at_evaluation", False):
        # positions drawn per row at evaluation: GPT.forward runs a pass per row; one row per batch keeps
        # every rank's number of passes (and of FSDP's gathers) the same
        batches = [(x[i : i + 1], y[i : i + 1]) for x, y in batches for i in range(len(x))]
    rounds = -(-len(batches) // dist.world) if lockstep else 0
    steps = range(max(len(batches), rounds * dist.world))
    for i in tqdm(steps, desc=progress, unit="batch", disable=progress is None, file=sys.stderr, leave=False):
        if i % dist.world != dist.rank:
            continue
        counted = i < len(batches)
        x, y = batches[i] if counted else batches[0]
        x, y = x.to(device), y.to(device)
        with autocast(device, dtype):
            losses = token_losses(model, x, y, **forward).double().sum().to(device)
        if counted:
            total[0] += losses
            total[1] += y.numel()
    if dist.enabled:
        torch.distributed.all_reduce(total)
    model.train(was_training)
    return float(total[0] / total[1])


def eval_batches(val, config):
    """The fixed validation segments of the periodic evaluation (same segments every time)."""
    generator = torch.Generator().manual_seed(config.seed)
    t = config.train
    return [get_batch(val, t.batch_size, config.model.block_size, generator) for _ in range(t.eval_iters)]


def split_batches(val, block_size: int, batch_size: int, max_tokens: int):
    """The validation split (its first ``max_tokens + 1`` tokens) in non-overlapping segments."""
    tokens = torch.from_numpy(val[: max_tokens + 1].astype("int64"))
    n = (len(tokens) - 1) // block_size
    full = tokens[: n * block_size + 1]
    x, y = full[:-1].view(n, block_size), full[1:].view(n, block_size)
    batches = [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, n, batch_size)]
    rest = len(tokens) - 1 - n * block_size
    if rest > 0:
        tail = tokens[n * block_size :]
        batches.append((tail[:-1][None], tail[1:][None]))
    return batches
