"""The extension's fine-tuning rates, each chosen on held-out training text at the tuning seeds
(issues #27, #47, #58).

No extension row's rate is guessed, and no row borrows another's: in the tuning step
(``minilm.study.tune``), after each kind's scale is chosen, every row of the extension (each rope
scaling method, the other schemes' interpolations, the keep-training control) is fine-tuned at
each rate of its grid (``sweep.lrs`` to start with, a grid from 1e-4 to 1e-3 in the full study),
as its runs are, from the model of its source kind at each *tuning seed* (trained at the scale
chosen for that kind; no table reads them), and each run is scored at factor x L on the held-out
end of the train split (``data.holdout_tokens``), never on the validation split the report reads.
The rate with the lowest mean log perplexity over the tuning seeds is the row's (``choose``; the
smaller rate on a tie; a rate that diverged is out); a choice at either end of the grid extends
it (``tuning.extend``) and the step sweeps again. The cosine ends at the same fraction of the rate
as ``finetune`` says (min_lr / lr). Tuned for perplexity: the rate that extends text best is not
necessarily the one that retrieves best, and the report's retrieval tables say what it did.
Without ``sweep.lrs`` every row uses ``finetune.lr`` as written.
"""

from __future__ import annotations

from typing import Optional

from minilm.common import MinilmError
from minilm.study import tuning
from minilm.study.claims import mean_log_perplexity
from minilm.study.extension import LABEL_NAMES, extension_runs

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


def cell_label(label: str, lr: float) -> str:
    return f"{label} {lr:g}"


def build(study, pairs) -> None:
    """Add to ``study`` the sweep's fine-tuning runs of each (extension row, rate) of ``pairs`` at
    every tuning seed, from the tuning run of the row's source kind at its chosen scale
    (``study.lr_scales``), and their held-out evaluations at factor x L."""
    plan = study.plan
    factor = plan["extension"]["factor"]
    runs = extension_runs(plan)
    for label, lr in pairs:
        kind, position, kw = runs[label]
        for seed in tuning.seeds(plan):
            name = f"{label}-lr{lr:g}-t{seed}"
            key = study._train(
                name,
                SECTION,
                cell_label(label, lr),
                seed,
                position,
                "sweep the fine-tuning rates",
                init_from=study.tuned_source(kind, seed),
                finetune=finetune_at(plan, lr),
                **kw,
            )
            study._evaluate(
                key,
                study.runs[name].config.out_dir,
                [factor],
                [MODE],
                dict(section=SECTION, label=cell_label(label, lr), seed=seed, step=None),
                phase="evaluate the sweep on held-out training text",
                split="holdout",
            )


def choose(plan: dict, cells: list, label: str, grid) -> float:
    """The rate of extension row ``label`` in ``grid`` with the lowest mean log perplexity over the
    tuning seeds at factor x L on the held-out text (the smaller rate on a tie; a rate with a
    non-finite perplexity on any seed is out); a ``SweepError`` when no rate is left."""
    long = int(plan["extension"]["factor"] * plan["model"]["block_size"])
    scores = {lr: mean_log_perplexity(cells, SECTION, cell_label(label, lr), long, MODE) for lr in grid}
    scores = {lr: score for lr, score in scores.items() if score is not None}  # a rate that diverged is out
    if not scores:
        raise SweepError(
            f"no rate of {sorted(grid)} gave {label} a finite held-out perplexity at {long} "
            f"tokens on every tuning seed: try smaller sweep.lrs"
        )
    return min(sorted(scores), key=lambda lr: scores[lr])


def report_lines(plan: dict, cells: list, chosen: dict, grids: Optional[dict] = None) -> list:
    """The sweep's table for the report: held-out perplexity at factor x L per row and rate tried
    (``grids``: {row: its rates}; without it, the plan's)."""
    if not rates(plan) or not chosen:
        return []
    long = int(plan["extension"]["factor"] * plan["model"]["block_size"])
    tried = sorted({lr for grid in (grids or {}).values() for lr in grid} or set(rates(plan)))

    return [
        "Fine-tuning rates, chosen on held-out training text"
        + (
            " in the tuning step (frozen before this run): each row fine-tuned at each rate of its grid (extended past "
            "any choice at its edge; blank: not tried)"
            if grids
            else ": each row fine-tuned at each rate"
        )
        + f" from the "
        f"tuning seeds' models ({', '.join(map(str, tuning.seeds(plan)))}; none of them a seed of the tables), "
        f"perplexity at {long} on the last {plan['data']['holdout_tokens']:,} tokens of the train split (held out "
        f"of every run; never the validation split), mean over tuning seeds; bold: chosen, the lowest mean log "
        f"perplexity:",
        "",
        tuning.choice_table(
            cells,
            SECTION,
            chosen,
            tried,
            cell_label,
            long,
            "method",
            [f"lr {lr:g}" for lr in tried],
            LABEL_NAMES,
        ),
        "",
    ]
