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
    alpha, tested = primary.outcomes(study, rows, plan, write(tmp_path, [FLAT, WORSE, LOST, GAIN]))
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
        (lost,) = primary.outcomes([], rows, plan, write(tmp_path, [LOST]))[1]
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
    by_accuracy, by_logprob = primary.outcomes(
        [], study, plan, write(tmp_path, [GAIN, {**GAIN, "id": "gain-logprob", "metric": "logprob"}])
    )[1]
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
