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
from minilm.config import ConfigError
from minilm.hf.reading import PREFIX as HF_PREFIX
from minilm.model.lora import adapted_rows, add_adapters, freeze_in


def start_adapters(raw: nn.Module, lora, source: Loaded, dtype, out_dir: str, state=None) -> dict:
    """Give ``raw`` (holding the source's weights) the run's adapters and freeze the rest, kept in
    the run's compute ``dtype`` (``model.lora.freeze_in``); with ``state`` (``--resume``) load what
    the run had trained. Returns the checkpoint's ``lora_base``: the base's absolute path, its path
    from ``out_dir`` (``beside``: found again when both are moved together) and its weights' hash."""
    path = source.state.get("path") or ""
    local = bool(path) and not str(path).startswith(HF_PREFIX)  # a file or directory here, not the hub's name
    base = {"path": os.path.abspath(path) if local else path, "sha256": weights_hash(source.state["model"])}
    if local:
        base["beside"] = os.path.relpath(os.path.abspath(path), os.path.abspath(out_dir))
    check_fits(raw, lora)
    add_adapters(raw, lora.targets, lora.r, lora.alpha, lora.also_train)
    freeze_in(raw, dtype)
    if state is None:
        return base
    recorded, settings = state.get("lora_base"), state["config"]["train"].get("lora", {})
    recorded = recorded if isinstance(recorded, dict) else {}  # damaged: no hash, refused below
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


def check_fits(raw: nn.Module, lora) -> None:
    """Refuse adapters that cannot do what the settings say on this model: a rank above the smallest
    adapted width (B A is then no lower rank than W), or ``head`` trained apart from a head that is
    the token embedding (tied: ``embeddings`` trains it)."""
    widths = [
        min(raw.get_submodule(name).in_features, stop - start)
        for name, rows in adapted_rows(raw, lora.targets).items()
        for start, stop in rows.values()
    ]
    if widths and lora.r > min(widths):
        raise ConfigError(
            f"train.lora.r={lora.r} is invalid for this model: its adapted linears {lora.targets} are "
            f"{min(widths)} wide at the least: expected a rank from 1 to {min(widths)} (low rank: well below it)"
        )
    if "head" in lora.also_train and raw.config.tie_embeddings:
        raise ConfigError(
            f"train.lora.also_train={lora.also_train} has head, but this model's head is its token embedding "
            f"(model.tie_embeddings): train it with embeddings"
        )


def trained_state(raw: nn.Module) -> dict:
    """The weights a LoRA run trains (what its checkpoint keeps), by parameter name."""
    return {name: param.detach() for name, param in raw.named_parameters() if param.requires_grad}


def count_parameters(raw: nn.Module) -> tuple:
    """(trainable, frozen) parameters of ``raw`` (a tied weight counted once)."""
    trainable = sum(p.numel() for p in raw.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in raw.parameters()) - trainable
