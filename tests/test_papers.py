"""The extension tested as the papers test it (minilm.study.papers, issue #58): the text-only fine-tuning arm,
claims on what fine-tuning changed (after - before per seed), the PI paper's passkey zero-shot and after, and
perplexity against the keep-at-L control."""

import types

import numpy as np
import pytest
import torch
import yaml

from minilm import GPT
from minilm.checkpoints import format as checkpoint
from minilm.config import build_config
from minilm.evaluation import passkey
from minilm.study import claims, extension, papers, primary, stats
from minilm.study import plan as experiments
from minilm.training.mixture import draw, task_for
from tests.test_experiments import cells, frozen_rates, probes


def built(plan, tmp_path):
    """The job graph of ``plan`` at frozen rates (no corpus needed)."""
    study = experiments.Study(plan, str(tmp_path))
    study.scored_tokens = 8192
    study.use_rates(frozen_rates(plan), {"path": "rates.yaml", "commit": None, "registered": None})
    study.build()
    return study


def test_the_text_only_arm_fine_tunes_every_row_on_text_alone_at_its_twins_rate(tmp_path):
    plan = experiments.make_plan("length-generalization", False, [1])
    assert (
        plan["extension"]["text_only"]
        and experiments.make_plan("length-generalization", True)["extension"]["text_only"]
    )
    rows = extension.extension_labels(plan, text_only=False)
    assert set(rows) == set(extension.extension_runs(plan)) and "keep" in rows  # the sweep tunes only these
    assert extension.extension_labels(plan) == [x for row in rows for x in (row, f"{row} text-only")]
    study = built(plan, tmp_path)
    twins = {r.label: r for r in study.runs.values() if r.section == "extension" and not r.label.endswith("text-only")}
    text_only = [r for r in study.runs.values() if r.section == "extension" and r.label.endswith("text-only")]
    assert {extension.twin_of(r.label) for r in text_only} == set(twins) == set(rows)
    for run in text_only:
        twin, train = twins[extension.twin_of(run.label)], run.config.train
        assert train.retrieval_share == 0 and train.retrieval_weight == 0
        assert twin.config.train.retrieval_share == 1 and twin.config.train.retrieval_weight > 0
        assert (train.lr, train.min_lr) == (twin.config.train.lr, twin.config.train.min_lr)  # its twin's rate
        assert study.finetune_lrs[extension.twin_of(run.label)] == train.lr
        for same in ("init_from", "max_steps", "batch_size", "snapshot_steps"):
            assert getattr(train, same) == getattr(twin.config.train, same), same
        assert run.config.model == twin.config.model and run.source == twin.source
        # a batch of its mixture is text alone: no retrieval rows, no answer weights; its twin's has them
        tokens = np.random.default_rng(0).integers(0, 900, 50_000)
        prepared = types.SimpleNamespace(train=tokens)
        for config, answers in ((run.config, False), (twin.config, True)):
            x, y, mask = draw(
                tokens,
                4,
                config.model.block_size,
                torch.Generator().manual_seed(0),
                0,
                config.train.retrieval_share,
                task_for(config, prepared),
                keep_text=config.train.retrieval_weight > 0,
            )
            assert (mask is not None and bool(mask.any())) == answers, run.label
    # the step 0 of a twin is its twin's: one evaluation and one retrieval job serve both
    names = {r.label: n for n, r in study.runs.items() if r.section == "extension"}
    assert names["linear text-only"] == "rope-linear-512-text-only-s1" and names["keep text-only"].startswith(
        "rope-keep-128-text-only"
    )
    assert len({j.key for j in study.jobs}) == len(study.jobs)
    off = experiments.make_plan("length-generalization", False, [1], ["extension.text_only=false"])
    assert extension.extension_labels(off) == rows
    with pytest.raises(experiments.ExperimentError, match="extension.text_only=3 is invalid"):
        experiments.make_plan("length-generalization", True, None, ["extension.text_only=3"])


def test_the_passkey_runs_every_row_zero_shot_and_after_fine_tuning(tmp_path):
    plan = experiments.make_plan("length-generalization", False, [1])
    study = built(plan, tmp_path)
    jobs = {j.key: j for j in study.jobs if j.key.startswith(papers.SECTION)}
    length = 4 * plan["model"]["block_size"] - 8  # the prompt and its answer fill the extended window
    assert {(j.args[2], tuple(j.args[3]), j.args[4]) for j in jobs.values()} == {
        (length, tuple(plan["retrieval"]["depths"]), plan["extension"]["passkey_trials"])
    }
    sources = {"train rope-s1", "train learned-s1", "train sinusoidal-s1"}
    before = {k for k, j in jobs.items() if j.after[0] in sources}  # the sources, each method applied zero-shot
    assert "passkey rope-s1 model.position.scaling={type: linear, factor: 4}" in before
    assert "passkey rope-s1" in before  # no scaling and the control: the source as it is
    assert len(before) == 8 and len(jobs) == 8 + 2 * 9  # the text-only twins share their twin's step 0
    rows = [r for r in study._readers if r[0].startswith(papers.SECTION)]
    read = [
        row for key, reader in rows for row in reader([{"length": length, "depth": 0.0, "correct": 1, "trials": 8}])
    ]
    assert {(r["label"], r["when"]) for r in read} == {
        (m, w) for m in extension.extension_labels(plan) for w in ("before", "after")
    }
    off = experiments.make_plan("length-generalization", True, [1], ["extension.passkey_trials=0"])
    assert not [j for j in built(off, tmp_path / "off").jobs if j.key.startswith(papers.SECTION)]


def test_the_passkey_job_scores_a_checkpoint_zero_shot_and_says_bounded(tmp_path, gen_tokenizer):
    def saved(position, name):
        config = build_config(
            {
                "model": {"vocab_size": 400, "n_layer": 1, "n_head": 2, "d_model": 16, "block_size": 64},
                "out_dir": str(tmp_path / name),
            }
        )
        config = build_config({**config.to_dict(), "model": {**config.to_dict()["model"], "position": position}})
        torch.manual_seed(0)
        model = GPT(config.model)
        return checkpoint.save(
            {"model": model.state_dict(), "config": config.to_dict(), "tokenizer": gen_tokenizer.to_bytes()},
            config.out_dir,
        )

    rope = saved({"kind": "rope"}, "rope")
    zero_shot = extension.scaling_override("linear", 4, 256)
    rows = papers.passkey_job(rope, zero_shot, 248, [0.0, 1.0], 2, 1, "cpu")
    assert [(r["length"], r["depth"], r["trials"]) for r in rows] == [(248, 0.0, 2), (248, 1.0, 2)]
    assert all(r["correct"] in (0, 1, 2) for r in rows)  # an untrained model: whatever it gets, counted
    learned = saved({"kind": "learned"}, "learned")
    assert {r["correct"] for r in papers.passkey_job(learned, [], 248, [0.0], 2, 1, "cpu")} == {None}  # past its table


def passkey_rows(label, when, correct, length, seeds=(1, 2, 3)):
    return [
        dict(section="passkey", label=label, when=when, length=length, depth=0.0, correct=c, trials=8, seed=s)
        for s, c in zip(seeds, correct)
    ]


CHANGE_GAIN = {
    "id": "change",
    "claim": "fine-tuning adds more retrieval to PI than to the control",
    "source": "paper",
    "test": "difference",
    "expect": ">",
    "a": {"section": "extension", "label": "linear", "length": 4, "when": "change"},
    "b": {"section": "extension", "label": "keep", "length": 4, "when": "change"},
}


def write(tmp_path, entries):
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"alpha": 0.05, "claims": entries}), encoding="utf-8")
    return str(path)


def test_a_change_cell_reads_after_minus_before_per_seed(tmp_path):
    plan = experiments.make_plan("length-generalization", True, [1, 2, 3])
    L = plan["model"]["block_size"]
    ext = lambda label, when, hits: probes(label, 4 * L, hits, section="extension", when=when, seeds=(1, 2, 3))  # noqa
    rows = (
        probes("rope", L, [32, 32, 32], seeds=(1, 2, 3))  # the gate passes
        + ext("linear", "before", [20, 24, 16])
        + ext("linear", "after", [30, 28, 30])
        + ext("keep", "before", [16, 16, 16])
        + ext("keep", "after", [18, 15, 20])
    )
    linear = claims.seed_accuracies(rows, "extension", "linear", 4 * L, when=claims.CHANGE)
    assert linear == pytest.approx({1: 10 / 32, 2: 4 / 32, 3: 14 / 32})
    keep = claims.seed_accuracies(rows, "extension", "keep", 4 * L, when=claims.CHANGE)
    assert keep == pytest.approx({1: 2 / 32, 2: -1 / 32, 3: 4 / 32})
    assert claims.seed_accuracies(rows, "extension", "none", 4 * L, when=claims.CHANGE) is None  # not run
    # a perplexity change: the last step over step 0, per seed
    study = (
        cells("extension", "linear", 4 * L, [90, 80, 100], step=0)
        + cells("extension", "linear", 4 * L, [60, 58, 70], step=5)
        + cells("extension", "linear", 4 * L, [45, 44, 50], step=10)
        + cells("extension", "keep", 4 * L, [54, 52, 56], step=0)
        + cells("extension", "keep", 4 * L, [53, 50, 56], step=10)
    )
    assert claims.per_seed(study, "extension", "linear", 4 * L, "nonoverlapping", step=claims.CHANGE) == pytest.approx(
        {1: 0.5, 2: 0.55, 3: 0.5}
    )
    assert claims.perplexity_changes(study, "scratch", "rope", L, "nonoverlapping") == {}  # no steps: no change
    ppl_claim = {
        **CHANGE_GAIN,
        "id": "ppl",
        "test": "superiority",
        "expect": "<",
        "a": {"section": "extension", "label": "linear", "length": 4, "when": "change"},
    }
    _, (gain, ppl) = primary.outcomes(study, rows, plan, write(tmp_path, [CHANGE_GAIN, ppl_claim]))
    # the same test as a claim on cells that hold those changes: per seed 8, 5 and 10 of 32 more for PI than
    # for the control; perplexity after / before 0.5 / (53 / 54), 0.55 / (50 / 52), 0.5 / 1
    same_rows = rows + ext("x", "after", [8, 5, 10]) + ext("y", "after", [0, 0, 0])
    same_cells = cells("scratch", "x", L, [0.5, 0.55, 0.5]) + cells("scratch", "y", L, [53 / 54, 50 / 52, 1.0])
    plain = {
        **CHANGE_GAIN,
        "id": "plain",
        "a": {"section": "extension", "label": "x", "length": 4, "when": "after"},
        "b": {"section": "extension", "label": "y", "length": 4, "when": "after"},
    }
    plain_ppl = {
        **ppl_claim,
        "id": "plain-ppl",
        "a": {"section": "scratch", "label": "x", "length": 1},
        "b": {"section": "scratch", "label": "y", "length": 1},
    }
    _, (same_gain, same_ppl) = primary.outcomes(same_cells, same_rows, plan, write(tmp_path, [plain, plain_ppl]))
    assert gain.p == pytest.approx(same_gain.p) and ppl.p == pytest.approx(same_ppl.p) and gain.p < 0.5
    assert gain.estimate.startswith("difference of after - before 24.0% [") and ppl.estimate.startswith("ratio 0.5")
    assert gain.estimate.split("[")[1] == same_gain.estimate.split("[")[1] and ppl.estimate == same_ppl.estimate
    passkey = passkey_rows("linear", "before", [0, 1, 0], 4 * L) + passkey_rows("linear", "after", [4, 6, 5], 4 * L)
    changes = claims.seed_accuracies(passkey, papers.SECTION, "linear", 4 * L, when=claims.CHANGE)
    assert changes == pytest.approx({1: 0.5, 2: 0.625, 3: 0.625})
    mixed = {**CHANGE_GAIN, "b": {**CHANGE_GAIN["b"], "when": "after"}}
    with pytest.raises(primary.ClaimsError, match="claim 'change': when=\\['change', 'after'\\] is invalid"):
        primary.load(write(tmp_path, [mixed]))
    with pytest.raises(primary.ClaimsError, match="is invalid: before, after, or change"):
        primary.load(write(tmp_path, [{**CHANGE_GAIN, "b": {**CHANGE_GAIN["b"], "when": "later"}}]))


def test_the_extension_is_read_against_the_keep_at_L_control(tmp_path):
    plan = experiments.make_plan("length-generalization", True, [1, 2, 3], ["eval.modes=[nonoverlapping]"])
    L, last = plan["model"]["block_size"], plan["extension"]["curve_steps"][-1]
    study_cells = (
        cells("extension", "linear", 4 * L, [44, 45, 46], step=last)
        + cells("extension", "keep", L, [44, 44.5, 47], step=last)
        + cells("extension", "keep", 4 * L, [52, 55, 50], step=last)
        + cells("extension", "linear text-only", 4 * L, [46, 47, 48], step=last)
        + cells("extension", "keep text-only", L, [46, 46, 46], step=last)
        + cells("extension", "keep text-only", 4 * L, [50, 51, 52], step=last)
        + cells("scratch", "rope", L, [45, 46, 47])
    )
    study = types.SimpleNamespace(plan=plan, cells=study_cells, L=L)
    labels = ["linear", "linear text-only", "keep", "keep text-only"]
    lines = papers.control_lines(study, labels, {m: extension.LABEL_NAMES[m] for m in labels})
    table = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in "\n".join(lines).splitlines()
        if line.startswith("| ")
    ]
    body = {row[0]: row for row in table}

    def ratio(a, b):
        return stats.interval([x / y for x, y in zip(a, b)]).format(3)

    assert body["PI (linear)"][2:] == [
        ratio([44, 45, 46], [44, 44.5, 47]),  # against the control with the same tokens, at L
        ratio([44, 45, 46], [52, 55, 50]),  # and at 4L
        ratio([44, 45, 46], [45, 46, 47]),  # against the source at L
    ]
    assert body["PI (linear), text-only"][2] == ratio([46, 47, 48], [46, 46, 46])  # against the text-only control
    assert body["rope, training kept at L"][2:4] == ["(the control)"] * 2
    assert table[0][2:4] == [f"/ kept at L, at {L}", f"/ kept at L, at {4 * L}"]
    assert papers.control_lines(study, ["linear"], {"linear": "PI"}) == []  # no control run: no table


def test_a_passkey_claim_reads_its_windows_prompts_and_its_rows_train_at_the_claim_seeds(tmp_path):
    """A passkey cell of length m names the window m x L: its prompts are m x L less the answer's tokens
    (``papers.passkey_length``), and the extension row it reads trains again at the claim seeds."""
    plan = experiments.make_plan("length-generalization", True, [1, 2, 3])
    prompt = papers.passkey_length(plan)
    assert prompt == 4 * plan["model"]["block_size"] - passkey.MAX_NEW_TOKENS
    rows = passkey_rows("linear text-only", "after", [6, 7, 8], prompt) + passkey_rows(
        "none text-only", "after", [1, 0, 2], prompt
    )
    claim = {
        "id": "pk",
        "claim": "PI keeps the passkey where direct fine-tuning loses it",
        "source": "paper",
        "test": "difference",
        "expect": ">",
        "a": {"section": "passkey", "label": "linear text-only", "length": 4, "when": "after"},
        "b": {"section": "passkey", "label": "none text-only", "length": 4, "when": "after"},
    }
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"alpha": 0.05, "claims": [claim]}), encoding="utf-8")
    gate = probes("rope", plan["model"]["block_size"], [32, 32, 32], seeds=(1, 2, 3))  # the task learned at L
    _, (outcome,) = primary.outcomes([], rows + gate, plan, str(path))
    assert outcome.p is not None and outcome.estimate.startswith("difference 75.0% [")
    for change, message in (
        ({"metric": "logprob"}, "the passkey has no log-probability: metric accuracy"),
        ({"a": {**claim["a"], "length": 2}}, "a passkey cell's length must be extension.factor 4"),
    ):
        path.write_text(yaml.safe_dump({"alpha": 0.05, "claims": [{**claim, **change}]}), encoding="utf-8")
        with pytest.raises(primary.ClaimsError, match=message):
            primary.outcomes([], rows + gate, plan, str(path))
    path.write_text(yaml.safe_dump({"alpha": 0.05, "claims": [claim]}), encoding="utf-8")
    study = experiments.Study(plan, str(tmp_path))
    study.scored_tokens = 8192
    study.use_rates(frozen_rates(plan), {"path": "rates.yaml", "commit": None, "registered": None})
    study.claimed = primary.retrieval_rows(str(path))
    study.build()
    extra = {(r.section, r.label) for r in study.runs.values() if r.seed in plan["claim_seeds"]}
    assert extra == {("scratch", "rope"), ("extension", "linear text-only"), ("extension", "none text-only")}
    assert any(j.key.startswith("passkey rope-linear") and j.args[-2] in plan["claim_seeds"] for j in study.jobs)
