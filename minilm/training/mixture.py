"""The training batch: corpus sequences with a fixed share of retrieval sequences.

With ``train.retrieval_share = s`` the global batch of step k holds the sequences
g = k * B .. k * B + B - 1 of the run, and sequence g is a retrieval sequence
(``minilm.data.retrieval.training_rows``) exactly when floor((g + 1) s) > floor(g s): a share
s of all sequences, spread evenly, the same rows for every position scheme and seed, and a
function of the step alone (so a resumed run draws the same ones). With s = 0 the batch is
``get_batch``'s, untouched.

The loss weighs every sequence alike: a micro-batch of B rows, r of them retrieval rows,
has loss ((B - r) / B) * (mean token loss of the corpus rows) + (r / B) * (mean loss of the
answers of the retrieval rows). Only the answers of a retrieval row carry loss (the rest of
it is text with pairs written over it, and the pairs' values are random), so without this
weighting a row's 3 answers would count as much as 3 of a corpus row's 128 tokens.
"""
from __future__ import annotations

import torch

from minilm.data.batches import get_batch
from minilm.data.retrieval import IGNORE, Task, training_rows
from minilm.training.losses import lm_loss


def retrieval_rows(step: int, batch: int, share: float) -> torch.Tensor:
    """Boolean mask of the rows of global batch ``step`` (of ``batch`` rows) that are retrieval rows."""
    g = torch.arange(step * batch, (step + 1) * batch, dtype=torch.float64)
    return torch.floor((g + 1) * share) > torch.floor(g * share)


def draw(tokens, batch: int, block_size: int, generator: torch.Generator, step: int, share: float,
         task) -> tuple:
    """(x, y, retrieval mask) of one global batch; y is ``IGNORE`` where a retrieval row has no answer."""
    x, y = get_batch(tokens, batch, block_size, generator)
    if share <= 0:
        return x, y, None
    mask = retrieval_rows(step, batch, share)
    if mask.any():
        x, y = x.clone(), y.clone()  # with one row, get_batch's x and y are views of one tensor
        haystacks = torch.cat([x[mask], y[mask, -1:]], dim=1)
        x[mask], y[mask] = training_rows(haystacks, task, generator)
    return x, y, mask


def mixed_loss(hidden: torch.Tensor, weight: torch.Tensor, softcap: float, y: torch.Tensor, mask) -> torch.Tensor:
    """The language-model loss of the corpus rows and the answer loss of the retrieval rows,
    each weighted by its share of the rows (module docstring); logits soft-capped at ``softcap``."""
    if mask is None or not mask.any():
        return lm_loss(hidden, weight, y, softcap)
    rows = mask.shape[0]
    answers = y[mask] != IGNORE
    loss = mask.sum() / rows * lm_loss(hidden[mask][answers], weight, y[mask][answers], softcap)
    if not mask.all():
        loss = loss + (~mask).sum() / rows * lm_loss(hidden[~mask], weight, y[~mask], softcap)
    return loss


def task_for(config, prepared) -> "Task | None":
    """The run's retrieval task (None without retrieval sequences): picked from its training split."""
    if config.train.retrieval_share <= 0:
        return None
    return Task.from_tokens(prepared.train, config.model.vocab_size)
