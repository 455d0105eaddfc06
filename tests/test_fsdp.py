"""FSDP2 (train.parallel: fsdp) under torchrun with 2 gloo processes, and sharded checkpoints
(train.checkpoint_format: sharded): the sharded run follows the one-process run, a sharded
checkpoint resumes on 2 or 1 processes whichever number wrote it, ``minilm unshard`` makes an
ordinary file of it, and a failed save leaves the previous checkpoint whole.

Every run here uses a constant learning rate after the warm-up (min_lr = lr), so that a run
cut at step 5 and resumed to step 10 has the schedule of the uninterrupted 10-step run."""

import errno
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp

from minilm.checkpoints import format as checkpoint
from minilm.checkpoints.format import CheckpointError
from minilm.checkpoints.loading import load_model
from minilm.config import ConfigError, resolve_config
from minilm.configfile import load_config
from minilm.training import saving
from minilm.training.loop import TrainingError, train
from minilm.training.parallel import FSDP2_ON_CPU
from tests.conftest import REPO, tiny_overrides
from tests.forkrun import run_python

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
fsdp_on_cpu = pytest.mark.skipif(
    not FSDP2_ON_CPU, reason=f"FSDP2 on the CPU needs torch >= 2.9, not {torch.__version__}"
)

CONSTANT_LR = (
    "train.lr=3e-3",
    "train.min_lr=3e-3",
    "train.checkpoint_interval=5",
    "train.eval_interval=5",
    "train.sample_tokens=0",
)


def run(args, processes=1):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"] if processes > 1 else []
    proc = subprocess.run(
        [sys.executable, *launcher, "train.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def losses(out_dir, event="train"):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [(r["step"], r.get("loss", r.get("val_loss"))) for r in map(json.loads, f) if r["event"] == event]


def overrides(corpus, out_dir, processes, *extra):
    """Global batch 8 rows of 32 tokens: 2 processes x 4 rows, or 1 process x 2 micro-steps x 4 rows."""
    return tiny_overrides(corpus, out_dir, *CONSTANT_LR, f"train.grad_accum={2 // processes}", *extra)


@pytest.fixture(scope="module")
def reference(tiny_corpus, tmp_path_factory):
    """The one-process run of 10 steps that the sharded runs must follow."""
    out = tmp_path_factory.mktemp("fsdp") / "reference"
    run(overrides(tiny_corpus, out, 1, "train.max_steps=10"))
    return out


@pytest.mark.slow
@fsdp_on_cpu
def test_fsdp_on_two_processes_follows_the_one_process_run(tiny_corpus, tmp_path, reference):
    out = tmp_path / "fsdp"
    proc = run(overrides(tiny_corpus, out, 2, "train.max_steps=10", "train.parallel=fsdp"), processes=2)
    assert "2 processes" in proc.stderr
    ours, theirs = losses(out), losses(reference)
    assert [s for s, _ in ours] == list(range(1, 11))
    for (_, a), (_, b) in zip(ours, theirs):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-5)
    ((_, final),) = losses(out, "final")
    assert final == pytest.approx(losses(reference, "final")[0][1], rel=1e-5)
    a, b = checkpoint.load(str(out)), checkpoint.load(str(reference))  # the file gathered from the shards
    for key in b["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-5, atol=1e-6)
    (mine,), (yours,) = a["optimizer"]["parts"], b["optimizer"]["parts"]
    assert mine["param_groups"] == yours["param_groups"]
    for i, state in yours["state"].items():
        torch.testing.assert_close(mine["state"][i]["exp_avg_sq"], state["exp_avg_sq"], rtol=1e-4, atol=1e-9)


@pytest.mark.slow
@fsdp_on_cpu
def test_fsdp_ranks_receive_rank_0s_weights_and_buffers(tiny_corpus, tmp_path):
    """Ranks other than 0 build the model on the meta device and receive their shards, and the
    buffers no state dict holds (ALiBi's slopes), from rank 0: the run still follows one process,
    here with two micro-steps a step (FSDP reduces the gradients into the shards after each)."""
    alibi = ("model.position.kind=alibi", "train.max_steps=3")
    run(overrides(tiny_corpus, tmp_path / "one", 1, *alibi, "train.grad_accum=4"))
    run(overrides(tiny_corpus, tmp_path / "two", 2, *alibi, "train.grad_accum=2", "train.parallel=fsdp"), processes=2)
    for (_, a), (_, b) in zip(losses(tmp_path / "two", "final"), losses(tmp_path / "one", "final")):
        assert a == pytest.approx(b, rel=1e-5)


@pytest.mark.slow
@fsdp_on_cpu
def test_fsdp_evaluates_positions_drawn_per_row_in_lockstep(tiny_corpus, tmp_path):
    """Positions drawn at evaluation make a forward pass per row: every rank must still make as
    many passes (and FSDP gathers) as the others, whatever its share of the rows."""
    drawn = (
        "model.position={kind: randomized, inner: {kind: rope}, max_positions: 64, eval_positions: sampled}",
        "train.max_steps=2",
        "train.final_eval_tokens=255",
    )  # a tail row shorter than the rest
    run(overrides(tiny_corpus, tmp_path / "two", 2, *drawn, "train.parallel=fsdp"), processes=2)
    assert len(losses(tmp_path / "two", "final")) == 1


@pytest.mark.slow
@fsdp_on_cpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fsdp_mixed_precision_trains_near_the_float32_run(tiny_corpus, tmp_path, reference, dtype):
    """bf16 weights gathered for compute with float32 gradient reduction; float16 with the scaler."""
    out = tmp_path / dtype
    run(
        overrides(tiny_corpus, out, 2, "train.max_steps=10", "train.parallel=fsdp", f"train.dtype={dtype}"), processes=2
    )
    for (_, a), (_, b) in zip(losses(out), losses(reference)):
        assert a == pytest.approx(b, rel=2e-3)


@pytest.mark.slow
@fsdp_on_cpu
def test_sharded_checkpoints_resume_on_two_or_one_processes(tiny_corpus, tmp_path, reference):
    """2 -> 2, 2 -> 1 and 1 -> 2: the resumed runs continue the uninterrupted trajectory."""
    sharded = ("train.parallel=fsdp", "train.checkpoint_format=sharded")
    two, one = tmp_path / "two", tmp_path / "one"
    run(overrides(tiny_corpus, two, 2, "train.max_steps=5", *sharded), processes=2)
    assert sorted(os.listdir(two / "ckpt.dcp")) == [".metadata", "__0_0.distcp", "__1_0.distcp", "run.pt"]
    assert not (two / "ckpt.pt").exists()
    run(overrides(tiny_corpus, one, 1, "train.max_steps=5", *sharded))
    for name, first, then in (("2-2", two, 2), ("2-1", two, 1), ("1-2", one, 2)):
        out = tmp_path / name
        shutil.copytree(first, out)
        proc = run([*overrides(tiny_corpus, out, then, "train.max_steps=10", *sharded), "--resume"], processes=then)
        assert "resuming" in proc.stderr and "at step 5" in proc.stderr
        assert "process(es)" not in proc.stderr  # grad_accum keeps the global batch: nothing to say
        ours, theirs = losses(out), losses(reference)
        assert [s for s, _ in ours] == list(range(1, 11)), name
        for (step, a), (_, b) in zip(ours, theirs):
            assert a == pytest.approx(b, rel=1e-5, abs=1e-5), (name, step)


@pytest.mark.slow
@fsdp_on_cpu
def test_unshard_makes_a_file_that_commands_take_and_resume_continues(tiny_corpus, tmp_path, reference, capsys):
    out = tmp_path / "run"
    run(
        overrides(tiny_corpus, out, 2, "train.max_steps=5", "train.parallel=fsdp", "train.checkpoint_format=sharded"),
        processes=2,
    )
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = run_python(["-m", "minilm", "unshard", str(out)], cwd=REPO, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "step 5" in proc.stdout and proc.stderr == ""
    model, _, config, _ = load_model(str(out / "ckpt.pt"))
    assert config.model.n_layer == 2 and model.num_params() > 0
    again = run_python(["-m", "minilm", "unshard", str(out)], cwd=REPO, env=env, timeout=120)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "--overwrite" in again.stderr
    other = tmp_path / "other"  # resumed on one process with the two's grad_accum: half the global batch, said
    shutil.copytree(out, other, ignore=shutil.ignore_patterns("ckpt.dcp"))
    config = resolve_config(load_config(None, overrides(tiny_corpus, other, 2, "train.max_steps=6")))
    capsys.readouterr()
    train(config, resume=True)
    said = capsys.readouterr().err
    assert "trained on 2 process(es), this one on 1: each step now takes 4 sequences, not 8" in said, said
    config = resolve_config(load_config(None, overrides(tiny_corpus, out, 1, "train.max_steps=10")))
    train(config, resume=True, quiet=True)  # the file, optimiser and all, continues the run
    for (_, a), (_, b) in zip(losses(out), losses(reference)):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-5)


# --------------------------------------------------------------------------- one process


def test_a_sharded_muon_run_resumes_and_unshards(tiny_config):
    """Muon's state is read back from shards as AdamW's is (torch's checkpoint builds a fresh optimiser's
    state by step(closure=None), which Muon refused: such a run saved what it could never read)."""
    muon = ("train.checkpoint_format=sharded", "train.optimizer=muon")
    train(tiny_config("train.max_steps=2", *muon), quiet=True)
    assert train(tiny_config("train.max_steps=3", *muon), resume=True, quiet=True)["steps"] == 3
    config = tiny_config("train.max_steps=3", *muon)
    assert load_model(
        saving.unshard(config.out_dir, os.path.join(config.out_dir, "whole.pt"))
    ).config.train.optimizer == ("muon")


def test_a_sharded_checkpoint_is_refused_where_a_file_is_expected(tiny_config):
    config = tiny_config("train.max_steps=2", "train.checkpoint_format=sharded")
    train(config, quiet=True)
    with pytest.raises(
        CheckpointError, match="is a sharded checkpoint: make one file of it with 'python -m minilm unshard"
    ):
        load_model(config.out_dir)
    with pytest.raises(
        CheckpointError,
        match="train.checkpoint_format='file' but .* holds ckpt.dcp: resume with train.checkpoint_format=sharded",
    ):
        train(tiny_config("train.max_steps=3"), resume=True, quiet=True)
    with pytest.raises(CheckpointError, match="is not a sharded checkpoint"):
        saving.unshard(config.out_dir + "-missing")
    folder = os.path.join(config.out_dir, "whole")  # --out a directory: its ckpt.pt, refused only where it exists
    os.makedirs(folder)
    assert saving.unshard(config.out_dir, folder, overwrite=False) == os.path.join(folder, "ckpt.pt")
    with pytest.raises(CheckpointError, match=f"{os.path.join(folder, 'ckpt.pt')!r} exists: give --overwrite"):
        saving.unshard(config.out_dir, folder, overwrite=False)


@pytest.mark.slow
def test_damaged_shards_are_one_line_errors(tiny_config, tmp_path):
    config = tiny_config("train.max_steps=2", "train.checkpoint_format=sharded")
    train(config, quiet=True)
    damaged = tmp_path / "damaged"
    shutil.copytree(os.path.join(config.out_dir, "ckpt.dcp"), damaged / "ckpt.dcp")
    os.truncate(damaged / "ckpt.dcp" / ".metadata", 50)
    env = {**os.environ, "PYTHONPATH": REPO}
    for argv, said in (
        (["unshard", str(damaged)], "cannot read the shards of"),
        (["unshard", os.path.join(config.out_dir, "nothing")], "is not a sharded checkpoint"),
    ):
        proc = run_python(["-m", "minilm", *argv], cwd=REPO, env=env, timeout=120)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and said in proc.stderr, proc.stderr


def test_muon_is_refused_under_fsdp():
    with pytest.raises(ConfigError, match="train.optimizer='muon' with train.parallel='fsdp' is refused"):
        load_config(None, ["train.optimizer=muon", "train.parallel=fsdp"])


def test_a_failed_sharded_save_leaves_the_previous_checkpoint_whole(tiny_config, monkeypatch):
    """The save at step 6 writes a shard and fails (a full disk): the step-3 checkpoint stays
    whole, the half-written one is gone, and --resume continues from step 3."""
    config = tiny_config("train.max_steps=6", "train.checkpoint_interval=3", "train.checkpoint_format=sharded")
    real_save, calls = dcp.save, []

    def save_then_fail(state, checkpoint_id):
        calls.append(checkpoint_id)
        if len(calls) == 2:
            open(os.path.join(checkpoint_id, "__0_0.distcp"), "wb").write(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(state, checkpoint_id=checkpoint_id)

    monkeypatch.setattr(dcp, "save", save_then_fail)
    with pytest.raises(
        TrainingError,
        match=r"cannot save the checkpoint .*ckpt.dcp. at step 6: no space left on the "
        r"device .*; the previous checkpoint is kept",
    ):
        train(config, quiet=True)
    monkeypatch.setattr(dcp, "save", real_save)
    link = os.path.join(config.out_dir, "ckpt.dcp")
    version = os.path.join(config.out_dir, os.readlink(link))
    assert sorted(os.listdir(config.out_dir)) == sorted(
        [".lock", "ckpt.dcp", "metrics.jsonl", os.path.basename(version)]
    )
    assert saving.read_record(link)["step"] == 3
    assert train(config, resume=True, quiet=True)["steps"] == 6
    assert not os.path.exists(version) and saving.read_record(link)["step"] == 6  # the old version is gone


KILLED_SAVE = """
import os, sys
from minilm.config import resolve_config
from minilm.configfile import load_config
from minilm.training import saving
from minilm.training.loop import train
point, calls = saving._point, []
def point_then_die(directory, version):
    calls.append(version)
    if len(calls) == 2:  # the step-6 version is complete on disk; the process dies before the link moves
        os._exit(9)
    point(directory, version)
saving._point = point_then_die
train(resolve_config(load_config(None, sys.argv[1:])), quiet=True)
"""


@pytest.mark.slow
def test_a_save_killed_before_its_link_moves_leaves_the_previous_checkpoint(tiny_corpus, tmp_path):
    out = tmp_path / "run"
    given = tiny_overrides(
        tiny_corpus, out, "train.max_steps=6", "train.checkpoint_interval=3", "train.checkpoint_format=sharded"
    )
    proc = run_python(
        ["-c", KILLED_SAVE, *given],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert proc.returncode == 9, proc.stderr
    versions = sorted(p for p in os.listdir(out) if p.startswith(".ckpt.dcp-"))
    assert len(versions) == 2 and saving.read_record(str(out / "ckpt.dcp"))["step"] == 3
    config = resolve_config(load_config(None, given))
    assert train(config, resume=True, quiet=True)["steps"] == 6
    assert [p for p in os.listdir(out) if p.startswith(".ckpt.dcp-")] == [os.readlink(out / "ckpt.dcp")]


def test_a_stale_staging_directory_is_removed_when_a_run_starts(tiny_config):
    config = tiny_config("train.max_steps=1")
    stale = os.path.join(config.out_dir, ".ckpt.dcp-1a2b3c.tmp")
    os.makedirs(stale)
    open(os.path.join(stale, "__0_0.distcp"), "wb").close()
    train(config, quiet=True)
    assert not os.path.exists(stale)


def test_a_file_older_than_the_sharded_checkpoint_beside_it_is_refused(tiny_config):
    """After 'minilm unshard' the run went on sharded: the out_dir's ckpt.pt is stale."""
    config = tiny_config("train.max_steps=3", "train.checkpoint_format=sharded")
    train(config, quiet=True)
    saving.unshard(config.out_dir)
    assert load_model(config.out_dir)[3]["step"] == 3  # both at step 3: the file is the same checkpoint
    train(tiny_config("train.max_steps=5", "train.checkpoint_format=sharded"), resume=True, quiet=True)
    with pytest.raises(
        CheckpointError,
        match=r"holds ckpt.pt at step 3 and ckpt.dcp at step 5: bring ckpt.pt up to "
        r"date with 'python -m minilm unshard .* --overwrite'",
    ):
        load_model(config.out_dir)
    assert load_model(os.path.join(config.out_dir, "ckpt.pt"))[3]["step"] == 3
    saving.unshard(config.out_dir)
    assert load_model(config.out_dir)[3]["step"] == 5
