"""The retrieval task (minilm.data.retrieval), its training mixture (minilm.training.mixture), its
evaluation (minilm.evaluation.retrieval) and the binomial intervals the study reads it with."""

import math

import numpy as np
import pytest
import torch

from minilm.config import ModelConfig
from minilm.data.batches import get_batch
from minilm.data.retrieval import (
    IGNORE,
    SLOT,
    SUITE,
    RetrievalError,
    Task,
    distance,
    multikey_probe,
    needle_at,
    probe,
    suite_probe,
    training_rows,
)
from minilm.evaluation.retrieval import accuracy
from minilm.model.gpt import GPT
from minilm.study.stats import normal_quantile, wilson
from minilm.training.losses import lm_loss
from minilm.training.mixture import draw, mixed_loss, retrieval_rows

VOCAB = 300


def corpus(n=5000, seed=0):
    """Token ids 100..299 only: ids 0..99 are free for the task."""
    return np.random.default_rng(seed).integers(100, VOCAB, n).astype(np.uint16)


def test_the_task_takes_unused_ids_and_states_its_chance():
    task = Task.from_tokens(corpus(), VOCAB)
    used = set(corpus().tolist())
    assert task.marker == 0 and not used & {task.marker, *task.keys, *task.values}
    assert len(set(task.keys) | set(task.values) | {task.marker}) == 1 + 2 * len(task.keys)
    assert task.chance == pytest.approx(1 / 32)
    with pytest.raises(RetrievalError, match="needs 65"):
        Task.from_tokens(np.arange(VOCAB) % (VOCAB - 10), VOCAB)


@pytest.mark.parametrize("pairs", [1, 8])  # the study's single needle, and pairs with distractors
def test_training_answers_are_where_the_targets_say(pairs):
    task = Task.from_tokens(corpus(), VOCAB, pairs=pairs)
    g = torch.Generator().manual_seed(1)
    haystacks = torch.from_numpy(corpus(16 * 129, seed=1).astype(np.int64)).view(16, 129)
    x, y = training_rows(haystacks, task, g)
    assert x.shape == y.shape == (16, 128)
    answered = 0
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        for i, target in enumerate(row_y):
            if target == IGNORE:
                continue
            answered += 1
            key = row_x[i]
            assert row_x[i - 1] == task.marker and key in task.keys and target in task.values
            # the pair MARK k v comes earlier with the same key and this value
            earlier = [j for j in range(i - 1) if row_x[j] == task.marker and j + 2 < i - 1 and row_x[j + 1] == key]
            assert earlier and row_x[earlier[0] + 2] == target
        asked = sum(t != IGNORE for t in row_y)
        assert (
            asked % task.queries == 0 and 1 <= asked // task.queries <= task.pairs
        )  # every pair asked `queries` times
    assert answered == 16 * task.queries if pairs == 1 else answered > 16 * task.queries
    with pytest.raises(RetrievalError, match="too short"):
        training_rows(haystacks[:, :4], task, g)


@pytest.mark.parametrize("pairs", [1, 8])
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_a_probe_puts_its_needle_at_the_depth_and_asks_at_the_end(depth, pairs):
    task = Task.from_tokens(corpus(), VOCAB, pairs=pairs)
    T = 200
    haystacks = torch.from_numpy(corpus(8 * T, seed=2).astype(np.int64)).view(8, T)
    prompts, answers = probe(haystacks, task, depth, torch.Generator().manual_seed(3))
    at = round(depth * (T - SLOT - 2))
    for prompt, answer in zip(prompts.tolist(), answers.tolist()):
        assert prompt[-2] == task.marker and prompt[-1] in task.keys
        assert prompt[at : at + SLOT] == [task.marker, prompt[-1], answer]
        pairs = [j for j in range(T - 2) if prompt[j] == task.marker]
        assert len(pairs) == task.pairs_for(T) and len({prompt[j + 1] for j in pairs}) == len(pairs)
    with pytest.raises(RetrievalError, match="depth=1.5"):
        probe(haystacks, task, 1.5, torch.Generator())


def test_a_model_that_looks_up_the_key_scores_everything_and_chance_is_chance():
    """accuracy() against two fake models: one that finds the needle, one that guesses."""
    task = Task.from_tokens(corpus(), VOCAB)
    tokens = corpus(20000, seed=4)

    class Oracle(torch.nn.Module):
        def __init__(self, guess):
            super().__init__()
            self.guess, self.w = guess, torch.nn.Parameter(torch.zeros(1))
            self.positions = type("P", (), {"position_limit": staticmethod(lambda: None)})()
            self.logits = lambda h: h

        def forward(self, x, return_hidden=True):
            out = torch.zeros(x.shape[0], x.shape[1], VOCAB)
            for b, row in enumerate(x.tolist()):
                if self.guess:
                    out[b, -1, task.values[b % len(task.values)]] = 1
                    continue
                key = row[-1]
                j = max(j for j in range(len(row) - 2) if row[j] == task.marker and row[j + 1] == key)
                out[b, -1, row[j + 2]] = 1
            return out

    rows = accuracy(Oracle(False), task, tokens, [64, 128], [0.0, 1.0], trials=20, seed=1)
    assert [(r["length"], r["depth"], r["correct"], r["trials"]) for r in rows] == [
        (64, 0.0, 20, 20),
        (64, 1.0, 20, 20),
        (128, 0.0, 20, 20),
        (128, 1.0, 20, 20),
    ]
    # the answer's logit 1, every other 0: log-probability log(e / (e + VOCAB - 1)) on every probe
    assert all(r["logprob"] == pytest.approx(1 - math.log(math.e + VOCAB - 1), rel=1e-5) for r in rows)
    guessed = accuracy(Oracle(True), task, tokens, [128], [0.5], trials=640, seed=2)[0]
    assert abs(guessed["correct"] / 640 - task.chance) < 0.03


def test_a_bounded_model_is_not_probed_past_its_table():
    torch.manual_seed(0)
    model = GPT(
        ModelConfig(vocab_size=VOCAB, n_layer=1, n_head=2, d_model=16, block_size=64, position={"kind": "learned"})
    )
    task = Task.from_tokens(corpus(), VOCAB)
    rows = accuracy(model, task, corpus(20000, seed=5), [64, 128], [0.5], trials=3, seed=1)
    assert rows[0]["correct"] is not None and rows[1]["correct"] is None


def test_the_mixture_is_a_fixed_share_and_weighs_every_row_alike():
    share = 0.25
    masks = torch.stack([retrieval_rows(step, 16, share) for step in range(10)])
    assert masks.sum().item() == 40 and masks.sum(dim=1).tolist() == [4] * 10
    assert (
        retrieval_rows(0, 1, share).tolist() == [False]
        and sum(retrieval_rows(s, 1, share).item() for s in range(8)) == 2
    )  # batch 1: every 4th step
    tokens = corpus(20000, seed=6)
    task = Task.from_tokens(tokens, VOCAB)
    x0, y0 = get_batch(tokens, 16, 64, torch.Generator().manual_seed(7))
    x, y, mask = draw(tokens, 16, 64, torch.Generator().manual_seed(7), 0, 0.0, task)
    assert mask is None and torch.equal(x, x0) and torch.equal(y, y0)  # share 0: get_batch's batch
    x, y, mask = draw(tokens, 16, 64, torch.Generator().manual_seed(7), 0, share, task)
    assert torch.equal(x[~mask], x0[~mask]) and (y[mask] != IGNORE).sum() > 0
    hidden, weight = torch.randn(16, 64, 8), torch.randn(VOCAB, 8)
    manual = 0.75 * lm_loss(hidden[~mask], weight, y[~mask]) + 0.25 * torch.nn.functional.cross_entropy(
        (hidden[mask] @ weight.t()).reshape(-1, VOCAB), y[mask].reshape(-1), ignore_index=IGNORE
    )
    assert mixed_loss(hidden, weight, 0.0, y, mask).item() == pytest.approx(manual.item(), rel=1e-5)


def test_a_needle_in_every_row_keeps_the_text_and_weighs_each_answer_w_tokens():
    """train.retrieval_weight w > 0: the rows keep their text's targets (all but those whose next
    token the task wrote), the answers are flagged, and the loss counts each text target once and
    each answer w times."""
    tokens = corpus(20000, seed=6)
    task = Task.from_tokens(tokens, VOCAB)
    x0, y0 = get_batch(tokens, 8, 64, torch.Generator().manual_seed(7))
    x, y, answers = draw(tokens, 8, 64, torch.Generator().manual_seed(7), 0, 1.0, task, keep_text=True)
    assert answers.shape == y.shape and answers.sum(dim=1).tolist() == [task.queries] * 8  # one needle, asked 3x
    assert (
        all(int(v) in task.values for v in y[answers]) and not torch.isin(y[~answers], torch.tensor(task.values)).any()
    )
    kept = (y != IGNORE) & ~answers
    assert torch.equal(y[kept], y0[kept]) and kept.float().mean() > 0.8  # the text's own next tokens, most of them
    written = torch.cat([x, y0[:, -1:]], 1) != torch.cat([x0, y0[:, -1:]], 1)  # where the task wrote the input
    assert not (kept & written[:, 1:]).any()  # no target is a token the task wrote, unless it is an answer
    hidden, weight, w = torch.randn(8, 64, 8), torch.randn(VOCAB, 8), 8.0
    per_token = torch.nn.functional.cross_entropy(
        (hidden @ weight.t()).reshape(-1, VOCAB), y.reshape(-1), ignore_index=IGNORE, reduction="none"
    ).view(8, 64)
    manual = (per_token[kept].sum() + w * per_token[answers].sum()) / (kept.sum() + w * answers.sum())
    assert mixed_loss(hidden, weight, 0.0, y, answers, w).item() == pytest.approx(manual.item(), rel=1e-5)


def test_the_spread_placement_draws_the_first_lookup_uniformly_over_the_row():
    """train.retrieval_spread: the pair, its first query d slots later (d uniform on 1 .. slots - q), the other
    queries after that one. Written on random slots instead, each answer can be copied from the query just
    before it, and the first lookup is as short as the gaps between 1 + q random slots."""
    T, queries = 512, 12
    slots = (T + 1) // SLOT
    haystacks = torch.from_numpy(corpus(400 * (T + 1), seed=8).astype(np.int64)).view(400, T + 1)
    first = {}
    for spread in (False, True):
        task = Task.from_tokens(corpus(), VOCAB, queries=queries, spread=spread)
        x, y = training_rows(haystacks, task, torch.Generator().manual_seed(9), keep_text=True)
        first[spread] = []
        for row_x, row_y in zip(x.tolist(), y.tolist()):
            asked = [i for i, t in enumerate(row_y) if t in task.values]
            pair = row_x.index(task.marker)  # the first marker is the pair's, and its value is every answer
            assert len(asked) == queries and {row_y[i] for i in asked} == {row_x[pair + 2]} and pair < asked[0]
            first[spread].append((asked[0] - 1 - pair) // SLOT)  # the first query's distance, in slots
    d = np.array(first[True])
    assert d.min() >= 1 and d.max() <= slots - queries and d.max() > 0.9 * (slots - queries)
    assert abs(d.mean() - (slots - queries + 1) / 2) < 6  # uniform on 1 .. 158: mean 79.5, sd 45.6 / sqrt(400) = 2.3
    assert np.median(first[False]) * SLOT < T / 8  # random slots: the first lookup is short
    with pytest.raises(RetrievalError, match="one pair a row"):
        training_rows(haystacks[:4], Task.from_tokens(corpus(), VOCAB, pairs=8, spread=True), torch.Generator())


def test_wilson_intervals_match_published_values():
    assert normal_quantile(0.975) == pytest.approx(1.959964, abs=1e-6)
    # Newcombe (1998), table I: 0/10 -> 0 to 0.2775; 1/29 -> 0.0061 to 0.1718; 81/263 -> 0.2553 to 0.3662
    for k, n, low, high in [
        (0, 10, 0.0, 0.2775),
        (1, 29, 0.0061, 0.1718),
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (10, 10, 0.7225, 1.0),
    ]:
        p = wilson(k, n)
        assert (p.low, p.high) == pytest.approx((low, high), abs=1e-4)
    assert wilson(47, 50).format() == "94% [84, 98]"
    with pytest.raises(ValueError):
        wilson(3, 2)


def test_a_share_outside_zero_to_one_is_a_one_line_error():
    from minilm.config import ConfigError, build_config

    for share in (1.0, -0.1):
        with pytest.raises(ConfigError, match=f"train.retrieval_share={share} is invalid"):
            build_config({"train": {"retrieval_share": share}})
    assert build_config({"train": {"retrieval_share": 1.0, "retrieval_weight": 2.0}}).train.retrieval_share == 1.0
    with pytest.raises(ConfigError, match="train.retrieval_weight=-1.0 is invalid"):
        build_config({"train": {"retrieval_weight": -1}})
    with pytest.raises(ConfigError, match="train.retrieval_weight=8.0 is invalid: .* 0 without train.retrieval_share"):
        build_config({"train": {"retrieval_weight": 8}})  # a weight with no retrieval rows would do nothing


# --------------------------------------------------------------------------- the long-context suite


def _pairs_before(prompt, end, marker):
    """(position, key, next token) of every MARK k x written before ``end``."""
    return [(j, prompt[j + 1], prompt[j + 2]) for j in range(end - 2) if prompt[j] == marker]


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_the_copy_probe_repeats_the_text_found_at_its_depth(depth):
    """copy: the text before the repeat is the haystack's own; the last items + 1 tokens are the
    items + 1 tokens at the stated depth; each asked position is answered by the token that
    followed it in the first copy."""
    task = Task.from_tokens(corpus(), VOCAB)
    T, items, span = 240, 4, 5
    haystacks = torch.from_numpy(corpus(6 * T, seed=8).astype(np.int64)).view(6, T)
    prompts, positions, targets = suite_probe(haystacks, task, "copy", depth, torch.Generator().manual_seed(9), items)
    first = round(depth * (T - 2 * span))
    assert torch.equal(prompts[:, : T - span], haystacks[:, : T - span])
    assert torch.equal(prompts[:, T - span :], haystacks[:, first : first + span])
    assert positions.shape == targets.shape == (6, items) and (positions[:, -1] == T - 2).all()
    for prompt, where, want in zip(prompts.tolist(), positions.tolist(), targets.tolist()):
        assert [prompt[p + 1] for p in where] == want == [prompt[p - (T - span) + first + 1] for p in where]
    with pytest.raises(RetrievalError, match="too short for copy"):
        suite_probe(haystacks[:, :9], task, "copy", depth, torch.Generator(), items)


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("name", [name for name in SUITE if name != "copy"])
def test_every_suite_answer_follows_from_what_the_prompt_says(name, depth):
    """Each task's answers are recomputed from the prompt alone by the rule the task states."""
    task = Task.from_tokens(corpus(), VOCAB)
    T, items = 240, 4
    haystacks = torch.from_numpy(corpus(6 * T, seed=8).astype(np.int64)).view(6, T)
    prompts, positions, targets = suite_probe(haystacks, task, name, depth, torch.Generator().manual_seed(9), items)
    assert prompts.shape == (6, T) and positions.shape == targets.shape and (positions[:, -1] == T - 1).all()
    for prompt, where, want in zip(prompts.tolist(), positions.tolist(), targets.tolist()):
        first_ask = min(where) - 1  # the questions start with the marker before the first asked position
        written = _pairs_before(prompt, first_ask, task.marker)
        if name in ("single", "multikey", "multiquery"):
            assert len(written) == {"single": 1, "multikey": items, "multiquery": items}[name]
            lookup = {k: v for _, k, v in written}
            assert len(lookup) == len(written)  # distinct keys
            assert [lookup[prompt[p]] for p in where] == want and all(prompt[p - 1] == task.marker for p in where)
            if name == "multiquery":
                assert sorted(prompt[p] for p in where) == sorted(lookup)  # every key asked once
        elif name == "multivalue":
            assert len({k for _, k, _ in written}) == 1 and [v for _, _, v in sorted(written)] == want
            assert prompt[where[0]] == written[0][1] and prompt[where[0] + 1 : T] == want[:-1]
        else:  # vartrack: follow x_n -> x_n-1 -> ... -> the value
            assign = {k: x for _, k, x in written}
            x = prompt[T - 1]
            for _ in range(items):
                x = assign[x]
            assert x == want[0] and x in task.values and len(written) == items
            assert [p for p, _, _ in sorted(written)] == [p for p, _, _ in written]  # the chain in order
        if name != "multivalue":  # the first needle stands at the depth the task states
            at = [p for p, _, _ in written]
            room = (
                first_ask - SLOT * (items + 1 if name == "vartrack" else 1)
                if name not in ("single", "multikey")
                else T - SLOT - 2
            )
            assert round(depth * room) in at


def test_the_suite_refuses_what_it_cannot_build():
    task = Task.from_tokens(corpus(), VOCAB)
    hay = torch.from_numpy(corpus(2 * 30, seed=1).astype(np.int64)).view(2, 30)
    with pytest.raises(RetrievalError, match="task 'needle' is unknown"):
        suite_probe(hay, task, "needle", 0.5, torch.Generator())
    with pytest.raises(RetrievalError, match="items=1 is invalid"):
        suite_probe(hay, task, "multiquery", 0.5, torch.Generator(), items=1)
    with pytest.raises(RetrievalError, match="too short for multiquery"):
        suite_probe(hay, task, "multiquery", 0.5, torch.Generator(), items=4)


def test_suite_accuracy_scores_a_probe_right_only_when_every_answer_is():
    """accuracy(name=...) against a model that knows each probe's answers (replayed from the same
    seed): all right; the same model wrong on the first answer only: every multi-answer probe wrong."""
    task = Task.from_tokens(corpus(), VOCAB)
    tokens = corpus(20000, seed=4)

    def answers_of(name, lengths, depths, trials, seed, items):
        generator, known = torch.Generator().manual_seed(seed), {}
        for length in lengths:
            for depth in depths:
                starts = torch.randint(len(tokens) - length, (trials,), generator=generator)
                hay = torch.from_numpy(np.stack([tokens[s : s + length].astype(np.int64) for s in starts.tolist()]))
                for prompt, where, want in zip(*suite_probe(hay, task, name, depth, generator, items)):
                    known[tuple(prompt.tolist())] = (where.tolist(), want.tolist())
        return known

    class Knower(torch.nn.Module):
        def __init__(self, known, miss_first):
            super().__init__()
            self.known, self.miss_first, self.w = known, miss_first, torch.nn.Parameter(torch.zeros(1))
            self.positions = type("P", (), {"position_limit": staticmethod(lambda: None)})()
            self.logits = lambda h: h

        def forward(self, x, return_hidden=True):
            out = torch.zeros(x.shape[0], x.shape[1], VOCAB)
            for b, row in enumerate(x.tolist()):
                where, want = self.known[tuple(row)]
                for i, (t, v) in enumerate(zip(where, want)):
                    out[b, t, (v + 1) % VOCAB if (self.miss_first and i == 0) else v] = 1
            return out

    for name in SUITE:
        known = answers_of(name, [120], [0.0, 1.0], 3, 1, 3)
        rows = accuracy(Knower(known, False), task, tokens, [120], [0.0, 1.0], trials=3, seed=1, name=name, items=3)
        assert [r["correct"] for r in rows] == [3, 3], name
        rows = accuracy(Knower(known, True), task, tokens, [120], [0.0, 1.0], trials=3, seed=1, name=name, items=3)
        assert [r["correct"] for r in rows] == [0, 0], name


# --------------------------------------------------------------------------- multi-key probes and distance


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_a_multikey_probe_asks_the_pair_at_its_depth_among_distinct_keys(depth):
    task, T = Task.from_tokens(corpus(), VOCAB), 128
    haystacks = torch.from_numpy(corpus(64 * T, seed=8).astype(np.int64)).view(64, T)
    prompts, answers = multikey_probe(haystacks, task, 4, depth, torch.Generator().manual_seed(9))
    assert prompts.shape == (64, T) and answers.shape == (64,)
    at, repeated = needle_at(T, depth), 0
    for prompt, answer in zip(prompts.tolist(), answers.tolist()):
        marks = [j for j in range(T - 2) if prompt[j] == task.marker]
        pairs = {prompt[j + 1]: prompt[j + 2] for j in marks}
        assert len(marks) == 4 and len(pairs) == 4 and set(pairs) <= set(task.keys)  # 4 pairs, distinct keys
        assert prompt[-2:] == [task.marker, prompt[at + 1]] and pairs[prompt[-1]] == answer  # the one at depth
        assert prompt[at : at + SLOT] == [task.marker, prompt[-1], answer]
        repeated += len(set(pairs.values())) < 4  # values drawn independently: some prompts repeat one
    assert repeated > 0
    again, same = multikey_probe(haystacks, task, 4, depth, torch.Generator().manual_seed(9))
    assert torch.equal(again, prompts) and torch.equal(same, answers)  # the seed decides the probes
    with pytest.raises(RetrievalError, match="keys=11 is invalid for a probe of 128 tokens: expected an integer"):
        multikey_probe(haystacks, task, 11, depth, torch.Generator())  # at most 128 // 12 = 10 pairs fit


@pytest.mark.parametrize("keys", [None, 4])
def test_every_probe_row_records_how_far_back_its_answer_lies(keys):
    """The fake model finds the asked key's value in each prompt and notes how far back from the last
    position it lies; every row's ``distance`` is that, and ``keys`` the pairs it saw."""
    task, seen = Task.from_tokens(corpus(), VOCAB), {}

    class Finder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.positions = type("P", (), {"position_limit": staticmethod(lambda: None)})()
            self.logits = lambda h: h

        def forward(self, x, return_hidden=True):
            out = torch.zeros(x.shape[0], x.shape[1], VOCAB)
            for b, row in enumerate(x.tolist()):
                marks = [j for j in range(len(row) - 2) if row[j] == task.marker]
                j = next(j for j in marks if row[j + 1] == row[-1]) + 2  # the asked pair's value
                seen.setdefault(len(row), set()).add((len(row) - 1 - j, len(marks)))
                out[b, -1, row[j]] = 1
            return out

    for depth in (0.0, 0.25, 1.0):
        seen.clear()
        rows = accuracy(Finder(), task, corpus(20000, seed=10), [64, 128], [depth], trials=5, seed=3, keys=keys)
        for r in rows:
            assert seen[r["length"]] == {(r["distance"], r["keys"])} and r["correct"] == 5
            assert r["distance"] == distance(r["length"], depth) and r["keys"] == (keys or 1)
    assert distance(128, 1.0) == 2 and distance(128, 0.0) == 125  # the value right before the query; the start
