"""minilm.study.compare: the replication's report sets every claim's verdict at its L beside the verdict
the study it replicates reached at its own L, each family tested and Holm-corrected on its own."""

import json
import os

import yaml

from minilm.study import compare, primary
from minilm.study import plan as experiments
from tests.test_experiments import cells
from tests.test_primary import FLAT, LOST, WORSE


def study(experiment, claims, rope_at_4L, out):
    """A finished study of ``experiment`` (quick plan, five seeds) whose rope cells give the ratio of 4L to L
    per seed ``rope_at_4L``; its record lists ``claims`` as the claims it tested."""
    plan = experiments.make_plan(experiment, True, [1, 2, 3, 4, 5])
    L = plan["model"]["block_size"]
    made = experiments.Study(plan, str(out))
    made.cells = (
        cells("scratch", "rope", L, [40.0] * 5)
        + cells("scratch", "rope", 4 * L, [40.0 * r for r in rope_at_4L])
        + cells("scratch", "alibi", L, [30.0] * 5)
        + cells("scratch", "alibi", 4 * L, [30.3, 29.7, 30.1, 29.9, 30.0])
    )
    made.claims = {"text": yaml.safe_dump({"alpha": 0.05, "claims": claims}), "commit": "c" * 40, "registered": True}
    return made


def record(made, commit="a" * 40):
    """Write ``made``'s study.json as a finished run at ``commit`` would."""
    os.makedirs(made.out, exist_ok=True)
    with open(os.path.join(made.out, "study.json"), "w", encoding="utf-8") as f:
        json.dump({**made.state(), "run": {"commit": commit}}, f)


def table_rows(lines) -> dict:
    """{claim id: its cells} of the section's table."""
    text = "\n".join(lines)
    return {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| claim")
    }


def test_each_claim_reads_its_verdict_at_both_lengths(tmp_path):
    first = study("length-generalization", [WORSE, LOST], [1.20, 1.22, 1.19, 1.21, 1.20], tmp_path / "first")
    record(first)
    second = study("replication-512", [WORSE, FLAT, LOST], [1.01, 0.98, 1.02, 0.99, 1.00], tmp_path / "second")
    second.plan["replicates"] = str(tmp_path / "first")
    lines = compare.side_by_side(second, 7, str(tmp_path))
    text = "\n".join(lines)
    assert lines[0] == "## 7. Every claim's verdict at both training lengths"
    rows = table_rows(lines)
    assert list(rows) == ["worse", "lost", "flat"]  # the first study's claims, then this one's own
    assert rows["worse"][2] == "supported" and rows["worse"][5] == "not supported" and rows["worse"][6] == "**changed**"
    assert rows["flat"][0] == "not a claim here" and rows["flat"][5] == "supported" and rows["flat"][6] == ""
    # no retrieval rows: the gate fails on both sides, and an untested claim is not counted as a change
    assert rows["lost"][2] == rows["lost"][5] == "not tested" and rows["lost"][6] == "not comparable (untested)"
    assert "ratio 1.20" in rows["worse"][0] and "ratio 1.00" in rows["worse"][3]
    assert "Verdicts that differ: 1 of the 1 claims tested in both runs" in text
    assert "L = 32: `" in text and "`aaaaaaaaaaaa`, 5 seeds" in text and "its claims as it recorded them" in text


def test_a_missing_or_broken_record_is_said_and_a_plan_that_replicates_nothing_has_no_section(tmp_path):
    second = study("replication-512", [WORSE], [1.0] * 5, tmp_path / "second")
    second.plan["replicates"] = "nowhere/length-generalization"
    (line,) = [x for x in compare.side_by_side(second, 7, str(tmp_path)) if "missing" in x]
    assert "`nowhere/length-generalization/study.json`, is missing" in line and "--report-only" in line
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "study.json").write_text("{not json", encoding="utf-8")
    second.plan["replicates"] = str(broken)
    (line,) = [x for x in compare.side_by_side(second, 7, str(tmp_path)) if "cannot be read" in x]
    first = study("length-generalization", [WORSE], [1.0] * 5, tmp_path / "first")
    assert compare.side_by_side(first, 7, str(tmp_path)) == []


def test_the_replication_reads_the_record_its_confirmatory_commands_write():
    """The full replication reads the first study where that study's confirmatory command writes it; the quick one
    reads the quick study's default --out."""
    named, _ = primary.confirmatory_run(primary.path_for("length-generalization"))
    assert f"--out {experiments.make_plan('replication-512')['replicates']} " in named
    assert experiments.make_plan("replication-512", True)["replicates"] == os.path.join(
        "out", "length-generalization-quick"
    )
