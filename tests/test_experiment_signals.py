"""``minilm experiment`` stops when told (issue 59): a SIGTERM to the command reaches its worker
processes, none survives it, nothing is half-written or journaled half-done, and ``--resume``
finishes the study."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minilm.cli import experiment as experiment_cli
from minilm.training import loop
from minilm.training.optim import lr_at
from tests.forkrun import run_python

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads processes from /proc (Linux)")


def descendants(pid: int) -> set:
    """(pid, start time) of every process below ``pid``, read from /proc (the start time tells a
    reused pid apart)."""
    found, stack = set(), [pid]
    while stack:
        for task in Path(f"/proc/{stack.pop()}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:  # the task ended meanwhile
                continue
            for child in children:
                if started(child) is not None:
                    found.add((child, started(child)))
                    stack.append(child)
    return found


def started(pid: int):
    """The start time of a live process, or None when it is gone (a zombie is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in "ZX" else fields[19]


def alive(processes: set) -> set:
    return {(pid, when) for pid, when in processes if started(pid) == when}


def study_args(corpus, out, workers: int, steps: int) -> list:
    """``minilm experiment``'s arguments for a one-seed quick ablation of the base group on ``corpus``."""
    return [
        "ablation",
        "--quick",
        "--out",
        str(out),
        "--seeds",
        "1",
        "--workers",
        str(workers),
        "--quiet",
        "ablation.groups=[base]",
        f"data.corpus={corpus / 'corpus.txt'}",
        "data.vocab_size=400",
        f"data.dir={corpus / 'data'}",
        f"train.max_steps={steps}",
    ]


@pytest.mark.slow
def test_a_sigterm_stops_the_workers_and_resume_finishes_the_study(tiny_corpus, tmp_path):
    out = tmp_path / "study"
    command = [sys.executable, "-m", "minilm", "experiment", *study_args(tiny_corpus, out, workers=2, steps=100)]
    # (100 steps: the signal finds a worker training)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    log = tmp_path / "stderr.txt"  # not a pipe: a worker left running would hold it open
    with open(log, "w") as err:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err)
    workers: set = set()
    try:
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None and not list(out.glob("runs/*/metrics.jsonl")):
            time.sleep(0.05)
        workers = descendants(proc.pid)
        assert proc.poll() is None and len(workers) >= 2, "the study ended before its workers were seen training"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        deadline = time.time() + 5  # the resource tracker ends when it sees the command gone
        while alive(workers) and time.time() < deadline:
            time.sleep(0.05)
        assert not alive(workers), f"processes left running: {sorted(alive(workers))}"
    finally:
        proc.kill()
        for pid, _ in alive(workers):
            os.kill(pid, signal.SIGKILL)
    stderr = log.read_text()
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1].startswith("error: stopped by SIGTERM")
    assert "--resume" in stderr.strip().splitlines()[-1]
    assert not list(out.rglob(".*.tmp"))  # no write was left half done
    entries = [p.read_text() for p in (out / "journal").glob("*.json") if p.name != "meta.json"]
    assert all('"SIGTERM"' not in text for text in entries)  # a run stopped part way is not journaled as done

    resumed = run_python([*command[1:], "--resume"], cwd=REPO, env=env, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert (out / "report.md").exists() and (out / "results.csv").exists()


def test_a_training_run_stopped_part_way_is_not_journaled_as_done(tiny_corpus, tmp_path, monkeypatch, capsys):
    """One worker (the jobs run in this process): a SIGTERM caught by the training loop ends the study with
    status 143 instead of recording the cut run as finished, and the SIGTERM handler is given back."""
    out = tmp_path / "study"
    args = study_args(tiny_corpus, out, workers=1, steps=5)
    handler, sent = signal.getsignal(signal.SIGTERM), []

    def lr_then_terminate(step, t):  # a real SIGTERM during the first run's third step
        if step == 2 and not sent:
            sent.append(step)
            os.kill(os.getpid(), signal.SIGTERM)
        return lr_at(step, t)

    monkeypatch.setattr(loop, "lr_at", lr_then_terminate)
    assert experiment_cli.main(args) == 143
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: stopped by SIGTERM")
    assert signal.getsignal(signal.SIGTERM) is handler
    assert not [p for p in (out / "journal").glob("*.json") if p.name != "meta.json"]
    monkeypatch.setattr(loop, "lr_at", lr_at)
    assert experiment_cli.main([*args, "--resume"]) == 0
