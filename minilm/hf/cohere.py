"""The Cohere2 family in (``cohere2``: Command R7B, Command A), as transformers 5.24 computes it:
one LayerNorm without bias before a parallel block (attention and the SwiGLU MLP read the same
normalised input and both add to the residual), grouped-query attention, tied embeddings, and the
logits multiplied by ``logit_scale``.

Positions per layer: the ``sliding_attention`` layers of ``layer_types`` (by default every layer but
each ``sliding_window_pattern``-th: 3 local, 1 global) attend within ``sliding_window`` with RoPE and
the ``full_attention`` layers attend to everything with no positions at all (global NoPE). A config
with ``sliding_window: null`` is refused, as transformers' Cohere2 cannot run one either.

How it lands in minilm's layout, exactly and with no option of its own:
* the shared input norm is both of minilm's (``ln_1`` and ``ln_2``, the same weights; a fine-tune
  may move them apart, which the import does not mind);
* Cohere's RoPE turns interleaved pairs (2i, 2i+1) of each head where minilm turns (i, i + d/2) at
  the same frequency: the rows of each head's q and k projections are reordered so that the pairs
  land where minilm turns them (q . k is unchanged by one reordering of both);
* ``logit_scale`` multiplies the final norm's weight (the head is linear and the norm has no bias).

Import only: a minilm model is not written back as Cohere2 (export as Llama or Qwen3 instead).
"""

from __future__ import annotations

import torch

from minilm.hf.exaone import read_layers
from minilm.hf.family import ROTARY, Family, Weights, llama_shape, refuse, take_head
from minilm.hf.rope import rope_position


def read_config(hf: dict, path: str) -> dict:
    if hf.get("hidden_act", "silu") != "silu":
        refuse(path, f"hidden_act={hf.get('hidden_act')!r} is not supported for cohere2; supported: silu")
    if hf.get("attention_bias"):
        refuse(path, "attention_bias=true is not supported for Cohere2 (a bias on o_proj has no minilm place)")
    if "sliding_window" in hf and hf["sliding_window"] is None:
        refuse(path, "sliding_window=null is not supported for cohere2 (transformers' Cohere2 cannot run without one)")
    return dict(
        llama_shape(hf, path, 1e-5),
        norm="layernorm",
        norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
        parallel_residual=True,
        mlp="swiglu",
        tie_embeddings=hf.get("tie_word_embeddings", True),
        position=rope_position(hf, path),
        layers=read_layers(hf, path),
    )


def pairs_to_halves(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """A q or k projection's rows, each head's interleaved pairs (2i, 2i+1) moved to (i, i + d/2)."""
    heads = weight.view(-1, head_dim // 2, 2, weight.shape[-1])
    return heads.transpose(1, 2).reshape(weight.shape)


def read_weights(tensors: dict, model: dict, hf: dict) -> dict:
    w = Weights(tensors, "model.")
    out = {"wte.weight": w.take("embed_tokens.weight")}
    d = model["head_dim"]
    for i in range(model["n_layer"]):
        h, b = f"layers.{i}", f"blocks.{i}"
        norm = w.take(f"{h}.input_layernorm.weight")
        out[f"{b}.ln_1.weight"], out[f"{b}.ln_2.weight"] = norm, norm.clone()
        q, k, v = (w.take(f"{h}.self_attn.{p}_proj.weight") for p in "qkv")
        out[f"{b}.attn.qkv.weight"] = torch.cat([pairs_to_halves(q, d), pairs_to_halves(k, d), v])
        out[f"{b}.attn.proj.weight"] = w.take(f"{h}.self_attn.o_proj.weight")
        out[f"{b}.mlp.fc.weight"] = torch.cat([w.take(f"{h}.mlp.{p}_proj.weight") for p in ("gate", "up")])
        out[f"{b}.mlp.proj.weight"] = w.take(f"{h}.mlp.down_proj.weight")
    out["ln_f.weight"] = w.take("norm.weight") * float(hf.get("logit_scale", 0.0625))
    return w.done(take_head(out, w, model["tie_embeddings"], "lm_head.weight"))


COHERE = Family(
    name="Cohere2",
    model_types=("cohere2",),
    read_config=read_config,
    read_weights=read_weights,
    exports=lambda m: False,
    write=None,
    handles=frozenset(),
    buffers=ROTARY,
)
