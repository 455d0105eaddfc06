"""Context extension: how a trained checkpoint's position settings and weights move into a
model with a longer training length (block_size) or a new position setting. The loader
(``minilm.checkpoints.loading.load_model``) applies this for evaluation-time scalings and for
``train.init_from``.

Weights move into the new scheme wherever the shapes allow:

* rope -> rope with a scaling (linear / ntk / dynamic / yarn): RoPE has no parameters;
  ``scaling.original_max_positions`` is taken from the source's block_size when omitted,
  so NTK / YaRN use the ORIGINAL training length (docs/design.md, "Glossary"); so does a
  layer type's own (``loading.complete_layer_positions``).
* randomized: ``max_positions`` when omitted is the range the source drew from (8 x its
  block_size), where that still holds the new block_size.
* any kind -> a wrapper (``interpolated``, ``randomized``) around the same kind, and back: the
  wrapped scheme's parameters are the source's at any depth of wrapping (e.g.
  ``positions.table.weight`` <-> ``positions.inner.table.weight``); what is compared is the
  kind inside the wrappers (``positions.unwrap_setting``).
  When ``inner`` is omitted it is the source's position setting; when ``factor`` is
  omitted it is new block_size / source block_size, except around a bounded table
  (learned) where it is (new block_size - 1) / (table rows - 1), so that the last new
  position lands exactly on the last trained row (position interpolation, Chen et al. 2023).
* learned -> learned with a longer table: the old table is stretched over the new length
  by linear interpolation between rows (what position interpolation does for it); with a
  shorter one (``model.block_size`` below the training length, at evaluation or generation),
  its first rows are kept as they are: the same model on the positions it keeps.

Anything else that does not fit (another architecture, another kind) is a clear error,
never a partial load.
"""

from __future__ import annotations

import copy
import json
from typing import Optional

import torch
import torch.nn.functional as F

from minilm.checkpoints.format import CheckpointError
from minilm.positions.randomized import DEFAULT_RANGE


def scaled_length(position: dict, source_model: dict) -> Optional[int]:
    """The training length a rope scaling asks of a source trained without one: its factor times
    its original length (``original_max_positions``, else the source's block_size); None for a
    setting without a factor, another kind, or a source that has a scaling of its own."""
    scaling, own = position.get("scaling") or {}, source_model["position"]
    if position.get("kind") != "rope" or not scaling.get("factor") or (own.get("scaling") or {}).get("factor"):
        return None
    return int(round(scaling["factor"] * (scaling.get("original_max_positions") or source_model["block_size"])))


def position_overrides(position: dict) -> list:
    """How a run's position setting applies to the source's: key by key over the source's own
    (its base, rotary fraction, table size stay unless set), as a whole for ``interpolated``.
    A kind other than the source's is refused by the loader. JSON is YAML: one value per override."""
    if position.get("kind") == "interpolated":
        return [f"model.position={json.dumps(position)}"]
    return [f"model.position.{key}={json.dumps(value)}" for key, value in position.items()]


def _table_rows(position: dict, block_size: int):
    """Rows of a learned table for this setting (None for unbounded kinds)."""
    if position.get("kind") == "learned":
        return position.get("max_positions") or block_size
    return None


def complete_position(position: dict, src_model: dict, block_size: int) -> dict:
    """Fill what the source determines (see the module docstring); returns a new dict.
    ``position`` is in canonical form (``positions.canonical``)."""
    position = copy.deepcopy(position)
    src_position, src_block = src_model["position"], src_model["block_size"]
    scaling = position.get("scaling")
    if position.get("kind") == "rope" and isinstance(scaling, dict) and scaling.get("type", "none") != "none":
        if scaling.get("original_max_positions") is None:
            scaling["original_max_positions"] = src_block
    if position.get("kind") == "randomized" and position.get("max_positions") is None:
        trained_range = DEFAULT_RANGE * src_block  # the range it drew its positions from in training
        if trained_range >= block_size:
            position["max_positions"] = trained_range
    if position.get("kind") == "interpolated":
        if "inner" not in position:
            position["inner"] = copy.deepcopy(src_position)
        inner = position["inner"]
        rows = _table_rows(src_position, src_block)
        if inner.get("kind") == "learned" and rows is not None and inner.get("max_positions") is None:
            inner = {**inner, "max_positions": rows}  # the wrapped table keeps the source's rows
        position["inner"] = inner
        if "factor" not in position:
            rows = _table_rows(inner, src_block)
            position["factor"] = (block_size - 1) / (rows - 1) if rows and rows > 1 else block_size / src_block
    return position


def _stretch_rows(table: torch.Tensor, rows: int) -> torch.Tensor:
    """Linearly interpolate a (n, d) table to (rows, d), keeping the first and last rows."""
    return (
        F.interpolate(table.t()[None].float(), size=rows, mode="linear", align_corners=True)[0]
        .t()
        .to(table.dtype)
        .contiguous()
    )


def _unwrapped_key(key: str) -> str:
    """A position weight's name with every wrapper level taken off: positions.inner.table.weight
    -> positions.table.weight."""
    rest = key[len("positions.") :]
    while rest.startswith("inner."):
        rest = rest[len("inner.") :]
    return "positions." + rest


def load_source_weights(model: torch.nn.Module, source: dict) -> None:
    """Copy the source checkpoint's weights into ``model`` (see the module docstring)."""
    weights = dict(source["model"])
    target = model.state_dict()
    wrapped = {_unwrapped_key(key): key for key in target if key.startswith("positions.")}
    for key in list(weights):
        if key.startswith("positions.") and key not in target and _unwrapped_key(key) in wrapped:
            weights[wrapped[_unwrapped_key(key)]] = weights.pop(key)
    for key, value in list(weights.items()):
        if (
            key in target
            and key.endswith("table.weight")
            and value.shape[0] != target[key].shape[0]
            and value.shape[1:] == target[key].shape[1:]
        ):
            rows = target[key].shape[0]
            weights[key] = _stretch_rows(value, rows) if rows > value.shape[0] else value[:rows].clone()
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
        raise CheckpointError(
            f"weights of {source.get('path')!r} (position kind {kind!r}) do not fit the new model: "
            + "; ".join(problems)
        )
    model.load_state_dict(weights, strict=True)
