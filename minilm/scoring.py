"""Held-out scoring, shared by the trainer's evaluations and ``minilm.evaluation``.

``token_losses`` is the one implementation of "sum of next-token losses": it turns the
final hidden states into logits in chunks of ``LOSS_CHUNK`` rows, so the T x vocab logits
of a long window never exist at once. ``windows`` cuts a token stream into the windows of
the two evaluation protocols (Press et al. 2022, "Train Short, Test Long", appendix B):

* ``nonoverlapping``: consecutive windows, each scored in full from position 0, so the
  average token sees T/2 tokens of context. This is what the ALiBi paper reports.
* ``sliding``: windows of T tokens that advance by ``stride`` tokens; only the last
  ``stride`` tokens of each window are scored, so every scored token sees at least
  T - stride tokens of context (except in the first window, which is scored in full,
  as in the usual sliding-window recipe). Costs T / stride times more.

``score`` runs a model over all windows of one length and returns the mean nats per
scored token.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from minilm.common import MinilmError, autocast

MODES = ("nonoverlapping", "sliding")
LOSS_CHUNK = 4096  # rows of hidden states turned into logits at once


class ScoringError(MinilmError):
    """A bad scoring request (mode, stride); the message is one line for the user."""


def token_losses(model, x: torch.Tensor, y: torch.Tensor, keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Sum (float64, on the CPU) of the next-token cross-entropies in nats of targets ``y``
    after inputs ``x``, at the positions where ``keep`` is True (all when None)."""
    hidden = model(x, return_hidden=True)
    if keep is None:
        hidden, targets = hidden.reshape(-1, hidden.shape[-1]), y.reshape(-1)
    else:
        hidden, targets = hidden[keep], y[keep]
    total = torch.zeros((), dtype=torch.float64)
    for start in range(0, hidden.shape[0], LOSS_CHUNK):
        logits = model.lm_head(hidden[start:start + LOSS_CHUNK]).float()
        total += F.cross_entropy(logits, targets[start:start + LOSS_CHUNK], reduction="sum").double().cpu()
    return total


def windows(n: int, length: int, mode: str, stride: Optional[int] = None) -> list:
    """(begin, end, scored) for the targets 1..n: inputs are tokens[begin:end], targets
    tokens[begin+1:end+1], and the last ``scored`` of them count. Every target is scored once."""
    if mode == "nonoverlapping":
        return [(b, min(b + length, n), min(b + length, n) - b) for b in range(0, n, length)]
    if mode != "sliding":
        raise ScoringError(f"mode={mode!r} is invalid: valid: {', '.join(MODES)}")
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
def score(model, tokens: torch.Tensor, length: int, mode: str = "nonoverlapping", stride: Optional[int] = None,
          *, batch_tokens: int = 8192, dtype: Optional[torch.dtype] = None, progress=None) -> float:
    """Mean nats per target over targets 1..len(tokens)-1 with windows of ``length`` tokens,
    computed in ``dtype`` autocast (None: float32); ``progress.update(windows)`` as it goes."""
    n = len(tokens) - 1
    device = next(model.parameters()).device
    groups: dict = {}
    for span in windows(n, length, mode, stride):  # windows of one input length go through the model together
        groups.setdefault(span[1] - span[0], []).append(span)
    per_batch = max(1, batch_tokens // length)
    total = torch.zeros((), dtype=torch.float64)
    for size, group in groups.items():
        for i in range(0, len(group), per_batch):
            batch = group[i:i + per_batch]
            x = torch.stack([tokens[b:e] for b, e, _ in batch]).to(device)
            y = torch.stack([tokens[b + 1:e + 1] for b, e, _ in batch]).to(device)
            keep = torch.zeros(x.shape, dtype=torch.bool, device=device)
            for row, (_, _, scored) in enumerate(batch):
                keep[row, size - scored:] = True
            with autocast(device, dtype):
                total += token_losses(model, x, y, keep)
            if progress is not None:
                progress.update(len(batch))
    return float(total) / n
