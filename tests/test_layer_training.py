"""Positions per layer through training: a hybrid design (learned sinks, a window, a layer type with T5
buckets of its own) checkpoints, loads and resumes exactly, splits its parameters into the optimiser's
and LoRA's groups as a uniform model does, and trains under FSDP2 on two processes as on one."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from minilm.checkpoints import format as checkpoint
from minilm.checkpoints.loading import load_model
from minilm.config import ModelConfig, TrainConfig
from minilm.model.gpt import GPT
from minilm.model.lora import trainable_names
from minilm.training import loop as trainer
from minilm.training.loop import train
from minilm.training.optim import lr_at, make_optimizer
from minilm.training.parallel import FSDP2_ON_CPU
from tests.conftest import REPO, tiny_overrides

HYBRID = (
    "model.layers={pattern: [local, global], local: {window: 8, sinks: learned}, "
    "global: {position: {kind: t5, num_buckets: 8, max_distance: 32}, softcap: 30}}",
)


def read_metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["event"] == "train"]


def test_a_hybrid_resumes_exactly_and_loads_its_layers(tiny_config, monkeypatch):
    full = train(tiny_config(*HYBRID, out="full"), quiet=True)
    reference = [r["loss"] for r in read_metrics(os.path.dirname(full["checkpoint"]))]
    config = tiny_config(*HYBRID, out="cut")

    def lr_then_interrupt(step, t):  # a real SIGINT during step 5
        if step == 4:
            os.kill(os.getpid(), signal.SIGINT)
        return lr_at(step, t)

    monkeypatch.setattr(trainer, "lr_at", lr_then_interrupt)
    assert train(config, quiet=True)["steps"] == 5
    monkeypatch.setattr(trainer, "lr_at", lr_at)
    train(config, resume=True, quiet=True)
    assert [r["loss"] for r in read_metrics(config.out_dir)] == reference
    loaded = load_model(config.out_dir).model
    saved = checkpoint.load(config.out_dir)["model"]
    assert any(k.endswith("attn.sink_logits") for k in saved) and any(k.startswith("layer_positions.") for k in saved)
    assert [t.name for t in loaded.layer_types] == ["local", "global"]
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in saved.items())


def test_layer_schemes_join_the_position_groups():
    """The optimiser's position group (``train.position_lr_scale``) and LoRA's ``also_train: [position]``
    take every scheme's parameters, a layer type's own among them; learned sinks are attention weights."""
    model = GPT(
        ModelConfig(
            vocab_size=64,
            n_layer=2,
            n_head=2,
            d_model=16,
            block_size=16,
            position={"kind": "t5"},
            layers={"pattern": ["a", "b"], "a": {"sinks": "learned"}, "b": {"position": {"kind": "kerple"}}},
        )
    )
    position_names = {n for n, _ in model.named_parameters() if n.startswith(("positions.", "layer_positions."))}
    assert any(n.startswith("layer_positions.b.") for n in position_names)
    assert trainable_names(model, ["position"]) == position_names
    optimizer = make_optimizer(model, TrainConfig(position_lr_scale=10.0), torch.device("cpu"))
    (group,) = [g for g in optimizer.param_groups if g.get("lr_scale") == 10.0]
    ids = {id(p) for p in group["params"]}
    assert ids == {id(p) for n, p in model.named_parameters() if n in position_names}
    assert group["weight_decay"] == 0.0


@pytest.mark.slow
@pytest.mark.skipif(not FSDP2_ON_CPU, reason=f"FSDP2 on the CPU needs torch >= 2.9, not {torch.__version__}")
def test_a_hybrid_trains_under_fsdp_as_on_one_process(tiny_corpus, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    common = ("train.lr=3e-3", "train.min_lr=3e-3", "train.max_steps=6", "train.sample_tokens=0", *HYBRID)
    runs = {}
    for processes in (1, 2):
        out = tmp_path / f"p{processes}"
        extra = (f"train.grad_accum={2 // processes}", *(["train.parallel=fsdp"] if processes == 2 else []))
        launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"] if processes == 2 else []
        proc = subprocess.run(
            [sys.executable, *launcher, "train.py", *tiny_overrides(tiny_corpus, out, *common, *extra)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[processes] = [r["loss"] for r in read_metrics(out)]
    assert runs[2] == pytest.approx(runs[1], rel=1e-5, abs=1e-5)
