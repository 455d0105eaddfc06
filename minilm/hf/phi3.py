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

from minilm.hf.family import Family, Weights, refuse, require, take_head, take_norm
from minilm.hf.llama import llama_style
from minilm.hf.rope import rope_parameters, rope_position


def read_config(hf: dict, path: str) -> dict:
    width, heads = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("hidden_act", "silu") != "silu":
        refuse(path, f"hidden_act={hf.get('hidden_act')!r} is not supported for phi3; supported: silu")
    window, longest = hf.get("sliding_window"), hf["max_position_embeddings"]
    if window and window < longest:
        refuse(path, f"sliding_window={window} is not supported (a window of at least max_position_embeddings="
                     f"{longest}, or none, is)")
    position = rope_position(hf, path)
    if (position["scaling"] or {}).get("type") == "longrope":  # Phi-3's generate recomputes its cache past L
        position["scaling"]["switch"] = "refill"
    return dict(vocab_size=hf["vocab_size"], n_layer=hf["num_hidden_layers"], n_head=heads, d_model=width,
                block_size=longest, d_ff=hf["intermediate_size"], bias=False, head_dim=hf.get("head_dim") or width // heads,
                mlp="swiglu", norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
                n_kv_head=hf.get("num_key_value_heads") or heads, tie_embeddings=hf.get("tie_word_embeddings", False),
                position=position, embedding_scale=1.0)


def read_weights(tensors: dict, model: dict) -> dict:
    w = Weights(tensors, "model.", ignore=("rotary_emb.inv_freq",))
    out = {"wte.weight": w.take("embed_tokens.weight")}
    for i in range(model["n_layer"]):
        h, b = f"layers.{i}", f"blocks.{i}"
        take_norm(out, w, f"{h}.input_layernorm", f"{b}.ln_1", bias=False)
        take_norm(out, w, f"{h}.post_attention_layernorm", f"{b}.ln_2", bias=False)
        out[f"{b}.attn.qkv.weight"] = w.take(f"{h}.self_attn.qkv_proj.weight")  # [q; k; v], as minilm's
        out[f"{b}.attn.proj.weight"] = w.take(f"{h}.self_attn.o_proj.weight")
        out[f"{b}.mlp.fc.weight"] = w.take(f"{h}.mlp.gate_up_proj.weight")  # [gate; up], as minilm's
        out[f"{b}.mlp.proj.weight"] = w.take(f"{h}.mlp.down_proj.weight")
    take_norm(out, w, "norm", "ln_f", bias=False)
    return w.done(take_head(out, w, model["tie_embeddings"], "lm_head.weight"))


def write(m, sd: dict) -> tuple:
    require(not m.qkv_bias and not m.qk_norm, "Phi-3", f"it has neither q/k/v biases nor q/k norms "
                                                       f"(qkv_bias={m.qkv_bias}, qk_norm={m.qk_norm})")
    params, positions = rope_parameters(m)
    out = {"model.embed_tokens.weight": sd["wte.weight"]}
    for i in range(m.n_layer):
        b, h = f"blocks.{i}", f"model.layers.{i}"
        out[f"{h}.input_layernorm.weight"] = sd[f"{b}.ln_1.weight"]
        out[f"{h}.post_attention_layernorm.weight"] = sd[f"{b}.ln_2.weight"]
        out[f"{h}.self_attn.qkv_proj.weight"] = sd[f"{b}.attn.qkv.weight"]
        out[f"{h}.self_attn.o_proj.weight"] = sd[f"{b}.attn.proj.weight"]
        out[f"{h}.mlp.gate_up_proj.weight"] = sd[f"{b}.mlp.fc.weight"]
        out[f"{h}.mlp.down_proj.weight"] = sd[f"{b}.mlp.proj.weight"]
    out["model.norm.weight"] = sd["ln_f.weight"]
    if not m.tie_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    original = params.get("original_max_position_embeddings", positions)
    config = dict(architectures=["Phi3ForCausalLM"], model_type="phi3", vocab_size=m.vocab_size,
                  hidden_size=m.d_model, intermediate_size=m.d_ff, num_hidden_layers=m.n_layer,
                  num_attention_heads=m.n_head, num_key_value_heads=m.n_kv_head or m.n_head, head_dim=m.head_dim,
                  hidden_act="silu", max_position_embeddings=positions, original_max_position_embeddings=original,
                  rms_norm_eps=m.norm_eps, tie_word_embeddings=m.tie_embeddings, rope_parameters=params,
                  partial_rotary_factor=params["partial_rotary_factor"], attention_dropout=0.0, resid_pdrop=0.0,
                  embd_pdrop=0.0, sliding_window=None, pad_token_id=None)
    return "phi3", config, out


PHI3 = Family(name="Phi-3", model_types=("phi3",), read_config=read_config, read_weights=read_weights,
              exports=lambda m: m.position["kind"] == "rope" and llama_style(m) and not (m.qkv_bias or m.qk_norm),
              write=write, handles=frozenset({"d_ff", "bias", "norm", "norm_eps", "mlp", "parallel_residual",
                                              "tie_embeddings", "n_kv_head", "qkv_bias", "qk_norm", "head_dim"}))
