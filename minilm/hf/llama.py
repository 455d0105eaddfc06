"""The Llama family both ways (``llama``, ``qwen2``, ``qwen3``, ``smollm3``; ``mistral``, ``ministral3`` in): q/k/v
projections concatenated (GQA: ``n_kv_head``), gate and up concatenated
(``mlp: swiglu``), RMSNorm, Qwen2's q/k/v bias as ``qkv_bias``, Qwen3's RMSNorm on each head's
q and k (``q_norm``, ``k_norm``: one weight of head_dim shared by the heads) as ``qk_norm``,
and a ``head_dim`` apart from hidden_size / heads (Qwen3's 128). minilm's Llama-style
``rope`` models (rmsnorm, swiglu, no biases, a sequential residual) are written as Llama, as
Qwen2 when they have ``qkv_bias``, and as Qwen3 when they have ``qk_norm``.

Positions per layer come in as ``model.layers`` (``read_layers``), as transformers 5.24's configs
decide them: Mistral's ``sliding_window`` on every layer (Ministral 3's too, and its query scale on
every layer, ``query_scale``); Qwen2/3's ``layer_types`` (by default the
layers from ``max_window_layers`` on slide, and only with ``use_sliding_window``); SmolLM3's
``no_rope_layers`` (by default every ``no_rope_layer_interval``-th layer without RoPE), its sliding
layers being the NoPE ones when ``use_sliding_window`` is set. transformers' window W lets a query
at p see the keys j > p - W, which is minilm's ``window``. Qwen2 and Qwen3 go out with theirs, and a
Llama-layout model with NoPE layers (a layer type's ``position: {kind: none}``) goes out as SmolLM3,
its NoPE layers as ``no_rope_layers``, with at most one sliding window."""

from __future__ import annotations

import torch

from minilm.common import shown
from minilm.hf.family import (
    LLAMA_LAYOUT,
    NOPE,
    ROTARY,
    Family,
    Weights,
    count,
    llama_config,
    llama_shape,
    put_projections,
    refuse,
    require,
    take_head,
    take_norm,
    take_projections,
)
from minilm.hf.rope import rope_parameters, rope_position
from minilm.positions.layers import layer_types

# transformers' config classes where config.json leaves the key out and a model type differs from Llama's
TIED = ("smollm3",)  # tie_word_embeddings true
THETA = {"smollm3": 2_000_000.0}  # rope_theta (Llama's: 10000)


def llama_style(m) -> bool:
    return (
        m.norm == "rmsnorm"
        and m.mlp == "swiglu"
        and not m.bias
        and not m.parallel_residual
        and m.sublayer_norms == "pre"  # the others: Gemma's (sandwich) and EXAONE 4's (post)
    )


def read_config(hf: dict, path: str) -> dict:
    if hf.get("hidden_act", "silu") != "silu":
        refuse(path, f"hidden_act={hf.get('hidden_act')!r} is not supported for {hf['model_type']}; supported: silu")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        refuse(path, "attention_bias / mlp_bias are not supported (q/k/v biases alone are: Qwen2)")
    if hf["model_type"] == "ministral3" and not (hf.get("rope_parameters") or hf.get("rope_scaling")):
        refuse(path, "ministral3 without rope_parameters is not supported (its config class's default is a YaRN)")
    return dict(
        llama_shape(hf, path, 1e-6),
        qk_norm=hf["model_type"] == "qwen3",
        qkv_bias=hf["model_type"] == "qwen2",
        mlp="swiglu",
        tie_embeddings=hf.get("tie_word_embeddings", hf["model_type"] in TIED),
        position=rope_position(hf, path, THETA.get(hf["model_type"], 10000.0)),
        layers=read_layers(hf, path),
    )


def read_layers(hf: dict, path: str):
    """``model.layers`` of a config (None: every layer full attention with RoPE; the module docstring)."""
    n, kind = hf["num_hidden_layers"], hf["model_type"]
    window = hf.get("sliding_window")
    if kind not in ("mistral", "ministral3") and not hf.get("use_sliding_window"):
        window = None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        refuse(path, f"sliding_window={window!r} is invalid: expected a number of keys >= 1 or null")
    rope = [True] * n
    if kind == "smollm3":
        rope = hf.get("no_rope_layers")
        if rope is None:
            every = count(hf, "no_rope_layer_interval", path, 4, absent="every 4th layer without RoPE")
            rope = [int((i + 1) % every != 0) for i in range(n)]
        if not isinstance(rope, list) or len(rope) != n:
            refuse(path, f"no_rope_layers={shown(rope)} is invalid: expected a list of {n} entries, one per layer")
    if kind in ("mistral", "ministral3"):
        sliding = [window is not None] * n
    else:
        types = hf.get("layer_types")
        if types is None and kind == "smollm3":
            types = ["sliding_attention" if window is not None and not r else "full_attention" for r in rope]
        elif types is None:
            first = count(hf, "max_window_layers", path, n, least=0, absent="no layer slides")
            types = ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(n)]
        if len(types) != n or any(t not in ("sliding_attention", "full_attention") for t in types):
            refuse(path, f"layer_types={types!r} is not supported: expected {n} of sliding_attention, full_attention")
        sliding = [t == "sliding_attention" and window is not None for t in types]
    scale = query_scale(hf, path) if kind == "ministral3" else None
    if all(rope) and not any(sliding) and scale is None:
        return None
    names = [("sliding" if s else "full") + ("" if r else "_nope") for s, r in zip(sliding, rope)]
    settings = {"sliding": {"window": window}, "full": {}, "sliding_nope": {"window": window}, "full_nope": {}}
    layers = {"pattern": names}
    for name in dict.fromkeys(names):
        layers[name] = dict(settings[name], **({"query_scale": scale} if scale else {}))
        if name.endswith("_nope"):
            layers[name]["position"] = {"kind": "none"}
    return layers


def query_scale(hf: dict, path: str):
    """Ministral 3's query scale, 1 + beta ln(1 + floor(p / L)) with ``llama_4_scaling_beta`` beta and the
    rope's ``original_max_position_embeddings`` L (max_position_embeddings where absent; transformers'
    ``get_llama_4_attn_scale``), as a layer type's ``query_scale``; None without a beta."""
    params = {**(hf.get("rope_parameters") or {}), **(hf.get("rope_scaling") or {})}
    beta = params.get("llama_4_scaling_beta")
    if beta is None:
        return None
    key = "original_max_position_embeddings"
    floor = count(
        params,
        key,
        path,
        hf["max_position_embeddings"],
        absent="max_position_embeddings",
        label=f"rope_parameters.{key}",
    )
    return {"beta": float(beta), "floor": floor, "offset": 0}


def layer_family(m, family: str) -> str:
    """The family ``m`` is written as: SmolLM3 for a Llama-layout model whose ``model.layers`` have
    NoPE layers beside RoPE ones (``model.position``), else ``family``."""
    if family != "llama" or m.layers is None:
        return family
    types = layer_types(m.layers, m.position, m.n_layer)
    return "smollm3" if any(t.position == NOPE for t in types) else family


def write_layers(m, family: str) -> dict:
    """The config keys of ``m.layers``: for Qwen2/3 and SmolLM3 every type full attention or one sliding
    window, and for SmolLM3 the NoPE layers as ``no_rope_layers``."""
    if m.layers is None:
        return {"use_sliding_window": False}
    types = layer_types(m.layers, m.position, m.n_layer)
    windows = {t.window for t in types if t.window is not None}
    if not windows and all(t.position == m.position and t.plain and not t.query_scale for t in types):
        return {"use_sliding_window": False}  # the layers' types, as many as the model has, say nothing new
    positions = (m.position, NOPE) if family == "smollm3" else (m.position,)
    require(
        (family in ("qwen2", "qwen3") and len(windows) == 1 or family == "smollm3" and len(windows) <= 1)
        and all(t.position in positions and not (t.chunk or t.sinks or t.softcap or t.query_scale) for t in types),
        {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "smollm3": "SmolLM3"}[family],
        "its model.layers is more than layers of one sliding window beside full ones, which Qwen2 and Qwen3 "
        "hold, and NoPE layers, which SmolLM3 holds (a layer type's other position, chunk, sinks, soft-cap or "
        "query scale have no Llama equivalent)",
    )
    kinds = ["sliding_attention" if t.window is not None else "full_attention" for t in types]
    config = {"use_sliding_window": bool(windows), "sliding_window": min(windows) if windows else None}
    config["layer_types"] = kinds
    if family == "smollm3":
        return {**config, "no_rope_layers": [int(t.position != NOPE) for t in types]}
    return {**config, "max_window_layers": 0}


def read_weights(tensors: dict, model: dict, hf: dict) -> dict:
    w = Weights(tensors, "model.")
    out = {"wte.weight": w.take("embed_tokens.weight")}
    for i in range(model["n_layer"]):
        h, b = f"layers.{i}", f"blocks.{i}"
        take_norm(out, w, f"{h}.input_layernorm", f"{b}.ln_1", bias=False)
        take_norm(out, w, f"{h}.post_attention_layernorm", f"{b}.ln_2", bias=False)
        take_projections(out, w, h, b)
        if model["qkv_bias"]:
            out[f"{b}.attn.qkv.bias"] = torch.cat([w.take(f"{h}.self_attn.{p}_proj.bias") for p in "qkv"])
        if model["qk_norm"]:
            for name in ("q_norm", "k_norm"):
                out[f"{b}.attn.{name}.weight"] = w.take(f"{h}.self_attn.{name}.weight")
    take_norm(out, w, "norm", "ln_f", bias=False)
    return w.done(take_head(out, w, model["tie_embeddings"], "lm_head.weight"))


ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
}


def write(m, sd: dict) -> tuple:
    require(
        not (m.qk_norm and m.qkv_bias),
        "Qwen3",
        "it has q/k norms without q/k/v-only biases (Qwen2 has the biases without the norms)",
    )
    family = layer_family(m, "qwen3" if m.qk_norm else "qwen2" if m.qkv_bias else "llama")
    require(
        family != "smollm3" or m.head_dim == m.d_model // m.n_head,
        "SmolLM3",
        f"model.head_dim={m.head_dim}: SmolLM3's heads are d_model / n_head wide",
    )
    kv = m.n_kv_head or m.n_head
    sizes = [m.n_head * m.head_dim, kv * m.head_dim, kv * m.head_dim]
    out = {"model.embed_tokens.weight": sd["wte.weight"]}
    for i in range(m.n_layer):
        b, h = f"blocks.{i}", f"model.layers.{i}"
        out[f"{h}.input_layernorm.weight"] = sd[f"{b}.ln_1.weight"]
        out[f"{h}.post_attention_layernorm.weight"] = sd[f"{b}.ln_2.weight"]
        put_projections(out, sd, b, h, m)
        if m.qkv_bias:
            for name, part in zip("qkv", sd[f"{b}.attn.qkv.bias"].split(sizes)):
                out[f"{h}.self_attn.{name}_proj.bias"] = part
        if m.qk_norm:
            for name in ("q_norm", "k_norm"):
                out[f"{h}.self_attn.{name}.weight"] = sd[f"{b}.attn.{name}.weight"]
    out["model.norm.weight"] = sd["ln_f.weight"]
    if not m.tie_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    config = dict(
        llama_config(m, *rope_parameters(m)),
        architectures=[ARCHITECTURES[family]],
        model_type=family,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
    )
    config.update(write_layers(m, family))
    if family == "smollm3":  # its config class would otherwise take SmolLM3's own pad id, 128004
        config["pad_token_id"] = None
    if (
        family == "qwen3" and not config["use_sliding_window"]
    ):  # every layer full attention (Qwen3's sliding window is off)
        config.update(sliding_window=None, max_window_layers=m.n_layer, layer_types=["full_attention"] * m.n_layer)
    return family, config, out


LLAMA = Family(
    name="Llama",
    model_types=("llama", "mistral", "ministral3", "qwen2", "qwen3", "smollm3"),
    read_config=read_config,
    read_weights=read_weights,
    exports=lambda m: m.position["kind"] == "rope" and llama_style(m),
    write=write,
    handles=LLAMA_LAYOUT | {"qkv_bias", "qk_norm", "layers"},
    buffers=ROTARY,
)
