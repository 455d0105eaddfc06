"""Positions per layer: the layer design of ``model.layers``, read into one ``LayerType`` per layer.

Every open family since 2024 chooses positions per layer: sliding-window layers beside global ones
(Gemma 2/3, Mistral, GPT-OSS, OLMo 3), layers without positions (SmolLM3's NoPE every 4th layer;
Cohere2, EXAONE 4 and Llama 4: RoPE on local layers, NoPE on global ones, the RNoPE-SWA design of
Yang et al. 2025, "Rope to Nope and Back Again"), chunked attention (Llama 4), a learned sink logit
per head (GPT-OSS), soft-capped attention logits (Gemma 2) and a query scaled by its position
(Llama 4, Ministral 3; Nakanishi 2025, "Scalable-Softmax"). ``model.layers`` names layer types and
a pattern of them repeated over ``n_layer``::

    layers:
      pattern: [local, local, local, global]
      local:  {window: 128}              # sliding window of 128 keys (the query included)
      global: {position: {kind: none}}   # full attention, no positions

A type may set:

* ``position``: any position setting of the registry (a different base, a scaling on these layers
  only), except a scheme that adds to the embeddings (that happens once, before the first layer:
  it belongs in ``model.position``); unset, ``model.position``;
* ``window`` W: a query at p sees the keys at p - W < j <= p (W keys, itself included);
* ``chunk`` C: a query sees only the keys of its own chunk, floor(j / C) = floor(p / C);
* ``sinks: learned``: one trained logit s_h per head joins the softmax's denominator and its
  weight is dropped: weights exp(z_j) / (exp(s_h) + sum_i exp(z_i)) (GPT-OSS);
* ``softcap`` c: attention logits c tanh(z / c) before any bias and the mask (Gemma 2);
* ``query_scale`` {beta, floor, offset}: q at position p times 1 + beta ln(1 + floor((p + offset) /
  floor)) after its rotation: Ministral 3 (``offset`` 0) and Llama 4 (``offset`` 1).

Without ``model.layers`` every layer is the one type ``model.position`` describes, as before.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from minilm.common import Range, check_number, shown, suggest
from minilm.positions.base import MAX_POSITIONS, PositionError, build, canonical, describe, scheme_class, validate

TYPE_KEYS = ("position", "window", "chunk", "sinks", "softcap", "query_scale")
SINK_KINDS = ("learned",)  # ``sinks:`` of a layer type (the streaming sinks of a cache are another thing)
QUERY_SCALE_KEYS = ("beta", "floor", "offset")


class LayerType(NamedTuple):
    """What one layer's attention sees and how (the module docstring): its type's name, position
    setting, window, chunk, learned sinks, soft-cap and query scaling (None / False / 0: off)."""

    name: str
    position: dict
    window: Optional[int] = None
    chunk: Optional[int] = None
    sinks: bool = False
    softcap: float = 0.0
    query_scale: Optional[dict] = None

    @property
    def masked(self) -> bool:
        """Whether the layer hides keys a causal query would see (a window or chunks)."""
        return self.window is not None or self.chunk is not None

    @property
    def plain(self) -> bool:
        """Whether the layer's attention is softmax(q k^T / sqrt(d)) v, nothing added or hidden."""
        return not self.masked and not self.sinks and not self.softcap

    def cache_span(self) -> Optional[int]:
        """The most recent keys a cached decode step of this layer can need (None: all of them)."""
        spans = [s for s in (self.window, self.chunk) if s is not None]
        return min(spans) if spans else None


SOFTCAP = Range(0, 1e6, low_open=True, text="0 (off) or a number > 0 and <= 1e6")


def _count(where: str, value, low: int = 1) -> int:
    return check_number(where, value, Range(low, MAX_POSITIONS, integer=True), PositionError)


def _query_scale(where: str, value) -> Optional[dict]:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PositionError(f"{where}={shown(value)} is invalid: expected a mapping with {', '.join(QUERY_SCALE_KEYS)}")
    for key in value:
        if key not in QUERY_SCALE_KEYS:
            raise PositionError(f"{where}: unknown key {key!r}: {suggest(key, QUERY_SCALE_KEYS)}")
    if "beta" not in value or "floor" not in value:
        raise PositionError(f"{where} needs beta and floor: 1 + beta ln(1 + floor((p + offset) / floor))")
    return {
        "beta": float(check_number(f"{where}.beta", value["beta"], Range(0, 1e3), PositionError)),
        "floor": float(_count(f"{where}.floor", value["floor"])),
        "offset": float(_count(f"{where}.offset", value.get("offset", 0), low=0)),
    }


def _position(where: str, value, default: dict) -> dict:
    if value is None:
        return default
    if not isinstance(value, dict) or "kind" not in value:
        raise PositionError(f"{where}={shown(value)} is invalid: expected a mapping with a 'kind'")
    scheme_class(value["kind"])  # an unknown kind: one line with the closest names
    return canonical(value)


def read_type(name: str, settings, default_position: dict) -> LayerType:
    """The ``LayerType`` of ``model.layers.<name>`` (a mapping of TYPE_KEYS; null: all defaults)."""
    where = f"model.layers.{name}"
    settings = {} if settings is None else settings
    if not isinstance(settings, dict):
        raise PositionError(f"{where}={shown(settings)} is invalid: expected a mapping of {', '.join(TYPE_KEYS)}")
    for key in settings:
        if key not in TYPE_KEYS:
            raise PositionError(f"{where}: unknown key {key!r}: {suggest(key, TYPE_KEYS)}")
    sinks = settings.get("sinks")
    if sinks not in (None, False, *SINK_KINDS):
        raise PositionError(f"{where}.sinks={shown(sinks)} is invalid: valid: {', '.join(SINK_KINDS)} (or leave out)")
    window, chunk = settings.get("window"), settings.get("chunk")
    return LayerType(
        name=name,
        position=_position(f"{where}.position", settings.get("position"), default_position),
        window=None if window is None else _count(f"{where}.window", window),
        chunk=None if chunk is None else _count(f"{where}.chunk", chunk),
        sinks=sinks == "learned",
        softcap=0.0
        if settings.get("softcap") in (None, 0)
        else float(check_number(f"{where}.softcap", settings["softcap"], SOFTCAP, PositionError)),
        query_scale=_query_scale(f"{where}.query_scale", settings.get("query_scale")),
    )


def layer_types(layers, position: dict, n_layer: int) -> list:
    """One ``LayerType`` per layer of a model of ``n_layer`` layers: ``layers`` (``model.layers``: a
    ``pattern`` of type names, repeated, and each type's settings) or, when None, ``position`` for
    every layer. A PositionError names the bad key or value, or a type left out of the pattern (one
    only past the pattern's first ``n_layer`` names is refused where a run starts: ``check_all_used``)."""
    if layers is None:
        return [LayerType("all", position)] * n_layer
    if not isinstance(layers, dict) or "pattern" not in layers:
        raise PositionError(
            f"model.layers={shown(layers)} is invalid: expected a mapping with a 'pattern' (a list of "
            f"layer type names) and each type's settings, e.g. {{pattern: [local, global], local: {{window: 128}}, "
            f"global: {{}}}}"
        )
    pattern = layers["pattern"]
    if not isinstance(pattern, list) or not pattern or not all(isinstance(name, str) for name in pattern):
        raise PositionError(f"model.layers.pattern={shown(pattern)} is invalid: expected a list of layer type names")
    defined = [key for key in layers if key != "pattern"]
    for name in pattern:
        if name not in defined:
            raise PositionError(
                f"model.layers.pattern names {name!r}, which model.layers does not define: "
                f"{suggest(name, defined) if defined else 'give it settings, e.g. ' + name + ': {window: 128}'}"
            )
    for name in defined:
        if name not in pattern:
            raise PositionError(
                f"model.layers.{name} is not in model.layers.pattern {pattern}: use it there or leave it out"
            )
    types = {name: read_type(name, layers[name], position) for name in defined}
    return [types[pattern[i % len(pattern)]] for i in range(n_layer)]


def check_all_used(pattern: list, n_layer: int) -> None:
    """A PositionError when ``pattern`` is longer than ``n_layer`` and some of its types fall past
    the last layer: the model would never use them (as a type defined but left out of the pattern).
    Checked where a model is built from scratch (``minilm.training.source.starting_config``), not where
    one is loaded: a checkpoint trained so before this check still loads as the model it is."""
    unused = [name for name in dict.fromkeys(pattern) if name not in pattern[:n_layer]]
    if unused:
        need = max(pattern.index(name) for name in unused) + 1
        raise PositionError(
            f"model.layers.pattern {pattern} is longer than model.n_layer={n_layer}: no layer would be of type "
            f"{', '.join(unused)}: give model.n_layer >= {need}, or leave {'it' if len(unused) == 1 else 'them'} "
            f"out of the pattern and model.layers"
        )


def describe_design(position: dict, layers, n_layer: Optional[int] = None) -> str:
    """A short label of a model's positions: ``describe(position)``, and with ``layers`` each type's
    differences in pattern order with how many of the ``n_layer`` layers are of it (None: one pass
    of the pattern), e.g. 'rope; local x3 window=64, global none'."""
    if layers is None:
        return describe(position)
    types = layer_types(layers, position, n_layer or len(layers["pattern"]))
    parts = []
    for name in dict.fromkeys(t.name for t in types):
        t = next(t for t in types if t.name == name)
        settings = [describe(t.position)] if t.position != position else []
        settings += [f"{key}={getattr(t, key)}" for key in ("window", "chunk") if getattr(t, key) is not None]
        settings += ["learned sinks"] * t.sinks + [f"softcap={t.softcap:g}"] * bool(t.softcap)
        settings += ["query scale"] * (t.query_scale is not None)
        count = sum(u.name == name for u in types)
        parts.append(f"{name}{f' x{count}' if count > 1 else ''} {' '.join(settings) or 'as model.position'}")
    return f"{describe(position)}; {', '.join(parts)}"


def own_settings(types: list, position: dict) -> dict:
    """{type name: setting} for each distinct position setting of ``types`` other than ``position``
    (``model.position``), named by the first type that has it: the schemes a model builds apart."""
    own = {}
    for layer_type in types:
        if layer_type.position != position and layer_type.position not in own.values():
            own[layer_type.name] = layer_type.position
    return own


def cache_slots(types: list, capacity: int) -> list:
    """The key slots each layer keeps in a KV cache of ``capacity`` tokens: its window or chunk where
    that is shorter (``LayerType.cache_span``), else the capacity."""
    return [capacity if t.cache_span() is None else min(t.cache_span(), capacity) for t in types]


def query_scale_factor(pos: torch.Tensor, scale: dict) -> torch.Tensor:
    """1 + beta ln(1 + floor((p + offset) / floor)) at positions ``pos`` (any shape; negative
    positions, padding, count as 0): the query scaling of Llama 4 (offset 1) and Ministral 3
    (offset 0), Scalable-Softmax's log-length temperature in steps of ``floor`` tokens."""
    steps = torch.floor((pos.clamp(min=0).float() + scale["offset"]) / scale["floor"])
    return 1.0 + scale["beta"] * torch.log1p(steps)


def check_types(types: list, model_config, *, reach: bool = True) -> None:
    """PositionError where a layer type's own position setting cannot be built for this model
    (``validate``), or adds to the embeddings, which happens once, before any layer; or where every
    layer type sets its own position and ``model.position`` has parameters: no layer would use them
    (they would never train, and DDP fails on parameters without gradients)."""
    shape = dict(n_head=model_config.n_head, block_size=model_config.block_size, head_dim=model_config.head_dim)
    if all(t.position != model_config.position for t in types):
        root = build(model_config.position, d_model=model_config.d_model, **shape)
        if not root.embeds and any(True for _ in root.parameters()):
            raise PositionError(
                f"model.layers: every layer type sets its own position, so model.position "
                f"({describe(model_config.position)}) is no layer's, and its parameters would never train: set "
                f"model.position to one of the types' positions, or leave that type's position out"
            )
    seen = []
    for layer_type in types:
        if layer_type.position is model_config.position or layer_type.position in seen:
            continue
        seen.append(layer_type.position)
        validate(layer_type.position, model_config, reach=reach)
        scheme = build(layer_type.position, d_model=model_config.d_model, **shape)
        if scheme.embeds:
            raise PositionError(
                f"model.layers.{layer_type.name}.position is {describe(layer_type.position)}, which adds positions "
                f"to the embeddings once, before the first layer: set it as model.position, or give this layer "
                f"type a scheme that acts inside attention (rope, alibi, t5, none, ...)"
            )
