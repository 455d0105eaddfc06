"""The tuning step (issue #58): run once, before any confirmatory run, and frozen.

``python -m minilm experiment NAME --tune`` chooses, on the tuning seeds only:

1. each kind's scale of ``train.lr`` (``minilm.study.tuning``: held-out perplexity at L, a scale
   whose models fail the retrieval task rejected where another scale learns it), in rounds: a kind
   whose choice sits at an end of its grid gets the next scale past that end, and is tuned again, until every choice is
   inside its grid (at most ``tuning.MAX_EXTENSIONS`` added scales, else a ``TuningError``);
2. then each extension row's fine-tuning rate (``minilm.study.sweep``), from the tuning runs at
   the chosen scales, in rounds the same way.

Each round runs only its new jobs (``minilm.study.jobs``, in the study's journal, so an
interrupted step resumes). The choices, the grids as tried, the rejections and every held-out
cell are written to the rates file (``minilm.study.rates``) that the study then reads.
"""

from __future__ import annotations

from minilm.study import rates, sweep, tuning
from minilm.study.extension import extension_runs
from minilm.study.jobs import run_jobs
from minilm.study.provenance import busy_seconds
from minilm.study.sweep import SweepError
from minilm.study.tuning import MAX_EXTENSIONS, TuningError


def _run_round(study, build, done: dict) -> tuple:
    """Build a round's jobs with ``build()``, run only those, and return (cells, retrieval rows) of
    every job finished so far."""
    first = len(study.jobs)
    build()
    done.update(run_jobs(study.jobs[first:], workers=study.workers, quiet=study.quiet, journal=study.journal))
    cells, retrieval = [], []
    for key, read in study._readers:
        if key in done:
            (retrieval if key.startswith("retrieval") else cells).extend(read(done[key].value))
    return cells, retrieval


def _rounds(grids: dict, build, choose, what: str) -> dict:
    """Choose for every row of ``grids`` ({row: its values}), extending a grid past a choice at its
    edge and running again (``build(pairs)`` adds the runs of (row, value) pairs; ``choose(row,
    grid)`` reads the results so far); returns {row: its choice}."""
    chosen, todo, added = {}, [(row, v) for row, grid in grids.items() for v in grid], {row: 0 for row in grids}
    while todo:
        build(todo)
        todo = []
        for row in [r for r in grids if r not in chosen]:
            choice = choose(row, grids[row])
            beyond = tuning.extend(grids[row], choice)
            if beyond is None:
                chosen[row] = choice
            elif added[row] == MAX_EXTENSIONS:
                raise TuningError(
                    f"{what} of {row} is still at the edge of {sorted(grids[row])} after {MAX_EXTENSIONS} "
                    f"extensions: widen the grid"
                )
            else:
                grids[row].append(beyond)
                added[row] += 1
                todo.append((row, beyond))
    return chosen


def run_tuning(study, kinds, about: dict) -> dict:
    """The tuning step of ``study`` (a ``minilm.study.plan.Study`` of the plan to tune) for ``kinds``;
    returns the rates file's contents (``rates.record``), ``about`` recorded in it with the step's
    ``minutes`` (the union of its jobs' running times) and ``process_minutes`` (their sum)."""
    plan, done, results = study.plan, {}, {"cells": [], "retrieval": []}

    def build(make):
        def run(pairs):
            results["cells"], results["retrieval"] = _run_round(study, lambda: make(pairs), done)

        return run

    grids = {kind: sorted(tuning.scales(plan)) for kind in kinds}
    study.lr_scales = _rounds(
        grids,
        build(lambda pairs: tuning.build(study, pairs)),
        lambda kind, grid: tuning.choose(plan, results["cells"], results["retrieval"], kind, grid),
        "the rate scale",
    )
    rejected = {
        kind: out
        for kind in kinds
        if (out := tuning.rejected(plan, results["cells"], results["retrieval"], kind, grids[kind]))
    }
    failures = tuning.task_failures(plan, results["retrieval"], grids)
    rows = {row: sorted(sweep.rates(plan)) for row in extension_runs(plan)} if sweep.rates(plan) else {}
    try:
        finetune_lrs = _rounds(
            rows,
            build(lambda pairs: sweep.build(study, pairs)),
            lambda row, grid: sweep.choose(plan, results["cells"], row, grid),
            "the fine-tuning rate",
        )
    except TuningError as exc:
        raise SweepError(str(exc)) from None
    about = {  # the jobs' running time, over every invocation of a resumed step (not the last one's wall time)
        **about,
        "minutes": round(busy_seconds(done) / 60, 1),
        "process_minutes": round(sum(d.ended - d.started for d in done.values()) / 60, 1),
    }
    contents = rates.record(
        plan,
        {"scales": study.lr_scales, "finetune_lrs": finetune_lrs},
        {"scales": grids, "finetune_lrs": rows},
        rejected,
        [c for c in results["cells"] if c["section"] in (tuning.SECTION, sweep.SECTION)],
        [r for r in results["retrieval"] if r["section"] == tuning.SECTION],
        about,
    )
    contents["task_failures"] = failures  # kinds below tuning.task_floor at every scale: chosen by perplexity
    return contents
