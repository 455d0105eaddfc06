"""Hugging Face model directories read as minilm checkpoints.

``read_hf(path)`` turns a ``transformers`` model directory (config.json, safetensors or torch
weights, tokenizer files) into the dict a minilm checkpoint file holds: ``model`` (a minilm
state dict), ``config`` (a full run config as a plain dict), ``tokenizer`` (bytes) and
``path``. ``minilm.checkpoints.loading.load_model`` then builds the model as for any
checkpoint, so every scaling, ``interpolated`` and ``train.init_from`` apply to imported
models too. How each family's config and weights map is its own file (``minilm.hf.gpt2``,
``neox``, ``llama``, ``phi3``, ``mpt``); the families are listed in ``minilm.hf.families``.

``path`` is a directory recognised by its config.json, or ``hf:NAME``: a repo id already in
the local Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else
~/.cache/huggingface/hub). Nothing is ever downloaded. Anything minilm cannot map is a
one-line ``HFError`` naming what is supported; every tensor is checked as it is read, as the
weights of minilm's own checkpoints are (``read_weights``), so a NaN, inf or integer weight is
refused by its name and file rather than reaching a forward pass.
"""

from __future__ import annotations

import json
import os

import torch

try:  # the hf extra
    from safetensors.torch import load_file as load_safetensors
except ImportError:  # pragma: no cover - reported when a safetensors file is read
    load_safetensors = None

from minilm.common import MinilmError, first_sentence, shown
from minilm.config import Config, ModelConfig
from minilm.data.hf_tokenizer import HFTokenizer
from minilm.hf.families import READERS
from minilm.hf.family import HFError
from minilm.model.gpt import GPT, weight_fault

PREFIX = "hf:"


def is_hf_source(path: str) -> bool:
    """True for ``hf:NAME`` and for a directory holding config.json (and no minilm ckpt.pt)."""
    return str(path).startswith(PREFIX) or (
        os.path.isdir(path)
        and os.path.isfile(os.path.join(path, "config.json"))
        and not os.path.isfile(os.path.join(path, "ckpt.pt"))
    )


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
        raise HFError(
            f"{PREFIX}{name} is not in the local Hugging Face cache ({hub_cache()}): minilm never "
            f"downloads; fetch it yourself (hf download {name}) or give its directory"
        )
    ref = os.path.join(repo, "refs", "main")
    if os.path.isfile(ref):
        with open(ref, encoding="utf-8") as f:
            chosen = os.path.join(snapshots, f.read().strip())
        if os.path.isdir(chosen):
            return chosen
    found = sorted(os.listdir(snapshots))
    if len(found) != 1:
        raise HFError(
            f"{PREFIX}{name}: {len(found)} snapshots in {snapshots} and no refs/main to choose "
            f"one; give the snapshot directory itself"
        )
    return os.path.join(snapshots, found[0])


def read_hf(path: str) -> dict:
    """The minilm checkpoint dict of a Hugging Face model directory or ``hf:NAME``."""
    directory, family, model_tree, hf = read_model_tree(path)
    expected = expected_shapes(model_tree, path)
    tensors = read_weights(directory, family.buffers)
    try:
        state_dict = family.read_weights(tensors, model_tree, hf)
    except (RuntimeError, ValueError) as exc:  # a tensor that cannot take the config's shape
        if isinstance(exc, HFError):
            raise HFError(f"{path}: {exc}") from None  # a tensor the family lacks or has no place for
        raise HFError(
            f"{path}: the weights do not fit config.json ({first_sentence(str(exc), type(exc).__name__)})"
        ) from None
    check_shapes(state_dict, expected, path)
    tokenizer = HFTokenizer.from_directory(directory)
    config = Config().to_dict()
    config["model"] = {**config["model"], **model_tree}
    config["data"]["vocab_size"] = tokenizer.vocab_size
    if tokenizer.vocab_size > model_tree["vocab_size"]:
        raise HFError(
            f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model only "
            f"{model_tree['vocab_size']} embedding rows"
        )
    return {"model": state_dict, "config": config, "tokenizer": tokenizer.to_bytes(), "path": str(path)}


def read_model_tree(path: str) -> tuple:
    """(directory, family, minilm model settings, config.json's mapping) of a Hugging Face model
    directory or ``hf:NAME``, from its config.json alone (no weights read: what ``minilm memory`` counts)."""
    directory = cached_snapshot(path[len(PREFIX) :]) if str(path).startswith(PREFIX) else path
    try:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            hf = json.load(f)
    except (OSError, ValueError) as exc:
        raise HFError(f"cannot read {os.path.join(directory, 'config.json')}: {exc}") from None
    if not isinstance(hf, dict):
        raise HFError(f"{path}: config.json holds a {type(hf).__name__}, not the mapping of a model's settings")
    family = READERS.get(hf.get("model_type"))
    if family is None:
        raise HFError(
            f"{path}: model_type {hf.get('model_type')!r} is not supported; supported: {', '.join(sorted(READERS))}"
        )
    check_architectures(hf, path)
    try:
        model_tree = family.read_config(hf, path)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, HFError):
            raise
        raise HFError(
            f"{path}: config.json lacks or garbles {exc}: it does not describe a {family.name} model"
        ) from None
    check_sizes(model_tree, path)
    return directory, family, model_tree, hf


def read_weights(directory: str, buffers: tuple = ()) -> dict:
    """{name: tensor} from model.safetensors / pytorch_model.bin, sharded (the files its index's
    ``weight_map`` names) or not, without the tensors whose names end in ``buffers`` (a family's masks
    and rotary tables, ``Family.buffers``). Every other tensor is checked as it is read, as minilm's
    own checkpoints are (``minilm.model.gpt.weight_fault``: floating point, finite): a NaN, inf or
    integer tensor is a one-line HFError naming it and its file, never a model that computes NaN."""
    for index_name, single in (
        ("model.safetensors.index.json", "model.safetensors"),
        ("pytorch_model.bin.index.json", "pytorch_model.bin"),
    ):
        index = os.path.join(directory, index_name)
        if os.path.isfile(index):
            files = [os.path.join(directory, name) for name in shard_files(index)]
            return {k: v for file in files for k, v in _read_file(file, buffers).items()}
        if os.path.isfile(os.path.join(directory, single)):
            return _read_file(os.path.join(directory, single), buffers)
    raise HFError(
        f"no weights in {directory}: expected model.safetensors or pytorch_model.bin (or their sharded index)"
    )


def shard_files(index: str) -> list:
    """The file names a sharded model's index names in its ``weight_map`` ({tensor name: file name})."""
    try:
        with open(index, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError) as exc:
        raise HFError(f"cannot read {index}: {first_sentence(str(exc), type(exc).__name__)}") from None
    weight_map = found.get("weight_map") if isinstance(found, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) and v for v in weight_map.values()):
        what = "lacks weight_map" if weight_map is None else f"has weight_map={shown(weight_map)}"
        raise HFError(
            f"{index} {what}: expected a mapping of each tensor's name to the file that holds it, "
            f'e.g. {{"weight_map": {{"lm_head.weight": "model-00001-of-00002.safetensors"}}}}'
        )
    return sorted(set(weight_map.values()))


def _read_file(path: str, buffers: tuple = ()) -> dict:
    """The tensors of one weights file, checked (``read_weights``)."""
    if path.endswith(".safetensors") and load_safetensors is None:
        raise HFError(f'reading {path} needs safetensors: pip install -e ".[hf]"')
    try:
        if path.endswith(".safetensors"):
            tensors = load_safetensors(path)
        else:
            tensors = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a cut-off or foreign file fails in each library's own way
        raise HFError(
            f"cannot read the weights {path!r} (truncated or damaged: "
            f"{first_sentence(str(exc), type(exc).__name__)}); download them again"
        ) from None
    if not isinstance(tensors, dict):
        raise HFError(f"{path} holds a {type(tensors).__name__}, not a mapping of tensor names to tensors")
    tensors = {name: tensor for name, tensor in tensors.items() if not str(name).endswith(buffers)}
    for name, tensor in tensors.items():
        fault = weight_fault(tensor)
        if fault is not None:
            raise HFError(f"{path} holds tensor {name!r} {fault}; the file is damaged or altered: download it again")
    return tensors


ARCHITECTURES = {
    "gpt2": "GPT2",
    "gpt_neox": "GPTNeoX",
    "llama": "Llama",
    "mistral": "Mistral",
    "ministral3": "Ministral3",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "smollm3": "SmolLM3",
    "gemma2": "Gemma2",
    "gemma3_text": "Gemma3",
    "exaone4": "Exaone4",
    "olmo3": "Olmo3",
    "phi3": "Phi3",
    "mpt": "Mpt",
    "cohere2": "Cohere2",
}  # model_type -> transformers' class prefix


def check_architectures(hf: dict, path: str) -> None:
    """config.json's ``architectures`` (when given) must name classes of its own ``model_type``:
    a file that says both Llama and GPT-2 describes no one model."""
    named, prefix = hf.get("architectures"), ARCHITECTURES[hf["model_type"]]
    if named is None:
        return
    if not isinstance(named, list) or any(not isinstance(a, str) or not a.startswith(prefix) for a in named):
        raise HFError(
            f"{path}: config.json's architectures={named!r} contradict model_type={hf['model_type']!r} "
            f"(expected {prefix}... classes)"
        )


def expected_shapes(model_tree: dict, path: str) -> dict:
    """{name: shape} of the minilm model config.json describes, built on the meta device (no
    memory); a config minilm cannot build (a width the heads do not divide, ...) is refused."""
    try:
        with torch.device("meta"):
            return {k: tuple(v.shape) for k, v in GPT(ModelConfig(**model_tree)).state_dict().items()}
    except (MinilmError, ValueError, TypeError) as exc:
        raise HFError(
            f"{path}: config.json describes no model minilm can build: {first_sentence(str(exc), type(exc).__name__)}"
        ) from None


def check_shapes(state_dict: dict, expected: dict, path: str) -> None:
    """Every weight has the shape config.json gives it, before any is loaded into a model."""
    for name, shape in expected.items():
        if name in state_dict and tuple(state_dict[name].shape) != shape:
            raise HFError(
                f"{path}: weight {name!r} (minilm's name) has shape {tuple(state_dict[name].shape)} but "
                f"config.json makes it {shape}: the config and the weights disagree"
            )


SIZES = ("vocab_size", "n_layer", "n_head", "d_model", "block_size", "d_ff")


def check_sizes(model_tree: dict, path: str) -> None:
    """A config.json whose sizes are not positive integers is refused by name, before any use."""
    for name in SIZES:
        value = model_tree.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise HFError(f"{path}: config.json gives {name}={value!r} (minilm's name): expected a positive integer")
