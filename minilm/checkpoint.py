"""Atomic checkpoint save and safe load.

A checkpoint is one ``torch.save`` file (``<out_dir>/ckpt.pt``) holding a dict:
``format``/``version`` (to recognise foreign files), ``model`` (state dict of the raw,
uncompiled module), ``config`` (the full run config as a plain dict), ``tokenizer``
(the sentencepiece model proto, bytes) and, for resuming, ``optimizer``, ``step``,
``rng`` and ``data_state``. Writes go to a temp file in the same directory, are fsynced,
then renamed over the old file, so a crash mid-save never harms the last good checkpoint.
Loads use ``torch.load(weights_only=True)``.
"""
from __future__ import annotations

import os
import tempfile
from typing import Optional

import torch

FORMAT = "minilm-checkpoint"
VERSION = 1
FILENAME = "ckpt.pt"


class CheckpointError(ValueError):
    """A missing, truncated or foreign checkpoint; the message is one line for the user."""


def resolve(path: str) -> str:
    """A checkpoint file, or an out_dir holding ``ckpt.pt``."""
    if os.path.isdir(path):
        candidate = os.path.join(path, FILENAME)
        if not os.path.isfile(candidate):
            raise CheckpointError(f"no checkpoint in directory {path!r}: expected {candidate}")
        return candidate
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist: give a checkpoint file or an out_dir with {FILENAME}")
    return path


def save(state: dict, path: str) -> str:
    """Write ``state`` atomically to ``path`` (a file, or a directory to hold ckpt.pt)."""
    if os.path.isdir(path) or not path.endswith(".pt"):
        path = os.path.join(path, FILENAME)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    state = {"format": FORMAT, "version": VERSION, **state}
    fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def load(path: str, map_location: Optional[str] = "cpu") -> dict:
    """Load and check a checkpoint file or out_dir; clear errors for anything unusable."""
    path = resolve(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged file fails in many ways (KeyError, struct.error, ...)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"cannot read checkpoint {path!r} (truncated or not a minilm checkpoint): "
                              f"{reason[:200]}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path!r} is not a minilm checkpoint (no '{FORMAT}' marker)")
    if state.get("version") != VERSION:
        raise CheckpointError(f"{path!r} has checkpoint version {state.get('version')!r}; this minilm reads {VERSION}")
    for key in ("model", "config", "tokenizer"):
        if key not in state:
            raise CheckpointError(f"{path!r} is incomplete: it lacks '{key}'")
    state["path"] = path
    return state


def load_model(path: str, *, device: str = "cpu", position: Optional[dict] = None,
               block_size: Optional[int] = None):
    """Rebuild the trained model from a checkpoint: returns (model, tokenizer, config, state).

    ``position`` replaces the model's position settings (e.g. a RoPE scaling applied at
    evaluation time, no fine-tuning); ``block_size`` replaces the model's context length.
    Parameters must still match exactly: a mismatch is an error, never a partial load.
    """

    from minilm.config import ConfigError, build_config
    from minilm.model import GPT
    from minilm.tokenizer import Tokenizer

    state = load(path)
    tree = state["config"]
    if position is not None or block_size is not None:
        tree = {**tree, "model": {**tree["model"]}}
        if position is not None:
            tree["model"]["position"] = position
        if block_size is not None:
            tree["model"]["block_size"] = block_size
    try:
        config = build_config(tree)
    except ConfigError as exc:
        raise CheckpointError(f"{state['path']}: {exc}") from None
    model = GPT(config.model)
    missing, unexpected = model.load_state_dict(state["model"], strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{state['path']}: weights do not fit position kind "
                              f"{config.model.position.get('kind')!r}: missing {sorted(missing)[:4]}, "
                              f"unexpected {sorted(unexpected)[:4]}")
    model.to(device).eval()
    tokenizer = Tokenizer.from_bytes(state["tokenizer"])
    return model, tokenizer, config, state
