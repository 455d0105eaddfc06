"""A LoRA run (``train.lora.r`` > 0; the adapters are ``minilm.model.lora``'s): the model it starts
from gets adapters and everything else is frozen but ``train.lora.also_train``; its checkpoint
holds only what it trains (the adapters, the also_train parameters and their optimiser state)
and the base it trained on: ``train.init_from``'s path and the sha256 of its weights
(``checkpoints.format.weights_hash``). A resumed run, and every command that loads the
checkpoint (``checkpoints.loading.lora_base``), refuses a base whose weights have changed.
"""

from __future__ import annotations

import dataclasses
import os

from torch import nn

from minilm.checkpoints.format import CheckpointError, weights_hash
from minilm.checkpoints.loading import Loaded
from minilm.hf.reading import is_hf_source
from minilm.model.lora import add_adapters, freeze_in


def start_adapters(raw: nn.Module, lora, source: Loaded, dtype, state=None) -> dict:
    """Give ``raw`` (holding the source's weights) the run's adapters and freeze the rest, kept in
    the run's compute ``dtype`` (``model.lora.freeze_in``); with ``state`` (``--resume``) load what
    the run had trained. Returns the checkpoint's ``lora_base``."""
    path = source.state.get("path") or ""
    base = {
        "path": path if is_hf_source(path) or not path else os.path.abspath(path),
        "sha256": weights_hash(source.state["model"]),
    }
    add_adapters(raw, lora.targets, lora.r, lora.alpha, lora.also_train)
    freeze_in(raw, dtype)
    if state is None:
        return base
    recorded, settings = state.get("lora_base") or {}, state["config"]["train"].get("lora", {})
    if recorded.get("sha256") != base["sha256"]:
        raise CheckpointError(
            f"cannot resume: train.init_from={path!r} is not the base this run's adapters were "
            f"trained on (its weights' sha256 differs from the checkpoint's): restore that base"
        )
    if settings != dataclasses.asdict(lora):
        raise CheckpointError(
            f"cannot resume: train.lora={dataclasses.asdict(lora)} but the checkpoint's adapters are "
            f"{settings}: resume with the same train.lora"
        )
    trained = {name for name, param in raw.named_parameters() if param.requires_grad}
    if set(state["model"]) != trained:
        raise CheckpointError(
            f"cannot resume: the checkpoint's weights are not this run's adapters and also_train "
            f"parameters (e.g. {sorted(set(state['model']) ^ trained)[:2]})"
        )
    raw.load_state_dict(state["model"], strict=False)
    return base


def trained_state(raw: nn.Module) -> dict:
    """The weights a LoRA run trains (what its checkpoint keeps), by parameter name."""
    return {name: param.detach() for name, param in raw.named_parameters() if param.requires_grad}


def count_parameters(raw: nn.Module) -> tuple:
    """(trainable, frozen) parameters of ``raw`` (a tied weight counted once)."""
    trainable = sum(p.numel() for p in raw.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in raw.parameters()) - trainable
