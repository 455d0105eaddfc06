"""A LoRA run's adapters in peft's on-disk format (``adapter_config.json``,
``adapter_model.safetensors``), for a base of the Llama family (Llama, Mistral, Qwen2, Qwen3),
which ``peft.PeftModel.from_pretrained(base, directory)`` puts on the transformers base.

minilm's adapter on the rows of q in the fused ``attn.qkv`` is peft's on ``self_attn.q_proj``
(``minilm.model.lora``): the same A (r x d_in) and B (rows x r), and the same scale alpha / r.
The ``also_train`` parameters go in whole as peft's ``modules_to_save`` (the norms, the token
embedding, the head), under the names the family's writer gives them. What peft cannot hold
is refused in one line: another family's fused layers (GPT-NeoX interleaves q, k, v per head
in one linear), or parameters of the position scheme.
"""
from __future__ import annotations

import json
import os
import re

try:  # the hf extra
    from safetensors.torch import save_file
except ImportError:  # pragma: no cover - reported by export_adapter()
    save_file = None

from minilm.common import staged_directory
from minilm.hf.export import convert
from minilm.hf.family import HFError

MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
           "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
SAVED = {"norms": ("input_layernorm", "post_attention_layernorm", "norm", "q_norm", "k_norm"),
         "embeddings": ("embed_tokens",), "head": ("lm_head",)}
ADAPTER = re.compile(r"blocks\.(\d+)\.(?:attn\.qkv|attn\.proj|mlp\.fc|mlp\.proj)\.lora_([ab])\.(\w+)$")
FAMILIES = ("llama", "qwen2", "qwen3")


def export_adapter(trained: dict, config, base_weights: dict, base_path: str, directory: str) -> dict:
    """Write the adapters (and also_train parameters) of a LoRA run as a peft adapter directory.
    ``trained``: the run's checkpoint weights (minilm names); ``config``: its Config;
    ``base_weights``: the base's state dict (minilm names), ``base_path`` where it lives.
    Returns {family, directory, tensors}."""
    if save_file is None:
        raise HFError('export needs safetensors and tokenizers: pip install -e ".[hf]"')
    if os.path.isdir(directory) and os.listdir(directory):
        raise HFError(f"{directory!r} exists and is not empty: export into a new directory")
    lora = config.train.lora
    if "position" in lora.also_train:
        raise HFError("train.lora.also_train has position: peft has no place for a position scheme's parameters; "
                      "export the merged model instead (minilm export RUN DIR)")
    whole = {**{k: v.detach().float().cpu() for k, v in base_weights.items()},
             **{k: v.detach().float().cpu() for k, v in trained.items() if ".lora_" not in k}}
    family, _, named = convert(config.model, whole)
    if family not in FAMILIES:
        raise HFError(f"peft adapters are written for the Llama family ({', '.join(FAMILIES)}); this model exports "
                      f"as {family}, whose fused layers peft cannot hold apart: export the merged model instead")
    tensors, targets = {}, set()
    for key, value in trained.items():
        found = ADAPTER.match(key)
        if found:
            layer, matrix, target = found.groups()
            tensors[f"base_model.model.model.layers.{layer}.{MODULES[target]}.lora_{matrix.upper()}.weight"] = value
            targets.add(MODULES[target].split(".")[-1])
    saved = sorted({name for group in lora.also_train for name in SAVED[group]})
    for key, value in named.items():
        module = key.rsplit(".", 1)[0]
        if any(module == name or module.endswith("." + name) for name in saved):
            tensors["base_model.model." + key] = value
    settings = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.r, "lora_alpha": lora.alpha,
                "lora_dropout": 0.0, "target_modules": sorted(targets), "modules_to_save": saved or None,
                "bias": "none", "fan_in_fan_out": False, "base_model_name_or_path": base_path,
                "inference_mode": True, "init_lora_weights": True, "use_rslora": False, "use_dora": False,
                "rank_pattern": {}, "alpha_pattern": {}}
    with staged_directory(directory) as staging:
        with open(os.path.join(staging, "adapter_config.json"), "w", encoding="utf-8") as f:
            json.dump(settings, f, indent=2)
        save_file({k: v.detach().float().cpu().contiguous() for k, v in tensors.items()},
                  os.path.join(staging, "adapter_model.safetensors"), metadata={"format": "pt"})
    return {"family": family, "directory": directory, "tensors": len(tensors)}
