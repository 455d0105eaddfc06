"""What lets a training run stop and continue exactly: the stop flag set by Ctrl-C / SIGTERM,
the RNG states saved with a checkpoint, the checks that a resumed run fits its checkpoint and
has steps left to train, the tokenizer it continues with (the checkpoint's), and trimming the
metrics log back to the checkpoint's step."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
from typing import Callable, Optional

import torch

from minilm.checkpoints.format import CheckpointError, with_defaults
from minilm.common import atomic_write, shown
from minilm.config import TRAJECTORY, Config, ConfigError, TrainConfig, fields_with
from minilm.data.corpus import configured_tokenizer
from minilm.data.hf_tokenizer import AnyTokenizer, tokenizer_from_bytes


class StopFlag:
    """Ctrl-C / SIGTERM set a flag that the loop checks after each step (a second Ctrl-C aborts)."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._old = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc):
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def rng_state(device) -> dict:
    """The global RNG states (dropout); the data generator's state is saved as data_state."""
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def check_run_state(state: dict, path: str, device) -> None:
    """What ``--resume`` restores besides the weights and the optimiser, checked before anything is
    restored: ``step`` a count, ``rng`` the global generators' states (``rng_state``: ``torch``, and
    ``cuda`` where the run continues on CUDA) and ``data_state``'s ``generator`` the data generator's,
    each one a state a generator takes (tried on a new generator, so nothing is changed; wherever the
    load mapped the tensor, its bytes are what is judged). A checkpoint
    that passed its CRC but holds a garbled state is a one-line CheckpointError naming it."""

    def refuse(what: str, found: str, expected: str):
        raise CheckpointError(
            f"cannot resume {path!r}: its {what} is {found}: expected {expected}; the file was altered "
            f"(resume from an earlier checkpoint, or start a new run)"
        )

    step, rng, data = state["step"], state["rng"], state["data_state"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        refuse("step", shown(step), "a count of steps >= 0")
    if not isinstance(rng, dict) or "torch" not in rng:
        refuse("rng", shown(rng), "a mapping with the torch generator's state (and cuda's, on CUDA)")
    if not isinstance(data, dict) or "generator" not in data:
        refuse("data_state", shown(data), "a mapping with the data generator's state (generator)")
    states = [("rng.torch", rng["torch"], "cpu"), ("data_state.generator", data["generator"], "cpu")]
    if device.type == "cuda" and "cuda" in rng:
        states.append(("rng.cuda", rng["cuda"], device))
    for what, value, where in states:
        try:
            torch.Generator(device=where).set_state(value.cpu() if torch.is_tensor(value) else value)
        except (TypeError, RuntimeError, ValueError):
            dtype = str(getattr(value, "dtype", "")).replace("torch.", "")
            found = f"a {dtype} tensor of {value.numel():,} values" if torch.is_tensor(value) else shown(value)
            size = torch.Generator(device=where).get_state().numel()
            refuse(what, found, f"the state a {torch.device(where).type} generator writes (a uint8 tensor of {size:,})")


def _first_difference(a, b, prefix=""):
    """The first dotted key where two nested dicts differ, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            diff = _first_difference(a.get(key), b.get(key), f"{prefix}{key}.")
            if diff:
                return diff
        return None
    return None if a == b else (prefix.rstrip("."), a, b)


def check_resumable(config: Config, state: dict) -> None:
    """Resuming needs the same model, data and seeds; train settings may change (e.g. max_steps).
    A key the checkpoint lacks (an option added after it was written) counts at the value that
    reproduces what the code did then (``checkpoints.format.with_defaults``)."""
    ours, theirs = config.to_dict(), with_defaults(state["config"])
    for section in ("model", "data", "seed", "data_seed"):
        diff = _first_difference(ours.get(section), theirs.get(section), f"{section}.")
        if diff:
            key, now, before = diff
            raise ConfigError(
                f"cannot resume {state['path']}: {key}={now!r} but the checkpoint has {before!r}; "
                f"use the same setting or start a new out_dir"
            )


def check_steps_left(config: Config, state: dict, taken: list = ()) -> None:
    """A ConfigError when ``train.max_steps`` (the checkpoint's, or given again) is at or below the
    checkpoint's step: the resumed run would train nothing, only evaluate, log and save again.
    ``taken``: ``resumed_config``'s list, which says when the value is the checkpoint's."""
    step, max_steps = int(state["step"]), config.train.max_steps
    if max_steps <= step:
        finished = " (the run is finished)" if max_steps == step else ""
        whose = (
            " (the checkpoint's: on --resume only one given on the command line replaces it)"
            if f"train.max_steps={max_steps!r}" in taken
            else ""
        )
        raise ConfigError(
            f"cannot resume {state['path']}: it is at step {step}{finished} and train.max_steps={max_steps}{whose}: "
            f"give a train.max_steps above {step} (--resume train.max_steps=N) to train it further"
        )


def resumed_tokenizer(config: Config, state: dict) -> AnyTokenizer:
    """The tokenizer a resumed run encodes its corpus with: the checkpoint's, whose ids its weights
    learned (a tokenizer trained again on the corpus, changed or not, may give its pieces other ids).
    A ``data.tokenizer`` that is no longer that tokenizer is a ConfigError."""
    tokenizer = tokenizer_from_bytes(state["tokenizer"])
    given = configured_tokenizer(config.data)
    if given is not None and given.to_bytes() != tokenizer.to_bytes():
        raise ConfigError(
            f"cannot resume {state['path']}: data.tokenizer={config.data.tokenizer!r} is no longer the tokenizer the "
            f"checkpoint was trained with: restore that directory, or start a new run from the checkpoint with "
            f"train.init_from (which keeps its tokenizer)"
        )
    return tokenizer


TRAJECTORY_DEFAULTS = {key: getattr(TrainConfig(), key) for key in fields_with(TrainConfig, TRAJECTORY)}


def resumed_config(config: Config, state: dict) -> tuple:
    """(config, taken) for ``--resume``: the train settings that change the remaining steps are
    the checkpoint's, except those given again on the command line (``config.overridden``); a
    config built in code (no record of what was given) is taken as it is. ``taken`` lists
    'train.KEY=VALUE' for each setting the checkpoint decided against the config file."""
    overridden = getattr(config, "overridden", None)
    if overridden is None:
        return config, []
    before = {**TRAJECTORY_DEFAULTS, **state["config"].get("train", {})}
    taken = {
        key: before[key]
        for key in fields_with(TrainConfig, TRAJECTORY)
        if f"train.{key}" not in overridden and before[key] != getattr(config.train, key)
    }
    if not taken:
        return config, []
    resumed = dataclasses.replace(config, train=dataclasses.replace(config.train, **taken))
    resumed.given, resumed.overridden = getattr(config, "given", None), overridden
    return resumed, [f"train.{key}={value!r}" for key, value in taken.items()]


def trajectory_changes(config: Config, state: dict) -> list:
    """'train.KEY=NOW (was BEFORE)' for each train setting that differs from the checkpoint's
    and changes the remaining steps (max_steps moves the schedule's end, for one): the resumed
    run is then no longer the one an uninterrupted run would have been. A key newer than the
    checkpoint counts as its default there (``train.schedule``: cosine), which is what that
    run did."""
    before = {**TRAJECTORY_DEFAULTS, **state["config"].get("train", {})}
    return [
        f"train.{key}={getattr(config.train, key)!r} (was {before[key]!r})"
        for key in fields_with(TrainConfig, TRAJECTORY)
        if before[key] != getattr(config.train, key)
    ]


def truncate_metrics(path: str, step: int) -> None:
    """On resume, drop the metrics.jsonl records past the checkpoint's step (``cut_log``)."""
    cut_log(path, step, _jsonl_step)


def cut_log(path: str, step: int, step_of: Callable[[str], Optional[int]]) -> None:
    """On resume, drop a log's lines whose step (``step_of``: None where a line has none it can read)
    is past the checkpoint's: they are from the part of the run that was lost. Every other line but a
    blank one is kept as it is, the user's own among them; only a torn last line (no newline, no step to read: a
    write the stop cut short) goes."""
    if not os.path.exists(path):
        return
    with open(path, newline="") as f:
        lines = f.read().splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] = lines[-1] + "\n" if step_of(lines[-1]) is not None else ""
    atomic_write(path, "".join(line for line in lines if line.strip() and (step_of(line) or 0) <= step))


def _jsonl_step(line: str) -> Optional[int]:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    value = record.get("step") if isinstance(record, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
