"""Text generation: prefill the prompt once, then decode one token at a time from the KV cache.

Layers, each usable on its own:

* ``sample(logits, sampling, generator, seen)``: repetition penalty (CTRL, Keskar et al. 2019:
  a positive logit of an already present token is divided by the penalty, a negative one
  multiplied), then greedy argmax (temperature 0) or temperature, top-k, top-p (nucleus,
  Holtzman et al. 2020) and min-p (Nguyen et al. 2024: drop the tokens less likely than
  min_p times the most likely one) sampling, in that order, as transformers applies them.
* ``Decoder``: feeds tokens to the model and returns next-token logits, with the right
  positions for every scheme, past the context too (see below).
* ``generate_rows``: yields the sampled token of each row, step by step (rows may continue
  prompts of different lengths); ``generate_ids``: continuations of one prompt.
* text in and out (prompts, incremental detokenization with stop strings, ``generate``):
  ``minilm.generation.text``.

Past the context (``max_context``, default the model's block_size) generation never stops:

* bounded schemes (``position_limit()`` is not None: learned, interpolated over learned)
  slide a window: the model sees the last ``max_context`` tokens at positions
  0..max_context-1 (nanoGPT). With the cache the sequence is decoded from the cache while
  it fits; once it slides every position changes, so each step re-encodes the window
  without a cache (no cache reuse is possible).
* unbounded schemes (rope, alibi, t5, none, sinusoidal, interpolated over those) keep
  absolute positions and a rolling cache of ``max_context`` slots that evicts the oldest
  key when full: sliding-window attention, no re-encoding. A prompt longer than the
  window is prefilled in chunks of the window (with sinks, one token at a time past it). With ``sinks`` = N
  (attention sinks, Xiao et al. 2023) the first N tokens stay in the window for good beside
  the last max_context - N, placed by ``sink_positions``: ``cache`` (the default, as the
  paper does it) numbers positions within the cache, so the sinks stay max_context - 1 - s
  back; ``absolute`` keeps their own positions, ever further back (``minilm.model.cache``).

``use_cache=False`` computes exactly the same thing without reusing keys: every step runs
the whole sequence so far, ``model(idx, window=max_context)`` for the rolling schemes and
the last ``max_context`` tokens for the sliding ones, with the same ``context_len`` (what
dynamic NTK scaling reads) as the cache, which is ``max_context``: the dynamic-NTK scale is
fixed for a whole generation (docs/design.md, "Dynamic scaling and the cache").
Cached decode steps run the layers through ``minilm.generation.lean`` (the same computation with
less Python per layer), or with ``compile=True`` with a static cache and a compiled step
(``minilm.generation.compiled``).
"""

from __future__ import annotations

import math
import secrets
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence

import torch
from tqdm import tqdm

from minilm.common import MinilmError, Range, available_memory, check_number, peak_memory
from minilm.generation.compiled import compiled_body
from minilm.generation.lean import lean_body
from minilm.model.cache import SINK_POSITIONS, cache_dtype, check_sink_positions
from minilm.positions.layers import cache_slots

PROGRESS_CHUNKS = 16  # a prompt prefilled in at least this many chunks past the window shows a progress bar


class GenerationError(MinilmError):
    """A bad generation setting or input; the message is one line for the user."""


class GenerationWarning(UserWarning):
    """Something was adjusted to make generation possible (e.g. a prompt cropped to the context)."""


# --------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. ``temperature=0`` is greedy (top_k / top_p / min_p unused);
    ``top_k=None`` or 0 (as transformers reads it), ``top_p=1`` and ``min_p=0`` keep every token;
    ``repetition_penalty=1`` is off."""

    temperature: float = 0.8
    top_k: Optional[int] = 200
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0

    def check(self) -> "Sampling":
        def number(x):
            return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

        if not number(self.temperature) or self.temperature < 0:
            raise GenerationError(f"temperature={self.temperature!r} is invalid: expected a number >= 0 (0 = greedy)")
        if self.top_k is not None and (
            not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0
        ):
            raise GenerationError(f"top_k={self.top_k!r} is invalid: expected an integer >= 1 (0 or none: off)")
        if not number(self.top_p) or not 0 < self.top_p <= 1:
            raise GenerationError(f"top_p={self.top_p!r} is invalid: expected a number in (0, 1]")
        if not number(self.min_p) or not 0 <= self.min_p <= 1:
            raise GenerationError(f"min_p={self.min_p!r} is invalid: expected a number in [0, 1] (0 = off)")
        if not number(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise GenerationError(
                f"repetition_penalty={self.repetition_penalty!r} is invalid: expected a number > 0 (1 = off)"
            )
        return self


def repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL (Keskar et al. 2019): for tokens already present, a positive logit is divided by
    ``penalty`` and a negative one multiplied by it (penalty > 1 makes repeats less likely)."""
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def sample(
    logits: torch.Tensor,
    sampling: Sampling,
    generator: Optional[torch.Generator] = None,
    seen: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Next token ids (B,) from float logits (B, V). ``seen`` (B, V) bool marks the tokens
    already present, for the repetition penalty."""
    if sampling.repetition_penalty != 1.0 and seen is not None:
        logits = repetition_penalty(logits, seen, sampling.repetition_penalty)
    if sampling.temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # probability mass of the tokens ranked above
        sorted_logits = sorted_logits.masked_fill(before >= sampling.top_p, float("-inf"))  # rank 0 always stays
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    if sampling.min_p > 0:  # the most likely token always stays (its probability is the maximum)
        probs = logits.softmax(dim=-1)
        logits = logits.masked_fill(probs < sampling.min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


# --------------------------------------------------------------------------- the decode loop


def context_size(model, max_context: Optional[int] = None) -> int:
    """The number of tokens the model sees at once: ``max_context`` or the block_size, and at
    most the position table of a bounded scheme."""
    positions = model.positions
    limit = positions.position_limit()
    usable = None if limit is None else int(math.floor(limit))
    if max_context is None:
        max_context = model.config.block_size if usable is None else min(model.config.block_size, usable)
    if not isinstance(max_context, int) or isinstance(max_context, bool) or max_context < 1:
        raise GenerationError(f"max_context={max_context!r} is invalid: expected an integer >= 1")
    if usable is not None and max_context > usable:
        raise GenerationError(
            f"max_context={max_context} is larger than the {positions.kind} position table: at most {usable} positions"
        )
    return max_context


def check_cache_memory(
    model,
    batch_size: int,
    capacity: int,
    advice: str = "lower --max-context, --max-new-tokens or --num-samples",
    prefill: int = 0,
) -> None:
    """GenerationError when a KV cache of ``capacity`` tokens for ``batch_size`` sequences, and
    the forward pass of a ``prefill``-token prompt beside it (its logits, MLP and residual
    activations), would not fit in the memory that is free now (checked before allocating,
    never after); the message ends with ``advice``, what the caller's user can lower."""
    c = model.config
    ref = model.wte.weight
    heads = model.blocks[0].attn.n_kv_head
    slots = sum(cache_slots(model.layer_types, capacity))  # each layer's window, or the capacity
    need = 2 * batch_size * heads * slots * c.head_dim * cache_dtype(ref).itemsize  # k and v
    need += batch_size * prefill * (c.vocab_size + 2 * c.d_ff + 4 * c.d_model) * ref.element_size()
    free = available_memory(ref.device)
    if free is not None and need > free:
        what = f" and a prompt of {prefill:,} tokens" if prefill else ""
        raise GenerationError(
            f"a KV cache of {capacity:,} tokens x {batch_size} sample(s){what} needs "
            f"{need / 2**30:.1f} GiB but {free / 2**30:.1f} GiB is free: {advice}"
        )


def check_sinks(model, sinks, max_context: int, slides: bool, sink_positions: str, compile: bool) -> int:
    """``sinks`` checked: 0 <= sinks < max_context, and only for schemes that roll; ``sink_positions``
    one of SINK_POSITIONS, and ``cache`` neither compiled nor under positions added to the embeddings."""
    check_count("sink_tokens", sinks, 0)
    check_sink_positions(sink_positions, GenerationError)
    if sinks and slides:
        raise GenerationError(
            f"sink_tokens={sinks} needs a scheme whose cache rolls (rope, alibi, t5, ...): "
            f"{model.positions.kind} positions are bounded and slide their window instead"
        )
    if sinks and sink_positions == "cache" and model.positions.embeds:
        raise GenerationError(
            f"sink_positions=cache renumbers positions inside attention, but "
            f"{model.positions.kind} positions are added to the embeddings: use sink_positions=absolute"
        )
    if sinks and sink_positions == "cache" and any(layer_type.masked for layer_type in model.layer_types):
        raise GenerationError(
            "sink_positions=cache renumbers the positions of one window, but this model's layers have windows "
            "or chunks of their own (model.layers): use sink_positions=absolute"
        )
    if sinks and sink_positions == "cache" and compile:
        raise GenerationError(
            "the compiled step keeps absolute positions: with sink_tokens use "
            "sink_positions=absolute, or leave compile off"
        )
    if sinks >= max_context:
        raise GenerationError(
            f"sink_tokens={sinks} leaves no room in a context of {max_context}: "
            f"expected 0 <= sink_tokens < {max_context}"
        )
    return sinks


class Decoder:
    """Feeds tokens to ``model`` for ``batch_size`` sequences and returns the next-token logits
    (B, V): ``prefill(ids)`` once, then ``step(tokens)``. The sequences share their positions,
    or with ``offsets`` (the cache's) they are prompts of different lengths, left-padded: row b
    begins after offsets[b] tokens of padding and sits at its own positions.

    ``slides`` is True for bounded schemes (the window is re-encoded from position 0 once the
    sequence is longer than ``max_context``), False for the rest (a rolling cache / banded
    causal mask over absolute positions). See the module docstring.
    """

    def __init__(
        self,
        model,
        batch_size: int,
        *,
        max_context: Optional[int] = None,
        use_cache: bool = True,
        total: Optional[int] = None,
        sinks: int = 0,
        sink_positions: str = SINK_POSITIONS[0],
        compile: bool = False,
        offsets: Optional[Sequence[int]] = None,
    ):
        self.model, self.batch_size, self.use_cache = model, batch_size, use_cache
        if compile and not use_cache:
            raise GenerationError("compile=True compiles the cached decode step: it needs use_cache=True")
        self.max_context = context_size(model, max_context)
        self.slides = model.positions.position_limit() is not None
        self.sinks = check_sinks(model, sinks, self.max_context, self.slides, sink_positions, compile)
        self.sink_positions = sink_positions
        self.device = model.wte.weight.device
        self.cache = None
        if use_cache:  # sized by the need (``total`` tokens at most), capped by the context
            capacity = self.max_context if total is None else max(1, min(self.max_context, total))
            check_cache_memory(model, batch_size, capacity)
            self.cache = model.new_cache(
                batch_size,
                capacity,
                rolling=not self.slides,
                static=compile,
                sinks=self.sinks if capacity == self.max_context else 0,
                sink_positions=sink_positions,
                offsets=None if offsets is None else torch.as_tensor(offsets, device=self.device),
            )
        self.body = compiled_body(model) if compile else lean_body(model)  # the decode step's layers
        self.length = 0  # tokens given so far
        self.refill_at = model.positions.refill_length() if use_cache else None  # keys recomputed once past it
        # the token history, needed whenever something is recomputed from tokens
        start = 2 * self.max_context if total is None else max(1, min(2 * self.max_context, total))
        self._history = (
            None
            if (use_cache and not self.slides and self.refill_at is None)
            else torch.empty(batch_size, start, dtype=torch.long, device=self.device)
        )

    def _remember(self, ids: torch.Tensor) -> None:
        if self._history is not None:
            end = self.length + ids.shape[1]
            if end > self._history.shape[1]:
                grown = torch.empty(
                    self.batch_size, max(end, 2 * self._history.shape[1]), dtype=torch.long, device=self.device
                )
                grown[:, : self.length] = self._history[:, : self.length]
                self._history = grown
            self._history[:, self.length : end] = ids
        self.length += ids.shape[1]

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Take the prompt (B, P) and return the logits that follow it."""
        if ids.dim() != 2 or ids.shape[0] != self.batch_size or ids.shape[1] < 1 or self.length:
            raise GenerationError(f"prefill takes one prompt batch ({self.batch_size}, P>=1) on a fresh decoder")
        ids = ids.to(self.device)
        if self.slides and ids.shape[1] > self.max_context:
            ids = ids[:, -self.max_context :]
        self._remember(ids)
        if self.cache is None:
            return self._recompute()
        return self._fill(ids)

    def _fill(self, ids: torch.Tensor) -> torch.Tensor:
        """Write ``ids`` into the cache from its current length; the logits that follow them. Past
        the window a rolling cache takes chunks of its capacity (with sinks or static, one token at a time)."""
        chunk = 1 if self.cache.sinks or self.cache.static else self.cache.capacity
        logits = self.model(ids[:, : self.cache.capacity], self.cache, context_len=self.max_context)[:, -1]
        starts = range(self.cache.capacity, ids.shape[1], chunk)
        for t in tqdm(
            starts, desc="prefill", unit="chunk", file=sys.stderr, leave=False, disable=len(starts) < PROGRESS_CHUNKS
        ):  # a long prompt shows its progress
            logits = self.model(ids[:, t : t + chunk], self.cache, context_len=self.max_context)[:, -1]
        return logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per sequence (B,) and return the logits that follow."""
        tokens = tokens.view(self.batch_size, 1)
        self._remember(tokens)
        if self.refill_at is not None and self.length > self.refill_at >= self.cache.length:
            self.cache.rewind()  # the keys so far were rotated for a length <= refill_at: rotate them all again
            return self._fill(self._history[:, : self.length])
        if self.cache is not None and (not self.slides or self.length <= self.cache.capacity):
            return self.model(tokens, self.cache, context_len=self.max_context, body=self.body)[:, -1]
        return self._recompute()

    def _recompute(self) -> torch.Tensor:
        """Logits after the whole sequence so far, without reusing keys."""
        n = self.max_context
        if self.slides:
            return self.model(self._history[:, max(0, self.length - n) : self.length], context_len=n)[:, -1]
        window = n if self.length > n else None  # within the window the band changes nothing
        return self.model(
            self._history[:, : self.length],
            window=window,
            sinks=self.sinks,
            sink_positions=self.sink_positions,
            context_len=n,
        )[:, -1]


@dataclass
class Stats:
    """What a generation cost; ``generate_ids`` fills it in."""

    prompt_tokens: int = 0
    num_samples: int = 0
    new_tokens: int = 0  # per sample
    prefill_seconds: float = 0.0
    compile_seconds: float = 0.0  # with compile=True: the first decode step, which compiles it
    decode_seconds: float = 0.0  # from the first new token to the last one (after the compiling step)
    seed: Optional[int] = None
    device: str = "cpu"
    padded: bool = False  # prompts of different lengths, left-padded to prompt_tokens

    def lines(self) -> List[str]:
        b = self.num_samples
        compiled = self.compile_seconds > 0  # the compiling step is counted apart from the decode rate
        # the first new token comes out of the prefill, the second from the compiling step
        decode_steps = max(self.new_tokens - 1 - compiled, 0)
        prefill_rate = self.prompt_tokens * b / self.prefill_seconds if self.prefill_seconds else float("nan")
        decode_rate = decode_steps * b / self.decode_seconds if self.decode_seconds else float("nan")
        return (
            [
                f"prompt{'s: up to' if self.padded else ':'} {self.prompt_tokens} tokens, new: "
                f"{self.new_tokens} tokens "
                f"x {b} sample{'s' * (b > 1)}, seed {self.seed}",
                f"prefill: {self.prompt_tokens * b} tokens{' (padding included)' * self.padded} in "
                f"{self.prefill_seconds:.3f} s ({prefill_rate:.1f} tokens/s)",
            ]
            + ([f"compile: the first decode step took {self.compile_seconds:.3f} s (compiling it)"] if compiled else [])
            + [
                f"decode: {decode_steps * b} tokens in {self.decode_seconds:.3f} s ({decode_rate:.1f} tokens/s)",
                f"peak memory: {peak_memory(self.device)}",
            ]
        )


MAX_COUNT = 10**9  # tokens, samples or threads one generation asks for: past any that could finish


def check_count(name: str, value, low: int) -> None:
    """GenerationError unless ``value`` is an integer from ``low`` to ``MAX_COUNT``."""
    check_number(name, value, Range(low, MAX_COUNT, integer=True), GenerationError)


def generate_ids(model, prompt_ids: Sequence[int], *, num_samples: int = 1, **options) -> Iterator[torch.Tensor]:
    """Yield the next token of each of ``num_samples`` continuations of ``prompt_ids``, a
    (num_samples,) tensor per step: ``generate_rows`` with the prompt in every row."""
    yield from generate_rows(model, [prompt_ids], num_samples=num_samples, **options)


def checked_prompts(model, prompts: Sequence[Sequence[int]]) -> list:
    """The prompts as lists of ids, each checked: not empty, every id in the vocabulary."""
    if not prompts:
        raise GenerationError("no prompts: give at least one")
    rows = [[int(t) for t in ids] for ids in prompts]
    for i, ids in enumerate(rows):
        where = f"prompt {i + 1}" if len(rows) > 1 else "the prompt"
        if not ids:
            raise GenerationError(f"{where} is empty: give at least one token")
        bad = [t for t in ids if not 0 <= t < model.config.vocab_size]
        if bad:
            raise GenerationError(
                f"{where}: token id {bad[0]} is out of range: valid ids are 0..{model.config.vocab_size - 1}"
            )
    return rows


def check_lengths(
    model, rows: list, max_new_tokens: int, context: int, *, use_cache: bool, sinks: int, compile: bool
) -> None:
    """GenerationError for prompts of different lengths where a setting needs one length for all
    (they decode left-padded from a cache: ``Decoder``)."""
    if len({len(r) for r in rows}) == 1:
        return
    if not use_cache or sinks or compile:
        raise GenerationError(
            "prompts of different lengths decode together from a KV cache: not with "
            "--no-cache, --sink-tokens or --compile (give prompts one at a time for those)"
        )
    longest = max(len(r) for r in rows)
    if model.positions.position_limit() is not None and longest + max_new_tokens > context:
        raise GenerationError(
            f"prompts of different lengths under {model.positions.kind} positions must fit "
            f"the context together: the longest prompt ({longest}) + max_new_tokens "
            f"({max_new_tokens}) > {context}; lower --max-new-tokens"
        )


def check_refill(model, rows: list, max_new_tokens: int, context: int, *, use_cache: bool) -> None:
    """GenerationError where a cached generation could not match the uncached one under LongRoPE's
    ``switch: refill`` (Phi-3: every key rotated again once the sequence passes the original length L,
    ``Decoder.step``): the refill must run as one pass, so the cache must hold more than L tokens, and
    left-padded prompts of different lengths would pass L at different steps."""
    refill = model.positions.refill_length() if use_cache else None
    total = max(len(r) for r in rows) + max_new_tokens
    if refill is None or total <= refill:
        return
    if len({len(r) for r in rows}) > 1 and min(len(r) for r in rows) <= refill:  # longer ones are past L from the start
        raise GenerationError(
            f"LongRoPE with switch: refill rotates every key again once a sequence passes {refill} tokens, which "
            f"prompts of different lengths pass at different steps: give them one at a time"
        )
    if min(context, total) <= refill:
        raise GenerationError(
            f"LongRoPE with switch: refill rotates every key again once the sequence passes {refill} tokens, in one "
            f"pass, which a cache of {min(context, total)} cannot hold: give --max-context above {refill} (it is "
            f"{context}), or --no-cache"
        )


@torch.inference_mode()
def generate_rows(
    model,
    prompts: Sequence[Sequence[int]],
    *,
    num_samples: int = 1,
    max_new_tokens: int = 200,
    sampling: Sampling = Sampling(),
    seed: Optional[int] = None,
    max_context: Optional[int] = None,
    use_cache: bool = True,
    sinks: int = 0,
    sink_positions: str = SINK_POSITIONS[0],
    stats: Optional[Stats] = None,
    compile: bool = False,
    vocab: Optional[int] = None,
) -> Iterator[torch.Tensor]:
    """Yield the next token of every row, a (rows,) tensor per step, ``max_new_tokens`` times:
    row i * num_samples + j is the j-th continuation of ``prompts[i]``. The rows decode together
    as one batch (the cache checked to fit before anything is allocated); prompts of different
    lengths are left-padded and each row keeps its own positions (``Decoder``), so that greedy
    decoding gives every row what it gives alone. ``seed`` makes sampling reproducible (None: a
    fresh random seed, recorded in ``stats``). A prompt longer than the window of a bounded
    scheme is cropped to its last ``max_context`` tokens with a warning. ``vocab``: only ids below it are
    drawn (a tokenizer with fewer tokens than the embedding's rows, padded for speed as Pythia's 50,304 for
    50,277 tokens: the rows past it are no tokens); None: every row."""
    check_count("max_new_tokens", max_new_tokens, 0)
    check_count("num_samples", num_samples, 1)
    if seed is not None and not (isinstance(seed, int) and 0 <= seed < 2**63):
        raise GenerationError(f"seed={seed!r} is invalid: expected an integer from 0 to 2**63 - 1")
    sampling.check()
    rows = checked_prompts(model, prompts)
    limit = context_size(model, max_context)
    long = [i for i, r in enumerate(rows) if len(r) > limit]
    if model.positions.position_limit() is not None and long:
        which = (
            "the prompt" if len(rows) == 1 else f"prompt{'s' * (len(long) > 1)} " + ", ".join(str(i + 1) for i in long)
        )
        warnings.warn(
            f"{which} {'has' if len(long) == 1 else 'have'} {max(len(rows[i]) for i in long)} tokens"
            f"{' at most' * (len(long) > 1)} but {model.positions.kind} positions allow a context of {limit}: "
            f"using the last {limit} tokens",
            GenerationWarning,
        )
        rows = [r[-limit:] for r in rows]
    check_lengths(model, rows, max_new_tokens, limit, use_cache=use_cache, sinks=sinks, compile=compile)
    check_refill(model, rows, max_new_tokens, limit, use_cache=use_cache)
    longest = max(len(r) for r in rows)
    offsets = torch.tensor([longest - len(r) for r in rows]).repeat_interleave(num_samples)
    decoder = Decoder(
        model,
        len(offsets),
        max_context=max_context,
        use_cache=use_cache,
        total=longest + max_new_tokens,
        sinks=sinks,
        sink_positions=sink_positions,
        compile=compile,
        offsets=offsets if bool(offsets.any()) else None,
    )
    timed = stats is not None  # on CUDA, timing each step costs a synchronisation
    stats = stats if timed else Stats()
    device = decoder.device
    seed = secrets.randbits(63) if seed is None else int(seed)
    generator = torch.Generator(device=device).manual_seed(seed)
    stats.prompt_tokens, stats.num_samples, stats.seed, stats.device = longest, len(offsets), seed, str(device)
    stats.new_tokens, stats.prefill_seconds, stats.decode_seconds, stats.compile_seconds = 0, 0.0, 0.0, 0.0
    stats.padded = decoder.cache is not None and decoder.cache.offsets is not None
    if max_new_tokens == 0:
        return
    padded = torch.tensor([[0] * (longest - len(r)) + r for r in rows], dtype=torch.long, device=device)
    ids = padded.expand(num_samples, -1) if len(rows) == 1 else padded.repeat_interleave(num_samples, dim=0)
    seen = None
    if sampling.repetition_penalty != 1.0:
        seen = torch.zeros(len(rows), model.config.vocab_size, dtype=torch.bool, device=device)
        for i, r in enumerate(rows):
            seen[i, r] = True
        seen = seen.repeat_interleave(num_samples, dim=0)
    drawn = None if vocab is None or vocab >= model.config.vocab_size else vocab
    yield from _decode(model, decoder, ids, max_new_tokens, sampling, generator, seen, stats, timed, compile, drawn)


RECOMPUTE_WARNING_SECONDS = 30.0  # an uncached generation estimated to take longer says so first


def warn_if_recomputing_long(decoder, max_new_tokens: int, prefill_seconds: float) -> None:
    """Without a cache, a rolling scheme's every step runs the whole sequence so far (its keys past
    the window still feed the layers below): a GenerationWarning with the time that will take,
    estimated from the prompt's own pass, when it passes ``RECOMPUTE_WARNING_SECONDS``."""
    if decoder.cache is not None or decoder.slides or decoder.length <= decoder.max_context:
        return
    estimate = prefill_seconds * (max_new_tokens - 1)
    if estimate > RECOMPUTE_WARNING_SECONDS:
        warnings.warn(
            f"without the cache each of the {max_new_tokens - 1} steps left recomputes all {decoder.length:,}+ "
            f"tokens (past the window of {decoder.max_context}): about {estimate:,.0f} s at the prompt's "
            f"{prefill_seconds:.1f} s a pass; the KV cache gives the same tokens in a fraction of that",
            GenerationWarning,
        )


def _decode(model, decoder, ids, max_new_tokens, sampling, generator, seen, stats, timed, compile, vocab):
    """The token loop of ``generate_rows``: prefill, then one step per new token, timed; ids from ``vocab``
    on (None: none) are never drawn."""

    def pick(logits):
        logits = logits.float()
        if vocab is not None:  # a copy: the decoder's own logits stay as they were
            logits = torch.cat([logits[:, :vocab], torch.full_like(logits[:, vocab:], float("-inf"))], dim=-1)
        return sample(logits, sampling, generator, seen)

    was_training = model.training
    model.eval()
    try:
        start = time.perf_counter()
        token = pick(decoder.prefill(ids))
        _sync(decoder.device, timed)
        stats.prefill_seconds = time.perf_counter() - start
        warn_if_recomputing_long(decoder, max_new_tokens, stats.prefill_seconds)
        start = time.perf_counter()
        for step in range(max_new_tokens):
            if step:
                token = pick(decoder.step(token))
                _sync(decoder.device, timed)
                if compile and step == 1:  # this step compiled the decode step: timed apart
                    stats.compile_seconds = time.perf_counter() - start
                    start = time.perf_counter()
                stats.decode_seconds = time.perf_counter() - start
            stats.new_tokens = step + 1
            if seen is not None:
                seen.scatter_(1, token[:, None], True)
            yield token
    finally:
        model.train(was_training)


def _sync(device, timed: bool) -> None:
    if timed and device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------- text
