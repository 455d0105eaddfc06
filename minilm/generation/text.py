"""Text in and out of generation: prompts as token ids (``encode_prompt``), incremental
detokenization with stop strings (``TextStream``), and ``generate``, which yields
``Piece(sample, token, text)`` as the token loop of ``minilm.generation.decode`` produces them.

A stop string ends a sample and is not part of its text (the text ends just before it); the
token that completed it is the sample's last token. An end-of-text id (the tokenizer's
``stop_ids``: for an imported model the ``eos_token_id`` of its generation_config.json, else of
its config.json, one id or a list) ends a sample too: it is the sample's last token and adds no text
(``stop_ids=()`` goes on past it, as ``generate.py --ignore-eos``). Pieces are only handed out
once they are complete characters and can no longer turn out to be the start of a stop string.
"""

from __future__ import annotations

from typing import Iterator, List, NamedTuple, Optional, Sequence

from minilm.generation.decode import GenerationError, Sampling, Stats, generate_rows
from minilm.model.cache import SINK_POSITIONS

CONTEXT_TOKENS = 5  # prompt tokens decoded along with the first new ones, so joins come out right


class TextStream:
    """Incremental detokenization of one generated sequence, with stop strings.

    ``push(token)`` returns the new text that is safe to show: each step decodes only the
    few last tokens (from the last complete-character boundary) and hands out the new
    suffix, holding it back while it ends in an incomplete UTF-8 character (byte-fallback
    pieces decode to U+FFFD until the character is complete) or could still be the start
    of a stop string. The joined pieces are exactly the decoded continuation of the prompt
    (up to a stop string, which is cut off together with everything after it, or up to an
    end-of-text id of ``stop_ids``, which adds no text and flushes what was held back).
    """

    def __init__(
        self, tokenizer, prompt_ids: Sequence[int] = (), stop: Sequence[str] = (), stop_ids: Sequence[int] = ()
    ):
        self.tokenizer = tokenizer
        if any(not isinstance(s, str) or not s for s in stop):
            raise GenerationError(
                f"stop={list(stop)!r} is invalid: a stop text is a non-empty string (an empty one "
                f"would end every sample before its first token)"
            )
        self.stop = tuple(stop)
        self.stop_ids = frozenset(int(i) for i in stop_ids)
        self._longest_stop = max((len(s) for s in self.stop), default=0)
        self._ids = [int(t) for t in prompt_ids][-CONTEXT_TOKENS:]
        self._prefix, self._read = 0, len(self._ids)  # ids[prefix:read] is text already counted
        self.tokens: List[int] = []  # generated ids, up to the one that completed a stop string or ended the text
        self.text = ""  # the decoded continuation so far (cut at a stop string)
        self._shown = 0  # characters of text handed out
        self.stopped = False

    def push(self, token: int, final: bool = False) -> str:
        """Add one generated token; ``final`` flushes everything held back. An end-of-text id
        flushes it too, and ends the stream without adding text."""
        if self.stopped:
            return ""
        self.tokens.append(int(token))
        if int(token) in self.stop_ids:
            out = self._release(final=True)
            self.stopped = True
            return out
        self._ids.append(int(token))
        return self._release(final)

    def _release(self, final: bool) -> str:
        """Decode what the last tokens added and hand out the part that is safe to show."""
        decode = self.tokenizer.decode
        new = decode(self._ids[self._prefix :])
        old = decode(self._ids[self._prefix : self._read])
        before = len(self.text)
        if final or (len(new) > len(old) and not new.endswith("\ufffd")):
            self.text += new[len(old) :]
            self._prefix, self._read = self._read, len(self._ids)
        safe = len(self.text)
        if self.stop:
            start = max(0, before - self._longest_stop + 1)
            hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                self.text, self.stopped, safe = self.text[: min(hits)], True, min(hits)
            elif not final:
                safe -= self._stop_prefix()
        out = self.text[self._shown : safe]
        self._shown = max(self._shown, safe)
        return out

    def _stop_prefix(self) -> int:
        """Length of the longest end of the text that begins some stop string."""
        for k in range(min(len(self.text), self._longest_stop - 1), 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self.stop):
                return k
        return 0


class Piece(NamedTuple):
    """One generated token of one sample and the text it adds (may be empty)."""

    sample: int
    token: int
    text: str
    done: bool  # the sample is finished (stop string, end-of-text id or last token)


def encode_prompt(tokenizer, prompt) -> List[int]:
    """Token ids of a prompt string (or ids as given); an empty prompt starts from BOS."""
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not ids:
        if tokenizer.bos_id is None:
            raise GenerationError("the prompt is empty and the tokenizer has no BOS token to start from: give a prompt")
        ids = [tokenizer.bos_id]
    return ids


def generate(
    model,
    tokenizer,
    prompt=None,
    *,
    prompts: Optional[Sequence] = None,
    max_new_tokens: int = 200,
    sampling: Sampling = Sampling(),
    num_samples: int = 1,
    seed: Optional[int] = None,
    stop: Sequence[str] = (),
    max_context: Optional[int] = None,
    use_cache: bool = True,
    sinks: int = 0,
    sink_positions: str = SINK_POSITIONS[0],
    stats: Optional[Stats] = None,
    compile: bool = False,
    stop_ids: Optional[Sequence[int]] = None,
) -> Iterator[Piece]:
    """Yield a ``Piece`` per new token of every unfinished sample as it is decoded; the samples
    are decoded together as one batch. ``prompt`` is a string or token ids; ``prompts`` instead
    gives several (of any lengths), and sample ``i * num_samples + j`` is the j-th continuation
    of prompt i. Stops early once every sample has hit a stop string or an end-of-text id
    (``stop_ids``; None: the tokenizer's, ``()``: none)."""
    if isinstance(stop, str):
        stop = [stop]
    if (prompt is None) == (prompts is None):
        raise GenerationError("give either one prompt or a list of prompts")
    rows = [encode_prompt(tokenizer, p) for p in ([prompt] if prompts is None else prompts)]
    stop_ids = tuple(tokenizer.stop_ids if stop_ids is None else stop_ids)
    streams = None  # made once generate_rows has checked the sizes (a cache that fits) and prefilled
    steps = generate_rows(
        model,
        rows,
        num_samples=num_samples,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        seed=seed,
        max_context=max_context,
        use_cache=use_cache,
        sinks=sinks,
        sink_positions=sink_positions,
        stats=stats,
        compile=compile,
        vocab=tokenizer.vocab_size,
    )
    try:
        for step, tokens in enumerate(steps):
            if streams is None:
                streams = [TextStream(tokenizer, ids, stop, stop_ids) for ids in rows for _ in range(num_samples)]
            final = step == max_new_tokens - 1
            for i, token in enumerate(tokens.tolist()):
                stream = streams[i]
                if not stream.stopped:
                    text = stream.push(token, final=final)
                    yield Piece(i, token, text, final or stream.stopped)
            if all(s.stopped for s in streams):
                break
    finally:
        steps.close()


def generate_text(model, tokenizer, prompt=None, **options) -> List[str]:
    """The continuations (without the prompt) of ``generate``, one string per sample."""
    texts = [""] * (options.get("num_samples", 1) * len(options.get("prompts") or [None]))
    for piece in generate(model, tokenizer, prompt, **options):
        texts[piece.sample] += piece.text
    return texts
