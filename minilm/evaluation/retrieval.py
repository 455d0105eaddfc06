"""Retrieval accuracy against context length and needle depth (``minilm.data.retrieval``).

For each length T and depth d, ``trials`` probes of exactly T tokens are cut from the
validation split (random stretches; the same stretches, keys and values for every model
given the same seed, so models are compared on identical prompts). A probe is right when the
model's most likely next token after the query is the needle's value (exact match, greedy);
``logprob`` is the mean over probes of the answers' mean log-probability (nats), a score that
ranks models where exact match is at its floor or its ceiling.
Each probe asks one question, so the trials of a cell are independent given the model and
its accuracy is a binomial proportion (intervals: ``minilm.study.stats.wilson``). A length
past a bounded scheme's table (learned positions) is not run: its rows have ``correct`` None.
The study's probes (no suite task named) also record the pairs in each prompt (``keys``: 1 for
the single needle; ``keys`` > 1 for ``multikey_probe``) and how far back the answer lies
(``distance``: ``minilm.data.retrieval.distance``), so accuracy can be read by distance in units
of the training length instead of pooled over depths (``minilm.study.context``).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from minilm.common import autocast
from minilm.data.retrieval import Task, distance, multikey_probe, probe, suite_probe


@torch.no_grad()
def accuracy(
    model,
    task: Task,
    tokens,
    lengths: Sequence[int],
    depths: Sequence[float],
    *,
    trials: int,
    seed: int,
    batch_tokens: int = 8192,
    dtype: Optional[torch.dtype] = None,
    name: Optional[str] = None,
    items: int = 4,
    keys: Optional[int] = None,
    progress=None,
) -> list:
    """Rows {length, depth, correct, trials, logprob} of exact-match retrieval over ``tokens`` (the validation
    split): the study's ``probe`` of ``task`` (with ``keys`` pairs: ``multikey_probe``; the rows add the pairs
    in each prompt, ``keys``, and the answer's ``distance``), or with ``name`` a task of the long-context suite
    (``minilm.data.retrieval.suite_probe``, right when every answer of the probe is). ``progress`` (a tqdm
    bar, or None): ``progress.update(1)`` after each (length, depth) cell."""
    device = next(model.parameters()).device
    limit = model.positions.position_limit()
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for length in lengths:
        for depth in depths:
            starts = torch.randint(len(tokens) - length, (trials,), generator=generator)
            haystacks = torch.from_numpy(
                np.stack([np.asarray(tokens[s : s + length], dtype=np.int64) for s in starts.tolist()])
            )
            # drawn even where not run, so the generator stays in step: every model of a seed gets the same probes
            where = {}
            if name is None:
                if keys is None:
                    prompts, answers = probe(haystacks, task, depth, generator)
                else:
                    prompts, answers = multikey_probe(haystacks, task, keys, depth, generator)
                positions, targets = torch.full((trials, 1), length - 1), answers[:, None]
                where = dict(keys=keys or task.pairs_for(length), distance=distance(length, depth))
            else:
                prompts, positions, targets = suite_probe(haystacks, task, name, depth, generator, items)
            if limit is not None and length > limit:
                row = dict(length=length, depth=depth, correct=None, trials=trials, logprob=None)
            else:
                per_batch = max(1, batch_tokens // length)
                correct, logprob = _score_cell(model, (prompts, positions, targets), per_batch, device, dtype)
                row = dict(length=length, depth=depth, correct=correct, trials=trials, logprob=logprob / trials)
            rows.append({**row, **where})
            if progress is not None:
                progress.update(1)
    return rows


def _score_cell(model, probes: tuple, per_batch: int, device, dtype) -> tuple:
    """(probes answered exactly, summed mean log-probability of the answers) of one cell's
    ``probes`` (prompts, answer positions, answer ids), ``per_batch`` prompts at a time."""
    prompts, positions, targets = probes
    correct, logprob = 0, 0.0
    for i in range(0, len(prompts), per_batch):
        x, at, want = (t[i : i + per_batch].to(device) for t in (prompts, positions, targets))
        with autocast(device, dtype):
            hidden = model(x, return_hidden=True)
            hidden = hidden.gather(1, at[:, :, None].expand(-1, -1, hidden.shape[-1]))
            logits = model.logits(hidden).float()
        correct += int((logits.argmax(dim=-1) == want).all(dim=1).sum())
        logprob += float(torch.log_softmax(logits, -1).gather(-1, want[..., None]).mean(dim=(1, 2)).sum())
    return correct, logprob
