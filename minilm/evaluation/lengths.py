"""Perplexity and bits per character on the held-out split at several lengths.

A checkpoint (loaded with ``minilm.checkpoints.loading.load_model``, evaluation-time overrides such
as a RoPE scaling applied) is scored on segments of T tokens cut from its validation split,
for each length T (by default 1x, 2x, 4x, 8x and 16x its training length, the
block_size), in the modes of ``minilm.evaluation.scoring``: ``nonoverlapping``, ``sliding``
(stride T/2 or ``stride``) and ``fixed-stride`` (one stride at every length: ``fixed_stride``,
by default the training length).

Every length scores the same tokens: the first N targets of the split, where N is
``max_tokens`` (or the whole split, if shorter) rounded down to a multiple of the longest
requested length, so the numbers of one table differ only by the segment length. The
validation text is tokenized with the checkpoint's own tokenizer
(``minilm.data.prepare(..., tokenizer=...)``).

Perplexity = exp(mean nats per scored token); bits/char = total nats / (characters of the
scored text * ln 2), the characters being those of the decoded scored tokens. A bounded
scheme (``position_limit()`` not None, e.g. learned) past its table is reported as
``n/a (bounded)``, not run.

Memory stays linear in T: the model chunks masks and biases (``minilm.model.attention.MASK_BUDGET``),
bias-free schemes use SDPA's causal kernel, and the loss is computed from the final hidden
states in chunks (``minilm.evaluation.scoring.LOSS_CHUNK``), so the T x vocab logits never exist at once.

Output: ``markdown_table``, ``write_csv`` and (with matplotlib) ``plot`` of perplexity
against length.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np
import torch
from tqdm import tqdm

from minilm.checkpoints.loading import load_model
from minilm.common import MinilmError, peak_memory, resolve_device, resolve_dtype
from minilm.common import markdown_table as table
from minilm.common import write_csv as common_write_csv
from minilm.data import corpus as data
from minilm.evaluation.scoring import MODES, document_forward, score_many, segments
from minilm.figures.canvas import log2_axes, require_matplotlib, save_figure
from minilm.positions import describe
from minilm.positions.layers import describe_design

DEFAULT_MULTIPLES = (1, 2, 4, 8, 16)
DEFAULT_MAX_TOKENS = 65536


class EvaluationError(MinilmError):
    """A bad evaluation request; the message is one line meant for the user."""


@dataclass
class Result:
    """One cell: a model at one length. ``nll`` is the mean nats per scored token (None if not run)."""

    label: str
    checkpoint: str
    position: str
    train_length: int
    length: int
    mode: str
    stride: Optional[int]
    tokens: int
    chars: int
    nll: Optional[float]
    status: str = "ok"  # ok | bounded
    by_position: Optional[list] = None  # nonoverlapping with position_bin: mean nats per bin of positions
    truncated_by_position: Optional[list] = None  # the same bins with the context cut to ``truncate`` tokens

    @property
    def ppl(self) -> Optional[float]:
        return None if self.nll is None else math.exp(min(self.nll, 700.0))

    @property
    def bpc(self) -> Optional[float]:
        return None if self.nll is None else self.nll * self.tokens / (self.chars * math.log(2))

    def cell(self, what: str = "ppl") -> str:
        if self.status == "bounded":
            return "n/a (bounded)"
        if what == "bpc":
            return f"{self.bpc:.3f}"
        return f"{self.ppl:.2f}" if self.ppl < 1e4 else f"{self.ppl:.3g}"


# --------------------------------------------------------------------------- checkpoints

_VAL_CACHE: dict = {}
SPLITS = ("val", "holdout")  # what is scored: the validation split, or text held out of the train split


def validation_tokens(config, tokenizer, quiet: bool = False, split: str = "val") -> np.ndarray:
    """The validation split of ``config.data`` (or ``split`` "holdout": the last
    ``data.holdout_tokens`` of the train split) as ids of ``tokenizer`` (memoised per process)."""
    key = (
        os.path.abspath(config.data.corpus),  # relative paths: one corpus and dir from wherever they are read
        os.path.abspath(config.data.dir),
        config.data.vocab_size,
        config.data.end_of_text,
        config.data.text_field,
        config.data.holdout_tokens,
        split,
        hashlib.sha1(tokenizer.to_bytes()).hexdigest(),
    )
    if key not in _VAL_CACHE:
        if split not in SPLITS:
            raise EvaluationError(f"split={split!r} is invalid: valid: {', '.join(SPLITS)}")
        tokens = data.prepare(config.data, quiet=quiet, tokenizer=tokenizer, announce=True).tokens(split)
        if not len(tokens):
            raise EvaluationError(
                "the holdout split is empty: the model was trained with data.holdout_tokens=0; "
                "score the validation split, or train with data.holdout_tokens=N"
                if split == "holdout"
                else f"the {split} split of {config.data.corpus!r} is empty"
            )
        _VAL_CACHE[key] = np.asarray(tokens)
    return _VAL_CACHE[key]


def segment_length(multiple: float, block_size: int) -> int:
    """``multiple`` x the training length in tokens; an EvaluationError when that is under one token."""
    length = int(round(multiple * block_size))
    if length < 1:
        raise EvaluationError(
            f"multiple {multiple:g} of block_size {block_size} is {multiple * block_size:g} "
            f"tokens: evaluation lengths must be at least 1 token"
        )
    return length


def evaluate_checkpoints(
    paths: Sequence[str],
    *,
    lengths: Optional[Sequence[int]] = None,
    multiples: Sequence[float] = DEFAULT_MULTIPLES,
    mode: str = "nonoverlapping",
    stride: Optional[int] = None,
    fixed_stride: Optional[int] = None,
    max_tokens: Optional[int] = DEFAULT_MAX_TOKENS,
    position_bin: int = 0,
    truncate: Optional[int] = None,
    truncated_stride: Optional[int] = None,
    overrides: Sequence[str] = (),
    labels: Optional[Sequence[str]] = None,
    batch_tokens: int = 8192,
    dtype: str = "float32",
    device: str = "auto",
    quiet: bool = False,
    split: str = "val",
) -> list:
    """Score each checkpoint at each length; returns a list of ``Result`` (one per cell).

    ``mode`` is one of ``minilm.evaluation.scoring.MODES`` or a list of them; every (mode,
    length) cell of a checkpoint comes from one ``score_many`` pass. ``lengths`` are
    absolute segment lengths shared by every checkpoint; without them each checkpoint is
    scored at ``multiples`` of its own block_size. ``overrides`` are ``key=value`` settings
    applied to every checkpoint's config (position scaling at evaluation time, another
    corpus); ``labels`` name the rows (default: the checkpoint directory, a longer end of its path
    where two share one, ``_row_names``; plus what a ``model.`` override changed: ``_default_label``).
    ``position_bin`` > 0: each nonoverlapping Result also holds the
    mean loss by position in the segment, averaged over bins of that many positions; with ``truncate``
    also the same bins with the context cut to ``truncate`` tokens (``truncated_by_position``, the
    control of ``truncated_curve``: sliding windows of ``truncate`` tokens advancing by
    ``truncated_stride``, default ``truncate // 2``, the sliding protocol's, whose runs it shares). ``split``
    "holdout" scores the train split's held-out text (``data.holdout_tokens``) instead."""
    modes = _checked_modes(mode, stride)
    _check_lengths(lengths, multiples, labels, paths, dtype)
    _check_sizes(max_tokens, batch_tokens, fixed_stride, position_bin)
    control = _control_request(truncate, truncated_stride) if position_bin else None
    device = resolve_device(device)
    compute_dtype = resolve_dtype(dtype, device)
    loaded = _load_all(paths, overrides, device, lengths, multiples, split)
    longest = max(t for *_, these in loaded for t in these)

    names = _row_names([path for path, *_ in loaded])
    results = []
    for index, (path, model, tokenizer, config, these) in enumerate(loaded):
        val = validation_tokens(config, tokenizer, quiet=quiet, split=split)
        available = len(val) - 1
        budget = available if max_tokens is None else min(max_tokens, available)
        if budget < longest:
            limited = "" if budget == available else f" (max_tokens={max_tokens})"
            raise EvaluationError(
                f"{path}: the {split} split has {budget} scorable tokens{limited}, fewer than "
                f"the longest length {longest}: use shorter lengths or more text"
            )
        n = budget // longest * longest
        tokens = torch.from_numpy(np.asarray(val[: n + 1], dtype=np.int64))
        eot = tokenizer.eos_id if config.data.end_of_text else None
        chars = scored_chars(tokenizer, tokens[1:].tolist(), eot, ends_split=n + 1 == len(val))
        position = config.model.position
        label = labels[index] if labels is not None else _default_label(names[index], overrides, position)
        limit = model.positions.position_limit()
        runnable = [t for t in these if limit is None or t <= limit]
        cells = [(m, t) for m in modes for t in runnable]
        strides = {
            "nonoverlapping": lambda t: None,
            "sliding": lambda t: stride or max(1, t // 2),
            "fixed-stride": lambda t: fixed_stride or config.model.block_size,
        }
        requests = [(t, m, strides[m](t)) for m, t in cells] + ([control] if control else [])
        total = sum(len(segments(n, *request)) for request in requests)
        started, positions, by_target = time.time(), [], ([] if control else None)
        with tqdm(
            total=total, desc=f"eval {label}", unit="segment", file=sys.stderr, disable=quiet, leave=False
        ) as bar:
            nll = dict(
                zip(
                    cells,
                    score_many(
                        model,
                        tokens,
                        requests,
                        batch_tokens=batch_tokens,
                        dtype=compute_dtype,
                        progress=bar,
                        by_position=positions,
                        by_target=by_target,
                        forward=document_forward(config.data, tokenizer.eos_id),
                    ),
                )
            )
        binned = {cell: _binned(curve, position_bin) for cell, curve in zip(cells, positions)}
        cut = {
            cell: _binned(truncated_curve(curve, by_target[-1], cell[1], control[0]), position_bin)
            for cell, curve in zip(cells, positions)
            if control and curve is not None and cell[1] > control[0]
        }
        for m in modes:
            for t in these:
                common = dict(
                    label=label,
                    checkpoint=path,
                    position=describe_design(position, config.model.layers, config.model.n_layer),
                    train_length=config.model.block_size,
                    length=t,
                    mode=m,
                    stride=strides[m](t),
                    tokens=n,
                    chars=chars,
                )
                results.append(
                    Result(nll=nll[(m, t)], by_position=binned[(m, t)], truncated_by_position=cut.get((m, t)), **common)
                    if (m, t) in nll
                    else Result(nll=None, status="bounded", **common)
                )
        if not quiet:
            print(
                f"[eval] {label}: {len(runnable)} lengths x {len(modes)} mode(s) x {n:,} tokens in "
                f"{time.time() - started:.1f}s; peak memory so far {peak_memory(device)}",
                file=sys.stderr,
                flush=True,
            )
    return results


def _check_lengths(lengths, multiples, labels, paths, dtype) -> None:
    if lengths is not None and (not lengths or any(int(t) != t or t < 1 for t in lengths)):
        raise EvaluationError(f"lengths={list(lengths)} are invalid: expected positive integers")
    if lengths is None and (not multiples or any(m <= 0 for m in multiples)):
        raise EvaluationError(f"multiples={list(multiples)} are invalid: expected positive numbers")
    if labels is not None and len(labels) != len(paths):
        raise EvaluationError(f"{len(labels)} labels for {len(paths)} checkpoints")
    if dtype not in ("float32", "bfloat16"):
        raise EvaluationError(f"dtype={dtype!r} is invalid: valid: float32, bfloat16")


def _load_all(paths, overrides, device, lengths, multiples, split: str = "val") -> list:
    """(path, model, tokenizer, config, its lengths) of every checkpoint, loaded before any is scored.
    The holdout split is the tail the run held out: scored with another ``data.holdout_tokens`` it would
    be text the run trained on (or less than it held out), so that is refused."""
    loaded = []
    for path in paths:
        model, tokenizer, config, state = load_model(path, overrides, device=device)
        saved = (state.get("config") or {}).get("data")  # a minilm run's (before holdout_tokens existed: 0)
        held = saved.get("holdout_tokens", 0) if saved else None
        if split == "holdout" and held is not None and held != config.data.holdout_tokens:
            raise EvaluationError(
                f"{path}: data.holdout_tokens={config.data.holdout_tokens} but the run held out {held} tokens: the "
                f"holdout split is the tail it never trained on; leave data.holdout_tokens as the run's"
            )
        block = config.model.block_size
        if lengths is not None:
            these = [int(t) for t in lengths]
        else:
            these = sorted({segment_length(m, block) for m in multiples})
        loaded.append((state["path"], model, tokenizer, config, these))
    return loaded


def scored_chars(tokenizer, ids: list, eot: Optional[int], ends_split: bool) -> int:
    """Characters of the text ``ids`` stand for, counted as the prepared corpus counts a split's
    (``Prepared.val_chars``, which the training's bits/char divide by): the decoded text, and with
    ``data.end_of_text`` (``eot``, the id after every document) each document boundary as the two blank
    lines the joined text has there, where the tokens have "\n" and the id, which decodes to nothing
    (the split's last id, ``ends_split``, closes no boundary: the joined text ends with one "\n")."""
    chars = len(tokenizer.decode(ids))
    if eot is None:
        return chars
    boundaries = sum(1 for t in ids if t == eot) - (1 if ends_split and ids and ids[-1] == eot else 0)
    return chars + 2 * boundaries


def _check_sizes(max_tokens, batch_tokens, fixed_stride, position_bin) -> None:
    if max_tokens is not None and max_tokens < 1:
        raise EvaluationError(f"max_tokens={max_tokens} is invalid: expected a positive integer")
    if not isinstance(batch_tokens, int) or batch_tokens < 1:
        raise EvaluationError(f"batch_tokens={batch_tokens!r} is invalid: expected an integer >= 1")
    if fixed_stride is not None and (not isinstance(fixed_stride, int) or fixed_stride < 1):
        raise EvaluationError(f"fixed_stride={fixed_stride!r} is invalid: expected an integer >= 1")
    if not isinstance(position_bin, int) or position_bin < 0:
        raise EvaluationError(f"position_bin={position_bin!r} is invalid: expected an integer >= 0 (0: none)")


def _control_request(truncate: Optional[int], stride: Optional[int]) -> Optional[tuple]:
    """The scoring request (length, mode, stride) of the truncated-context control, or None without ``truncate``."""
    if truncate is None:
        return None
    if not isinstance(truncate, int) or isinstance(truncate, bool) or truncate < 1:
        raise EvaluationError(f"truncate={truncate!r} is invalid: expected an integer >= 1 (None: no control)")
    stride = (truncate // 2 or 1) if stride is None else stride
    if not isinstance(stride, int) or isinstance(stride, bool) or not 1 <= stride <= truncate:
        raise EvaluationError(f"truncated_stride={stride!r} is invalid: expected an integer from 1 to {truncate}")
    return (truncate, "sliding", stride)


def truncated_curve(curve: torch.Tensor, losses: torch.Tensor, length: int, truncate: int) -> torch.Tensor:
    """The loss by position of nonoverlapping segments of ``length`` tokens with the context cut to
    ``truncate`` tokens: ``curve`` (the segments' mean nats at each position, full context) where the
    position p < ``truncate`` (no context to cut), and past it the mean over the segments of ``losses``
    (per-target nats of a sliding request at ``truncate``, ``score_many``'s ``by_target``) at their
    position p, so every position p >= truncate is scored with at most ``truncate`` tokens visible (with
    stride 1, exactly tokens[p - truncate + 1 : p + 1]). A drop past L in both curves is the text, not
    context use (the issue's control for the loss-by-position table)."""
    padded = torch.cat([losses, losses.new_full(((-len(losses)) % length,), math.nan)]).view(-1, length)
    cut = padded.nanmean(dim=0)
    return torch.cat([curve[:truncate], cut[truncate:]])


def _binned(curve, width: int) -> Optional[list]:
    """Mean of ``curve`` over consecutive bins of ``width`` positions (the last may be shorter)."""
    if curve is None or width < 1:
        return None
    return [float(curve[i : i + width].mean()) for i in range(0, len(curve), width)]


def _checked_modes(mode, stride) -> list:
    """``mode`` (one mode or a list) as a list, with a one-line error for a bad mode or stride."""
    modes = [mode] if isinstance(mode, str) else list(mode)
    if not modes or any(m not in MODES for m in modes):
        raise EvaluationError(f"mode={mode!r} is invalid: valid: {', '.join(MODES)}")
    if stride is not None and "sliding" not in modes:
        raise EvaluationError(f"stride={stride} is only used with mode='sliding' (mode is {mode!r})")
    if stride is not None and (not isinstance(stride, int) or stride < 1):
        raise EvaluationError(f"stride={stride!r} is invalid: expected an integer >= 1 (omit it for length/2)")
    return modes


def _row_names(paths: Sequence[str]) -> list:
    """Each checkpoint's row name: its run directory (a checkpoint file's directory), or where two
    would share one, the shortest end of their paths that tells them apart: more of the directories
    first (``a/rope``, ``b/rope``), then the file's name (``snapshots/step-1``), so no row hides another."""
    options = []  # each path's possible names, shortest first
    for path in paths:
        pieces = os.path.abspath(path).strip(os.sep).split(os.sep)
        folders, file = (pieces[:-1], pieces[-1][:-3]) if pieces[-1].endswith(".pt") else (pieces, None)
        ends = ["/".join(folders[-k:]) for k in range(1, len(folders) + 1)]
        options.append(ends + ([f"{ends[0]}/{file}"] if file else []))
    names = [ends[0] for ends in options]
    for name in {n for n in names if names.count(n) > 1}:
        same = [i for i, n in enumerate(names) if n == name]
        for j in range(1, max(len(options[i]) for i in same)):
            ends = [options[i][min(j, len(options[i]) - 1)] for i in same]
            if len(set(ends)) == len(ends):
                for i, end in zip(same, ends):
                    names[i] = end
                break
    return names


def _default_label(name: str, overrides: Sequence[str], position: dict) -> str:
    """The row's name, with what evaluation changed of the model: its positions described, any other
    ``model.`` setting as given (a learned table stretched by ``model.block_size`` is another model)."""
    settings = [o.lstrip("-") for o in overrides]
    if any(o.startswith("model.position") for o in settings):
        name += f" [{describe(position)}]"
    others = [o for o in settings if o.startswith("model.") and not o.startswith("model.position")]
    return name + (f" [{', '.join(others)}]" if others else "")


# --------------------------------------------------------------------------- output


def markdown_table(results: Sequence, what: str = "ppl") -> str:
    """A wide markdown table: one row per label, one column per evaluated length."""
    lengths = sorted({r.length for r in results})
    rows: dict = {}
    for r in results:
        rows.setdefault(r.label, {"position": r.position, "train": r.train_length})[r.length] = r.cell(what)
    title = "perplexity" if what == "ppl" else "bits/char"
    return table(
        ["model", "position", "train length"] + [f"{title} @ {t}" for t in lengths],
        [[label, row["position"], row["train"]] + [row.get(t, "") for t in lengths] for label, row in rows.items()],
    )


def write_csv(results: Sequence, path: str) -> str:
    """One line per cell: every Result field plus ppl and bpc (empty when not run); written
    whole or not at all (``common.atomic_write``)."""
    rows = []
    for r in results:
        row = {
            **asdict(r),
            "ppl": "" if r.ppl is None else f"{r.ppl:.6g}",
            "bpc": "" if r.bpc is None else f"{r.bpc:.6g}",
        }
        row["nll"] = "" if r.nll is None else f"{r.nll:.6g}"
        row["stride"] = "" if r.stride is None else r.stride
        row.pop("by_position")
        row.pop("truncated_by_position")
        rows.append(row)
    return common_write_csv(rows, path, keep=True)  # an earlier result is set aside, never replaced


def plot(
    results: Sequence,
    path: str,
    title: str = "perplexity vs evaluation length",
    dashed: Sequence[str] = (),
    split: str = "val",
) -> str:
    """PNG of perplexity against length (log x; log y too when it spans more than 10x), one line per label "
    "(``dashed`` labels dashed);
    a dotted vertical line at each distinct training length. Needs matplotlib (object API, no
    pyplot, no display)."""
    Figure = require_matplotlib()
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    labels = list(dict.fromkeys(r.label for r in results))
    for label in labels:
        points = sorted((r.length, r.ppl) for r in results if r.label == label and r.ppl is not None)
        if points:
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                marker="o",
                label=label,
                linestyle="--" if label in dashed else "-",
            )
    for train in sorted({r.train_length for r in results}):
        ax.axvline(train, color="grey", linestyle=":", linewidth=1)
    values = [r.ppl for r in results if r.ppl is not None]
    wide = bool(values) and max(values) > 10 * min(
        values
    )  # a log axis keeps blown-up curves from flattening the others
    log2_axes(ax, [r.length for r in results], log_y=wide)
    ax.set_xlabel("evaluation length (tokens); dotted: training length")
    ax.set_ylabel(
        ("validation" if split == "val" else "held-out training text")
        + " perplexity"
        + (" (log scale)" if wide else "")
    )
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, keep=True)
