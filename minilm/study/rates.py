"""The frozen rates: what the tuning step chose, written once and read by every confirmatory run
(issue #58, "tuning is its own step").

``python -m minilm experiment NAME --tune`` (``minilm.study.tune``) chooses each kind's rate scale
(``minilm.study.tuning``) and each extension row's fine-tuning rate (``minilm.study.sweep``) on the
tuning seeds and writes them here, with everything its choice rests on: the plan's settings it was
tuned for (``TUNED_FOR``), each grid as finally tried, the scales rejected and why, and the
held-out cells and retrieval rows of every tuning run. The full study's file is committed beside
its claims (``minilm/study/registered/<experiment>.rates.yaml``), so git shows it written before
the run; a run of the study reads the rates from it and tunes nothing. A run whose plan differs from
the file's in any setting the rates depend on is refused (``check``): rates tuned for another model,
corpus or recipe are no rates for it.
"""

from __future__ import annotations

import copy
import os

import yaml

from minilm.common import MinilmError, atomic_write
from minilm.yamlfile import parse_yaml

REGISTERED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "registered")
# the plan's sections whose settings the rates depend on (eval, seeds and controls do not); the retrieval keys that
# shape training rows or decide the task floor; the extension's factor and fine-tuning length
TUNED_FOR = ("model", "data", "train", "finetune", "schemes", "arms", "tuning", "sweep")
TRAINING_RETRIEVAL = ("answer_share", "query_density", "spread", "depths", "trials")
FILE = "rates.yaml"  # the file's name in an experiment's --out when it is not the registered one (--quick)


class RatesError(MinilmError):
    """No usable frozen rates for a run; the message is one line for the user."""


def registered_path(experiment: str) -> str:
    return os.path.join(REGISTERED, f"{experiment}.rates.yaml")


def tuned_for(plan: dict) -> dict:
    """The settings of ``plan`` the rates were chosen under: ``TUNED_FOR``, how the task enters a training
    row (``TRAINING_RETRIEVAL``) and the extension's factor."""
    return {
        **{key: copy.deepcopy(plan.get(key)) for key in TUNED_FOR},
        "retrieval": {key: copy.deepcopy(plan.get("retrieval", {}).get(key)) for key in TRAINING_RETRIEVAL},
        "extension": {key: plan.get("extension", {}).get(key) for key in ("factor", "curve_steps")},
    }


def record(plan: dict, chosen: dict, grids: dict, rejected: dict, cells: list, retrieval: list, about: dict) -> dict:
    """The file's contents: ``chosen`` {"scales": {kind: scale}, "finetune_lrs": {row: lr}}, ``grids``
    {"scales": {kind: [tried]}, "finetune_lrs": {row: [tried]}}, ``rejected`` {kind: {scale: why}},
    the tuning's held-out ``cells`` and ``retrieval`` rows, and ``about`` (commit, machine, command, and the
    tuning jobs' minutes and process_minutes)."""
    return {
        "experiment": plan["experiment"],
        "about": about,
        "tuned_for": tuned_for(plan),
        "scales": chosen["scales"],
        "finetune_lrs": chosen["finetune_lrs"],
        "grids": grids,
        "rejected": [{"kind": k, "scale": s, "why": why} for k, out in rejected.items() for s, why in out.items()],
        "cells": [{k: v for k, v in c.items() if k not in ("by_position", "truncated_by_position")} for c in cells],
        "retrieval": list(retrieval),
    }


def write(path: str, contents: dict) -> str:
    """The rates file at ``path``, written whole (``atomic_write``), a header saying what it is."""
    header = (
        f"# The frozen rates of the {contents['experiment']} experiment, written by its tuning step "
        f"(python -m minilm experiment {contents['experiment']} --tune); every run of the study reads them and "
        f"tunes nothing (minilm/study/rates.py).\n"
    )
    atomic_write(path, header + yaml.safe_dump(contents, sort_keys=False, width=120))
    return path


def read(path: str, experiment: str) -> dict:
    """The rates file at ``path``; a ``RatesError`` naming the tuning command when there is none."""
    if not os.path.exists(path):
        raise RatesError(
            f"no frozen rates at {path!r}: run the tuning step first (python -m minilm experiment {experiment} "
            f"--tune, with the same overrides), or give --rates FILE"
        )
    try:
        with open(path, encoding="utf-8") as f:
            contents = parse_yaml(f)
    except (OSError, yaml.YAMLError) as exc:
        raise RatesError(f"cannot read the rates file {path!r}: {exc}") from None
    if not isinstance(contents, dict) or not {"tuned_for", "scales", "finetune_lrs"} <= set(contents):
        raise RatesError(f"{path!r} is not a rates file: expected tuned_for, scales and finetune_lrs")
    return contents


def differences(a, b, prefix: str = "") -> list:
    """The dotted keys where two nested settings differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d
            for key in sorted(set(a) | set(b), key=str)
            for d in differences(a.get(key), b.get(key), f"{prefix}{key}.")
        ]
    return [] if a == b else [prefix.rstrip(".")]


def check(contents: dict, path: str, plan: dict, kinds, rows) -> None:
    """Refuse ``contents`` for ``plan`` in one line: settings the rates depend on that differ, or
    kinds / extension rows it has no rate for."""
    changed = differences(contents["tuned_for"], tuned_for(plan))
    if changed:
        raise RatesError(
            f"the rates in {path!r} were tuned for other settings ({', '.join(changed[:4])}"
            f"{' ...' if len(changed) > 4 else ''}): run the tuning step for these (--tune) or give --rates FILE"
        )
    missing = [k for k in kinds if k not in contents["scales"]] + [
        r for r in rows if contents["finetune_lrs"] and r not in contents["finetune_lrs"]
    ]
    if missing:
        raise RatesError(f"the rates in {path!r} have no rate for {missing}: run the tuning step again (--tune)")
