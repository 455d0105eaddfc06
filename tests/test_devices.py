"""GPU readiness on a machine without one: every position scheme's forward passes (training with
its loss, evaluation, documents masked, a KV cache filled and stepped) and a LoRA-adapted model
run with the model and the tokens on the meta device, where a tensor created on the CPU by
mistake (a table, a mask, positions) is an error, as it would be on a GPU. Paths that read
values on the host (sliding windows, rolling caches, left-padded rows, sampling) cannot run on
the meta device; bench/gpu_check.sh runs them on a GPU."""

import pytest
import torch

from minilm import GPT, ModelConfig
from minilm.model.lora import add_adapters
from minilm.positions.base import available
from minilm.training.mixture import mixed_loss

SETTINGS = {"interpolated": {"kind": "interpolated", "inner": {"kind": "learned"}, "factor": 2}}


def on_meta(kind: str, **options) -> GPT:
    config = ModelConfig(
        vocab_size=64,
        n_layer=2,
        n_head=2,
        d_model=32,
        block_size=16,
        position=SETTINGS.get(kind, {"kind": kind}),
        **options,
    )
    with torch.device("meta"):
        return GPT(config)


def passes(model: GPT, idx: torch.Tensor) -> None:
    model.train()
    loss = model(idx, head=lambda hidden, weight, cap: mixed_loss(hidden, weight, cap, idx, None))
    assert loss.device.type == "meta" and loss.dim() == 0
    model(idx, end_of_text=3, restart_positions=True)
    model.eval()
    assert model(idx).shape == (2, 8, 64)
    cache = model.new_cache(2, 16)
    model(idx[:, :5], cache)
    assert model(idx[:, 5:6], cache).device.type == "meta"


@pytest.mark.parametrize("kind", available())
def test_every_scheme_runs_on_the_models_device(kind):
    passes(on_meta(kind), torch.zeros(2, 8, dtype=torch.long, device="meta"))


def test_a_lora_model_runs_on_its_device():
    model = on_meta("rope", norm="rmsnorm", mlp="swiglu", n_kv_head=1, tie_embeddings=False)
    add_adapters(model, ["q", "v", "mlp"], 4, 8.0, ["norms"])
    assert all(p.device.type == "meta" for p in model.parameters())
    passes(model, torch.zeros(2, 8, dtype=torch.long, device="meta"))
