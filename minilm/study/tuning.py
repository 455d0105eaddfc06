"""Each scheme's learning rate, chosen by one procedure on held-out training text (issue #47).

The study's baselines share one recipe, but one rate does not suit every scheme alike (T5's
and FIRE's learned biases, learned positions' table). So no scheme's rate is guessed: before the
study's own seeds train anything, every kind is trained from scratch at each rate of
``train.lr`` x ``tuning.lr_scales`` (min_lr in proportion) on the *tuning seeds*
(``tuning.seeds``, disjoint from the study's seeds, so that no model a claim reads was used to
tune), and each run is scored at L on the held-out end of the train split
(``data.holdout_tokens``: text no run trains on; never the validation split the report reads).
The scale with the lowest mean log perplexity over the tuning seeds is the kind's (``choose``;
the scale nearer 1 on a tie, a scale that diverged on any tuning seed is out), and every run of
that kind at the study's seeds, from scratch and the oracle, trains at it. The kind's settings
in the plan's ``schemes`` section (T5's table rate) apply on top, as everywhere.
"""

from __future__ import annotations

import math
from typing import Optional

from minilm.common import MinilmError, markdown_table
from minilm.study.claims import mean_log_perplexity, per_seed
from minilm.study.stats import interval

SECTION = "tuning"  # the cells of the tuning runs, and the runs' section
MODE = "nonoverlapping"


class TuningError(MinilmError):
    """No rate could be chosen for a kind; the message is one line for the user."""


def scales(plan: dict) -> list:
    return list(plan.get(SECTION, {}).get("lr_scales", []))


def seeds(plan: dict) -> list:
    return list(plan.get(SECTION, {}).get("seeds", []))


def rates(plan: dict, scale: float) -> dict:
    """The train settings of ``scale`` x the plan's rate (min_lr in proportion)."""
    t = plan["train"]
    return {"lr": t["lr"] * scale, "min_lr": t["min_lr"] * scale}


def label(kind: str, scale: float) -> str:
    return f"{kind} x{scale:g}"


def run_name(kind: str, scale: float, seed: int) -> str:
    return f"{kind}-lr{scale:g}-t{seed}"


def build(study, kinds) -> dict:
    """Add the tuning runs of ``kinds`` and their held-out evaluations to ``study``; returns
    {kind: the keys of its evaluation jobs}, which the kind's runs at the study's seeds wait for."""
    keys: dict = {}
    for kind in kinds:
        for seed in seeds(study.plan):
            for scale in scales(study.plan):
                name = run_name(kind, scale, seed)
                key = study._train(
                    name,
                    SECTION,
                    label(kind, scale),
                    seed,
                    {"kind": kind},
                    "tune each scheme's rate",
                    settings={"train": rates(study.plan, scale)},
                )
                keys.setdefault(kind, []).append(
                    study._evaluate(
                        key,
                        study.runs[name].config.out_dir,
                        [1],
                        [MODE],
                        dict(section=SECTION, label=label(kind, scale), seed=seed, step=None),
                        phase="evaluate the tuning runs on held-out training text",
                        split="holdout",
                    )
                )
    return keys


def choose(plan: dict, cells: list, kind: str) -> float:
    """The scale of ``kind`` with the lowest mean log perplexity over the tuning seeds at L on the
    held-out text (module docstring); a ``TuningError`` when every scale diverged."""
    L = plan["model"]["block_size"]
    scores = {scale: mean_log_perplexity(cells, SECTION, label(kind, scale), L, MODE) for scale in scales(plan)}
    scores = {scale: score for scale, score in scores.items() if score is not None}
    if not scores:
        raise TuningError(
            f"no rate of tuning.lr_scales={scales(plan)} x train.lr={plan['train']['lr']:g} gave {kind} "
            f"a finite held-out perplexity on every tuning seed: try smaller scales"
        )
    return min(sorted(scores, key=lambda s: abs(math.log(s))), key=lambda s: scores[s])


def report_lines(plan: dict, cells: list, chosen: Optional[dict]) -> list:
    """The tuning's table for the report: held-out perplexity at L per kind and scale."""
    if not scales(plan) or not chosen:
        return []
    L = plan["model"]["block_size"]

    return [
        f"Each scheme's learning rate, chosen on held-out training text: every kind trained from scratch at "
        f"{', '.join(f'{s:g}' for s in scales(plan))} x lr {plan['train']['lr']:g} on the tuning seeds "
        f"{', '.join(map(str, seeds(plan)))} (none of them a seed of the tables), perplexity at L = {L} on the last "
        f"{plan['data']['holdout_tokens']:,} tokens of the train split (mean over tuning seeds; bold: chosen, the "
        f"lowest mean log perplexity):",
        "",
        choice_table(cells, SECTION, chosen, scales(plan), label, L, "scheme", [f"x{s:g}" for s in scales(plan)]),
        "",
    ]


def choice_table(
    cells,
    section: str,
    chosen: dict,
    options,
    cell_label,
    length: int,
    what: str,
    headers,
    names: Optional[dict] = None,
) -> str:
    """Held-out perplexity at ``length`` (mean ± interval over the tuning seeds) of each row of
    ``chosen`` ({row: the option chosen for it}) at each of ``options`` (cells labelled
    ``cell_label(row, option)``), the chosen one in bold, and the choice: the tuning's table and
    the sweep's."""

    def ppl(row, option):
        values = list(per_seed(cells, section, cell_label(row, option), length, MODE).values())
        text = interval(values).format() if values else ""
        return f"**{text}**" if chosen.get(row) == option else text

    rows = [[(names or {}).get(row, row)] + [ppl(row, o) for o in options] + [f"{chosen[row]:g}"] for row in chosen]
    return markdown_table([what, *headers, "chosen"], rows, "l" + "r" * (len(options) + 1))


def check(plan: dict) -> Optional[str]:
    """What is wrong with the plan's tuning section (None: nothing)."""
    if SECTION not in plan or not scales(plan):
        return None
    if not seeds(plan) or set(seeds(plan)) & set(plan["seeds"]) or any(not s > 0 for s in scales(plan)):
        return (
            f"tuning={plan[SECTION]} is invalid: expected lr_scales > 0 and tuning seeds disjoint from the "
            f"study's seeds {plan['seeds']}"
        )
    if plan["data"]["holdout_tokens"] <= plan["model"]["block_size"]:
        return (
            f"data.holdout_tokens={plan['data']['holdout_tokens']} is too few for the tuning: it "
            "scores L-token segments"
        )
    return None
