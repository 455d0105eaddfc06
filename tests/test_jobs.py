"""minilm.study.jobs: a graph of jobs in worker processes: order, values, times and errors."""
import math
import operator
import time

import pytest

from minilm.study.jobs import Job, run_jobs


@pytest.mark.parametrize("workers", [1, 2])
def test_jobs_run_after_what_they_need_and_return_their_values(workers):
    jobs = [Job("sleep", time.sleep, (0.3,), phase="a"),
            Job("add", operator.add, (2, 3), phase="a"),
            Job("after sleep", operator.mul, (4, 5), after=("sleep",), phase="b")]
    done = run_jobs(jobs, workers=workers, quiet=True)
    assert {k: d.value for k, d in done.items()} == {"sleep": None, "add": 5, "after sleep": 20}
    assert done["after sleep"].started >= done["sleep"].ended
    assert done["sleep"].seconds >= 0.29 and done["after sleep"].phase == "b"


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_job_stops_the_run_with_its_error(workers):
    jobs = [Job("ok", operator.add, (1, 1)), Job("bad", math.sqrt, (-1.0,)),
            Job("never", operator.add, (1, 2), after=("bad",))]
    with pytest.raises(ValueError, match="math domain error"):
        run_jobs(jobs, workers=workers, quiet=True)


def test_the_graph_is_checked_before_anything_runs():
    with pytest.raises(ValueError, match="listed twice"):
        run_jobs([Job("a", operator.add, (1, 1)), Job("a", operator.add, (1, 1))], quiet=True)
    with pytest.raises(ValueError, match="not listed before it"):
        run_jobs([Job("b", operator.add, (1, 1), after=("a",)), Job("a", operator.add, (1, 1))], quiet=True)
    with pytest.raises(ValueError, match="at least 1"):
        run_jobs([Job("a", operator.add, (1, 1))], workers=0, quiet=True)
