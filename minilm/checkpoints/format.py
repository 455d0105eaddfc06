"""Atomic checkpoint save and safe load.

A checkpoint is one ``torch.save`` file (``<out_dir>/ckpt.pt``) holding a dict:
``format``/``version`` (to recognise foreign files), ``model`` (state dict of the raw,
uncompiled module), ``config`` (the full run config as a plain dict), ``tokenizer``
(the sentencepiece model proto, bytes), ``run_dir`` (the directory the run was started in: what
its config's relative paths mean) and, for resuming, ``optimizer``, ``step``,
``rng`` and ``data_state``. Writes go to a temp file in the same directory, are fsynced,
then renamed over the old file (``common.atomic_write``), so a crash mid-save never harms
the last good checkpoint. Loads use ``torch.load(weights_only=True)`` and check what they read
(``check_contents``): the file's zip CRCs first (torch.load reads a file whose bytes changed
after it was written without a word: 64 flipped bytes changed 17 optimiser values), then every
section present, a config holding its model section and position setting (``check_config``), and
floating-point, finite weights (``minilm.model.gpt.weight_fault``, which Hugging Face weights meet too).

This module knows the file format only; turning a checkpoint back into a model is
``minilm.checkpoints.loading.load_model``.
"""

from __future__ import annotations

import codecs
import dataclasses
import errno
import hashlib
import os
import pickle
import re
import zipfile
from typing import Optional

import torch

from minilm.common import MinilmError, atomic_write, first_sentence, shown
from minilm.config import DataConfig, ModelConfig
from minilm.model.gpt import weight_fault

# bytes (the tokenizer) pickle as _codecs.encode calls, which torch < 2.5 refuses to load with weights_only
torch.serialization.add_safe_globals([codecs.encode])

FORMAT = "minilm-checkpoint"
VERSION = 1
FILENAME = "ckpt.pt"
SHARDED = "ckpt.dcp"  # train.checkpoint_format: sharded (minilm.training.saving), beside or instead of FILENAME


class CheckpointError(MinilmError):
    """A missing, truncated or foreign checkpoint; the message is one line for the user."""


def resolve(path: str) -> str:
    """A checkpoint file, or an out_dir holding ``ckpt.pt``."""
    if os.path.isdir(path):
        candidate, sharded = os.path.join(path, FILENAME), os.path.join(path, SHARDED)
        if os.path.basename(os.path.normpath(path)) == SHARDED or (
            not os.path.isfile(candidate) and os.path.isdir(sharded)
        ):
            found = path if os.path.basename(os.path.normpath(path)) == SHARDED else sharded
            raise CheckpointError(
                f"{found!r} is a sharded checkpoint: make one file of it with "
                f"'python -m minilm unshard {found}' and give that file"
            )
        if os.path.isfile(candidate) and os.path.isdir(sharded):
            check_not_stale(path, candidate, sharded)
        if not os.path.isfile(candidate):
            raise CheckpointError(f"no checkpoint in directory {path!r}: expected {candidate}")
        return candidate
    if not os.path.exists(path):
        raise CheckpointError(
            f"checkpoint {path!r} does not exist: give a checkpoint file or an out_dir with {FILENAME}"
        )
    return path


def _step(path: str, **options):
    try:
        return torch.load(path, map_location="cpu", weights_only=True, **options).get("step")
    except Exception:  # noqa: BLE001 - an unreadable file is reported by the load that follows
        return None


def check_not_stale(out_dir: str, file: str, sharded: str) -> None:
    """An out_dir holding both checkpoints (``minilm unshard`` wrote the file): refuse the file
    when the sharded one is further on (the run went on after the unshard)."""
    at, further = _step(file, mmap=True), _step(os.path.join(sharded, "run.pt"))
    if at is not None and further is not None and further > at:
        raise CheckpointError(
            f"{out_dir!r} holds {FILENAME} at step {at} and {SHARDED} at step {further}: bring "
            f"{FILENAME} up to date with 'python -m minilm unshard {out_dir} --overwrite', or give "
            f"{file} to use step {at}"
        )


def file_path(path: str) -> str:
    """The file ``save`` writes for ``path``: itself when it names a .pt file, else ckpt.pt inside it."""
    return os.path.join(path, FILENAME) if os.path.isdir(path) or not path.endswith(".pt") else path


def save(state: dict, path: str) -> str:
    """Write ``state`` atomically to ``path`` (a file, or a directory to hold ckpt.pt: ``file_path``)."""
    path = file_path(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    state = {"format": FORMAT, "version": VERSION, **state}
    atomic_write(path, lambda f: torch.save(state, f))
    return path


def load(path: str, map_location: Optional[str] = "cpu") -> dict:
    """Load and check a checkpoint file or out_dir; clear errors for anything unusable."""
    path = resolve(path)
    check_integrity(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        if found is None:  # not a pickle at all: random bytes, another format
            raise CheckpointError(
                f"cannot read checkpoint {path!r}: it is not a file that torch.save wrote "
                f"(truncated, or another format); give a minilm checkpoint or out_dir"
            ) from None
        raise CheckpointError(
            f"cannot read checkpoint {path!r}: it holds Python objects other than tensors and "
            f"plain data ({found.group(1)}), which minilm never loads (weights_only=True)"
        ) from None
    except OSError as exc:
        if exc.errno in (errno.EINVAL, None):  # the zip reader's word for a cut-off file
            raise CheckpointError(
                f"cannot read checkpoint {path!r}: it is truncated or damaged "
                f"({exc.strerror or exc}); give a complete checkpoint"
            ) from None
        raise CheckpointError(f"cannot read checkpoint {path!r}: {exc.strerror or exc}") from None
    except Exception as exc:  # noqa: BLE001 - a damaged file fails in many ways (KeyError, struct.error, ...)
        raise CheckpointError(
            f"cannot read checkpoint {path!r} (truncated or not a minilm checkpoint): "
            f"{first_sentence(str(exc), type(exc).__name__)}"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path!r} is not a minilm checkpoint (no '{FORMAT}' marker)")
    if state.get("version") != VERSION:
        raise CheckpointError(f"{path!r} has checkpoint version {state.get('version')!r}; this minilm reads {VERSION}")
    check_contents(state, path)
    state["path"] = path
    state["model"] = upgraded_weights(state["model"])
    return state


def check_integrity(path: str) -> None:
    """A one-line CheckpointError when a member of the checkpoint's zip fails its CRC (bytes changed
    after torch.save wrote them); a file that is not a zip is left to torch.load to judge."""
    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise CheckpointError(
            f"cannot read checkpoint {path!r}: it is damaged ({exc}); give an intact checkpoint"
        ) from None
    if bad is not None:
        raise CheckpointError(
            f"checkpoint {path!r} is damaged: its part {bad.split('/')[-1]!r} fails its checksum (the "
            f"file changed after it was written); give an intact checkpoint"
        )


def check_contents(state: dict, path: str) -> None:
    """Every section present, a config as ``check_config`` wants it, and weights that are finite
    floating-point tensors (every weight minilm writes is; ``minilm.model.gpt.weight_fault``, the
    check of Hugging Face weights too): one line naming what is wrong."""
    for key in ("model", "config", "tokenizer"):
        if key not in state:
            raise CheckpointError(f"{path!r} is incomplete: it lacks '{key}'")
    check_config(state["config"], path)
    if not isinstance(state["model"], dict) or not all(isinstance(v, torch.Tensor) for v in state["model"].values()):
        raise CheckpointError(f"{path!r} is damaged: its model section is not a mapping of tensors")
    for name, tensor in state["model"].items():
        fault = weight_fault(tensor)
        if fault is not None:
            raise CheckpointError(
                f"{path!r} holds weight {name!r} {fault}; the run that wrote it diverged or the file was "
                f"altered: use an earlier checkpoint"
            )


def check_config(config, path: str) -> None:
    """A checkpoint's config (a file's or a sharded checkpoint's record) as minilm writes it: a mapping
    whose ``model`` section holds a ``position`` setting with a kind, and whose other sections
    (``data``, ``train``), where present, are mappings; one line naming what is not."""
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise CheckpointError(
            f"{path!r} is incomplete: its config holds no model section (got "
            f"{type(config).__name__}); give a checkpoint that minilm wrote"
        )
    for section in ("data", "train"):
        if section in config and not isinstance(config[section], dict):
            raise CheckpointError(
                f"{path!r} is damaged: its config's {section} section is {shown(config[section])}: expected "
                f"a mapping of {section} settings; give a checkpoint that minilm wrote"
            )
    if "position" not in config["model"]:
        raise CheckpointError(
            f"{path!r} is incomplete: its config's model section lacks position (the position setting, "
            f"e.g. {{kind: rope}}); give a checkpoint that minilm wrote"
        )
    position = config["model"]["position"]
    if not isinstance(position, dict) or not isinstance(position.get("kind"), str):
        raise CheckpointError(
            f"{path!r} is damaged: its config's model.position is {shown(position)}: expected a mapping "
            f"with a kind (e.g. {{kind: rope}}); give a checkpoint that minilm wrote"
        )


def upgraded_weights(weights: dict) -> dict:
    """A state dict with the weights renamed since it was saved, at their values now: FIRE's
    ``threshold`` (a count of positions) is learned as its log, ``log_threshold``."""
    out = dict(weights)
    for key in [k for k in out if k.startswith("positions.") and k.endswith(".threshold")]:
        out[key[: -len("threshold")] + "log_threshold"] = out.pop(key).abs().log()
    return out


def with_defaults(config: dict) -> dict:
    """A checkpoint's config dict with the keys it lacks (options added after it was written) at
    the values that reproduce what the code did then: ``model.embedding_scale`` 1 (no scaling
    existed), every other model and data option at its default. A copy; the state is untouched."""
    config = {**config, "model": dict(config.get("model", {})), "data": dict(config.get("data", {}))}
    config["model"].setdefault("embedding_scale", 1.0)
    for section, cls in (("model", ModelConfig), ("data", DataConfig)):
        for f in dataclasses.fields(cls):
            if f.name not in config[section] and f.default is not dataclasses.MISSING:
                config[section][f.name] = f.default
    return config


def weights_hash(weights: dict) -> str:
    """sha256 over every tensor of a state dict, by name (its name, dtype, shape and bytes): the
    identity of a LoRA run's base, whatever file format holds it (``minilm.training.adapters``)."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        tensor = weights[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
