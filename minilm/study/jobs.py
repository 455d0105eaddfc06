"""Independent jobs (training runs, evaluations) in parallel worker processes.

A study is a graph of jobs: a ``Job`` names the keys of the jobs it needs (``after``); a job
starts with its arguments when they are done. ``run_jobs`` keeps ``workers`` processes busy, each
limited to ``threads`` torch threads: on a small CPU, independent one-thread runs side by side use the
cores better than one run with many threads (small matrices scale poorly across threads).
Ready jobs start in the order given, so list the ones that unblock others first.

A ``journal`` (``minilm.study.journal``) records every finished job as it finishes and gives
back, without running it, a job that finished earlier with the same key and arguments.

With ``workers=1`` the jobs run in this process, one after another. Workers are forked from
multiprocessing's ``forkserver``: a clean process, started once, that imported torch and the study's
job modules (``PRELOAD``) and never ran a tensor operation, so no thread pool or lock is inherited and a
worker starts in a fraction of a second instead of an interpreter's seconds; each worker then takes this
process's working directory and environment as they are when its pool starts (where there is no
forkserver, on Windows, each worker is a fresh interpreter: ``spawn``). A job's
function and arguments must be picklable: module-level functions and plain data. A job
that raises stops the run: the jobs still queued are cancelled, the running ones finish,
and the first error is raised again here (a ``MinilmError`` keeps its one-line message; a
worker that dies is a ``JobError``).

Stopping: a ``KeyboardInterrupt`` here (Ctrl-C, or ``Interrupted``, as the command raises SIGTERM)
or from a job (``Interrupted``: a training run stopped by a signal) drops the queued jobs and sends
each worker SIGTERM: a training run stops after its step with its checkpoint saved whole, any other
job is dropped at once (``Interrupted`` raised in it), and a worker still running after
``STOP_SECONDS`` is killed. Every worker has exited when the interrupt is raised again here; the
jobs that finished are in the journal, the dropped ones run again on resuming. Workers ignore
SIGINT (a terminal's Ctrl-C reaches every process of its group): this process stops them.
"""

from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
import os
import signal
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from tqdm import tqdm

from minilm.common import MinilmError


@dataclass
class Job:
    """One unit of a study's work: ``fn(*args)`` run in a worker once the jobs named in ``after``
    are done (the comments by each field)."""

    key: str
    fn: Callable
    args: tuple = ()
    after: tuple = ()  # keys of the jobs that must finish first
    phase: str = ""  # the report's wall time is given per phase


@dataclass
class Done:
    """A finished job: its return value and when it ran (seconds since the epoch)."""

    value: Any
    started: float
    ended: float
    phase: str = ""

    @property
    def seconds(self) -> float:
        return self.ended - self.started


# what the forkserver imports once for every worker: this process's main module (as spawn would), torch and
# the modules of the study's jobs
PRELOAD = ("__main__", "torch", "minilm.study.work", "minilm.study.papers")
STOP_SECONDS = 30.0  # how long a worker has to end its job after SIGTERM before it is killed


class JobError(MinilmError):
    """A worker process died (killed, out of memory); the message is one line for the user."""


class Interrupted(KeyboardInterrupt):
    """A stop asked by the signal named ``signal`` ("SIGINT", "SIGTERM"): raised like Ctrl-C, so that
    whatever is running cleans up as for Ctrl-C, and ``run_jobs`` stops its workers."""

    def __init__(self, name: str):
        super().__init__(name)
        self.signal = name


def _limit_threads(threads: int) -> None:
    torch.set_num_threads(threads)


_stopping = False  # in a worker: SIGTERM came, so every job from now on is dropped
_in_job = False  # in a worker: a job is running (``_timed``)


def _start_worker(threads: int, cwd: str, environ: dict) -> None:
    """A worker's setup: the pool's working directory and environment (the forkserver's are those of its
    own start), ``threads`` torch threads, SIGINT ignored (``run_jobs`` stops its workers), SIGTERM drops
    the job (``_drop_job``)."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _drop_job)
    _limit_threads(threads)


def _drop_job(signum, frame) -> None:
    """SIGTERM in a worker: the running job, and any the worker is handed later, ends with ``Interrupted``
    (sent back as its outcome). The signal does not end the worker itself: it exits when the executor tells
    it to, running its exit handlers as at the end of a study (so no process is cut off in the middle)."""
    global _stopping
    if not _stopping:  # once: a job being dropped cleans up undisturbed
        _stopping = True
        if _in_job:
            raise Interrupted("SIGTERM")


def _timed(fn: Callable, args: tuple) -> tuple:
    global _in_job
    started = time.time()
    try:
        _in_job = True
        if _stopping:
            raise Interrupted("SIGTERM")
        value = fn(*args)
    finally:
        _in_job = False
    return value, started, time.time()


def check_graph(jobs: Sequence[Job]) -> None:
    """Unique keys, and every ``after`` names an earlier job (so the graph has no cycle)."""
    seen = set()
    for job in jobs:
        if job.key in seen:
            raise ValueError(f"job {job.key!r} is listed twice")
        missing = [k for k in job.after if k not in seen]
        if missing:
            raise ValueError(f"job {job.key!r} needs {missing}, which are not listed before it")
        seen.add(job.key)


def run_jobs(jobs: Sequence[Job], workers: int = 1, threads: int = 1, quiet: bool = False, journal=None) -> dict:
    """Run every job (or read it back from ``journal``); returns {key: Done}. The progress bar
    names the jobs running."""
    check_graph(jobs)
    if workers < 1 or threads < 1:
        raise ValueError(f"workers={workers} and threads={threads} must be at least 1")
    done: dict = {}
    with tqdm(total=len(jobs), desc="jobs", unit="job", file=sys.stderr, disable=quiet) as bar:
        if workers == 1:
            previous = torch.get_num_threads()
            _limit_threads(threads)
            try:
                for job in jobs:
                    args = job.args
                    done[job.key] = _recorded(journal, job, args)
                    if done[job.key] is None:
                        done[job.key] = Done(*_timed(job.fn, args), job.phase)
                        _record(journal, job, args, done[job.key])
                    bar.update(1)
            finally:
                torch.set_num_threads(previous)
            return done
        _run_parallel(jobs, workers, threads, done, bar, journal)
    return done


def _recorded(journal, job: Job, args: tuple) -> Optional[Done]:
    return journal.read(job.key, args) if journal is not None else None


def _record(journal, job: Job, args: tuple, done: Done) -> None:
    if journal is not None:
        journal.record(job.key, args, done)


def _run_parallel(jobs, workers, threads, done, bar, journal) -> None:
    pending = list(jobs)
    running: dict = {}  # future -> (job, its arguments)
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(PRELOAD))  # read when the server starts: once per process
    else:  # Windows: a fresh interpreter each
        context = multiprocessing.get_context("spawn")
    pool = futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=_start_worker, initargs=(threads, os.getcwd(), dict(os.environ))
    )
    try:
        while pending or running:
            for job in [j for j in pending if all(k in done for k in j.after)]:
                if len(running) >= workers:
                    break
                pending.remove(job)
                args = job.args
                earlier = _recorded(journal, job, args)
                if earlier is not None:
                    done[job.key] = earlier
                    bar.update(1)
                else:
                    running[pool.submit(_timed, job.fn, args)] = job, args
            if not running and any(all(k in done for k in j.after) for j in pending):
                continue  # jobs read back from the journal made others ready
            if not running:
                raise ValueError(f"jobs {[j.key for j in pending]} can never start")
            finished, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
            for future in finished:
                job, args = running.pop(future)
                try:
                    value, started, ended = future.result()  # a job's exception is raised here
                except BrokenProcessPool:
                    raise JobError(
                        f"a worker process died while running {job.key!r} (killed, or out of memory?); "
                        f"finished runs are kept"
                    ) from None
                done[job.key] = Done(value, started, ended, job.phase)
                _record(journal, job, args, done[job.key])
                bar.update(1)
                bar.set_postfix_str(", ".join(j.key for j, _ in running.values())[:60], refresh=False)
    except KeyboardInterrupt:
        _stop(pool)
        raise
    except BaseException:
        try:
            pool.shutdown(wait=True, cancel_futures=True)  # the running jobs finish
        except KeyboardInterrupt:  # unless a stop is asked meanwhile
            _stop(pool)
            raise
        _record_finished(journal, running)  # and are kept for --resume, as the failing job's error says
        raise
    pool.shutdown(wait=True)


def _record_finished(journal, running: dict) -> None:
    """Journal every job of ``running`` ({future: (job, args)}) that finished without an error: those
    that ran on while another job failed, or finished in the same wait as it."""
    for future, (job, args) in running.items():
        if future.done() and not future.cancelled() and future.exception() is None:
            value, started, ended = future.result()
            _record(journal, job, args, Done(value, started, ended, job.phase))


def _stop(pool: futures.ProcessPoolExecutor) -> None:
    """Drop the queued jobs, send every worker SIGTERM, kill any still running after ``STOP_SECONDS``
    (or at a second interrupt), and return when all have exited."""
    processes = list((pool._processes or {}).values())  # the executor's own table: no public way to its workers
    pool.shutdown(wait=False, cancel_futures=True)
    try:
        for process in processes:
            process.terminate()
        deadline = time.monotonic() + STOP_SECONDS
        for process in processes:
            process.join(max(deadline - time.monotonic(), 0))
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    pool.shutdown(wait=True)
