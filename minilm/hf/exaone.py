"""The EXAONE 4 family both ways (``exaone4``), as transformers 5.24 computes it: a Llama block
with its norms after each sublayer only (``sublayer_norms: post``: ``post_attention_layernorm``,
``post_feedforward_layernorm``, no input norms), an RMSNorm on each head's q and k (``qk_norm``),
SwiGLU and grouped-query attention.

Positions per layer: with a ``sliding_window``, the ``sliding_attention`` layers of ``layer_types``
(by default every layer but each ``sliding_window_pattern``-th: 3 local, 1 global) attend within the
window with RoPE and the ``full_attention`` layers attend to everything with no positions at all
(global NoPE); without one, every layer is full attention with RoPE, as transformers' attention decides
it (whose cache cannot be made for a sliding layer without a window). A pattern written as text
(``"LLLG"``) with no ``layer_types`` is refused, as transformers cannot build it either.
"""

from __future__ import annotations

from minilm.hf.family import (
    LAYER_TYPES,
    LLAMA_LAYOUT,
    NOPE,
    ROTARY,
    Family,
    Weights,
    llama_config,
    llama_shape,
    put_projections,
    refuse,
    require,
    take_head,
    take_projections,
)
from minilm.hf.rope import rope_parameters, rope_position
from minilm.positions.layers import layer_types


def read_config(hf: dict, path: str) -> dict:
    if hf.get("hidden_act", "silu") != "silu":
        refuse(path, f"hidden_act={hf.get('hidden_act')!r} is not supported for exaone4; supported: silu")
    return dict(
        llama_shape(hf, path, 1e-5),
        qk_norm=True,
        sublayer_norms="post",
        mlp="swiglu",
        tie_embeddings=hf.get("tie_word_embeddings", False),
        position=rope_position(hf, path),
        layers=read_layers(hf, path),
    )


def read_layers(hf: dict, path: str):
    """``model.layers`` of a config: local RoPE layers in a window and global NoPE ones, or None."""
    n, window = hf["num_hidden_layers"], hf.get("sliding_window", 4096)
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        refuse(path, f"sliding_window={window!r} is invalid: expected a number of keys >= 1 or null")
    types = hf.get("layer_types")
    if types is None:
        every = hf.get("sliding_window_pattern", 4)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            refuse(path, f"sliding_window_pattern={every!r} without layer_types: expected a number of layers >= 1")
        types = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    if len(types) != n or any(t not in LAYER_TYPES for t in types):
        refuse(path, f"layer_types={types!r} is not supported: expected {n} of sliding_attention, full_attention")
    names = ["local" if t == "sliding_attention" else "global" for t in types]
    layers = {"pattern": names}
    for name in dict.fromkeys(names):
        layers[name] = {"window": window} if name == "local" else {"position": dict(NOPE)}
    return layers


def read_weights(tensors: dict, model: dict, hf: dict) -> dict:
    """minilm's state dict of EXAONE 4's tensors, or OLMo 3's (the same names, q/k norms of their own widths)."""
    w = Weights(tensors, "model.")
    out = {"wte.weight": w.take("embed_tokens.weight")}
    for i in range(model["n_layer"]):
        h, b = f"layers.{i}", f"blocks.{i}"
        out[f"{b}.post_attn_norm.weight"] = w.take(f"{h}.post_attention_layernorm.weight")
        out[f"{b}.post_mlp_norm.weight"] = w.take(f"{h}.post_feedforward_layernorm.weight")
        take_projections(out, w, h, b)
        for name in ("q_norm", "k_norm"):
            out[f"{b}.attn.{name}.weight"] = w.take(f"{h}.self_attn.{name}.weight")
    out["ln_f.weight"] = w.take("norm.weight")
    return w.done(take_head(out, w, model["tie_embeddings"], "lm_head.weight"))


def post_norm_style(m, span: str) -> bool:
    """A Llama-layout rope model with norms after each sublayer only and q/k norms over ``span``:
    EXAONE 4's (each head) or OLMo 3's (the whole projection)."""
    return (
        m.sublayer_norms == "post"
        and m.qk_norm
        and m.qk_norm_span == span
        and m.mlp == "swiglu"
        and m.norm == "rmsnorm"
        and not m.bias
        and not m.qkv_bias
        and not m.parallel_residual
        and m.position["kind"] == "rope"
    )


def write_layers(m) -> dict:
    """layer_types and sliding_window: local layers of one window with ``model.position``, global ones
    without positions (or no ``model.layers``: every layer full attention with RoPE)."""
    if m.layers is None:
        return {"sliding_window": None, "layer_types": ["full_attention"] * m.n_layer}
    types = layer_types(m.layers, m.position, m.n_layer)
    windows = {t.window for t in types if t.window is not None}
    require(
        len(windows) == 1
        and all(not (t.chunk or t.sinks or t.softcap or t.query_scale) for t in types)
        and all(t.position == (m.position if t.window is not None else NOPE) for t in types),
        "EXAONE 4",
        "its model.layers is more than local layers of one window with model.position beside global layers "
        "without positions ({kind: none}), the one design EXAONE 4 holds",
    )
    kinds = ["sliding_attention" if t.window is not None else "full_attention" for t in types]
    return {"sliding_window": windows.pop(), "layer_types": kinds}


def post_norm_tensors(m, sd: dict) -> dict:
    """The HF tensors of a minilm model with norms after each sublayer and q/k norms (EXAONE 4, OLMo 3:
    the same names): ``read_weights`` the other way."""
    out = {"model.embed_tokens.weight": sd["wte.weight"]}
    for i in range(m.n_layer):
        b, h = f"blocks.{i}", f"model.layers.{i}"
        out[f"{h}.post_attention_layernorm.weight"] = sd[f"{b}.post_attn_norm.weight"]
        out[f"{h}.post_feedforward_layernorm.weight"] = sd[f"{b}.post_mlp_norm.weight"]
        put_projections(out, sd, b, h, m)
        for name in ("q_norm", "k_norm"):
            out[f"{h}.self_attn.{name}.weight"] = sd[f"{b}.attn.{name}.weight"]
    out["model.norm.weight"] = sd["ln_f.weight"]
    if not m.tie_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    return out


def write(m, sd: dict) -> tuple:
    out = post_norm_tensors(m, sd)
    config = dict(
        llama_config(m, *rope_parameters(m)),
        architectures=["Exaone4ForCausalLM"],
        model_type="exaone4",
        hidden_act="silu",
        pad_token_id=None,
    )
    config.update(write_layers(m))
    return "exaone4", config, out


EXAONE = Family(
    name="EXAONE 4",
    model_types=("exaone4",),
    read_config=read_config,
    read_weights=read_weights,
    exports=lambda m: post_norm_style(m, "head"),
    write=write,
    handles=LLAMA_LAYOUT | {"qk_norm", "layers", "sublayer_norms"},
    buffers=ROTARY,
)
