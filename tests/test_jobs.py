"""minilm.study.jobs: a graph of jobs in worker processes: order, values, times and errors; the journal
that lets an interrupted study resume (minilm.study.journal)."""

import math
import operator
import time

import pytest

from minilm.study.jobs import Done, Job, run_jobs
from minilm.study.journal import Journal, JournalError
from minilm.study.provenance import busy_seconds


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


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_job_stops_the_run_with_its_error(workers):
    jobs = [
        Job("ok", operator.add, (1, 1)),
        Job("bad", math.sqrt, (-1.0,)),
        Job("never", operator.add, (1, 2), after=("bad",)),
    ]
    with pytest.raises(ValueError, match="math domain error"):
        run_jobs(jobs, workers=workers, quiet=True)


def test_the_graph_is_checked_before_anything_runs():
    with pytest.raises(ValueError, match="listed twice"):
        run_jobs([Job("a", operator.add, (1, 1)), Job("a", operator.add, (1, 1))], quiet=True)
    with pytest.raises(ValueError, match="not listed before it"):
        run_jobs([Job("b", operator.add, (1, 1), after=("a",)), Job("a", operator.add, (1, 1))], quiet=True)
    with pytest.raises(ValueError, match="at least 1"):
        run_jobs([Job("a", operator.add, (1, 1))], workers=0, quiet=True)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_journal_gives_back_finished_jobs_and_reruns_changed_ones(workers, tmp_path):
    journal = Journal(str(tmp_path / "journal"))
    journal.start("abc", {"seeds": [1]}, resume=False)
    first = run_jobs(
        [Job("a", operator.add, (1, 0)), Job("b", operator.mul, (3, 4))], workers=workers, quiet=True, journal=journal
    )
    # read back, not run: run, "a" would divide by zero; "b" changed its arguments, so it runs again; "c"
    # needs "a" and takes its arguments from a's value (as the study's tuned runs do)
    again = run_jobs(
        [
            Job("a", operator.truediv, (1, 0)),
            Job("b", operator.mul, (3, 5)),
            Job("c", operator.add, after=("a",), resolve=lambda done: (done["a"].value, 10)),
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


def test_busy_time_is_the_union_of_the_jobs_intervals():
    done = {k: Done(None, s, e) for k, (s, e) in {"a": (0, 10), "b": (5, 12), "c": (100, 103), "d": (101, 102)}.items()}
    assert busy_seconds(done) == 15
