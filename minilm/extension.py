"""Start a run from a trained checkpoint (``train.init_from``), possibly with a longer
context and a new position setting: context extension.

Weights move into the new scheme wherever the shapes allow:

* rope -> rope with a scaling (linear / ntk / dynamic / yarn): RoPE has no parameters;
  ``scaling.original_max_positions`` is taken from the source's block_size when omitted,
  so NTK / YaRN use the ORIGINAL training length (DESIGN.md pitfall 3).
* any kind -> ``interpolated`` around the same kind: the wrapped scheme's parameters are
  the source's (e.g. ``positions.table.weight`` -> ``positions.inner.table.weight``).
  When ``base`` is omitted it is the source's position setting; when ``factor`` is
  omitted it is new block_size / source block_size, except around a bounded table
  (learned) where it is (new block_size - 1) / (table rows - 1), so that the last new
  position lands exactly on the last trained row (position interpolation, Chen et al. 2023).
* learned -> learned with a longer table: the old table is stretched over the new length
  by linear interpolation between rows (what position interpolation does for it).

Anything else that does not fit (another architecture, another kind) is a clear error,
never a partial load.
"""
from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn.functional as F

from minilm.checkpoint import CheckpointError, load
from minilm.config import Config, ConfigError

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
    position = complete_position(config.model.position, src_model, config.model.block_size)
    src_kind, new_kind = base_kind(src_model["position"]), base_kind(position)
    if src_kind != new_kind:
        raise CheckpointError(f"train.init_from={path!r}: model.position uses kind {new_kind!r} but the source "
                              f"was trained with {src_kind!r}; extend with the same kind (a scaling of it, or "
                              f"interpolated around it)")
    model = dataclasses.replace(config.model, position=position, vocab_size=src_model["vocab_size"])
    from minilm.positions import build
    try:
        limit = build(position, d_model=model.d_model, n_head=model.n_head, block_size=model.block_size) \
            .position_limit()
    except ValueError as exc:
        raise ConfigError(f"model.position (completed from {path!r}): {exc}") from None
    if limit is not None and limit < model.block_size - 1e-6:
        raise ConfigError(f"model.position={position} covers positions 0..{limit - 1:g} but model.block_size="
                          f"{model.block_size} needs 0..{model.block_size - 1}: leave out the factor of "
                          f"interpolated to have it computed, or give the learned table more rows")
    return dataclasses.replace(config, model=model), source


def base_kind(position: dict) -> str:
    """The kind that carries the weights: the wrapped kind of ``interpolated``, else the kind."""
    if position.get("kind") == "interpolated":
        inner = position.get("base", {"kind": "rope"})
        return base_kind(inner if isinstance(inner, dict) else {"kind": inner})
    return position.get("kind")


def _table_rows(position: dict, block_size: int):
    """Rows of a learned table for this setting (None for unbounded kinds)."""
    if position.get("kind") == "learned":
        return position.get("max_positions") or block_size
    return None


def complete_position(position: dict, src_model: dict, block_size: int) -> dict:
    """Fill what the source determines (see the module docstring); returns a new dict."""
    position = copy.deepcopy(position)
    src_position, src_block = src_model["position"], src_model["block_size"]
    scaling = position.get("scaling")
    if position.get("kind") == "rope" and isinstance(scaling, dict) and scaling.get("type", "none") != "none":
        if scaling.get("original_max_positions") is None:
            scaling["original_max_positions"] = src_block
    if position.get("kind") == "interpolated":
        if "base" not in position:
            position["base"] = copy.deepcopy(src_position)
        inner = position["base"] if isinstance(position["base"], dict) else {"kind": position["base"]}
        rows = _table_rows(src_position, src_block)
        if inner.get("kind") == "learned" and rows is not None and inner.get("max_positions") is None:
            inner = {**inner, "max_positions": rows}  # the wrapped table keeps the source's rows
        position["base"] = inner
        if "factor" not in position:
            rows = _table_rows(inner, src_block)
            position["factor"] = (block_size - 1) / (rows - 1) if rows and rows > 1 else block_size / src_block
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
            shapes = [(k, tuple(weights[k].shape), tuple(target[k].shape)) for k in wrong[:2]]
            problems.append(f"shape mismatch {shapes}")
        kind = source["config"]["model"]["position"].get("kind")
        raise CheckpointError(f"weights of {source.get('path')!r} (position kind {kind!r}) do not fit the new model: "
                              + "; ".join(problems))
    model.load_state_dict(weights, strict=True)
