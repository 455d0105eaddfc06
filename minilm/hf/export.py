"""minilm models written as Hugging Face model directories.

``export_model(model, tokenizer, config, directory)`` writes config.json, model.safetensors
and the tokenizer files, which ``transformers.AutoModelForCausalLM`` and ``AutoTokenizer``
load with no custom code. The family follows the position kind and the architecture
options (the first of ``minilm.hf.families.FAMILIES`` that ``exports`` the model):

* ``rope``: Llama when Llama-style (rmsnorm, swiglu, no biases; GQA allowed), Qwen2 when that
  has ``qkv_bias``, Qwen3 when it has ``qk_norm``, Phi-3 when asked for (``family="phi3"``);
  else GPT-NeoX (layernorm, gelu or gelu_tanh, full attention heads).
* ``learned``: GPT-2.  * ``alibi``: MPT.

Biases the target has and minilm does not are written as zeros. Everything else
(sinusoidal, t5, fire, interpolated, an embedding scale, a setting a family does not handle)
is refused with a one-line reason. The directory is written under a temporary name and
renamed into place, so it is complete or absent; an existing non-empty directory is never
touched. The command line loads the checkpoint (``python -m minilm export``) and hands the
model in.
"""

from __future__ import annotations

import json
import os

try:  # the hf extra
    from safetensors.torch import save_file
except ImportError:  # pragma: no cover - reported by export_model()
    save_file = None

from minilm.common import staged_directory, suggest
from minilm.data.hf_tokenizer import save_pretrained_tokenizer
from minilm.hf.families import BY_NAME, FAMILIES, READERS
from minilm.hf.family import HFError, refuse_unhandled
from minilm.hf.gemma import GEMMA
from minilm.hf.rope import rope_problem

EXPORTABLE = (
    "rope (GPT-NeoX, Llama, Qwen2, Qwen3, SmolLM3, Gemma 2 or 3, EXAONE 4, OLMo 3 or Phi-3), learned (GPT-2), "
    "alibi (MPT)"
)


def export_model(model, tokenizer, config, directory: str, family: str = None) -> dict:
    """Write a model (its ``config``: a run Config) as a transformers model directory, as the
    named ``family`` (a key of ``minilm.hf.families.BY_NAME``) or the first that takes it;
    returns {family, directory, params}."""
    if save_file is None:
        raise HFError('export needs safetensors and tokenizers: pip install -e ".[hf]"')
    if os.path.isdir(directory) and os.listdir(directory):
        raise HFError(f"{directory!r} exists and is not empty: export into a new directory")
    family, hf_config, tensors = convert(
        config.model, {k: v.detach().float().cpu() for k, v in model.state_dict().items()}, family
    )
    hf_config.update(bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id, dtype="float32")
    stops = list(tokenizer.stop_ids)  # every end-of-text id (Llama 3 has three) goes to generation_config.json
    generation = {"bos_token_id": tokenizer.bos_id, "eos_token_id": stops[0] if len(stops) == 1 else stops or None}
    if not str(directory).strip():
        raise HFError(f"directory={directory!r} is invalid: name the new directory to write")
    # no overwrite: the finished directory takes the name by one rename, which replaces an empty
    # directory and fails on a full one, so a second export racing for the name never replaces the first
    with staged_directory(directory) as staging:
        for name, content in (("config.json", hf_config), ("generation_config.json", generation)):
            with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
                json.dump(content, f, indent=2)
        save_file(
            {k: v.contiguous() for k, v in tensors.items()},
            os.path.join(staging, "model.safetensors"),
            metadata={"format": "pt"},
        )
        save_pretrained_tokenizer(tokenizer, staging)
    return {"family": family, "directory": directory, "params": sum(t.numel() for t in tensors.values())}


def family_problem(name: str) -> str:
    """Why ``name`` is no family export writes, with what to write instead: a model type of a family that
    writes it (qwen3 is written by llama), a family read only, or the closest names of ``BY_NAME``."""
    writer = READERS.get(name)
    if writer is not None and writer.write:
        written_as = writer.model_types[0]
        return f"family {name!r} is no --family of its own: {writer.name} models are written by --family {written_as}"
    if writer is not None:
        return f"family {name!r} is read only: valid: {', '.join(BY_NAME)}"
    return f"family {name!r} is unknown: {suggest(name, BY_NAME)}"


def convert(m, sd: dict, family: str = None) -> tuple:
    """(model_type, config.json dict, HF state dict) for a ModelConfig ``m`` and its state dict,
    as the named ``family`` or the first that exports ``m``."""
    if m.embedding_scale not in (1, 1.0, "auto") and not GEMMA.exports(m):
        raise HFError(
            f"model.embedding_scale={m.embedding_scale!r}: transformers models do not scale the token embedding, "
            f"except Gemma's by sqrt_d_model (with sublayer_norms sandwich, mlp geglu_tanh and rmsnorm)"
        )
    takers = [f for f in FAMILIES if f.exports(m) and rope_problem(f, m) is None]
    if family is not None:
        if family not in BY_NAME:
            raise HFError(family_problem(family))
        chosen = BY_NAME[family]
        if chosen not in takers:
            why = rope_problem(chosen, m) if chosen.exports(m) else None
            names = ", ".join(f.model_types[0] for f in takers)
            raise HFError(
                f"this {m.position['kind']} model cannot be written as {chosen.name}"
                + (f" ({why})" if why else "")
                + (f": it exports as {names}" if takers else f": exportable: {EXPORTABLE}")
            )
        refuse_unhandled(chosen, m)
        return chosen.write(m, sd)
    if takers:
        refuse_unhandled(takers[0], m)
        return takers[0].write(m, sd)
    why = [f"{f.model_types[0]}: {rope_problem(f, m)}" for f in FAMILIES if f.exports(m)]
    if why:
        raise HFError(f"no transformers family runs this model's rope as minilm does ({'; '.join(why)})")
    raise HFError(f"position kind {m.position['kind']!r} has no transformers equivalent; exportable: {EXPORTABLE}")
