"""GPT-2 (``gpt2``) both ways: Conv1D weights are stored (in, out) and are transposed;
``wpe`` is the learned position table; gelu_new is ``mlp: gelu_tanh``. minilm's ``learned``
models are written as GPT-2 (tied head, layernorm, gelu or gelu_tanh)."""

from __future__ import annotations

from minilm.hf.family import (
    HF_ACTIVATION,
    Family,
    Weights,
    activation,
    count,
    put_linear,
    refuse,
    require,
    require_classic_layout,
    take_head,
    take_norm,
)

CONV1D = (
    ("attn.c_attn", "attn.qkv"),
    ("attn.c_proj", "attn.proj"),
    ("mlp.c_fc", "mlp.fc"),
    ("mlp.c_proj", "mlp.proj"),
)  # (GPT-2 name, minilm name)
MASKS = (".attn.bias", ".attn.masked_bias")  # the causal mask older files keep beside the weights


def read_config(hf: dict, path: str) -> dict:
    if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("scale_attn_weights") is False:
        refuse(path, "GPT-2 attention scaling other than 1/sqrt(head_dim) is not supported")
    width = count(hf, "n_embd", path)
    return dict(
        vocab_size=hf["vocab_size"],
        n_layer=hf["n_layer"],
        n_head=hf["n_head"],
        d_model=width,
        block_size=hf["n_positions"],
        d_ff=count(hf, "n_inner", path, 4 * width, absent="4 n_embd"),
        bias=True,
        mlp=activation(hf, "activation_function", path),
        norm="layernorm",
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        tie_embeddings=hf.get("tie_word_embeddings", True),
        position={"kind": "learned", "max_positions": hf["n_positions"]},
        embedding_scale=1.0,
    )


def read_weights(tensors: dict, model: dict, hf: dict) -> dict:
    w = Weights(tensors, "transformer.")
    out = {"wte.weight": w.take("wte.weight"), "positions.table.weight": w.take("wpe.weight")}
    for i in range(model["n_layer"]):
        h, b = f"h.{i}", f"blocks.{i}"
        take_norm(out, w, f"{h}.ln_1", f"{b}.ln_1")
        take_norm(out, w, f"{h}.ln_2", f"{b}.ln_2")
        for source, target in CONV1D:
            out[f"{b}.{target}.weight"] = w.take(f"{h}.{source}.weight").t().contiguous()  # Conv1D: (in, out)
            out[f"{b}.{target}.bias"] = w.take(f"{h}.{source}.bias")
    take_norm(out, w, "ln_f", "ln_f")
    return w.done(take_head(out, w, model["tie_embeddings"], "lm_head.weight"))


def write(m, sd: dict) -> tuple:
    require_classic_layout(m, "GPT-2")
    require(m.mlp in HF_ACTIVATION, "GPT-2", f"mlp={m.mlp}; it has gelu or gelu_tanh")
    rows = sd["positions.table.weight"].shape[0]
    out = {"transformer.wte.weight": sd["wte.weight"], "transformer.wpe.weight": sd["positions.table.weight"]}
    for i in range(m.n_layer):
        b, h = f"blocks.{i}", f"transformer.h.{i}"
        put_linear(sd, out, f"{b}.ln_1", f"{h}.ln_1", True)
        put_linear(sd, out, f"{b}.ln_2", f"{h}.ln_2", True)
        for target, source in CONV1D:
            put_linear(sd, out, f"{b}.{source}", f"{h}.{target}", True, transpose=True)  # Conv1D: (in, out)
    put_linear(sd, out, "ln_f", "transformer.ln_f", True)
    config = dict(
        architectures=["GPT2LMHeadModel"],
        model_type="gpt2",
        vocab_size=m.vocab_size,
        n_positions=rows,
        n_embd=m.d_model,
        n_layer=m.n_layer,
        n_head=m.n_head,
        n_inner=m.d_ff,
        activation_function=HF_ACTIVATION[m.mlp],
        layer_norm_epsilon=m.norm_eps,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
    )
    return "gpt2", config, out


GPT2 = Family(
    name="GPT-2",
    model_types=("gpt2",),
    read_config=read_config,
    read_weights=read_weights,
    exports=lambda m: m.position["kind"] == "learned",
    write=write,
    handles=frozenset(
        {"d_ff", "bias", "norm", "norm_eps", "mlp", "parallel_residual", "tie_embeddings", "n_kv_head", "qkv_bias"}
    ),
    buffers=MASKS,
)
