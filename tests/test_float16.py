"""train.dtype: float16 with a gradient scaler (for GPUs without bf16; CPU autocast takes float16
too, which is what these tests run): a step whose scaled gradients overflow is skipped, counted
and halves the scale; a run trains, logs its skipped steps and loss scale, and resumes with them."""

import json
import math

import pytest
import torch

from minilm.training.loop import setup, train, train_step
from minilm.training.resume import StopFlag


def test_an_overflowing_step_is_skipped_counted_and_halves_the_scale(tiny_config):
    run = setup(tiny_config("train.dtype=float16", "train.max_steps=4"), quiet=True)
    assert run.scaler is not None and run.dtype == torch.float16
    before = {name: p.detach().clone() for name, p in run.raw.named_parameters()}
    run.scaler = torch.amp.GradScaler("cpu", init_scale=3.0e38)  # any gradient of the scaled loss overflows
    loss, grad_norm, _, _ = train_step(run, StopFlag())
    assert math.isfinite(loss) and grad_norm is None and run.skipped_steps == 1 and run.step == 1
    assert run.scaler.get_scale() == pytest.approx(1.5e38)
    assert all(torch.equal(p, before[name]) for name, p in run.raw.named_parameters())  # nothing stepped
    run.scaler.update(new_scale=1024.0)
    loss, grad_norm, _, _ = train_step(run, StopFlag())
    assert run.skipped_steps == 1 and grad_norm is not None and math.isfinite(float(grad_norm))
    assert any(not torch.equal(p, before[name]) for name, p in run.raw.named_parameters())


def test_a_float16_run_trains_logs_its_scale_and_resumes_with_it(tiny_config):
    config = tiny_config(
        "train.dtype=float16", "train.max_steps=6", "train.log_interval=1", "train.checkpoint_interval=3"
    )
    summary = train(config, quiet=True)
    assert math.isfinite(summary["final_val_loss"])
    lines = [json.loads(line) for line in open(f"{config.out_dir}/metrics.jsonl")]
    steps = [line for line in lines if line.get("event") == "train"]
    assert len(steps) == 6 and all(s["loss_scale"] > 0 for s in steps)
    # a skipped step logs no gradient norm; the count is the number of such steps
    assert summary["skipped_steps"] == steps[-1]["skipped_steps"] == sum(s["grad_norm"] is None for s in steps)
    state = torch.load(f"{config.out_dir}/ckpt.pt", weights_only=False)
    assert state["scaler"]["scale"] == steps[-1]["loss_scale"] and state["skipped_steps"] == summary["skipped_steps"]
    longer = tiny_config("train.dtype=float16", "train.max_steps=8", "train.log_interval=1")
    resumed = setup(longer, resume=True, quiet=True)
    assert resumed.step == 6 and resumed.scaler.get_scale() == state["scaler"]["scale"]
    assert resumed.skipped_steps == state["skipped_steps"]


def test_float32_and_bfloat16_runs_have_no_scaler(tiny_config):
    assert setup(tiny_config("train.dtype=float32", "train.max_steps=2"), quiet=True).scaler is None
    assert setup(tiny_config("train.dtype=bfloat16", "train.max_steps=2", out="bf16"), quiet=True).scaler is None
