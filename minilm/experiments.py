"""Experiments that run end to end from one command and write a self-contained report.

    python -m minilm experiment length-generalization [--quick] [--out DIR] [--seed N] [key=value ...]

``length-generalization`` (train short, test long; Press et al. 2022; Chen et al. 2023; Peng et al. 2023):

1. From scratch, identical tiny models and budgets (same seed, same batches): one model per
   position kind (sinusoidal, learned, rope, alibi, t5, none) at training length L.
2. Each is evaluated at 1x .. 16x L (non-overlapping windows, the same scored tokens at
   every length; ``minilm.evaluation``).
3. Base-frequency ablation: sinusoidal with base 1000, 10000 (the model of step 1) and
   100000, at L and 2L.
4. Context extension to 4L from the rope model: position interpolation (linear), NTK-aware
   and YaRN scaling, each fine-tuned for the same few steps at 4L with a lower learning
   rate, plus plain rope fine-tuned at 4L without scaling (control); and the same scalings
   zero-shot (no fine-tuning), plus dynamic NTK. All evaluated at 1x .. 16x L.

Everything goes under ``--out``: ``report.md`` (``minilm.report``: tables, links to the
plots, every config as YAML, git commit, machine, wall times), ``results.csv`` (every
evaluated cell), the PNG plots (when matplotlib is installed) and ``runs/<name>/`` with the
checkpoints (a ``.gitignore`` there keeps them out of git). The command is
``minilm.cli.experiment``. Settings are a nested plan (``FULL`` or
``QUICK``); ``key=value`` arguments override it, e.g. ``data.corpus=my_texts/``,
``train.max_steps=500``, ``finetune.max_steps=50``, ``eval.max_tokens=8192``.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import sys
import time
from typing import Callable, Optional

from minilm import evaluation
from minilm.common import MinilmError
from minilm.config import ConfigError, apply_overrides, build_config, resolve_config
from minilm.trainer import train

KINDS = ("sinusoidal", "learned", "rope", "alibi", "t5", "none")

# The full run: about 35-40 minutes on an idle 2-core CPU (float32).
FULL = {
    "seed": 1337,
    "model": {"n_layer": 4, "n_head": 4, "d_model": 128, "block_size": 128, "dropout": 0.0, "bias": False},
    "data": {"corpus": "shakespeare", "vocab_size": 1024, "dir": "data"},
    "train": {"batch_size": 16, "max_steps": 600, "lr": 2.0e-3, "min_lr": 2.0e-4, "warmup_steps": 60,
              "weight_decay": 0.1, "grad_clip": 1.0, "dtype": "auto", "device": "auto"},
    "finetune": {"batch_size": 4, "max_steps": 200, "lr": 5.0e-4, "min_lr": 5.0e-5, "warmup_steps": 20},
    "extension": {"factor": 4, "scalings": ["linear", "ntk", "yarn"], "control": True},
    "ablation": {"bases": [1000.0, 10000.0, 100000.0], "multiples": [1, 2]},
    "eval": {"multiples": [1, 2, 4, 8, 16], "max_tokens": 16384, "batch_tokens": 8192, "mode": "nonoverlapping"},
}

# --quick: the same steps with tiny models, a few dozen training steps and short evaluations.
QUICK = copy.deepcopy(FULL)
QUICK["model"].update({"n_layer": 2, "n_head": 2, "d_model": 32, "block_size": 32})
QUICK["train"].update({"batch_size": 8, "max_steps": 30, "warmup_steps": 5, "lr": 3.0e-3, "min_lr": 3.0e-4})
QUICK["finetune"].update({"batch_size": 2, "max_steps": 10, "warmup_steps": 2})
QUICK["eval"].update({"multiples": [1, 2, 4], "max_tokens": 1024})

# trainer settings every run of an experiment shares: no periodic evaluation, one checkpoint at the end
RUN_DEFAULTS = {"eval_interval": 10 ** 9, "eval_iters": 2, "log_interval": 10, "checkpoint_interval": 10 ** 9,
                "sample_tokens": 0, "final_eval_tokens": 0}


class ExperimentError(MinilmError):
    """A bad experiment setting; the message is one line meant for the user."""


# --------------------------------------------------------------------------- plan and configs

def make_plan(quick: bool = False, seed: Optional[int] = None, overrides=()) -> dict:
    """The nested settings of a run: FULL or QUICK with ``key=value`` overrides applied."""
    plan = copy.deepcopy(QUICK if quick else FULL)
    for assignment in overrides:
        section = assignment.split("=", 1)[0].strip().lstrip("-").split(".")[0]
        if section not in plan:
            raise ExperimentError(f"override {assignment!r}: unknown section {section!r}; valid: {', '.join(plan)}")
    apply_overrides(plan, overrides)
    if seed is not None:
        plan["seed"] = seed
    return plan


def run_config(plan: dict, out_dir: str, position: dict, *, block_size: Optional[int] = None,
               init_from: Optional[str] = None):
    """The Config of one run: the plan's model, data and training budget (the fine-tune budget
    with ``init_from``), this position setting, and the shared trainer settings."""
    train_settings = {**RUN_DEFAULTS, **plan["train"]}
    if init_from is not None:
        train_settings.update(plan["finetune"])
        train_settings["init_from"] = init_from
    tree = {"model": {**plan["model"], "position": position,
                      "block_size": block_size or plan["model"]["block_size"]},
            "data": plan["data"], "train": train_settings, "out_dir": out_dir, "seed": plan["seed"]}
    try:
        return resolve_config(build_config(copy.deepcopy(tree)))
    except ConfigError as exc:
        raise ExperimentError(f"experiment settings: {exc}") from None


# --------------------------------------------------------------------------- the experiment

class Runner:
    """Trains and evaluates the runs of one experiment, keeping results and timings.

    ``log(message)`` is told what is being trained (the command line prints it); ``quiet``
    turns off the trainer's and the evaluation's own progress output."""

    def __init__(self, plan: dict, out: str, quiet: bool = False, overwrite: bool = False,
                 log: Optional[Callable[[str], None]] = None):
        self.plan, self.out, self.quiet, self.overwrite, self.log = plan, out, quiet, overwrite, log
        self.runs_dir = os.path.join(out, "runs")
        self.configs: dict = {}  # run name -> Config
        self.summaries: dict = {}  # run name -> trainer summary
        self.tables: dict = {"scratch": [], "ablation": [], "extension": []}  # table -> [evaluation.Result]
        self._scored: dict = {}  # (run, overrides, length) -> Result, so no cell is computed twice
        self.phases: list = []  # (phase, seconds)

    def say(self, message: str) -> None:
        if self.log is not None:
            self.log(message)

    def train(self, name: str, position: dict, **kw) -> str:
        config = run_config(self.plan, os.path.join(self.runs_dir, name), position, **kw)
        self.configs[name] = config
        self.say(f"training {name}: position {position}, block_size {config.model.block_size}, "
                 f"{config.train.max_steps} steps" + (f" from {kw['init_from']}" if kw.get("init_from") else ""))
        self.summaries[name] = train(config, quiet=self.quiet, overwrite=self.overwrite)
        return config.out_dir

    def evaluate(self, name: str, label: str, multiples, *, overrides=(), table: str) -> None:
        """Score run ``name`` at ``multiples`` of L (all at the same scored tokens: the longest
        length of the plan fixes them) and add the cells to ``table`` under ``label``."""
        e, L = self.plan["eval"], self.plan["model"]["block_size"]
        lengths = [int(m * L) for m in multiples]
        todo = [t for t in lengths if (name, tuple(overrides), t) not in self._scored]
        if todo:
            longest = int(max(max(e["multiples"]), max(self.plan["ablation"]["multiples"])) * L)
            budget = e["max_tokens"] // longest * longest  # the same scored tokens for every call
            for r in evaluation.evaluate_checkpoints(
                    [os.path.join(self.runs_dir, name)], lengths=todo, mode=e["mode"], max_tokens=budget,
                    overrides=overrides, labels=[label], batch_tokens=e["batch_tokens"], quiet=self.quiet):
                self._scored[(name, tuple(overrides), r.length)] = r
        self.tables[table] += [dataclasses.replace(self._scored[(name, tuple(overrides), t)], label=label)
                               for t in lengths]

    def phase(self, name: str, started: float) -> None:
        self.phases.append((name, time.time() - started))

    def run(self) -> None:
        plan = self.plan
        os.makedirs(self.runs_dir, exist_ok=True)
        with open(os.path.join(self.runs_dir, ".gitignore"), "w") as f:
            f.write("# checkpoints of minilm.experiments runs: not for git\n*\n")
        multiples = plan["eval"]["multiples"]

        started = time.time()
        for kind in KINDS:
            self.train(kind, {"kind": kind})
        self.phase(f"train {len(KINDS)} schemes from scratch", started)

        started = time.time()
        for kind in KINDS:
            self.evaluate(kind, kind, multiples, table="scratch")
        self.phase("evaluate them at every length", started)

        started = time.time()
        for base in plan["ablation"]["bases"]:
            name = "sinusoidal" if base == 10000 else f"sinusoidal-base{base:g}"
            if name != "sinusoidal":
                self.train(name, {"kind": "sinusoidal", "base": float(base)})
            self.evaluate(name, f"base {base:g}", plan["ablation"]["multiples"], table="ablation")
        self.phase("sinusoidal base ablation", started)

        started = time.time()
        factor = plan["extension"]["factor"]
        long = int(factor * plan["model"]["block_size"])
        source = os.path.join(self.runs_dir, "rope")
        self.evaluate("rope", "rope, no scaling", multiples, table="extension")
        for scaling in [*plan["extension"]["scalings"], "dynamic"]:
            self.evaluate("rope", f"{scaling}, zero-shot", multiples, table="extension",
                          overrides=[f"model.position.scaling={{type: {scaling}, factor: {factor}}}"])
        for scaling in plan["extension"]["scalings"]:
            name = f"rope-{scaling}-{long}"
            self.train(name, {"kind": "rope", "scaling": {"type": scaling, "factor": factor}},
                       block_size=long, init_from=source)
            self.evaluate(name, f"{scaling}, fine-tuned at {long}", multiples, table="extension")
        if plan["extension"]["control"]:
            name = f"rope-plain-{long}"
            self.train(name, {"kind": "rope"}, block_size=long, init_from=source)
            self.evaluate(name, f"no scaling, fine-tuned at {long}", multiples, table="extension")
        self.phase(f"rope extension to {long}", started)


if __name__ == "__main__":
    print("error: this command moved: use python -m minilm experiment ...", file=sys.stderr)
    sys.exit(2)
