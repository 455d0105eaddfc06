"""The primary claims of a study: read from the file written before the run
(``minilm/study/registered/<experiment>.yaml``), each tested once, and corrected together.

A claim names its test (the file's header says what each computes):

* ``superiority`` and ``equivalence`` read perplexities: per seed r = ppl(a) / ppl(b)
  (paired: every scheme of a seed saw the same batches), and test the mean of log r over
  seeds with Student's t (``stats.t_test``) or with two one-sided tests against the margin
  (``stats.tost``, Schuirmann 1987). Log ratios make "10% better" and "10% worse" symmetric.
* ``proportion`` and ``difference`` read retrieval with the seed as the unit: each seed's
  accuracy (its probes, and depths unless the claim names one, counted together) is one value;
  ``proportion`` tests those values against the threshold, ``difference`` the per-seed
  differences a - b (paired: every model of a seed sees the same probes), both by the exact
  sign-flip permutation test over seeds (``stats.sign_flip_test``; the rule below). Pooling the
  probes of all seeds into one binomial sample would treat 3 x 32 probes as 96 independent models.
  With ``metric: logprob`` a ``difference`` reads each seed's mean log-probability of the answers
  instead (nats), which ranks models that all retrieve at the ceiling. Retrieval past L is not
  read when the gate fails (``claims.gate``): such a claim is "not tested". A ``proportion`` claim
  that a row retrieves *less* than its threshold past L reads only the seeds whose model of that row
  retrieves at least ``tuning.task_floor`` at L (depths pooled): a model that never learned the task
  retrieves nothing anywhere and would support it by failing (``learners``); the estimate says how
  many models it read.
* A cell with ``when: change`` reads what fine-tuning changed, per seed (``claims.CHANGE``): an
  extension row's (or its passkey's) accuracy after - before, or its perplexity after / before
  (the last step over step 0); every cell of such a claim reads a change, so ``difference`` and
  ``superiority`` compare two rows' changes, paired within the seed.

Each estimate carries the (1 - 2 alpha) interval over seeds (90% at alpha = 0.05): the
interval a one-sided test at level alpha decides on before any correction, and for TOST
exactly the interval that must lie inside the margins (Schuirmann 1987). The verdict reads the
Holm-adjusted p-value, so a claim whose interval clears its threshold may still be "not
supported" once the family is corrected.

Which test (``Outcome.method``, printed beside each claim), the file's ``retrieval_test``:

* ``sign-flip`` (the default, issue #58): retrieval claims take the exact sign-flip test and its
  interval, the thresholds it does not reject (``stats.sign_flip_interval``). Their per-seed
  values break the t-test's assumption: accuracies are bounded in [0, 1] and saturate (five seeds
  at 100% have no spread, hence no t statistic, while four at 100% and one at 31/32 gave
  t-test p = 7.7e-8), split into models that keep a needle and models that lose it (94 / 100 /
  94 / 9 / 9%), and log-probability differences are as skewed. The sign-flip test needs only that
  a seed's deviation is as likely to carry either sign under the null; it moves in steps of 2^-n,
  so at five seeds no retrieval claim gets p below 1/32 = 0.031: after Holm's correction such a
  claim is supported only with the family's largest p and every other claim supported, and two
  of them at 1/32 never are (2 x 1/32 > 0.05). At eight seeds the floor is 1/256 = 0.0039.
* ``t-test``: retrieval claims take Student's t, as every run recorded before files named their
  test (``recorded_test``) did; a run's record is re-read with the test it ran.
* Perplexity claims take Student's t or TOST under either rule: log ratios are continuous and
  unbounded, their seed spread is the text's, and the sign-flip test's floor of 2^-n would leave
  no perplexity claim supportable at five seeds. Under either rule, values without spread (no t
  statistic) take the sign-flip test (``stats.sign_flip_tost`` for equivalence).

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
from minilm.study.claims import CHANGE, cell_step, gate, paired_differences, paired_ratio, seed_accuracies
from minilm.study.papers import SECTION, prompt_tokens
from minilm.study.stats import (
    holm,
    interval,
    no_spread,
    sign_flip_interval,
    sign_flip_test,
    sign_flip_tost,
    t_test,
    tost,
)
from minilm.study.tuning import task_floor

REGISTERED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "registered")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(REGISTERED)))  # the checkout holding the package
TESTS = {"superiority": "perplexity", "equivalence": "perplexity", "proportion": "retrieval", "difference": "retrieval"}
CELL_KEYS = {"section", "label", "length", "step", "when", "depth"}
RETRIEVAL_TESTS = ("sign-flip", "t-test")
RETRIEVAL_TEST = "sign-flip"  # the test of retrieval claims in a file that names none (module docstring)
RECORDED_BEFORE = "t-test"  # the test of a run recorded before files named theirs
EARLIER_KEYS = {"commit", "what", "outcome", "report", "claims"}
VERDICTS = ("supported", "not supported", "not tested")


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
    method: str = ""  # the test that gave p: t-test, TOST, sign-flip or sign-flip TOST


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
    retrieval_test(path, text)
    earlier_runs(path, text)
    return float(alpha), tree.get("mode", "nonoverlapping"), claims


def retrieval_test(path: str, text: Optional[str] = None, default: str = RETRIEVAL_TEST) -> str:
    """The test of the file's retrieval claims (module docstring): its ``retrieval_test`` key,
    sign-flip or t-test, else ``default``."""
    rule = (yaml.safe_load(read(path) if text is None else text) or {}).get("retrieval_test", default)
    if rule not in RETRIEVAL_TESTS:
        raise ClaimsError(f"{path}: retrieval_test={rule!r} is invalid: valid: {', '.join(RETRIEVAL_TESTS)}")
    return rule


def recorded_test(recorded: Optional[dict]) -> str:
    """The retrieval test a run's record of its claims file (``snapshot``) was tested with, for a
    file that names none: the record's, or Student's t in a record from before runs recorded it;
    with no record (the file as it is now), the default."""
    return RETRIEVAL_TEST if not recorded else recorded.get("retrieval_test", RECORDED_BEFORE)


def confirmatory_run(path: str, text: Optional[str] = None) -> tuple:
    """(the run the file names to test its claims, [earlier runs that tested claims of it, one line
    each]): the file's ``confirmatory_run`` and ``earlier_runs`` keys (empty where absent)."""
    tree = yaml.safe_load(read(path) if text is None else text) or {}
    return str(tree.get("confirmatory_run", "")).strip(), [_earlier_line(e) for e in earlier_runs(path, text)]


def earlier_runs(path: str, text: Optional[str] = None) -> list:
    """The file's ``earlier_runs``, checked: each a line of text (as files wrote them before issue
    #58) or a mapping with the run's ``commit`` (null where none was recorded), ``what`` it was, its
    ``outcome``, optionally its ``report`` (where its artifacts are, or that there are none) and
    ``claims``: {claim id: supported | not supported | not tested} for the claims it tested."""
    tree = yaml.safe_load(read(path) if text is None else text) or {}
    entries = tree.get("earlier_runs") or []
    ids = {c.get("id") for c in tree.get("claims") or [] if isinstance(c, dict)}
    if not isinstance(entries, list):
        raise ClaimsError(f"{path}: earlier_runs must be a list, got {type(entries).__name__}")
    for number, entry in enumerate(entries, 1):
        if isinstance(entry, str):
            continue
        where = f"{path}: earlier_runs entry {number}"
        if not isinstance(entry, dict) or not {"commit", "what", "outcome"} <= set(entry) or set(entry) - EARLIER_KEYS:
            raise ClaimsError(f"{where} needs commit, what and outcome, optionally report and claims; got {entry!r}")
        wrong = _invalid_verdicts(entry.get("claims") or {}, ids)
        if wrong:
            raise ClaimsError(f"{where}: claims {wrong!r} is invalid: ids of this file, each {', '.join(VERDICTS)}")
    return entries


def _invalid_verdicts(verdicts, ids: set):
    """What of an earlier run's ``claims`` is not {an id of the file: a verdict} (empty: nothing)."""
    if not isinstance(verdicts, dict):
        return verdicts
    return {k: v for k, v in verdicts.items() if k not in ids or v not in VERDICTS}


def _earlier_line(entry) -> str:
    """An earlier run in one line: '<commit>: <what> (<outcome>; <report>)'."""
    if isinstance(entry, str):
        return entry
    commit = str(entry["commit"]) if entry["commit"] else "no commit recorded"
    where = f"; {entry['report']}" if entry.get("report") else ""
    return f"{commit}: {entry['what']} ({entry['outcome']}{where})"


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
    if claim.metric == "logprob" and any(c and c["section"] == SECTION for c in (claim.a, claim.b)):
        raise ClaimsError(f"{path}: claim {name!r}: the passkey has no log-probability: metric accuracy")
    if claim.test == "proportion" and not (isinstance(claim.threshold, (int, float)) and 0 < claim.threshold < 1):
        raise ClaimsError(f"{path}: claim {name!r}: a proportion test needs 0 < threshold < 1, got {claim.threshold!r}")
    if (
        claim.test == "superiority"
        and claim.threshold is not None
        and not (isinstance(claim.threshold, (int, float)) and claim.threshold > 0)
    ):
        raise ClaimsError(f"{path}: claim {name!r}: a ratio threshold must be > 0, got {claim.threshold!r}")
    whens = [cell.get("when") for cell in (claim.a, claim.b) if cell]
    if any(w not in (None, "before", "after", CHANGE) for w in whens) or (CHANGE in whens and len(set(whens)) > 1):
        raise ClaimsError(
            f"{path}: claim {name!r}: when={whens} is invalid: before, after, or {CHANGE} (after - before per "
            f"seed) in every cell of the claim"
        )
    for key, cell in (("a", claim.a), ("b", claim.b)):
        if (
            cell
            and cell["section"] in ("extension", "passkey")
            and TESTS[claim.test] == "retrieval"
            and "when" not in cell
        ):
            raise ClaimsError(
                f"{path}: claim {name!r}: retrieval cell {key} of the extension needs when: before or after, "
                f"or {CHANGE} (else it would pool both)"
            )
    return claim


# --------------------------------------------------------------------------- testing


def outcomes(
    cells, rows, plan: dict, path: Optional[str] = None, text: Optional[str] = None, default_test: str = RETRIEVAL_TEST
) -> tuple:
    """(alpha, [Outcome, ...]) of every claim of the plan's file (or of ``text``), Holm-corrected;
    retrieval claims by the file's ``retrieval_test``, else ``default_test`` (``recorded_test``)."""
    path = path or path_for(plan["experiment"])
    alpha, mode, claims = check_plan(plan, path, text)
    rule = retrieval_test(path, text, default_test)
    L = plan["model"]["block_size"]
    _, _, passed = gate(rows, plan) if rows else (None, None, False)
    floor = task_floor(plan)
    tested = [_test(claim, cells, rows, L, mode, passed, alpha, rule, floor) for claim in claims]
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


def _test(
    claim: Claim,
    cells,
    rows,
    L: int,
    mode: str,
    passed: bool,
    alpha: float,
    rule: str,
    floor: float,
) -> Outcome:
    if TESTS[claim.test] == "perplexity":
        return _perplexity(claim, cells, L, mode, alpha)
    past_L = any(cell["length"] > 1 for cell in (claim.a, claim.b) if cell)
    found = [_accuracies(rows, cell, L, claim.metric) for cell in (claim.a, claim.b) if cell]
    if any(not rates for rates in found):
        return Outcome(claim, "not run", None)
    if past_L and not passed:
        return Outcome(claim, "not read (the gate failed)", None)
    unread = ""
    if claim.test == "proportion" and claim.expect == "<" and past_L and claim.a["section"] != SECTION:
        found[0], unread = learners(found[0], rows, claim.a, L, floor)
        if not found[0]:
            return Outcome(claim, "no model read" + unread, None)
    values = list(found[0].values()) if claim.test == "proportion" else paired_differences(*found)
    if len(values) < 2:
        return Outcome(claim, ("one seed: no test" if values else "no seed in both cells") + unread, None)
    p, method, (low, high) = _retrieval_test(
        values, claim.threshold if claim.test == "proportion" else 0.0, claim.expect, rule, alpha
    )
    mean = sum(values) / len(values)
    what = "accuracy" if claim.test == "proportion" else "difference"
    what = f"{what} of after - before" if claim.a.get("when") == CHANGE else what
    scale, unit = (1, " nats") if claim.metric == "logprob" else (100, "%")
    digits = 3 if scale == 1 else 1
    estimate = (
        f"{what} {scale * mean:.{digits}f}{unit} [{scale * low:.{digits}f}, {scale * high:.{digits}f}] "
        f"({100 * (1 - 2 * alpha):g}% CI, n={len(values)} seeds){unread}"
    )
    return Outcome(claim, estimate, p, method=method)


def learners(accuracies: dict, rows, cell: dict, L: int, floor: float) -> tuple:
    """({seed: accuracy} of ``accuracies`` whose model of ``cell``'s row retrieves at least ``floor`` at L,
    depths pooled (an extension row's ``when: change`` is read at L after fine-tuning, the model it ends
    with); what the estimate adds about the others: ``"; K of N <label> models did not learn the task at L
    (below F%), J not probed at L: not read"``, else ""). The claim's population is the models that do
    the task: a model that retrieves nothing anywhere would support "retrieves less than t past L" by
    failing. Leaving seeds out can move p either way, as any change of the seeds read does; the rule is
    fixed before the run, and the estimate names what it left out."""
    at = {**{k: v for k, v in cell.items() if k != "depth"}, "length": 1}
    at = {**at, "when": "after"} if cell.get("when") == CHANGE else at
    at_L = _accuracies(rows, at, L) or {}
    kept = {seed: a for seed, a in accuracies.items() if at_L.get(seed, -1.0) >= floor}
    unlearned = sum(seed in at_L and at_L[seed] < floor for seed in accuracies)
    unprobed = sum(seed not in at_L for seed in accuracies)
    n, parts = len(accuracies), []
    if unlearned:
        parts.append(f"{unlearned} of {n} {cell['label']} models did not learn the task at L (below {100 * floor:g}%)")
    if unprobed:
        parts.append(f"{unprobed} of {n} not probed at L")
    return kept, f"; {', '.join(parts)}: not read" if parts else ""


def _retrieval_test(values: list, threshold: float, expect: str, rule: str, alpha: float) -> tuple:
    """(p, the test's name, the (1 - 2 alpha) interval it decides on) of a retrieval claim's per-seed
    values: the sign-flip test and its inverted interval under ``sign-flip``; under ``t-test``,
    Student's t and its interval, or the sign-flip test where the values have no spread."""
    if rule == "sign-flip":
        return sign_flip_test(values, threshold, expect), "sign-flip", sign_flip_interval(values, 1 - 2 * alpha)
    ci = interval(values, 1 - 2 * alpha)
    if no_spread(values):
        return sign_flip_test(values, threshold, expect), "sign-flip", (ci.low, ci.high)
    return t_test(values, threshold, expect), "t-test", (ci.low, ci.high)


def _perplexity(claim: Claim, cells, L: int, mode: str, alpha: float) -> Outcome:
    where = [(c["section"], c["label"], int(c["length"] * L), cell_step(c)) for c in (claim.a, claim.b)]
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
    exact = no_spread(logs)  # no t statistic: the sign-flip test (module docstring)
    if claim.test == "equivalence":
        bound = math.log(1 + claim.margin)
        if exact:
            return Outcome(claim, estimate, sign_flip_tost(logs, -bound, bound), method="sign-flip TOST")
        return Outcome(claim, estimate, tost(logs, -bound, bound), method="TOST")
    threshold = math.log(claim.threshold or 1.0)
    if exact:
        return Outcome(claim, estimate, sign_flip_test(logs, threshold, claim.expect), method="sign-flip")
    return Outcome(claim, estimate, t_test(logs, threshold, claim.expect), method="t-test")


def _accuracies(rows, cell: dict, L: int, metric: str = "accuracy"):
    """{seed: accuracy} of a retrieval claim's cell; a passkey cell's length m is the window m x L, whose prompt
    is m x L less the answer's tokens (``papers.prompt_tokens``)."""
    passkey = cell["section"] == SECTION
    tokens = prompt_tokens(cell["length"], L) if passkey else int(cell["length"] * L)
    return seed_accuracies(
        rows,
        cell["section"],
        cell["label"],
        tokens,
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


def retrieval_rows(path: str, text: Optional[str] = None) -> set:
    """(section, label) of every cell a retrieval claim of the file reads: the rows that the plan's
    ``claim_seeds`` train again, since the exact test needs more than five seeds (module docstring)."""
    _, _, claims = load(path, text)
    return {
        (c["section"], c["label"])
        for claim in claims
        if TESTS[claim.test] == "retrieval"
        for c in (claim.a, claim.b)
        if c
    }


def p_shown(p: float, alpha: float) -> str:
    """An adjusted p-value as the report prints it: 3 significant digits, more where 3 would round it to
    the other side of ``alpha`` from its verdict (0.04996 is "0.04996", not "0.05", beside "supported")."""
    for digits in (3, 4, 6):
        text = f"{p:.{digits}g}"
        if (float(text) < alpha) == (p < alpha):
            return text
    return repr(p)


def check_plan(plan: dict, path: str, text: Optional[str] = None) -> tuple:
    """(alpha, mode, claims) of the claims file at ``path`` (or its ``text``), a ClaimsError where the plan
    cannot give what they read: their protocol not among ``eval.modes``, a passkey cell at another length
    than ``extension.factor``. A study checks it before any job runs, not after hours of them."""
    alpha, mode, claims = load(path, text)
    if mode not in plan["eval"]["modes"]:
        raise ClaimsError(f"{path}: mode={mode!r} is not among the study's eval.modes {plan['eval']['modes']}")
    factor = plan.get("extension", {}).get("factor")
    for claim in claims:  # the passkey is asked in the extended window only (``papers.passkey_length``)
        if any(c and c["section"] == SECTION and c["length"] != factor for c in (claim.a, claim.b)):
            raise ClaimsError(f"{path}: claim {claim.id!r}: a passkey cell's length must be extension.factor {factor}")
    return alpha, mode, claims


def snapshot(experiment: str, run_commit: str) -> Optional[dict]:
    """What a run records of its claims file when it starts (``Study.claims``): the text it tests,
    the commit that last changed the file, whether that commit is in the run's history and the
    test its retrieval claims take (``retrieval_test``). The report reads this record, so a later
    edit of the file or of the default test does not change a finished run's claims (None where
    the experiment has no claims file)."""
    path = path_for(experiment)
    if not os.path.exists(path):
        return None
    last, before = registration(path, run_commit)
    return {"text": read(path), "commit": last, "registered": before, "retrieval_test": retrieval_test(path)}


def tests_text(rule: str, alpha: float) -> str:
    """What the report says of the claims' tests, under the file's retrieval rule (``t-test``: the
    words reports used before the rule existed)."""
    level = f"{100 * (1 - 2 * alpha):g}%"
    tost_note = f"for TOST: equivalence holds at level {alpha:g} exactly when that interval lies inside the margins"
    start = (
        "Perplexity claims test the per-seed log ratio ppl(a) / ppl(b) (a t-test, or two one-sided tests against "
        "the margin for equivalence); retrieval claims test each seed's accuracy against the threshold, or the "
        "per-seed difference of two cells (paired: every model of a seed sees the same probes), "
    )
    if rule == "t-test":
        return (
            start
            + f"with Student's t over seeds. Estimates carry the {level} interval, the one the test at level "
            + f"{alpha:g} decides on ({tost_note})."
        )
    return start + (
        "with the exact sign-flip permutation test over seeds (Fisher 1935, Pitman 1937: p is the share of the 2^n "
        "sign patterns of the seeds' deviations whose sum is at least as extreme as the observed one, so p >= 2^-n, "
        "1/32 at five seeds), because accuracies are bounded and saturate at 0% and 100%, where Student's t does "
        f"not hold. Estimates carry the {level} interval the test at level {alpha:g} decides on: Student's t for "
        f"perplexity ({tost_note}), and for retrieval the thresholds that neither one-sided sign-flip test "
        "rejects. Values without spread have no t statistic and take the sign-flip test; the test column names "
        "each claim's."
    )


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
