"""minilm.study.primary: the pre-registered claims file, each claim's test, Holm's correction
over the whole family, and whether the file was committed before the run."""

import math
import subprocess

import pytest
import yaml

from minilm.study import designs, extension, primary, stats
from minilm.study import plan as experiments
from tests.test_experiments import cells, probes


def write(tmp_path, claims, **top):
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"alpha": 0.05, **top, "claims": claims}), encoding="utf-8")
    return str(path)


FLAT = {
    "id": "flat",
    "claim": "alibi flat",
    "source": "paper",
    "test": "equivalence",
    "margin": 0.1,
    "a": {"section": "scratch", "label": "alibi", "length": 4},
    "b": {"section": "scratch", "label": "alibi", "length": 1},
}
WORSE = {
    "id": "worse",
    "claim": "rope worse at 4L",
    "source": "paper",
    "test": "superiority",
    "expect": ">",
    "a": {"section": "scratch", "label": "rope", "length": 4},
    "b": {"section": "scratch", "label": "rope", "length": 1},
}
LOST = {
    "id": "lost",
    "claim": "rope loses the needle",
    "source": "paper",
    "test": "proportion",
    "expect": "<",
    "threshold": 0.5,
    "a": {"section": "scratch", "label": "rope", "length": 4},
}
GAIN = {
    "id": "gain",
    "claim": "PI beats none",
    "source": "paper",
    "test": "difference",
    "expect": ">",
    "a": {"section": "extension", "label": "linear", "length": 4, "when": "after"},
    "b": {"section": "extension", "label": "none", "length": 4, "when": "after"},
}


def test_each_claim_is_its_own_test_and_holm_runs_over_the_family(tmp_path):
    plan = experiments.make_plan("length-generalization", True, [1, 2, 3])
    L = plan["model"]["block_size"]
    study = (
        cells("scratch", "alibi", L, [40, 50, 45])
        + cells("scratch", "alibi", 4 * L, [40.4, 50.2, 44.9])
        + cells("scratch", "rope", L, [40, 50, 45])
        + cells("scratch", "rope", 4 * L, [48, 61, 53])
    )
    rows = (
        probes("rope", L, [32, 31, 32], seeds=(1, 2, 3))
        + probes("rope", 4 * L, [9, 12, 10], seeds=(1, 2, 3))
        + probes("linear", 4 * L, [30, 31, 29], section="extension", when="after", seeds=(1, 2, 3))
        + probes("none", 4 * L, [20, 24, 22], section="extension", when="after", seeds=(1, 2, 3))
    )
    path = write(tmp_path, [FLAT, WORSE, LOST, GAIN], retrieval_test="t-test")  # the rule of runs before issue #58
    alpha, tested = primary.outcomes(study, rows, plan, path)
    by_id = {o.claim.id: o for o in tested}
    flat = [math.log(a / b) for a, b in zip([40.4, 50.2, 44.9], [40, 50, 45])]
    assert by_id["flat"].p == pytest.approx(stats.tost(flat, -math.log(1.1), math.log(1.1)))
    worse = [math.log(a / b) for a, b in zip([48, 61, 53], [40, 50, 45])]
    assert by_id["worse"].p == pytest.approx(stats.t_test(worse, 0.0, ">"))
    assert by_id["lost"].p == pytest.approx(stats.t_test([9 / 32, 12 / 32, 10 / 32], 0.5, "<"))
    # paired per seed: differences 10, 7 and 7 of 32, mean 1/4, s.e. 1/32: t = 8 with 2 degrees of freedom,
    # whose upper tail is (1 - t / sqrt(t^2 + 2)) / 2 in closed form
    assert by_id["gain"].p == pytest.approx((1 - 8 / math.sqrt(66)) / 2, rel=1e-9)
    assert [o.adjusted for o in tested] == pytest.approx(stats.holm([o.p for o in tested]))
    assert alpha == 0.05 and all(o.verdict == ("supported" if o.adjusted < 0.05 else "not supported") for o in tested)
    assert by_id["worse"].verdict == "supported" and by_id["flat"].estimate.startswith("ratio 1.00")
    # TOST decides on the 90% interval (alpha = 0.05): that is the interval printed beside the verdict
    ci = stats.interval(flat, 0.90)
    assert f"[{math.exp(ci.low):.3f}, {math.exp(ci.high):.3f}] (90% CI, n=3 seeds)" in by_id["flat"].estimate
    assert ci.high < math.log(1.1) and ci.low > -math.log(1.1) and by_id["flat"].p < 0.05


@pytest.mark.slow
def test_retrieval_claims_take_the_seed_as_the_unit(tmp_path):
    """The same per-seed accuracies from 32 or 3,200 probes per seed give the same test: the
    replicates are the 3 trained models, not their probes (pooled, the binomial test would call
    the larger count overwhelming)."""
    plan = experiments.make_plan("length-generalization", True, [1, 2, 3])
    L = plan["model"]["block_size"]
    found = {}
    for scale in (1, 100):
        rows = probes("rope", L, [32 * scale] * 3, trials=32 * scale, seeds=(1, 2, 3)) + probes(
            "rope", 4 * L, [14 * scale, 17 * scale, 13 * scale], trials=32 * scale, seeds=(1, 2, 3)
        )
        (lost,) = primary.outcomes([], rows, plan, write(tmp_path, [LOST], retrieval_test="t-test"))[1]
        found[scale] = lost
    assert found[1].p == pytest.approx(found[100].p, rel=1e-12)
    assert found[1].p == pytest.approx(stats.t_test([14 / 32, 17 / 32, 13 / 32], 0.5, "<"))
    assert "n=3 seeds" in found[1].estimate and found[1].verdict == "not supported"
    pooled = sum(math.comb(9600, k) for k in range(4401)) / 2**9600  # exact binomial of the 100x probes, pooled
    assert pooled < 1e-10  # what treating them as 9,600 independent trials would have claimed


def test_a_log_probability_claim_ranks_models_at_the_accuracy_ceiling(tmp_path):
    """Both methods retrieve every probe, so accuracy cannot rank them; each seed's mean answer
    log-probability (two depths of 32 and 96 probes, weighted by their probes) can, paired by seed."""
    plan = experiments.make_plan("length-generalization", True, [1, 2, 3])
    L = plan["model"]["block_size"]

    def rows(label, by_depth):  # {depth: [(correct, logprob) per seed]}
        return [
            dict(
                section="extension",
                label=label,
                length=4 * L,
                depth=d,
                correct=c,
                trials=n,
                seed=seed,
                when="after",
                logprob=lp,
            )
            for (d, n), values in by_depth.items()
            for seed, (c, lp) in zip((1, 2, 3), values)
        ]

    study = (
        probes("rope", L, [32, 32, 32], seeds=(1, 2, 3))  # the gate passes
        + rows(
            "linear",
            {(0.0, 32): [(32, -0.10), (32, -0.20), (32, -0.30)], (1.0, 96): [(96, -0.30), (96, -0.40), (96, -0.50)]},
        )
        + rows(
            "none",
            {(0.0, 32): [(32, -0.50), (32, -0.40), (32, -0.90)], (1.0, 96): [(96, -0.70), (96, -0.80), (96, -0.70)]},
        )
    )
    claims = [GAIN, {**GAIN, "id": "gain-logprob", "metric": "logprob"}]
    by_accuracy, by_logprob = primary.outcomes([], study, plan, write(tmp_path, claims, retrieval_test="t-test"))[1]
    assert by_accuracy.verdict == "not supported"  # 100% against 100%: no evidence either way
    # per seed, weighted by probes: linear -0.25, -0.35, -0.45; none -0.65, -0.70, -0.75: differences .40, .35, .30
    assert by_logprob.p == pytest.approx(stats.t_test([0.40, 0.35, 0.30], 0.0, ">"))
    assert by_logprob.estimate.startswith("difference 0.350 nats [") and "n=3 seeds" in by_logprob.estimate
    assert primary.hypothesis(by_logprob.claim) == "log-prob difference > 0"
    with pytest.raises(primary.ClaimsError, match="metric='logprob' is invalid"):
        primary.load(write(tmp_path, [{**LOST, "metric": "logprob"}]))


def test_an_untested_claim_stays_in_the_family_with_p_one(tmp_path):
    plan = experiments.make_plan("length-generalization", True, [1, 2])
    L = plan["model"]["block_size"]
    study = cells("scratch", "rope", L, [40, 50]) + cells("scratch", "rope", 4 * L, [48, 61])
    unlearned = probes("rope", L, [3, 2]) + probes("rope", 4 * L, [2, 1])
    _, tested = primary.outcomes(study, unlearned, plan, write(tmp_path, [WORSE, LOST, GAIN]))
    worse, lost, gain = tested
    assert lost.p is None and lost.estimate.startswith("not read") and gain.estimate == "not run"
    assert worse.adjusted == pytest.approx(min(1.0, 3 * worse.p))  # the family keeps all three claims
    assert lost.adjusted == 1.0 and lost.verdict == "not supported"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"test": "better"}, "test='better' is invalid; valid: superiority, equivalence, proportion, difference"),
        ({"margin": None}, "needs margin > 0"),
        ({"b": None}, "needs the cell b"),
        ({"b": {"section": "scratch", "label": "alibi"}}, "expected section, label and length"),
        ({"a": {"section": "scratch", "label": "alibi", "length": 4, "seed": 1}}, "expected section, label and length"),
        ({"colour": "red"}, "unknown keys ['colour']"),
    ],
)
def test_a_malformed_claim_is_a_one_line_error_naming_it(tmp_path, change, message):
    path = write(tmp_path, [{**FLAT, **change}])
    with pytest.raises(primary.ClaimsError, match="claim 'flat'") as error:
        primary.load(path)
    assert message in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(primary.ClaimsError, match="repeat"):
        primary.load(write(tmp_path, [FLAT, FLAT]))
    with pytest.raises(primary.ClaimsError, match="expect=None"):
        primary.load(write(tmp_path, [{**WORSE, "expect": None}]))
    with pytest.raises(primary.ClaimsError, match="alpha=2"):
        primary.load(write(tmp_path, [FLAT], alpha=2))
    with pytest.raises(primary.ClaimsError, match="needs when: before or after"):
        primary.load(write(tmp_path, [{**GAIN, "b": {"section": "extension", "label": "none", "length": 4}}]))
    with pytest.raises(primary.ClaimsError, match="ratio threshold must be > 0"):
        primary.load(write(tmp_path, [{**WORSE, "threshold": 0}]))


def test_a_run_tests_the_claims_it_recorded_and_a_diverged_cell_is_not_tested(tmp_path):
    plan = experiments.make_plan("length-generalization", True, [1, 2])
    L = plan["model"]["block_size"]
    study = cells("scratch", "rope", L, [40, 50]) + cells("scratch", "rope", 4 * L, [48, float("nan")])
    recorded = yaml.safe_dump({"claims": [WORSE]})
    _, (worse,) = primary.outcomes(study, [], plan, str(tmp_path / "edited-since.yaml"), recorded)
    assert worse.p is None and "not finite" in worse.estimate and worse.adjusted == 1.0
    with pytest.raises(primary.ClaimsError, match="mode='strided' is not among"):
        primary.outcomes(study, [], plan, "x.yaml", yaml.safe_dump({"mode": "strided", "claims": [WORSE]}))


@pytest.mark.parametrize("experiment", ["length-generalization", "replication-512"])
def test_the_shipped_claims_name_cells_the_full_study_makes(experiment):
    plan = experiments.make_plan(experiment)
    alpha, mode, claims = primary.load(primary.path_for(experiment))
    assert alpha == 0.05 and mode in plan["eval"]["modes"] and len(claims) >= 5
    for claim in claims:
        for cell in (claim.a, claim.b):
            if cell is None:
                continue
            labels = designs.scratch_labels(plan) if cell["section"] == "scratch" else extension.extension_labels(plan)
            assert cell["label"] in labels, claim.id
            multiples = plan["retrieval" if primary.TESTS[claim.test] == "retrieval" else "eval"]["multiples"]
            if cell["section"] == "extension" and "step" in cell:
                multiples = plan["extension"]["curve_multiples"]
                assert cell["step"] in plan["extension"]["curve_steps"], claim.id
            assert cell["length"] in multiples, claim.id
            assert cell.get("depth", 0.0) in plan["retrieval"]["depths"], claim.id


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def test_registration_reads_whether_the_claims_were_committed_before_the_run(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    claims = repo / "claims.yaml"
    claims.write_text("first\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "claims")
    written = git(repo, "rev-parse", "HEAD")
    (repo / "code.py").write_text("x = 1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "the run's code")
    run = git(repo, "rev-parse", "HEAD")
    assert primary.registration(str(claims), run) == (written, True)
    assert primary.registration(str(claims), run + " (dirty: 1 uncommitted or untracked files, e.g. x)") == (
        written,
        True,
    )
    claims.write_text("changed after the run\n")
    assert primary.registration(str(claims), run) == (written, False)  # the file differs from any commit
    git(repo, "commit", "-qam", "claims changed after the run")
    assert primary.registration(str(claims), run)[1] is False
    assert primary.registration(str(claims), "unknown (not a git checkout)")[1] is None
    assert primary.registration(str(tmp_path / "elsewhere.yaml"), run) == (None, None)


SEEDS = (1, 2, 3, 4, 5)


def test_each_kind_of_claim_takes_its_documented_test(tmp_path):
    """Retrieval claims (proportion, difference, on accuracy or log-probability) take the exact
    sign-flip test and print the interval it decides on; perplexity claims take Student's t or TOST,
    and the sign-flip test only where their per-seed values have no spread (no t statistic)."""
    plan = experiments.make_plan("length-generalization", True, list(SEEDS))
    L = plan["model"]["block_size"]
    study = (
        cells("scratch", "alibi", L, [40, 50, 45, 42, 48])
        + cells("scratch", "alibi", 4 * L, [40.4, 50.2, 44.9, 42.1, 48.3])
        + cells("scratch", "rope", L, [40, 50, 45, 42, 48])
        + cells("scratch", "rope", 4 * L, [48, 61, 53, 50, 57])
        + cells("scratch", "t5", L, [40, 50, 45, 42, 48])
        + cells("scratch", "t5", 4 * L, [50, 62.5, 56.25, 52.5, 60])  # every seed exactly 25% worse
    )
    rows = (
        probes("rope", L, [32, 32, 32, 31, 32], seeds=SEEDS)
        + probes("rope", 4 * L, [9, 12, 10, 15, 3], seeds=SEEDS)
        + probes("linear", 4 * L, [30, 31, 29, 32, 30], section="extension", when="after", seeds=SEEDS)
        + probes("none", 4 * L, [20, 24, 22, 25, 30], section="extension", when="after", seeds=SEEDS)
    )
    flat_t5 = {**FLAT, "id": "t5-flat", "a": {**FLAT["a"], "label": "t5"}, "b": {**FLAT["b"], "label": "t5"}}
    worse_t5 = {**WORSE, "id": "t5-worse", "a": flat_t5["a"], "b": flat_t5["b"]}
    path = write(tmp_path, [FLAT, WORSE, LOST, GAIN, flat_t5, worse_t5])
    assert primary.retrieval_test(path) == "sign-flip"  # the default of a file that names none
    by_id = {o.claim.id: o for o in primary.outcomes(study, rows, plan, path)[1]}
    assert {i: o.method for i, o in by_id.items()} == {
        "flat": "TOST",
        "worse": "t-test",
        "lost": "sign-flip",
        "gain": "sign-flip",
        "t5-flat": "sign-flip TOST",
        "t5-worse": "sign-flip",
    }
    lost = [c / 32 for c in (9, 12, 10, 15, 3)]
    assert by_id["lost"].p == stats.sign_flip_test(lost, 0.5, "<") == 1 / 32  # every seed below 50%
    gain = [(a - b) / 32 for a, b in zip([30, 31, 29, 32, 30], [20, 24, 22, 25, 30])]  # 10, 7, 7, 7, 0 of 32
    assert by_id["gain"].p == stats.sign_flip_test(gain, 0.0, ">") == 2 / 32  # the zero flips with itself
    low, high = stats.sign_flip_interval(gain, 0.90)
    assert f"[{100 * low:.1f}, {100 * high:.1f}] (90% CI, n=5 seeds)" in by_id["gain"].estimate
    logs = [math.log(a / b) for a, b in zip([48, 61, 53, 50, 57], [40, 50, 45, 42, 48])]
    assert by_id["worse"].p == pytest.approx(stats.t_test(logs, 0.0, ">"))
    # t5: log 1.25 on every seed, no spread: the sign-flip tests, "worse" at 2^-5 and "flat" at 1 (past the margin)
    assert by_id["t5-worse"].p == 1 / 32 and by_id["t5-flat"].p == 1.0
    # under the rule of the runs before issue #58 the same retrieval claims take Student's t
    by_t = {
        o.claim.id: o
        for o in primary.outcomes(study, rows, plan, write(tmp_path, [LOST, GAIN], retrieval_test="t-test"))[1]
    }
    assert by_t["lost"].method == by_t["gain"].method == "t-test"
    assert by_t["lost"].p == pytest.approx(stats.t_test(lost, 0.5, "<"))


def test_saturated_retrieval_is_no_longer_a_cliff(tmp_path):
    """Five seeds at 100% against four at 100% and one at 31/32 (the issue's pair): the t-test with
    its sign-test fallback gave 0.031 and 7.7e-8; the sign-flip test gives 1/32 to both."""
    plan = experiments.make_plan("length-generalization", True, list(SEEDS))
    L = plan["model"]["block_size"]
    kept = {**LOST, "id": "kept", "expect": ">", "threshold": 0.5, "a": {**LOST["a"], "length": 1}}
    found = {}
    for name, per_seed in (("saturated", [32] * 5), ("one probe less", [32, 32, 32, 32, 31])):
        (outcome,) = primary.outcomes([], probes("rope", L, per_seed, seeds=SEEDS), plan, write(tmp_path, [kept]))[1]
        found[name] = outcome
    assert found["saturated"].p == found["one probe less"].p == 1 / 32
    assert found["saturated"].method == "sign-flip" and "[100.0, 100.0]" in found["saturated"].estimate
    (old,) = primary.outcomes(
        [], probes("rope", L, [32, 32, 32, 32, 31], seeds=SEEDS), plan, write(tmp_path, [kept], retrieval_test="t-test")
    )[1]
    assert old.p == pytest.approx(7.7e-8, rel=0.05)  # what the t-test made of one probe


def test_a_claim_that_retrieval_fails_past_L_reads_only_models_that_learned_the_task(tmp_path):
    """ "Rope at 4L retrieves fewer than half the needles 4L back" is no evidence from a model that
    retrieves nothing at L either: the seeds below the task floor at L (depths pooled) and the seeds
    not probed at L are not read, and the estimate says how many; a claim that it retrieves more
    reads every seed, failing models included."""
    seeds = (1, 2, 3, 4, 5)
    plan = experiments.make_plan("length-generalization", False, list(seeds))
    L = plan["model"]["block_size"]
    rows = (
        probes("alibi", L, [32] * 5, seeds=seeds)  # the gate: a scheme that learned the task
        + probes("rope", L, [32, 32, 32, 1], depth=0.0, seeds=seeds[:4])  # seed 5 was not probed at L
        + probes("rope", L, [32, 32, 32, 0], depth=1.0, seeds=seeds[:4])
        + probes("rope", 4 * L, [30, 31, 29, 0, 2], depth=0.0, seeds=seeds)
    )
    far = {**LOST, "a": {**LOST["a"], "depth": 0.0}}
    (read,) = primary.outcomes([], rows, plan, write(tmp_path, [far]))[1]
    assert read.p == stats.sign_flip_test([30 / 32, 31 / 32, 29 / 32], 0.5, "<")
    assert "n=3 seeds" in read.estimate
    said = "1 of 5 rope models did not learn the task at L (below 50%), 1 of 5 not probed at L: not read"
    assert said in read.estimate
    plan["tuning"]["task_floor"] = 0.0  # the model that never learned is read: it pulls the mean down
    (with_failure,) = primary.outcomes([], rows, plan, write(tmp_path, [far]))[1]
    assert "n=4 seeds" in with_failure.estimate and "did not learn" not in with_failure.estimate
    assert with_failure.p < read.p
    plan["tuning"]["task_floor"] = 0.5
    (more,) = primary.outcomes([], rows, plan, write(tmp_path, [{**far, "id": "kept", "expect": ">"}]))[1]
    assert "n=5 seeds" in more.estimate and "not read" not in more.estimate


def test_an_extension_rows_change_is_read_for_the_models_that_do_the_task_after_fine_tuning(tmp_path):
    seeds = (1, 2, 3)
    plan = experiments.make_plan("length-generalization", False, list(seeds))
    L = plan["model"]["block_size"]
    rows = probes("alibi", L, [32] * 3, seeds=seeds)
    for when, at_L, far in (("before", [0, 0, 0], [0, 0, 0]), ("after", [32, 32, 2], [8, 6, 1])):
        rows += probes("linear", L, at_L, section="extension", when=when, seeds=seeds)
        rows += probes("linear", 4 * L, far, section="extension", when=when, seeds=seeds)
    little = {**LOST, "a": {"section": "extension", "label": "linear", "length": 4, "when": "change"}}
    (read,) = primary.outcomes([], rows, plan, write(tmp_path, [little]))[1]
    assert "n=2 seeds" in read.estimate and "1 of 3 linear models did not learn the task at L" in read.estimate
    assert read.p == stats.sign_flip_test([8 / 32, 6 / 32], 0.5, "<")


def test_a_run_is_reread_with_the_test_it_recorded(tmp_path):
    """A record from before runs recorded their retrieval test (3e29b1a's) is re-read with Student's
    t, as it was tested; a run now records the test its file takes."""
    assert primary.recorded_test({"text": "claims: []", "commit": "x", "registered": True}) == "t-test"
    assert primary.recorded_test({"text": "", "retrieval_test": "sign-flip"}) == "sign-flip"
    assert primary.recorded_test(None) == primary.RETRIEVAL_TEST == "sign-flip"
    recorded = primary.snapshot("length-generalization", "unknown (not a git checkout)")
    assert recorded["retrieval_test"] == "sign-flip" and "retrieval_test: sign-flip" in recorded["text"]
    with pytest.raises(primary.ClaimsError, match="retrieval_test='wilcoxon' is invalid") as error:
        primary.load(write(tmp_path, [FLAT], retrieval_test="wilcoxon"))
    assert "\n" not in str(error.value)
    assert "Student's t over seeds" in primary.tests_text("t-test", 0.05)
    assert "sign-flip permutation test" in primary.tests_text("sign-flip", 0.05)


EARLIER = {"commit": "897d2b4", "what": "three seeds", "outcome": "1 of 1 supported", "claims": {"flat": "supported"}}


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"commit": "abc", "what": "x"}, "needs commit, what and outcome"),
        ({**EARLIER, "seeds": 3}, "needs commit, what and outcome"),
        ({**EARLIER, "claims": {"other": "supported"}}, "claims {'other': 'supported'} is invalid"),
        ({**EARLIER, "claims": {"flat": "held"}}, "claims {'flat': 'held'} is invalid"),
        ({**EARLIER, "claims": ["flat"]}, "claims ['flat'] is invalid"),
    ],
)
def test_earlier_runs_are_checked_entry_by_entry(tmp_path, entry, message):
    with pytest.raises(primary.ClaimsError, match="earlier_runs entry 2") as error:
        primary.load(write(tmp_path, [FLAT], earlier_runs=["8f901d4: as files wrote it before", entry]))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_earlier_runs_print_one_line_each(tmp_path):
    runs = ["8f901d4: a line as written", EARLIER, {**EARLIER, "commit": None, "report": "no artifact"}]
    path = write(tmp_path, [FLAT], earlier_runs=runs, confirmatory_run="the next one")
    assert primary.confirmatory_run(path) == (
        "the next one",
        [
            "8f901d4: a line as written",
            "897d2b4: three seeds (1 of 1 supported)",
            "no commit recorded: three seeds (1 of 1 supported; no artifact)",
        ],
    )


def test_the_shipped_claims_list_every_earlier_run_with_its_outcome():
    """The claims files' earlier runs: length-generalization's 897d2b4, 69b0ab9, the unseen-corpus run (no
    artifact, no commit), 3e29b1a and dd38cfc (the frozen design before the spread placement), 65f932b (the
    spread design's, whose report was lost with its machine: a count, no verdicts), the replication's 00e440b;
    each with its verdict per claim (``earlier_runs`` refuses other ids), whose count of supported claims is
    the outcome's "N of M"; 8f901d4 tested none."""
    path = primary.path_for("length-generalization")
    runs = {entry["commit"]: entry for entry in primary.earlier_runs(path)}
    assert list(runs) == ["8f901d4", "897d2b4", "69b0ab9", None, "3e29b1a", "dd38cfc", "65f932b"]
    assert "no claim" in runs["8f901d4"]["outcome"] and "claims" not in runs["8f901d4"]
    assert "no artifact" in runs[None]["report"] and "no artifact" in runs["65f932b"]["report"]
    assert runs["65f932b"]["outcome"].startswith("18 of 23 supported") and "claims" not in runs["65f932b"]
    replication = primary.path_for("replication-512")
    again = {entry["commit"]: entry for entry in primary.earlier_runs(replication)}
    assert list(again) == ["00e440b"]
    cases = [(runs, commit, n, 13) for commit, n in (("897d2b4", 8), ("69b0ab9", 7), (None, 7), ("3e29b1a", 10))]
    cases += [(runs, "dd38cfc", 18, 23), (again, "00e440b", 12, 13)]
    for entries, commit, supported, tested in cases:
        verdicts = entries[commit]["claims"]
        assert len(verdicts) == tested and list(verdicts.values()).count("supported") == supported, commit
        assert entries[commit]["outcome"].startswith(f"{supported} of {tested} supported"), commit
    # the two runs of the frozen design differ on the two claims its file predicted would change with L
    changed = {k for k, v in again["00e440b"]["claims"].items() if runs["dd38cfc"]["claims"][k] != v}
    assert changed == {"alibi-far-needle", "t5-ties-alibi-at-L"}
    assert runs[None]["claims"] == runs["69b0ab9"]["claims"]  # issue #47: the same 13 verdicts


def test_an_adjusted_p_is_printed_on_its_verdicts_side_of_alpha():
    assert primary.p_shown(0.04996, 0.05) == "0.04996" and primary.p_shown(0.0123456, 0.05) == "0.0123"
    assert primary.p_shown(0.05, 0.05) == "0.05" and primary.p_shown(0.050004, 0.05) == "0.05"
