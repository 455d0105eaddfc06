"""Every claim's verdict at two training lengths, side by side (issue #58): the replication's report reads
the record of the study it replicates (``replicates`` in its plan: the directory of that study's
``study.json``, e.g. ``reports/length-generalization``) and tests that study's claims again, as the
record holds them, with this code, beside its own.

``tested(study)`` gives (alpha, outcomes) of a study's claims file, the one the run recorded when it started
(``minilm.study.primary.snapshot``) or else the file as it is now; ``side_by_side(study, repo)`` the report's
section: one row per claim id of either file, its estimate, Holm-adjusted p and verdict at each L, and whether
the verdict is the same.
"""

from __future__ import annotations

import json
import os

from minilm.common import markdown_table as table
from minilm.study.plan import Study
from minilm.study.primary import outcomes, path_for, recorded_test


def tested(study: Study) -> tuple:
    """(alpha, [Outcome, ...]) of the claims ``study`` recorded when it ran (else its plan's file as it is now)."""
    path, recorded, rows = path_for(study.plan["experiment"]), study.claims, study.retrieval + study.passkey
    if recorded:
        return outcomes(study.cells, rows, study.plan, path, recorded["text"], recorded_test(recorded))
    return outcomes(study.cells, rows, study.plan, path)


def replicated(study: Study, repo: str) -> tuple:
    """(the directory of the study that ``study`` replicates, that study or None when its record is missing,
    the commit its run was at); (None, None, None) for a plan that replicates nothing."""
    where = study.plan.get("replicates")
    if not where:
        return None, None, None
    path = where if os.path.isabs(where) else os.path.join(repo, where)
    try:
        with open(os.path.join(path, "study.json"), encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        return where, None, None
    return where, Study.from_state(state, path), state.get("run", {}).get("commit")


def _cells(outcome) -> list:
    if outcome is None:
        return ["not a claim here", "", ""]
    p = "n/a" if outcome.p is None else f"{outcome.adjusted:.3g}"
    return [outcome.estimate, p, outcome.verdict if outcome.p is not None else "not tested"]


def _same(a, b) -> str:
    if a is None or b is None:
        return ""
    shown = [o.verdict if o.p is not None else "not tested" for o in (a, b)]
    return "same" if shown[0] == shown[1] else "**changed**"


def side_by_side(study: Study, number: int, repo: str) -> list:
    """The report's section ``number``: every claim's verdict in the study ``study`` replicates and in
    ``study``, row by row (nothing when its plan replicates nothing)."""
    where, first, commit = replicated(study, repo)
    if where is None:
        return []
    title = f"## {number}. Every claim's verdict at both training lengths"
    if first is None:
        return [
            title,
            "",
            f"The record of the study this one replicates, `{where}/study.json`, is missing: run it "
            f"(its confirmatory command), then `--report-only` here.",
            "",
        ]
    (_, before), (_, after) = tested(first), tested(study)
    ours, theirs = {o.claim.id: o for o in after}, {o.claim.id: o for o in before}
    ids = [o.claim.id for o in before] + [i for i in ours if i not in theirs]
    L0, L1 = first.plan["model"]["block_size"], study.plan["model"]["block_size"]
    rows = [[i, *_cells(theirs.get(i)), *_cells(ours.get(i)), _same(theirs.get(i), ours.get(i))] for i in ids]
    head = ["claim"] + [f"{what}, L = {L}" for L in (L0, L1) for what in ("estimate", "Holm p", "verdict")]
    changed = sum(r[-1] == "**changed**" for r in rows)
    return [
        title,
        "",
        f"L = {L0}: `{where}` (its run at commit `{(commit or 'unknown')[:12]}`, its claims as it recorded them, "
        f"Holm over its own family of {len(before)}); L = {L1}: this run (Holm over its family of {len(after)}). "
        f"Each family is corrected on its own, so a verdict can change with the family's size as well as with L. "
        f"Verdicts that differ: {changed} of the {sum(bool(r[-1]) for r in rows)} claims in both files. Which "
        f"verdicts were expected to change with L, and why, is written in this run's claims file.",
        "",
        table(head + ["verdict at both"], rows, "llllllll"),
        "",
    ]
