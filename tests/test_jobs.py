"""minilm.study.jobs: a graph of jobs in worker processes: order, values, times and errors; the journal
that lets an interrupted study resume (minilm.study.journal)."""

import json
import math
import operator
import os
import pickle
import shutil
import time

import pytest

from minilm.evaluation.lengths import Result
from minilm.study.jobs import Done, Job, run_jobs
from minilm.study.journal import Journal, JournalError
from minilm.study.provenance import busy_seconds


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_jobs_run_after_what_they_need_and_return_their_values(workers):
    jobs = [
        Job("sleep", time.sleep, (0.3,), phase="a"),
        Job("add", operator.add, (2, 3), phase="a"),
        Job("after sleep", operator.mul, (4, 5), after=("sleep",), phase="b"),
    ]
    done = run_jobs(jobs, workers=workers, quiet=True)
    assert {k: d.value for k, d in done.items()} == {"sleep": None, "add": 5, "after sleep": 20}
    assert done["after sleep"].started >= done["sleep"].ended
    assert done["sleep"].seconds >= 0.29 and done["after sleep"].phase == "b"


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_job_stops_the_run_with_its_error(workers):
    jobs = [
        Job("ok", operator.add, (1, 1)),
        Job("bad", math.sqrt, (-1.0,)),
        Job("never", operator.add, (1, 2), after=("bad",)),
    ]
    with pytest.raises(ValueError, match="math domain error"):
        run_jobs(jobs, workers=workers, quiet=True)


@pytest.mark.slow
def test_the_jobs_that_finish_beside_a_failing_one_are_kept_for_a_resume(tmp_path):
    """Two workers: one job fails while another runs on; the run stops with the error, and the other
    job, which finished, is in the journal (a resume reads it back instead of running it again)."""
    journal = Journal(str(tmp_path / "journal"))
    journal.start("abc", {"seeds": [1]}, resume=False)
    jobs = [Job("slow", time.sleep, (0.5,)), Job("bad", math.sqrt, (-1.0,))]
    with pytest.raises(ValueError, match="math domain error"):
        run_jobs(jobs, workers=2, quiet=True, journal=journal)
    again = run_jobs([Job("slow", math.sqrt, (0.5,))], workers=1, quiet=True, journal=journal)  # not run: read back
    assert again["slow"].value is None and again["slow"].seconds >= 0.49


def where_and_what(name: str) -> tuple:
    """A job: the worker's working directory and its value of the environment variable ``name``."""
    return os.getcwd(), os.environ.get(name)


@pytest.mark.slow
def test_workers_take_the_directory_and_environment_of_their_pool(tmp_path, monkeypatch):
    """Workers come from one server started with the first pool; each pool's workers still see this
    process's working directory and environment as they are when the pool starts, as fresh processes would."""
    for step in ("first", "second"):
        (tmp_path / step).mkdir()
        monkeypatch.chdir(tmp_path / step)
        monkeypatch.setenv("MINILM_TEST_POOL", step)
        jobs = [Job(f"{step} {i}", where_and_what, ("MINILM_TEST_POOL",)) for i in range(2)]
        done = run_jobs(jobs, workers=2, quiet=True)
        assert {d.value for d in done.values()} == {(os.path.realpath(tmp_path / step), step)}


def test_the_graph_is_checked_before_anything_runs():
    with pytest.raises(ValueError, match="listed twice"):
        run_jobs([Job("a", operator.add, (1, 1)), Job("a", operator.add, (1, 1))], quiet=True)
    with pytest.raises(ValueError, match="not listed before it"):
        run_jobs([Job("b", operator.add, (1, 1), after=("a",)), Job("a", operator.add, (1, 1))], quiet=True)
    with pytest.raises(ValueError, match="at least 1"):
        run_jobs([Job("a", operator.add, (1, 1))], workers=0, quiet=True)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_journal_gives_back_finished_jobs_and_reruns_changed_ones(workers, tmp_path):
    journal = Journal(str(tmp_path / "journal"))
    journal.start("abc", {"seeds": [1]}, resume=False)
    first = run_jobs(
        [Job("a", operator.add, (1, 0)), Job("b", operator.mul, (3, 4))], workers=workers, quiet=True, journal=journal
    )
    # read back, not run: run, "a" would divide by zero; "b" changed its arguments, so it runs again; "c" is new
    again = run_jobs(
        [
            Job("a", operator.truediv, (1, 0)),
            Job("b", operator.mul, (3, 5)),
            Job("c", operator.add, (1, 10), after=("a",)),
        ],
        workers=workers,
        quiet=True,
        journal=journal,
    )
    assert {k: d.value for k, d in again.items()} == {"a": 1, "b": 15, "c": 11}
    assert again["a"].started == first["a"].started  # its times are the first run's


def test_a_journal_belongs_to_one_commit_and_plan(tmp_path):
    journal = Journal(str(tmp_path / "journal"))
    with pytest.raises(JournalError, match="holds no journal"):
        journal.start("abc", {"seeds": [1]}, resume=True)
    assert journal.start("abc", {"seeds": [1]}, resume=False) == 1
    assert journal.start("abc", {"seeds": [1]}, resume=True) == 2
    with pytest.raises(JournalError, match="commit 'abc', the code is now 'def'"):
        journal.start("def", {"seeds": [1]}, resume=True)
    with pytest.raises(JournalError, match="the plan differs"):
        journal.start("abc", {"seeds": [1, 2]}, resume=True)
    run_jobs([Job("a", operator.add, (1, 0))], quiet=True, journal=journal)
    journal.start("abc", {"seeds": [1]}, resume=False)  # a fresh start forgets the finished jobs
    assert journal.read("a", (1, 0)) is None


def test_a_journal_resumes_only_in_the_precision_its_jobs_trained_in(tmp_path):
    """dtype auto trains in bf16 on a CPU with native bf16 units and in float32 elsewhere: a study
    resumed on the other kind of CPU would mix the two, so it is refused in one line."""
    journal = Journal(str(tmp_path / "journal"))
    journal.start("abc", {"seeds": [1]}, resume=False, precision="torch.bfloat16")
    with pytest.raises(JournalError, match="trained in torch.bfloat16, this machine trains the plan in torch.float32"):
        journal.start("abc", {"seeds": [1]}, resume=True, precision="torch.float32")
    assert journal.start("abc", {"seeds": [1]}, resume=True, precision="torch.bfloat16") == 2


class Payload:
    """What a crafted pickle would run on loading: here it only leaves a file behind."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_crafted_journal_entry_runs_nothing_and_its_job_runs_again(tmp_path):
    """The journal is plain JSON: an entry someone else wrote as a pickle (under the old .pkl name or the
    new .json one) is never unpickled; its job runs again."""
    journal = Journal(str(tmp_path / "study" / "journal"))
    journal.start("abc", {"seeds": [1]}, resume=False)
    run_jobs([Job("a", operator.add, (1, 2))], quiet=True, journal=journal)
    entry = journal._path("a", (1, 2))
    marker = tmp_path / "ran"
    crafted = pickle.dumps(("a", Payload(str(marker))))
    for path in (entry, entry[: -len(".json")] + ".pkl"):
        with open(path, "wb") as f:
            f.write(crafted)
    journal.start("abc", {"seeds": [1]}, resume=True)
    again = run_jobs([Job("a", operator.add, (1, 2))], quiet=True, journal=journal)
    assert again["a"].value == 3 and not marker.exists()
    assert journal.read("a", (1, 2)).value == 3  # rewritten as data


@pytest.mark.parametrize(
    "entry",
    [
        42,
        [1, 2, 3],
        "text",
        {"key": "a", "value": 3},
        {"key": "a", "value": {"object": 3}, "started": 0, "ended": 1, "phase": ""},
        {"key": "a", "value": {"Result": {"nope": 1}}, "started": 0, "ended": 1, "phase": ""},
        {"key": "a", "value": 3, "started": "soon", "ended": 1, "phase": ""},
        {"key": "a", "value": 3, "started": float("nan"), "ended": 1, "phase": ""},
        {"key": "b", "value": 3, "started": 0, "ended": 1, "phase": ""},
    ],
    ids=["number", "list", "text", "no times", "unknown tag", "bad cell", "text time", "nan time", "other key"],
)
def test_a_malformed_journal_entry_is_not_trusted(entry, tmp_path):
    journal = Journal(str(tmp_path / "journal"))
    journal.start("abc", {}, resume=False)
    with open(journal._path("a", (1, 2)), "w", encoding="utf-8") as f:
        json.dump(entry, f)
    assert journal.read("a", (1, 2)) is None


def test_a_journal_entry_nested_past_any_depth_is_not_trusted(tmp_path):
    journal = Journal(str(tmp_path / "journal"))
    journal.start("abc", {}, resume=False)
    with open(journal._path("a", (1, 2)), "w", encoding="utf-8") as f:
        f.write("[" * 100000)
    assert journal.read("a", (1, 2)) is None


@pytest.mark.parametrize("meta", [[1, 2], {"commit": "abc", "plan": {}, "invocations": "two"}, "x"])
def test_a_malformed_meta_json_is_one_line(meta, tmp_path):
    journal = Journal(str(tmp_path / "journal"))
    journal.start("abc", {}, resume=False)
    (tmp_path / "journal" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(JournalError, match="is not a journal's meta.json") as info:
        journal.start("abc", {}, resume=True)
    assert "\n" not in str(info.value)


def test_values_read_back_as_they_were_and_a_moved_study_resumes_where_it_is(tmp_path):
    """Tuples, lists, mappings, evaluation cells, NaN and paths under the study's directory read back
    as written; copied elsewhere, the study finds its jobs (paths are stored relative to it) and reads
    their paths back under the new place."""
    old = tmp_path / "old"
    cell = Result("-", str(old / "runs" / "rope" / "ckpt.pt"), "rope", 16, 32, "sliding", 8, 100, 400, 1.5)
    value = {"cells": [cell], "pair": (1, 2.5), "nan": float("nan"), "where": str(old / "runs"), "other": "/etc"}
    journal = Journal(str(old / "journal"))
    journal.start("abc", {}, resume=False)
    args = (str(old / "runs" / "rope"), [32], {"seed": 1})
    journal.record("evaluate rope", args, Done(value, 1.0, 2.0, "eval"))
    back = journal.read("evaluate rope", args).value
    assert back["cells"] == [cell] and back["pair"] == (1, 2.5) and math.isnan(back["nan"])
    assert (back["where"], back["other"]) == (str(old / "runs"), "/etc")
    shutil.copytree(old, tmp_path / "new")
    moved = Journal(str(tmp_path / "new" / "journal"))
    assert moved.start("abc", {}, resume=True) == 2
    found = moved.read("evaluate rope", (str(tmp_path / "new" / "runs" / "rope"), [32], {"seed": 1}))
    assert found.value["cells"][0].checkpoint == str(tmp_path / "new" / "runs" / "rope" / "ckpt.pt")
    assert found.value["where"] == str(tmp_path / "new" / "runs")
    with pytest.raises(JournalError, match="holds a set"):
        journal.record("b", (), Done({1, 2}, 1.0, 2.0))


def test_busy_time_is_the_union_of_the_jobs_intervals():
    done = {k: Done(None, s, e) for k, (s, e) in {"a": (0, 10), "b": (5, 12), "c": (100, 103), "d": (101, 102)}.items()}
    assert busy_seconds(done) == 15
