"""Tests for minilm.training.loop and train.py: schedule, optimiser groups, a tiny run end to end,
exact resume, NaN stop, signals, init_from and 2-process DDP (gloo)."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

import minilm.data.corpus
from minilm.checkpoints import format as checkpoint
from minilm.checkpoints.format import CheckpointError
from minilm.checkpoints.loading import load_model
from minilm.cli.train import main as train_cli
from minilm.common import cpu_has_fast_bf16, resolve_dtype
from minilm.config import Config, ConfigError, ModelConfig, TrainConfig, resolve_config
from minilm.configfile import load_config
from minilm.model.gpt import GPT
from minilm.training import loop as trainer
from minilm.training.announce import idle_settings
from minilm.training.loop import TrainingError, train
from minilm.training.mixture import draw
from minilm.training.optim import lr_at, make_optimizer
from minilm.training.resume import resumed_tokenizer, trajectory_changes
from tests.conftest import REPO, tiny_overrides, tiny_text
from tests.forkrun import run_python


def read_metrics(out_dir, event="train"):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["event"] == event]


def cli(args):
    return run_python(args, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO})


# --------------------------------------------------------------------------- pieces


def test_lr_schedule_warmup_then_cosine_to_min_lr():
    t = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=110)
    assert lr_at(0, t) == pytest.approx(1e-4)  # (step + 1) / warmup
    assert lr_at(9, t) == pytest.approx(1e-3)
    assert lr_at(10, t) == pytest.approx(1e-3)
    assert lr_at(60, t) == pytest.approx(1e-4 + 0.5 * 9e-4)  # half way: the cosine is at 0
    assert lr_at(110, t) == pytest.approx(1e-4)
    values = [lr_at(s, t) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_lr_schedule_wsd_holds_lr_then_falls_linearly_over_the_cooldown():
    t = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=110, schedule="wsd", cooldown=0.4)
    assert lr_at(0, t) == pytest.approx(1e-4)  # the same warm-up as the cosine
    assert [lr_at(s, t) for s in (10, 40, 65)] == [1e-3] * 3  # held until 110 * 0.6 = 66
    assert lr_at(66, t) == pytest.approx(1e-3)
    assert lr_at(88, t) == pytest.approx(1e-4 + 0.5 * 9e-4)  # half way through the cooldown
    assert lr_at(109, t) == pytest.approx(1e-4 + 9e-4 / 44)
    assert lr_at(110, t) == pytest.approx(1e-4)
    steps = [lr_at(s, t) - lr_at(s + 1, t) for s in range(66, 110)]
    assert steps == pytest.approx([9e-4 / 44] * 44)  # a straight line
    # a cooldown longer than what follows the warm-up starts where the warm-up ends
    whole = TrainConfig(lr=1e-3, min_lr=0.0, warmup_steps=10, max_steps=110, schedule="wsd", cooldown=1.0)
    assert lr_at(10, whole) == pytest.approx(1e-3) and lr_at(60, whole) == pytest.approx(5e-4)


def test_weight_decay_only_on_matrices_not_positions():
    from minilm import ModelConfig

    model = GPT(
        ModelConfig(
            vocab_size=300, n_layer=1, n_head=2, d_model=16, block_size=8, bias=True, position={"kind": "learned"}
        )
    )
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1), torch.device("cpu"))
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in decayed}
    assert opt.param_groups[0]["weight_decay"] == 0.1 and opt.param_groups[1]["weight_decay"] == 0.0
    assert "wte.weight" in names and "blocks.0.attn.qkv.weight" in names and "blocks.0.mlp.fc.weight" in names
    assert "positions.table.weight" not in names
    assert not any("ln_" in n or n.endswith(".bias") for n in names)
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


def test_dtype_auto_follows_the_hardware():
    cpu = torch.device("cpu")
    assert resolve_dtype("float32", cpu) == torch.float32
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16
    expected = torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    assert resolve_dtype("auto", cpu) == expected


# --------------------------------------------------------------------------- runs


def test_tiny_run_writes_checkpoint_metrics_and_summary(tiny_config):
    config = tiny_config()
    summary = train(config, quiet=True)
    for key in ("checkpoint", "steps", "tokens", "seconds", "best_val_bpc", "final_val_loss"):
        assert key in summary
    assert summary["steps"] == 12 and summary["tokens"] == 12 * 4 * 32
    model, tokenizer, loaded, state = load_model(summary["checkpoint"])
    assert state["step"] == 12 and loaded.model.vocab_size == tokenizer.vocab_size == 400
    assert state["tokenizer"] == minilm.data.corpus.prepare(config.data, quiet=True).tokenizer.to_bytes()
    train_log = read_metrics(config.out_dir)
    assert [r["step"] for r in train_log] == list(range(1, 13))
    assert train_log[-1]["loss"] < train_log[0]["loss"]
    assert [r["step"] for r in read_metrics(config.out_dir, "eval")] == [6]
    final = read_metrics(config.out_dir, "final")[0]
    prepared = minilm.data.corpus.prepare(config.data, quiet=True)
    bpc = final["val_loss"] * len(prepared.val) / prepared.val_chars / math.log(2)
    assert final["val_bpc"] == pytest.approx(bpc, rel=1e-4)
    assert summary["final_val_bpc"] == final["val_bpc"] and summary["best_val_bpc"] <= final["val_bpc"]
    assert final["val_ppl"] == pytest.approx(math.exp(final["val_loss"]), rel=1e-4)
    assert isinstance(summary["sample"], str)


def test_snapshots_keep_the_weights_of_chosen_steps(tiny_config):
    config = tiny_config("train.snapshot_steps=[5, 12]")
    summary = train(config, quiet=True)
    snapshots = os.path.join(config.out_dir, "snapshots")
    assert sorted(os.listdir(snapshots)) == ["step-12.pt", "step-5.pt"]
    final = load_model(summary["checkpoint"]).model.state_dict()
    at_end = load_model(os.path.join(snapshots, "step-12.pt"))
    assert at_end.state["step"] == 12 and "optimizer" not in at_end.state  # weights only
    assert all(torch.equal(final[k], v) for k, v in at_end.model.state_dict().items())
    early = load_model(os.path.join(snapshots, "step-5.pt")).model.state_dict()
    assert not all(torch.equal(final[k], v) for k, v in early.items())
    for bad in ("[0]", "[13]", "[true]"):
        with pytest.raises(
            ConfigError, match=r"train.snapshot_steps=.* is invalid: expected a list of steps between 1"
        ):
            tiny_config(f"train.snapshot_steps={bad}")
    with pytest.raises(ConfigError, match="train.snapshot_steps=5 has the wrong type: expected list"):
        tiny_config("train.snapshot_steps=5")


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_resume_reproduces_the_uninterrupted_losses_exactly(tiny_config, monkeypatch, optimizer):
    full = train(tiny_config(f"train.optimizer={optimizer}", out="full"), quiet=True)
    reference = [r["loss"] for r in read_metrics(os.path.dirname(full["checkpoint"]))]

    config = tiny_config(f"train.optimizer={optimizer}", out="cut")
    handler = signal.getsignal(signal.SIGINT)

    def lr_then_interrupt(step, t):  # a real SIGINT during step 5
        if step == 4:
            os.kill(os.getpid(), signal.SIGINT)
        return lr_at(step, t)

    monkeypatch.setattr(trainer, "lr_at", lr_then_interrupt)
    first = train(config, quiet=True)
    monkeypatch.setattr(trainer, "lr_at", lr_at)
    assert first["interrupted"] == "SIGINT" and first["steps"] == 5
    assert checkpoint.load(config.out_dir)["step"] == 5
    second = train(config, resume=True, quiet=True)
    assert second["steps"] == 12
    assert [r["loss"] for r in read_metrics(config.out_dir)] == reference
    assert second["final_val_loss"] == full["final_val_loss"]
    assert signal.getsignal(signal.SIGINT) is handler  # the handlers are restored


def test_seed_fixes_the_initialisation_and_data_seed_the_batches(tiny_config):
    def first(*extra):
        run = trainer.setup(tiny_config(*extra, out="-".join(extra) or "default"), quiet=True)
        for logger in run.loggers:
            logger.close()
        x, _, _ = draw(run.prepared.train, 4, 32, run.generator, 0, 0.0, None)
        return run.raw.lm_head.weight.detach().clone(), x

    weights, batch = first()
    same_data_weights, same_data_batch = first("seed=7", "data_seed=1337")  # data_seed as the default seed
    other_data_weights, other_data_batch = first("data_seed=8")
    assert torch.equal(batch, same_data_batch) and not torch.equal(weights, same_data_weights)
    assert torch.equal(weights, other_data_weights) and not torch.equal(batch, other_data_batch)
    with pytest.raises(ConfigError, match=r"data_seed=-1 is invalid: expected an integer from 0 to 2\*\*63 - 1"):
        tiny_config("data_seed=-1")


def test_a_needle_in_every_row_logs_the_text_and_the_task_loss_apart(tiny_config):
    config = tiny_config(
        "train.max_steps=3", "train.retrieval_share=1.0", "train.retrieval_weight=8", "model.block_size=64"
    )
    train(config, quiet=True)
    rows = read_metrics(config.out_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:  # the step's loss is the weighted mean of the two, so it lies between them
        low, high = sorted((r["text_loss"], r["task_loss"]))
        assert low - 1e-4 <= r["loss"] <= high + 1e-4


def test_resume_errors(tiny_config):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        train(tiny_config(), resume=True, quiet=True)
    train(tiny_config("train.max_steps=2"), quiet=True)
    with pytest.raises(ConfigError, match="model.d_model=48"):
        train(tiny_config("model.d_model=48"), resume=True, quiet=True)
    with pytest.raises(ConfigError, match="train.optimizer='muon' but the checkpoint was trained with 'adamw'"):
        train(tiny_config("train.optimizer=muon"), resume=True, quiet=True)


TINY = ("model.n_layer=1", "model.d_model=16", "train.sample_tokens=0", "train.final_eval_tokens=200")


def test_a_resume_after_the_corpus_changed_keeps_the_checkpoints_tokenizer(tmp_path, capsys):
    """A resumed run's ids are its checkpoint's: a corpus edited since is encoded with the checkpoint's
    tokenizer (not a tokenizer trained again on it, whose ids mean other pieces), and the run says so."""
    (tmp_path / "corpus.txt").write_text(tiny_text(800))

    def config(steps):
        return resolve_config(load_config(None, tiny_overrides(tmp_path, tmp_path / "run", *TINY, steps)))

    first = train(config("train.max_steps=1"), quiet=True)
    before = checkpoint.load(first["checkpoint"])["tokenizer"]
    (tmp_path / "corpus.txt").write_text(tiny_text(800, seed=1))
    capsys.readouterr()
    train(config("train.max_steps=2"), resume=True)
    state = checkpoint.load(first["checkpoint"])
    assert state["step"] == 2 and state["tokenizer"] == before
    assert "changed since the checkpoint was written" in capsys.readouterr().err


def test_a_resume_refuses_a_data_tokenizer_that_is_not_the_checkpoints(tiny_config, gen_tokenizer, hf_tokenizer_dir):
    config = tiny_config(f"data.tokenizer={hf_tokenizer_dir}")
    state = {"tokenizer": gen_tokenizer.to_bytes(), "path": "out/ckpt.pt"}
    with pytest.raises(ConfigError, match="data.tokenizer=.* is no longer the tokenizer the checkpoint was trained"):
        resumed_tokenizer(config, state)


def test_resuming_a_finished_run_is_refused_and_changes_nothing(tiny_config):
    """A resumed run with no steps left would only evaluate, log a second final record and save the
    checkpoint again with another max_steps: it is refused, naming the step, before anything is written."""
    train(tiny_config(*TINY, "train.max_steps=2"), quiet=True)
    out = tiny_config().out_dir
    files = {name: open(os.path.join(out, name), "rb").read() for name in ("ckpt.pt", "metrics.jsonl")}
    in_the_file = tiny_config(*TINY, "train.max_steps=5")
    in_the_file.overridden = in_the_file.overridden - {"train.max_steps"}  # a config file's: the checkpoint's 2 wins
    with pytest.raises(ConfigError, match=r"at step 2 \(the run is finished\) and train.max_steps=2 \(the checkpo"):
        train(in_the_file, resume=True, quiet=True)
    with pytest.raises(ConfigError, match=r"at step 2 \(the run is finished\) and train.max_steps=2: .* above 2"):
        train(tiny_config(*TINY, "train.max_steps=2"), resume=True, quiet=True)
    with pytest.raises(ConfigError, match=r"at step 2 and train.max_steps=1: give a train.max_steps above 2"):
        train(tiny_config(*TINY, "train.max_steps=1"), resume=True, quiet=True)
    assert {name: open(os.path.join(out, name), "rb").read() for name in files} == files
    assert train(tiny_config(*TINY, "train.max_steps=3"), resume=True, quiet=True)["steps"] == 3


def test_a_resumed_run_trains_with_the_settings_its_notes_name(tiny_config):
    """On --resume a train setting given again is the one the optimiser steps with (loading torch's state
    would put back the checkpoint's weight decay and betas), and one only the config file changed is the
    checkpoint's, as the note says, in the optimiser and the dtype alike."""
    train(tiny_config("train.max_steps=2", "train.weight_decay=0.1", "train.dtype=float32"), quiet=True)

    def resumed(config):
        run = trainer.setup(config, resume=True, quiet=True)
        for logger in run.loggers:
            logger.close()
        return run

    given = resumed(tiny_config("train.max_steps=4", "train.weight_decay=0.0", "train.beta2=0.9"))
    assert {group["weight_decay"] for group in given.optimizer.param_groups} == {0.0}
    assert {group["betas"] for group in given.optimizer.param_groups} == {(0.9, 0.9)}
    in_the_file = tiny_config("train.max_steps=4", "train.weight_decay=0.3", "train.dtype=bfloat16")
    in_the_file.overridden = in_the_file.overridden - {"train.weight_decay", "train.dtype"}  # as a config file's
    kept = resumed(in_the_file)
    assert kept.config.train.weight_decay == 0.1 and kept.config.train.dtype == "float32"
    assert max(group["weight_decay"] for group in kept.optimizer.param_groups) == 0.1
    assert kept.dtype == torch.float32


def test_a_run_resumed_with_another_batch_counts_the_tokens_it_saw(tiny_config):
    """Two steps of 4 rows of 32, then two of 8 rows: 768 tokens, not four steps of today's batch."""
    train(tiny_config("train.max_steps=2", "train.eval_interval=2", "train.checkpoint_interval=2"), quiet=True)
    config = tiny_config("train.max_steps=4", "train.batch_size=8", "train.eval_interval=2")
    summary = train(config, resume=True, quiet=True)
    seen = 2 * 4 * 32 + 2 * 8 * 32
    assert summary["tokens"] == seen and read_metrics(config.out_dir)[-1]["tokens"] == seen
    assert checkpoint.load(config.out_dir)["data_state"]["tokens_seen"] == seen


def test_settings_the_run_leaves_unused_are_named_not_taken_in_silence(tiny_config, capsys):
    """A cooldown without wsd, Muon's settings under AdamW, a position rate scale for positions without
    parameters: each does nothing, and the run's opening says so; the same settings where they act, and
    the shipped recipe, say nothing."""
    idle = tiny_config(
        "train.schedule=cosine",
        "train.cooldown=0.2",
        "train.optimizer=adamw",
        "train.muon_lr_scale=3",
        "train.position_lr_scale=10",
        "train.max_steps=1",
        "model.position={kind: rope}",
    )
    train(idle, quiet=False)
    notes = [line for line in capsys.readouterr().err.splitlines() if "does nothing" in line]
    assert len(notes) == 1
    for said in ("train.cooldown=0.2", "train.muon_lr_scale=3.0", "train.position_lr_scale=10"):
        assert said in notes[0]
    t5 = GPT(tiny_config("model.position={kind: t5, max_distance: 32}").model)
    acting = TrainConfig(schedule="wsd", cooldown=0.2, optimizer="muon", muon_lr_scale=3, position_lr_scale=10)
    assert idle_settings(acting, t5) == [] and idle_settings(TrainConfig(), t5) == []


def test_the_retrieval_rows_settings_without_retrieval_rows_are_named():
    model = GPT(ModelConfig(vocab_size=50, n_layer=1, n_head=2, d_model=16, block_size=16))
    idle = idle_settings(TrainConfig(retrieval_queries=5, retrieval_spread=True), model)
    assert idle == [
        "train.retrieval_queries=5 does nothing with train.retrieval_share=0 (it shapes its rows)",
        "train.retrieval_spread=True does nothing with train.retrieval_share=0 (it shapes its rows)",
    ]
    assert idle_settings(TrainConfig(retrieval_share=0.5, retrieval_queries=5, retrieval_spread=True), model) == []


def test_print_config_shows_the_sources_architecture_and_the_tokenizers_vocabulary(
    tiny_config, tiny_corpus, hf_tokenizer_dir, capsys
):
    """--print-config resolves as the run's start does: train.init_from's architecture and vocabulary,
    data.tokenizer's vocabulary; not the defaults."""
    source = os.path.dirname(train(tiny_config(*TINY, "train.max_steps=1", out="source"), quiet=True)["checkpoint"])
    corpus = f"data.corpus={tiny_corpus / 'corpus.txt'}"
    capsys.readouterr()
    assert train_cli([corpus, f"train.init_from={source}", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (printed["model"]["n_layer"], printed["model"]["d_model"], printed["model"]["vocab_size"]) == (1, 16, 400)
    assert train_cli([corpus, f"data.tokenizer={hf_tokenizer_dir}", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["vocab_size"] == printed["data"]["vocab_size"] == 300


def test_a_checkpoint_from_before_an_option_resumes_at_the_options_default(tiny_config):
    """A model option added after a checkpoint was written (here model.embedding_init_std) is
    missing from its config: resuming reads it at its default, the behaviour of the code then;
    changing the optimiser's groups on resume (train.position_lr_scale) is a one-line error."""
    t5 = "model.position={kind: t5, max_distance: 32}"  # a scheme with parameters of its own
    config = tiny_config("train.max_steps=2", t5)
    train(config, quiet=True)
    state = checkpoint.load(config.out_dir)
    del state["config"]["model"]["embedding_init_std"]
    checkpoint.save(state, config.out_dir)
    assert train(tiny_config("train.max_steps=3", t5), resume=True, quiet=True)["steps"] == 3
    with pytest.raises(ConfigError, match="model.embedding_init_std=0.05 but the checkpoint has 0.02"):
        train(tiny_config("train.max_steps=4", t5, "model.embedding_init_std=0.05"), resume=True, quiet=True)
    with pytest.raises(ConfigError, match=r"train.position_lr_scale=10.0 .* the checkpoint's optimiser state"):
        train(tiny_config("train.max_steps=4", t5, "train.position_lr_scale=10.0"), resume=True, quiet=True)


def test_a_fire_checkpoint_from_before_the_log_threshold_loads_and_fine_tunes(tiny_config):
    """FIRE's threshold was saved as a count of positions before it was learned as its log: such
    a checkpoint loads (evaluation, generation) and starts a fine-tuning with the same model."""
    config = tiny_config("train.max_steps=1", "model.position={kind: fire}")
    train(config, quiet=True)
    model = load_model(config.out_dir)[0]
    state = checkpoint.load(config.out_dir)
    state["model"]["positions.threshold"] = state["model"].pop("positions.log_threshold").exp()
    checkpoint.save(state, config.out_dir)
    idx = torch.randint(0, 100, (1, 32))
    with torch.no_grad():
        assert torch.allclose(load_model(config.out_dir)[0](idx), model(idx), atol=1e-5)
    tuned = tiny_config("train.max_steps=1", f"train.init_from={config.out_dir}", out="tuned")
    assert train(tuned, quiet=True)["steps"] == 1


def test_a_resume_names_a_schedule_the_checkpoint_predates():
    """A checkpoint written before train.schedule existed trained with the cosine: resuming it
    under wsd is a change of trajectory, and the note says so; the same settings give none."""
    old = {"config": {"train": {"max_steps": 2000, "lr": 2.5e-3}}}
    now = Config(train=TrainConfig(max_steps=2000, lr=2.5e-3, schedule="wsd"))
    assert trajectory_changes(now, old) == ["train.schedule='wsd' (was 'cosine')"]
    assert trajectory_changes(Config(train=TrainConfig(max_steps=2000, lr=2.5e-3)), old) == []


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tiny_config, monkeypatch):
    config = tiny_config()
    original = trainer.mixed_loss
    calls = []

    def nan_from_step_8(hidden, weight, softcap, targets, mask, *rest):
        calls.append(1)
        loss = original(hidden, weight, softcap, targets, mask, *rest)
        return loss * float("nan") if len(calls) >= 8 else loss

    monkeypatch.setattr(trainer, "mixed_loss", nan_from_step_8)
    with pytest.raises(TrainingError, match=r"loss is nan at step 8: stopping; the last good checkpoint"):
        train(config, quiet=True)
    state = checkpoint.load(config.out_dir)
    assert state["step"] == 6
    assert all(torch.isfinite(v).all() for v in state["model"].values())


def test_init_from_loads_weights_and_extends_context(tiny_config):
    source = train(tiny_config(out="source"), quiet=True)
    src = checkpoint.load(source["checkpoint"])
    # a near-zero learning rate: the new run's weights must still be the source's
    config = tiny_config(
        f"train.init_from={os.path.dirname(source['checkpoint'])}",
        "train.max_steps=1",
        "train.lr=1e-12",
        "train.min_lr=0",
        "train.warmup_steps=0",
        "model.block_size=64",
        "model.position={kind: rope, scaling: {type: linear, factor: 2}}",
        out="extended",
    )
    summary = train(config, quiet=True)
    state = checkpoint.load(summary["checkpoint"])
    assert state["step"] == 1
    assert state["config"]["model"]["position"]["scaling"]["original_max_positions"] == 32
    for key, value in src["model"].items():
        torch.testing.assert_close(state["model"][key], value, rtol=0, atol=1e-6)
    with pytest.raises(CheckpointError, match="model.d_model"):
        train(tiny_config(f"train.init_from={source['checkpoint']}", "model.d_model=48", out="bad"), quiet=True)
    with pytest.raises(CheckpointError, match="does not exist"):
        train(tiny_config("train.init_from=/nonexistent/ckpt.pt", out="bad"), quiet=True)


def test_init_from_fine_tunes_on_another_corpus_with_the_source_tokenizer(tiny_config, tmp_path):
    source = train(tiny_config(out="source"), quiet=True)
    src = checkpoint.load(source["checkpoint"])
    other = tmp_path / "other.txt"  # a fine-tuning corpus the source never saw, in other words
    other.write_text("".join(f"The pass key is {10000 + 7 * i}. Remember it.\n" for i in range(400)))
    summary = train(
        tiny_config(
            f"train.init_from={source['checkpoint']}",
            f"data.corpus={other}",
            "data.vocab_size=999",
            "train.max_steps=2",
            out="tuned",
        ),
        quiet=True,
    )
    state = checkpoint.load(summary["checkpoint"])
    assert state["tokenizer"] == src["tokenizer"]
    assert state["config"]["data"]["vocab_size"] == state["config"]["model"]["vocab_size"] == 400
    assert state["config"]["data"]["corpus"] == str(other)
    assert math.isfinite(summary["final_val_bpc"])


# --------------------------------------------------------------------------- command line


@pytest.mark.slow
def test_cli_end_to_end_then_sigterm_saves(tiny_corpus, tmp_path):
    out = tmp_path / "cli"
    result = cli(["train.py", *tiny_overrides(tiny_corpus, out)])
    assert result.returncode == 0, result.stderr
    assert "done: 12 steps" in result.stdout and "bits/char" in result.stdout and "--- sample" in result.stdout
    assert "done:" not in result.stderr and "model:" in result.stderr  # results on stdout, notes on stderr
    model, tokenizer, config, state = load_model(str(out))
    assert state["step"] == 12 and isinstance(model, GPT)

    # SIGTERM in the middle of a long run: a checkpoint is saved, exit status 143, no traceback
    out2 = tmp_path / "term"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    proc = subprocess.Popen(
        [
            sys.executable,
            "train.py",
            *tiny_overrides(tiny_corpus, out2, "train.max_steps=100000", "train.checkpoint_interval=100000"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and not (out2 / "metrics.jsonl").exists():
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr and "interrupted by SIGTERM" in stderr
    state = checkpoint.load(str(out2))
    assert 1 <= state["step"] < 100000 and "optimizer" in state


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_ddp_two_processes_match_one_process_with_grad_accum(tiny_corpus, tmp_path):
    """Two gloo processes (torchrun, grad_accum=2: one micro-step under no_sync) and one process
    (grad_accum=4) see the same global batches (one global draw per step, each rank / micro-step
    takes its rows), so their losses and weights agree up to float summation order."""
    single = cli(
        [
            "train.py",
            *tiny_overrides(
                tiny_corpus, tmp_path / "single", "train.grad_accum=4", "train.max_steps=6", "train.sample_tokens=0"
            ),
        ]
    )
    assert single.returncode == 0, single.stderr
    ddp = cli(
        [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "train.py",
            *tiny_overrides(
                tiny_corpus, tmp_path / "ddp", "train.grad_accum=2", "train.max_steps=6", "train.sample_tokens=0"
            ),
        ]
    )
    assert ddp.returncode == 0, ddp.stderr
    assert "2 processes" in ddp.stderr
    a, b = read_metrics(tmp_path / "single"), read_metrics(tmp_path / "ddp")
    assert [r["step"] for r in b] == list(range(1, 7))  # rank 0 alone writes the log
    assert [r["tokens"] for r in a] == [r["tokens"] for r in b]
    for x, y in zip(a, b):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-4)
    wa, wb = checkpoint.load(str(tmp_path / "single"))["model"], checkpoint.load(str(tmp_path / "ddp"))["model"]
    for key in wa:
        torch.testing.assert_close(wb[key], wa[key], rtol=1e-3, atol=1e-5)
