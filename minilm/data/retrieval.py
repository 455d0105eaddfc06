"""A retrieval task that small models learn: associative recall in a haystack of text.

A *pair* is three tokens ``MARK k v``: a marker token that never occurs in the corpus, a key
``k`` from a small key set and a value ``v`` from a small value set. A *query* repeats
``MARK k`` of an earlier pair, and the answer is that pair's value. The marker makes pairs
and queries unambiguous in ordinary text, so the task is pure lookup: find the earlier
``MARK k`` and copy the token after it (an induction head; multi-query associative recall,
Arora et al. 2023, "Zoology", on a text haystack as in needle-in-a-haystack tests). With
``len(values)`` values drawn uniformly, guessing is right with probability
``1 / len(values)`` (``chance``).

* ``training_rows``: sequences of ``T + 1`` tokens for training. Between 1 and ``pairs``
  keys (distinct; the number drawn per row, so rows with few distractors come with rows
  with many), each placed ``1 + queries`` times on a grid of 3-token slots at random (first
  as the pair, then as its queries, each written out whole), over a random stretch of the
  training split; the only targets are the answers (every other target is ``IGNORE``).
  A query is written whole, so an answer can be copied from the query before it: the lookups
  are short at every length unless ``spread`` draws the first one's distance over the row.
* ``probe``: evaluation prompts of exactly ``T`` tokens over the validation split: the
  *needle* pair at depth ``d`` (its marker at ``round(d * (T - 5))``, ``needle_at``, so depth 0
  is the start and depth 1 is right before the query), ``pairs - 1`` distractor pairs with other
  keys at random slots elsewhere, and ``MARK k`` of the needle as the last two tokens. The model's
  prediction at the last position is scored by exact match with the needle's value, which lies
  ``distance(T, d)`` positions before it. ``multikey_probe``: ``keys`` pairs with distinct keys
  and independent values, the one at the depth asked, so which pair is asked moves with the
  depth and a model must bind the key to its value (a single marker can be found by content alone).

``Task.from_tokens`` picks its tokens among the ids that the training split never uses (with
minilm's byte-fallback tokenizer: the specials and most byte pieces): the lowest is the
marker, the next ``size`` the keys, the next ``size`` the values. Keys that occur nowhere in
the text make the lookup a plain induction head (match the previous token, copy the next).

How many pairs (``pairs``, default ``PAIRS`` = 1): with one pair the probe is a single needle
with a unique marker (the passkey test of Mohtashami & Jaggi 2023, which the PI and YaRN
papers use, with one token to copy instead of five digits); with more, the other pairs are
distractors and the lookup must match the key (associative recall). The study's 3-layer model
learns the single needle within its 500 steps and not the distractor version (pilots in
docs/design.md, "Measured choices"), so the default is 1 and ``pairs`` stays a setting.
Each pair is asked ``queries`` (default ``QUERIES`` = 3) times in a training row: three
answers a row instead of one took the needle from 68% to 100% at L in the pilots. A
model with tied input and output embeddings learns neither: the ids the text never uses get
only the softmax's push-down gradient through the tied head, the same for all of them, so
their embeddings collapse onto one direction (mean cosine 0.66-0.86 between keys after
training) and the model cannot tell one value from another; the study unties them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch

from minilm.common import MinilmError

IGNORE = -100  # a target that carries no loss (cross_entropy's default ignore_index)
SLOT = 3  # tokens of a pair or a query: MARK, key, value
PAIRS = 1  # pairs per sequence: one needle, no distractors (module docstring; at most half the slots are used)
QUERIES = 3  # queries of each pair in a training row (a probe asks once)
SIZE = 32  # keys and values in each set: chance 1/32 = 3.1%


class RetrievalError(MinilmError):
    """The retrieval task cannot be built on this data; the message is one line."""


@dataclass(frozen=True)
class Task:
    """The token ids of one retrieval task: the ``marker`` that opens a record, the ``keys`` and
    ``values`` drawn from, and how many ``pairs`` a record holds and ``queries`` ask of it."""

    marker: int
    keys: tuple
    values: tuple
    pairs: int = PAIRS
    queries: int = QUERIES
    spread: bool = False  # training rows: the first lookup's distance drawn uniformly (``training_rows``)

    @property
    def chance(self) -> float:
        return 1.0 / len(self.values)

    @classmethod
    def from_tokens(
        cls,
        tokens,
        vocab_size: int,
        size: int = SIZE,
        pairs: int = PAIRS,
        queries: int = QUERIES,
        spread: bool = False,
    ) -> "Task":
        """Marker, keys and values among the ids the training split never uses (module docstring)."""
        counts = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=vocab_size)[:vocab_size]
        unused = [int(i) for i in np.flatnonzero(counts == 0)]
        if len(unused) < 1 + 2 * size:
            raise RetrievalError(
                f"the training split leaves {len(unused)} of the {vocab_size} token ids unused; the "
                f"retrieval task needs {1 + 2 * size} (a marker, {size} keys, {size} values): use a "
                f"larger data.vocab_size"
            )
        return cls(
            unused[0], tuple(unused[1 : 1 + size]), tuple(unused[1 + size : 1 + 2 * size]), pairs, queries, spread
        )

    def pairs_for(self, length: int) -> int:
        """Pairs in a sequence of ``length`` tokens: at most half its slots hold pairs or queries."""
        return max(1, min(self.pairs, length // SLOT // 4))


def _choice(n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randperm(n, generator=generator)[:k]


def training_rows(haystacks: torch.Tensor, task: Task, generator: torch.Generator, keep_text: bool = False) -> tuple:
    """(x, y) from haystacks (B, T + 1) of corpus tokens: pairs and queries written over the
    text; y holds the answers at the queries' key positions and ``IGNORE`` elsewhere, or with
    ``keep_text`` the text's own next tokens wherever the next token is still the text's.

    A query is written whole (``MARK k v``), so each answer can be copied from the nearest earlier
    query: with the pair and its queries on random slots the lookups stay short at any length
    (measured in docs/guides/study.md).
    ``task.spread`` (one pair a row) draws the first query's distance to the pair uniformly, from
    one slot to as many as leave room for the other queries after it: one lookup a row reaches
    back as far as a probe's."""
    rows = haystacks.clone()
    B, T = rows.shape[0], rows.shape[1] - 1
    group, slots = 1 + task.queries, (T + 1) // SLOT  # the slots of one pair: the pair, then its queries
    n = max(1, min(task.pairs, slots // (2 * group)))  # at most half the slots hold pairs or queries
    if slots < group:
        raise RetrievalError(
            f"block_size {T} is too short for the retrieval task: it needs at least {group * SLOT - 1} tokens"
        )
    if task.spread and n > 1:
        raise RetrievalError(f"the spread placement writes one pair a row; this task has {task.pairs}: use pairs=1")
    keys, values = torch.tensor(task.keys), torch.tensor(task.values)
    y = torch.full((B, T), IGNORE, dtype=torch.long)
    for b in range(B):
        m = int(torch.randint(1, n + 1, (1,), generator=generator))
        chosen = _spread(slots, task.queries, generator) if task.spread else _choice(slots, group * m, generator)
        chosen = chosen.view(m, group).sort(dim=1).values * SLOT
        key = keys[_choice(len(keys), m, generator)]
        value = values[torch.randint(len(values), (m,), generator=generator)]
        for places, k, v in zip(chosen.tolist(), key, value):
            for at in places:
                rows[b, at : at + SLOT] = torch.stack([torch.tensor(task.marker), k, v])
            for at in places[1:]:
                y[b, at + 1] = v
    if keep_text:
        text = (rows == haystacks)[:, 1:] & (y == IGNORE)
        y[text] = rows[:, 1:][text]
    return rows[:, :-1].contiguous(), y


def _spread(slots: int, queries: int, generator: torch.Generator) -> torch.Tensor:
    """Slots of one pair and its ``queries``: the first query d slots after the pair, d uniform on
    1 .. slots - queries, the pair uniform where that fits, the other queries on distinct slots after it."""
    d = int(torch.randint(1, slots - queries + 1, (1,), generator=generator))
    pair = int(torch.randint(0, slots - queries - d + 1, (1,), generator=generator))
    first = pair + d
    rest = first + 1 + _choice(slots - first - 1, queries - 1, generator)
    return torch.cat([torch.tensor([pair, first]), rest])


def _free_slots(length: int, taken: Sequence[int]) -> list:
    """Starts of the 3-token grid slots in [0, length) that overlap none of the slots at ``taken``."""
    return [s * SLOT for s in range(length // SLOT) if all(s * SLOT + SLOT <= t or s * SLOT >= t + SLOT for t in taken)]


def needle_at(length: int, depth: float) -> int:
    """Where ``probe`` writes the needle's marker in a prompt of ``length`` tokens at ``depth`` (0 to 1):
    ``round(depth * (length - 5))``, from the start (depth 0) to right before the query (depth 1)."""
    return round(depth * (length - SLOT - 2))


def distance(length: int, depth: float) -> int:
    """How far back the answer lies in a ``probe`` of ``length`` tokens at ``depth``: the positions from the
    query's last token (where the answer is predicted) to the needle's value (the token an induction head
    copies), ``length - 3 - needle_at(length, depth)``; from 2 (depth 1) to ``length - 3`` (depth 0)."""
    return length - 1 - (needle_at(length, depth) + SLOT - 1)


def probe(haystacks: torch.Tensor, task: Task, depth: float, generator: torch.Generator) -> tuple:
    """(prompts (B, T), answers (B,)) from haystacks (B, T) of validation tokens: the needle at
    ``depth`` (0 to 1), distractor pairs elsewhere, and the query as the last two tokens."""
    if not 0.0 <= depth <= 1.0:
        raise RetrievalError(f"depth={depth} is invalid: expected a fraction from 0 to 1")
    prompts = haystacks.clone()
    B, T = prompts.shape
    n = task.pairs_for(T)
    if T < 2 * SLOT * n + 2:
        raise RetrievalError(
            f"length {T} is too short for a retrieval probe: it needs at least {2 * SLOT * n + 2} tokens"
        )
    needle = needle_at(T, depth)
    keys, values = torch.tensor(task.keys), torch.tensor(task.values)
    # distractors go on slots of the grid that end before the query and miss the needle
    free = _free_slots(T - 2, [needle])
    answers = torch.empty(B, dtype=torch.long)
    for b in range(B):
        key = keys[_choice(len(keys), n, generator)]
        value = values[torch.randint(len(values), (n,), generator=generator)]
        places = [needle] + [free[i] for i in _choice(len(free), n - 1, generator).tolist()]
        for at, k, v in zip(places, key, value):
            prompts[b, at : at + SLOT] = torch.stack([torch.tensor(task.marker), k, v])
        prompts[b, T - 2 :] = torch.stack([torch.tensor(task.marker), key[0]])
        answers[b] = value[0]
    return prompts, answers


def multikey_probe(haystacks: torch.Tensor, task: Task, keys: int, depth: float, generator: torch.Generator) -> tuple:
    """(prompts (B, T), answers (B,)) of ``probe`` with ``keys`` pairs in every prompt: distinct keys, values
    drawn independently, the pair at ``depth`` asked and the others at random slots elsewhere (associative
    recall, Arora et al. 2023; RULER's multi-key needle, Hsieh et al. 2024). A RetrievalError when ``keys``
    pairs do not fit in T tokens (``Task.pairs_for``) or the key set is smaller."""
    fits = replace(task, pairs=len(task.keys)).pairs_for(haystacks.shape[1])  # at most half the slots hold pairs
    if not isinstance(keys, int) or isinstance(keys, bool) or not 1 <= keys <= fits:
        raise RetrievalError(
            f"keys={keys!r} is invalid for a probe of {haystacks.shape[1]} tokens: expected an integer from 1 to {fits}"
        )
    return probe(haystacks, replace(task, pairs=keys), depth, generator)


# --------------------------------------------------------------------------- the long-context suite

SUITE = ("single", "multikey", "multiquery", "multivalue", "vartrack", "copy")


def _write(prompt: torch.Tensor, at: int, *tokens) -> None:
    prompt[at : at + len(tokens)] = torch.tensor([int(t) for t in tokens])


def _copy_probe(prompts: torch.Tensor, depth: float, items: int) -> tuple:
    """``suite_probe``'s copy task on ``prompts`` (B, T) of text, in place."""
    B, T = prompts.shape
    span = items + 1
    if T < 2 * span:
        raise RetrievalError(f"length {T} is too short for copy with {items} items: it needs at least {2 * span}")
    first = round(depth * (T - 2 * span))
    prompts[:, T - span :] = prompts[:, first : first + span]
    return prompts, torch.arange(T - span, T - 1).expand(B, -1), prompts[:, T - span + 1 :].clone()


def suite_probe(
    haystacks: torch.Tensor, task: Task, name: str, depth: float, generator: torch.Generator, items: int = 4
) -> tuple:
    """(prompts (B, T), positions (B, A), targets (B, A)) of one long-context task (RULER-style,
    Hsieh et al. 2024, over this task's marker, keys and values): the model is right on a probe
    when its greedy prediction after ``prompts[b, positions[b, a]]`` is ``targets[b, a]`` for
    every a. The last position is always T - 1 (the answer after the prompt); the others are
    answers written into the prompt (teacher forcing), as a model reads them back one by one.

    * ``single``: one pair at ``depth``, the query ``MARK k`` at the end (``probe`` with one pair).
    * ``multikey``: ``items`` pairs with distinct keys, the needle at ``depth``, the rest
      distractors elsewhere; the needle's key is asked (``probe`` with ``items`` pairs).
    * ``multiquery``: ``items`` pairs (the first at ``depth``); at the end every key is asked in
      a random order, ``MARK k v MARK k' v' ... MARK k''``: all ``items`` values must be right.
    * ``multivalue``: one key written with ``items`` values (one of them at ``depth``); the end asks
      ``MARK k`` and must give the values in the order they stand, one after the other.
    * ``copy`` (an induction probe on real text, no special token: a model trained on text alone
      is probed zero-shot): the ``items + 1`` text tokens at ``depth`` (the first copy, as the
      haystack has them, starting at ``round(depth * (T - 2 (items + 1)))``) are written again
      as the last ``items + 1`` tokens; given the first token of the repeat, the model must
      give the other ``items`` one after the other (teacher forced), which text statistics
      alone rarely do and a model that looks back at the first copy does.
    * ``vartrack`` (variable tracking): ``MARK x0 v``, then ``MARK x1 x0``, ..., ``MARK xn xn-1``
      (n = ``items`` - 1) later in that order; the end asks ``MARK xn`` and the answer is v.
      ``depth`` places the first assignment, as a fraction of the way to the last slot that
      leaves room for the chain after it.
    """
    if name not in SUITE:
        raise RetrievalError(f"task {name!r} is unknown: valid: {', '.join(SUITE)}")
    if not isinstance(items, int) or isinstance(items, bool) or not 2 <= items <= min(len(task.keys), 16):
        raise RetrievalError(f"items={items!r} is invalid: expected an integer from 2 to {min(len(task.keys), 16)}")
    if name in ("single", "multikey"):
        prompts, answers = probe(haystacks, replace(task, pairs=1 if name == "single" else items), depth, generator)
        return prompts, torch.full((len(prompts), 1), prompts.shape[1] - 1), answers[:, None]
    if not 0.0 <= depth <= 1.0:
        raise RetrievalError(f"depth={depth} is invalid: expected a fraction from 0 to 1")
    prompts = haystacks.clone()
    B, T = prompts.shape
    if name == "copy":
        return _copy_probe(prompts, depth, items)
    asked = {"multiquery": SLOT * items - 1, "multivalue": items + 1, "vartrack": 2}[name]  # tokens at the end
    if T - asked < 2 * SLOT * items:
        raise RetrievalError(
            f"length {T} is too short for {name} with {items} items: it needs at least "
            f"{2 * SLOT * items + asked} tokens"
        )
    space = T - asked  # the haystack before the questions
    room = space - SLOT * (items + 1 if name == "vartrack" else 1)  # the last start that leaves room after it
    needle = round(depth * room)
    positions, targets = [], []
    for b in range(B):
        keys = [task.keys[i] for i in _choice(len(task.keys), items, generator).tolist()]
        values = [task.values[i] for i in torch.randint(len(task.values), (items,), generator=generator).tolist()]
        after = needle + SLOT if name == "vartrack" else 0  # the chain goes after its first assignment
        free = [s for s in _free_slots(space, [needle]) if s >= after]
        others = sorted(free[i] for i in _choice(len(free), items - 1, generator).tolist())
        places, where, want = [needle] + others, [], []
        if name == "multiquery":
            for at, k, v in zip(places, keys, values):
                _write(prompts[b], at, task.marker, k, v)
            for q, i in enumerate(_choice(items, items, generator).tolist()):
                start = space + SLOT * q
                _write(
                    prompts[b], start, *((task.marker, keys[i], values[i]) if q < items - 1 else (task.marker, keys[i]))
                )
                where.append(start + 1)
                want.append(values[i])
        elif name == "multivalue":  # written in the order of their positions
            for at, v in zip(sorted(places), values):
                _write(prompts[b], at, task.marker, keys[0], v)
            _write(prompts[b], space, task.marker, keys[0], *values[:-1])
            where, want = list(range(space + 1, T)), values
        else:  # vartrack: x0 = v, x1 = x0, ...; asked xn
            _write(prompts[b], places[0], task.marker, keys[0], values[0])
            for i, at in enumerate(places[1:], start=1):
                _write(prompts[b], at, task.marker, keys[i], keys[i - 1])
            _write(prompts[b], space, task.marker, keys[-1])
            where, want = [T - 1], [values[0]]
        positions.append(where)
        targets.append(want)
    return prompts, torch.tensor(positions), torch.tensor(targets)
