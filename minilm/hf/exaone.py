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

import torch

from minilm.hf.family import Family, Weights, refuse, require, take_head
from minilm.hf.rope import rope_parameters, rope_position
from minilm.positions.layers import layer_types

TYPES = ("sliding_attention", "full_attention")
NOPE = {"kind": "none"}


def read_config(hf: dict, path: str) -> dict:
    width, heads = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("hidden_act", "silu") != "silu":
        refuse(path, f"hidden_act={hf.get('hidden_act')!r} is not supported for exaone4; supported: silu")
    return dict(
        vocab_size=hf["vocab_size"],
        n_layer=hf["num_hidden_layers"],
        n_head=heads,
        d_model=width,
        block_size=hf["max_position_embeddings"],
        d_ff=hf["intermediate_size"],
        bias=False,
        head_dim=hf.get("head_dim") or width // heads,
        qk_norm=True,
        sublayer_norms="post",
        mlp="swiglu",
        norm="rmsnorm",
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        n_kv_head=hf.get("num_key_value_heads") or heads,
        tie_embeddings=hf.get("tie_word_embeddings", False),
        position=rope_position(hf, path),
        embedding_scale=1.0,
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
    if len(types) != n or any(t not in TYPES for t in types):
        refuse(path, f"layer_types={types!r} is not supported: expected {n} of sliding_attention, full_attention")
    names = ["local" if t == "sliding_attention" else "global" for t in types]
    layers = {"pattern": names}
    for name in dict.fromkeys(names):
        layers[name] = {"window": window} if name == "local" else {"position": dict(NOPE)}
    return layers


def read_weights(tensors: dict, model: dict, hf: dict) -> dict:
    w = Weights(tensors, "model.", ignore=("rotary_emb.inv_freq",))
    out = {"wte.weight": w.take("embed_tokens.weight")}
    for i in range(model["n_layer"]):
        h, b = f"layers.{i}", f"blocks.{i}"
        out[f"{b}.post_attn_norm.weight"] = w.take(f"{h}.post_attention_layernorm.weight")
        out[f"{b}.post_mlp_norm.weight"] = w.take(f"{h}.post_feedforward_layernorm.weight")
        out[f"{b}.attn.qkv.weight"] = torch.cat([w.take(f"{h}.self_attn.{p}_proj.weight") for p in "qkv"])
        for name in ("q_norm", "k_norm"):
            out[f"{b}.attn.{name}.weight"] = w.take(f"{h}.self_attn.{name}.weight")
        out[f"{b}.attn.proj.weight"] = w.take(f"{h}.self_attn.o_proj.weight")
        out[f"{b}.mlp.fc.weight"] = torch.cat([w.take(f"{h}.mlp.{p}_proj.weight") for p in ("gate", "up")])
        out[f"{b}.mlp.proj.weight"] = w.take(f"{h}.mlp.down_proj.weight")
    out["ln_f.weight"] = w.take("norm.weight")
    return w.done(take_head(out, w, model["tie_embeddings"], "lm_head.weight"))


def exaone_style(m) -> bool:
    return (
        m.sublayer_norms == "post"
        and m.qk_norm
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


def write(m, sd: dict) -> tuple:
    params, positions = rope_parameters(m)
    kv = m.n_kv_head or m.n_head
    sizes = [m.n_head * m.head_dim, kv * m.head_dim, kv * m.head_dim]
    out = {"model.embed_tokens.weight": sd["wte.weight"]}
    for i in range(m.n_layer):
        b, h = f"blocks.{i}", f"model.layers.{i}"
        out[f"{h}.post_attention_layernorm.weight"] = sd[f"{b}.post_attn_norm.weight"]
        out[f"{h}.post_feedforward_layernorm.weight"] = sd[f"{b}.post_mlp_norm.weight"]
        for name, part in zip("qkv", sd[f"{b}.attn.qkv.weight"].split(sizes)):
            out[f"{h}.self_attn.{name}_proj.weight"] = part
        for name in ("q_norm", "k_norm"):
            out[f"{h}.self_attn.{name}.weight"] = sd[f"{b}.attn.{name}.weight"]
        out[f"{h}.self_attn.o_proj.weight"] = sd[f"{b}.attn.proj.weight"]
        gate, up = sd[f"{b}.mlp.fc.weight"].chunk(2)
        out[f"{h}.mlp.gate_proj.weight"], out[f"{h}.mlp.up_proj.weight"] = gate, up
        out[f"{h}.mlp.down_proj.weight"] = sd[f"{b}.mlp.proj.weight"]
    out["model.norm.weight"] = sd["ln_f.weight"]
    if not m.tie_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    config = dict(
        architectures=["Exaone4ForCausalLM"],
        model_type="exaone4",
        vocab_size=m.vocab_size,
        hidden_size=m.d_model,
        intermediate_size=m.d_ff,
        num_hidden_layers=m.n_layer,
        num_attention_heads=m.n_head,
        num_key_value_heads=kv,
        head_dim=m.head_dim,
        hidden_act="silu",
        max_position_embeddings=positions,
        rms_norm_eps=m.norm_eps,
        tie_word_embeddings=m.tie_embeddings,
        rope_parameters=params,
        attention_dropout=0.0,
        pad_token_id=None,
    )
    config.update(write_layers(m))
    return "exaone4", config, out


EXAONE = Family(
    name="EXAONE 4",
    model_types=("exaone4",),
    read_config=read_config,
    read_weights=read_weights,
    exports=exaone_style,
    write=write,
    handles=frozenset(
        {
            "d_ff",
            "bias",
            "norm",
            "norm_eps",
            "mlp",
            "parallel_residual",
            "tie_embeddings",
            "n_kv_head",
            "qk_norm",
            "head_dim",
            "layers",
            "sublayer_norms",
        }
    ),
)
