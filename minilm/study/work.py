"""The work a study's jobs do in the worker processes (``minilm.study.jobs``): train one run,
evaluate one checkpoint, probe one checkpoint's retrieval. Module-level functions, so that a
worker process can import them by name."""

from __future__ import annotations

import torch

from minilm.checkpoints.loading import load_model
from minilm.common import resolve_device
from minilm.config import build_config
from minilm.data import corpus as data
from minilm.data.retrieval import Task
from minilm.evaluation import lengths as evaluation
from minilm.evaluation import retrieval
from minilm.study.jobs import Interrupted
from minilm.training.loop import train


def train_job(config_tree: dict) -> dict:
    """Train one run of the study. Its out_dir is the study's own (under ``<out>/runs``, which the
    command refuses to reuse unless told to), so a run left there by an interrupted study is replaced.
    A run that Ctrl-C or SIGTERM stops part way (its checkpoint saved) is no result: ``Interrupted``."""
    summary = train(build_config(config_tree), quiet=True, overwrite=True)
    if summary["interrupted"]:
        raise Interrupted(summary["interrupted"])
    return {k: v for k, v in summary.items() if k != "sample"}


def evaluate_job(
    path: str, lengths: list, modes: list, overrides: list, settings: dict, device: str, seed: int, split: str = "val"
) -> list:
    """Results of one checkpoint at ``lengths`` in ``modes`` on ``split`` (val, or the holdout of
    the train split); ``settings`` is the plan's eval section, with ``truncate`` (a length, or None)
    where the loss by position is also wanted with the context cut to that length (its windows advance
    by ``truncated_stride``: ``minilm.evaluation.lengths.truncated_curve``).
    torch's generator starts from ``seed`` (what a scheme that draws its positions at evaluation
    reads), so a job gives the same numbers in whichever worker, after whichever job, it runs."""
    torch.manual_seed(seed)
    return evaluation.evaluate_checkpoints(
        [path],
        lengths=lengths,
        mode=modes,
        max_tokens=settings["max_tokens"],
        fixed_stride=settings["fixed_stride"],
        position_bin=settings["position_bin"],
        truncate=settings.get("truncate"),
        truncated_stride=settings.get("truncated_stride"),
        overrides=overrides,
        labels=["-"],
        batch_tokens=settings["batch_tokens"],
        device=device,
        quiet=True,
        split=split,
    )


def retrieval_job(
    path: str,
    overrides: list,
    lengths: list,
    depths: list,
    trials: int,
    seed: int,
    device: str,
    split: str = "val",
    keys: int = 1,
) -> list:
    """Retrieval rows {length, depth, correct, trials, logprob, keys, distance} of one checkpoint
    (``minilm.evaluation.retrieval``) over ``split`` (val, or the holdout of the train split: the tuning's):
    the single needle's probes, then with ``keys`` > 1 the multi-key probes (``keys`` pairs, one asked) at
    the same lengths and depths. The probes depend on ``seed`` only (each set starts its own generator from
    it); torch's generator starts from ``seed``, as in ``evaluate_job``."""
    torch.manual_seed(seed)
    model, tokenizer, config, _ = load_model(path, overrides, device=resolve_device(device))
    prepared = data.prepare(config.data, quiet=True, tokenizer=tokenizer)
    task, tokens = Task.from_tokens(prepared.train, config.model.vocab_size), prepared.tokens(split)
    return [
        row
        for count in ([1, keys] if keys > 1 else [1])
        for row in retrieval.accuracy(model, task, tokens, lengths, depths, trials=trials, seed=seed, keys=count)
    ]
