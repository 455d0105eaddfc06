"""The primary claims of a study: read from the file written before the run
(``minilm/study/registered/<experiment>.yaml``), each tested once, and corrected together.

A claim names its test (the file's header says what each computes):

* ``superiority`` and ``equivalence`` read perplexities: per seed r = ppl(a) / ppl(b)
  (paired: every scheme of a seed saw the same batches), and test the mean of log r over
  seeds with Student's t (``stats.t_test``) or with two one-sided tests against the margin
  (``stats.tost``, Schuirmann 1987). Log ratios make "10% better" and "10% worse" symmetric.
* ``proportion`` and ``difference`` read retrieval with the seed as the unit: each seed's
  accuracy (its probes, and depths unless the claim names one, counted together) is one value;
  ``proportion`` is the one-sample t-test of those values against the threshold, ``difference``
  the paired t-test of the per-seed differences a - b (every model of a seed sees the same
  probes). Pooling the probes of all seeds into one binomial sample would treat 3 x 32
  probes as 96 independent models. With ``metric: logprob`` a ``difference`` reads each seed's
  mean log-probability of the answers instead (nats), which ranks models that all retrieve at
  the ceiling. Retrieval past L is not read when the gate fails (``claims.gate``): such a
  claim is "not tested".

Each estimate carries the (1 - 2 alpha) interval over seeds (90% at alpha = 0.05): the
interval a one-sided test at level alpha decides on before any correction, and for TOST
exactly the interval that must lie inside the margins (Schuirmann 1987). The verdict reads the
Holm-adjusted p-value, so a claim whose interval clears its threshold may still be "not
supported" once the family is corrected. Seeds that agree exactly (retrieval saturated at 0%
or 100%) are tested by the sign test over seeds (``stats.t_test``), not by a zero-width interval.

Holm's step-down correction (``stats.holm``) runs over every claim of the file, a claim that
could not be tested entering with p = 1, so the family is the one written down, not the one
that happened to run. A claim is *supported* when its adjusted p-value is below ``alpha``;
otherwise *not supported* (which is not evidence of the opposite).

Whether the file was written before the run is read from git: the commit that last changed
it must be an ancestor of the run's commit (``registration``). When it is not, the report
labels the table exploratory.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
from typing import Optional

import yaml

from minilm.common import MinilmError
from minilm.study.claims import gate, paired_differences, paired_ratio, seed_accuracies
from minilm.study.stats import holm, interval, t_test, tost

REGISTERED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "registered")
TESTS = {"superiority": "perplexity", "equivalence": "perplexity", "proportion": "retrieval", "difference": "retrieval"}
CELL_KEYS = {"section", "label", "length", "step", "when", "depth"}


class ClaimsError(MinilmError):
    """A malformed claims file; the message is one line naming the claim and the key."""


@dataclasses.dataclass(frozen=True)
class Claim:
    """One claim of the claims file: what it says, its source, the test that decides it, the
    arm ``a`` (against ``b``) and the direction expected."""

    id: str
    claim: str
    source: str
    test: str
    a: dict
    b: Optional[dict] = None
    expect: Optional[str] = None
    threshold: Optional[float] = None
    margin: Optional[float] = None
    metric: str = "accuracy"  # retrieval: accuracy, or logprob (the answers' mean log-probability, nats)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One claim's test: the estimate as text, its p-value (None: not tested, and why) and,
    once the family is corrected, the adjusted p-value and the verdict."""

    claim: Claim
    estimate: str
    p: Optional[float]
    adjusted: Optional[float] = None
    verdict: str = ""


def path_for(experiment: str) -> str:
    return os.path.join(REGISTERED, f"{experiment}.yaml")


def read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise ClaimsError(f"cannot read the claims file {path!r}: {exc.strerror or exc}") from None


def load(path: str, text: Optional[str] = None) -> tuple:
    """(alpha, mode, [Claim, ...]) of a claims file (or of ``text``, the file as a run recorded
    it), checked key by key."""
    try:
        tree = yaml.safe_load(read(path) if text is None else text)
    except yaml.YAMLError as exc:
        raise ClaimsError(f"the claims file {path!r} is not YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(tree, dict) or not isinstance(tree.get("claims"), list) or not tree["claims"]:
        raise ClaimsError(f"{path}: expected a mapping with a non-empty list 'claims'")
    alpha = tree.get("alpha", 0.05)
    if not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ClaimsError(f"{path}: alpha={alpha!r} is invalid: expected a number between 0 and 1")
    claims = [_claim(path, entry) for entry in tree["claims"]]
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise ClaimsError(f"{path}: claim ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    return float(alpha), tree.get("mode", "nonoverlapping"), claims


def confirmatory_run(path: str, text: Optional[str] = None) -> tuple:
    """(the run the file names to test its claims, [earlier runs that tested claims of it]): the
    file's ``confirmatory_run`` and ``earlier_runs`` keys, as written (empty where absent)."""
    tree = yaml.safe_load(read(path) if text is None else text) or {}
    return str(tree.get("confirmatory_run", "")).strip(), [str(r) for r in tree.get("earlier_runs", []) or []]


def _claim(path: str, entry) -> Claim:
    name = entry.get("id", "?") if isinstance(entry, dict) else "?"
    fields = {f.name for f in dataclasses.fields(Claim)}
    if not isinstance(entry, dict) or not {"id", "claim", "source", "test", "a"} <= set(entry):
        raise ClaimsError(f"{path}: claim {name!r} needs id, claim, source, test and a")
    unknown = set(entry) - fields
    if unknown:
        raise ClaimsError(f"{path}: claim {name!r} has unknown keys {sorted(unknown)}; valid: {sorted(fields)}")
    claim = Claim(**entry)
    if claim.test not in TESTS:
        raise ClaimsError(f"{path}: claim {name!r}: test={claim.test!r} is invalid; valid: {', '.join(TESTS)}")
    needs_b = claim.test != "proportion"
    for key, cell in (("a", claim.a), ("b", claim.b)):
        if cell is None and (key == "a" or needs_b):
            raise ClaimsError(f"{path}: claim {name!r} (test {claim.test}) needs the cell {key}")
        if cell is not None and (
            not isinstance(cell, dict) or not {"section", "label", "length"} <= set(cell) or set(cell) - CELL_KEYS
        ):
            raise ClaimsError(
                f"{path}: claim {name!r}: cell {key}={cell!r} is invalid: expected section, label "
                f"and length, optionally {', '.join(sorted(CELL_KEYS - {'section', 'label', 'length'}))}"
            )
    if claim.test == "equivalence":
        if not isinstance(claim.margin, (int, float)) or claim.margin <= 0:
            raise ClaimsError(f"{path}: claim {name!r}: an equivalence test needs margin > 0, got {claim.margin!r}")
    elif claim.expect not in ("<", ">"):
        raise ClaimsError(f"{path}: claim {name!r}: expect={claim.expect!r} is invalid: valid: '<', '>'")
    if claim.metric not in ("accuracy", "logprob") or (claim.metric == "logprob" and claim.test != "difference"):
        raise ClaimsError(
            f"{path}: claim {name!r}: metric={claim.metric!r} is invalid: accuracy, or logprob with the difference test"
        )
    if claim.test == "proportion" and not (isinstance(claim.threshold, (int, float)) and 0 < claim.threshold < 1):
        raise ClaimsError(f"{path}: claim {name!r}: a proportion test needs 0 < threshold < 1, got {claim.threshold!r}")
    if (
        claim.test == "superiority"
        and claim.threshold is not None
        and not (isinstance(claim.threshold, (int, float)) and claim.threshold > 0)
    ):
        raise ClaimsError(f"{path}: claim {name!r}: a ratio threshold must be > 0, got {claim.threshold!r}")
    for key, cell in (("a", claim.a), ("b", claim.b)):
        if cell and cell["section"] == "extension" and TESTS[claim.test] == "retrieval" and "when" not in cell:
            raise ClaimsError(
                f"{path}: claim {name!r}: retrieval cell {key} of the extension needs when: before "
                f"or after (else it would pool both)"
            )
    return claim


# --------------------------------------------------------------------------- testing


def outcomes(cells, rows, plan: dict, path: Optional[str] = None, text: Optional[str] = None) -> tuple:
    """(alpha, [Outcome, ...]) of every claim of the plan's file (or of ``text``), Holm-corrected."""
    path = path or path_for(plan["experiment"])
    alpha, mode, claims = load(path, text)
    if mode not in plan["eval"]["modes"]:
        raise ClaimsError(f"{path}: mode={mode!r} is not among the study's eval.modes {plan['eval']['modes']}")
    L = plan["model"]["block_size"]
    _, _, passed = gate(rows, plan) if rows else (None, None, False)
    tested = [_test(claim, cells, rows, L, mode, passed, alpha) for claim in claims]
    tested = [
        o
        if o.p is None or math.isfinite(o.p)
        else dataclasses.replace(o, p=None, estimate=o.estimate + " (not finite: no test)")
        for o in tested
    ]
    adjusted = holm([1.0 if o.p is None else o.p for o in tested])
    return alpha, [
        dataclasses.replace(o, adjusted=a, verdict="supported" if a < alpha else "not supported")
        for o, a in zip(tested, adjusted)
    ]


def _test(claim: Claim, cells, rows, L: int, mode: str, passed: bool, alpha: float) -> Outcome:
    if TESTS[claim.test] == "perplexity":
        return _perplexity(claim, cells, L, mode, alpha)
    past_L = any(cell["length"] > 1 for cell in (claim.a, claim.b) if cell)
    found = [_accuracies(rows, cell, L, claim.metric) for cell in (claim.a, claim.b) if cell]
    if any(not rates for rates in found):
        return Outcome(claim, "not run", None)
    if past_L and not passed:
        return Outcome(claim, "not read (the gate failed)", None)
    values = list(found[0].values()) if claim.test == "proportion" else paired_differences(*found)
    if len(values) < 2:
        return Outcome(claim, "one seed: no test" if values else "no seed in both cells", None)
    ci = interval(values, 1 - 2 * alpha)
    what = "accuracy" if claim.test == "proportion" else "difference"
    scale, unit = (1, " nats") if claim.metric == "logprob" else (100, "%")
    estimate = (
        f"{what} {scale * ci.mean:.{3 if scale == 1 else 1}f}{unit} [{scale * ci.low:.{3 if scale == 1 else 1}f}, "
        f"{scale * ci.high:.{3 if scale == 1 else 1}f}] ({100 * (1 - 2 * alpha):g}% CI, n={ci.n} seeds)"
    )
    return Outcome(
        claim, estimate, t_test(values, claim.threshold if claim.test == "proportion" else 0.0, claim.expect)
    )


def _perplexity(claim: Claim, cells, L: int, mode: str, alpha: float) -> Outcome:
    where = [(c["section"], c["label"], int(c["length"] * L), c.get("step")) for c in (claim.a, claim.b)]
    ratios = paired_ratio(cells, where[0], where[1], mode)
    if len(ratios) < 2:
        return Outcome(claim, "not run" if not ratios else f"ratio {ratios[0]:.3f} (one seed: no test)", None)
    if not all(r > 0 and math.isfinite(r) for r in ratios):
        return Outcome(claim, f"ratios {ratios} (not finite: no test)", None)
    logs = [math.log(r) for r in ratios]
    ci = interval(logs, 1 - 2 * alpha)  # the geometric mean ratio and the interval the test decides on
    estimate = (
        f"ratio {math.exp(ci.mean):.3f} [{math.exp(ci.low):.3f}, {math.exp(ci.high):.3f}] "
        f"({100 * (1 - 2 * alpha):g}% CI, n={ci.n} seeds)"
    )
    if claim.test == "equivalence":
        bound = math.log(1 + claim.margin)
        return Outcome(claim, estimate, tost(logs, -bound, bound))
    return Outcome(claim, estimate, t_test(logs, math.log(claim.threshold or 1.0), claim.expect))


def _accuracies(rows, cell: dict, L: int, metric: str = "accuracy"):
    return seed_accuracies(
        rows,
        cell["section"],
        cell["label"],
        int(cell["length"] * L),
        cell.get("depth"),
        cell.get("when"),
        metric=metric,
    )


def hypothesis(claim: Claim) -> str:
    """What the test's alternative says, in a few symbols."""
    if claim.test == "equivalence":
        return f"ratio within ×/÷ {1 + claim.margin:g}"
    if claim.test == "superiority":
        return f"ratio {claim.expect} {claim.threshold or 1:g}"
    if claim.test == "proportion":
        return f"accuracy {claim.expect} {100 * claim.threshold:g}%"
    return f"{'log-prob ' if claim.metric == 'logprob' else ''}difference {claim.expect} 0"


# --------------------------------------------------------------------------- registration


def snapshot(experiment: str, run_commit: str) -> Optional[dict]:
    """What a run records of its claims file when it starts (``Study.claims``): the text it tests,
    the commit that last changed the file and whether that commit is in the run's history. The
    report reads this record, so a later edit of the file does not change a finished run's
    claims (None where the experiment has no claims file)."""
    path = path_for(experiment)
    if not os.path.exists(path):
        return None
    last, before = registration(path, run_commit)
    return {"text": read(path), "commit": last, "registered": before}


def registration(path: str, run_commit: str) -> tuple:
    """(the commit that last changed ``path``, whether it is an ancestor of ``run_commit``):
    False when the file differs from that commit now; None for either when git cannot tell
    (not a checkout, the file never committed, the run's commit unknown)."""
    repo, run = os.path.dirname(os.path.abspath(path)), run_commit.split()[0] if run_commit else ""
    try:
        last = subprocess.run(
            ["git", "log", "-1", "--format=%H", "--", os.path.basename(path)],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None, None
    if not last or len(run) != 40:
        return last or None, None
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", os.path.basename(path)], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    if dirty:  # what the run read is not what any commit holds
        return last, False
    ancestor = subprocess.run(["git", "merge-base", "--is-ancestor", last, run], cwd=repo, capture_output=True)
    return last, {0: True, 1: False}.get(ancestor.returncode)
