"""Rope settings both ways: a config.json's ``rope_theta``, partial rotary and scaling as
minilm's ``rope`` setting (``rope_position``), and minilm's setting as ``rope_parameters``
(``rope_parameters``).

Reading: scalings of type linear, dynamic, yarn (every key: ``beta_fast``, ``beta_slow``,
``truncate``, ``attention_factor``, ``mscale``, ``mscale_all_dim``, read as transformers reads
them: a beta of 0 is its default, ``mscale`` counts only beside ``mscale_all_dim``), llama3,
longrope (Phi-3: ``short_factor``, ``long_factor``, the attention factor, and transformers'
switch between them by each pass's largest position, ``switch: positions``) and proportional
(p-RoPE: ``partial_rotary_factor`` is the share of frequency pairs kept, over a head rotated
whole); ``original_max_positions`` is the config's ``original_max_position_embeddings``, else
``max_position_embeddings`` (always the latter for dynamic), as in transformers; each is a count
(``family.count``: 0, a negative or a bool is refused, never taken for absent).
Writing: linear, dynamic, yarn (every key), llama3, longrope and proportional as
``rope_parameters``; static NTK as its changed base, theta * s^(d/(d-2)) (Bloc97 2023), the
same rotation with no scaling at all.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from minilm.hf.family import LAYER_TYPES, count, refuse, require
from minilm.positions import build
from minilm.positions.rope import ntk_base

SCALINGS = ("default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional")  # rope_type values read
YARN_KEYS = ("beta_fast", "beta_slow", "truncate", "attention_factor", "mscale", "mscale_all_dim")
ROPE_TYPES = {
    "none": "default",
    "linear": "linear",
    "dynamic": "dynamic",
    "yarn": "yarn",
    "llama3": "llama3",
    "longrope": "longrope",
    "proportional": "proportional",
}


def rope_position(hf: dict, path: str, theta: float = 10000.0, fraction: Optional[float] = None) -> dict:
    """minilm's rope setting for a config's rope_theta, partial rotary and scaling. ``theta`` and ``fraction``
    are what the family's transformers config class takes where config.json has no such key (GPT-NeoX: a
    quarter of the head; SmolLM3: base 2,000,000); ``fraction`` None: the family's transformers code turns
    the whole head whatever partial_rotary_factor says (Llama's layout), so a factor other than 1 is refused."""
    params = dict(hf.get("rope_parameters") or {})
    params.update(hf.get("rope_scaling") or {})
    base = params.get("rope_theta", hf.get("rope_theta", hf.get("rotary_emb_base", theta)))
    given = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", hf.get("rotary_pct")))
    kind, key = params.get("rope_type", params.get("type", "default")), "original_max_position_embeddings"
    if fraction is None and given not in (None, 1, 1.0) and kind != "proportional":
        refuse(
            path,
            f"partial_rotary_factor={given!r} is not supported for {hf.get('model_type')}: transformers turns its "
            f"whole head (it reads the factor in some scalings only, where the shapes fail); supported: 1.0",
        )
    fraction = given if given is not None else (fraction or 1.0)
    outer = count(hf, key, path, None, absent="max_position_embeddings")  # Phi-3 keeps it beside the parameters
    if kind not in SCALINGS:
        refuse(path, f"rope scaling {kind!r} is not supported; supported: {', '.join(SCALINGS)}")
    position = {"kind": "rope", "base": float(base), "rotary_fraction": float(fraction), "scaling": None}
    if kind == "default":
        return position
    if kind == "proportional":  # the whole head turns; partial_rotary_factor is the share of pairs at a frequency
        factor = float(params.get("factor") or 1.0)
        scaling = {"type": "proportional", "fraction": float(fraction), "factor": factor}
        return {**position, "rotary_fraction": 1.0, "scaling": scaling}
    maximum = count(hf, "max_position_embeddings", path)
    outer = maximum if outer is None else outer
    original = count(params, key, path, outer, absent="the config's own", label=f"rope_parameters.{key}")
    if kind == "dynamic":  # transformers' dynamic NTK measures lengths against max_position_embeddings
        original = maximum
    factor = params.get("factor")
    if factor is None and (kind == "longrope" or kind == "yarn" and original < maximum):  # transformers' rule
        factor = maximum / original
    if factor is None:
        refuse(path, f"rope scaling {kind!r} needs a factor (new length / original length) in its rope parameters")
    scaling = {"type": kind, "factor": float(factor), "original_max_positions": int(original)}
    if kind == "longrope":  # transformers picks the factors in each forward pass by its largest position
        scaling.update(
            short_factor=[float(v) for v in params["short_factor"]],
            long_factor=[float(v) for v in params["long_factor"]],
            switch="positions",
        )
        if params.get("attention_factor") is not None:
            scaling["attention_factor"] = float(params["attention_factor"])
    if kind == "llama3":
        scaling.update(
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        )
    if kind == "yarn":
        scaling.update({key: params[key] for key in YARN_KEYS if params.get(key) is not None})
        for key in ("beta_fast", "beta_slow"):  # transformers: ``params.get(key) or default``
            if not scaling.get(key, 1):
                del scaling[key]
    position["scaling"] = scaling
    return position


def rope_parameters(m) -> tuple:
    """(rope_parameters, max_position_embeddings) of a ModelConfig's rope setting."""
    rope = m.position
    scheme = build(rope, d_model=m.d_model, n_head=m.n_head, block_size=m.block_size, head_dim=m.head_dim)
    scaling = scheme.scaling  # every default resolved (original length, LongRoPE's attention factor)
    kind, fraction = scaling["type"], rope.get("rotary_fraction", 1.0)
    rotated = int(m.head_dim * fraction)
    require(rotated % 2 == 0, "rope", f"rotary_fraction={fraction} rotates an odd {rotated} dims")
    params = {
        "rope_type": "default",
        "rope_theta": float(rope.get("base", 10000.0)),
        "partial_rotary_factor": float(fraction),
    }  # always: GPT-NeoX's default is 0.25
    if kind == "ntk":
        params["rope_theta"] = ntk_base(params["rope_theta"], scaling["factor"], rotated)
        return params, m.block_size
    require(
        kind in ROPE_TYPES,
        "rope",
        f"scaling {kind!r} has no transformers equivalent here; exportable: {', '.join(ROPE_TYPES)}, ntk",
    )
    if kind == "none":
        return params, m.block_size
    params.update(rope_type=ROPE_TYPES[kind], factor=float(scaling["factor"]))
    if kind == "proportional":  # transformers turns the whole head and reads the kept share as partial_rotary_factor
        require(
            fraction == 1.0, "rope", f"proportional with rotary_fraction={fraction}: transformers turns the whole head"
        )
        params["partial_rotary_factor"] = scaling["fraction"]
        return params, m.block_size
    original = scaling["original_max_positions"]
    if kind == "dynamic":  # transformers measures dynamic lengths against max_position_embeddings
        return params, original
    params["original_max_position_embeddings"] = original
    if kind == "llama3":
        params.update(low_freq_factor=scaling["low_freq_factor"], high_freq_factor=scaling["high_freq_factor"])
    if kind == "yarn":  # the attention factor resolved (mscale and mscale_all_dim already in it)
        params.update({key: scaling[key] for key in ("beta_fast", "beta_slow", "truncate", "attention_factor")})
    if kind == "longrope":  # transformers then switches by each pass's positions, as ``switch: positions``
        params.update(
            short_factor=list(scaling["short_factor"]),
            long_factor=list(scaling["long_factor"]),
            attention_factor=float(scaling["attention_factor"]),
        )
    return params, m.block_size


def rope_settings(m) -> list:
    """Every rope setting of ModelConfig ``m``: ``model.position`` and each layer type's own (``model.layers``)."""
    types = [t for name, t in (m.layers or {}).items() if name != "pattern" and isinstance(t, dict)]
    return [p for p in [m.position] + [t.get("position") or {} for t in types] if p.get("kind") == "rope"]


def rope_problem(family, m) -> Optional[str]:
    """Why ``family`` (a ``minilm.hf.family.Family``) cannot hold ModelConfig ``m``'s rope settings as its
    transformers code runs them, or None: part of a head turned where it turns the whole head, or LongRoPE's
    factors switched otherwise than it switches them (``scaling.switch``: ``minilm.positions.rope``)."""
    for position in rope_settings(m):
        fraction, scaling = position.get("rotary_fraction", 1.0), position.get("scaling") or {}
        if fraction != 1.0 and not family.partial_rotary:
            return f"rotary_fraction={fraction}: transformers' {family.name} turns the whole head"
        switch = scaling.get("switch", "context")
        if scaling.get("type") == "longrope" and switch != family.longrope_switch:
            return (
                f"LongRoPE with scaling.switch={switch}: transformers' {family.name} switches its factors as "
                f"switch {family.longrope_switch} does"
            )
    return None


def rope_by_layer_type(hf: dict, path: str, legacy: dict) -> dict:
    """{layer type: minilm's rope setting} of a config whose ``rope_parameters`` are kept per layer type
    (Gemma 3, OLMo 3); ``legacy`` is the family's reading of its older keys, {layer type: parameters}.
    A type's missing ``rope_theta`` is the legacy one's. yarn's ``truncate`` inside a type is dropped:
    transformers looks for it beside the types, where it is never found, so such a yarn truncates."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and params and set(params) <= set(LAYER_TYPES):
        by_type = {t: dict(params.get(t) or {"rope_type": "default"}) for t in LAYER_TYPES}
    else:
        by_type = {t: dict(legacy[t]) for t in LAYER_TYPES}
    out = {}
    for t, settings in by_type.items():
        settings.setdefault("rope_theta", legacy[t]["rope_theta"])
        settings.pop("truncate", None)
        out[t] = rope_position({**hf, "rope_parameters": settings, "rope_scaling": None}, path)
    return out


def rope_parameters_by_layer_type(m, family: str, sliding: dict) -> dict:
    """``rope_parameters`` keyed by layer type for ModelConfig ``m``: the sliding layers' rope setting
    ``sliding``, the full layers' ``m.position``. yarn's ``truncate: false`` is refused: transformers
    reads it beside the types, never inside one (``rope_by_layer_type``)."""
    out = {}
    for layer_type, position in (("sliding_attention", sliding), ("full_attention", m.position)):
        params = rope_parameters(dataclasses.replace(m, position=position, layers=None))[0]
        require(
            params.get("truncate", True),
            family,
            f"the {layer_type} layers' yarn has truncate: false, which transformers does not read per layer type",
        )
        out[layer_type] = params
    return out
