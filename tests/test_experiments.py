"""The length-generalization study (minilm.study.plan, minilm.study.report, python -m minilm experiment):
--quick end to end with 2 seeds, the extension curve's snapshots, the plan, the verdicts."""

import csv
import dataclasses
import json
import math
import os
import subprocess

import pytest
import torch
import yaml

from minilm.cli import experiment as experiment_cli
from minilm.data.retrieval import distance
from minilm.evaluation import lengths as evaluation
from minilm.figures.canvas import have_matplotlib
from minilm.model.gpt import GPT
from minilm.study import claims, designs, extension, primary, provenance, report, sweep, tuning
from minilm.study import plan as experiments
from minilm.study.figures import ORDER, style
from minilm.study.jobs import check_graph
from minilm.study.journal import Journal, JournalError


@pytest.fixture(scope="module")
def quick_study(tiny_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("study") / "lg"
    code = experiment_cli.main(
        [
            "length-generalization",
            "--quick",
            "--out",
            str(out),
            "--seeds",
            "3,4",
            "--workers",
            "2",
            "--quiet",
            f"data.corpus={tiny_corpus / 'corpus.txt'}",
            "data.vocab_size=400",
            f"data.dir={tiny_corpus / 'data'}",
            "train.max_steps=10",
            "sweep.lrs=[1.0e-4, 3.0e-3]",
            "tuning.lr_scales=[1.0, 2.0, 4.0]",  # grids of several values: the tuning step's rounds run
            "tuning.seeds=[101]",
        ]
    )  # neither is finetune.lr (5e-4)
    assert code == 0
    return out


@pytest.mark.slow
def test_quick_study_end_to_end_with_two_seeds(quick_study):
    out, plan, L = quick_study, designs.QUICK, designs.QUICK["model"]["block_size"]
    text = (out / "report.md").read_text(encoding="utf-8")
    for heading in (
        "## Protocol",
        "## 1. Perplexity: every scheme trained at L",
        "## 2. Loss by position",
        "## 3. Retrieval: every scheme",
        f"## 4. Extending from {L} to {4 * L}, with the controls",
        "`minilm/study/registered/length-generalization.yaml`",
        "## 6. Expectations from the literature",
        "## Wall time",
        "## Configs",
        "Git commit at the start: `",
        "Machine: ",
        "Seeds: 3, 4",
        "Gate: the best scheme at L is",
    ):
        assert heading in text
    assert "Sinusoidal base" not in text  # an experiment of its own
    assert f"cosine to {plan['train']['min_lr']:g} after" in text  # the plan's schedule, in words
    for kind in designs.scratch_labels(plan):
        assert f"\n| {kind} | " in text
    assert " ± " in text and "n/a (bounded)" in text
    cells = list(csv.DictReader(open(out / "results.csv")))
    scratch = [c for c in cells if c["section"] == "scratch" and c["seed"] != "9"]  # 9: the claim seed
    modes, lengths = plan["eval"]["modes"], [int(m * L) for m in plan["eval"]["multiples"]]
    rows = designs.scratch_labels(plan)  # the kinds, then the per-layer arms
    assert len(rows) == len(designs.KINDS) + 5 and {"rnope-swa", "nope-last", "p-rope", "sinks"} < set(rows)
    assert len(scratch) == len(rows) * 2 * len(modes) * len(lengths)
    assert {c["seed"] for c in cells if c["section"] not in ("tuning", "sweep")} == {"3", "4", "9"}
    # the claim seed (9) trains only the rows the retrieval claims read, and rope, their extensions' source
    assert {c["label"] for c in cells if c["seed"] == "9" and c["section"] == "scratch"} == {
        "rope",
        "alibi",
        "rnope-swa",
    }
    assert "seeds 9 train only the rows the retrieval claims read" in text
    assert {c["seed"] for c in cells if c["section"] == "tuning"} == {"101"}  # tuning seeds are not test seeds
    # every scheme tuned at each scale on held-out text, and every run of the test seeds at its kind's choice
    tuned = json.load(open(out / "study.json"))["lr_scales"]
    frozen = yaml.safe_load((out / "rates.yaml").read_text(encoding="utf-8"))
    grids = frozen["grids"]["scales"]
    assert 0 < frozen["about"]["minutes"] <= frozen["about"]["process_minutes"]  # the jobs' union, their sum
    assert "CPU flags:" in frozen["about"]["machine"]  # bf16 units or not: what the rates were tuned in
    assert set(tuned) == set(designs.scratch_labels(plan))
    for kind, scale in tuned.items():  # the tuning step extended every grid until its choice was inside it
        assert {1.0, 2.0, 4.0} <= set(grids[kind]) and min(grids[kind]) < scale < max(grids[kind]), kind
    for name, run in json.load(open(out / "study.json"))["runs"].items():
        if run["section"] in ("scratch", "oracle", "oracle-source") and not run["config"]["train"]["init_from"]:
            kind = run["label"] if run["section"] == "scratch" else run["config"]["model"]["position"]["kind"]
            assert run["config"]["train"]["lr"] == pytest.approx(plan["train"]["lr"] * tuned[kind]), name
        elif run["section"] == "oracle":  # the equal-token oracle's fine-tuning: direct fine-tuning's rate
            assert run["config"]["train"]["lr"] == json.load(open(out / "study.json"))["finetune_lrs"]["none"]
    assert "Each scheme's learning rate, chosen on held-out training text" in text
    holdout = ("sweep", "tuning")  # scored on the held-out end of the train split
    assert len({c["tokens"] for c in cells if c["section"] not in holdout}) == 1  # every cell scores the same tokens
    scored = int(next(c["tokens"] for c in cells if c["section"] == "scratch"))
    assert f"the first {scored:,} tokens" in text  # the protocol names the validation cells' count, not the sweep's
    assert {c["status"] for c in scratch if c["label"] == "learned" and int(c["length"]) > L} == {"bounded"}
    curve = [c for c in cells if c["section"] == "extension" and c["mode"] == "nonoverlapping"]
    steps = plan["extension"]["curve_steps"]
    labels = extension.extension_labels(plan)  # the methods, learned + PI, sinusoidal + PI, training kept at L
    assert set(labels) > set(plan["extension"]["methods"]) and "keep" in labels
    assert {(c["label"], int(c["step"])) for c in curve} == {(m, s) for m in labels for s in steps}
    # the oracle on the pretraining's sequences (4x its tokens) and on its tokens, at the first seed (oracle_seeds)
    assert {(c["label"], c["seed"]) for c in cells if c["section"] == "oracle"} == {
        ("rope", "3"),
        ("rope-equal-tokens", "3"),
    }
    heading = next(line for line in text.splitlines() if line.startswith("## 5. "))
    # a checkout where git shows the claims file committed before the run's commit, or anywhere else
    assert heading.startswith(
        (
            "## 5. Primary claims (pre-registered in `minilm/study/registered/",
            "## 5. The claims of `minilm/study/registered/",
        )
    )
    exploratory = text.split("## 6. Expectations")[1]
    verdict_rows = [line for line in exploratory.splitlines() if line.startswith("| ") and " (n=2) | " in line]
    assert verdict_rows and all(any(v in row for v in ("| yes |", "| no |", "| unresolved |")) for row in verdict_rows)
    primary_rows = [
        line
        for line in text.split("## 5. ")[1].split("## 6.")[0].splitlines()
        if line.startswith("| ") and not line.startswith("| id |")
    ][1:]
    assert len(primary_rows) >= 5 and all(
        row.rstrip(" |").endswith(("supported", "not tested")) for row in primary_rows
    )
    plan_block = yaml.safe_load(text.split("```yaml\n")[1].split("```")[0])
    assert plan_block["seeds"] == [3, 4] and plan_block["train"]["max_steps"] == 10
    probes = list(csv.DictReader(open(out / "retrieval.csv")))
    r = plan["retrieval"]
    assert {(p["label"], p["when"]) for p in probes if p["section"] == "extension"} == {
        (m, w) for m in extension.extension_labels(plan) for w in ("before", "after")
    }
    scratch_probes = [  # the single needle's, at the tables' seeds (9: the claim seed)
        p for p in probes if p["section"] == "scratch" and p["keys"] == "1" and p["seed"] != "9"
    ]
    assert len(scratch_probes) == len(designs.scratch_labels(designs.QUICK)) * 2 * len(r["multiples"]) * len(
        r["depths"]
    )
    assert {p["correct"] for p in scratch_probes if p["label"] == "learned" and int(p["length"]) > L} == {""}
    assert all(p["trials"] == str(r["trials"]) for p in probes)
    state = json.loads((out / "study.json").read_text(encoding="utf-8"))
    assert "id: alibi-flat" in state["claims"]["text"]  # the claims as the run read them when it started
    curves = [
        c["by_position"]
        for c in state["cells"]
        if c["mode"] == "nonoverlapping" and c["section"] == "scratch" and c["length"] == 8 * L and c["status"] == "ok"
    ]
    assert curves and all(len(c) == 8 * L // plan["eval"]["position_bin"] for c in curves)
    assert {c["mode"] for c in cells} == {"nonoverlapping", "sliding", "fixed-stride"}
    if have_matplotlib():
        for figure in (
            "perplexity-by-length.png",
            "loss-by-position.png",
            "retrieval-by-length-and-depth.png",
            "extension-perplexity-by-step.png",
            "extension-retrieval-by-length-and-depth.png",
        ):
            assert f"]({figure})" in text and os.path.getsize(out / figure) > 1000


@pytest.mark.slow
def test_the_study_reads_retrieval_by_distance_multikey_probes_and_the_truncated_control(quick_study):
    """Issue #58, item 5: multi-key probes beside the single needle's, every row with its distance, the
    tables by distance, and the loss by position with the context cut to L beside the whole segment's."""
    out, plan, L = quick_study, designs.QUICK, designs.QUICK["model"]["block_size"]
    keys = str(plan["retrieval"]["keys"])
    probes = list(csv.DictReader(open(out / "retrieval.csv")))
    assert {p["keys"] for p in probes if p["section"] not in ("tuning",)} == {"1", keys}
    assert {p["keys"] for p in probes if p["section"] == "tuning"} == {"1"}  # the tuning asks the single needle
    cell = lambda p: (p["label"], p["seed"], p["length"], p["depth"])  # noqa: E731
    single, multi = ([cell(p) for p in probes if p["keys"] == k and p["section"] == "scratch"] for k in ("1", keys))
    assert sorted(single) == sorted(multi)  # the same cells, each probed both ways
    assert all(int(p["distance"]) == distance(int(p["length"]), float(p["depth"])) for p in probes)
    text = (out / "report.md").read_text(encoding="utf-8")
    section = text.split("## 3. Retrieval")[1].split("## 4. ")[0]
    assert "| model | [0, L) | [L, 2L) | [2L, 4L) | [4L, 8L) |" in section
    assert f"Multi-key probes: {keys} pairs" in section
    assert "Retrieval by distance to the needle, before and after fine-tuning" in text
    assert "The control: the same positions scored with the context cut to L" in text
    assert f"| cut to L, {L}-{2 * L - 1} | cut - whole, {L}-{2 * L - 1} |" in text
    width = plan["eval"]["position_bin"]
    cells = json.loads((out / "study.json").read_text(encoding="utf-8"))["cells"]
    longest = [c for c in cells if c["mode"] == "nonoverlapping" and c["length"] == 8 * L and c["status"] == "ok"]
    assert {c["section"] for c in longest if c["truncated_by_position"]} == {"scratch", "extension", "oracle"}
    for c in longest:
        if c["truncated_by_position"]:  # below L nothing is cut; past it, the cut context changes the losses
            assert c["truncated_by_position"][: L // width] == c["by_position"][: L // width]
            assert c["truncated_by_position"][L // width :] != c["by_position"][L // width :]
        else:  # the loss by position reads the extension's last step only
            assert c["section"] == "extension" and c["step"] != plan["extension"]["curve_steps"][-1]


@pytest.mark.slow
def test_the_extension_curve_reads_the_intermediate_snapshots(quick_study):
    out, L = quick_study, designs.QUICK["model"]["block_size"]
    middle = designs.QUICK["extension"]["curve_steps"][1]
    run = out / "runs" / f"rope-linear-{4 * L}-s3"
    snapshot = run / "snapshots" / f"step-{middle}.pt"
    assert snapshot.is_file()
    cells = [
        c
        for c in csv.DictReader(open(out / "results.csv"))
        if c["section"] == "extension"
        and c["label"] == "linear"
        and c["seed"] == "3"
        and c["mode"] == "nonoverlapping"
        and int(c["length"]) == 4 * L
    ]
    by_step = {int(c["step"]): float(c["nll"]) for c in cells}
    tokens = int(cells[0]["tokens"])
    again = evaluation.evaluate_checkpoints([str(snapshot)], lengths=[4 * L], max_tokens=tokens, quiet=True)[0]
    assert by_step[middle] == pytest.approx(again.nll, rel=1e-5)  # the cell is the snapshot's, evaluated again
    assert len(set(by_step.values())) == len(by_step)  # 0, the middle snapshot and the end all differ
    source = evaluation.evaluate_checkpoints(
        [str(out / "runs" / "rope-s3")],
        lengths=[4 * L],
        max_tokens=tokens,
        overrides=["model.position.scaling={type: linear, factor: 4}"],
        quiet=True,
    )[0]
    assert by_step[0] == pytest.approx(source.nll, rel=1e-5)  # step 0: the source with the scaling applied


@pytest.mark.slow
def test_the_sweep_chooses_each_methods_rate_on_held_out_text_at_the_tuning_seeds(quick_study):
    out, L = quick_study, designs.QUICK["model"]["block_size"]
    state = json.loads((out / "study.json").read_text(encoding="utf-8"))
    cells = [c for c in state["cells"] if c["section"] == "sweep"]
    labels = extension.extension_labels(state["plan"], text_only=False)  # the rows the sweep tunes
    # each row at each rate of its grid (the plan's, extended past a choice at an edge), fine-tuned from the
    # tuning seed's model and scored at 4L on the holdout
    grids = yaml.safe_load((out / "rates.yaml").read_text(encoding="utf-8"))["grids"]["finetune_lrs"]
    assert {(c["label"], c["seed"], c["length"]) for c in cells} == {
        (sweep.cell_label(label, lr), 101, 4 * L) for label in labels for lr in grids[label]
    }
    assert {c["tokens"] for c in cells} == {2047 // (4 * L) * 4 * L}
    val = next(c for c in state["cells"] if c["section"] == "scratch")
    assert val["tokens"] != cells[0]["tokens"]
    for label in labels:
        assert {1e-4, 3e-3} <= set(grids[label])
        ppl = {lr: c["ppl"] for c in cells for lr in grids[label] if c["label"] == sweep.cell_label(label, lr)}
        chosen = min(ppl, key=ppl.get)
        assert state["finetune_lrs"][label] == chosen and min(grids[label]) < chosen < max(grids[label])
        # the sweep's runs start from the tuning seed's model of the row's kind, at the scale chosen for it
        kind = extension.extension_runs(state["plan"])[label][0]
        source = f"{kind}-lr{state['lr_scales'][kind]:g}-t101"
        sweep_run = torch.load(out / "runs" / f"{label}-lr{chosen:g}-t101" / "ckpt.pt", weights_only=False)
        assert sweep_run["config"]["train"]["init_from"].endswith(source)
        # every extension run of the row (each seed) trained at the row's rate, as its checkpoint says
        for name, run in state["runs"].items():  # and its text-only twin, at the same rate
            if run["section"] == "extension" and extension.twin_of(run["label"]) == label:
                config = torch.load(out / "runs" / name / "ckpt.pt", weights_only=False)["config"]
                assert config["train"]["lr"] == pytest.approx(chosen) and run["config"]["train"]["lr"] == chosen
                assert config["train"]["min_lr"] == pytest.approx(chosen / 10)
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "Fine-tuning rates, chosen on held-out training text" in text and "The plateau:" in text


@pytest.mark.slow
def test_the_study_fine_tunes_on_text_alone_and_asks_the_passkey_before_and_after(quick_study):
    """Issue #58, item 3: every extension row's text-only twin trained with no retrieval rows (its checkpoint
    says so) and read like its twin; the PI paper's passkey at 4L for every row, zero-shot and after; the
    perplexity against the keep-at-L control."""
    out, plan, L = quick_study, designs.QUICK, designs.QUICK["model"]["block_size"]
    labels = extension.extension_labels(plan)
    assert len(labels) == 2 * len(extension.extension_labels(plan, text_only=False))
    for name, run in json.loads((out / "study.json").read_text(encoding="utf-8"))["runs"].items():
        if run["section"] == "extension":
            train = torch.load(out / "runs" / name / "ckpt.pt", weights_only=False)["config"]["train"]
            assert (train["retrieval_share"] == 0) == extension.is_text_only(run["label"]), name
    rows = list(csv.DictReader(open(out / "passkey.csv")))
    assert {(r["label"], r["when"]) for r in rows if r["seed"] != "9"} == {
        (m, w) for m in labels for w in ("before", "after")
    }
    assert {(r["seed"], int(r["length"]), int(r["trials"])) for r in rows} == {
        (s, 4 * L - 8, plan["extension"]["passkey_trials"])
        for s in ("3", "4", "9")  # 9: the claim seed's rows
    }
    assert {float(r["depth"]) for r in rows} == set(plan["retrieval"]["depths"])
    text = (out / "report.md").read_text(encoding="utf-8")
    section = text.split("## 4. ")[1].split("## 5. ")[0]
    assert f"Passkey retrieval at {4 * L - 8} tokens" in section and "| PI (linear), text-only | " in section
    assert f"| method | ppl at {4 * L} | / kept at L, at {L} | / kept at L, at {4 * L} | / source at {L} |" in section
    assert "**Text-only fine-tuning**" in text and "**Passkey**" in text


def machine_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("Machine: "))


@pytest.mark.slow
def test_report_only_rewrites_from_the_record_and_keeps_a_discussion(quick_study, monkeypatch):
    out = quick_study
    (out / "discussion.md").write_text("The numbers of this tiny run mean nothing.\n", encoding="utf-8")
    state = json.loads((out / "study.json").read_text(encoding="utf-8"))
    assert state["run"]["command"].startswith("python -m minilm experiment length-generalization --quick")
    ran_on = machine_line((out / "report.md").read_text(encoding="utf-8"))
    monkeypatch.setattr(report, "host_line", lambda: "another machine")  # rewritten elsewhere, or with other threads
    assert experiment_cli.main(["length-generalization", "--out", str(out), "--report-only"]) == 0
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "## 7. Discussion" in text and "mean nothing" in text
    assert machine_line(text) == ran_on and "another machine" not in text  # the machine the jobs ran on


def test_a_rewritten_report_names_the_machine_its_jobs_ran_on(tmp_path, monkeypatch):
    """A record of an earlier version has no machine: the report that run wrote names it; with neither,
    the rewriting machine is named as such, never passed off as the run's."""
    monkeypatch.setattr(report, "host_line", lambda: "this machine")
    assert report.recorded_host({"machine": "the run's machine"}, str(tmp_path)) == "the run's machine"
    (tmp_path / "report.md").write_text(
        "# A study\n\nMachine: the first machine; CPU flags: avx2  \n", encoding="utf-8"
    )
    assert report.recorded_host({}, str(tmp_path)) == "the first machine; CPU flags: avx2"
    (tmp_path / "report.md").unlink()
    assert "this machine" in report.recorded_host({}, str(tmp_path))
    assert "not recorded by the run" in report.recorded_host({}, str(tmp_path))


@pytest.mark.slow
def test_the_ablation_runs_its_groups_against_paired_references(tiny_corpus, tmp_path):
    out = tmp_path / "ablation"
    data = [
        f"data.corpus={tiny_corpus / 'corpus.txt'}",
        "data.vocab_size=400",
        f"data.dir={tiny_corpus / 'data'}",
        "train.max_steps=5",
    ]
    code = experiment_cli.main(
        [
            "ablation",
            "--quick",
            "--out",
            str(out),
            "--seeds",
            "1,2",
            "--workers",
            "1",
            "--quiet",
            "ablation.groups=[base, concat]",
            *data,
        ]
    )
    assert code == 0
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "# Ablations" in text and "## 1.1 Sinusoidal base frequency" in text and "## 1.2 Concatenated" in text
    assert "| sinusoidal | base 100,000 |" in text and "| learned | concatenated (16 + 16 dims) |" in text
    assert "Retrieval" not in text and "dim dropout" not in text  # the groups not chosen are not run
    cells = list(csv.DictReader(open(out / "results.csv")))
    # the references (sinusoidal, learned) are run once and shared by the groups that read them
    assert {c["label"] for c in cells} == {
        "sinusoidal",
        "sinusoidal-base1000",
        "sinusoidal-base100000",
        "sinusoidal-concat",
        "learned",
        "learned-concat",
    }
    assert {c["seed"] for c in cells} == {"1", "2"}
    # a ratio in the table is the per-seed ratio of the two cells, averaged
    L = designs.QUICK["model"]["block_size"]
    ppl = {(c["label"], c["seed"]): float(c["ppl"]) for c in cells if int(c["length"]) == L}
    mean = sum(ppl[("sinusoidal-base1000", s)] / ppl[("sinusoidal", s)] for s in "12") / 2
    assert "| sinusoidal | base 1,000 | " in text and f"| {mean:.3f} ± " in text
    heading = next(line for line in text.splitlines() if line.startswith("## 2. "))
    assert "`minilm/study/registered/ablation.yaml`" in heading  # pre-registered or not, by what git shows
    if have_matplotlib():
        assert os.path.getsize(out / "ablation-perplexity-by-length.png") > 1000
    # run again over it: the earlier run's hand-written discussion is kept aside, not carried into this report
    (out / "discussion.md").write_text("About the first run only.\n", encoding="utf-8")
    assert (
        experiment_cli.main(
            [
                "ablation",
                "--quick",
                "--out",
                str(out),
                "--seeds",
                "1",
                "--workers",
                "1",
                "--quiet",
                "--overwrite",
                "ablation.groups=[base]",
                *data,
            ]
        )
        == 0
    )
    assert (out / "discussion.1.md").read_text(encoding="utf-8") == "About the first run only.\n"
    assert not (out / "discussion.md").exists() and "first run" not in (out / "report.md").read_text(encoding="utf-8")


@pytest.mark.slow
def test_an_interrupted_experiment_resumes_from_its_journal(tiny_corpus, tmp_path, capsys):
    out = tmp_path / "ablation"
    args = [
        "ablation",
        "--quick",
        "--out",
        str(out),
        "--seeds",
        "1",
        "--workers",
        "1",
        "--quiet",
        "ablation.groups=[base]",
        f"data.corpus={tiny_corpus / 'corpus.txt'}",
        "data.vocab_size=400",
        f"data.dir={tiny_corpus / 'data'}",
        "train.max_steps=5",
    ]
    assert experiment_cli.main([*args, "--overwrite"]) == 0  # as a confirmatory run begins, over any earlier one
    first = (out / "results.csv").read_text()
    journal = sorted(p for p in (out / "journal").glob("*.json") if p.name != "meta.json")  # the jobs' entries
    kept = {p: p.stat().st_mtime_ns for p in journal[::2]}
    for path in journal[1::2]:  # as if the run had been killed before these jobs finished
        path.unlink()
    (out / "study.json").unlink()
    assert experiment_cli.main(args) == 2  # an earlier experiment is not run over unasked
    assert "--resume to continue it" in capsys.readouterr().err
    assert experiment_cli.main([*args, "--resume"]) == 0
    assert (out / "results.csv").read_text() == first  # the jobs run again give the same cells
    assert (
        all(p.stat().st_mtime_ns == t for p, t in kept.items())
        and len(list((out / "journal").glob("*.json"))) == len(journal) + 1
    )
    text = (out / "report.md").read_text(encoding="utf-8")
    command = next(line for line in text.splitlines() if line.startswith("Command: "))
    assert "the last of 2 invocations" in text and "--overwrite" in command and "--resume" not in command  # as begun
    assert experiment_cli.main([*args[:-1], "train.max_steps=6", "--resume"]) == 2
    assert "the plan differs" in capsys.readouterr().err
    assert experiment_cli.main([*args, "--resume", "--overwrite"]) == 2


def test_ablation_variants_are_sized_for_the_plan():
    full, quick = (experiments.make_plan("ablation", q)["ablation"]["variants"] for q in (False, True))
    assert full["sinusoidal-concat"]["model"] == {"concat_position_dims": 64}
    assert quick["learned-concat"]["model"] == {"concat_position_dims": 16}
    assert full["learned-2x-tokens"]["train"] == {"max_steps": 1000, "warmup_steps": 100}
    assert full["rope-no-task"]["train"] == {"retrieval_share": 0.0, "retrieval_weight": 0.0}  # text alone
    gap = experiments.make_plan("ablation", True, None, ["ablation.groups=[gap]"])["ablation"]["variants"]
    assert set(gap) == {
        "sinusoidal",
        "rope",
        "learned",
        "sinusoidal-no-task",
        "rope-no-task",
        "learned-no-task",
        "sinusoidal-2x-tokens",
        "learned-2x-tokens",
        "learned-table-lr10",
    }
    # with half the rows answers only (no text loss), the same text tokens without the task is half the steps
    answers_only = experiments.make_plan(
        "ablation", False, None, ["train.retrieval_weight=0", "train.retrieval_share=0.5"]
    )
    same_text = answers_only["ablation"]["variants"]["rope-no-task-same-text"]["train"]
    assert same_text == {"retrieval_share": 0.0, "retrieval_weight": 0.0, "max_steps": 250, "warmup_steps": 25}
    with pytest.raises(experiments.ExperimentError, match="ablation.groups=.*valid: base, dim-dropout, concat, gap"):
        experiments.make_plan("ablation", True, None, ["ablation.groups=[bases]"])
    # a variant's settings reach its run's config, over the scheme's own settings of the plan
    plan = experiments.make_plan("ablation", False)
    v = plan["ablation"]["variants"]["sinusoidal-concat"]
    config = experiments.run_config(
        plan, "/tmp/x", v["position"], 1, settings={"model": v["model"], "train": v["train"]}
    )
    assert config.model.concat_position_dims == 64 and config.model.embedding_init_std == 0.02
    # every variant of the full ablation makes a valid run (the graph is built before any job runs)
    study = experiments.Study(plan, "/tmp/ablation-graph")
    study.scored_tokens = 8192
    assert len(study.build()) == 2 * len(plan["seeds"]) * len(plan["ablation"]["variants"])
    assert study.runs["alibi-float32-s1"].config.train.dtype == "float32"


def test_plan_overrides_and_errors(capsys, tmp_path):
    plan = experiments.make_plan("length-generalization", True, [5, 6], ["data.corpus=texts/", "finetune.lr=1e-4"])
    assert plan["seeds"] == [5, 6] and plan["data"]["corpus"] == "texts/" and plan["finetune"]["lr"] == 1e-4
    assert designs.FULL["data"]["corpus"] == "shakespeare" and designs.FULL["seeds"] == [1, 2, 3, 4, 5]
    with pytest.raises(experiments.ExperimentError, match="unknown section 'modle'"):
        experiments.make_plan("length-generalization", False, None, ["modle.d_model=3"])
    with pytest.raises(experiments.ExperimentError, match="curve_steps"):
        experiments.make_plan("length-generalization", True, None, ["extension.curve_steps=[10, 5]"])
    with pytest.raises(experiments.ExperimentError, match=r"tuning.lr_scales=\[1, 1, 2\] is invalid: expected each"):
        experiments.make_plan("length-generalization", True, None, ["tuning.lr_scales=[1, 1, 2]"])
    with pytest.raises(experiments.ExperimentError, match="at least two after it"):  # the plateau reads the last two
        experiments.make_plan("length-generalization", True, None, ["extension.curve_steps=[0, 10]"])
    with pytest.raises(experiments.ExperimentError, match="eval.position_bin=12 is invalid: .* divides L=32"):
        experiments.make_plan("length-generalization", True, None, ["eval.position_bin=12"])
    header = report._length_table([], "scratch", ["rope"], [64, 128], "nonoverlapping", 32).splitlines()[0]
    assert "64 (2L)" in header and "128 (4L)" in header  # in units of L, whatever the first length
    sliding = tmp_path / "sliding"  # the claims read the nonoverlapping protocol: refused before anything runs
    assert experiment_cli.main(["length-generalization", "--quick", "--out", str(sliding), "eval.modes=[sliding]"]) == 2
    assert "mode='nonoverlapping' is not among the study's eval.modes" in capsys.readouterr().err
    assert not sliding.exists()
    with pytest.raises(experiments.ExperimentError, match="valid: none, linear, ntk, dynamic, yarn, llama3"):
        experiments.make_plan("length-generalization", True, None, ["extension.methods=[pi]"])
    with pytest.raises(experiments.ExperimentError, match="eval.modes"):
        experiments.make_plan("length-generalization", True, None, ["eval.modes=[strided]"])
    with pytest.raises(experiments.ExperimentError, match="retrieval.depths"):
        experiments.make_plan("length-generalization", True, None, ["retrieval.depths=[2]"])
    with pytest.raises(experiments.ExperimentError, match="unknown section 'extension'"):
        experiments.make_plan("ablation", True, None, ["extension.factor=2"])
    refused = tmp_path / "refused"
    assert experiment_cli.main(["length-generalization", "--quick", "--out", str(refused), "model.n_head=3"]) == 2
    assert "error: experiment settings: model.d_model=32 is not divisible by model.n_head=3" in capsys.readouterr().err
    assert not refused.exists()  # refused before anything is written
    with pytest.raises(SystemExit) as stop:
        experiment_cli.main(["length-generalization", "--quick", "--seeds", "1,1"])
    assert stop.value.code == 2 and "repeats a seed" in capsys.readouterr().err
    assert experiment_cli.main(["length-generalization", "--out", str(tmp_path), "--report-only"]) == 2
    assert "study.json" in capsys.readouterr().err
    for foreign in ('{"plan": {}}', "[1, 2]"):  # another program's JSON: one line, no traceback
        (tmp_path / "study.json").write_text(foreign)
        assert experiment_cli.main(["length-generalization", "--out", str(tmp_path), "--report-only"]) == 2
        assert "is not a study record: it lacks what a study writes" in capsys.readouterr().err
    (tmp_path / "study.json").unlink()
    untuned = tmp_path / "ablation-tuning"
    assert experiment_cli.main(["ablation", "--quick", "--tune", "--out", str(untuned)]) == 2
    assert "--tune: ablation has no tuning step" in capsys.readouterr().err
    assert not untuned.exists()  # not the whole ablation run under a tuning step's name


def test_the_registered_rates_are_tuned_for_the_registered_design():
    """The study's frozen rates fit its plan as shipped (a change of the design that the rates depend on must
    come with the tuning step run again), and every choice lies inside its grid. (The replication's rates are
    of its design before 1500 steps from scratch: its tuning step runs again for them.)"""
    from minilm.study import rates

    plan = experiments.make_plan("length-generalization", False)
    path = rates.registered_path("length-generalization")
    contents = rates.read(path, "length-generalization")
    rates.check(contents, path, plan, designs.scratch_labels(plan), experiment_cli.sweep_rows(plan))
    for kind, scale in contents["scales"].items():
        grid = contents["grids"]["scales"][kind]
        assert min(grid) < scale < max(grid), kind
    for row, lr in contents["finetune_lrs"].items():
        grid = contents["grids"]["finetune_lrs"][row]
        assert min(grid) < lr < max(grid), row
    refused = experiments.make_plan("replication-512", False)
    replication = rates.registered_path("replication-512")
    with pytest.raises(rates.RatesError, match=r"tuned for other settings \(train.max_steps\)"):
        rates.check(rates.read(replication, "replication-512"), replication, refused, [], [])


def test_a_study_trains_only_at_rates_tuned_for_its_settings(capsys, tmp_path):
    """Without a rates file, or with one tuned for other settings, a study stops in one line before any
    job, naming the tuning step; --quick tunes first instead (the quick study above)."""
    from minilm.study import rates

    missing = tmp_path / "none.rates.yaml"
    args = ["length-generalization", "--quiet", "--rates", str(missing), "--out", str(tmp_path / "a")]
    assert experiment_cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no frozen rates at '{missing}'" in err
    assert "python -m minilm experiment length-generalization --tune" in err
    other = experiments.make_plan("length-generalization", True, [1], ["model.d_model=64"])
    path = rates.write(str(tmp_path / "other.rates.yaml"), frozen_rates(other))
    args = ["length-generalization", "--quick", "--quiet", "--rates", path, "--out", str(tmp_path / "b")]
    assert experiment_cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "were tuned for other settings (model.d_model)" in err
    denser = experiments.make_plan("length-generalization", True, [1], ["retrieval.query_density=[6, 128]"])
    path = rates.write(str(tmp_path / "denser.rates.yaml"), frozen_rates(denser))
    args = ["length-generalization", "--quick", "--quiet", "--rates", path, "--out", str(tmp_path / "d")]
    assert experiment_cli.main(args) == 2  # the task's rows are part of what the rates were tuned for
    assert "were tuned for other settings (retrieval.query_density)" in capsys.readouterr().err
    near = experiments.make_plan("length-generalization", True, [1], ["retrieval.spread=false"])
    assert not experiments.run_config(near, str(tmp_path / "r"), {"kind": "rope"}, 1).train.retrieval_spread
    assert experiments.run_config(denser, str(tmp_path / "r"), {"kind": "rope"}, 1).train.retrieval_spread
    path = rates.write(str(tmp_path / "spread.rates.yaml"), frozen_rates(near))
    args = ["length-generalization", "--quick", "--quiet", "--rates", path, "--out", str(tmp_path / "e")]
    assert experiment_cli.main(args) == 2  # rows whose lookups reach further are another task to tune for
    assert "were tuned for other settings (retrieval.spread)" in capsys.readouterr().err
    fewer = experiments.make_plan("length-generalization", True, [1])
    contents = frozen_rates(fewer)
    del contents["scales"]["fire"]
    path = rates.write(str(tmp_path / "fewer.rates.yaml"), contents)
    args = ["length-generalization", "--quick", "--quiet", "--rates", path, "--out", str(tmp_path / "c")]
    assert experiment_cli.main(args) == 2
    assert "have no rate for ['fire']: run the tuning step again (--tune)" in capsys.readouterr().err
    assert not (tmp_path / "c" / "runs").exists()  # refused before any job


def test_the_replications_oracle_trains_1000_steps_on_rows_placed_as_every_runs(tmp_path):
    """Every run of both designs that trains on the task (from scratch, extensions, controls, claim seeds,
    the tuning and sweep runs; not the text-only rows) places each row's first query spread over the row;
    the replication's oracle on the pretraining's sequences trains 1000 steps (at 2048 it is still learning the
    task at 500; the models from scratch train 1500), the equal-token oracle keeps the pretraining's steps and
    tokens, and the report's rows and section 4 say so."""
    tokens = lambda run: run.config.train.max_steps * run.config.train.batch_size * run.config.model.block_size  # noqa
    for name, seed in (("length-generalization", 1), ("replication-512", 11)):
        plan = experiments.make_plan(name, False, [seed])
        study = experiments.Study(plan, str(tmp_path / name))
        study.scored_tokens = 8192
        study.use_rates(frozen_rates(plan), {"path": "rates.yaml", "commit": None, "registered": None})
        study.claimed = primary.retrieval_rows(primary.path_for(name))
        study.build()
        tuning.build(study, [("rope", 1.0)])
        sweep.build(study, [("yarn", 1e-3)])
        sections = {run.section for run in study.runs.values()}
        assert {"scratch", "extension", "oracle", "oracle-source", tuning.SECTION, sweep.SECTION} <= sections
        assert {run.seed for run in study.runs.values()} > {seed, *tuning.seeds(plan)}  # the claim seeds' runs too
        for run in study.runs.values():
            train = run.config.train
            assert train.retrieval_spread or train.retrieval_share == 0, run.key  # text-only rows: no task rows
        assert any(run.config.train.retrieval_share == 0 for run in study.runs.values()) == (name != "replication-512")
    runs = study.runs
    oracle, equal, source = runs["rope-2048-oracle-s11"], runs["rope-equal-tokens-2048-oracle-s11"], runs["rope-s11"]
    assert oracle.config.train.max_steps == 1000 and source.config.train.max_steps == 1500
    assert equal.config.train.max_steps == source.config.train.max_steps
    assert 3 * tokens(oracle) == 8 * tokens(source) and tokens(equal) == tokens(source)
    assert oracle.config.train.lr == source.config.train.lr  # the kind's frozen rate, over the longer schedule
    named = "rope trained at 2048 (oracle, 4 rows per step, 2.67x the tokens in 1000 steps)"
    assert report._oracle_names(plan)["rope"] == named
    equal_named = "rope trained at 2048 (oracle, 1 row per step, then fine-tuned: the extension's tokens and steps)"
    assert report._oracle_names(plan)["rope-equal-tokens"] == equal_named
    study.cells, study.retrieval = [], []
    said = " ".join(report._extension(study, {}))
    assert "on the pretraining's sequences, 2.67x its tokens in 1000 steps, and on its tokens" in said
    first = experiments.make_plan("length-generalization", False, [1])
    assert extension.oracle_steps(first) == first["train"]["max_steps"]  # L = 128's oracle: the pretraining's steps
    assert report._oracle_names(first)["rope"] == "rope trained at 512 (oracle, 16 rows per step, 4x the tokens)"
    assert designs.ABLATION_FULL["train"]["retrieval_spread"]  # the ablation's rows as the study's


def cells(section, label, length, per_seed, step=None, mode="nonoverlapping"):
    return [
        dict(section=section, label=label, length=length, mode=mode, step=step, seed=seed, ppl=ppl, status="ok")
        for seed, ppl in enumerate(per_seed, 1)
    ]


def test_verdicts_are_paired_ratios_over_seeds():
    plan = experiments.make_plan("length-generalization", True, [1, 2, 3], ["eval.modes=[nonoverlapping]"])
    L = plan["model"]["block_size"]
    study = (
        cells("scratch", "rope", L, [40, 50, 45])
        + cells("scratch", "rope", 4 * L, [48, 61, 53])
        + cells("scratch", "sinusoidal", L, [41, 52, 46])
        + cells("scratch", "learned", L, [40, 50, 45])
        + cells("scratch", "alibi", L, [40, 50, 45])
        + cells("scratch", "alibi", 4 * L, [41, 60, 44])
    )
    rows = {row[0]: row for row in claims.verdicts(study, plan)}
    assert rows["plain rope at 4L worse than at L"][-1] == "yes"  # +20%, +22%, +18%: every seed
    assert rows["sinusoidal at L within 15% of learned at L"][-1] == "yes"
    assert rows["alibi at 4L within 10% of its L perplexity"][-1] == "unresolved"  # +2.5%, +20%, -2%
    assert rows["at 4L, xpos beats rope"][-2:] == ["not run", "n/a"]


def probes(label, length, correct, trials=32, depth=0.0, section="scratch", when=None, seeds=(1, 2)):
    return [
        dict(
            section=section,
            label=label,
            length=length,
            depth=depth,
            correct=c,
            trials=trials,
            seed=seed,
            **({"when": when} if when else {}),
        )
        for seed, c in zip(seeds, correct)
    ]


def test_retrieval_claims_are_read_only_past_the_gate():
    plan = experiments.make_plan("length-generalization", True, [1, 2])
    L = plan["model"]["block_size"]
    learned = (
        probes("rope", L, [31, 30])
        + probes("rope", 4 * L, [2, 1])
        + probes("alibi", L, [30, 31])
        + probes("alibi", 4 * L, [3, 4])
    )
    label, best, passed = claims.gate(learned, plan)
    assert passed and best == pytest.approx(61 / 64) and label in ("rope", "alibi")
    rows = {row[0]: row for row in claims.retrieval_verdicts(learned, plan)}
    assert rows["rope at 4L, depths pooled: below 50%"][-1] == "yes"
    assert rows["alibi at 4L below alibi at L, depths pooled"][-1] == "yes"
    assert rows["PI (linear) after fine-tuning at 4L: above 50%"][-2:] == ["not run", "n/a"]
    unlearned = probes("rope", L, [3, 2]) + probes("rope", 4 * L, [2, 1])
    assert not claims.gate(unlearned, plan)[2]
    rows = {row[0]: row for row in claims.retrieval_verdicts(unlearned, plan)}
    assert rows["rope at 4L, depths pooled: below 50%"][-1] == "not read (gate failed)"


def test_the_plans_scheme_settings_reach_only_that_schemes_runs(tmp_path):
    plan = experiments.make_plan(
        "length-generalization",
        True,
        [1],
        [
            "schemes={t5: {position: {max_distance: 24}, train: {position_lr_scale: 10}}, "
            "sinusoidal: {model: {embedding_init_std: 0.125}}}"
        ],
    )
    t5 = experiments.run_config(plan, str(tmp_path / "t5"), {"kind": "t5"}, 1)
    assert t5.model.position == {"kind": "t5", "max_distance": 24} and t5.train.position_lr_scale == 10
    sinusoidal = experiments.run_config(plan, str(tmp_path / "s"), {"kind": "sinusoidal"}, 1)
    assert sinusoidal.model.embedding_init_std == 0.125 and sinusoidal.train.position_lr_scale == 1
    rope = experiments.run_config(plan, str(tmp_path / "r"), {"kind": "rope"}, 1)
    assert rope.model.position == {"kind": "rope"} and rope.model.embedding_init_std == 0.02
    assert (rope.seed, rope.data_seed) == (1, experiments.DATA_SEED_OFFSET + 1)  # two streams, both recorded
    with pytest.raises(experiments.ExperimentError, match="max_distance"):
        experiments.run_config(
            experiments.make_plan("length-generalization", True, [1], ["schemes={t5: {position: {max_distance: 0}}}"]),
            str(tmp_path / "bad"),
            {"kind": "t5"},
            1,
        )


def test_every_scheme_shares_one_embedding_recipe_and_randomized_draws_past_the_longest_length(tmp_path):
    plan = experiments.make_plan("length-generalization", True, [1])
    L = plan["model"]["block_size"]
    configs = {kind: experiments.run_config(plan, str(tmp_path / kind), {"kind": kind}, 1) for kind in designs.KINDS}
    recipes = {(c.model.embedding_init_std, c.model.embedding_scale) for c in configs.values()}
    assert recipes == {(0.02, "auto")}  # GPT-2's table; each scheme's own input multiplier
    assert configs["kerple"].model.position["floor"] == 1e-2  # chijames/KERPLE's clamp
    assert configs["xpos"].model.position["scale_base"] == L / 2  # torchscale's 512 for 1,024
    assert configs["t5"].model.position == {"kind": "t5"}  # the reference layout: 32 buckets to 128
    longest = max(plan["eval"]["multiples"] + plan["retrieval"]["multiples"]) * L
    assert configs["randomized"].model.position["max_positions"] >= 4 * longest
    model = GPT(configs["randomized"].model).eval()  # eval_positions: sampled, as the study evaluates
    seen, inner = [], model.positions.inner
    start = inner.start
    inner.start = lambda pos, context_len: seen.append(pos) or start(pos, context_len)  # what the wrapped rope is given
    for _ in range(3):  # a draw at the longest length is a sample of the range, never every position
        model(torch.zeros(1, longest, dtype=torch.long))
    for drawn in seen:
        assert len(drawn) == longest == len(torch.unique(drawn)) and int(drawn.max()) >= longest
    assert not torch.equal(seen[0], seen[1])


def test_each_scheme_takes_the_scale_with_the_lowest_held_out_log_perplexity():
    from minilm.study import tuning

    plan = experiments.make_plan(
        "length-generalization", True, [1], ["tuning.seeds=[101, 102]", "tuning.task_floor=0.5"]
    )
    L = plan["model"]["block_size"]

    def cell(kind, scale, seed, ppl):
        return dict(
            section="tuning",
            label=tuning.label(kind, scale),
            seed=seed,
            step=None,
            mode="nonoverlapping",
            length=L,
            ppl=ppl,
        )

    # geometric means: x0.5 sqrt(40 * 90) = 60, x1 sqrt(50 * 60) = 54.8, x2 diverged on one seed (out)
    cells = [
        cell("t5", 0.5, 101, 40),
        cell("t5", 0.5, 102, 90),
        cell("t5", 1.0, 101, 50),
        cell("t5", 1.0, 102, 60),
        cell("t5", 2.0, 101, 10),
        cell("t5", 2.0, 102, float("inf")),
    ]
    grid = [0.5, 1.0, 2.0]
    assert tuning.choose(plan, cells, [], "t5", grid) == 1.0
    tie = [cell("rope", 0.5, s, 50) for s in (101, 102)] + [cell("rope", 2.0, s, 50) for s in (101, 102)]
    assert tuning.choose(plan, tie, [], "rope", grid) == 0.5  # equally far from 1 (x0.5, x2): the first, the smaller
    with pytest.raises(tuning.TuningError, match=r"no scale of \[0.5, 1.0, 2.0\] .* left for fire .*x1 diverged"):
        tuning.choose(plan, [cell("fire", 1.0, 101, float("nan"))], [], "fire", grid)

    # a scale whose models fail the task is out: x1 retrieves 3 + 9 of 32 + 32 at L (mean 18.75%, below 50%)
    def probed(kind, scale, seed, correct):
        return dict(section="tuning", label=tuning.label(kind, scale), seed=seed, length=L, correct=correct, trials=32)

    probes = [probed("t5", 1.0, 101, 3), probed("t5", 1.0, 102, 9), probed("t5", 0.5, 101, 32)]
    assert tuning.task_accuracy(probes, "t5", 1.0) == pytest.approx((3 / 32 + 9 / 32) / 2)
    assert tuning.rejected(plan, cells, probes, "t5", grid) == {
        1.0: "failed the task: 18.8% retrieved at L, below 50%",
        2.0: "diverged (no finite held-out perplexity on every tuning seed)",
    }
    assert tuning.choose(plan, cells, probes, "t5", grid) == 0.5  # the next best, geometric mean 60
    # a kind that fails the task at every scale is chosen by its perplexity alone, and listed
    failing = [probed("t5", s, seed, 3) for s in (0.5, 1.0) for seed in (101, 102)]
    assert tuning.rejected(plan, cells, failing, "t5", grid) == {
        2.0: "diverged (no finite held-out perplexity on every tuning seed)"
    }
    assert tuning.choose(plan, cells, failing, "t5", grid) == 1.0
    assert tuning.task_failures(plan, failing, {"t5": [0.5, 1.0]}) == ["t5"]
    assert tuning.task_failures(plan, probes, {"t5": [0.5, 1.0]}) == []


def test_a_choice_at_the_edge_of_its_grid_extends_the_grid_and_tunes_again():
    """The tuning step's rounds (``minilm.study.tune``): a choice at either end adds the next value past
    it (the grid's own ratio) and only those runs are built, until every choice is inside its grid."""
    from minilm.study import tune, tuning

    assert tuning.extend([0.5, 1.0, 2.0], 2.0) == 4.0 and tuning.extend([0.5, 1.0, 2.0], 0.5) == 0.25
    assert tuning.extend([0.5, 1.0, 2.0], 1.0) is None and tuning.extend([1.0], 1.0) is None
    assert tuning.extend([1e-4, 3e-3], 3e-3) == 0.09  # x30, and no float noise (1e-3 x 10 is 0.01, not 0.00999...)
    assert tuning.extend([3e-5, 1e-4, 3e-4, 1e-3], 1e-3) == pytest.approx(
        1e-3 * 1e-3 / 3e-4, rel=1e-5
    )  # 6 significant digits
    best = {"rope": 8.0, "t5": 0.25, "fire": 1.0}  # the scale each row's loss is lowest at
    built = []

    def choose(row, grid):  # the lowest of a bowl around the row's best, among the values run so far
        ran = {v for r, v in built if r == row}
        assert set(grid) == ran  # every value of the grid was built before the choice reads it
        return min(grid, key=lambda v: abs(math.log(v / best[row])))

    grids = {row: [0.5, 1.0, 2.0] for row in best}
    chosen = tune._rounds(grids, built.extend, choose, "the rate scale")
    assert chosen == best
    assert sorted(grids["rope"]) == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]  # 16 shows that 8 is inside
    assert sorted(grids["t5"]) == [0.125, 0.25, 0.5, 1.0, 2.0] and grids["fire"] == [0.5, 1.0, 2.0]
    assert len(built) == len(set(built)) == 3 * 3 + 3 + 2  # no (row, value) runs twice
    with pytest.raises(tuning.TuningError, match="still at the edge of .* after 4 extensions: widen the grid"):
        tune._rounds({"x": [1.0, 2.0]}, lambda pairs: None, lambda row, grid: max(grid), "the rate scale")
    with pytest.raises(experiments.ExperimentError, match="tuning seeds disjoint from the study's seeds"):
        experiments.make_plan("length-generalization", True, [1, 101])
    assert experiments.make_plan("length-generalization", True, [1], ["tuning.lr_scales=[]", "sweep.lrs=[]"])  # allowed
    with pytest.raises(experiments.ExperimentError, match="sweep.lrs needs the tuning section"):
        experiments.make_plan("length-generalization", True, [1], ["tuning.lr_scales=[]"])


def test_the_answers_keep_their_share_of_the_loss_at_every_length():
    """``weight_for_share``: at the weight it gives, the answers of a real retrieval row carry the same
    share of its loss weight at L = 128 and 512 (17.1%, each answer 8 times at 128); at a fixed weight of
    8 their share at 512 falls to 4.6%, where the first confirmatory run's oracle could not learn the task."""
    from minilm.data.retrieval import IGNORE, Task, training_rows
    from minilm.training.mixture import weight_for_share

    task = Task(marker=1000, keys=tuple(range(1001, 1033)), values=tuple(range(1033, 1065)))

    def share(length: int, weight: float, queries: int = 3, spread: bool = False) -> float:
        generator = torch.Generator().manual_seed(length)
        haystacks = torch.randint(0, 1000, (64, length + 1), generator=generator)
        _, y = training_rows(haystacks, dataclasses.replace(task, queries=queries, spread=spread), generator, True)
        answers = torch.isin(y, torch.tensor(task.values))
        text = (y != IGNORE) & ~answers
        assert (answers.sum(1) == queries).all()  # one pair, asked ``queries`` times
        return float((weight * answers.sum()) / (text.sum() + weight * answers.sum()))

    assert weight_for_share(6 / 35, 128) == 8.0
    plan = experiments.make_plan("length-generalization", False, [1])
    for length in (128, 512, 2048):  # a slot at position 0 leaves one more text target: within 0.2%
        assert share(length, weight_for_share(6 / 35, length)) == pytest.approx(6 / 35, rel=2e-3)
        queries = designs.queries_for(plan, length)  # 3, 12, 48: the answers as dense as at L
        assert queries == 3 * length // 128
        assert share(length, weight_for_share(6 / 35, length, queries), queries) == pytest.approx(6 / 35, rel=2e-3)
        # retrieval.spread: the same slots written, elsewhere in the row: the same share at the same weight
        weight = weight_for_share(6 / 35, length, queries)
        assert share(length, weight, queries, spread=True) == pytest.approx(6 / 35, rel=2e-3)
    assert share(512, 8.0) == pytest.approx(0.046, abs=5e-4)
    with pytest.raises(ValueError, match="answer share of 1.0 is invalid"):
        weight_for_share(1.0, 128)
    with pytest.raises(experiments.ExperimentError, match=r"retrieval.answer_share=1.5 is invalid"):
        experiments.make_plan("length-generalization", True, [1], ["retrieval.answer_share=1.5"])
    with pytest.raises(experiments.ExperimentError, match=r"retrieval.query_density=\[3\] is invalid"):
        experiments.make_plan("length-generalization", True, [1], ["retrieval.query_density=[3]"])
    with pytest.raises(experiments.ExperimentError, match=r"retrieval.spread=3 is invalid: expected true or false"):
        experiments.make_plan("length-generalization", True, [1], ["retrieval.spread=3"])
    assert designs.ABLATION_FULL["train"]["retrieval_weight"] == 8.0  # the ablation's rows at L, as the study's


def test_the_replication_is_the_frozen_design_at_L_512_on_fresh_seeds(tmp_path):
    """replication-512: the L = 128 design at L = 512 (extended to 2048) on seeds and tuning seeds no run of the
    first study used, each run from scratch on three times the first study's tokens, its claims file the first's
    thirteen claims."""

    first, plan = (experiments.make_plan(name, False) for name in ("length-generalization", "replication-512"))
    assert plan["model"]["block_size"] == 4 * first["model"]["block_size"] == 512
    used = set(first["seeds"]) | set(first["tuning"]["seeds"])
    assert not used & (set(plan["seeds"]) | set(plan["tuning"]["seeds"])) and len(plan["seeds"]) == 5
    assert set(designs.scratch_labels(plan)) == {"rope", "alibi", "sinusoidal", "t5", "randomized", "none"}
    study = experiments.Study(plan, str(tmp_path))
    study.scored_tokens = 8192
    study.use_rates(frozen_rates(plan), {"path": "rates.yaml", "commit": None, "registered": None})
    study.build()
    runs = study.runs
    tokens = lambda run: run.config.train.max_steps * run.config.train.batch_size * run.config.model.block_size  # noqa
    # three times the first study's tokens: in 500 steps rope, sinusoidal, randomized and NoPE do not learn the task
    assert tokens(runs["rope-s11"]) == 3 * first["train"]["max_steps"] * first["train"]["batch_size"] * 128
    check_graph(study.jobs)  # every job's sources are in the graph (no extension from a kind it does not train)
    assert runs["rope-yarn-2048-s11"].config.model.block_size == 2048
    with pytest.raises(experiments.ExperimentError, match=r"other_extensions has \['learned-pi'\], whose source kind"):
        experiments.make_plan("replication-512", False, None, ["controls.other_extensions=[learned-pi]"])
    assert runs["rope-yarn-2048-s11"].config.model.position["scaling"] == {"type": "yarn", "factor": 4}
    # the answers' share of the loss is the first study's at every length
    share = first["retrieval"]["answer_share"]
    assert plan["retrieval"]["answer_share"] == share
    # every claim reads cells the plan makes
    _, _, claims = primary.load(primary.path_for("replication-512"))
    made = {(r.section, r.label) for r in runs.values()}
    for claim in claims:
        for cell in filter(None, (claim.a, claim.b)):
            assert (cell["section"], cell["label"]) in made, claim.id
    assert [c.id for c in claims] == [c.id for c in primary.load(primary.path_for("length-generalization"))[2]][:13]


def test_the_rows_the_retrieval_claims_read_train_at_the_claim_seeds_too(tmp_path):
    """The exact test's p cannot fall below 2^-n: the rows the registered retrieval claims read (and the
    runs they start from) train again at ``claim_seeds``, so those claims are tested on 8 seeds; nothing
    else does."""
    plan = experiments.make_plan("length-generalization", False)
    study = experiments.Study(plan, str(tmp_path))
    study.scored_tokens = 8192
    study.use_rates(frozen_rates(plan), {"path": "rates.yaml", "commit": None, "registered": None})
    study.claimed = primary.retrieval_rows(primary.path_for("length-generalization"))
    assert ("scratch", "alibi") in study.claimed and ("extension", "linear") in study.claimed
    assert ("scratch", "t5") not in study.claimed  # t5's claims are all on perplexity
    study.build()
    extra = {(r.section, r.label) for r in study.runs.values() if r.seed in plan["claim_seeds"]}
    assert extra == study.claimed | {("scratch", "rope")}  # rope: the extension rows' source
    for seed in plan["claim_seeds"]:
        assert study.runs[f"rope-linear-512-s{seed}"].source == f"rope-s{seed}"
    assert len(plan["seeds"]) + len(plan["claim_seeds"]) >= 8
    with pytest.raises(experiments.ExperimentError, match=r"claim_seeds=\[5\] is invalid"):
        experiments.make_plan("length-generalization", False, None, ["claim_seeds=[5]"])
    with pytest.raises(experiments.ExperimentError, match=r"claim_seeds=\[101\] is invalid"):
        experiments.make_plan("length-generalization", False, None, ["claim_seeds=[101]"])


def frozen_rates(plan: dict) -> dict:
    """A rates file's contents for ``plan``, as the tuning step would write them: each kind at x2,
    each extension row at a rate of its own."""
    from minilm.study import rates

    rows = extension.extension_runs(plan)
    chosen = {
        "scales": {kind: 2.0 for kind in designs.scratch_labels(plan)},
        "finetune_lrs": {row: 1e-4 * (i + 1) for i, row in enumerate(rows)},
    }
    return rates.record(plan, chosen, {"scales": {}, "finetune_lrs": {}}, {}, [], [], {"commit": "test"})


def test_the_protocol_names_the_schedule_the_runs_used(tmp_path):
    """A plan that sets train.schedule trains its runs with it, and the report says which one."""
    plan = experiments.make_plan("length-generalization", True, [1], ["train.schedule=wsd", "train.cooldown=0.25"])
    run = experiments.run_config(plan, str(tmp_path / "r"), {"kind": "rope"}, 1)
    assert (run.train.schedule, run.train.cooldown) == ("wsd", 0.25)
    assert report._falling(run.train) == (
        f"held, then linear to {run.train.min_lr:g} over the last 25% of the steps (wsd)"
    )
    default = experiments.run_config(
        experiments.make_plan("length-generalization", True, [1], []), str(tmp_path / "d"), {"kind": "rope"}, 1
    )
    assert report._falling(default.train, 1e-5) == "cosine to 1e-05"


def test_the_controls_train_on_the_same_tokens_as_what_they_control(tmp_path):
    """The oracle trains from scratch at 4L on the pretraining's sequences (4x its tokens; with
    oracle_batch_scale 1/4, its tokens), training kept at L uses the fine-tuning's tokens in rows
    of L, and learned / sinusoidal extend from their own source; each extension's step 0 is its
    source with the method applied zero-shot."""
    plan = experiments.make_plan("length-generalization", False, [1])
    study = experiments.Study(plan, str(tmp_path))
    study.scored_tokens = 8192  # what prepare_data would fix; the graph does not need the corpus
    with pytest.raises(experiments.ExperimentError, match="frozen rates"):
        study.build()  # a study never tunes: it trains at the tuning step's frozen rates
    frozen = frozen_rates(plan)
    study.use_rates(frozen, {"path": "rates.yaml", "commit": None, "registered": None})
    study.build()
    L, f = plan["model"]["block_size"], plan["extension"]["factor"]
    tokens = lambda run: run.config.train.max_steps * run.config.train.batch_size * run.config.model.block_size  # noqa
    runs = study.runs
    assert (
        tokens(runs["rope-512-oracle-s1"])
        == f * tokens(runs["rope-s1"])
        == f * tokens(runs["rope-equal-tokens-512-oracle-s1"])
    )
    assert runs["rope-512-oracle-s1"].config.train.batch_size == runs["rope-s1"].config.train.batch_size
    # the equal-token oracle then takes the extension's fine-tuning at 4L: the extension's tokens and steps in all
    steps = lambda run: run.config.train.max_steps  # noqa
    equal, tuned = runs["rope-equal-tokens-512-oracle-s1"], runs["rope-equal-tokens-512-oracle-tuned-s1"]
    direct = runs["rope-none-512-s1"]  # rope fine-tuned at 4L without scaling
    assert tokens(equal) + tokens(tuned) == tokens(runs["rope-s1"]) + tokens(direct)
    assert steps(equal) + steps(tuned) == steps(runs["rope-s1"]) + steps(direct)
    assert tuned.config.train.init_from.endswith("rope-equal-tokens-512-oracle-s1") and tuned.section == "oracle"
    assert tuned.config.train.lr == direct.config.train.lr and equal.section == "oracle-source"
    # the answers keep their density and share of the loss at every length: 3 queries a row of L, each answer
    # counted 8 times; 12 a row of 4L, each 8.155 times (share 6 / 35: 12 w / (512 - 39 + 12 w))
    weight = {
        name: (run.config.train.retrieval_queries, run.config.train.retrieval_weight) for name, run in runs.items()
    }
    assert weight["rope-s1"] == weight[f"rope-keep-{L}-s1"] == (3, 8.0)
    assert weight["rope-512-oracle-s1"] == weight["rope-yarn-512-s1"] == weight["rope-equal-tokens-512-oracle-tuned-s1"]
    queries, w = weight["rope-yarn-512-s1"]
    assert queries == 12 and 12 * w / (4 * L - 39 + 12 * w) == pytest.approx(6 / 35, rel=1e-5)
    assert {r.seed for r in runs.values() if r.section == "oracle"} == {1}  # the study's oracle seeds: 3 of 5
    three = experiments.Study(
        experiments.make_plan(
            "length-generalization",
            False,
            [1, 2, 3],
            ["controls.oracle_seeds=2", "controls.oracle=[rope, alibi]", "controls.oracle_equal_tokens=false"],
        ),
        str(tmp_path / "3"),
    )
    three.scored_tokens = 8192
    three.use_rates(frozen_rates(three.plan), {"path": "rates.yaml", "commit": None, "registered": None})
    three.build()  # the oracle at its first oracle_seeds (2) seeds only
    assert {r.seed for r in three.runs.values() if r.section == "oracle"} == {1, 2}
    assert {r.label for r in three.runs.values() if r.section == "oracle"} == {"rope", "alibi"}
    # a frozen-rates run tunes nothing: no tuning or sweep run, every run at its kind's or row's frozen rate
    job = {j.key: j for j in study.jobs}
    assert not [k for k in job if "holdout" in k or "-t10" in k]
    assert {r.section for r in runs.values()} == {"scratch", "extension", "oracle", "oracle-source"}
    for run in runs.values():
        t = run.config.train
        if run.section == "extension" or run.config.train.init_from:
            # the equal-token oracle: direct fine-tuning's; a text-only row: its twin's
            row = extension.twin_of(run.label) if run.section == "extension" else "none"
            assert t.lr == frozen["finetune_lrs"][row] and t.min_lr == pytest.approx(t.lr / 10), run.key
        else:
            scale = frozen["scales"][run.config.model.position["kind"]]
            assert t.lr == pytest.approx(plan["train"]["lr"] * scale), run.key
    assert job["train rope-yarn-512-s1"].after == ("train rope-s1",)
    assert (
        runs["rope-512-oracle-s1"].config.model.block_size == 4 * L and runs["rope-512-oracle-s1"].section == "oracle"
    )
    keep, yarn = runs[f"rope-keep-{L}-s1"], runs["rope-yarn-512-s1"]
    assert keep.config.model.block_size == L and tokens(keep) == tokens(yarn) and keep.source == "rope-s1"
    assert keep.config.train.init_from.endswith("rope-s1") and keep.config.model.position == {"kind": "rope"}
    learned = runs["learned-pi-512-s1"]
    assert learned.source == "learned-s1" and learned.config.model.position["kind"] == "interpolated"
    assert extension.scaling_override("learned-pi", f, 4 * L) == [
        "model.position={kind: interpolated, inner: {kind: learned}}",
        "model.block_size=512",
    ]
    assert extension.scaling_override("sinusoidal-pi", f) == [
        "model.position={kind: interpolated, inner: {kind: sinusoidal}, factor: 4}"
    ]
    assert extension.scaling_override("keep", f) == extension.scaling_override("none", f) == []
    before = {job.key for job in study.jobs if job.key.startswith("retrieval") and "learned-s1" in job.key}
    assert any("kind: interpolated" in key for key in before)  # learned + PI zero-shot, from the learned model
    with pytest.raises(experiments.ExperimentError, match="controls has"):
        experiments.make_plan("length-generalization", True, None, ["controls.oracle=[rotary]"])
    bad_scales = (("0", "0"), ("-1", "-1"), ("true", "True"), ("twice", "'twice'"), ("1e-9", "1e-09"), (".inf", "inf"))
    for bad, said in bad_scales:
        with pytest.raises(experiments.ExperimentError, match=f"controls.oracle_steps_scale={said} is invalid"):
            experiments.make_plan("length-generalization", True, None, [f"controls.oracle_steps_scale={bad}"])
    with pytest.raises(experiments.ExperimentError, match="schemes has"):
        experiments.make_plan("length-generalization", True, None, ["schemes.t5.trian={lr: 1}"])
    odd = experiments.make_plan("length-generalization", False, [1], ["train.batch_size=10"])
    with pytest.raises(experiments.ExperimentError, match="batch_size 10 x 0.25 = 2.5 rows"):
        experiments.run_config(odd, str(tmp_path / "odd"), {"kind": "rope"}, 1, block_size=512, batch_scale=0.25)


@pytest.mark.slow
def test_the_sweep_choice_skips_diverged_rates_and_says_when_none_is_left(tmp_path):
    plan = experiments.make_plan("length-generalization", True, [1, 2], ["sweep.lrs=[1.0e-4, 2.0e-4, 5.0e-4]"])
    long = 4 * plan["model"]["block_size"]

    def cells(values):
        return [
            {"section": "sweep", "label": sweep.cell_label("yarn", lr), "seed": seed, "length": long}
            | {"mode": "nonoverlapping", "ppl": ppl}
            for (lr, seed), ppl in values.items()
        ]

    # geometric means 100, 90 and 95: 2e-4 wins, though 5e-4 is best on tuning seed 101
    grid = [1e-4, 2e-4, 5e-4]
    chosen = sweep.choose(
        plan,
        cells(
            {
                (1e-4, 101): 100.0,
                (1e-4, 102): 100.0,
                (2e-4, 101): 90.0,
                (2e-4, 102): 90.0,
                (5e-4, 101): 80.0,
                (5e-4, 102): 112.8125,
            }
        ),
        "yarn",
        grid,
    )
    assert chosen == 2e-4
    assert (
        sweep.choose(
            plan,
            cells({(1e-4, 101): float("inf"), (1e-4, 102): 1.0, (2e-4, 101): 50.0, (2e-4, 102): 50.0}),
            "yarn",
            grid,
        )
        == 2e-4
    )
    with pytest.raises(sweep.SweepError, match=r"no rate of \[0.0001, 0.0002, 0.0005\] gave yarn a finite"):
        sweep.choose(plan, cells({(1e-4, 101): float("nan")}), "yarn", grid)
    assert sweep.finetune_at(plan, 2e-4) == {**plan["finetune"], "lr": 2e-4, "min_lr": pytest.approx(2e-5)}
    short = experiments.Study(
        experiments.make_plan("length-generalization", True, [1], ["data.holdout_tokens=100"]), str(tmp_path)
    )
    with pytest.raises(
        experiments.ExperimentError,
        match="data.holdout_tokens=100 is too few for the sweep: it scores 128-token segments; hold out at least 129",
    ):
        short.prepare_data()


def test_every_series_of_the_study_figures_has_its_own_look():
    """Sixteen kinds from scratch and the extension's rows share the figures: no two may look alike."""
    plan = experiments.make_plan("length-generalization")
    labels = sorted(set(designs.scratch_labels(plan)) | set(ORDER))
    looks = {tuple(sorted(style(label).items())) for label in labels}
    assert len(looks) == len(labels), "two series of the figures share colour, line style and marker"


@pytest.mark.parametrize("name", ["length-generalization", "replication-512"])
def test_no_two_series_of_one_panel_share_a_colour(name):
    """The kinds from scratch are drawn together, and so are the extension's rows: within each panel every
    series has a colour of its own ("no scaling" and "rope, training kept at L" were both pink)."""
    plan = experiments.make_plan(name)
    for labels in (
        designs.scratch_labels(plan),
        [extension.LABEL_NAMES[row] for row in extension.extension_labels(plan, text_only=False)],
    ):
        colours = [style(label)["color"] for label in labels]
        assert len(set(colours)) == len(colours), dict(zip(labels, colours))


def test_a_resumed_journal_refuses_other_inputs(tmp_path):
    """The rates and the corpus every job read are bound to the journal: a resume with others is refused
    (its jobs would be read back beside jobs of other inputs); the same ones resume."""
    journal = Journal(str(tmp_path / "journal"))
    journal.start("abc", {"p": 1}, resume=False)
    journal.bind("corpus", "fingerprint-1", "data.corpus='texts/'")
    journal.start("abc", {"p": 1}, resume=True)
    journal.bind("corpus", "fingerprint-1", "data.corpus='texts/'")
    with pytest.raises(JournalError, match="--resume: data.corpus='texts/' is not the one the journal's jobs ran with"):
        journal.bind("corpus", "fingerprint-2", "data.corpus='texts/'")


def test_two_different_uncommitted_edits_are_two_codes(tmp_path):
    """A dirty tree's commit string carries a hash of the changes: a resume with other edits of the same
    files is other code."""
    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    (tmp_path / "f.py").write_text("a = 1\n")
    git("add", "f.py")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x")
    (tmp_path / "f.py").write_text("a = 2\n")
    first = provenance.git_commit(str(tmp_path))
    (tmp_path / "f.py").write_text("a = 3\n")
    second = provenance.git_commit(str(tmp_path))
    assert "dirty: 1 uncommitted" in first and first != second
    (tmp_path / "f.py").write_text("a = 2\n")
    assert provenance.git_commit(str(tmp_path)) == first
