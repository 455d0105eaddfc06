"""Reading a run's settings: a YAML config file (a user's path, ./configs/, or one shipped in
the package) with ``dotted.key=value`` overrides on top, and what the user gave of them
(``given_keys``, ``was_given``); the settings themselves and their checks are ``minilm.config``'s."""

from __future__ import annotations

import os
import typing
from typing import Optional

import yaml

from minilm.common import suggest
from minilm.config import Config, ConfigError, build_config
from minilm.yamlfile import YAMLBoundError, parse_yaml, yaml_problem


def apply_overrides(
    tree: dict, assignments: typing.Sequence[str], *, allowed: typing.Sequence[str] = (), what: str = ""
) -> dict:
    """Apply ``dotted.key=value`` assignments (values parsed as YAML, else kept as strings) to a nested
    dict in place and return it. With ``allowed`` (key prefixes), any other key is a ConfigError saying
    what may change ``what`` (e.g. "at evaluation time"). A new ``model.position.kind`` starts its options afresh."""
    for assignment in assignments:
        key = assignment.split("=", 1)[0].strip().lstrip("-")
        if "=" not in assignment:
            raise ConfigError(f"override {assignment!r} has no value: write it as {key}=VALUE")
        if allowed and not key.startswith(tuple(allowed)):
            raise ConfigError(
                f"override {assignment!r} is not allowed {what}: only "
                f"{', '.join(a + '*' if a.endswith('.') else a for a in allowed)} can change"
            )
        if key == "model.position.kind" and isinstance(tree.get("model", {}).get("position"), dict):
            if assignment.split("=", 1)[1].strip() != tree["model"]["position"].get("kind"):
                tree["model"]["position"] = {}
        raw = assignment.split("=", 1)[1]
        try:
            value = parse_yaml(raw) if raw.strip() else None
        except YAMLBoundError as exc:
            raise ConfigError(f"override {key}: {yaml_problem(exc)}") from None
        except yaml.YAMLError:
            value = raw
        node, parts = tree, key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {key}: '{part}' is a value, not a section")
            node = child
        node[parts[-1]] = value
    return tree


SHIPPED_CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")  # package data


def find_config_file(name: str) -> str:
    """Look a config up as given (a user's own path wins), then under ./configs/, then among the
    configs shipped in the package (``SHIPPED_CONFIGS``: rope.yaml, alibi.yaml, ...)."""
    for path in (name, os.path.join("configs", name), os.path.join(SHIPPED_CONFIGS, name)):
        if os.path.isfile(path):
            return path
    available = sorted(f for f in os.listdir(SHIPPED_CONFIGS) if f.endswith(".yaml"))
    raise ConfigError(
        f"config file {name!r} not found in ., ./configs/ or the shipped configs: {suggest(name, available)}"
    )


def load_config(path: Optional[str] = None, overrides: typing.Sequence[str] = ()) -> Config:
    """Read a YAML config (or the defaults when ``path`` is None), apply overrides, validate."""
    tree: dict = {}
    if path is not None:
        resolved = find_config_file(path)
        try:
            with open(resolved) as f:
                tree = parse_yaml(f) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{resolved} is not valid YAML: {yaml_problem(exc)}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config {resolved!r}: {getattr(exc, 'strerror', None) or exc}") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"{resolved} must hold a mapping with sections model, data, train")
    tree = apply_overrides(tree, overrides)
    config = build_config(tree)
    config.given, config.overridden = given_keys(tree), given_keys(apply_overrides({}, overrides))
    return config


def given_keys(tree: dict, prefix: str = "") -> frozenset:
    """Every dotted key (sections too) a config file and its overrides set: what the user chose."""
    keys = set()
    for key, value in tree.items():
        keys.add(prefix + str(key))
        if isinstance(value, dict):
            keys |= given_keys(value, f"{prefix}{key}.")
    return frozenset(keys)


def was_given(config: "Config", key: str) -> bool:
    """Whether the user set dotted ``key`` (``load_config`` records it); True for a config built in code."""
    given = getattr(config, "given", None)
    return given is None or key in given
