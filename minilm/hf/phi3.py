"""Phi-3 (``phi3``: Phi-3, Phi-3.5, Phi-4-mini) both ways: the Llama layout (RMSNorm, SwiGLU,
no biases, GQA) with q, k and v in one ``qkv_proj`` and gate and up in one ``gate_up_proj``,
which are minilm's own ``attn.qkv`` and ``mlp.fc`` as they are; partial rotary
(``partial_rotary_factor``); LongRoPE scaling (``short_factor``, ``long_factor``,
``original_max_position_embeddings``, the attention factor sqrt(1 + ln s / ln L) with s the
ratio of max_position_embeddings to it) read with transformers' switch between the two sets
of factors, and its ``generate``'s recomputation of the cache once a generation passes the
original length (``switch: refill`` in ``minilm.positions.rope``). A Llama-style minilm model is
written as Llama unless Phi-3 is asked for (``minilm export --family phi3``)."""

from __future__ import annotations

import torch

from minilm.hf.family import LLAMA_LAYOUT, ROTARY, Family, count, llama_config, llama_shape, refuse, require
from minilm.hf.llama import llama_style
from minilm.hf.llama import read_weights as read_llama_weights
from minilm.hf.llama import write as write_llama
from minilm.hf.rope import rope_position


def read_config(hf: dict, path: str) -> dict:
    shape = llama_shape(hf, path, 1e-5)  # every count checked (num_key_value_heads: 0 is refused, not absent)
    if hf.get("hidden_act", "silu") != "silu":
        refuse(path, f"hidden_act={hf.get('hidden_act')!r} is not supported for phi3; supported: silu")
    window, longest = count(hf, "sliding_window", path, None, absent="no window"), shape["block_size"]
    if window is not None and window < longest:
        refuse(
            path,
            f"sliding_window={window} is not supported (a window of at least max_position_embeddings="
            f"{longest}, or none, is)",
        )
    position = rope_position(hf, path, fraction=1.0)
    if (position["scaling"] or {}).get("type") == "longrope":  # Phi-3's generate recomputes its cache past L
        position["scaling"]["switch"] = "refill"
    return dict(shape, mlp="swiglu", tie_embeddings=hf.get("tie_word_embeddings", False), position=position)


def unfused(tensors: dict, model: dict) -> dict:
    """Phi-3's tensors under Llama's names: ``qkv_proj`` split into q, k and v, ``gate_up_proj``
    into gate and up (both [first; second] as minilm's own fused weights)."""
    kv = (model.get("n_kv_head") or model["n_head"]) * model["head_dim"]
    sizes = {
        "self_attn.qkv_proj": (("q", "k", "v"), [model["n_head"] * model["head_dim"], kv, kv]),
        "mlp.gate_up_proj": (("gate", "up"), None),
    }
    out = {}
    for name, tensor in tensors.items():
        fused = next((k for k in sizes if name.endswith(f"{k}.weight")), None)
        if fused is None:
            out[name] = tensor
            continue
        parts, split = sizes[fused]
        pieces = tensor.split(split) if split else tensor.chunk(2)
        stem = name[: -len(f"{fused}.weight")] + fused.split(".")[0]
        out.update({f"{stem}.{p}_proj.weight": piece for p, piece in zip(parts, pieces)})
    return out


def read_weights(tensors: dict, model: dict, hf: dict) -> dict:
    return read_llama_weights(unfused(tensors, model), {**model, "qkv_bias": False, "qk_norm": False}, hf)


def write(m, sd: dict) -> tuple:
    require(
        not m.qkv_bias and not m.qk_norm,
        "Phi-3",
        f"it has neither q/k/v biases nor q/k norms (qkv_bias={m.qkv_bias}, qk_norm={m.qk_norm})",
    )
    _, written, out = write_llama(m, sd)  # Llama's tensors, then q/k/v and gate/up fused again
    for i in range(m.n_layer):
        h = f"model.layers.{i}"
        out[f"{h}.self_attn.qkv_proj.weight"] = torch.cat([out.pop(f"{h}.self_attn.{p}_proj.weight") for p in "qkv"])
        out[f"{h}.mlp.gate_up_proj.weight"] = torch.cat([out.pop(f"{h}.mlp.{p}_proj.weight") for p in ("gate", "up")])
    params, positions = written["rope_parameters"], written["max_position_embeddings"]
    config = dict(
        llama_config(m, params, positions),
        architectures=["Phi3ForCausalLM"],
        model_type="phi3",
        hidden_act="silu",
        original_max_position_embeddings=params.get("original_max_position_embeddings", positions),
        partial_rotary_factor=params["partial_rotary_factor"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        sliding_window=None,
        pad_token_id=None,
    )
    return "phi3", config, out


PHI3 = Family(
    name="Phi-3",
    model_types=("phi3",),
    read_config=read_config,
    read_weights=read_weights,
    exports=lambda m: m.position["kind"] == "rope" and llama_style(m) and not (m.qkv_bias or m.qk_norm),
    write=write,
    handles=LLAMA_LAYOUT | {"qkv_bias", "qk_norm"},
    partial_rotary=True,
    longrope_switch="refill",
    buffers=ROTARY,
)
