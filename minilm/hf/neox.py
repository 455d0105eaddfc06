"""GPT-NeoX / Pythia (``gpt_neox``) both ways: ``query_key_value`` interleaves (head,
q|k|v, dim) and is regrouped; ``use_parallel_residual`` is ``parallel_residual``; partial
rotary is ``rotary_fraction``; ``embed_out`` is the untied head. minilm's ``rope`` models
that are not Llama-style (layernorm, gelu or gelu_tanh, full attention heads; sequential or
parallel residual) are written as GPT-NeoX."""

from __future__ import annotations

from minilm.hf.family import (
    HF_ACTIVATION,
    Family,
    Weights,
    activation,
    put_linear,
    refuse,
    require,
    take_head,
    take_norm,
)
from minilm.hf.llama import llama_style
from minilm.hf.rope import rope_parameters, rope_position

LINEARS = (
    ("attention.dense", "attn.proj"),
    ("mlp.dense_h_to_4h", "mlp.fc"),
    ("mlp.dense_4h_to_h", "mlp.proj"),
)  # (NeoX name, minilm name)
BUFFERS = (".attention.bias", ".attention.masked_bias", "rotary_emb.inv_freq")  # mask and rotary table of older files


def read_config(hf: dict, path: str) -> dict:
    if not hf.get("attention_bias", True):
        refuse(path, "GPT-NeoX without attention biases is not supported (its MLP and norms keep theirs)")
    return dict(
        vocab_size=hf["vocab_size"],
        n_layer=hf["num_hidden_layers"],
        n_head=hf["num_attention_heads"],
        d_model=hf["hidden_size"],
        block_size=hf["max_position_embeddings"],
        d_ff=hf["intermediate_size"],
        bias=True,
        mlp=activation(hf, "hidden_act", path),
        norm="layernorm",
        norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
        parallel_residual=hf.get("use_parallel_residual", True),
        tie_embeddings=hf.get("tie_word_embeddings", False),
        position=rope_position(hf, path, fraction=0.25),  # transformers' GPTNeoXConfig: a quarter of the head
        embedding_scale=1.0,
    )


def read_weights(tensors: dict, model: dict, hf: dict) -> dict:
    w = Weights(tensors, "gpt_neox.")
    heads, width = model["n_head"], model["d_model"]
    out = {"wte.weight": w.take("embed_in.weight")}
    for i in range(model["n_layer"]):
        h, b = f"layers.{i}", f"blocks.{i}"
        take_norm(out, w, f"{h}.input_layernorm", f"{b}.ln_1")
        take_norm(out, w, f"{h}.post_attention_layernorm", f"{b}.ln_2")
        qkv = w.take(f"{h}.attention.query_key_value.weight")  # rows: (head, q|k|v, dim)
        out[f"{b}.attn.qkv.weight"] = qkv.view(heads, 3, -1, width).transpose(0, 1).reshape(3 * width, width)
        bias = w.take(f"{h}.attention.query_key_value.bias")
        out[f"{b}.attn.qkv.bias"] = bias.view(heads, 3, -1).transpose(0, 1).reshape(3 * width)
        for source, target in LINEARS:
            take_norm(out, w, f"{h}.{source}", f"{b}.{target}")
    take_norm(out, w, "final_layer_norm", "ln_f")
    head = "embed_out.weight" if w.has("embed_out.weight") else "lm_head.weight"  # older / newer name
    return w.done(take_head(out, w, model["tie_embeddings"], head))


def write(m, sd: dict) -> tuple:
    require(
        m.norm == "layernorm" and m.mlp in HF_ACTIVATION,
        "GPT-NeoX",
        f"norm={m.norm}, mlp={m.mlp}; GPT-NeoX has layernorm and gelu / gelu_tanh (Llama: rmsnorm, swiglu, no bias)",
    )
    require(m.n_kv_head in (None, m.n_head) and not m.qkv_bias, "GPT-NeoX", "it has neither GQA nor q/k/v-only bias")
    params, positions = rope_parameters(m)
    heads, width = m.n_head, m.d_model
    out = {"gpt_neox.embed_in.weight": sd["wte.weight"]}
    for i in range(m.n_layer):
        b, h = f"blocks.{i}", f"gpt_neox.layers.{i}"
        put_linear(sd, out, f"{b}.ln_1", f"{h}.input_layernorm", True)
        put_linear(sd, out, f"{b}.ln_2", f"{h}.post_attention_layernorm", True)
        key = f"{h}.attention.query_key_value"  # minilm (q|k|v, head, dim) -> NeoX (head, q|k|v, dim)
        put_linear(sd, out, f"{b}.attn.qkv", key, True)
        out[f"{key}.weight"] = out[f"{key}.weight"].view(3, heads, -1, width).transpose(0, 1).reshape(3 * width, width)
        out[f"{key}.bias"] = out[f"{key}.bias"].view(3, heads, -1).transpose(0, 1).reshape(3 * width)
        for target, source in LINEARS:
            put_linear(sd, out, f"{b}.{source}", f"{h}.{target}", True)
    put_linear(sd, out, "ln_f", "gpt_neox.final_layer_norm", True)
    if not m.tie_embeddings:
        out["embed_out.weight"] = sd["lm_head.weight"]
    config = dict(
        architectures=["GPTNeoXForCausalLM"],
        model_type="gpt_neox",
        vocab_size=m.vocab_size,
        hidden_size=width,
        num_hidden_layers=m.n_layer,
        num_attention_heads=heads,
        intermediate_size=m.d_ff,
        hidden_act=HF_ACTIVATION[m.mlp],
        max_position_embeddings=positions,
        layer_norm_eps=m.norm_eps,
        use_parallel_residual=m.parallel_residual,
        attention_bias=True,
        tie_word_embeddings=m.tie_embeddings,
        rope_parameters=params,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    return "gpt_neox", config, out


NEOX = Family(
    name="GPT-NeoX",
    model_types=("gpt_neox",),
    read_config=read_config,
    read_weights=read_weights,
    exports=lambda m: m.position["kind"] == "rope" and not llama_style(m),
    write=write,
    partial_rotary=True,
    handles=frozenset(
        {"d_ff", "bias", "norm", "norm_eps", "mlp", "parallel_residual", "tie_embeddings", "n_kv_head", "qkv_bias"}
    ),
    buffers=BUFFERS,
)
