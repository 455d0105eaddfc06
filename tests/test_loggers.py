"""train.loggers (minilm.training.loggers): every logger writes the same scalars and they read
back (metrics.jsonl, metrics.csv, tensorboard's own reader, a wandb offline run), a resumed run
cuts them back to its checkpoint, and a missing package or a bad name is one line."""

import csv
import importlib.util
import json
import os

import pytest
import torch

from minilm.checkpoints import format as checkpoint
from minilm.config import ConfigError
from minilm.training import loggers
from minilm.training.loggers import CSV_FIELDS, _truncate_csv
from minilm.training.loop import train
from minilm.training.resume import truncate_metrics


def jsonl_scalars(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return {(r["event"], r["step"], name): value for r in records for name, value in loggers.scalars(r).items()}


def csv_scalars(out_dir):
    with open(os.path.join(out_dir, "metrics.csv"), newline="") as f:
        return {(row["event"], int(row["step"]), row["name"]): float(row["value"]) for row in csv.DictReader(f)}


def test_jsonl_and_csv_hold_the_same_scalars_and_a_resume_cuts_both_back(tiny_config):
    config = tiny_config(
        "train.loggers=[jsonl, csv]",
        "train.max_steps=6",
        "train.checkpoint_interval=3",
        "train.eval_interval=3",
        "train.sample_tokens=0",
    )
    train(config, quiet=True)
    first = jsonl_scalars(config.out_dir)
    assert first == pytest.approx(csv_scalars(config.out_dir))
    names = {name for (event, _, name) in first if event == "train"}
    assert names == {"loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s", "memory_mib"}
    assert {name for (event, _, name) in first if event == "eval"} == {"val_loss", "val_ppl", "val_bpc"}
    ckpt = checkpoint.load(config.out_dir)  # as if the run had stopped after step 3's checkpoint:
    ckpt["step"] = 3  # the logs past it are from the lost part, cut on resume and written again
    torch.save({k: v for k, v in ckpt.items() if k != "path"}, os.path.join(config.out_dir, "ckpt.pt"))
    train(config, resume=True, quiet=True)
    again = csv_scalars(config.out_dir)
    assert again == pytest.approx(jsonl_scalars(config.out_dir))
    assert sorted(step for (event, step, name) in again if event == "train" and name == "loss") == list(range(1, 7))


def test_a_resume_cuts_only_the_lost_steps_and_a_torn_last_line(tmp_path):
    """Cutting the logs back to the checkpoint's step drops the lines past it and a torn last line (a write
    the stop cut short); a line of the user's, or one whose step cannot be read, is kept, not lost."""
    jsonl = tmp_path / "metrics.jsonl"
    jsonl.write_text('{"step": 1, "loss": 2.0}\nmy note\n[1]\n{"step": 5, "loss": 1.0}\n{"step": 2, "lo')
    truncate_metrics(str(jsonl), 3)
    assert jsonl.read_text() == '{"step": 1, "loss": 2.0}\nmy note\n[1]\n'
    table = tmp_path / "metrics.csv"
    header = ",".join(CSV_FIELDS)
    table.write_text(f"{header}\ntrain,1,64,loss,2.0\ntrain,5,320,loss,1.0\nmy,note\ntrain,2,128,loss,1.5\ntrain,1")
    _truncate_csv(str(table), 3)  # the last row torn inside its step (from train,150,...)
    assert table.read_text() == f"{header}\ntrain,1,64,loss,2.0\nmy,note\ntrain,2,128,loss,1.5\n"


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="the tensorboard extra is not installed")
def test_tensorboard_event_files_read_back_with_tensorboards_reader(tiny_config):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = tiny_config("train.loggers=[jsonl, tensorboard]", "train.max_steps=4", "train.sample_tokens=0")
    train(config, quiet=True)
    events = EventAccumulator(os.path.join(config.out_dir, "tensorboard"))
    events.Reload()
    expected = jsonl_scalars(config.out_dir)
    for tag in ("train/loss", "train/lr", "train/grad_norm", "train/memory_mib", "final/val_bpc"):
        event, name = tag.split("/")
        read = {e.step: e.value for e in events.Scalars(tag)}
        assert read == pytest.approx(
            {s: v for (ev, s, n), v in expected.items() if ev == event and n == name}, rel=1e-6
        )
    assert "config/text_summary" in events.Tags()["tensors"]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="the wandb extra is not installed")
def test_wandb_offline_keeps_the_run_on_disk(tiny_config, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = tiny_config("train.loggers=[wandb]", "train.max_steps=3", "train.sample_tokens=0")
    train(config, quiet=True)
    runs = [d for d in os.listdir(os.path.join(config.out_dir, "wandb")) if d.startswith("offline-run-")]
    assert len(runs) == 1
    files = os.listdir(os.path.join(config.out_dir, "wandb", runs[0]))
    assert any(name.endswith(".wandb") for name in files)
    assert not os.path.exists(os.path.join(config.out_dir, "metrics.jsonl"))  # only the loggers asked for


def test_a_missing_package_or_a_bad_name_is_one_line(tiny_config, monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    config = tiny_config("train.loggers=[jsonl, wandb]", out="missing")
    with pytest.raises(
        loggers.LoggerError,
        match=r"train.loggers has wandb, which needs the wandb package: "
        r"pip install 'minilm\[wandb\]'",
    ):
        train(config, quiet=True)
    assert not os.path.exists(config.out_dir)  # said before anything was done
    for bad in ("[jsonl, jsonl]", "[mlflow]"):
        with pytest.raises(
            ConfigError,
            match="train.loggers=.* is invalid: expected a list of distinct names among jsonl, csv, tensorboard, wandb",
        ):
            tiny_config(f"train.loggers={bad}")
    with pytest.raises(ConfigError, match="train.loggers='jsonl' has the wrong type: expected list"):
        tiny_config("train.loggers=jsonl")
