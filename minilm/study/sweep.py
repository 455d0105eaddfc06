"""The fine-tuning learning-rate sweep of the length-generalization study (issue #27).

The extension's learning rate is not guessed: before any extension run starts, each seed's
rope model is fine-tuned to factor x L with ``sweep.method`` at every rate of ``sweep.lrs``,
with the extension's budget, and each run is scored at factor x L
on text held out of the train split (``data.holdout_tokens``: text no run of the study trained
on), never on the validation split that the report's tables read. The rate with the lowest
mean log perplexity over seeds there is the one every extension run and the keep-training
control use (``choose``); the cosine ends at the same fraction of it as ``finetune`` says
(min_lr / lr). Without ``sweep.lrs`` the extension uses ``finetune.lr`` as written.

One rate serves every method, as in the papers, and it is tuned for one of them: the study
tunes it for direct fine-tuning (``none``), the baseline its claims say PI and YaRN beat, so a
tuned rate can only make those claims harder to support. (The sweep's run at the chosen rate is
the same run as that method's extension run; it is trained twice, a few seconds each.)
"""
from __future__ import annotations

import os
from typing import Optional

from minilm.common import MinilmError, markdown_table
from minilm.study.claims import mean_log_perplexity, paired_ratio, per_seed
from minilm.study.extension import METHOD_NAMES
from minilm.study.stats import interval

SECTION = "sweep"  # the cells of the sweep, and the runs' section
MODE = "nonoverlapping"  # how the sweep scores the held-out text


class SweepError(MinilmError):
    """The sweep could not choose a rate; the message is one line for the user."""


def rates(plan: dict) -> list:
    return list(plan.get(SECTION, {}).get("lrs", []))


def finetune_at(plan: dict, lr: Optional[float]) -> dict:
    """The plan's fine-tuning settings at peak rate ``lr`` (None: as written), min_lr in proportion."""
    ft = plan["finetune"]
    return dict(ft) if lr is None else {**ft, "lr": lr, "min_lr": lr * ft["min_lr"] / ft["lr"]}


def label(lr: float) -> str:
    return f"{lr:g}"


def build(study) -> list:
    """Add the sweep's fine-tuning runs and their held-out evaluations to ``study``; returns the
    keys of the evaluation jobs, which the tuned runs wait for."""
    plan, L = study.plan, study.L
    method, factor = plan[SECTION]["method"], plan["extension"]["factor"]
    long = int(factor * L)
    position = {"kind": "rope", **({"scaling": {"type": method, "factor": factor}} if method != "none" else {})}
    keys = []
    for seed in plan["seeds"]:
        source = f"rope-s{seed}"
        for lr in rates(plan):
            name = f"rope-{method}-{long}-lr{label(lr)}-s{seed}"
            key = study._train(name, SECTION, label(lr), seed, position, "sweep the fine-tuning rate",
                               after=[f"train {source}"], source=source,
                               init_from=os.path.join(study.runs_dir, source), block_size=long,
                               finetune=finetune_at(plan, lr))
            keys.append(study._evaluate(key, study.runs[name].config.out_dir, [1, factor], [MODE],
                                        dict(section=SECTION, label=label(lr), seed=seed, step=None),
                                        phase="evaluate the sweep on held-out training text", split="holdout"))
    return keys


def choose(plan: dict, cells: list) -> Optional[float]:
    """The swept rate with the lowest mean log perplexity over seeds at factor x L on the
    held-out text (the smaller rate on a tie; a rate with a non-finite perplexity on any seed is
    out); None without a sweep, a ``SweepError`` when no rate is left."""
    long = int(plan["extension"]["factor"] * plan["model"]["block_size"])
    scores = {lr: mean_log_perplexity(cells, SECTION, label(lr), long, MODE) for lr in rates(plan)}
    scores = {lr: score for lr, score in scores.items() if score is not None}  # a rate that diverged is out
    if rates(plan) and not scores:
        raise SweepError(f"no rate of sweep.lrs={rates(plan)} gave a finite held-out perplexity at {long} tokens on "
                         f"every seed: try smaller rates")
    return min(sorted(scores), key=lambda lr: scores[lr]) if scores else None


def report_lines(plan: dict, cells: list, chosen: Optional[float]) -> list:
    """The sweep's table for the report: held-out perplexity at L and factor x L per rate."""
    if not rates(plan):
        return []
    L, factor = plan["model"]["block_size"], plan["extension"]["factor"]
    lengths = [L, int(factor * L)]

    def ppl(lr, t):
        values = list(per_seed(cells, SECTION, label(lr), t, MODE).values())
        return interval(values).format() if values else ""

    def ratio(lr):  # paired, per seed, against the chosen rate at factor x L
        values = [] if chosen is None else paired_ratio(cells, (SECTION, label(lr), lengths[1], None),
                                                        (SECTION, label(chosen), lengths[1], None), MODE)
        return "-" if lr == chosen else (interval(values).format(3) if values else "")

    rows = [[f"{lr:g}" + (" (chosen)" if lr == chosen else "")] + [ppl(lr, t) for t in lengths] + [ratio(lr)]
            for lr in rates(plan)]
    return [f"Fine-tuning learning rate, chosen on held-out training text: fine-tuning of each seed's rope model "
            f"({METHOD_NAMES[plan[SECTION]['method']]}) at each rate, perplexity on the last {plan['data']['holdout_tokens']:,} tokens of "
            f"the train split (held out of every run; never the validation split), mean ± 95% interval over seeds. "
            f"The lowest mean log perplexity at {lengths[1]} chooses the rate of every extension run:", "",
            markdown_table(["peak lr"] + [f"held-out ppl at {t}" for t in lengths]
                           + [f"/ the chosen rate's at {lengths[1]} (paired)"], rows, "lrrr"), ""]
