"""The training batch: corpus sequences with a fixed share of retrieval sequences.

With ``train.retrieval_share = s`` the global batch of step k holds the sequences
g = k * B .. k * B + B - 1 of the run, and sequence g is a retrieval sequence
(``minilm.data.retrieval.training_rows``) exactly when floor((g + 1) s) > floor(g s): a share
s of all sequences, spread evenly, the same rows for every position scheme and seed, and a
function of the step alone (so a resumed run draws the same ones). With s = 0 the batch is
``get_batch``'s, untouched.

With ``train.retrieval_weight`` 0 the loss weighs every sequence alike: a micro-batch of B
rows, r of them retrieval rows, has loss ((B - r) / B) * (mean token loss of the corpus rows)
+ (r / B) * (mean loss of the answers of the retrieval rows). Only the answers of a retrieval
row carry loss (the rest of it is text with pairs written over it, and the pairs' values are
random), so a row's 3 answers weigh as much as a corpus row's 128 tokens, and the text of the
retrieval rows is not learned from: the task buys its accuracy with the model's text.

With ``train.retrieval_weight`` w > 0 a retrieval row keeps its text (``training_rows`` with
``keep_text``): every target that is still the text's next token counts once, wherever it
is, and each answer counts w times: loss = (sum of text losses + w * sum of answer losses) /
(text targets + w * answers). The share may then be 1 (a needle in every row). Targets whose
next token the task wrote (a marker, a key, a pair's random value) carry no loss.

The answers' share of a row's loss weight is then w a / (t + w a), a row of T tokens with one
pair asked q times holding a = q answers and t = T - 3 (1 + q) text targets: at w = 8, q = 3 it
is 24 / 140 = 17.1% at T = 128 but 24 / 524 = 4.6% at T = 512. ``weight_for_share`` gives the w
that keeps a share at any length (issue #58: a task that keeps its share of the loss).
"""

from __future__ import annotations

from typing import Optional

import torch

from minilm.data.batches import Documents, get_batch
from minilm.data.retrieval import IGNORE, QUERIES, SLOT, Task, training_rows
from minilm.training.losses import lm_loss


def retrieval_rows(step: int, batch: int, share: float) -> torch.Tensor:
    """Boolean mask of the rows of global batch ``step`` (of ``batch`` rows) that are retrieval rows."""
    g = torch.arange(step * batch, (step + 1) * batch, dtype=torch.float64)
    return torch.floor((g + 1) * share) > torch.floor(g * share)


def draw(
    tokens,
    batch: int,
    block_size: int,
    generator: torch.Generator,
    step: int,
    share: float,
    task,
    keep_text: bool = False,
) -> tuple:
    """(x, y, mask) of one global batch, from a token array or the ``Documents`` of
    ``data.min_document_tokens``. ``mask``: the retrieval rows (B,), y ``IGNORE`` where such
    a row has no answer; with ``keep_text``, the answers' positions (B, T) instead, y the text's
    next tokens elsewhere (``IGNORE`` where the task wrote the next token)."""
    x, y = (
        tokens.batch(batch, block_size, generator)
        if isinstance(tokens, Documents)
        else get_batch(tokens, batch, block_size, generator)
    )
    if share <= 0:
        return x, y, None
    mask = retrieval_rows(step, batch, share)
    if mask.any():
        x, y = x.clone(), y.clone()  # with one row, get_batch's x and y are views of one tensor
        haystacks = torch.cat([x[mask], y[mask, -1:]], dim=1)
        x[mask], y[mask] = training_rows(haystacks, task, generator, keep_text)
    if keep_text:  # the answers are the task's values, ids the training text never uses
        mask = mask[:, None] & torch.isin(y, torch.tensor(task.values))
    return x, y, mask


def mixed_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    softcap: float,
    y: torch.Tensor,
    mask,
    answer_weight: float = 0.0,
    parts: Optional[dict] = None,
) -> torch.Tensor:
    """The language-model loss of the corpus rows and the answer loss of the retrieval rows,
    each weighted by its share of the rows; with ``answer_weight`` w > 0 (``mask`` then marks
    the answers) every text target once and every answer w times (module docstring), and the two
    means, detached, in ``parts`` (text_loss, task_loss); logits soft-capped at ``softcap``."""
    if mask is None or not mask.any():
        return lm_loss(hidden, weight, y, softcap)
    if answer_weight > 0:
        text = (y != IGNORE) & ~mask
        n_text, n_answers = text.sum(), mask.sum()
        text_loss, task_loss = (lm_loss(hidden[m], weight, y[m], softcap) for m in (text, mask))
        if parts is not None:
            parts.update(text_loss=text_loss.detach(), task_loss=task_loss.detach())
        return (n_text * text_loss + answer_weight * n_answers * task_loss) / (n_text + answer_weight * n_answers)
    rows = mask.shape[0]
    answers = y[mask] != IGNORE
    loss = mask.sum() / rows * lm_loss(hidden[mask][answers], weight, y[mask][answers], softcap)
    if not mask.all():
        loss = loss + (~mask).sum() / rows * lm_loss(hidden[~mask], weight, y[~mask], softcap)
    return loss


def weight_for_share(share: float, block_size: int, queries: int = QUERIES) -> float:
    """``train.retrieval_weight`` w at which the answers of a retrieval row of ``block_size`` tokens
    (one pair asked ``queries`` times) carry ``share`` of its loss weight: w = share / (1 - share) x
    t / q, t = block_size - SLOT (1 + queries) text targets (module docstring). 0 <= share < 1."""
    if not 0 <= share < 1:
        raise ValueError(f"an answer share of {share} is invalid: expected a fraction from 0 to below 1")
    text = block_size - SLOT * (1 + queries)
    if text <= 0:
        raise ValueError(
            f"block_size {block_size} leaves no text beside the retrieval task's {SLOT * (1 + queries)} tokens"
        )
    return float(f"{share / (1 - share) * text / queries:.6g}")  # 8.0 at 6 / 35 and 128, not 8.000000000000002


def task_for(config, prepared) -> "Task | None":
    """The run's retrieval task (None without retrieval sequences): picked from its training split."""
    if config.train.retrieval_share <= 0:
        return None
    return Task.from_tokens(
        prepared.train,
        config.model.vocab_size,
        queries=config.train.retrieval_queries,
        spread=config.train.retrieval_spread,
    )
