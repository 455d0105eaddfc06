"""``minilm extend``: a trained model fine-tuned at a longer length, planned from the source itself.

The source (a minilm run or checkpoint file, a transformers model directory or ``hf:NAME``) gives the
architecture, the tokenizer and the original length; the method and the factor give the new position
setting and the new length, the source's length x the factor. Everything else is a shipped extension
config's (``minilm/configs/extend_*.yaml``, chosen by ``config_for``), so ``minilm extend out/rope --method
yarn --factor 4`` trains what ``minilm train --config extend_rope_yarn.yaml train.init_from=out/rope`` trains;
``--lora`` lays the adapters of ``extend_yarn_lora.yaml`` over it. ``plan_extension`` turns a request into
that config file and the overrides on it (a ``Plan``), refusing in one line what cannot be extended;
``describe_plan`` says what the run will train. The run itself is ``train.init_from``'s
(``minilm.training.source``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional, Sequence

from minilm.checkpoints.extension import scaled_length
from minilm.checkpoints.format import CheckpointError
from minilm.checkpoints.loading import locate_data, read_checkpoint
from minilm.common import MinilmError, Range, suggest
from minilm.config import ARCHITECTURE, ConfigError, ModelConfig, fields_with
from minilm.configfile import SHIPPED_CONFIGS, apply_overrides
from minilm.hf.reading import PREFIX, is_hf_source, read_model_tree
from minilm.positions import canonical, describe, unwrap_setting
from minilm.positions.rope import SCALING_NAMES, SCALING_TYPES
from minilm.yamlfile import parse_yaml

ROPE_METHODS = tuple(t for t in SCALING_TYPES if t != "none")  # the registry's rope scalings
METHODS = ROPE_METHODS + ("interpolated",)  # and the position-interpolation wrapper, for any kind
ALIASES = {"pi": SCALING_NAMES["pi"], "interp": "interpolated"}
ROPE_CONFIGS = {"linear": "extend_rope_pi.yaml", "ntk": "extend_rope_ntk.yaml", "yarn": "extend_rope_yarn.yaml"}
OTHER_ROPE_CONFIG = "extend_rope_yarn.yaml"  # the other scalings: its schedule, with their own type
INTERPOLATION_CONFIGS = {"learned": "extend_learned_interp.yaml"}  # a learned table's factor is its rows'
OTHER_INTERPOLATION_CONFIG = "extend_sinusoidal_interp.yaml"  # any other kind: wrapped as it is
LORA_CONFIG = "extend_yarn_lora.yaml"  # whose train.lora and optimizer --lora takes
SET_BY_EXTEND = {  # keys the command decides: an override of one is refused, naming what to give instead
    "train.init_from": "SOURCE",
    "model.position": "--method",
    "model.position.kind": "--method",
    "model.position.scaling": "--method",
    "model.position.scaling.type": "--method",
    "model.position.scaling.factor": "--factor",
    "model.position.factor": "--factor",
    "model.position.scaling.original_max_positions": "SOURCE (its length)",
}


@dataclass
class Plan:
    """An extension, planned: where from, how, and the config that trains it.

    ``source`` as given; ``what`` says what it is ("a minilm run", "a transformers llama model");
    ``model`` its model settings (position in canonical form); ``length`` its training length and
    ``new_length`` the run's; ``config_path`` the shipped config the run starts from and
    ``overrides`` what applies over it, the user's last."""

    source: str
    what: str
    model: dict
    method: str
    factor: float
    length: int
    new_length: int
    config_path: str
    overrides: list


def plan_extension(
    source: str,
    method: str,
    factor: float,
    *,
    lora: bool = False,
    out_dir: Optional[str] = None,
    overrides: Sequence[str] = (),
) -> Plan:
    """The plan of ``minilm extend SOURCE --method METHOD --factor FACTOR``: the source read (its
    settings only), the method and factor checked against it, the new length derived, the user's
    ``overrides`` checked (none may set what the command decides, nor another block_size). Raises a
    one-line MinilmError for an unknown method, a factor <= 1, an unreadable source, a source without
    RoPE for a rope scaling or one whose positions are scaled already."""
    method = method_name(method)
    check_factor(factor)
    what, model, corpus = source_settings(source)
    check_source(source, model, method)
    length, new_length = model["block_size"], extended_length(model, method, factor)
    if new_length <= length:
        raise ConfigError(
            f"--factor {factor:g} extends {source!r} from {length} tokens to {new_length}: no longer; give a factor "
            f"of at least {(length + 1) / length:.6g}"
        )
    check_overrides(overrides, length, factor, new_length)
    check_architecture(source, model, overrides)
    config_name = config_for(method, model)
    planned = architecture_overrides(model) + [
        f"train.init_from={json.dumps(source)}",
        f"out_dir={json.dumps(out_dir or default_out_dir(source, method, factor, lora))}",
        f"model.block_size={new_length}",
        *scaling_overrides(method, model, factor),
        *(lora_overrides() if lora else []),
        *corpus_overrides(corpus, overrides),
    ]
    return Plan(
        source=source,
        what=what,
        model=model,
        method=method,
        factor=factor,
        length=length,
        new_length=new_length,
        config_path=os.path.join(SHIPPED_CONFIGS, config_name),
        overrides=planned + list(overrides),
    )


def method_name(method: str) -> str:
    """The method's registry name (``pi`` is ``linear``, ``interp`` ``interpolated``); another is refused."""
    name = ALIASES.get(method, method)
    if name not in METHODS:
        raise ConfigError(f"--method {method!r} is invalid: {suggest(method, METHODS + tuple(ALIASES))}")
    return name


def check_factor(factor: float) -> None:
    """A factor is a finite number > 1: the new length over the source's."""
    if not Range(1, low_open=True).holds(factor):
        raise ConfigError(
            f"--factor {factor!r} is invalid: expected a number > 1, the new length over the source's (e.g. 4)"
        )


TEXT_SETTINGS = ("end_of_text", "document_mask", "min_document_tokens", "holdout_tokens")  # how a corpus is cut


def source_settings(source: str) -> tuple:
    """(what the source is, its model settings with the position setting in canonical form, the data
    settings it trained on: corpus and text field, its corpus found as ``locate_data`` finds it, and how
    that text was cut (``TEXT_SETTINGS``: end-of-text ids, document masks, the held-out tail); None for
    a transformers model) of a minilm run or checkpoint file (read whole) or a transformers model
    directory or ``hf:NAME`` (its config.json alone). A source that cannot be read is one line that says
    what SOURCE may be."""
    corpus = None
    try:
        if is_hf_source(source):
            family, model = read_model_tree(source)[1:3]
            what = f"a transformers {family.name} model"
        else:
            state = read_checkpoint(source)
            model, what = state["config"]["model"], "a minilm run"
            data = locate_data(state["config"].get("data", {}), state)
            corpus = {key: data[key] for key in ("corpus", "text_field") if isinstance(data.get(key), str)}
            corpus.update({key: data[key] for key in TEXT_SETTINGS if key in data})
    except MinilmError as exc:
        raise CheckpointError(
            f"cannot extend {source!r}: {exc} (SOURCE is a minilm run: an out_dir or a checkpoint file, or a "
            f"transformers model directory)"
        ) from None
    return what, {**model, "position": canonical(model["position"])}, corpus


def corpus_overrides(corpus: Optional[dict], overrides: Sequence[str]) -> list:
    """A minilm source's data settings (``source_settings``), as overrides: the extension reads the text
    the source was trained on, cut as it was (its end-of-text ids, document masks and held-out tail), unless
    ``overrides`` give ``data.corpus`` (a transformers source has none: the config's corpus); a setting the
    overrides give is theirs."""
    given = {o.split("=", 1)[0].strip().lstrip("-") for o in overrides}
    if not corpus or "data.corpus" in given:
        return []
    if "data.end_of_text" in given:  # the documents' masks and lengths read the end-of-text ids: the user's then
        given |= {"data.document_mask", "data.min_document_tokens"}
    return [f"data.{key}={json.dumps(value)}" for key, value in corpus.items() if f"data.{key}" not in given]


def check_source(source: str, model: dict, method: str) -> None:
    """A source whose positions are scaled already (a wrapper, a rope scaling) is refused, and so is a
    source without RoPE for a rope scaling: each in one line naming its positions and what would do."""
    position = model["position"]
    scaling = (position.get("scaling") or {}).get("type", "none") or "none"
    if unwrap_setting(position) is not position or scaling != "none":
        raise ConfigError(
            f"{source!r} has positions {describe(position)}, scaled already: minilm extend takes a source "
            f"without a scaling; to scale it again, minilm train with train.init_from={source} and a position setting"
        )
    if method in ROPE_METHODS and position.get("kind") != "rope":
        raise ConfigError(
            f"--method {method} is a rope scaling, but {source!r} has {position.get('kind')!r} positions, "
            f"no RoPE: valid for it: --method interpolated"
        )


def extended_length(model: dict, method: str, factor: float) -> int:
    """The run's block_size: the source's length x the factor (for a rope scaling the length the trainer
    derives for it, ``checkpoints.extension.scaled_length``)."""
    if method in ROPE_METHODS:
        return scaled_length({"kind": "rope", "scaling": {"type": method, "factor": factor}}, model)
    return int(round(factor * model["block_size"]))


SECTION_EXAMPLE = {"train": "max_steps", "model": "dropout", "data": "corpus"}  # a dotted key of each section


def check_overrides(overrides: Sequence[str], length: int, factor: float, new_length: int) -> None:
    """The user's overrides may set anything the source and the command do not decide: a key of
    ``SET_BY_EXTEND`` is refused, and so is a block_size other than the derived one (naming both)."""
    for assignment in overrides:
        key = assignment.split("=", 1)[0].strip().lstrip("-")
        if key in SECTION_EXAMPLE:  # a whole section replaces what extend planned in it
            raise ConfigError(
                f"override {key}=... replaces the whole {key} section, and with it what minilm extend sets there "
                f"(train.init_from, the source's architecture and tokenizer): give dotted keys, e.g. "
                f"{key}.{SECTION_EXAMPLE[key]}=..."
            )
        if key in SET_BY_EXTEND:
            raise ConfigError(
                f"override {key} is set by minilm extend: give {SET_BY_EXTEND[key]} instead of {assignment!r}"
            )
    asked = (apply_overrides({}, overrides).get("model") or {}).get("block_size")
    if asked is not None and asked != new_length:
        raise ConfigError(
            f"model.block_size={asked!r} is not the new length {new_length} (the source's {length} x --factor "
            f"{factor:g}): leave it out, or give the --factor that reaches it"
        )


def check_architecture(source: str, model: dict, overrides: Sequence[str]) -> None:
    """An override of an architecture key is refused where it is not the source's value (before the run
    says anything; a value the source leaves derived, such as a null head_dim, the trainer compares)."""
    asked = apply_overrides({}, overrides).get("model") or {}
    for key in fields_with(ModelConfig, ARCHITECTURE):
        if key in asked and model.get(key) is not None and asked[key] != model[key]:
            raise ConfigError(
                f"model.{key}={asked[key]!r} is not the architecture of {source!r}, which has {model[key]!r}: "
                f"the extended model keeps the source's; leave model.{key} out"
            )


def config_for(method: str, model: dict) -> str:
    """The shipped config a method's run starts from (its schedule, data and budget)."""
    if method in ROPE_METHODS:
        return ROPE_CONFIGS.get(method, OTHER_ROPE_CONFIG)
    return INTERPOLATION_CONFIGS.get(model["position"]["kind"], OTHER_INTERPOLATION_CONFIG)


def scaling_overrides(method: str, model: dict, factor: float) -> list:
    """The new position setting over the config's: a rope scaling's type and factor (the original length is
    the source's, filled in by the loader), or interpolation around the source's own scheme (its factor
    derived from the lengths, for a learned table from its rows)."""
    if method in ROPE_METHODS:
        return [f"model.position.scaling.type={method}", f"model.position.scaling.factor={factor!r}"]
    if model["position"]["kind"] in INTERPOLATION_CONFIGS:
        return []  # the config's setting is the source kind's
    return ['model.position={"kind": "interpolated"}']  # inner omitted: the source's setting


def architecture_overrides(model: dict) -> list:
    """Overrides that set each architecture key to what ``model`` (a source's settings) has: the shape
    comes from the source, whatever the config file says of it."""
    keys = fields_with(ModelConfig, ARCHITECTURE)
    return [f"model.{key}={json.dumps(model[key])}" for key in keys if key in model]


def lora_overrides() -> list:
    """``--lora``: the adapters and the optimiser of the shipped ``extend_yarn_lora.yaml`` (its train.lora
    mapping and train.optimizer), laid over the method's config."""
    with open(os.path.join(SHIPPED_CONFIGS, LORA_CONFIG), encoding="utf-8") as f:
        train = parse_yaml(f)["train"]
    return [f"train.lora={json.dumps(train['lora'])}", f"train.optimizer={train['optimizer']}"]


def default_out_dir(source: str, method: str, factor: float, lora: bool = False) -> str:
    """Beside the source, never in it: ``out/rope`` -> ``out/rope-yarn-x4``; a checkpoint file's run
    directory (``out/rope/ckpt.pt`` -> ``out/rope-yarn-x4``, a snapshot ``out/rope-step-100-yarn-x4``);
    ``hf:NAME`` -> ``out/<name>-yarn-x4``; a LoRA run's name ends in ``-lora``."""
    tail = f"-{method}-x{factor:g}" + ("-lora" if lora else "")
    if str(source).startswith(PREFIX):
        return os.path.join("out", source[len(PREFIX) :].rstrip("/").split("/")[-1] + tail)
    path = os.path.normpath(source)
    if os.path.basename(path) in (".", ".."):
        path = os.path.abspath(path)
    if os.path.isfile(path):
        run, stem = os.path.dirname(path) or ".", os.path.splitext(os.path.basename(path))[0]
        if os.path.basename(os.path.abspath(run)) == "snapshots":
            run = os.path.dirname(run) or "."
        path = os.path.normpath(run) + ("" if stem == "ckpt" else f"-{stem}")
    return path + tail


def describe_plan(plan: Plan, config) -> str:
    """What the run will train, as one short paragraph: the source, its architecture and length, the
    method and factor, the new length, full fine-tuning or LoRA, the steps and the out_dir."""
    m, t = plan.model, config.train
    source = (
        f"extend {plan.source}: {plan.what} of {m['n_layer']} layers x d_model {m['d_model']} ({m['n_head']} "
        f"heads, {describe(m['position'])} positions, a tokenizer of {m['vocab_size']:,} tokens), "
        f"trained at {plan.length:,} tokens."
    )
    if t.lora.r:
        also = f"; {', '.join(t.lora.also_train)} trained too" if t.lora.also_train else ""
        how = f"LoRA adapters (rank {t.lora.r} on {', '.join(t.lora.targets)}{also})"
    else:
        how = "every weight (full fine-tuning)"
    run = (
        f"It trains {how} at {plan.length:,} x {plan.factor:g} = {plan.new_length:,} tokens with "
        f"{describe(config.model.position)} positions ({plan.method}, original length {plan.length:,}): "
        f"{t.max_steps:,} steps of {t.batch_size * t.grad_accum} x {plan.new_length:,} tokens of "
        f"{config.data.corpus} at lr {t.lr:g} "
        f"(the settings of {os.path.basename(plan.config_path)}), into {config.out_dir}."
    )
    return f"{source} {run}"
