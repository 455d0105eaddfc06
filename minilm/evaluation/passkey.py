"""Passkey retrieval (Mohtashami & Jaggi 2023; used by Position Interpolation, Chen et al.
2023, and YaRN, Peng et al. 2023): a random 5-digit key hidden at a chosen depth in
filler text of a chosen length; the model must continue "The pass key is" with the key.

A prompt of ``length`` tokens is (the task's usual introduction sentence is left out: it
would fill most of a tiny model's context)::

    filler ... (depth x all filler tokens) ...  The pass key is 12345. Remember it.
    12345 is the pass key.  ... rest of the filler ...  What is the pass key? The pass key is

The filler is the classic "The grass is green. The sky is blue. ..." repeated and cut at
token level so the prompt is exactly ``length`` tokens. A trial is correct when the greedy
continuation starts with the key (leading spaces allowed). Accuracy is reported per length
and depth. A bounded scheme (learned) whose table cannot hold the prompt and the answer
is reported as n/a.

A tiny model trained on ordinary text cannot do this. To teach it at length L, fine-tune
it on a mixture of passkey documents and its own training text, then test at 2L, 4L, ...:
``make-corpus`` writes passkey documents (prompt + answer, L/4..L tokens counted with the
checkpoint's tokenizer, random depths) and, with ``--mix F``, excerpts of the checkpoint's
training split making up the fraction F of the characters, as .txt files of a corpus
directory. ``train.init_from`` encodes that directory with the source's tokenizer::

    python -m minilm passkey make-corpus data/passkey-128 --checkpoint out/rope --length 128 --mix 0.5
    python train.py --config rope.yaml train.init_from=out/rope data.corpus=data/passkey-128 \
        model.block_size=128 train.max_steps=300 out_dir=out/rope-passkey
    python -m minilm passkey eval out/rope-passkey --lengths 128,256,512 --depths 0,0.5,1 --trials 10
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from minilm.common import MinilmError, available_memory, markdown_table, staged_directory
from minilm.generation.decode import Sampling, check_cache_memory, generate_ids

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEY_LINE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"
ANSWER = " {key}."
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
MAX_NEW_TOKENS = 8  # " 12345." is at most 7 pieces


class PasskeyError(MinilmError):
    """A passkey prompt cannot be built or scored; the message is one line."""


@dataclass
class Prompt:
    """One passkey prompt: its token ids, the key to retrieve, where the key line begins and how
    many filler tokens surround it."""

    ids: list  # exactly ``length`` token ids, ending with the question
    key: str  # the 5 digits to retrieve
    key_start: int  # token index where the key line begins
    filler_tokens: int  # filler tokens in the prompt (before + after the key line)


def random_key(rng: random.Random) -> str:
    return str(rng.randint(10000, 99999))


def _pieces(tokenizer, key: str):
    key_line = tokenizer.encode(" " + KEY_LINE.format(key=key))
    question = tokenizer.encode(" " + QUESTION)
    sentences = [tokenizer.encode(" " + s.strip() + ".") for s in FILLER.split(".") if s.strip()]
    return key_line, question, sentences


def min_length(tokenizer) -> int:
    """The shortest prompt (no filler) in tokens."""
    key_line, question, _ = _pieces(tokenizer, "12345")
    return len(key_line) + len(question)


def make_prompt(tokenizer, length: int, depth: float, key: str) -> Prompt:
    """A prompt of exactly ``length`` tokens with the key line after ``depth`` of the filler.

    The filler around the key line is whole sentences, so the key's depth is exact to within
    one filler sentence; the prompt starts inside a sentence (cut on the left) to make the
    length exact."""
    if not 0.0 <= depth <= 1.0:
        raise PasskeyError(f"depth={depth!r} is invalid: expected a fraction 0 <= depth <= 1")
    key_line, question, sentences = _pieces(tokenizer, key)
    fill = length - len(key_line) - len(question)
    if fill < 0:
        raise PasskeyError(
            f"length={length} is too short for a passkey prompt: it needs at least "
            f"{length - fill} tokens with this tokenizer"
        )
    after, i = [], 0  # whole sentences after the key, as close as possible to (1 - depth) of the filler
    target = fill - int(round(depth * fill))
    while True:
        sentence = sentences[i % len(sentences)]
        if abs(len(after) + len(sentence) - target) >= abs(len(after) - target) or len(after) + len(sentence) > fill:
            break
        after += sentence
        i += 1
    need, before, j = fill - len(after), [], -1  # the sentences before them in the endless filler
    while len(before) < need:
        before = sentences[j % len(sentences)] + before
        j -= 1
    before = before[len(before) - need :]  # cut on the left to the exact length
    ids = before + key_line + after + question
    return Prompt(ids=ids, key=key, key_start=len(before), filler_tokens=fill)


def answer_ids(tokenizer, key: str) -> list:
    return tokenizer.encode(ANSWER.format(key=key))


def is_correct(text: str, key: str) -> bool:
    """The continuation starts (after optional whitespace) with exactly the key's digits."""
    match = re.match(r"\s*(\d+)", text)
    return bool(match) and match.group(1) == key


def greedy(model, ids: Sequence[int], max_new_tokens: int = MAX_NEW_TOKENS, vocab: Optional[int] = None) -> list:
    """Greedy continuation of ``ids`` (minilm.generation: prefill once, then decode from the KV
    cache), with a context that holds the whole prompt, so attention is never windowed; ids from
    ``vocab`` on (the embedding's padding past the tokenizer's tokens) are never chosen."""
    steps = generate_ids(
        model,
        ids,
        max_new_tokens=max_new_tokens,
        sampling=Sampling(temperature=0.0, top_k=None),
        max_context=len(ids) + max_new_tokens,
        seed=0,
        vocab=vocab,
    )
    return [int(token[0]) for token in steps]


def accuracy(
    model,
    tokenizer,
    lengths: Sequence[int],
    depths: Sequence[float] = DEFAULT_DEPTHS,
    trials: int = 5,
    seed: int = 0,
    generate: Optional[Callable] = None,
    progress=None,
) -> list:
    """Passkey accuracy per (length, depth): a list of dicts with length, depth, correct, trials,
    accuracy (None when the model's position table cannot hold prompt + answer).

    ``generate(ids, max_new_tokens) -> new ids`` defaults to greedy decoding with ``model``;
    the keys come from ``random.Random(seed)``, so every model sees the same prompts."""
    if trials < 1:
        raise PasskeyError(f"trials={trials} is invalid: expected at least 1")
    generate = generate or (lambda ids, n: greedy(model, ids, n, tokenizer.vocab_size))
    limit = model.positions.position_limit() if model is not None else None
    if model is not None:  # the longest prompt's cache must fit before any prompt is built
        check_cache_memory(
            model,
            1,
            max(lengths) + MAX_NEW_TOKENS,
            advice=f"lower --lengths (longest: {max(lengths):,})",
            prefill=max(lengths),
        )
    rows = []
    for length in lengths:
        for depth in depths:
            rng = random.Random(f"{seed}-{length}-{depth}")
            if limit is not None and length + MAX_NEW_TOKENS > limit:
                rows.append(dict(length=length, depth=depth, correct=0, trials=trials, accuracy=None))
                if progress is not None:
                    progress.update(trials)
                continue
            correct = 0
            for _ in range(trials):
                prompt = make_prompt(tokenizer, length, depth, random_key(rng))
                text = tokenizer.decode(generate(prompt.ids, MAX_NEW_TOKENS))
                correct += is_correct(text, prompt.key)
                if progress is not None:
                    progress.update(1)
            rows.append(dict(length=length, depth=depth, correct=correct, trials=trials, accuracy=correct / trials))
    return rows


def markdown(rows: Sequence[dict]) -> str:
    """Accuracy table: one row per length, one column per depth, plus the mean."""
    depths = sorted({r["depth"] for r in rows})
    body = []
    for length in sorted({r["length"] for r in rows}):
        cells = {r["depth"]: r for r in rows if r["length"] == length}
        values = [cells[d]["accuracy"] for d in depths]
        if any(v is None for v in values):
            body.append([length] + ["n/a (bounded)" for _ in depths] + ["n/a"])
        else:
            body.append([length] + [f"{v:.0%}" for v in values] + [f"{sum(values) / len(values):.0%}"])
    return markdown_table(["length"] + [f"depth {d:g}" for d in depths] + ["mean"], body)


# --------------------------------------------------------------------------- training data


def document(tokenizer, length: int, rng: random.Random) -> list:
    """One training document: a prompt of ``length`` tokens at a random depth, then the answer."""
    key = random_key(rng)
    prompt = make_prompt(tokenizer, length, rng.random(), key)
    return prompt.ids + answer_ids(tokenizer, key)


def write_corpus(
    out_dir: str,
    tokenizer,
    n: int,
    length: int,
    seed: int = 0,
    per_file: int = 50,
    mix_text: str = "",
    mix: float = 0.0,
    *,
    overwrite: bool = False,
    progress=None,
) -> list:
    """Write ``n`` passkey documents of ``length // 4 .. length`` tokens (random depths) as .txt
    files of ``per_file`` documents under ``out_dir``: a corpus for ``data.corpus``. With
    ``mix`` > 0, random excerpts of ``mix_text`` (as long as the longest document) are written
    as ``text-*.txt`` files too, until they are the fraction ``mix`` of all characters. The
    directory is written whole or not at all (``common.staged_directory``): a non-empty
    ``out_dir`` is refused unless ``overwrite``, which replaces it once the new one is complete.
    ``progress.update(1)`` after each document."""
    if n < 1:
        raise PasskeyError(f"n={n} is invalid: expected at least 1 document")
    if not 0.0 <= mix < 1.0:
        raise PasskeyError(f"mix={mix!r} is invalid: expected 0 <= mix < 1 (the fraction of ordinary text)")
    check_corpus_size(n, length, mix)
    shortest = min_length(tokenizer)
    if length < shortest + MAX_NEW_TOKENS:
        raise PasskeyError(
            f"length={length} is too short: passkey documents need at least "
            f"{shortest + MAX_NEW_TOKENS} tokens with this tokenizer"
        )
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not overwrite:  # refused before the work
        raise PasskeyError(
            f"{out_dir!r} exists and is not empty: choose a new directory for the corpus, or give "
            f"--overwrite to replace it"
        )
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        doc_length = rng.randint(max(shortest, length // 4), length - MAX_NEW_TOKENS)
        docs.append(tokenizer.decode(document(tokenizer, doc_length, rng)))
        if progress is not None:
            progress.update(1)
    excerpts = []
    if mix > 0:  # excerpts of ordinary text as long as the longest document, until they are `mix` of all
        size = max(len(d) for d in docs)
        if len(mix_text) <= size:
            raise PasskeyError(
                f"the text to mix in has {len(mix_text)} characters: too short for {size}-character excerpts"
            )
        for _ in range(-(-int(sum(len(d) for d in docs) * mix / (1.0 - mix)) // size)):
            start = rng.randrange(len(mix_text) - size)
            excerpts.append(mix_text[start : start + size])
    with staged_directory(out_dir, overwrite=overwrite) as staging:
        names = _write_documents(staging, "passkey", docs, per_file) + _write_documents(
            staging, "text", excerpts, per_file
        )
    return [os.path.join(out_dir, name) for name in names]


CHARS_PER_TOKEN = 8  # more than a BPE token of English ever holds: the bound on a corpus's size
MAX_CORPUS_SHARE = 0.5  # of the free memory (the documents are held in memory) and disk


def check_corpus_size(n: int, length: int, mix: float) -> None:
    """Refuse, before any work, a corpus whose documents would not fit in half the free memory
    or disk (at most ``CHARS_PER_TOKEN`` characters per token, as text and again as files)."""
    need = int(n * length * CHARS_PER_TOKEN / (1.0 - mix))
    memory = available_memory()
    if memory is not None and need > MAX_CORPUS_SHARE * memory:
        raise PasskeyError(
            f"n={n:,} documents of up to {length:,} tokens need up to {need / 2**30:,.1f} GiB of text, "
            f"more than half of the {memory / 2**30:.1f} GiB of free memory: lower --n or --length"
        )


def _write_documents(out_dir, prefix: str, docs: list, per_file: int) -> list:
    """``docs`` as ``<prefix>-0000.txt``, ... of ``per_file`` documents each, blank lines between
    them; returns the file names."""
    names = []
    for start in range(0, len(docs), per_file):
        name = f"{prefix}-{len(names):04d}.txt"
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            f.write("\n\n".join(docs[start : start + per_file]) + "\n")
        names.append(name)
    return names
