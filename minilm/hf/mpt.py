"""MPT (export only): minilm's ``alibi`` models are written as MPT (tied head, layernorm
without biases, gelu, d_ff = 4 d_model), whose ALiBi slopes for ``alibi_bias_max=8`` are the
ALiBi paper's (Press et al. 2022) that minilm uses; a head count where they differ is refused."""
from __future__ import annotations

import torch

from minilm.hf.family import Family, require, require_classic_layout
from minilm.positions.alibi import alibi_slopes


def mpt_slopes(n_head: int) -> torch.Tensor:
    """MPT's slopes (``alibi_bias_max=8``), in its order for a head count that is not a power of two."""
    padded = 2 ** (n_head - 1).bit_length()
    slopes = 2.0 ** (-torch.arange(1, padded + 1) * 8.0 / padded)
    if padded != n_head:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:n_head]
    return slopes


def write(m, sd: dict) -> tuple:
    require_classic_layout(m, "MPT")
    require(m.mlp == "gelu" and m.d_ff == 4 * m.d_model and not m.bias, "MPT",
            f"it has gelu, d_ff = 4 d_model and no biases (mlp={m.mlp}, d_ff={m.d_ff}, bias={m.bias})")
    ours = torch.tensor(alibi_slopes(m.n_head), dtype=torch.float64)
    require(torch.allclose(mpt_slopes(m.n_head).double(), ours, rtol=1e-6),
            "MPT", f"MPT's slopes for {m.n_head} heads differ from the ALiBi paper's that minilm uses")
    out = {"transformer.wte.weight": sd["wte.weight"]}
    for i in range(m.n_layer):
        b, h = f"blocks.{i}", f"transformer.blocks.{i}"
        out[f"{h}.norm_1.weight"], out[f"{h}.norm_2.weight"] = sd[f"{b}.ln_1.weight"], sd[f"{b}.ln_2.weight"]
        out[f"{h}.attn.Wqkv.weight"] = sd[f"{b}.attn.qkv.weight"]
        out[f"{h}.attn.out_proj.weight"] = sd[f"{b}.attn.proj.weight"]
        out[f"{h}.ffn.up_proj.weight"] = sd[f"{b}.mlp.fc.weight"]
        out[f"{h}.ffn.down_proj.weight"] = sd[f"{b}.mlp.proj.weight"]
    out["transformer.norm_f.weight"] = sd["ln_f.weight"]
    config = dict(architectures=["MptForCausalLM"], model_type="mpt", d_model=m.d_model, n_heads=m.n_head,
                  n_layers=m.n_layer, expansion_ratio=4, max_seq_len=m.block_size, vocab_size=m.vocab_size,
                  layer_norm_epsilon=m.norm_eps, no_bias=True, learned_pos_emb=False, resid_pdrop=0.0,
                  emb_pdrop=0.0, tie_word_embeddings=True,
                  attn_config={"alibi": True, "alibi_bias_max": 8, "attn_pdrop": 0})
    return "mpt", config, out


MPT = Family(name="MPT", model_types=(), exports=lambda m: m.position["kind"] == "alibi", write=write,
             handles=frozenset({"d_ff", "bias", "norm", "norm_eps", "mlp", "parallel_residual", "tie_embeddings",
                                "n_kv_head", "qkv_bias"}))
