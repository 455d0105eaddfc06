"""The Gemma family both ways: Gemma 2 (``gemma2``) and Gemma 3's text model (``gemma3_text``,
``Gemma3ForCausalLM``), as transformers 5.24 computes them.

A Gemma block is minilm's with ``sublayer_norms: sandwich`` (a norm before each sublayer and one on its output,
before the residual add), ``mlp: geglu_tanh`` (gelu_tanh(gate) * up), RMSNorm, the token embedding
multiplied by sqrt(d_model) (``embedding_scale: sqrt_d_model``) and, in Gemma 3, an RMSNorm on each
head's q and k (``qk_norm``). Gemma's RMSNorm multiplies by (1 + w) where minilm's multiplies by w:
weights come in as 1 + w and go out as w - 1 (in float32 the same products). The attention scores
are scaled by ``query_pre_attn_scalar`` ** -0.5 rather than head_dim ** -0.5: the factor between them
is folded into the query's projection (Gemma 2) or its norm (Gemma 3) on the way in, so an export
writes ``query_pre_attn_scalar`` = head_dim.

Positions per layer (``model.layers``): ``layer_types`` of sliding and full attention (when absent,
Gemma 2 alternates sliding and full, Gemma 3 repeats ``sliding_window_pattern`` - 1 sliding and one
full, as transformers fills them in), the window ``sliding_window`` (transformers' W: a query at p
sees keys j > p - W, minilm's ``window``), Gemma 2's ``attn_logit_softcapping`` on every layer (a
type's ``softcap``) and ``final_logit_softcapping`` (``logit_softcap``; both 50 and 30 when Gemma 2's
config.json leaves them out, as transformers' defaults). Gemma 3's rope settings are per layer type:
``rope_parameters`` keyed by ``sliding_attention`` and ``full_attention`` (older files: ``rope_theta``
and ``rope_scaling`` for the full layers, ``rope_local_base_freq`` for the sliding ones; bases 1e6
and 1e4 by default); transformers reads yarn's ``truncate`` from the mapping of the two, where it is
never set, so a per-type yarn truncates, as here. Bidirectional attention and attention biases are
refused.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from minilm.hf.family import (
    LAYER_TYPES,
    LLAMA_LAYOUT,
    ROTARY,
    Family,
    Weights,
    count,
    llama_config,
    llama_shape,
    put_projections,
    refuse,
    require,
    sliding_layers,
    take_head,
    take_projections,
)
from minilm.hf.rope import rope_by_layer_type, rope_parameters, rope_parameters_by_layer_type, rope_position
from minilm.positions.layers import layer_types

DEFAULTS = {  # what transformers takes where config.json says nothing
    "gemma2": {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "pattern": 2},
    "gemma3_text": {"attn_logit_softcapping": None, "final_logit_softcapping": None, "pattern": 6},
}
ARCHITECTURES = {"gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}


def read_config(hf: dict, path: str) -> dict:
    kind = hf["model_type"]
    activation = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if activation != "gelu_pytorch_tanh":
        refuse(path, f"hidden_activation={activation!r} is not supported for {kind}; supported: gelu_pytorch_tanh")
    if hf.get("attention_bias"):
        refuse(path, "attention_bias=true is not supported for Gemma")
    if hf.get("use_bidirectional_attention"):
        refuse(path, "use_bidirectional_attention=true is not supported: minilm's attention is causal")
    check_scalar(hf, path)
    defaults = DEFAULTS[kind]
    final = hf.get("final_logit_softcapping", defaults["final_logit_softcapping"])
    full, layers = read_layers(hf, path)
    return dict(
        llama_shape(hf, path, 1e-6),
        qk_norm=kind == "gemma3_text",
        sublayer_norms="sandwich",
        mlp="geglu_tanh",
        tie_embeddings=hf.get("tie_word_embeddings", True),
        position=full,
        embedding_scale="sqrt_d_model",
        logit_softcap=float(final or 0.0),
        layers=layers,
    )


def type_positions(hf: dict, path: str) -> dict:
    """{layer type: minilm's rope setting} of a config (the module docstring)."""
    if hf["model_type"] == "gemma2":
        position = rope_position(hf, path)
        return {t: position for t in LAYER_TYPES}
    legacy = {  # the older keys: rope_theta and rope_scaling on the full layers, rope_local_base_freq on the sliding
        "full_attention": {**(hf.get("rope_scaling") or {}), "rope_theta": hf.get("rope_theta", 1e6)},
        "sliding_attention": {"rope_type": "default", "rope_theta": hf.get("rope_local_base_freq", 1e4)},
    }
    return rope_by_layer_type(hf, path, legacy)


def read_layers(hf: dict, path: str) -> tuple:
    """(the full layers' rope setting, ``model.layers``) of a config."""
    kind = hf["model_type"]
    every = DEFAULTS[kind]["pattern"]
    every = count(hf, "sliding_window_pattern", path, every, absent=f"{every}, {kind}'s default")
    softcap = hf.get("attn_logit_softcapping", DEFAULTS[kind]["attn_logit_softcapping"])
    extra = {"softcap": float(softcap)} if softcap else None
    return sliding_layers(hf, path, every, type_positions(hf, path), extra)


def query_factor(head_dim: int, hf: dict) -> float:
    """What minilm's queries are multiplied by so that its scores, scaled by head_dim ** -0.5, are
    Gemma's, scaled by query_pre_attn_scalar ** -0.5."""
    return math.sqrt(head_dim / hf.get("query_pre_attn_scalar", 256))


def check_scalar(hf: dict, path: str) -> None:
    scalar = hf.get("query_pre_attn_scalar", 256)
    if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or not 0 < scalar < math.inf:
        refuse(path, f"query_pre_attn_scalar={scalar!r} is invalid: expected a number > 0")


def read_weights(tensors: dict, model: dict, hf: dict) -> dict:
    w = Weights(tensors, "model.")

    def norm(name: str) -> torch.Tensor:  # Gemma's (1 + w) as minilm's weight
        return 1.0 + w.take(f"{name}.weight").float()  # in float32, as transformers computes it

    factor = query_factor(model["head_dim"], hf)
    out = {"wte.weight": w.take("embed_tokens.weight")}
    for i in range(model["n_layer"]):
        h, b = f"layers.{i}", f"blocks.{i}"
        out[f"{b}.ln_1.weight"] = norm(f"{h}.input_layernorm")
        out[f"{b}.post_attn_norm.weight"] = norm(f"{h}.post_attention_layernorm")
        out[f"{b}.ln_2.weight"] = norm(f"{h}.pre_feedforward_layernorm")
        out[f"{b}.post_mlp_norm.weight"] = norm(f"{h}.post_feedforward_layernorm")
        take_projections(out, w, h, b)
        if model["qk_norm"]:  # the factor goes on the norm that follows the projection
            out[f"{b}.attn.q_norm.weight"] = norm(f"{h}.self_attn.q_norm") * factor
            out[f"{b}.attn.k_norm.weight"] = norm(f"{h}.self_attn.k_norm")
        else:  # or on the query rows of the projection (in float32)
            queries, qkv = model["n_head"] * model["head_dim"], out[f"{b}.attn.qkv.weight"].float()
            qkv[:queries] *= factor
            out[f"{b}.attn.qkv.weight"] = qkv
    out["ln_f.weight"] = norm("norm")
    return w.done(take_head(out, w, model["tie_embeddings"], "lm_head.weight"))


def gemma_style(m) -> bool:
    return (
        m.sublayer_norms == "sandwich"
        and m.mlp == "geglu_tanh"
        and m.norm == "rmsnorm"
        and m.embedding_scale == "sqrt_d_model"
        and not m.bias
        and not m.parallel_residual
        and m.position["kind"] == "rope"
    )


def write_layers(m, family: str) -> dict:
    """layer_types, sliding_window, the attention soft-cap and (Gemma 3) the rope settings per type."""
    name = {"gemma2": "Gemma 2", "gemma3_text": "Gemma 3"}[family]
    types = layer_types(m.layers, m.position, m.n_layer)
    windows = {t.window for t in types if t.window is not None}
    caps = {t.softcap for t in types}
    locals_ = {repr(t.position) for t in types if t.window is not None}
    require(
        len(windows) <= 1
        and len(caps) == 1
        and all(not (t.chunk or t.sinks or t.query_scale) for t in types)
        and all(t.position == m.position for t in types if t.window is None)
        and len(locals_) <= 1,
        name,
        "its model.layers is more than sliding layers of one window and one rope setting beside full "
        "layers with model.position, one soft-cap on all (a chunk, sinks or query scale have no Gemma equivalent)",
    )
    sliding = next((t.position for t in types if t.window is not None), m.position)
    require(
        family == "gemma3_text" or sliding == m.position,
        name,
        "its sliding layers have a rope setting of their own, which Gemma 3 holds (q/k norms), Gemma 2 not",
    )
    cap = caps.pop() or None
    config = {
        "layer_types": ["sliding_attention" if t.window is not None else "full_attention" for t in types],
        # transformers makes the sliding mask in every model, so a window is written even where no layer slides
        "sliding_window": windows.pop() if windows else m.block_size,
        "attn_logit_softcapping": cap,
    }
    if family == "gemma3_text":
        config["rope_parameters"] = rope_parameters_by_layer_type(m, name, sliding)
    return config


def write(m, sd: dict) -> tuple:
    require(
        gemma_style(m),
        "Gemma",
        "it needs sublayer_norms sandwich, mlp geglu_tanh, rmsnorm, embedding_scale sqrt_d_model, rope",
    )
    family = "gemma3_text" if m.qk_norm else "gemma2"

    def norm(name: str) -> torch.Tensor:  # minilm's weight as Gemma's (1 + w)
        weight = sd[f"{name}.weight"]
        return (weight.float() - 1.0).to(weight.dtype)

    out = {"model.embed_tokens.weight": sd["wte.weight"]}
    for i in range(m.n_layer):
        b, h = f"blocks.{i}", f"model.layers.{i}"
        out[f"{h}.input_layernorm.weight"] = norm(f"{b}.ln_1")
        out[f"{h}.post_attention_layernorm.weight"] = norm(f"{b}.post_attn_norm")
        out[f"{h}.pre_feedforward_layernorm.weight"] = norm(f"{b}.ln_2")
        out[f"{h}.post_feedforward_layernorm.weight"] = norm(f"{b}.post_mlp_norm")
        put_projections(out, sd, b, h, m)
        if m.qk_norm:
            for name in ("q_norm", "k_norm"):
                out[f"{h}.self_attn.{name}.weight"] = norm(f"{b}.attn.{name}")
    out["model.norm.weight"] = norm("ln_f")
    if not m.tie_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    config = dict(
        llama_config(m, *rope_parameters(m)),
        architectures=[ARCHITECTURES[family]],
        model_type=family,
        hidden_activation="gelu_pytorch_tanh",
        attention_bias=False,
        query_pre_attn_scalar=m.head_dim,
        final_logit_softcapping=m.logit_softcap or None,
    )
    config.update(write_layers(dataclasses.replace(m, layers=m.layers or {"pattern": ["all"], "all": {}}), family))
    return family, config, out


GEMMA = Family(
    name="Gemma",
    model_types=("gemma2", "gemma3_text"),
    read_config=read_config,
    read_weights=read_weights,
    exports=gemma_style,
    write=write,
    handles=LLAMA_LAYOUT | {"qk_norm", "layers", "sublayer_norms", "logit_softcap", "embedding_scale"},
    buffers=ROTARY,
)
