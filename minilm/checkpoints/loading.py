"""The one way to rebuild a model from a checkpoint: ``load_model(path, overrides)``.

generate.py, evaluate.py, passkey, the position plots and ``train.init_from`` all load
through here. ``overrides`` are ``key=value`` settings applied to the checkpoint's config
before the model is built; only what can change after training may change:

* ``model.position...``: a RoPE scaling (``original_max_positions`` defaults to the
  checkpoint's training length), or ``interpolated`` around the trained kind (its table or
  bias buckets included). The kind itself cannot change.
* ``model.block_size``: a new training length (a learned table is stretched to it).
* ``model.dropout`` and ``data...``.

The run's prepared data is found from anywhere: a relative ``data.dir`` (or ``data.corpus`` path)
that the checkpoint keeps and the current directory lacks is taken from the directory the run was
started in (``locate_data``), so an evaluation elsewhere reads what the run prepared rather than
tokenizing the corpus again into ``./data``.

How the weights move is ``minilm.checkpoints.extension``. Checkpoints written before ``interpolated``'s
option ``base`` was renamed ``inner`` load through ``positions.canonical``. A mismatch is
an error, never a partial load.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

import torch

from minilm.checkpoints.extension import complete_position, load_source_weights
from minilm.checkpoints.format import CheckpointError, load, weights_hash, with_defaults
from minilm.common import shown
from minilm.config import AFTER_TRAINING, Config, ConfigError, ModelConfig, build_config, fields_with
from minilm.configfile import apply_overrides
from minilm.data.corpus import holds_prepared
from minilm.data.hf_tokenizer import AnyTokenizer, tokenizer_from_bytes
from minilm.data.shakespeare import SHAKESPEARE
from minilm.hf.reading import is_hf_source, read_hf
from minilm.model.gpt import GPT
from minilm.model.lora import add_adapters, merge_adapters
from minilm.positions import canonical, unwrap_setting

CHANGEABLE = tuple(f"model.{name}" for name in fields_with(ModelConfig, AFTER_TRAINING)) + ("data.",)


class Loaded(NamedTuple):
    """What ``load_model`` rebuilds: the model, its tokenizer, the run's resolved config and the checkpoint as read."""

    model: GPT
    tokenizer: AnyTokenizer  # minilm.data.tokenizer.Tokenizer or minilm.data.hf_tokenizer.HFTokenizer
    config: Config
    state: dict  # the checkpoint as read (``state["path"]`` is the file)


def read_checkpoint(path: str) -> dict:
    """The checkpoint dict at ``path``: a minilm file or out_dir, or a Hugging Face model
    directory or ``hf:NAME`` read through ``minilm.hf.reading``."""
    return read_hf(path) if is_hf_source(path) else load(path)


def load_model(
    path: str, overrides: Sequence[str] = (), *, device="cpu", dtype: Optional[torch.dtype] = None
) -> Loaded:
    """(model, tokenizer, config, state) of the checkpoint at ``path`` (a file, an out_dir, a
    Hugging Face model directory or ``hf:NAME``: ``minilm.hf.reading``), with ``overrides`` applied; the model is
    in eval mode on ``device`` (in ``dtype`` when
    given). A LoRA run's checkpoint (``lora_base``) loads its base, checked by hash, and merges its
    adapters (``minilm.model.lora``). Raises CheckpointError or ConfigError with one-line messages."""
    return model_of(read_checkpoint(path), overrides, device=device, dtype=dtype)


def complete_layer_positions(model_tree: dict, trained: dict) -> None:
    """``complete_position`` for each ``model.layers`` type with a position of its own, from that type's
    trained position: a scaling's original length and randomized's range stay the trained model's
    when ``model.block_size`` changes, as ``model.position``'s do."""
    layers, before = model_tree.get("layers"), trained.get("layers") or {}
    if not isinstance(layers, dict):
        return
    for name, setting in layers.items():
        if name != "pattern" and isinstance(setting, dict) and isinstance(setting.get("position"), dict):
            source = (before.get(name) or {}).get("position") or trained["position"]
            setting["position"] = complete_position(
                canonical(setting["position"]), {**trained, "position": source}, model_tree["block_size"]
            )


def model_of(
    state: dict, overrides: Sequence[str] = (), *, device="cpu", dtype: Optional[torch.dtype] = None
) -> Loaded:
    """``load_model`` of a checkpoint already read (``read_checkpoint``)."""
    state["config"]["model"]["position"] = canonical(state["config"]["model"]["position"])
    state["config"] = with_defaults(state["config"])  # options newer than the checkpoint, as the code then was
    trained = state["config"]["model"]
    tree = apply_overrides(
        copy.deepcopy(state["config"]),
        overrides,
        allowed=CHANGEABLE,
        what="at evaluation time, in generation or for fine-tuning (after training)",
    )
    tree["data"] = locate_data(tree["data"], state)
    model_tree = tree["model"]
    model_tree["position"] = complete_position(canonical(model_tree["position"]), trained, model_tree["block_size"])
    complete_layer_positions(model_tree, trained)
    try:
        config = build_config(tree)
    except ConfigError as exc:
        raise ConfigError(f"{state['path']}: {exc}") from None
    was, asked = unwrap_setting(trained["position"])["kind"], unwrap_setting(config.model.position)["kind"]
    if was != asked:
        raise CheckpointError(
            f"{state['path']} was trained with {was!r} positions, not {asked!r}: a loaded model "
            f"can scale its positions or interpolate them (interpolated around {was}), not "
            f"change their kind"
        )
    model = GPT(config.model)
    if "lora_base" in state:
        base = lora_base(state)
        load_source_weights(model, {**base.state, "model": base.model.state_dict()})
        merge_trained_adapters(model, config.train.lora, state)
    else:
        load_source_weights(model, state)
    model.to(device=device, dtype=dtype).eval()
    return Loaded(model, tokenizer_from_bytes(state["tokenizer"]), config, state)


def run_directories(state: dict) -> list:
    """Where the run that wrote ``state`` may have been started (its relative paths' base): the
    directory it recorded (``run_dir``), and the one its relative out_dir places the checkpoint in
    (``<base>/out/rope/ckpt.pt`` or ``.../snapshots/step-N.pt`` -> ``<base>``), which still holds after the
    whole tree was moved. Existing directories only; none for a Hugging Face model."""
    found = [state["run_dir"]] if isinstance(state.get("run_dir"), str) else []
    out_dir, path = state["config"].get("out_dir"), state.get("path")
    if isinstance(out_dir, str) and out_dir and not os.path.isabs(out_dir) and path and os.path.isfile(path):
        out = Path(os.path.normpath(out_dir)).parts
        here = Path(os.path.abspath(path)).parent
        for place in (here, here.parent):  # the out_dir itself, or its snapshots/
            if ".." not in out and place.parts[-len(out) :] == out:
                found.append(str(Path(*place.parts[: -len(out)])))
    return [d for d in dict.fromkeys(found) if os.path.isdir(d)]


def locate_data(data: dict, state: dict) -> dict:
    """``data`` (the data section, overrides applied) with the relative ``corpus`` path and ``dir``
    that the checkpoint keeps (not overridden) and the current directory lacks made absolute
    under the directory the run was started in (``run_directories``): the corpus file where it is,
    the data dir where it holds a prepared copy of the corpus (``holds_prepared``), else beside the
    corpus found there (a moved tree: the corpus's new path is prepared again, in the run's tree)."""
    trained, data = state["config"].get("data", {}), dict(data)
    bases, found = run_directories(state), []

    def kept(key: str) -> bool:
        value = data.get(key)
        return isinstance(value, str) and value == trained.get(key) and bool(value) and not os.path.isabs(value)

    if kept("corpus") and data["corpus"] != SHAKESPEARE and not os.path.exists(data["corpus"]):
        found = [base for base in bases if os.path.exists(os.path.join(base, data["corpus"]))][:1]
        data["corpus"] = os.path.abspath(os.path.join(found[0], data["corpus"])) if found else data["corpus"]
    if kept("dir") and not holds_prepared(data["dir"], data["corpus"]):
        there = [os.path.abspath(os.path.join(base, data["dir"])) for base in bases]
        there = [p for p in there if holds_prepared(p, data["corpus"])]
        data["dir"] = (there + [os.path.abspath(os.path.join(base, data["dir"])) for base in found] + [data["dir"]])[0]
    return data


def lora_base(state: dict) -> Loaded:
    """The base a LoRA run trained on (``state["lora_base"]``: its absolute path, its path relative
    to the run's directory (``beside``) and ``weights_hash``), as loaded: found where it was, or
    where it lies beside the run when the two were moved together; a base that is gone or whose
    weights changed since is an error, and so is a ``lora_base`` that is not such a record."""
    recorded = state["lora_base"]
    if not (
        isinstance(recorded, dict)
        and all(isinstance(recorded.get(k), str) and recorded[k] for k in ("path", "sha256"))
        and isinstance(recorded.get("beside", ""), str)
    ):
        raise CheckpointError(
            f"{state['path']}: its lora_base={shown(recorded)} is not the record of a base (a path and the "
            f"sha256 of its weights): the checkpoint is damaged; train the adapters again"
        )
    places = [recorded["path"]]
    if recorded.get("beside") and isinstance(state.get("path"), str) and os.path.isfile(state["path"]):
        here = Path(os.path.abspath(state["path"])).parent  # the run's directory, or its snapshots/
        places += [os.path.normpath(os.path.join(d, recorded["beside"])) for d in (here, here.parent)]
    found = [p for p in dict.fromkeys(places) if p == recorded["path"] or os.path.exists(p)]
    for place in found:
        try:
            base = read_checkpoint(place)
        except CheckpointError as exc:
            if place == found[-1]:
                raise CheckpointError(
                    f"{state['path']}: the LoRA base {recorded['path']!r} cannot be read ({exc}); the "
                    f"adapters need the base they were trained on"
                ) from None
            continue
        if weights_hash(base["model"]) == recorded["sha256"]:
            return model_of(base)
    raise CheckpointError(
        f"{state['path']}: the LoRA base {recorded['path']!r} has changed since the adapters "
        f"were trained on it (its weights' sha256 is not {recorded['sha256'][:12]}...): restore "
        f"that base, or train the adapters again"
    )


def merge_trained_adapters(model: GPT, lora, state: dict) -> None:
    """Put ``lora``'s adapters on ``model`` (the base's weights), load what the run trained
    (adapters and also_train parameters: ``state["model"]``) and merge them into the weights."""
    add_adapters(model, lora.targets, lora.r, lora.alpha, lora.also_train)
    trained = {name: param for name, param in model.named_parameters() if param.requires_grad}
    missing, unexpected = sorted(set(trained) - set(state["model"])), sorted(set(state["model"]) - set(trained))
    misshapen = [n for n in sorted(set(trained) - set(missing)) if state["model"][n].shape != trained[n].shape]
    if missing or unexpected or misshapen:
        raise CheckpointError(
            f"{state['path']}: its LoRA weights do not fit train.lora={lora}: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}, of another shape {misshapen[:3]}"
        )
    model.load_state_dict(state["model"], strict=False)
    merge_adapters(model)
    model.requires_grad_(True)
