"""Perplexity and bits per character on the held-out split at several lengths.

A checkpoint is scored on windows of T tokens cut from its validation split, for each
length T (by default 1x, 2x, 4x, 8x and 16x its training length, the block_size). Two
ways to cut the windows (Press et al. 2022, "Train Short, Test Long", appendix B):

* ``nonoverlapping``: consecutive windows, each scored in full from position 0, so the
  average token sees T/2 tokens of context. This is what the ALiBi paper reports.
* ``sliding``: windows of T tokens that advance by ``stride`` tokens; only the last
  ``stride`` tokens of each window are scored, so every scored token sees at least
  T - stride tokens of context (except in the first window, which is scored in full,
  as in the usual sliding-window recipe). Costs T / stride times more.

Every length scores the same tokens: the first N targets of the split, where N is
``max_tokens`` (or the whole split, if shorter) rounded down to a multiple of the longest
requested length, so the numbers of one table differ only by the window length. The
validation text is tokenized with the checkpoint's own tokenizer
(``minilm.data.prepare(..., tokenizer=...)``).

Perplexity = exp(mean nats per scored token); bits/char = total nats / (characters of the
scored text * ln 2), the characters being those of the decoded scored tokens. A bounded
scheme (``position_limit()`` not None, e.g. learned) past its table is reported as
``n/a (bounded)``, not run.

Memory stays linear in T: the model chunks masks and biases (``minilm.model.MASK_BUDGET``),
bias-free schemes use SDPA's causal kernel, and the loss is computed from the final hidden
states in chunks of ``LOSS_CHUNK`` rows, so the T x vocab logits never exist at once.
"""
from __future__ import annotations

import copy
import csv
import hashlib
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

MODES = ("nonoverlapping", "sliding")
DEFAULT_MULTIPLES = (1, 2, 4, 8, 16)
DEFAULT_MAX_TOKENS = 65536
LOSS_CHUNK = 4096  # rows of hidden states turned into logits at once
OVERRIDABLE = ("model.position", "model.block_size", "data.")


class EvaluationError(ValueError):
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


# --------------------------------------------------------------------------- windows and scoring

def windows(n: int, length: int, mode: str, stride: Optional[int] = None) -> list:
    """(begin, end, scored) for the targets 1..n: inputs are tokens[begin:end], targets
    tokens[begin+1:end+1], and the last ``scored`` of them count. Every target is scored once."""
    if mode == "nonoverlapping":
        return [(b, min(b + length, n), min(b + length, n) - b) for b in range(0, n, length)]
    if mode != "sliding":
        raise EvaluationError(f"mode={mode!r} is invalid: valid: {', '.join(MODES)}")
    stride = stride or max(1, length // 2)
    if not 1 <= stride <= length:
        raise EvaluationError(f"stride={stride} is invalid for length {length}: expected 1 <= stride <= length")
    out, previous, end = [], 0, min(length, n)
    while True:
        out.append((max(0, end - length), end, end - previous))
        if end == n:
            return out
        previous, end = end, min(end + stride, n)


def token_losses(model, x: torch.Tensor, y: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropies (nats, float32) at the positions where ``keep`` is True,
    from the final hidden states in chunks so that all logits never exist at once."""
    hidden = model(x, return_hidden=True)[keep]
    targets = y[keep]
    total = torch.zeros((), dtype=torch.float64)
    for start in range(0, hidden.shape[0], LOSS_CHUNK):
        logits = model.lm_head(hidden[start:start + LOSS_CHUNK]).float()
        total += F.cross_entropy(logits, targets[start:start + LOSS_CHUNK], reduction="sum").double().cpu()
    return total


@torch.no_grad()
def score(model, tokens: torch.Tensor, length: int, mode: str = "nonoverlapping", stride: Optional[int] = None,
          *, batch_tokens: int = 8192, autocast_dtype=None, progress=None) -> float:
    """Mean nats per target over targets 1..len(tokens)-1 with windows of ``length`` tokens."""
    n = len(tokens) - 1
    device = next(model.parameters()).device
    spans = windows(n, length, mode, stride)
    groups: dict = {}
    for span in spans:  # windows of one input length go through the model together
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
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                total += token_losses(model, x, y, keep)
            if progress is not None:
                progress.update(len(batch))
    return float(total) / n


# --------------------------------------------------------------------------- checkpoints

def _merge_overrides(tree: dict, overrides: Sequence[str]) -> dict:
    """Apply ``key=value`` overrides (model.position.*, model.block_size, data.*) to a config tree.
    Setting model.position.kind to another kind starts the position settings afresh."""
    from minilm.config import ConfigError, apply_override
    tree = copy.deepcopy(tree)
    for assignment in overrides:
        key = assignment.split("=", 1)[0].strip().lstrip("-")
        if "=" not in assignment or not key.startswith(OVERRIDABLE):
            raise EvaluationError(f"override {assignment!r} is not allowed at evaluation time (nor in generate.py): "
                                  f"only model.position.KEY=VALUE (or --position.KEY=VALUE), model.block_size=N "
                                  f"or data.KEY=VALUE can change after training")
        if key == "model.position.kind":
            new = assignment.split("=", 1)[1].strip()
            if new != tree["model"]["position"].get("kind"):
                tree["model"]["position"] = {}
        try:
            apply_override(tree, assignment)
        except ConfigError as exc:
            raise EvaluationError(str(exc)) from None
    return tree


def describe_position(position: dict) -> str:
    """A short label such as 'rope', 'rope+yarn x4' or 'interpolated(learned) x4.02'."""
    kind = position.get("kind")
    if kind == "interpolated":
        inner = position.get("base", {"kind": "rope"})
        inner = inner if isinstance(inner, dict) else {"kind": inner}
        return f"interpolated({describe_position(inner)}) x{float(position.get('factor', 2.0)):.3g}"
    text = kind
    if kind == "rope" and isinstance(position.get("scaling"), dict):
        scaling = position["scaling"]
        if scaling.get("type", "none") != "none":
            text += f"+{scaling['type']}"
            if scaling.get("factor") is not None:
                text += f" x{float(scaling['factor']):.3g}"
    extras = {k: v for k, v in position.items() if k not in ("kind", "scaling")}
    if extras:
        text += " " + ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in extras.items())
    return text


def load_for_evaluation(path: str, overrides: Sequence[str] = (), device: str = "cpu"):
    """(model, tokenizer, config, state) of a checkpoint with evaluation-time overrides applied.

    The weights move in as for a fine-tuning start (``minilm.extension``), without training:
    a RoPE scaling takes ``original_max_positions`` from the checkpoint's block_size when
    omitted (the ORIGINAL training length); ``model.position.kind=interpolated`` wraps the
    checkpoint's own scheme (its table or bias buckets included); a learned table stretched by
    ``model.block_size`` is interpolated. The kind itself cannot change."""
    from minilm.checkpoint import load
    from minilm.config import ConfigError, build_config
    from minilm.extension import base_kind, complete_position, load_source_weights
    from minilm.model import GPT
    from minilm.tokenizer import Tokenizer
    state = load(path)
    tree = _merge_overrides(state["config"], overrides)
    tree["model"]["position"] = complete_position(tree["model"]["position"], state["config"]["model"],
                                                  tree["model"]["block_size"])
    try:
        config = build_config(tree)
    except ConfigError as exc:
        raise EvaluationError(f"{state['path']}: {exc}") from None
    trained, asked = base_kind(state["config"]["model"]["position"]), base_kind(config.model.position)
    if trained != asked:
        raise EvaluationError(f"{state['path']} was trained with {trained!r} positions, not {asked!r}: "
                              f"evaluation can scale or interpolate them, not change the kind")
    model = GPT(config.model)
    load_source_weights(model, state)
    model.to(device).eval()
    return model, Tokenizer.from_bytes(state["tokenizer"]), config, state


_VAL_CACHE: dict = {}


def validation_tokens(config, tokenizer, quiet: bool = False) -> np.ndarray:
    """The validation split of ``config.data`` as ids of ``tokenizer`` (memoised per process)."""
    from minilm import data
    key = (config.data.corpus, config.data.dir, config.data.vocab_size,
           hashlib.sha1(tokenizer.to_bytes()).hexdigest())
    if key not in _VAL_CACHE:
        _VAL_CACHE[key] = np.asarray(data.prepare(config.data, quiet=quiet, tokenizer=tokenizer).val)
    return _VAL_CACHE[key]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError:
        raise EvaluationError(f"device={device!r} is invalid: valid: auto, cpu, cuda, cuda:N, mps") from None


def autocast_for(dtype: str):
    choices = {"float32": None, "bfloat16": torch.bfloat16}
    if dtype not in choices:
        raise EvaluationError(f"dtype={dtype!r} is invalid: valid: {', '.join(choices)}")
    return choices[dtype]


def evaluate_checkpoints(paths: Sequence[str], *, lengths: Optional[Sequence[int]] = None,
                         multiples: Sequence[float] = DEFAULT_MULTIPLES, mode: str = "nonoverlapping",
                         stride: Optional[int] = None, max_tokens: Optional[int] = DEFAULT_MAX_TOKENS,
                         overrides: Sequence[str] = (), labels: Optional[Sequence[str]] = None,
                         batch_tokens: int = 8192, dtype: str = "float32", device: str = "auto",
                         quiet: bool = False) -> list:
    """Score each checkpoint at each length; returns a list of ``Result`` (one per cell).

    ``lengths`` are absolute window lengths shared by every checkpoint; without them each
    checkpoint is scored at ``multiples`` of its own block_size. ``overrides`` are
    ``key=value`` settings applied to every checkpoint's config (position scaling at
    evaluation time, another corpus); ``labels`` name the rows (default: the checkpoint
    directory, plus the overridden position)."""
    from tqdm import tqdm
    if mode not in MODES:
        raise EvaluationError(f"mode={mode!r} is invalid: valid: {', '.join(MODES)}")
    if lengths is not None and (not lengths or any(int(t) != t or t < 1 for t in lengths)):
        raise EvaluationError(f"lengths={list(lengths)} are invalid: expected positive integers")
    if lengths is None and (not multiples or any(m <= 0 for m in multiples)):
        raise EvaluationError(f"multiples={list(multiples)} are invalid: expected positive numbers")
    if max_tokens is not None and max_tokens < 1:
        raise EvaluationError(f"max_tokens={max_tokens} is invalid: expected a positive integer")
    if labels is not None and len(labels) != len(paths):
        raise EvaluationError(f"{len(labels)} labels for {len(paths)} checkpoints")
    device = resolve_device(device)
    autocast_dtype = autocast_for(dtype)

    loaded = []
    for path in paths:
        model, tokenizer, config, state = load_for_evaluation(path, overrides, device=str(device))
        block = config.model.block_size
        these = [int(t) for t in lengths] if lengths is not None else \
            sorted({max(1, int(round(m * block))) for m in multiples})
        loaded.append((state["path"], model, tokenizer, config, these))
    longest = max(t for *_, these in loaded for t in these)

    results = []
    for index, (path, model, tokenizer, config, these) in enumerate(loaded):
        val = validation_tokens(config, tokenizer, quiet=quiet)
        available = len(val) - 1
        budget = available if max_tokens is None else min(max_tokens, available)
        if budget < longest:
            limited = "" if budget == available else f" (max_tokens={max_tokens})"
            raise EvaluationError(f"{path}: the validation split has {budget} scorable tokens{limited}, fewer than "
                                  f"the longest length {longest}: use shorter lengths or more text")
        n = budget // longest * longest
        tokens = torch.from_numpy(np.asarray(val[:n + 1], dtype=np.int64))
        chars = len(tokenizer.decode(tokens[1:].tolist()))
        position = config.model.position
        label = labels[index] if labels is not None else _default_label(path, overrides, position)
        limit = model.positions.position_limit()
        runnable = [t for t in these if limit is None or t <= limit]
        total = sum(len(windows(n, t, mode, stride)) for t in runnable)
        started = time.time()
        with tqdm(total=total, desc=f"eval {label}", unit="window", file=sys.stderr, disable=quiet,
                  leave=False) as bar:
            for t in these:
                common = dict(label=label, checkpoint=path, position=describe_position(position),
                              train_length=config.model.block_size, length=t, mode=mode,
                              stride=(stride or max(1, t // 2)) if mode == "sliding" else None,
                              tokens=n, chars=chars)
                if t not in runnable:
                    results.append(Result(nll=None, status="bounded", **common))
                    continue
                nll = score(model, tokens, t, mode, stride, batch_tokens=batch_tokens,
                            autocast_dtype=autocast_dtype, progress=bar)
                results.append(Result(nll=nll, **common))
        if not quiet:
            print(f"[eval] {label}: {len(runnable)} lengths x {n:,} tokens in {time.time() - started:.1f}s; "
                  f"peak memory so far {peak_memory()}", file=sys.stderr, flush=True)
    return results


def peak_memory() -> str:
    """This process's peak resident memory (max RSS) so far, e.g. '612 MB' ('n/a' off Unix)."""
    try:
        import resource
    except ImportError:
        return "n/a"
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return f"{kb / (1024 * 1024 if sys.platform == 'darwin' else 1024):.0f} MB"  # bytes on macOS, KiB on Linux


def _default_label(path: str, overrides: Sequence[str], position: dict) -> str:
    path = os.path.abspath(path)
    name = os.path.basename(os.path.dirname(path)) if path.endswith(".pt") else os.path.basename(path)
    if any(o.lstrip("-").startswith("model.position") for o in overrides):
        name += f" [{describe_position(position)}]"
    return name


# --------------------------------------------------------------------------- output

def markdown_table(results: Sequence, what: str = "ppl") -> str:
    """A wide markdown table: one row per label, one column per evaluated length."""
    lengths = sorted({r.length for r in results})
    rows: dict = {}
    for r in results:
        rows.setdefault(r.label, {"position": r.position, "train": r.train_length})[r.length] = r.cell(what)
    title = "perplexity" if what == "ppl" else "bits/char"
    lines = ["| model | position | train length | " + " | ".join(f"{title} @ {t}" for t in lengths) + " |",
             "|" + "---|" * (3 + len(lengths))]
    for label, row in rows.items():
        cells = [row.get(t, "") for t in lengths]
        lines.append(f"| {label} | {row['position']} | {row['train']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(results: Sequence, path: str) -> str:
    """One line per cell: every Result field plus ppl and bpc (empty when not run)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = None
        for r in results:
            row = {**asdict(r), "ppl": "" if r.ppl is None else f"{r.ppl:.6g}",
                   "bpc": "" if r.bpc is None else f"{r.bpc:.6g}"}
            row["nll"] = "" if r.nll is None else f"{r.nll:.6g}"
            row["stride"] = "" if r.stride is None else r.stride
            if writer is None:
                writer = csv.DictWriter(f, fieldnames=list(row))
                writer.writeheader()
            writer.writerow(row)
    return path


def have_matplotlib() -> bool:
    import importlib.util
    return importlib.util.find_spec("matplotlib") is not None


def plot(results: Sequence, path: str, title: str = "perplexity vs evaluation length",
         dashed: Sequence[str] = ()) -> str:
    """PNG of perplexity against length (log x; log y too when it spans more than 10x), one line per label (``dashed`` labels dashed);
    a dotted vertical line at each distinct training length. Needs matplotlib (object API, no
    pyplot, no display)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter, ScalarFormatter
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    labels = list(dict.fromkeys(r.label for r in results))
    for label in labels:
        points = sorted((r.length, r.ppl) for r in results if r.label == label and r.ppl is not None)
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label,
                    linestyle="--" if label in dashed else "-")
    for train in sorted({r.train_length for r in results}):
        ax.axvline(train, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({r.length for r in results}))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    values = [r.ppl for r in results if r.ppl is not None]
    wide = bool(values) and max(values) > 10 * min(values)
    if wide:  # a log axis keeps blown-up curves from flattening the others
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("evaluation length (tokens); dotted: training length")
    ax.set_ylabel("validation perplexity" + (" (log scale)" if wide else ""))
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    return path
