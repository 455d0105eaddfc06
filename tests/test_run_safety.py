"""Nothing a run made is lost: one live run per out_dir, a full disk during a save, SIGKILL at
any moment, and a second run that must not replace the first one's files."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from minilm.checkpoints import format as checkpoint
from minilm.common import keep_aside
from minilm.training import loop as trainer
from minilm.training.loop import train
from minilm.training.outdir import OutDirError, OutDirLock
from tests.conftest import REPO, tiny_overrides
from tests.forkrun import run_python

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}


def start(args, **kwargs):
    return subprocess.Popen(
        [sys.executable, "train.py", *args],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def wait_for(path, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and not os.path.exists(path):
        time.sleep(0.05)
    assert os.path.exists(path), f"{path} never appeared"


def records(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_a_second_run_on_a_busy_out_dir_refuses_and_the_first_finishes_intact(tiny_corpus, tmp_path):
    out = tmp_path / "busy"
    args = tiny_overrides(
        tiny_corpus,
        out,
        "train.max_steps=100000",
        "train.eval_interval=50",
        "train.checkpoint_interval=50",
        "train.sample_tokens=0",
    ) + ["--quiet"]
    first = start(args)
    wait_for(out / "metrics.jsonl")
    for extra in ([], ["--overwrite"], ["--resume"]):  # however it asks, the out_dir is taken
        second = run_python(["train.py", *args, *extra], cwd=REPO, env=ENV, timeout=300)
        assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
        assert "in use by another run" in second.stderr and f"process {first.pid}" in second.stderr
    first.send_signal(signal.SIGTERM)  # the first run ends as it would on Ctrl-C: saved, resumable
    _, err = first.communicate(timeout=300)
    assert first.returncode == 143, err
    log = records(out)
    steps = [r["step"] for r in log if r["event"] == "train"]
    saved = checkpoint.load(str(out))["step"]
    assert steps == list(range(1, len(steps) + 1)) and steps[-1] == saved  # one writer: no gaps, no repeats
    # the lock died with its process: the same out_dir can now be resumed, to the end
    again = run_python(
        ["train.py", *args[:-1], f"train.max_steps={saved + 2}", "--resume", "--quiet"], cwd=REPO, env=ENV, timeout=300
    )
    assert again.returncode == 0, again.stderr
    log = records(out)
    assert [r["step"] for r in log if r["event"] == "train"] == list(range(1, saved + 3))
    assert sum(r["event"] == "final" for r in log) == 1 and checkpoint.load(str(out))["step"] == saved + 2


def test_a_fresh_run_keeps_the_old_metrics_and_refuses_the_old_checkpoint(tiny_config):
    config = tiny_config("train.max_steps=2", "train.sample_tokens=0")
    train(config, quiet=True)
    with pytest.raises(OutDirError, match="--resume.*--overwrite"):
        train(config, quiet=True)
    assert len(records(config.out_dir)) > 0  # nothing was deleted by the refused run
    train(config, quiet=True, overwrite=True)
    assert os.path.exists(os.path.join(config.out_dir, "metrics.1.jsonl"))  # the first run's log, rotated


def test_a_fresh_run_keeps_aside_every_file_an_earlier_run_left(tiny_config, capsys):
    """--overwrite keeps what the earlier run wrote aside, whichever loggers this run has on: the csv
    of a logger now off and the snapshots too, in one note; a resumed run that writes a snapshot
    again keeps the earlier one beside it."""
    tiny = ("model.n_layer=1", "model.d_model=16", "train.sample_tokens=0", "train.final_eval_tokens=200")
    first = tiny_config(*tiny, "train.max_steps=1", "train.loggers=[jsonl, csv]", "train.snapshot_steps=[1]")
    train(first, quiet=True)
    out = first.out_dir
    snapshot = open(os.path.join(out, "snapshots", "step-1.pt"), "rb").read()
    capsys.readouterr()
    train(tiny_config(*tiny, "train.max_steps=1", "train.snapshot_steps=[1]"), overwrite=True)
    notes = [line for line in capsys.readouterr().err.splitlines() if "kept the earlier run's" in line]
    assert len(notes) == 1
    for kept in ("metrics.jsonl as metrics.1.jsonl", "metrics.csv as metrics.1.csv", "snapshots as snapshots.1"):
        assert kept in notes[0]
    assert not os.path.exists(os.path.join(out, "metrics.csv"))
    assert open(os.path.join(out, "snapshots.1", "step-1.pt"), "rb").read() == snapshot
    assert os.listdir(os.path.join(out, "snapshots")) == ["step-1.pt"]
    run = trainer.setup(tiny_config(*tiny, "train.max_steps=2"), resume=True, quiet=True)
    for logger in run.loggers:
        logger.close()
    again = open(os.path.join(out, "snapshots", "step-1.pt"), "rb").read()
    run.save_snapshot()  # step 1 again
    assert open(os.path.join(out, "snapshots", "step-1.1.pt"), "rb").read() == again
    own = os.path.join(out, "snapshots", "step-1.pt")  # a fresh run from its own snapshot would move it aside
    with pytest.raises(OutDirError, match=r"lies inside out_dir=.*copy it out of out_dir, or choose another"):
        train(tiny_config(*tiny, f"train.init_from={own}", "train.max_steps=2"), overwrite=True, quiet=True)
    assert sorted(os.listdir(os.path.join(out, "snapshots"))) == ["step-1.1.pt", "step-1.pt"]  # nothing moved


@pytest.mark.slow
def test_a_failing_run_leaves_the_previous_files_alone(tiny_corpus, tmp_path):
    out = tmp_path / "kept"
    args = tiny_overrides(tiny_corpus, out, "train.max_steps=2", "train.sample_tokens=0") + ["--quiet"]
    assert run_python(["train.py", *args], cwd=REPO, env=ENV, timeout=300, text=False).returncode == 0
    before, weights = records(out), (out / "ckpt.pt").read_bytes()
    for bad in ("model.position={kind: learned, max_positions: 16}", "data.corpus=/nonexistent/texts"):
        result = run_python(["train.py", *args, bad, "--overwrite"], cwd=REPO, env=ENV, timeout=300)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert records(out) == before and (out / "ckpt.pt").read_bytes() == weights


@pytest.mark.slow
def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(tiny_corpus, tmp_path):
    out = tmp_path / "full"
    args = tiny_overrides(tiny_corpus, out, "train.sample_tokens=0") + ["--quiet"]  # saves at steps 6 and 12
    script = textwrap.dedent(f"""
        import errno, runpy, sys, torch
        real, calls = torch.save, []
        def save(obj, f, *a, **k):
            calls.append(1)
            if len(calls) >= 2:  # the second save finds the disk full halfway through
                f.write(b"half a checkpoint")
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(obj, f, *a, **k)
        torch.save = save
        sys.argv = ["train.py", *{args!r}]
        runpy.run_path("train.py", run_name="__main__")
    """)
    result = run_python(["-c", script], cwd=REPO, env=ENV, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "no space left on the device" in result.stderr and "the previous checkpoint is kept" in result.stderr
    assert checkpoint.load(str(out))["step"] == 6
    assert not [name for name in os.listdir(out) if name.endswith(".tmp")]


@pytest.mark.slow
@pytest.mark.parametrize("seconds", [0.3, 0.8, 1.5, 2.5])
def test_sigkill_at_any_moment_leaves_a_loadable_checkpoint(tiny_corpus, tmp_path, seconds):
    out = tmp_path / "killed"
    args = tiny_overrides(
        tiny_corpus,
        out,
        "train.max_steps=100000",
        "train.checkpoint_interval=1",
        "train.eval_interval=100000",
        "train.sample_tokens=0",
    ) + ["--quiet"]
    proc = start(args)
    wait_for(out / "metrics.jsonl")  # the run is past its setup: it now saves at every step
    time.sleep(seconds)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    state = checkpoint.load(str(out))  # never a half-written file
    assert state["step"] >= 1
    resumed = run_python(
        ["train.py", *args[:-1], f"train.max_steps={state['step'] + 1}", "--resume", "--quiet"],
        cwd=REPO,
        env=ENV,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert not [name for name in os.listdir(out) if name.endswith(".tmp")]  # stale temporaries are removed


def test_the_lock_is_exclusive_and_rotate_never_overwrites(tmp_path):
    with OutDirLock(str(tmp_path)):
        with pytest.raises(OutDirError, match=f"process {os.getpid()}"):
            with OutDirLock(str(tmp_path)):
                pass
    with OutDirLock(str(tmp_path)):  # released on exit
        pass
    for n in range(3):
        (tmp_path / "m.jsonl").write_text(str(n))
        keep_aside(str(tmp_path / "m.jsonl"))
    assert [(tmp_path / f"m.{n}.jsonl").read_text() for n in (1, 2, 3)] == ["0", "1", "2"]


@pytest.mark.slow
def test_resuming_with_other_train_settings_says_so(tiny_corpus, tmp_path):
    out = tmp_path / "sched"
    first = run_python(
        ["train.py", *tiny_overrides(tiny_corpus, out, "train.max_steps=4", "train.sample_tokens=0")],
        cwd=REPO,
        env=ENV,
        timeout=300,
    )
    assert first.returncode == 0, first.stderr
    longer = run_python(
        ["train.py", *tiny_overrides(tiny_corpus, out, "train.max_steps=6", "train.sample_tokens=0"), "--resume"],
        cwd=REPO,
        env=ENV,
        timeout=300,
    )
    assert longer.returncode == 0, longer.stderr
    assert "train.max_steps=6 (was 4)" in longer.stderr and "differs from the uninterrupted one" in longer.stderr
