"""What a Hugging Face family is to minilm, and what the families share.

A family (``Family``) maps one transformers architecture both ways: ``read_config`` and
``read_weights`` turn a model directory's config.json and tensors into minilm's model
settings and state dict; ``exports`` says whether a minilm model is written as this family,
and ``write`` turns a minilm model into config.json and tensors. ``handles`` names the
``ModelConfig`` fields that ``write`` maps or checks: ``refuse_unhandled`` refuses a model
whose other fields are not at their defaults, so a model option added later is refused by
every family until the family handles it, never silently dropped.

Weight names: minilm's fused ``attn.qkv`` is [q; k; v] with heads contiguous; ``mlp.fc`` is
[gate; up] for swiglu; the head is ``lm_head`` (``wte`` when tied).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Optional

import torch

from minilm.common import MinilmError, shown

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}  # HF name -> minilm mlp
HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_new"}  # minilm mlp -> HF name
SHARED = frozenset(
    {
        "vocab_size",
        "n_layer",
        "n_head",
        "d_model",
        "block_size",
        "dropout",
        "position",
        "embedding_scale",
        "embedding_init_std",
    }
)  # handled by the export itself: sizes, the kind's
# family, no scale; how the weights were initialised does not change what they compute


class HFError(MinilmError):
    """A Hugging Face directory or model minilm cannot map; the message is one line for the user."""


class Family(NamedTuple):
    """One Hugging Face family as minilm reads and writes it: its names, the fields it maps, and
    the functions that write a minilm model as it and read it back (the comments by each field)."""

    name: str  # as messages show it: "GPT-2"
    model_types: tuple  # config.json model_type values this family reads (none: export only)
    handles: frozenset  # ModelConfig fields that ``write`` maps or checks, beside SHARED
    exports: Callable  # (ModelConfig) -> bool: is a minilm model written as this family?
    write: Callable  # (ModelConfig, state dict) -> (model_type, config.json dict, HF tensors)
    read_config: Optional[Callable] = None  # (config.json dict, path) -> minilm model settings
    read_weights: Optional[Callable] = None  # (HF tensors, minilm model settings, config.json) -> minilm state dict
    buffers: tuple = ()  # name endings of tensors in its files that are no weights (masks, rotary tables): left unread
    partial_rotary: bool = False  # does transformers' code of it turn part of a head (partial_rotary_factor)?
    longrope_switch: str = "positions"  # when its transformers code switches LongRoPE's factors: minilm's switch


def refuse(path: str, what: str) -> None:
    raise HFError(f"{path}: {what}")


def require(ok: bool, family: str, what: str) -> None:
    if not ok:
        raise HFError(f"cannot export as {family}: {what}")


RESOLVED = {"head_dim": lambda m: m.d_model // m.n_head}  # fields whose null default the config resolves


def refuse_unhandled(family: Family, m) -> None:
    """Refuse a model with a setting ``family`` does not handle and that is not at its default."""
    for f in dataclasses.fields(m):
        if f.name in SHARED or f.name in family.handles:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if f.name in RESOLVED:
            default = RESOLVED[f.name](m)
        value = getattr(m, f.name)
        require(
            value == default,
            family.name,
            f"model.{f.name}={value!r} has no {family.name} equivalent (exported only at its default {default!r})",
        )


REQUIRED = object()  # ``count``'s default for a key config.json must give


def count(hf: dict, key: str, path: str, default=REQUIRED, least: int = 1, absent: str = "", label: str = ""):
    """config.json's ``key`` where a count is expected: an integer >= ``least``. Absent or null, it is
    ``default`` (``absent`` says what that means; a KeyError when required, which the reader reports as
    missing); 0 (where ``least`` is 1), a negative, a bool or text is refused in one line that names it,
    never read as absent (transformers takes a 0 as it is: no heads, a division by zero). ``label`` names
    the key in the message where it sits inside another (``rope_parameters.original_max_position_embeddings``)."""
    value = hf.get(key)
    if value is None:
        if default is REQUIRED:
            raise KeyError(key)
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        leave = f", or leave it out ({absent})" if absent else ""
        refuse(path, f"{label or key}={shown(value)} is invalid: expected an integer >= {least}{leave}")
    return value


def activation(hf: dict, key: str, path: str) -> str:
    name = hf.get(key, "gelu")
    if name not in ACTIVATIONS:
        refuse(path, f"{key}={name!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class Weights:
    """The source tensors by name, with a common prefix stripped; ``take`` marks them used, and
    ``done`` refuses tensors that were never used (a mapping that would silently drop weights). The
    tensors come checked and without the family's ``buffers`` (``minilm.hf.reading.read_weights``)."""

    def __init__(self, tensors: dict, prefix: str):
        self.tensors = {k.removeprefix(prefix): v for k, v in tensors.items()}
        self.used = set()

    def take(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise HFError(f"the weights lack {name!r}")
        self.used.add(name)
        return self.tensors[name]

    def has(self, name: str) -> bool:
        return name in self.tensors

    def done(self, out: dict) -> dict:
        left = sorted(set(self.tensors) - self.used)
        if left:
            raise HFError(f"weights {left[:3]} have no place in the minilm model")
        return out


def take_norm(out: dict, w: Weights, source: str, target: str, bias: bool = True) -> None:
    """Read a weight (and bias) pair: norms, and linears stored as (out, in)."""
    out[f"{target}.weight"] = w.take(f"{source}.weight")
    if bias:
        out[f"{target}.bias"] = w.take(f"{source}.bias")


def take_head(out: dict, w: Weights, tied: bool, name: str) -> dict:
    out["lm_head.weight"] = out["wte.weight"] if tied else w.take(name)
    if tied and w.has(name):
        w.take(name)  # a tied head saved anyway: the same tensor
    return out


def put_linear(sd: dict, out: dict, source: str, target: str, with_bias: bool, transpose: bool = False) -> None:
    """Write a minilm weight (and its bias, zeros where minilm has none) under a HF name."""
    weight = sd[f"{source}.weight"]
    out[f"{target}.weight"] = weight.t() if transpose else weight
    if with_bias:
        out[f"{target}.bias"] = sd.get(f"{source}.bias", torch.zeros(weight.shape[0]))


def require_classic_layout(m, family: str, tied: bool = True) -> None:
    """GPT-2 and MPT: layernorm, a sequential residual, full attention heads; a tied head where ``tied``."""
    require(
        m.norm == "layernorm" and not m.parallel_residual and (m.tie_embeddings or not tied),
        family,
        f"it needs layernorm, a sequential residual{' and a tied head' if tied else ''} (norm={m.norm}, "
        f"parallel_residual={m.parallel_residual}, tie_embeddings={m.tie_embeddings})",
    )
    require(m.n_kv_head in (None, m.n_head) and not m.qkv_bias, family, "it has neither GQA nor q/k/v-only bias")


LAYER_TYPES = ("sliding_attention", "full_attention")  # transformers' layer_types (and per-type rope) names
NOPE = {"kind": "none"}  # a layer without positions, as model.layers says it
ROTARY = ("rotary_emb.inv_freq",)  # the rotary table older files keep beside the weights (``Family.buffers``)

LLAMA_LAYOUT = frozenset(
    {"d_ff", "bias", "norm", "norm_eps", "mlp", "parallel_residual", "tie_embeddings", "n_kv_head", "head_dim"}
)  # the fields every family of Llama's layout (separate q, k, v, o; gate, up, down) writes or checks


def llama_shape(hf: dict, path: str, eps: float) -> dict:
    """The model settings a config.json of Llama's layout gives in its own keys: sizes, heads
    (``num_key_value_heads`` absent: one per query head; ``head_dim`` absent: hidden_size / heads), RMSNorm
    with ``rms_norm_eps`` (``eps`` where absent), no biases, no embedding scale. Every count is read by
    ``count``: a 0, a negative or a bool is refused, never taken for absent."""
    width, heads = count(hf, "hidden_size", path), count(hf, "num_attention_heads", path)
    return dict(
        vocab_size=count(hf, "vocab_size", path),
        n_layer=count(hf, "num_hidden_layers", path),
        n_head=heads,
        d_model=width,
        block_size=count(hf, "max_position_embeddings", path),
        d_ff=count(hf, "intermediate_size", path),
        bias=False,
        head_dim=count(hf, "head_dim", path, width // heads, absent="hidden_size / num_attention_heads"),
        norm="rmsnorm",
        norm_eps=float(hf.get("rms_norm_eps", eps)),
        n_kv_head=count(hf, "num_key_value_heads", path, heads, absent="one per query head"),
        embedding_scale=1.0,
    )


def take_projections(out: dict, w: Weights, source: str, target: str) -> None:
    """A Llama-layout layer's linears into minilm's: q, k, v into ``attn.qkv``, o into ``attn.proj``,
    gate and up into ``mlp.fc``, down into ``mlp.proj`` (weights only)."""
    out[f"{target}.attn.qkv.weight"] = torch.cat([w.take(f"{source}.self_attn.{p}_proj.weight") for p in "qkv"])
    out[f"{target}.attn.proj.weight"] = w.take(f"{source}.self_attn.o_proj.weight")
    out[f"{target}.mlp.fc.weight"] = torch.cat([w.take(f"{source}.mlp.{p}_proj.weight") for p in ("gate", "up")])
    out[f"{target}.mlp.proj.weight"] = w.take(f"{source}.mlp.down_proj.weight")


def put_projections(out: dict, sd: dict, source: str, target: str, m) -> None:
    """``take_projections`` the other way, for ModelConfig ``m``."""
    kv = (m.n_kv_head or m.n_head) * m.head_dim
    for name, part in zip("qkv", sd[f"{source}.attn.qkv.weight"].split([m.n_head * m.head_dim, kv, kv])):
        out[f"{target}.self_attn.{name}_proj.weight"] = part
    out[f"{target}.self_attn.o_proj.weight"] = sd[f"{source}.attn.proj.weight"]
    gate, up = sd[f"{source}.mlp.fc.weight"].chunk(2)
    out[f"{target}.mlp.gate_proj.weight"], out[f"{target}.mlp.up_proj.weight"] = gate, up
    out[f"{target}.mlp.down_proj.weight"] = sd[f"{source}.mlp.proj.weight"]


def llama_config(m, params: dict, positions: int) -> dict:
    """The config.json keys every family of Llama's layout writes alike for ModelConfig ``m``, with
    its ``rope_parameters`` and ``max_position_embeddings`` (``minilm.hf.rope.rope_parameters``)."""
    return dict(
        vocab_size=m.vocab_size,
        hidden_size=m.d_model,
        intermediate_size=m.d_ff,
        num_hidden_layers=m.n_layer,
        num_attention_heads=m.n_head,
        num_key_value_heads=m.n_kv_head or m.n_head,
        head_dim=m.head_dim,
        max_position_embeddings=positions,
        rms_norm_eps=m.norm_eps,
        tie_word_embeddings=m.tie_embeddings,
        rope_parameters=params,
        attention_dropout=0.0,
    )


def sliding_layers(hf: dict, path: str, every: int, positions: dict, extra: Optional[dict] = None) -> tuple:
    """(the full layers' rope setting, ``model.layers``: None where every layer is alike) of a config with
    ``layer_types`` of sliding and full attention (absent: every ``every``-th layer full, the others
    sliding), one ``sliding_window`` (null: no window; absent: 4096, transformers' default for Gemma 2/3
    and OLMo 3) and ``positions``, {layer type: rope setting};
    ``extra`` joins every type's settings (Gemma 2's soft-cap)."""
    n, types = hf["num_hidden_layers"], hf.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    if len(types) != n or any(t not in LAYER_TYPES for t in types):
        refuse(path, f"layer_types={types!r} is not supported: expected {n} of sliding_attention, full_attention")
    window = hf.get("sliding_window", 4096)  # where config.json has none, transformers' default for these families
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        refuse(path, f"sliding_window={window!r} is invalid: expected a number of keys >= 1 or null")
    names = ["sliding" if t == "sliding_attention" and window is not None else "full" for t in types]
    layers = {"pattern": names}
    for name in dict.fromkeys(names):
        setting = {"window": window} if name == "sliding" else {}
        if name == "sliding" and positions["sliding_attention"] != positions["full_attention"]:
            setting["position"] = positions["sliding_attention"]
        layers[name] = {**setting, **(extra or {})}
    plain = all(not setting for name, setting in layers.items() if name != "pattern")
    return positions["full_attention"], None if plain else layers
