"""A LoRA run's adapters in peft's on-disk format (``adapter_config.json``,
``adapter_model.safetensors``), for a base of the Llama family (Llama, Mistral, Qwen2, Qwen3) or
GPT-NeoX, which ``peft.PeftModel.from_pretrained(base, directory)`` puts on the transformers base.

minilm's adapter on the rows of q in the fused ``attn.qkv`` is peft's on ``self_attn.q_proj``
(``minilm.model.lora``): the same A (r x d_in) and B (rows x r), and the same scale alpha / r.
The ``also_train`` parameters go in whole as peft's ``modules_to_save`` (the norms, the token
embedding, the head), under the names the family's writer gives them. A base that ties its head to
the token embedding keeps them tied in minilm, so a trained embedding is saved as the head as well
(peft's copy of the embedding is not the head's: without it the head would keep the old weights). What peft cannot hold
is refused in one line: another family (GPT-2's Conv1D, MPT), or parameters of the position
scheme. GPT-NeoX keeps q, k and v in one linear, per head: minilm's adapters on them become
one adapter there (``neox_qkv``), exactly.
"""

from __future__ import annotations

import json
import os
import re

import torch

try:  # the hf extra
    from safetensors.torch import save_file
except ImportError:  # pragma: no cover - reported by export_adapter()
    save_file = None

from minilm.common import staged_directory
from minilm.hf.export import convert
from minilm.hf.family import HFError

# per family: the prefix of its layers, the module of each minilm adapter target, and the modules a
# group of also_train saves whole; GPT-NeoX holds q, k and v in one linear (FUSED), per head
LAYOUTS = {
    "llama": (
        "model.layers",
        {
            "q": "self_attn.q_proj",
            "k": "self_attn.k_proj",
            "v": "self_attn.v_proj",
            "o": "self_attn.o_proj",
            "gate": "mlp.gate_proj",
            "up": "mlp.up_proj",
            "down": "mlp.down_proj",
        },
        {
            "norms": ("input_layernorm", "post_attention_layernorm", "norm", "q_norm", "k_norm"),
            "embeddings": ("embed_tokens",),
            "head": ("lm_head",),
        },
    ),
    "gpt_neox": (
        "gpt_neox.layers",
        {"o": "attention.dense", "up": "mlp.dense_h_to_4h", "down": "mlp.dense_4h_to_h"},
        {
            "norms": ("input_layernorm", "post_attention_layernorm", "final_layer_norm"),
            "embeddings": ("embed_in",),
            "head": ("embed_out",),
        },
    ),
}
LAYOUTS["qwen2"] = LAYOUTS["qwen3"] = LAYOUTS["llama"]
FUSED = "attention.query_key_value"
ADAPTER = re.compile(r"blocks\.(\d+)\.(?:attn\.qkv|attn\.proj|mlp\.fc|mlp\.proj)\.lora_([ab])\.(\w+)$")


def export_adapter(
    trained: dict, config, base_weights: dict, base_path: str, directory: str, family: str = None
) -> dict:
    """Write the adapters (and also_train parameters) of a LoRA run as a peft adapter directory.
    ``trained``: the run's checkpoint weights (minilm names); ``config``: its Config;
    ``base_weights``: the base's state dict (minilm names), ``base_path`` where it lives; ``family``:
    the family the base is written as (``minilm.hf.export.convert``; None: the first that takes it).
    Returns {family, directory, tensors}."""
    if save_file is None:
        raise HFError('export needs safetensors and tokenizers: pip install -e ".[hf]"')
    if os.path.isdir(directory) and os.listdir(directory):
        raise HFError(f"{directory!r} exists and is not empty: export into a new directory")
    lora = config.train.lora
    if "position" in lora.also_train:
        raise HFError(
            "train.lora.also_train has position: peft has no place for a position scheme's parameters; "
            "export the merged model instead (minilm export RUN DIR)"
        )
    whole = {
        **{k: v.detach().float().cpu() for k, v in base_weights.items()},
        **{k: v.detach().float().cpu() for k, v in trained.items() if ".lora_" not in k},
    }
    family, _, named = convert(config.model, whole, family)
    if family not in LAYOUTS:
        raise HFError(
            f"peft adapters are written for the Llama family and GPT-NeoX; this model exports as {family}: "
            f"export the merged model instead (minilm export RUN DIR)"
        )
    prefix, modules, groups = LAYOUTS[family]
    tensors, targets, fused = {}, set(), {}
    for key, value in trained.items():
        found = ADAPTER.match(key)
        if found:
            layer, matrix, target = found.groups()
            if target in modules:
                tensors[f"base_model.model.{prefix}.{layer}.{modules[target]}.lora_{matrix.upper()}.weight"] = value
                targets.add(modules[target].split(".")[-1])
            else:  # q, k or v of GPT-NeoX's fused linear
                fused.setdefault(int(layer), {})[(target, matrix)] = value
    patterns = {}
    for layer, parts in fused.items():
        a, b = neox_qkv(parts, config.model)
        for matrix, value in (("A", a), ("B", b)):
            tensors[f"base_model.model.{prefix}.{layer}.{FUSED}.lora_{matrix}.weight"] = value
        targets.add(FUSED.split(".")[-1])
        patterns = {
            "rank_pattern": {"query_key_value": a.shape[0]},
            "alpha_pattern": {"query_key_value": lora.alpha * a.shape[0] / lora.r},
        }
    saved = sorted({name for group in lora.also_train for name in groups[group]})
    for key, value in named.items():
        module = key.rsplit(".", 1)[0]
        if any(module == name or module.endswith("." + name) for name in saved):
            tensors["base_model.model." + key] = value
    if config.model.tie_embeddings and "embeddings" in lora.also_train:  # the trained embedding is the head too
        head = groups["head"][0]
        tensors[f"base_model.model.{head}.weight"] = whole["wte.weight"].clone()
        saved = sorted({*saved, head})
    settings = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": lora.r,
        "lora_alpha": lora.alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(targets),
        "modules_to_save": saved or None,
        "bias": "none",
        "fan_in_fan_out": False,
        "base_model_name_or_path": base_path,
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "rank_pattern": {},
        "alpha_pattern": {},
        **patterns,
    }
    with staged_directory(directory) as staging:
        with open(os.path.join(staging, "adapter_config.json"), "w", encoding="utf-8") as f:
            json.dump(settings, f, indent=2)
        save_file(
            {k: v.detach().float().cpu().contiguous() for k, v in tensors.items()},
            os.path.join(staging, "adapter_model.safetensors"),
            metadata={"format": "pt"},
        )
    return {"family": family, "directory": directory, "tensors": len(tensors)}


def neox_qkv(parts: dict, m) -> tuple:
    """GPT-NeoX's one adapter on its fused q/k/v linear that computes minilm's adapters on q, k and v
    (``parts``: (target, "a" | "b") -> tensor): A stacks their A's (n r x d); B places each B on its
    target's rows and its own r columns, then takes NeoX's row order (head, q|k|v, dim). Its rank is
    n r, and alpha n alpha keeps the scale alpha / r (peft's rank_pattern, alpha_pattern)."""
    names = [t for t in "qkv" if (t, "a") in parts]
    r, width = parts[(names[0], "a")].shape[0], m.d_model
    a = torch.cat([parts[(t, "a")] for t in names])
    b = torch.zeros(3 * width, len(names) * r, dtype=a.dtype)
    for j, t in enumerate(names):
        start = "qkv".index(t) * width
        b[start : start + width, j * r : (j + 1) * r] = parts[(t, "b")]
    return a, b.view(3, m.n_head, -1, len(names) * r).transpose(0, 1).reshape(3 * width, len(names) * r)
