"""Hugging Face model directories read as minilm checkpoints.

``read_hf(path)`` turns a ``transformers`` model directory (config.json, safetensors or torch
weights, tokenizer files) into the dict a minilm checkpoint file holds: ``model`` (a minilm
state dict), ``config`` (a full run config as a plain dict), ``tokenizer`` (bytes) and
``path``. ``minilm.loading.load_model`` then builds the model as for any checkpoint, so
every scaling, ``interpolated`` and ``train.init_from`` apply to imported models too.

``path`` is a directory recognised by its config.json, or ``hf:NAME``: a repo id already in
the local Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else
~/.cache/huggingface/hub). Nothing is ever downloaded.

Families and how their weights map (minilm's fused ``attn.qkv`` is [q; k; v], heads contiguous):

* GPT-2 (``gpt2``): Conv1D weights are stored (in, out) and are transposed; ``wpe`` is the
  learned position table; gelu_new is ``mlp: gelu_tanh``.
* GPT-NeoX / Pythia (``gpt_neox``): ``query_key_value`` interleaves (head, q|k|v, dim) and is
  regrouped; ``use_parallel_residual`` -> ``parallel_residual``; partial rotary ->
  ``rotary_fraction``; ``embed_out`` is the untied head.
* Llama family (``llama``, ``mistral`` without a sliding window, ``qwen2``): q/k/v
  projections concatenated (GQA: ``n_kv_head``), gate and up concatenated (``mlp: swiglu``),
  RMSNorm, Qwen2's q/k/v bias as ``qkv_bias``.

Rope settings (``rope_theta``, ``partial_rotary_factor``, ``rope_scaling`` /
``rope_parameters`` of type linear, dynamic, yarn with its default betas and attention
factor, llama3) map onto minilm's ``rope`` scheme; ``original_max_positions`` is the
config's ``original_max_position_embeddings``, else ``max_position_embeddings`` (always the
latter for dynamic), as in transformers. Anything else is a one-line ``CheckpointError`` naming what is supported.
"""
from __future__ import annotations

import json
import os
from typing import Callable

import torch

try:  # the hf extra
    from safetensors.torch import load_file as load_safetensors
except ImportError:  # pragma: no cover - reported when a safetensors file is read
    load_safetensors = None

from minilm.checkpoint import CheckpointError
from minilm.config import Config
from minilm.hf_tokenizer import HFTokenizer

PREFIX = "hf:"
FAMILIES = ("gpt2", "gpt_neox", "llama", "mistral", "qwen2")
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
SCALINGS = ("default", "linear", "dynamic", "yarn", "llama3")
YARN_DEFAULTS = {"beta_fast": 32, "beta_slow": 1, "truncate": True}


def is_hf_source(path: str) -> bool:
    """True for ``hf:NAME`` and for a directory holding config.json (and no minilm ckpt.pt)."""
    return str(path).startswith(PREFIX) or (
        os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))
        and not os.path.isfile(os.path.join(path, "ckpt.pt")))


def hub_cache() -> str:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def cached_snapshot(name: str) -> str:
    """The directory of repo ``name`` in the local cache: the snapshot refs/main points at,
    else the only snapshot there is."""
    repo = os.path.join(hub_cache(), "models--" + name.replace("/", "--"))
    snapshots = os.path.join(repo, "snapshots")
    if not os.path.isdir(snapshots):
        raise CheckpointError(f"{PREFIX}{name} is not in the local Hugging Face cache ({hub_cache()}): minilm never "
                              f"downloads; fetch it yourself (huggingface-cli download {name}) or give its directory")
    ref = os.path.join(repo, "refs", "main")
    if os.path.isfile(ref):
        with open(ref, encoding="utf-8") as f:
            chosen = os.path.join(snapshots, f.read().strip())
        if os.path.isdir(chosen):
            return chosen
    found = sorted(os.listdir(snapshots))
    if len(found) != 1:
        raise CheckpointError(f"{PREFIX}{name}: {len(found)} snapshots in {snapshots} and no refs/main to choose "
                              f"one; give the snapshot directory itself")
    return os.path.join(snapshots, found[0])


def read_hf(path: str) -> dict:
    """The minilm checkpoint dict of a Hugging Face model directory or ``hf:NAME``."""
    directory = cached_snapshot(path[len(PREFIX):]) if str(path).startswith(PREFIX) else path
    try:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            hf = json.load(f)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {os.path.join(directory, 'config.json')}: {exc}") from None
    family = hf.get("model_type")
    if family not in FAMILIES:
        raise CheckpointError(f"{path}: model_type {family!r} is not supported; supported: {', '.join(FAMILIES)}")
    model_tree = MODEL_CONFIG[family](hf, path)
    weights = read_weights(directory)
    state_dict = WEIGHTS[family](weights, model_tree)
    tokenizer = HFTokenizer.from_directory(directory)
    config = Config().to_dict()
    config["model"] = {**config["model"], **model_tree}
    config["data"]["vocab_size"] = tokenizer.vocab_size
    if tokenizer.vocab_size > model_tree["vocab_size"]:
        raise CheckpointError(f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                              f"{model_tree['vocab_size']} embedding rows")
    return {"model": state_dict, "config": config, "tokenizer": tokenizer.to_bytes(), "path": str(path)}


# --------------------------------------------------------------------------- configs

def _refuse(path: str, what: str) -> None:
    raise CheckpointError(f"{path}: {what}")


def rope_position(hf: dict, path: str) -> dict:
    """minilm's rope setting for a config's rope_theta, partial rotary and scaling."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or {})
    params.update(scaling)
    base = params.get("rope_theta", hf.get("rope_theta", hf.get("rotary_emb_base", 10000.0)))
    fraction = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", hf.get("rotary_pct", 1.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in SCALINGS:
        _refuse(path, f"rope scaling {kind!r} is not supported; supported: {', '.join(SCALINGS)}")
    position = {"kind": "rope", "base": float(base), "rotary_fraction": float(fraction), "scaling": None}
    if kind == "default":
        return position
    maximum = hf["max_position_embeddings"]
    original = params.get("original_max_position_embeddings") or hf.get("original_max_position_embeddings") or maximum
    if kind == "dynamic":  # transformers' dynamic NTK measures lengths against max_position_embeddings
        original = maximum
    factor = params.get("factor") or (maximum / original if kind == "yarn" else None)
    scaling = {"type": kind, "factor": float(factor), "original_max_positions": int(original)}
    if kind == "llama3":
        scaling.update(low_freq_factor=float(params.get("low_freq_factor", 1.0)),
                       high_freq_factor=float(params.get("high_freq_factor", 4.0)))
    if kind == "yarn":
        odd = {k: params[k] for k, v in YARN_DEFAULTS.items() if params.get(k) not in (None, v)}
        odd.update({k: params[k] for k in ("attention_factor", "mscale", "mscale_all_dim") if params.get(k)})
        if odd:
            _refuse(path, f"yarn settings {odd} are not supported; minilm's yarn has beta_fast 32, beta_slow 1 "
                          f"and attention factor 0.1 ln(factor) + 1")
    position["scaling"] = scaling
    return position


def _activation(hf: dict, key: str, path: str) -> str:
    name = hf.get(key, "gelu")
    if name not in ACTIVATIONS:
        _refuse(path, f"{key}={name!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def gpt2_config(hf: dict, path: str) -> dict:
    if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("scale_attn_weights") is False:
        _refuse(path, "GPT-2 attention scaling other than 1/sqrt(head_dim) is not supported")
    width = hf["n_embd"]
    return dict(vocab_size=hf["vocab_size"], n_layer=hf["n_layer"], n_head=hf["n_head"], d_model=width,
                block_size=hf["n_positions"], d_ff=hf.get("n_inner") or 4 * width, bias=True,
                mlp=_activation(hf, "activation_function", path), norm="layernorm",
                norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), tie_embeddings=hf.get("tie_word_embeddings", True),
                position={"kind": "learned", "max_positions": hf["n_positions"]}, embedding_scale=1.0)


def neox_config(hf: dict, path: str) -> dict:
    if not hf.get("attention_bias", True):
        _refuse(path, "GPT-NeoX without attention biases is not supported (its MLP and norms keep theirs)")
    return dict(vocab_size=hf["vocab_size"], n_layer=hf["num_hidden_layers"], n_head=hf["num_attention_heads"],
                d_model=hf["hidden_size"], block_size=hf["max_position_embeddings"], d_ff=hf["intermediate_size"],
                bias=True, mlp=_activation(hf, "hidden_act", path), norm="layernorm",
                norm_eps=float(hf.get("layer_norm_eps", 1e-5)), parallel_residual=hf.get("use_parallel_residual", True),
                tie_embeddings=hf.get("tie_word_embeddings", False), position=rope_position(hf, path),
                embedding_scale=1.0)


def llama_config(hf: dict, path: str) -> dict:
    width, heads = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("hidden_act", "silu") != "silu":
        _refuse(path, f"hidden_act={hf.get('hidden_act')!r} is not supported for {hf['model_type']}; supported: silu")
    if hf.get("head_dim") not in (None, width // heads):
        _refuse(path, f"head_dim={hf['head_dim']} differs from hidden_size / num_attention_heads = {width // heads}")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        _refuse(path, "attention_bias / mlp_bias are not supported (q/k/v biases alone are: Qwen2)")
    if hf.get("sliding_window") and (hf["model_type"] == "mistral" or hf.get("use_sliding_window")):
        _refuse(path, f"sliding_window={hf['sliding_window']} is not supported (Mistral without a sliding window is)")
    return dict(vocab_size=hf["vocab_size"], n_layer=hf["num_hidden_layers"], n_head=heads, d_model=width,
                block_size=hf["max_position_embeddings"], d_ff=hf["intermediate_size"], bias=False,
                qkv_bias=hf["model_type"] == "qwen2", mlp="swiglu", norm="rmsnorm",
                norm_eps=float(hf.get("rms_norm_eps", 1e-6)), n_kv_head=hf.get("num_key_value_heads") or heads,
                tie_embeddings=hf.get("tie_word_embeddings", False), position=rope_position(hf, path),
                embedding_scale=1.0)


MODEL_CONFIG: dict[str, Callable] = {"gpt2": gpt2_config, "gpt_neox": neox_config, "llama": llama_config,
                                     "mistral": llama_config, "qwen2": llama_config}


# --------------------------------------------------------------------------- weights

def read_weights(directory: str) -> dict:
    """{name: tensor} from model.safetensors / pytorch_model.bin, sharded or not."""
    for index_name, single in (("model.safetensors.index.json", "model.safetensors"),
                               ("pytorch_model.bin.index.json", "pytorch_model.bin")):
        index = os.path.join(directory, index_name)
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
            return {k: v for name in files for k, v in _read_file(os.path.join(directory, name)).items()}
        if os.path.isfile(os.path.join(directory, single)):
            return _read_file(os.path.join(directory, single))
    raise CheckpointError(f"no weights in {directory}: expected model.safetensors or pytorch_model.bin "
                          f"(or their sharded index)")


def _read_file(path: str) -> dict:
    if path.endswith(".safetensors"):
        if load_safetensors is None:
            raise CheckpointError(f"reading {path} needs safetensors: pip install -e \".[hf]\"")
        return load_safetensors(path)
    return torch.load(path, map_location="cpu", weights_only=True)


class Weights:
    """The source tensors by name, with a common prefix stripped; ``take`` marks them used, and
    ``done`` refuses tensors that were never used (a mapping that would silently drop weights)."""

    def __init__(self, tensors: dict, prefix: str, ignore: tuple = ()):
        self.tensors = {k.removeprefix(prefix): v for k, v in tensors.items() if not k.endswith(ignore)}
        self.used = set()

    def take(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise CheckpointError(f"the weights lack {name!r}")
        self.used.add(name)
        return self.tensors[name]

    def has(self, name: str) -> bool:
        return name in self.tensors

    def done(self, out: dict) -> dict:
        left = sorted(set(self.tensors) - self.used)
        if left:
            raise CheckpointError(f"weights {left[:3]} have no place in the minilm model")
        return out


def _norm(out: dict, w: Weights, source: str, target: str, bias: bool = True) -> None:
    out[f"{target}.weight"] = w.take(f"{source}.weight")
    if bias:
        out[f"{target}.bias"] = w.take(f"{source}.bias")


def _head(out: dict, w: Weights, tied: bool, name: str) -> dict:
    out["lm_head.weight"] = out["wte.weight"] if tied else w.take(name)
    if tied and w.has(name):
        w.take(name)  # a tied head saved anyway: the same tensor
    return out


def gpt2_weights(tensors: dict, model: dict) -> dict:
    w = Weights(tensors, "transformer.", ignore=(".attn.bias", ".attn.masked_bias"))
    out = {"wte.weight": w.take("wte.weight"), "positions.table.weight": w.take("wpe.weight")}
    for i in range(model["n_layer"]):
        h, b = f"h.{i}", f"blocks.{i}"
        _norm(out, w, f"{h}.ln_1", f"{b}.ln_1")
        _norm(out, w, f"{h}.ln_2", f"{b}.ln_2")
        for source, target in (("attn.c_attn", "attn.qkv"), ("attn.c_proj", "attn.proj"),
                               ("mlp.c_fc", "mlp.fc"), ("mlp.c_proj", "mlp.proj")):
            out[f"{b}.{target}.weight"] = w.take(f"{h}.{source}.weight").t().contiguous()  # Conv1D: (in, out)
            out[f"{b}.{target}.bias"] = w.take(f"{h}.{source}.bias")
    _norm(out, w, "ln_f", "ln_f")
    return w.done(_head(out, w, model["tie_embeddings"], "lm_head.weight"))


def neox_weights(tensors: dict, model: dict) -> dict:
    w = Weights(tensors, "gpt_neox.", ignore=(".attention.bias", ".attention.masked_bias", "rotary_emb.inv_freq"))
    heads, width = model["n_head"], model["d_model"]
    out = {"wte.weight": w.take("embed_in.weight")}
    for i in range(model["n_layer"]):
        h, b = f"layers.{i}", f"blocks.{i}"
        _norm(out, w, f"{h}.input_layernorm", f"{b}.ln_1")
        _norm(out, w, f"{h}.post_attention_layernorm", f"{b}.ln_2")
        qkv = w.take(f"{h}.attention.query_key_value.weight")  # rows: (head, q|k|v, dim)
        out[f"{b}.attn.qkv.weight"] = qkv.view(heads, 3, -1, width).transpose(0, 1).reshape(3 * width, width)
        bias = w.take(f"{h}.attention.query_key_value.bias")
        out[f"{b}.attn.qkv.bias"] = bias.view(heads, 3, -1).transpose(0, 1).reshape(3 * width)
        for source, target in (("attention.dense", "attn.proj"), ("mlp.dense_h_to_4h", "mlp.fc"),
                               ("mlp.dense_4h_to_h", "mlp.proj")):
            _norm(out, w, f"{h}.{source}", f"{b}.{target}")
    _norm(out, w, "final_layer_norm", "ln_f")
    head = "embed_out.weight" if w.has("embed_out.weight") else "lm_head.weight"  # older / newer name
    return w.done(_head(out, w, model["tie_embeddings"], head))


def llama_weights(tensors: dict, model: dict) -> dict:
    w = Weights(tensors, "model.", ignore=("rotary_emb.inv_freq",))
    out = {"wte.weight": w.take("embed_tokens.weight")}
    for i in range(model["n_layer"]):
        h, b = f"layers.{i}", f"blocks.{i}"
        _norm(out, w, f"{h}.input_layernorm", f"{b}.ln_1", bias=False)
        _norm(out, w, f"{h}.post_attention_layernorm", f"{b}.ln_2", bias=False)
        out[f"{b}.attn.qkv.weight"] = torch.cat([w.take(f"{h}.self_attn.{p}_proj.weight") for p in "qkv"])
        if model["qkv_bias"]:
            out[f"{b}.attn.qkv.bias"] = torch.cat([w.take(f"{h}.self_attn.{p}_proj.bias") for p in "qkv"])
        out[f"{b}.attn.proj.weight"] = w.take(f"{h}.self_attn.o_proj.weight")
        out[f"{b}.mlp.fc.weight"] = torch.cat([w.take(f"{h}.mlp.{p}_proj.weight") for p in ("gate", "up")])
        out[f"{b}.mlp.proj.weight"] = w.take(f"{h}.mlp.down_proj.weight")
    _norm(out, w, "norm", "ln_f", bias=False)
    return w.done(_head(out, w, model["tie_embeddings"], "lm_head.weight"))


WEIGHTS: dict[str, Callable] = {"gpt2": gpt2_weights, "gpt_neox": neox_weights, "llama": llama_weights,
                                "mistral": llama_weights, "qwen2": llama_weights}
