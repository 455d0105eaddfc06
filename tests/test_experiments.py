"""The length-generalization experiment (minilm.experiments, minilm.report, python -m minilm experiment):
--quick end to end, the plan, the checks."""
import csv
import math
import os
import subprocess
import sys

import pytest
import yaml

from minilm import evaluation, experiments
from minilm.cli import experiment as experiment_cli
from minilm.report import checks


def test_quick_run_end_to_end(tiny_corpus, tmp_path):
    out = tmp_path / "lg"
    code = experiment_cli.main(["length-generalization", "--quick", "--out", str(out), "--seed", "7", "--quiet",
                                f"data.corpus={tiny_corpus / 'corpus.txt'}", "data.vocab_size=400",
                                f"data.dir={tiny_corpus / 'data'}", "train.max_steps=20"])
    assert code == 0
    report = (out / "report.md").read_text(encoding="utf-8")
    L = experiments.QUICK["model"]["block_size"]
    for heading in ("## 1. Trained at L",
                    "## 2. Sinusoidal base frequency", f"## 3. Extending rope from {L} to {4 * L}",
                    "## 4. Against the published ordering", "## Configs", "Git commit at the start: `", "Machine: "):
        assert heading in report
    for kind in experiments.KINDS:
        assert f"\n| {kind} | " in report
    assert "| learned | " in report and "n/a (bounded)" in report
    for row in ("linear, zero-shot", "yarn, zero-shot", "ntk, zero-shot", "dynamic, zero-shot",
                f"linear, fine-tuned at {4 * L}", f"yarn, fine-tuned at {4 * L}", f"no scaling, fine-tuned at {4 * L}"):
        assert f"| {row} | " in report
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert len(rows) == 6 * 3 + 3 * 2 + 9 * 3  # scratch, ablation, extension cells
    assert len({r["tokens"] for r in rows}) == 1  # every cell scores the same tokens
    assert {r["status"] for r in rows if r["label"] == "learned" and int(r["length"]) > L} == {"bounded"}
    runs = sorted(os.listdir(out / "runs"))
    assert runs == sorted([".gitignore", *experiments.KINDS, "sinusoidal-base1000", "sinusoidal-base100000",
                           f"rope-linear-{4 * L}", f"rope-ntk-{4 * L}", f"rope-yarn-{4 * L}", f"rope-plain-{4 * L}"])
    blocks = [b.split("```")[0] for b in report.split("```yaml\n")[1:]]
    plan, tuned = yaml.safe_load(blocks[0]), yaml.safe_load(blocks[-1])
    assert plan["seed"] == 7 and plan["train"]["max_steps"] == 20
    assert tuned["train"]["init_from"].endswith(os.path.join("runs", "rope"))
    assert tuned["model"]["block_size"] == 4 * L
    assert tuned["train"]["max_steps"] == experiments.QUICK["finetune"]["max_steps"]
    if evaluation.have_matplotlib():
        assert "](scratch.png)" in report and os.path.getsize(out / "scratch.png") > 1000
        assert os.path.getsize(out / "extension.png") > 1000


def test_plan_overrides_and_errors(capsys):
    plan = experiments.make_plan(True, 3, ["data.corpus=texts/", "finetune.max_steps=5"])
    assert plan["seed"] == 3 and plan["data"]["corpus"] == "texts/" and plan["finetune"]["max_steps"] == 5
    assert experiments.FULL["data"]["corpus"] == "shakespeare"  # the defaults are untouched
    with pytest.raises(experiments.ExperimentError, match="unknown section 'modle'"):
        experiments.make_plan(False, None, ["modle.d_model=3"])
    assert experiment_cli.main(["length-generalization", "--quick", "model.n_head=3", "--quiet"]) == 2
    assert "error: experiment settings: model.d_model=32 is not divisible by model.n_head=3" in capsys.readouterr().err


def cell(label, length, ppl, table_status="ok"):
    return evaluation.Result(label=label, checkpoint="c", position=label, train_length=8, length=length,
                             mode="nonoverlapping", stride=None, tokens=64, chars=200,
                             nll=None if ppl is None else math.log(ppl), status=table_status)


def test_checks_read_the_published_ordering_from_the_numbers():
    scratch = []
    curves = {"sinusoidal": [20, 60, 200], "rope": [19, 25, 40], "alibi": [19.5, 19, 18.8], "t5": [19.4, 19, 19],
              "none": [21, 22, 24], "learned": [19.6, None, None]}
    for kind, values in curves.items():
        scratch += [cell(kind, t, v, "ok" if v else "bounded") for t, v in zip((8, 16, 32), values)]
    extension = [cell("rope, no scaling", 8, 19), cell("rope, no scaling", 32, 40),
                 cell("linear, fine-tuned at 32", 32, 18), cell("yarn, fine-tuned at 32", 32, 22),
                 cell("no scaling, fine-tuned at 32", 32, 20)]
    ablation = [cell("base 1000", 16, 80), cell("base 10000", 16, 60), cell("base 100000", 16, 50)]
    got = {claim: ok for claim, _, ok in checks(
        {"scratch": scratch, "extension": extension, "ablation": ablation}, 8, 4)}
    assert got["past L (16 = 2x), sinusoidal degrades faster than rope"] == "yes"
    assert got["alibi stays near its L perplexity up to 4x (within 10%)"] == "yes"
    assert got["at 4x without fine-tuning: alibi (≈ none) < rope < sinusoidal"] == "yes"
    assert got["learned positions cannot be evaluated past L"] == "yes"
    assert got["at the training length rope is (slightly) best"] == "yes"
    assert got["rope + linear fine-tuned recovers at 32 (ppl at 32 <= rope's ppl at L 8)"] == "yes"
    assert got["rope + yarn fine-tuned recovers at 32 (ppl at 32 <= rope's ppl at L 8)"] == "**no**"
    assert got["plain rope at 32 without fine-tuning is clearly worse than at L (> 10%)"] == "yes"
    assert got["after the same fine-tuning steps, rope + linear beats rope without scaling at 32"] == "yes"
    assert got["after the same fine-tuning steps, rope + yarn beats rope without scaling at 32"] == "**no**"
    assert got["sinusoidal: a larger base extrapolates better (lower ppl at 2x)"] == "yes"


def test_old_invocation_names_the_new_one():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "minilm.experiments", "length-generalization", "--quick"],
                          cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: this command moved: use python -m minilm experiment ..."
