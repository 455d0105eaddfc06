"""A training run's checkpoint as one file or sharded (``train.checkpoint_format``), and a
sharded checkpoint made into one file.

- ``file``: ``<out_dir>/ckpt.pt`` (``minilm.checkpoints.format``), written by rank 0; under
  FSDP the model and the optimiser's moments are first gathered whole on it
  (``minilm.training.parallel``), so the file is the same however the run was spread.
- ``sharded``: ``<out_dir>/ckpt.dcp/``, written with ``torch.distributed.checkpoint`` (DCP):
  every rank writes its own shards of the model and the optimiser (DCP's ``*.distcp`` files
  and ``.metadata``), and rank 0 adds ``run.pt``, the run's other state (config, tokenizer,
  step, RNG and data generator, scores; ``RECORD``). DCP reads the shards back on any number
  of ranks, one included, cutting them anew, so a run saved on 2 processes resumes on 1 or 4.
  ``ckpt.dcp`` is a link to a version directory beside it (``.ckpt.dcp-<random>``); a save
  fills a new version and moves the link to it in one rename, and only then removes the old
  version: a save killed at any moment leaves the previous checkpoint whole.

``unshard`` reads a sharded checkpoint in one process and writes the ordinary file, optimiser
included, which every command takes and ``--resume`` continues.

DCP is imported by the functions that use it, as in ``minilm.training.parallel``: its import
costs every command about a second otherwise.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import warnings
from typing import Optional

import torch
import torch.distributed

from minilm.checkpoints import format as checkpoint
from minilm.checkpoints.format import CheckpointError
from minilm.common import WriteError, atomic_write, first_sentence, new_directory, temporary_path, write_failure
from minilm.config import Config, ConfigError, from_dict
from minilm.model.gpt import GPT
from minilm.training.adapters import trained_state
from minilm.training.distributed import Dist
from minilm.training.optim import Optimizers, make_optimizer
from minilm.training.parallel import full_model_state, full_optimizer_state
from minilm.training.resume import check_resumable, check_run_state, rng_state

RECORD = "run.pt"
RECORD_FORMAT = "minilm-sharded-checkpoint"


def write_checkpoint(run, val: Optional[dict]) -> str:
    """Write ``run``'s checkpoint (a ``minilm.training.loop.TrainingRun``) as its
    train.checkpoint_format says; every rank calls it. Returns its path."""
    record = {  # everything but the weights and the optimiser's moments
        "config": run.config.to_dict(),
        "run_dir": os.getcwd(),  # what the config's relative paths (data.dir) meant (checkpoints.loading.locate_data)
        "tokenizer": run.prepared.tokenizer.to_bytes(),
        "corpus_fingerprint": run.prepared.manifest.get("source_fingerprint"),  # --resume says when it changed
        "step": run.step,
        "rng": rng_state(run.device),
        "data_state": {
            "generator": run.generator.get_state(),
            "world_size": run.dist.world,
            "tokens_seen": run.tokens_at(run.step),
        },
        "best_val_bpc": run.best_bpc,
        "val": val,
        **({"scaler": run.scaler.state_dict(), "skipped_steps": run.skipped_steps} if run.scaler else {}),
    }
    if run.config.train.checkpoint_format == "sharded":
        return save_sharded(run.ckpt_path, record, run.raw, run.optimizer, run.dist)
    if run.lora_base is not None:  # a LoRA run keeps what it trains and names its base (minilm.training.adapters)
        record["lora_base"] = run.lora_base
    model = trained_state(run.raw) if run.lora_base is not None else full_model_state(run.raw, run.sharded)
    optimizer = run.optimizer.state_dict(lambda part: full_optimizer_state(run.raw, part, run.sharded))
    return on_rank_0(
        run.dist,
        run.ckpt_path,
        lambda: checkpoint.save({**record, "model": model, "optimizer": optimizer}, run.ckpt_path),
    )


def on_rank_0(dist: Dist, path: str, work):
    """``work()`` on rank 0 alone, and how it went told to every rank: a failure to write
    ``path`` there is the same one-line WriteError on every rank (the others would otherwise
    wait for rank 0 at their next collective call for ever). Returns ``path`` off rank 0."""
    done, failure = path, None
    if dist.main:
        try:
            done = work()
        except BaseException as exc:
            failure = write_failure(path, _first_failure(exc))
            if failure is None or not dist.enabled:
                raise failure or exc from None
    if dist.enabled:
        told = [None if failure is None else (failure.path, failure.reason, failure.advice)]
        torch.distributed.broadcast_object_list(told, src=0)
        if told[0] is not None:
            raise WriteError(*told[0])
    return done


def whole_model(run) -> Optional[GPT]:
    """``run``'s model with whole weights on rank 0 (None on the others): the model itself, or
    under FSDP a copy gathered from the shards (every rank calls it)."""
    if not run.sharded:
        return run.raw if run.dist.main else None
    state = full_model_state(run.raw, True)
    if not run.dist.main:
        return None
    model = GPT(run.config.model)
    model.load_state_dict(state)
    return model.to(run.device)


def checkpoint_path(out_dir: str, checkpoint_format: str) -> str:
    """Where a run keeps its checkpoint: ``ckpt.pt``, or ``ckpt.dcp`` when sharded."""
    return os.path.join(out_dir, checkpoint.SHARDED if checkpoint_format == "sharded" else checkpoint.FILENAME)


def resume_state(config: Config, device: torch.device) -> dict:
    """What ``--resume`` continues, checked to fit ``config``: the checkpoint file's dict, or a
    sharded checkpoint's record (no ``model`` key: ``load_sharded`` reads its weights later)."""
    fmt = config.train.checkpoint_format
    path, other = (checkpoint_path(config.out_dir, f) for f in (fmt, "sharded" if fmt == "file" else "file"))
    if not os.path.exists(path):
        if os.path.exists(other):
            raise CheckpointError(
                f"cannot resume: train.checkpoint_format={fmt!r} but out_dir={config.out_dir!r} "
                f"holds {os.path.basename(other)}: resume with train.checkpoint_format="
                f"{'file' if fmt == 'sharded' else 'sharded'}"
            )
        raise CheckpointError(
            f"cannot resume: no checkpoint {path!r}; run without --resume to start "
            f"a new run in out_dir={config.out_dir!r}"
        )
    state = read_record(path) if fmt == "sharded" else checkpoint.load(path, map_location=str(device))
    for key in ("step", "rng", "data_state") + (("optimizer",) if fmt == "file" else ()):
        if key not in state:
            raise CheckpointError(f"cannot resume {path!r}: it lacks '{key}' (not a training checkpoint)")
    check_run_state(state, path, device)  # a damaged state is said before a setting that differs
    check_resumable(config, state)
    if "lora_base" in state and not config.train.lora.r:  # it holds the adapters alone, not a whole model
        lora = state["config"]["train"].get("lora", {})
        raise ConfigError(
            f"cannot resume: {path!r} is a LoRA run's (train.lora.r={lora.get('r')}) but train.lora.r is 0: "
            f"resume with the run's train.lora settings"
        )
    return state


@contextlib.contextmanager
def _quiet_dcp():
    """DCP warns that it assumes one process when there is no process group (meant here), and
    logs tracebacks of its own, partly on the root logger, before raising (minilm says the
    error in one line)."""
    loggers = [logging.getLogger(), logging.getLogger("torch.distributed.checkpoint")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is (disabled|unavailable)")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _shard_state(raw: torch.nn.Module, optimizer: Optimizers) -> dict:
    """What DCP writes and reads: the model's and every optimiser part's state dicts, keyed by
    parameter name (each rank's shards under FSDP, whole tensors in one process)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {
        "model": get_model_state_dict(raw),
        "optimizer": {str(i): get_optimizer_state_dict(raw, part) for i, part in enumerate(optimizer.parts)},
    }


def save_sharded(directory: str, record: dict, raw: torch.nn.Module, optimizer: Optimizers, dist: Dist) -> str:
    """Write a sharded checkpoint: called on every rank (DCP's save is collective); ``record``
    (rank 0's) is everything else the run needs to continue. The shards go to a new version
    directory beside ``directory``, which becomes a link to it once the version is complete."""
    record = {
        "format": RECORD_FORMAT,
        "version": checkpoint.VERSION,
        "optimizer_kind": optimizer.kind,
        "optimizer_groups": [[len(g["params"]) for g in part.param_groups] for part in optimizer.parts],
        **record,
    }
    state = _shard_state(raw, optimizer)
    version = on_rank_0(dist, directory, lambda: _new_version(directory))
    if dist.enabled:
        where = [version]
        torch.distributed.broadcast_object_list(where, src=0)
        version = where[0]
    import torch.distributed.checkpoint as dcp

    try:
        with _quiet_dcp():
            dcp.save(state, checkpoint_id=version)  # collective: a failure on any rank is raised on every rank
        dist.barrier()  # every rank's shards are in place before rank 0 finishes the version and points to it

        def finish():
            atomic_write(os.path.join(version, RECORD), lambda f: torch.save(record, f))
            _point(directory, version)

        on_rank_0(dist, directory, finish)
    except BaseException as exc:
        if dist.main:
            shutil.rmtree(version, ignore_errors=True)
        failure = write_failure(directory, _first_failure(exc))
        if failure is not None:
            raise failure from None
        raise
    return directory


def _first_failure(exc: BaseException) -> BaseException:
    """The exception behind DCP's ``CheckpointException`` (which gathers every rank's), else ``exc``."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(exc, CheckpointException) and exc.failures:
        return next(iter(exc.failures.values()))[0]
    return exc


def _new_version(directory: str) -> str:
    """A new, empty version directory beside ``directory``: ``.<name>-<random>``."""
    parent, name = os.path.split(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    return str(new_directory(parent, f".{name}-"))


def _point(directory: str, version: str) -> None:
    """Make ``directory`` a link to ``version`` in one rename (the old checkpoint stays whole
    until then), then remove the versions nothing points to (earlier ones, and those of saves
    that were killed before this step). A directory found in its place becomes a version."""
    parent, name = os.path.split(os.path.abspath(directory))
    if os.path.isdir(directory) and not os.path.islink(directory):
        os.rename(directory, new_directory(parent, f".{name}-"))
    link = temporary_path(directory)
    os.symlink(os.path.basename(version), link)
    os.replace(link, directory)
    for old in glob.glob(os.path.join(glob.escape(parent), f".{glob.escape(name)}-*")):
        if old != version and not old.endswith(".tmp"):
            shutil.rmtree(old, ignore_errors=True)


def read_record(directory: str) -> dict:
    """The run state of a sharded checkpoint (no weights), checked; ``path`` names it."""
    path = os.path.join(directory, RECORD)
    if not os.path.isfile(path) or not os.path.isfile(os.path.join(directory, ".metadata")):
        raise CheckpointError(
            f"{directory!r} is not a complete sharded checkpoint: it lacks "
            f"{RECORD if not os.path.isfile(path) else '.metadata'}"
        )
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged file fails in many ways
        raise CheckpointError(f"cannot read {path!r}: {type(exc).__name__}: it is damaged or not minilm's") from None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise CheckpointError(f"{path!r} is not the record of a minilm sharded checkpoint")
    if record.get("version") != checkpoint.VERSION:
        raise CheckpointError(
            f"{path!r} has checkpoint version {record.get('version')!r}; this minilm reads {checkpoint.VERSION}"
        )
    checkpoint.check_config(record.get("config"), path)
    return {**record, "path": directory}


def load_sharded(record: dict, raw: torch.nn.Module, optimizer: Optimizers) -> None:
    """Load a sharded checkpoint's weights and optimiser state into ``raw`` and ``optimizer``
    (built, and sharded if so, by the caller); on every rank: each reads the slices it holds."""

    def check_groups(part, sizes):  # the optimiser's own refusal of other parameter groups
        if [len(g["params"]) for g in part.param_groups] != sizes:
            raise ValueError("another number or size of parameter groups")

    settings = optimizer.group_settings()  # this run's, as in Optimizers.load_state_dict
    optimizer.load_state_dict(
        {"kind": record["optimizer_kind"], "parts": record["optimizer_groups"]}, load_part=check_groups
    )
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    state = _shard_state(raw, optimizer)
    try:
        with _quiet_dcp():
            dcp.load(state, checkpoint_id=record["path"])
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - a damaged shard fails in many ways
        cause = _first_failure(exc)
        raise CheckpointError(
            f"cannot read the shards of {record['path']!r}: {type(cause).__name__}: "
            f"{first_sentence(str(cause), 'damaged or incomplete')}"
        ) from None
    set_model_state_dict(raw, state["model"])
    for i, part in enumerate(optimizer.parts):
        set_optimizer_state_dict(raw, part, state["optimizer"][str(i)])
    optimizer.restore_settings(settings)


def unshard(directory: str, out: Optional[str] = None, overwrite: bool = True) -> str:
    """Make one checkpoint file of the sharded checkpoint ``directory`` (an out_dir or its
    ckpt.dcp), optimiser included: ``out``, default ``ckpt.pt`` beside ``ckpt.dcp``, an
    existing one replaced only with ``overwrite``. One process."""
    given = directory
    if os.path.isdir(os.path.join(directory, checkpoint.SHARDED)):
        directory = os.path.join(directory, checkpoint.SHARDED)
    if not os.path.isdir(directory):
        raise CheckpointError(
            f"{given!r} is not a sharded checkpoint: give an out_dir holding {checkpoint.SHARDED}/ or that directory"
        )
    out = checkpoint.file_path(out or os.path.dirname(os.path.abspath(directory)))  # a directory: its ckpt.pt
    if os.path.exists(out) and not overwrite:
        raise CheckpointError(f"{out!r} exists: give --overwrite to replace it, or another --out")
    record = read_record(directory)
    config = from_dict(Config, checkpoint.with_defaults(record["config"]))
    raw = GPT(config.model)
    optimizer = make_optimizer(raw, config.train, torch.device("cpu"))
    load_sharded(record, raw, optimizer)
    kept = {
        k: v for k, v in record.items() if k not in ("format", "version", "path", "optimizer_kind", "optimizer_groups")
    }
    try:
        return checkpoint.save({**kept, "model": raw.state_dict(), "optimizer": optimizer.state_dict()}, out)
    except (OSError, WriteError) as exc:
        raise CheckpointError(f"cannot write {out!r}: {exc.reason if isinstance(exc, WriteError) else exc}") from None
