"""Start a run from a trained checkpoint (``train.init_from``), possibly with a longer
context and a new position setting: context extension.

Weights move into the new scheme wherever the shapes allow:

* rope -> rope with a scaling (linear / ntk / dynamic / yarn): RoPE has no parameters;
  ``scaling.original_max_positions`` is taken from the source's block_size when omitted,
  so NTK / YaRN use the ORIGINAL training length (DESIGN.md pitfall 3).
* any kind -> ``interpolated`` around the same kind: the wrapped scheme's parameters are
  the source's (e.g. ``positions.table.weight`` -> ``positions.inner.table.weight``).
* learned -> learned with a longer table: the old table is stretched over the new length
  by linear interpolation between rows (what position interpolation does for it).

Anything else that does not fit (another architecture, another kind) is a clear error,
never a partial load.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from minilm.checkpoint import CheckpointError, load
from minilm.config import Config

ARCHITECTURE = ("vocab_size", "n_layer", "n_head", "d_model", "d_ff", "bias")


def prepare_extension(config: Config, path: str):
    """Read the source checkpoint and complete ``config`` from it. Returns (config, source_state)."""
    source = load(path)
    src_model = source["config"]["model"]
    for name in ARCHITECTURE:
        ours = getattr(config.model, name)
        if name == "vocab_size":
            continue  # follows the tokenizer, which comes from the source as well
        if src_model.get(name) != ours:
            raise CheckpointError(f"train.init_from={path!r}: model.{name}={ours} but the source has "
                                  f"{src_model.get(name)}; an extended model keeps the source architecture")
    position = _complete_position(dict(config.model.position), src_model)
    model = dataclasses.replace(config.model, position=position, vocab_size=src_model["vocab_size"])
    return dataclasses.replace(config, model=model), source


def _complete_position(position: dict, src_model: dict) -> dict:
    scaling = position.get("scaling")
    if position.get("kind") == "rope" and isinstance(scaling, dict) and scaling.get("type", "none") != "none":
        if scaling.get("original_max_positions") is None:
            position["scaling"] = {**scaling, "original_max_positions": src_model["block_size"]}
    return position


def _stretch_rows(table: torch.Tensor, rows: int) -> torch.Tensor:
    """Linearly interpolate a (n, d) table to (rows, d), keeping the first and last rows."""
    return F.interpolate(table.t()[None].float(), size=rows, mode="linear", align_corners=True)[0].t() \
        .to(table.dtype).contiguous()


def load_source_weights(model: torch.nn.Module, source: dict) -> None:
    """Copy the source checkpoint's weights into ``model`` (see the module docstring)."""
    weights = dict(source["model"])
    target = model.state_dict()
    for key in list(weights):
        if key.startswith("positions.") and key not in target:
            wrapped = "positions.inner." + key[len("positions."):]
            if wrapped in target:
                weights[wrapped] = weights.pop(key)
    for key, value in list(weights.items()):
        if key in target and key.endswith("table.weight") and value.shape[0] != target[key].shape[0] \
                and value.shape[1:] == target[key].shape[1:]:
            weights[key] = _stretch_rows(value, target[key].shape[0])
    missing = sorted(set(target) - set(weights))
    unexpected = sorted(set(weights) - set(target))
    wrong = sorted(k for k in set(target) & set(weights) if target[k].shape != weights[k].shape)
    if missing or unexpected or wrong:
        problems = []
        if missing:
            problems.append(f"missing {missing[:3]}")
        if unexpected:
            problems.append(f"unexpected {unexpected[:3]}")
        if wrong:
            problems.append(f"shape mismatch {[(k, tuple(weights[k].shape), tuple(target[k].shape)) for k in wrong[:2]]}")
        kind = source["config"]["model"]["position"].get("kind")
        raise CheckpointError(f"weights of {source.get('path')!r} (position kind {kind!r}) do not fit the new model: "
                              + "; ".join(problems))
    model.load_state_dict(weights, strict=True)
