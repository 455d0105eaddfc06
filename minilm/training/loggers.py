"""Where a run's metrics go: ``train.loggers``, any of LOGGERS (default ``[jsonl]``). Every
logger gets the same records, those of ``TrainingRun.log``: an event (train, eval, final),
the step and tokens so far, and the scalars (train: loss, lr, grad_norm, tokens_per_s,
elapsed_s, memory_mib; eval and final: val_loss, val_ppl, val_bpc). Only rank 0 logs.

* ``jsonl``: ``metrics.jsonl``, one JSON object per record;
* ``csv``: ``metrics.csv``, one row per scalar (event, step, tokens, name, value): the events
  carry different scalars, so the long form keeps one header;
* ``tensorboard``: event files under ``tensorboard/``, each scalar as ``<event>/<name>`` at its
  step, and the config once as text (the ``tensorboard`` extra);
* ``wandb``: a wandb run (project ``minilm``, files under ``<out_dir>/wandb``) with the
  config as its config and the scalars as ``<event>/<name>``; ``WANDB_MODE=offline`` keeps it
  on disk (the ``wandb`` extra).

A fresh run finds none of an earlier run's files: ``training.outdir.set_aside_previous`` has kept them aside
with a number (``metrics.1.jsonl``, ``tensorboard.1``, ...) before the loggers start, for every logger, on
or not; a resumed run cuts the jsonl and csv back to the checkpoint's step, and tensorboard drops the
later steps (``purge_step``).
A logger whose package is missing is one line naming the extra to install, said before any
file is touched.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
from typing import Callable, Optional, Sequence

import yaml

from minilm.common import MinilmError, atomic_write
from minilm.config import LOGGERS
from minilm.training.resume import cut_log, truncate_metrics

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # logger -> the module (and extra) it needs
JSONL_FILE, CSV_FILE, TENSORBOARD_DIR = "metrics.jsonl", "metrics.csv", "tensorboard"
CSV_FIELDS = ("event", "step", "tokens", "name", "value")


class LoggerError(MinilmError):
    """A logger that cannot run; the message is one line for the user."""


def scalars(record: dict) -> dict:
    """The numbers of a record other than its step and tokens (None and text left out)."""
    return {
        k: v
        for k, v in record.items()
        if k not in ("event", "step", "tokens") and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


class JsonlLogger:
    """Writes each record as a line of JSON to the run's metrics file."""

    def __init__(self, out_dir: str, resumed_step: Optional[int], config: dict, say: Callable[[str], None]):
        self.path = os.path.join(out_dir, JSONL_FILE)
        _start_file(self.path, resumed_step, truncate_metrics)

    def write(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        pass


class CsvLogger:
    """Writes each record as a row of the run's CSV file, under a header of ``CSV_FIELDS``."""

    def __init__(self, out_dir: str, resumed_step: Optional[int], config: dict, say: Callable[[str], None]):
        self.path = os.path.join(out_dir, CSV_FILE)
        _start_file(self.path, resumed_step, _truncate_csv)
        if not os.path.exists(self.path):
            atomic_write(self.path, ",".join(CSV_FIELDS) + "\n")

    def write(self, record: dict) -> None:
        with open(self.path, "a", newline="") as f:
            writer = csv.writer(f)
            for name, value in scalars(record).items():
                writer.writerow([record["event"], record["step"], record["tokens"], name, value])

    def close(self) -> None:
        pass


class TensorBoardLogger:
    """Writes each record as TensorBoard scalars in the run's tensorboard directory."""

    def __init__(self, out_dir: str, resumed_step: Optional[int], config: dict, say: Callable[[str], None]):
        from torch.utils.tensorboard import SummaryWriter  # the optional extra, checked by open_loggers

        self.writer = SummaryWriter(os.path.join(out_dir, TENSORBOARD_DIR), purge_step=resumed_step)
        if resumed_step is None:
            self.writer.add_text("config", "```\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)

    def write(self, record: dict) -> None:
        for name, value in scalars(record).items():
            self.writer.add_scalar(f"{record['event']}/{name}", value, record["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """Writes each record to a Weights & Biases run kept in the run's directory."""

    def __init__(self, out_dir: str, resumed_step: Optional[int], config: dict, say: Callable[[str], None]):
        import wandb  # the optional extra, checked by open_loggers

        self.wandb = wandb
        self.run = wandb.init(
            project="minilm", dir=out_dir, config=config, name=os.path.basename(os.path.abspath(out_dir))
        )

    def write(self, record: dict) -> None:
        self.run.log({f"{record['event']}/{k}": v for k, v in scalars(record).items()}, step=record["step"])

    def close(self) -> None:
        self.run.finish()


KINDS = dict(zip(LOGGERS, (JsonlLogger, CsvLogger, TensorBoardLogger, WandbLogger)))  # in the config's order


def check_loggers(names: Sequence[str]) -> None:
    """LoggerError for a logger whose package is not installed (before any file is touched)."""
    for name in names:
        module = PACKAGES.get(name)
        if module and importlib.util.find_spec(module) is None:
            raise LoggerError(
                f"train.loggers has {name}, which needs the {module} package: "
                f"pip install 'minilm[{name}]' (or pip install {module})"
            )


def open_loggers(
    names: Sequence[str], out_dir: str, resumed_step: Optional[int], config: dict, say: Callable[[str], None]
) -> list:
    """The loggers ``names`` for a run in ``out_dir`` (``resumed_step``: the checkpoint's step
    when resuming, else None), each started."""
    check_loggers(names)
    return [KINDS[name](out_dir, resumed_step, config, say) for name in names]


def _start_file(path: str, resumed_step: Optional[int], cut) -> None:
    """A resumed run cuts the file back to its step (a fresh one finds none: ``set_aside_previous``)."""
    if resumed_step is not None:
        cut(path, resumed_step)


def _truncate_csv(path: str, step: int) -> None:
    """On resume, drop the rows past the checkpoint's step (``resume.cut_log``: the header, and any row
    whose step cannot be read, stay)."""
    cut_log(path, step, _csv_step)


def _csv_step(line: str) -> Optional[int]:
    fields = next(csv.reader([line]), [])  # a row of every field: a torn one (``train,1``) reads as none
    where = CSV_FIELDS.index("step")
    return int(fields[where]) if len(fields) == len(CSV_FIELDS) and fields[where].strip().isdigit() else None
