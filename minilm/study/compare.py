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

from minilm.common import MinilmError
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
    """(the directory of the study that ``study`` replicates (the plan's ``replicates``: absolute, or relative to
    the current directory, else to the checkout ``repo``), (that study, its outcomes, its run's record) or None,
    what is wrong with its record or None); (None, None, None) for a plan that replicates nothing."""
    where = study.plan.get("replicates")
    if not where:
        return None, None, None
    path = next((p for p in (where, os.path.join(repo, where)) if os.path.isdir(p)), where)
    record = os.path.join(path, "study.json")
    if not os.path.exists(record):
        return where, None, f"its record, `{where}/study.json`, is missing"
    try:
        with open(record, encoding="utf-8") as f:
            state = json.load(f)
        first = Study.from_state(state, path)
        return where, (first, tested(first)[1], state.get("run", {})), None
    except (OSError, ValueError, KeyError, TypeError, MinilmError) as exc:
        return where, None, f"its record, `{where}/study.json`, cannot be read: {exc}"


def _cells(outcome) -> list:
    if outcome is None:
        return ["not a claim here", "", ""]
    if outcome.p is None:
        return [outcome.estimate, "n/a", "not tested"]
    return [outcome.estimate, f"{outcome.adjusted:.3g}", outcome.verdict]


def _same(a, b) -> str:
    """Whether claim outcomes ``a`` and ``b`` reached the same verdict ('' where the claim is in one file only)."""
    if a is None or b is None:
        return ""
    if a.p is None or b.p is None:
        return "not comparable (untested)"
    return "same" if a.verdict == b.verdict else "**changed**"


def _design(first: Study, run: dict) -> str:
    """What a reader needs to judge the replicated run (``run``: its record's command, commit, ...): its commit,
    seeds, and where its rates and claims came from."""
    commit = (run.get("commit") or "unknown")[:12]
    seeds = len(first.plan["seeds"])
    rates = "frozen by a tuning step before it ran" if first.rates else "tuned within the run"
    claims = "its claims as it recorded them" if first.claims else "no claims recorded: the claims file as it is now"
    return f"its run at commit `{commit}`, {seeds} seeds, rates {rates}, {claims}"


def side_by_side(study: Study, number: int, repo: str) -> list:
    """The report's section ``number``: every claim's verdict in the study ``study`` replicates and in
    ``study``, row by row (nothing when its plan replicates nothing)."""
    where, found, problem = replicated(study, repo)
    if where is None:
        return []
    title = f"## {number}. Every claim's verdict at both training lengths"
    if problem:
        return [
            title,
            "",
            f"The study this one replicates: {problem}. Run it (its confirmatory command), then `--report-only` here.",
            "",
        ]
    first, before, run = found
    after = tested(study)[1]
    ours, theirs = {o.claim.id: o for o in after}, {o.claim.id: o for o in before}
    ids = [o.claim.id for o in before] + [i for i in ours if i not in theirs]
    L0, L1 = first.plan["model"]["block_size"], study.plan["model"]["block_size"]
    rows = [[i, *_cells(theirs.get(i)), *_cells(ours.get(i)), _same(theirs.get(i), ours.get(i))] for i in ids]
    head = ["claim"] + [f"{what}, L = {L}" for L in (L0, L1) for what in ("estimate", "Holm p", "verdict")]
    compared = [r for r in rows if r[-1] in ("same", "**changed**")]
    changed = sum(r[-1] == "**changed**" for r in compared)
    return [
        title,
        "",
        f"L = {L0}: `{where}` ({_design(first, run)}; Holm over its own family of {len(before)}); L = {L1}: this run "
        f"(Holm over its family of {len(after)}). Each family is corrected on its own, so a verdict can change with "
        f"the family's size as well as with L. Verdicts that differ: {changed} of the {len(compared)} claims tested "
        f"in both runs (a claim untested in either is not compared). Which verdicts were expected to change with "
        f"L, and why, is written in this run's claims file.",
        "",
        table(head + ["verdict at both"], rows, "llllllll"),
        "",
    ]
