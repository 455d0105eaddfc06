"""MPT (``mpt``) both ways: minilm's ``alibi`` models are written as MPT (layernorm without
biases, gelu, d_ff = 4 d_model, the head tied or not), whose ALiBi slopes for
``alibi_bias_max=8`` are the ALiBi paper's (Press et al. 2022) that minilm uses; a head count
where they differ is refused. Reading takes what transformers' MPT computes: ALiBi always,
no position embeddings, no biases, an MLP 4 d_model wide; a config whose attention
transformers changes in ways minilm does not (``clip_qkv``, a ``softmax_scale``, another
``alibi_bias_max``) is refused."""

from __future__ import annotations

import torch

from minilm.common import shown
from minilm.hf.family import Family, Weights, count, refuse, require, require_classic_layout, take_head
from minilm.positions.alibi import alibi_slopes

ATTENTION_DEFAULTS = {"clip_qkv": None, "softmax_scale": None, "alibi_bias_max": 8}  # what minilm's attention is


def mpt_slopes(n_head: int) -> torch.Tensor:
    """MPT's slopes (``alibi_bias_max=8``), in its order for a head count that is not a power of two."""
    padded = 2 ** (n_head - 1).bit_length()
    slopes = 2.0 ** (-torch.arange(1, padded + 1) * 8.0 / padded)
    if padded != n_head:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:n_head]
    return slopes


def read_config(hf: dict, path: str) -> dict:
    attention = hf.get("attn_config")
    if attention is None:
        attention = {}
    if not isinstance(attention, dict):
        refuse(
            path,
            f"attn_config={shown(attention)} is invalid: expected a mapping of MPT's attention settings "
            f'(e.g. {{"alibi": true}}) or none',
        )
    odd = {k: attention[k] for k, v in ATTENTION_DEFAULTS.items() if attention.get(k, v) != v}
    if odd:
        refuse(
            path,
            f"MPT attention settings {odd} are not supported; minilm's has "
            f"{', '.join(f'{k}={v}' for k, v in ATTENTION_DEFAULTS.items())}",
        )
    if hf.get("expansion_ratio", 4) != 4:
        refuse(path, f"expansion_ratio={hf['expansion_ratio']} is not supported: transformers' MPT is 4 d_model wide")
    heads = count(hf, "n_heads", path)
    if not torch.allclose(mpt_slopes(heads).double(), torch.tensor(alibi_slopes(heads), dtype=torch.float64)):
        refuse(
            path,
            f"n_heads={heads}: MPT's ALiBi slopes for {heads} heads differ from the ALiBi paper's that "
            f"minilm uses (a power of two is the same)",
        )
    width = hf["d_model"]
    return dict(
        vocab_size=hf["vocab_size"],
        n_layer=hf["n_layers"],
        n_head=heads,
        d_model=width,
        block_size=hf["max_seq_len"],
        d_ff=4 * width,
        bias=False,
        mlp="gelu",
        norm="layernorm",
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        tie_embeddings=hf.get("tie_word_embeddings", True),
        position={"kind": "alibi"},
        embedding_scale=1.0,
    )


def read_weights(tensors: dict, model: dict, hf: dict) -> dict:
    w = Weights(tensors, "transformer.")
    out = {"wte.weight": w.take("wte.weight")}
    for i in range(model["n_layer"]):
        b = f"blocks.{i}"  # the same block names in both
        for source, target in (
            ("norm_1", "ln_1"),
            ("norm_2", "ln_2"),
            ("attn.Wqkv", "attn.qkv"),
            ("attn.out_proj", "attn.proj"),
            ("ffn.up_proj", "mlp.fc"),
            ("ffn.down_proj", "mlp.proj"),
        ):
            out[f"{b}.{target}.weight"] = w.take(f"{b}.{source}.weight")
    out["ln_f.weight"] = w.take("norm_f.weight")
    return w.done(take_head(out, w, model["tie_embeddings"], "lm_head.weight"))


def write(m, sd: dict) -> tuple:
    require_classic_layout(m, "MPT", tied=False)
    require(
        m.mlp == "gelu" and m.d_ff == 4 * m.d_model and not m.bias,
        "MPT",
        f"it has gelu, d_ff = 4 d_model and no biases (mlp={m.mlp}, d_ff={m.d_ff}, bias={m.bias})",
    )
    ours = torch.tensor(alibi_slopes(m.n_head), dtype=torch.float64)
    require(
        torch.allclose(mpt_slopes(m.n_head).double(), ours, rtol=1e-6),
        "MPT",
        f"MPT's slopes for {m.n_head} heads differ from the ALiBi paper's that minilm uses",
    )
    out = {"transformer.wte.weight": sd["wte.weight"]}
    for i in range(m.n_layer):
        b, h = f"blocks.{i}", f"transformer.blocks.{i}"
        out[f"{h}.norm_1.weight"], out[f"{h}.norm_2.weight"] = sd[f"{b}.ln_1.weight"], sd[f"{b}.ln_2.weight"]
        out[f"{h}.attn.Wqkv.weight"] = sd[f"{b}.attn.qkv.weight"]
        out[f"{h}.attn.out_proj.weight"] = sd[f"{b}.attn.proj.weight"]
        out[f"{h}.ffn.up_proj.weight"] = sd[f"{b}.mlp.fc.weight"]
        out[f"{h}.ffn.down_proj.weight"] = sd[f"{b}.mlp.proj.weight"]
    out["transformer.norm_f.weight"] = sd["ln_f.weight"]
    if not m.tie_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    config = dict(
        architectures=["MptForCausalLM"],
        model_type="mpt",
        d_model=m.d_model,
        n_heads=m.n_head,
        n_layers=m.n_layer,
        expansion_ratio=4,
        max_seq_len=m.block_size,
        vocab_size=m.vocab_size,
        layer_norm_epsilon=m.norm_eps,
        no_bias=True,
        learned_pos_emb=False,
        resid_pdrop=0.0,
        emb_pdrop=0.0,
        tie_word_embeddings=m.tie_embeddings,
        attn_config={"alibi": True, "alibi_bias_max": 8, "attn_pdrop": 0},
    )
    return "mpt", config, out


MPT = Family(
    name="MPT",
    model_types=("mpt",),
    read_config=read_config,
    read_weights=read_weights,
    exports=lambda m: m.position["kind"] == "alibi",
    write=write,
    handles=frozenset(
        {"d_ff", "bias", "norm", "norm_eps", "mlp", "parallel_residual", "tie_embeddings", "n_kv_head", "qkv_bias"}
    ),
)
