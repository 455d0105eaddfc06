"""minilm checkpoints written as Hugging Face model directories.

``export(checkpoint, directory)`` writes config.json, model.safetensors and the tokenizer
files, which ``transformers.AutoModelForCausalLM`` and ``AutoTokenizer`` load with no custom
code. The family follows the position kind and the architecture options:

* ``rope``: GPT-NeoX (layernorm, gelu or gelu_tanh, full attention heads; sequential or
  parallel residual), or Llama when Llama-style (rmsnorm, swiglu, no biases; GQA allowed),
  Qwen2 when that has ``qkv_bias``. Scalings: linear, dynamic, yarn and llama3 as
  ``rope_parameters``; static NTK as its changed base, theta * s^(d/(d-2)), which is the
  same rotation with no scaling at all.
* ``learned``: GPT-2 (tied head, layernorm, gelu or gelu_tanh).
* ``alibi``: MPT (tied head, layernorm without biases, gelu, d_ff = 4 d_model, the slopes
  of MPT's ``alibi_bias_max=8``).

Biases the target has and minilm does not are written as zeros. Everything else
(sinusoidal, t5, fire, interpolated, an embedding scale, ...) is refused with a one-line
reason. The directory is written under a temporary name and renamed into place, so it is
complete or absent; an existing non-empty directory is never touched.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

import torch

try:  # the hf extra
    from safetensors.torch import save_file
except ImportError:  # pragma: no cover - reported by export()
    save_file = None

from minilm.common import MinilmError
from minilm.hf_tokenizer import save_pretrained_tokenizer
from minilm.loading import load_model
from minilm.positions.alibi import alibi_slopes
from minilm.positions.rope import ntk_base

ROPE_TYPES = {"none": "default", "linear": "linear", "dynamic": "dynamic", "yarn": "yarn", "llama3": "llama3"}
HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_new"}


class ExportError(MinilmError):
    """A checkpoint that has no transformers equivalent, or a directory that cannot be written."""


def export(checkpoint: str, directory: str) -> dict:
    """Write ``checkpoint`` as a transformers model directory; returns {family, directory, params}."""
    if save_file is None:
        raise ExportError('export needs safetensors and tokenizers: pip install -e ".[hf]"')
    if os.path.isdir(directory) and os.listdir(directory):
        raise ExportError(f"{directory!r} exists and is not empty: export into a new directory")
    model, tokenizer, config, _ = load_model(checkpoint)
    m = config.model
    family, hf_config, tensors = convert(m, {k: v.detach().float().cpu() for k, v in model.state_dict().items()})
    hf_config.update(bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id, dtype="float32")
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".export-", dir=parent)
    try:
        with open(os.path.join(staging, "config.json"), "w", encoding="utf-8") as f:
            json.dump(hf_config, f, indent=2)
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(staging, "model.safetensors"),
                  metadata={"format": "pt"})
        save_pretrained_tokenizer(tokenizer, staging)
        if os.path.isdir(directory):
            os.rmdir(directory)  # empty, checked above
        os.rename(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"family": family, "directory": directory, "params": sum(t.numel() for t in tensors.values())}


def convert(m, sd: dict) -> tuple:
    """(family, config.json dict, HF state dict) for a ModelConfig ``m`` and its state dict."""
    kind = m.position["kind"]
    if kind not in ("rope", "learned", "alibi"):
        raise ExportError(f"position kind {kind!r} has no transformers equivalent; exportable: rope (GPT-NeoX or "
                          f"Llama), learned (GPT-2), alibi (MPT)")
    if m.embedding_scale not in (1, 1.0, "auto"):
        raise ExportError(f"model.embedding_scale={m.embedding_scale!r}: transformers models do not scale the "
                          f"token embedding")
    if kind == "rope":
        llama_style = m.norm == "rmsnorm" and m.mlp == "swiglu" and not m.bias and not m.parallel_residual
        return llama_export(m, sd) if llama_style else neox_export(m, sd)
    if kind == "learned":
        return gpt2_export(m, sd)
    return mpt_export(m, sd)


def _require(ok: bool, family: str, what: str) -> None:
    if not ok:
        raise ExportError(f"cannot export as {family}: {what}")


def rope_parameters(m) -> tuple:
    """(rope_parameters, max_position_embeddings) of a rope setting."""
    rope = m.position
    scaling = rope.get("scaling") or {"type": "none"}
    kind, fraction = scaling.get("type", "none"), rope.get("rotary_fraction", 1.0)
    rotated = int(m.head_dim * fraction)
    _require(rotated % 2 == 0, "rope", f"rotary_fraction={fraction} rotates an odd {rotated} dims")
    params = {"rope_type": "default", "rope_theta": float(rope.get("base", 10000.0)),
              "partial_rotary_factor": float(fraction)}  # always: GPT-NeoX's default is 0.25
    if kind == "ntk":
        params["rope_theta"] = ntk_base(params["rope_theta"], scaling["factor"], rotated)
        return params, m.block_size
    _require(kind in ROPE_TYPES, "rope", f"scaling {kind!r} has no transformers equivalent here; exportable: "
             f"{', '.join(ROPE_TYPES)}, ntk")
    if kind == "none":
        return params, m.block_size
    params.update(rope_type=ROPE_TYPES[kind], factor=float(scaling["factor"]))
    original = scaling["original_max_positions"]
    if kind == "dynamic":  # transformers measures dynamic lengths against max_position_embeddings
        return params, original
    params["original_max_position_embeddings"] = original
    if kind == "llama3":
        params.update(low_freq_factor=scaling["low_freq_factor"], high_freq_factor=scaling["high_freq_factor"])
    return params, m.block_size


def _linear(sd: dict, out: dict, source: str, target: str, with_bias: bool, transpose: bool = False) -> None:
    weight = sd[f"{source}.weight"]
    out[f"{target}.weight"] = weight.t() if transpose else weight
    if with_bias:
        out[f"{target}.bias"] = sd.get(f"{source}.bias", torch.zeros(weight.shape[0]))


def neox_export(m, sd: dict) -> tuple:
    _require(m.norm == "layernorm" and m.mlp in HF_ACTIVATION, "GPT-NeoX",
             f"norm={m.norm}, mlp={m.mlp}; GPT-NeoX has layernorm and gelu / gelu_tanh (Llama: rmsnorm, swiglu, "
             f"no bias)")
    _require(m.n_kv_head in (None, m.n_head) and not m.qkv_bias, "GPT-NeoX", "it has neither GQA nor q/k/v-only bias")
    params, positions = rope_parameters(m)
    heads, width = m.n_head, m.d_model
    out = {"gpt_neox.embed_in.weight": sd["wte.weight"]}
    for i in range(m.n_layer):
        b, h = f"blocks.{i}", f"gpt_neox.layers.{i}"
        _linear(sd, out, f"{b}.ln_1", f"{h}.input_layernorm", True)
        _linear(sd, out, f"{b}.ln_2", f"{h}.post_attention_layernorm", True)
        _linear(sd, out, f"{b}.attn.qkv", f"{h}.attention.query_key_value", True)
        key = f"{h}.attention.query_key_value"  # minilm (q|k|v, head, dim) -> NeoX (head, q|k|v, dim)
        out[f"{key}.weight"] = out[f"{key}.weight"].view(3, heads, -1, width).transpose(0, 1).reshape(3 * width, width)
        out[f"{key}.bias"] = out[f"{key}.bias"].view(3, heads, -1).transpose(0, 1).reshape(3 * width)
        _linear(sd, out, f"{b}.attn.proj", f"{h}.attention.dense", True)
        _linear(sd, out, f"{b}.mlp.fc", f"{h}.mlp.dense_h_to_4h", True)
        _linear(sd, out, f"{b}.mlp.proj", f"{h}.mlp.dense_4h_to_h", True)
    _linear(sd, out, "ln_f", "gpt_neox.final_layer_norm", True)
    if not m.tie_embeddings:
        out["embed_out.weight"] = sd["lm_head.weight"]
    config = dict(architectures=["GPTNeoXForCausalLM"], model_type="gpt_neox", vocab_size=m.vocab_size,
                  hidden_size=width, num_hidden_layers=m.n_layer, num_attention_heads=heads,
                  intermediate_size=m.d_ff, hidden_act=HF_ACTIVATION[m.mlp], max_position_embeddings=positions,
                  layer_norm_eps=m.norm_eps, use_parallel_residual=m.parallel_residual, attention_bias=True,
                  tie_word_embeddings=m.tie_embeddings, rope_parameters=params, hidden_dropout=0.0,
                  attention_dropout=0.0)
    return "gpt_neox", config, out


def llama_export(m, sd: dict) -> tuple:
    family = "qwen2" if m.qkv_bias else "llama"
    params, positions = rope_parameters(m)
    kv = m.n_kv_head or m.n_head
    sizes = [m.n_head * m.head_dim, kv * m.head_dim, kv * m.head_dim]
    out = {"model.embed_tokens.weight": sd["wte.weight"]}
    for i in range(m.n_layer):
        b, h = f"blocks.{i}", f"model.layers.{i}"
        out[f"{h}.input_layernorm.weight"] = sd[f"{b}.ln_1.weight"]
        out[f"{h}.post_attention_layernorm.weight"] = sd[f"{b}.ln_2.weight"]
        for name, part in zip("qkv", sd[f"{b}.attn.qkv.weight"].split(sizes)):
            out[f"{h}.self_attn.{name}_proj.weight"] = part
        if m.qkv_bias:
            for name, part in zip("qkv", sd[f"{b}.attn.qkv.bias"].split(sizes)):
                out[f"{h}.self_attn.{name}_proj.bias"] = part
        out[f"{h}.self_attn.o_proj.weight"] = sd[f"{b}.attn.proj.weight"]
        gate, up = sd[f"{b}.mlp.fc.weight"].chunk(2)
        out[f"{h}.mlp.gate_proj.weight"], out[f"{h}.mlp.up_proj.weight"] = gate, up
        out[f"{h}.mlp.down_proj.weight"] = sd[f"{b}.mlp.proj.weight"]
    out["model.norm.weight"] = sd["ln_f.weight"]
    if not m.tie_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    config = dict(architectures=["Qwen2ForCausalLM" if m.qkv_bias else "LlamaForCausalLM"], model_type=family,
                  vocab_size=m.vocab_size, hidden_size=m.d_model, intermediate_size=m.d_ff,
                  num_hidden_layers=m.n_layer, num_attention_heads=m.n_head, num_key_value_heads=kv,
                  head_dim=m.head_dim, hidden_act="silu", max_position_embeddings=positions, rms_norm_eps=m.norm_eps,
                  tie_word_embeddings=m.tie_embeddings, attention_bias=False, mlp_bias=False,
                  rope_parameters=params, attention_dropout=0.0, use_sliding_window=False)
    return family, config, out


def _absolute_family_checks(m, family: str) -> None:
    _require(m.norm == "layernorm" and not m.parallel_residual and m.tie_embeddings, family,
             f"it needs layernorm, a sequential residual and a tied head (norm={m.norm}, "
             f"parallel_residual={m.parallel_residual}, tie_embeddings={m.tie_embeddings})")
    _require(m.n_kv_head in (None, m.n_head) and not m.qkv_bias, family, "it has neither GQA nor q/k/v-only bias")


def gpt2_export(m, sd: dict) -> tuple:
    _absolute_family_checks(m, "GPT-2")
    _require(m.mlp in HF_ACTIVATION, "GPT-2", f"mlp={m.mlp}; it has gelu or gelu_tanh")
    rows = sd["positions.table.weight"].shape[0]
    out = {"transformer.wte.weight": sd["wte.weight"], "transformer.wpe.weight": sd["positions.table.weight"]}
    for i in range(m.n_layer):
        b, h = f"blocks.{i}", f"transformer.h.{i}"
        _linear(sd, out, f"{b}.ln_1", f"{h}.ln_1", True)
        _linear(sd, out, f"{b}.ln_2", f"{h}.ln_2", True)
        for source, target in (("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"),
                               ("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj")):
            _linear(sd, out, f"{b}.{source}", f"{h}.{target}", True, transpose=True)  # Conv1D: (in, out)
    _linear(sd, out, "ln_f", "transformer.ln_f", True)
    config = dict(architectures=["GPT2LMHeadModel"], model_type="gpt2", vocab_size=m.vocab_size, n_positions=rows,
                  n_embd=m.d_model, n_layer=m.n_layer, n_head=m.n_head, n_inner=m.d_ff,
                  activation_function=HF_ACTIVATION[m.mlp], layer_norm_epsilon=m.norm_eps, resid_pdrop=0.0,
                  embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)
    return "gpt2", config, out


def mpt_export(m, sd: dict) -> tuple:
    _absolute_family_checks(m, "MPT")
    _require(m.mlp == "gelu" and m.d_ff == 4 * m.d_model and not m.bias, "MPT",
             f"it has gelu, d_ff = 4 d_model and no biases (mlp={m.mlp}, d_ff={m.d_ff}, bias={m.bias})")
    mpt = 2.0 ** (-torch.arange(1, 2 ** (m.n_head - 1).bit_length() + 1) * 8.0 / 2 ** (m.n_head - 1).bit_length())
    if mpt.numel() != m.n_head:  # MPT's order for a head count that is not a power of two
        mpt = torch.cat([mpt[1::2], mpt[::2]])[:m.n_head]
    _require(torch.allclose(mpt.double(), torch.tensor(alibi_slopes(m.n_head), dtype=torch.float64), rtol=1e-6),
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
