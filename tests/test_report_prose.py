"""The hand-written discussions of the checked-in reports against their own tables: every statement
of theirs that can be read mechanically is recomputed from report.md, results.csv and retrieval.csv.

What is read (on the text with its line breaks joined, a bullet or a paragraph at a time):

* "**N of M supported**" (the primary claims): the verdicts of report.md's primary table;
* a per-seed list, as many numbers as the run has seeds joined by " / " ("46.49 / 45.80 / ..." or
  "94 / 100 / 94 / 9 / 9%"): one seed's value each, in seed order, as a perplexity of results.csv,
  an accuracy of retrieval.csv (one depth, or the depths pooled) or a list report.md prints;
* "K of N ... models keep ..., J lose ..." after such a list in the same bullet: the count of its
  values at 50% or more (a model that keeps a needle finds at least half of them, the claim's own
  threshold) and below;
* "K of N <scheme> models did not learn the task at L": the seeds of that scheme below 50% at L;
* "x [low, high]" (an estimate with its interval): printed as such in report.md;
* "chose Sx the base rate for K of N kinds": the tuning table's chosen column.
"""

import csv
import os
import re
from collections import defaultdict

import pytest

from tests.conftest import REPO

REPORTS = [
    os.path.join(REPO, "reports", name)
    for name in sorted(os.listdir(os.path.join(REPO, "reports")))
    if os.path.exists(os.path.join(REPO, "reports", name, "discussion.md"))
]
WORDS = {w: i for i, w in enumerate("no one two three four five six seven eight nine ten eleven twelve".split())}
NUMBER = r"\d+(?:\.\d+)?"
LIST = re.compile(rf"(?<![\w.]){NUMBER}%?(?: / {NUMBER}%?)+")
KEEP = re.compile(r"\b(\w+) of (\w+) (?:[\w-]+ )?models? keeps? [^,;]*?, (\w+) loses?\b")
UNLEARNED = re.compile(r"\b(\w+) of (\w+) ([\w-]+) models? did not learn the task at L\b")
ESTIMATE = re.compile(rf"(-?{NUMBER}) \[(-?{NUMBER}), (-?{NUMBER})\]")
SUPPORTED = re.compile(r"\*\*(?:Primary claims: )?(\d+) of (\d+) (?:claims )?supported\*\*")
TUNING = re.compile(rf"chose ({NUMBER})x the base rate for (\d+) of (\d+) kinds")


def count(word: str) -> int:
    return int(word) if word.isdigit() else WORDS[word.lower()]


def read(directory: str, name: str) -> str:
    with open(os.path.join(directory, name), encoding="utf-8") as f:
        return f.read()


def blocks(text: str) -> list:
    """The discussion's paragraphs and bullets, each with its line breaks joined."""
    return [re.sub(r"\s+", " ", b).strip() for b in re.split(r"\n\s*\n|\n(?=- )", text) if b.strip()]


def rows(directory: str, name: str) -> list:
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def seeds(directory: str) -> set:
    """How many seeds a row of the run has, from report.md's header ("Seeds: 1, 2, 3, 4, 5 (..."): every
    row has those, and the rows the retrieval claims read have the claim seeds too ("seeds 6, 7, 8 train
    only the rows ...")."""
    report = read(directory, "report.md")
    n = len(re.search(r"^Seeds: ([\d, ]+)", report, re.M).group(1).split(","))
    extra = re.search(r"seeds ([\d, ]+) train only the rows", report)
    return {n, n + len(extra.group(1).split(","))} if extra else {n}


def per_seed_lists(directory: str) -> list:
    """Every per-seed list the run's records hold, (value, ...) in seed order: the perplexities of
    results.csv, the accuracies (%) of retrieval.csv by depth and with the depths pooled (single-needle and
    multi-key probes apart), and the
    lists report.md prints ("99/100/100/100/100", "400 / 200 / 400 / 200 / 400")."""
    groups = defaultdict(dict)
    for r in rows(directory, "results.csv"):
        if r.get("status", "ok") == "ok" and r["ppl"]:
            groups[(r["section"], r["label"], r["step"], r["mode"], r["length"])][int(r["seed"])] = float(r["ppl"])
    counts = defaultdict(lambda: [0, 0])
    for r in rows(directory, "retrieval.csv"):
        if r["correct"]:  # empty: a bounded scheme past its table
            for depth in (r["depth"], "pooled"):
                key = (r["section"], r["label"], r["length"], r["when"], depth, r.get("keys") or "1")
                cell = counts[(*key, int(r["seed"]))]
                cell[0], cell[1] = cell[0] + int(r["correct"]), cell[1] + int(r["trials"])
    for (*cell, seed), (correct, trials) in counts.items():
        groups[tuple(cell)][seed] = 100 * correct / trials
    lists = [tuple(v for _, v in sorted(g.items())) for g in groups.values()]
    report = read(directory, "report.md")
    for printed in LIST.findall(report) + re.findall(r"\((\d+(?:/\d+)+)\)", report):
        lists.append(tuple(float(x.strip().rstrip("%")) for x in printed.split("/")))
    return lists


def shown(value: float, like: str) -> str:
    """``value`` printed with as many decimals as ``like``."""
    decimals = len(like.split(".")[1]) if "." in like else 0
    return f"{value:.{decimals}f}"


def table_column(report: str, header: str, column: int = -1) -> list:
    """One column of the report.md table whose header row starts with ``header``."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    values = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        values.append(line.strip().strip("|").split("|")[column].strip())
    return values


def checks(directory: str) -> dict:
    """{kind: [(the statement, what the records say, whether they agree), ...]} for every statement
    of the discussion that the module docstring lists."""
    text, report, n = read(directory, "discussion.md"), read(directory, "report.md"), seeds(directory)
    found = defaultdict(list)
    lists = per_seed_lists(directory)
    for block in blocks(text):
        for match in SUPPORTED.finditer(block):
            verdicts = table_column(report, "| id | claim |")
            truth = (verdicts.count("supported"), len(verdicts))
            found["supported"].append((match.group(0), truth, (int(match[1]), int(match[2])) == truth))
        for match in LIST.finditer(block):
            items = [x.strip().rstrip("%") for x in match.group(0).split(" / ")]
            if len(items) in n:
                agree = any(len(c) == len(items) and all(shown(v, x) == x for v, x in zip(c, items)) for c in lists)
                found["per-seed list"].append((match.group(0), "a list of the records", agree))
        for match in KEEP.finditer(block):
            before = [m for m in LIST.finditer(block[: match.start()]) if len(m.group(0).split(" / ")) in n]
            values = [float(x.strip().rstrip("%")) for x in before[-1].group(0).split(" / ")] if before else []
            truth = (sum(v >= 50 for v in values), len(values), sum(v < 50 for v in values))
            said = (count(match[1]), count(match[2]), count(match[3]))
            found["models keep"].append((match.group(0), truth, bool(values) and said == truth))
        for match in UNLEARNED.finditer(block):
            L = re.search(r"training length \*\*L = (\d+)\*\*", report).group(1)
            cell = pooled_at(directory, match[3].lower(), L)
            truth = (sum(v < 50 for v in cell), len(cell))
            found["did not learn"].append((match.group(0), truth, (count(match[1]), count(match[2])) == truth))
        for match in ESTIMATE.finditer(block):
            found["estimate"].append((match.group(0), "printed in report.md", match.group(0) in report))
        for match in TUNING.finditer(block):
            chosen = table_column(report, "| scheme | x")
            truth = (sum(c == match[1] for c in chosen), len(chosen))
            found["tuning"].append((match.group(0), truth, (int(match[2]), int(match[3])) == truth))
    return found


def pooled_at(directory: str, label: str, length: str) -> list:
    """The per-seed accuracies (%, depths pooled) of the scheme ``label`` trained from scratch at ``length``, on the
    single needle (the task it trained on; the multi-key probes are a probe of their own)."""
    by_seed = defaultdict(lambda: [0, 0])
    for r in rows(directory, "retrieval.csv"):
        single = (r.get("keys") or "1") == "1"
        if r["section"] == "scratch" and r["label"] == label and r["length"] == length and r["correct"] and single:
            by_seed[int(r["seed"])][0] += int(r["correct"])
            by_seed[int(r["seed"])][1] += int(r["trials"])
    return [100 * c / t for _, (c, t) in sorted(by_seed.items())]


@pytest.mark.parametrize("directory", REPORTS, ids=os.path.basename)
def test_the_report_prints_the_discussion_as_written(directory):
    assert read(directory, "discussion.md").strip() in read(directory, "report.md")


@pytest.mark.parametrize("directory", REPORTS, ids=os.path.basename)
def test_the_discussion_agrees_with_the_tables(directory):
    wrong = [(kind, said, truth) for kind, found in checks(directory).items() for said, truth, ok in found if not ok]
    assert not wrong, wrong


def test_the_checks_read_every_kind_of_statement():
    """The patterns still match the prose they were written for (else a rewording would turn a
    check off unnoticed): the study's discussion has a statement of each kind (a rewritten discussion
    that drops one says so here), the ablation's its count of supported claims. A report lands the
    moment its run ends, before its discussion is written: until then there is no prose to read."""
    expected = {
        "length-generalization": {"supported", "per-seed list", "models keep", "did not learn", "estimate", "tuning"},
        "ablation": {"supported"},
    }
    waiting = []
    for name, kinds in expected.items():
        directory = os.path.join(REPO, "reports", name)
        if not os.path.exists(os.path.join(directory, "discussion.md")):
            waiting.append(f"reports/{name}")
            continue
        found = checks(directory)
        assert kinds <= set(found) and all(found[kind] for kind in kinds), (name, sorted(found))
        if name == "ablation":
            assert len(found["supported"]) == 1
        else:
            assert set(found) == kinds
    if waiting:
        pytest.skip(f"{' and '.join(waiting)}: no discussion.md yet (the run's discussion is to be written)")
