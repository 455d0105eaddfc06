"""Each scheme's learning rate, chosen by one procedure on held-out training text (issues #47, #58).

The study's baselines share one recipe, but one rate does not suit every scheme alike (T5's
and FIRE's learned biases, learned positions' table). So no scheme's rate is guessed: in the
tuning step (``minilm.study.tune``), before any confirmatory run, every kind is trained from
scratch at each scale of its grid (``tuning.lr_scales`` x ``train.lr``, min_lr in proportion) on
the *tuning seeds* (``tuning.seeds``, disjoint from every test seed), and each run is scored at L
on the held-out end of the train split (``data.holdout_tokens``: text no run trains on; never the
validation split the report reads) and probed for the retrieval task at L on that same text.

``choose``: the scale with the lowest mean log perplexity over the tuning seeds (the scale nearer
1 on a tie). A scale is out when it diverged on any tuning seed, or when the kind *fails the task*
there: its retrieval accuracy at L, mean over the tuning seeds, below ``tuning.task_floor`` (a rate
that buys text at the task's expense is no rate for a study of retrieval) where another scale of the
grid reaches it. A kind below the floor at every scale is chosen by perplexity alone and listed in the
rates file (``task_failures``). ``extend``: a choice at either end of the grid adds the next scale past
it (the grid's own ratio), and the tuning step
tunes again, until every choice is inside its grid. The chosen scales are frozen in the rates file
(``minilm.study.rates``) that the confirmatory runs read.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from minilm.common import MinilmError, markdown_table
from minilm.study.claims import mean_log_perplexity, per_seed
from minilm.study.stats import interval

SECTION = "tuning"  # the cells of the tuning runs, and the runs' section
MODE = "nonoverlapping"
TASK_FLOOR = 0.5  # tuning.task_floor's default: a scale whose model retrieves fewer than half the needles at L is out
MAX_EXTENSIONS = 4  # scales a grid may gain past either end before the tuning step gives up


class TuningError(MinilmError):
    """No rate could be chosen for a kind; the message is one line for the user."""


def scales(plan: dict) -> list:
    return list(plan.get(SECTION, {}).get("lr_scales", []))


def seeds(plan: dict) -> list:
    return list(plan.get(SECTION, {}).get("seeds", []))


def task_floor(plan: dict) -> float:
    return float(plan.get(SECTION, {}).get("task_floor", TASK_FLOOR))


def rates(plan: dict, scale: float) -> dict:
    """The train settings of ``scale`` x the plan's rate (min_lr in proportion)."""
    t = plan["train"]
    return {"lr": t["lr"] * scale, "min_lr": t["min_lr"] * scale}


def label(kind: str, scale: float) -> str:
    return f"{kind} x{scale:g}"


def run_name(kind: str, scale: float, seed: int) -> str:
    return f"{kind}-lr{scale:g}-t{seed}"


def build(study, pairs: Sequence[tuple]) -> None:
    """Add to ``study`` the tuning runs of each (kind, scale) of ``pairs`` at every tuning seed,
    their held-out evaluations at L and their retrieval probes at L on the held-out text."""
    for kind, scale in pairs:
        for seed in seeds(study.plan):
            name = run_name(kind, scale, seed)
            where = dict(section=SECTION, label=label(kind, scale), seed=seed)
            position, model = study.arm(kind)
            key = study._train(
                name,
                SECTION,
                label(kind, scale),
                seed,
                position,
                "tune each scheme's rate",
                settings={"model": model, "train": rates(study.plan, scale)},
            )
            out_dir = study.runs[name].config.out_dir
            study._evaluate(
                key,
                out_dir,
                [1],
                [MODE],
                {**where, "step": None},
                phase="evaluate the tuning runs on held-out training text",
                split="holdout",
            )
            study._retrieval(key, out_dir, (), where, seed, "probe the tuning runs on held-out training text", [1])


def task_accuracy(retrieval: Sequence[dict], kind: str, scale: float) -> Optional[float]:
    """The retrieval accuracy at L of ``kind`` at ``scale`` over the tuning runs' probes (depths
    pooled per seed, then the mean over seeds); None where none was probed."""
    by_seed: dict = {}
    for row in retrieval:
        if row["section"] == SECTION and row["label"] == label(kind, scale) and row.get("correct") is not None:
            hits, trials = by_seed.get(row["seed"], (0, 0))
            by_seed[row["seed"]] = (hits + row["correct"], trials + row["trials"])
    if not by_seed:
        return None
    return sum(hits / trials for hits, trials in by_seed.values()) / len(by_seed)


def fails_task(plan: dict, retrieval: list, kind: str, scale: float) -> bool:
    """Whether ``kind`` at ``scale`` retrieves less than ``tuning.task_floor`` at L (mean over tuning seeds)."""
    accuracy = task_accuracy(retrieval, kind, scale)
    return accuracy is not None and accuracy < task_floor(plan)


def rejected(plan: dict, cells: list, retrieval: list, kind: str, grid: Sequence[float]) -> dict:
    """{scale: why it is out} of ``kind``'s ``grid``: it diverged on a tuning seed, or it failed the task
    where another scale of the grid did not (a kind that fails the task at every scale is chosen by its
    perplexity alone, and the rates file lists it: ``task_failures``)."""
    L, out = plan["model"]["block_size"], {}
    finite = [s for s in grid if mean_log_perplexity(cells, SECTION, label(kind, s), L, MODE) is not None]
    learns = any(not fails_task(plan, retrieval, kind, s) for s in finite)
    for scale in grid:
        accuracy = task_accuracy(retrieval, kind, scale)
        if scale not in finite:
            out[scale] = "diverged (no finite held-out perplexity on every tuning seed)"
        elif learns and fails_task(plan, retrieval, kind, scale):
            out[scale] = f"failed the task: {100 * accuracy:.1f}% retrieved at L, below {100 * task_floor(plan):g}%"
    return out


def task_failures(plan: dict, retrieval: list, grids: dict) -> list:
    """The kinds that fail the task at every scale of their grid (chosen by perplexity alone)."""
    return [kind for kind, grid in grids.items() if all(fails_task(plan, retrieval, kind, s) for s in grid)]


def choose(plan: dict, cells: list, retrieval: list, kind: str, grid: Sequence[float]) -> float:
    """The scale of ``kind`` in ``grid`` with the lowest mean log perplexity over the tuning seeds
    at L on the held-out text, among those not ``rejected`` (module docstring); a ``TuningError``
    when every scale is out."""
    L, out = plan["model"]["block_size"], rejected(plan, cells, retrieval, kind, grid)
    scores = {s: mean_log_perplexity(cells, SECTION, label(kind, s), L, MODE) for s in grid if s not in out}
    if not scores:
        reasons = "; ".join(f"x{s:g} {why}" for s, why in sorted(out.items()))
        raise TuningError(
            f"no scale of {sorted(grid)} x train.lr={plan['train']['lr']:g} is left for {kind} ({reasons}): "
            f"try other tuning.lr_scales"
        )
    return min(sorted(scores, key=lambda s: abs(math.log(s))), key=lambda s: scores[s])


def extend(grid: Sequence[float], choice: float) -> Optional[float]:
    """The next value past ``choice`` when it is at either end of the geometric ``grid`` (its
    ratio between the two end values nearest it), or None when the choice is inside the grid (or
    the grid has one value: nothing to extend by)."""
    values = sorted(grid)
    if len(values) < 2 or values[0] < choice < values[-1]:
        return None
    beyond = choice * values[-1] / values[-2] if choice == values[-1] else choice * values[0] / values[1]
    return float(f"{beyond:.6g}")  # 1e-3 x 10, not 0.009999999999999998


def report_lines(plan: dict, cells: list, chosen: Optional[dict], grids: Optional[dict] = None) -> list:
    """The tuning's table for the report: held-out perplexity at L per kind and scale tried
    (``grids``: {kind: its scales}; without it, the plan's)."""
    if not scales(plan) or not chosen:
        return []
    L = plan["model"]["block_size"]
    tried = sorted({s for grid in (grids or {}).values() for s in grid} or set(scales(plan)))
    return [
        "Each scheme's learning rate, chosen on held-out training text"
        + (" in the tuning step (frozen before this run)" if grids else "")
        + f": every kind trained from scratch at {', '.join(f'{s:g}' for s in scales(plan))} x lr "
        f"{plan['train']['lr']:g}{', the grid extended past any choice at its edge' if grids else ''}, on the tuning "
        f"seeds "
        f"{', '.join(map(str, seeds(plan)))} (none of them a seed of the tables), perplexity at L = {L} on the "
        f"last {plan['data']['holdout_tokens']:,} tokens of the train split (mean over tuning seeds; bold: chosen, "
        f"the lowest mean log perplexity"
        + (
            f" among the scales whose models retrieve at least {100 * task_floor(plan):g}% at L; blank: not tried):"
            if grids
            else "):"
        ),
        "",
        choice_table(cells, SECTION, chosen, tried, label, L, "scheme", [f"x{s:g}" for s in tried]),
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
    if len(set(scales(plan))) != len(scales(plan)):  # an edge choice would extend the grid by a ratio of 1
        return f"tuning.lr_scales={scales(plan)} is invalid: expected each scale once"
    if not 0 <= task_floor(plan) <= 1:
        return f"tuning.task_floor={task_floor(plan)} is invalid: expected an accuracy from 0 to 1"
    if plan["data"]["holdout_tokens"] <= plan["model"]["block_size"]:
        return (
            f"data.holdout_tokens={plan['data']['holdout_tokens']} is too few for the tuning: it "
            "scores L-token segments"
        )
    return None
