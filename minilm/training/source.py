"""``train.init_from``: the model a run starts from, and what the run takes from it.

The source's weights, architecture and tokenizer always; its position setting, training
length and dropout unless the config sets them (a rope scaling with a factor set over a source
without one asks for factor x the source's length: that is the run's block_size unless the config
sets it, and a block_size set apart from it is said) (``minilm.configfile.was_given``: what a YAML file
and its overrides set, as against the defaults). A set position setting of the source's kind
applies over the source's (a scaling, interpolation: ``minilm.checkpoints.extension``); another
kind, or another architecture, is an error naming both values, as is a ``data.tokenizer`` that is
not the source's tokenizer. ``source_model`` also returns one line that says what was loaded and
what the run takes from it. ``starting_config`` is what any run starts from, with or without a
source: the config whose architecture and vocabulary are decided before any data is prepared.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from minilm.checkpoints.extension import position_overrides, scaled_length
from minilm.checkpoints.format import CheckpointError
from minilm.checkpoints.loading import Loaded, model_of, read_checkpoint
from minilm.config import ARCHITECTURE, Config, ConfigError, ModelConfig, fields_with, resolve_config
from minilm.configfile import was_given
from minilm.data.corpus import configured_tokenizer
from minilm.positions import PositionError, describe, unwrap_setting, validate
from minilm.positions.layers import check_all_used


def starting_config(config: Config, fresh: bool = True) -> tuple:
    """What a run's start decides before any data is prepared: (the config with the architecture and
    vocabulary of ``train.init_from``'s source (``source_model``), else the vocabulary of
    ``data.tokenizer``, else ``data.vocab_size`` (the size of the tokenizer to train); the source,
    a ``Loaded``, or None; the line that says what was loaded, or ''). ``setup`` starts from it and
    ``--print-config`` prints it. A ConfigError or CheckpointError where the source or the tokenizer
    cannot be used, or where a model built from scratch (``fresh``, not a resumed one) would leave a
    type of ``model.layers`` unused (``check_all_used``)."""
    if config.train.init_from:
        return source_model(config)
    if fresh and config.model.layers is not None:
        try:
            check_all_used(config.model.layers["pattern"], config.model.n_layer)
        except PositionError as exc:
            raise ConfigError(str(exc)) from None
    return resolve_config(config, tokenizer=configured_tokenizer(config.data)), None, ""


def source_model(config: Config) -> tuple:
    """``train.init_from``: (config with the source's model settings and vocabulary, Loaded, a
    line saying what was loaded and what the run takes from it). What the config sets (a YAML
    file and overrides: ``minilm.configfile.was_given``) applies over the source: a position setting of the
    same kind (a scaling, interpolation), block_size, dropout; another kind or architecture is
    an error naming both values. What it leaves unset is the source's."""
    path, knows_given = config.train.init_from, getattr(config, "given", None) is not None
    # the position setting applies when the user set it (a config built in code: when not the default)
    explicit = was_given(config, "model.position") if knows_given else config.model.position != ModelConfig().position
    overrides = position_overrides(config.model.position) if explicit else []
    overrides += [
        f"model.{name}={getattr(config.model, name)}"
        for name in ("block_size", "dropout")
        if was_given(config, f"model.{name}")
    ]
    state = read_checkpoint(path)
    scaled = scaled_length(config.model.position, state["config"]["model"]) if explicit else None
    note = ""
    if scaled and not was_given(config, "model.block_size"):
        overrides.append(f"model.block_size={scaled}")  # the factor's length, from any source
    elif scaled and config.model.block_size != scaled:
        note = (
            f" (note: model.block_size={config.model.block_size} is not the scaling's factor x the source's "
            f"length, {scaled}: the run trains at another length than the factor says)"
        )
    source = model_of(state, overrides)
    trained, defaults = source.config.model, ModelConfig()
    for name in fields_with(ModelConfig, ARCHITECTURE):  # the source decides; another value is a mistake
        asked = getattr(config.model, name)
        chosen = was_given(config, f"model.{name}") if knows_given else asked != getattr(defaults, name)
        if chosen and asked != getattr(trained, name):
            raise CheckpointError(
                f"train.init_from={path!r}: model.{name}={asked} but the source has "
                f"{getattr(trained, name)}; an extended model keeps the source architecture"
            )
    validate(source.config.model.position, source.config.model)  # its positions reach the new block_size
    check_tokenizer(config, source)
    said = loaded_line(path, source, source.state["config"]["model"].get("block_size")) + note
    config = dataclasses.replace(config, model=source.config.model)
    return resolve_config(config, tokenizer=source.tokenizer), source, said


def check_tokenizer(config: Config, source: Loaded) -> None:
    """A ConfigError when ``data.tokenizer`` is set and is not the tokenizer of ``train.init_from``
    (the same bytes), which a run from it keeps."""
    given = configured_tokenizer(config.data)
    if given is not None and given.to_bytes() != source.tokenizer.to_bytes():
        raise ConfigError(
            f"data.tokenizer={config.data.tokenizer!r} is not the tokenizer of train.init_from="
            f"{config.train.init_from!r} ({source.tokenizer.vocab_size:,} tokens), which a run from it keeps: "
            f"leave data.tokenizer out (null) or name the source's own tokenizer"
        )


def loaded_line(path: str, source: Loaded, trained_length: Optional[int]) -> str:
    """What ``train.init_from`` loaded and what the run takes from it, in one line."""
    m = source.config.model
    length = f"block_size {m.block_size}"
    if trained_length and trained_length != m.block_size:
        scaled = (
            unwrap_setting(m.position) is not m.position
            or (m.position.get("scaling") or {}).get("type", "none") != "none"
        )  # a wrapper, or a rope scaling
        length = f"block_size {trained_length} -> {m.block_size}" + (
            "" if scaled else " with no position scaling (positions past the source's length extrapolate)"
        )
    return (
        f"init_from: loaded {path} ({source.model.num_params() / 1e6:.2f}M parameters, {m.n_layer} layers x "
        f"d_model {m.d_model}); positions {describe(m.position)}, {length}; the architecture and the tokenizer "
        f"({m.vocab_size:,} tokens) are the source's"
    )
