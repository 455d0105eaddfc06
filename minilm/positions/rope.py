"""Rotary position embedding (Su et al. 2021, "RoFormer") and its context-extension scalings.

Layout: **halves** ("rotate_half", as in HF Llama / GPT-NeoX). Within the rotated part of
a head (the first ``rot`` dims, ``rot = rotary_fraction * head_dim`` rounded down to even),
dimension i is paired with dimension i + rot/2 and the pair rotates by angle
``pos * inv_freq_i`` with ``inv_freq_i = base^(-2i/rot)``. The remaining dims of each head
pass through untouched (partial rotary). Angles are computed in float32.

Scalings, with s = factor and L = original_max_positions (the ORIGINAL training length):

* ``linear`` (position interpolation, Chen et al. 2023): inv_freq / s.
* ``ntk`` (NTK-aware, bloc97 2023): base' = base * s^(d/(d-2)).
* ``dynamic`` (dynamic NTK, emozilla 2023): base' = base * (s*T/L - (s-1))^(d/(d-2)) when the
  current length T > L, else base. T is the length the sequence is processed at: the full
  length without a cache, and the generation's context (``max_context``) with one, so the scale is
  fixed for a whole cached generation and cached keys never go stale (docs/design.md, "Dynamic scaling and the cache").
* ``yarn`` (Peng et al. 2023): corr(r) = d ln(L / (2 pi r)) / (2 ln base); low = floor(corr(32)),
  high = ceil(corr(1)), clamped to [0, d-1]; ramp g_i = clamp((i-low)/(high-low), 0, 1);
  inv_i = inv_i/s * g_i + inv_i * (1 - g_i); cos and sin both scaled by 0.1 ln(s) + 1.
* ``llama3`` (Llama 3.1; Meta 2024, as HF transformers' ``_compute_llama3_parameters``):
  wavelength w_i = 2 pi / inv_i; w_i > L / low_freq_factor: inv_i / s (interpolated);
  w_i < L / high_freq_factor: inv_i (kept); between them a smooth blend with
  g = (L / w_i - low) / (high - low): inv_i' = (1 - g) inv_i / s + g inv_i. Defaults low 1, high 4.
* ``longrope`` (Ding et al. 2024, "LongRoPE"; HF ``_compute_longrope_parameters``):
  inv_i = base^(-2i/d) / e_i with per-pair factors e = ``long_factor`` when the context length
  T > L, else ``short_factor``; cos and sin scaled by ``attention_factor``, by default
  sqrt(1 + ln s / ln L) (1 when s <= 1), s = ``factor`` (default block_size / L). With
  ``switch: context`` (the default) the switch happens at the context length, like dynamic NTK:
  T is fixed for a whole cached generation, so a cached key never holds the other set of
  factors. ``switch: positions`` is transformers' behaviour (``longrope_frequency_update``),
  which models imported from Phi-3 take: each forward pass picks its factors by its own
  largest position + 1, so without a cache a sequence longer than L is all long factors, while
  a cached generation that crosses L rotates its new tokens with the long factors and keeps
  the keys of earlier passes as they were rotated, with the short ones (Qwen3 and Llama with
  LongRoPE in transformers). ``switch: refill`` picks as ``positions`` does, and a generation
  that passes L recomputes its cache once, so every key is rotated with the long factors from
  then on: what transformers' Phi-3 ``generate`` does (its ``prepare_inputs_for_generation``
  drops the cache at that step), and what models imported from Phi-3 take.
* ``proportional`` (p-RoPE: Barbero et al. 2025, "Round and Round We Go! What makes Rotary Positional
  Encodings useful?"; Gemma 4's global layers; HF ``_compute_proportional_rope_parameters``): the first
  int(F * d // 2) pairs keep inv_i / s, the rest get 0 (never rotated), F = ``fraction`` in [0, 1]
  (default 1), s = ``factor`` (default 1); no attention factor. HF's F (its partial_rotary_factor) spans
  head_dim, as here with ``rotary_fraction`` 1; with a smaller one p-RoPE acts within the ``rot`` dims.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from minilm.common import suggest
from minilm.positions.base import (
    MAX_BASE,
    MAX_FACTOR,
    MAX_POSITIONS,
    PositionError,
    PositionScheme,
    SchemePass,
    check_number,
    register,
)

SCALING_TYPES = ("none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope", "proportional")
SCALING_NAMES = {  # what the literature and other libraries call a scaling -> its scaling.type here
    **{t: t for t in SCALING_TYPES[1:]},
    "pi": "linear",
    "position_interpolation": "linear",
    "ntk_aware": "ntk",
    "dynamic_ntk": "dynamic",
    "p_rope": "proportional",
    "prope": "proportional",
    "default": "none",
}
FACTORED = ("linear", "ntk", "yarn", "llama3")  # the scalings that need scaling.factor
SCALING_KEYS = (
    "type",
    "factor",
    "original_max_positions",
    "low_freq_factor",
    "high_freq_factor",
    "short_factor",
    "long_factor",
    "attention_factor",
    "switch",
    "fraction",
    "beta_fast",
    "beta_slow",
    "truncate",
    "mscale",
    "mscale_all_dim",
)
EXTRA_KEYS = {
    "yarn": ("beta_fast", "beta_slow", "truncate", "attention_factor", "mscale", "mscale_all_dim"),
    "llama3": ("low_freq_factor", "high_freq_factor"),
    "longrope": ("short_factor", "long_factor", "attention_factor", "switch"),
    "proportional": ("fraction",),
}  # keys only these types take
LONGROPE_SWITCHES = ("context", "positions", "refill")  # what picks the long factors (module docstring)


def rope_inv_freq(dim: int, base: float) -> torch.Tensor:
    """inv_freq_i = base^(-2i/dim), i = 0 .. dim/2 - 1, in float64 for exact tests."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def ntk_base(base: float, factor: float, dim: int) -> float:
    """NTK-aware base: base * s^(d/(d-2))."""
    return base * factor ** (dim / (dim - 2))


def dynamic_ntk_base(base: float, factor: float, dim: int, length: int, original: int) -> float:
    """Dynamic NTK base for current length T: base * (s*T/L - (s-1))^(d/(d-2)) if T > L."""
    if length <= original:
        return base
    return base * ((factor * length / original) - (factor - 1)) ** (dim / (dim - 2))


def yarn_bounds(
    dim: int, base: float, original: int, beta_fast: float = 32.0, beta_slow: float = 1.0, truncate: bool = True
) -> Tuple[float, float]:
    """YaRN correction range [low, high] of dimension-pair indices: the pair that turns ``beta_fast``
    times over the original length L, and the one that turns ``beta_slow`` times, d ln(L / (2 pi b)) /
    (2 ln base) (Peng et al. 2023, eq. 17); with ``truncate`` rounded outwards to whole pairs (the
    paper's code; GPT-OSS sets it false), clipped to [0, dim - 1]."""

    def corr(rotations):
        return dim * math.log(original / (2 * math.pi * rotations)) / (2 * math.log(base))

    low, high = corr(beta_fast), corr(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN attention temperature applied to both cos and sin: 0.1 m ln(s) + 1 (1 when s <= 1), m = 1 in
    the paper (eq. 22) and DeepSeek's ``mscale`` otherwise."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_attention_factor(
    factor: float, mscale: Optional[float] = None, mscale_all_dim: Optional[float] = None
) -> float:
    """YaRN's default factor on cos and sin, as transformers computes it: where both ``mscale`` and
    ``mscale_all_dim`` are set and non-zero (DeepSeek-V2/V3), yarn_mscale(s, mscale) /
    yarn_mscale(s, mscale_all_dim); else yarn_mscale(s) (``mscale`` alone is ignored, as there)."""
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    return yarn_mscale(factor)


def yarn_inv_freq(
    dim: int,
    base: float,
    factor: float,
    original: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> torch.Tensor:
    """YaRN "NTK-by-parts": interpolate low frequencies, keep high ones, ramp between (``yarn_bounds``)."""
    inv = rope_inv_freq(dim, base)
    low, high = yarn_bounds(dim, base, original, beta_fast, beta_slow, truncate)
    span = (high - low) if high != low else 1e-3
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / span).clamp(0, 1)
    return inv / factor * ramp + inv * (1 - ramp)


def llama3_inv_freq(
    dim: int, base: float, factor: float, original: int, low_freq_factor: float = 1.0, high_freq_factor: float = 4.0
) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths interpolated, short ones kept, a smooth blend between."""
    inv = rope_inv_freq(dim, base)
    wavelength = 2 * math.pi / inv
    smooth = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv / factor + smooth * inv
    return torch.where(
        wavelength > original / low_freq_factor,
        inv / factor,
        torch.where(wavelength < original / high_freq_factor, inv, blended),
    )


def longrope_attention_factor(factor: float, original: int) -> float:
    """LongRoPE's default attention factor on cos and sin: sqrt(1 + ln s / ln L), 1 when s <= 1."""
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))


@register("rope")
class RoPE(PositionScheme):
    """Rotary embedding of q and k at ``base``, over ``rotary_fraction`` of each head, with an
    optional context-extension ``scaling`` (the module docstring and ``rope_scaling``)."""

    description = (
        "rotary embedding of q and k in every layer (Su et al. 2021); scalings linear/ntk/dynamic/yarn/llama3/longrope/"
        "proportional"
    )
    options = {"base": 10000.0, "rotary_fraction": 1.0, "scaling": None}
    variants = {  # model.position.kind=yarn points to model.position.scaling.type=yarn
        name: (f"scaling.type={t}", *(("scaling.factor=N",) if t in FACTORED else ()))
        for name, t in SCALING_NAMES.items()
        if t != "none"
    }
    nested_options = {"scaling": SCALING_KEYS}  # model.position.factor=4 points to scaling.factor

    def __init__(self, *, base: float, rotary_fraction: float, scaling: Optional[dict], **kw):
        super().__init__(**kw)
        check_number("rope", "base", base, low=1, high=MAX_BASE)
        check_number("rope", "rotary_fraction", rotary_fraction, low=0, high=1)
        head_dim = self.head_dim
        if rotary_fraction == 1 and head_dim % 2:
            raise PositionError(
                f"rope: head dimension {head_dim} is odd: rotation needs pairs; "
                f"choose an even head_dim (d_model/n_head)"
            )
        self.rot = int(head_dim * rotary_fraction) // 2 * 2
        if self.rot < 2:
            raise PositionError(
                f"rope: rotary_fraction={rotary_fraction} rotates {self.rot} of {head_dim} dims; "
                f"it must rotate at least 2"
            )
        self.base = float(base)
        self.scaling = self._check_scaling(scaling)
        self._by_positions = self.scaling.get("switch") in ("positions", "refill")  # transformers' LongRoPE
        self._frequencies = None  # (context_len, device, float32 inverse frequencies): ``frequencies``

    def _check_scaling(self, scaling) -> dict:
        if scaling is None:
            scaling = {}
        if not isinstance(scaling, dict):
            raise PositionError(f"rope: scaling={scaling!r} must be a mapping with keys {', '.join(SCALING_KEYS)}")
        for key in scaling:
            if key not in SCALING_KEYS:
                raise PositionError(f"rope: unknown scaling option {key!r}: {suggest(key, SCALING_KEYS)}")
        kind = scaling.get("type", "none") or "none"
        if kind not in SCALING_TYPES:
            known = SCALING_NAMES.get(str(kind).lower().replace("-", "_"))
            hint = f"{kind} is written scaling.type={known}; valid: {', '.join(SCALING_TYPES)}" if known else ""
            raise PositionError(f"rope: scaling.type={kind!r} is unknown: {hint or suggest(kind, SCALING_TYPES)}")
        for key in scaling:
            if any(key in keys for keys in EXTRA_KEYS.values()) and key not in EXTRA_KEYS.get(kind, ()):
                owner = ", ".join(t for t, keys in EXTRA_KEYS.items() if key in keys)
                raise PositionError(f"rope: scaling.{key} is not an option of scaling.type={kind}, only of {owner}")
        if kind == "none" and scaling.get("factor") not in (None, 1, 1.0):
            raise PositionError(
                f"rope: scaling.factor={scaling['factor']!r} has no effect without a scaling.type: "
                f"set one of {', '.join(t for t in SCALING_TYPES if t != 'none')}"
            )
        original = scaling.get("original_max_positions")
        original = self.block_size if original is None else original  # 0 is not "unset": it is refused
        check_number(
            "rope", "scaling.original_max_positions", original, low=1, low_open=False, integer=True, high=MAX_POSITIONS
        )
        if kind in ("ntk", "dynamic") and self.rot <= 2:  # their base's exponent d / (d - 2) needs d > 2
            raise PositionError(
                f"rope: scaling.type={kind} changes the base by s^(d/(d-2)), which needs more than 2 rotated dims, "
                f"and this rope rotates {self.rot} of {self.head_dim}: a larger rotary_fraction, or another scaling"
            )
        if kind == "longrope" and original < 2:  # its attention factor divides by ln L
            raise PositionError(
                f"rope: scaling.original_max_positions={original} is invalid for longrope: expected an integer >= 2"
            )
        factor = scaling.get("factor")
        if factor is None:
            if kind in FACTORED:
                raise PositionError(
                    f"rope: scaling.type={kind} needs scaling.factor (new length / original length), a number > 0"
                )
            factor = self.block_size / original if kind == "longrope" else 1.0
        check_number("rope", "scaling.factor", factor, low=0, high=MAX_FACTOR)
        out = {"type": kind, "factor": float(factor), "original_max_positions": int(original)}
        if kind == "yarn":
            out.update(self._check_yarn(scaling, out["factor"]))
        if kind == "llama3":
            out.update(self._check_llama3(scaling))
        if kind == "longrope":
            out.update(self._check_longrope(scaling, out["factor"], out["original_max_positions"]))
        if kind == "proportional":
            fraction = 1.0 if scaling.get("fraction") is None else scaling["fraction"]  # None: unset, as factor
            check_number("rope", "scaling.fraction", fraction, low=0, low_open=False, high=1)
            out["fraction"] = float(fraction)
        return out

    @staticmethod
    def _check_yarn(scaling: dict, factor: float) -> dict:
        """beta_fast (32), beta_slow (1), truncate (true) and the attention factor: given, or from
        factor, mscale and mscale_all_dim (``yarn_attention_factor``)."""
        out = {}
        for key, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
            value = default if scaling.get(key) is None else scaling[key]
            check_number("rope", f"scaling.{key}", value, low=0, high=MAX_POSITIONS)
            out[key] = float(value)
        truncate = scaling.get("truncate", True)
        if not isinstance(truncate, bool):
            raise PositionError(f"rope: scaling.truncate={truncate!r} is invalid: expected true or false")
        out["truncate"] = truncate
        for key in ("mscale", "mscale_all_dim"):
            if scaling.get(key) is not None:
                check_number("rope", f"scaling.{key}", scaling[key], low=0, low_open=False, high=MAX_FACTOR)
        attention = scaling.get("attention_factor")
        if attention is None:
            attention = yarn_attention_factor(factor, scaling.get("mscale"), scaling.get("mscale_all_dim"))
        check_number("rope", "scaling.attention_factor", attention, low=0, high=100)
        out["attention_factor"] = float(attention)
        return out

    @staticmethod
    def _check_llama3(scaling: dict) -> dict:
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        check_number("rope", "scaling.low_freq_factor", low, low=0, high=MAX_FACTOR)
        check_number("rope", "scaling.high_freq_factor", high, low=0, high=MAX_FACTOR)
        if high <= low:
            raise PositionError(f"rope: scaling.high_freq_factor={high} must be larger than low_freq_factor={low}")
        return {"low_freq_factor": float(low), "high_freq_factor": float(high)}

    def _check_longrope(self, scaling: dict, factor: float, original: int) -> dict:
        pairs = self.rot // 2
        out = {}
        for key in ("short_factor", "long_factor"):
            values = scaling.get(key)
            if not isinstance(values, (list, tuple)) or len(values) != pairs:
                raise PositionError(
                    f"rope: scaling.type=longrope needs scaling.{key}: a list of {pairs} numbers "
                    f"(one per rotated pair), got {values!r}"
                )
            for value in values:
                check_number("rope", f"scaling.{key} entry", value, low=0, high=MAX_FACTOR)
            out[key] = [float(v) for v in values]
        switch = scaling.get("switch", "context")
        if switch not in LONGROPE_SWITCHES:
            raise PositionError(f"rope: scaling.switch={switch!r} is invalid: valid: {', '.join(LONGROPE_SWITCHES)}")
        out["switch"] = switch
        attention = scaling.get("attention_factor")
        if attention is None:
            attention = longrope_attention_factor(factor, original)
        check_number("rope", "scaling.attention_factor", attention, low=0, high=100)
        out["attention_factor"] = float(attention)
        return out

    # ------------------------------------------------------------------ frequencies
    def inv_freq(self, context_len: Optional[int] = None) -> torch.Tensor:
        """Scaled inverse frequencies (float64) for a sequence processed at ``context_len``."""
        kind, s, L = self.scaling["type"], self.scaling["factor"], self.scaling["original_max_positions"]
        d = self.rot
        if kind == "linear":
            return rope_inv_freq(d, self.base) / s
        if kind == "ntk":
            return rope_inv_freq(d, ntk_base(self.base, s, d))
        if kind == "dynamic":
            return rope_inv_freq(d, dynamic_ntk_base(self.base, s, d, context_len or L, L))
        if kind == "yarn":
            sc = self.scaling
            return yarn_inv_freq(d, self.base, s, L, sc["beta_fast"], sc["beta_slow"], sc["truncate"])
        if kind == "llama3":
            return llama3_inv_freq(
                d, self.base, s, L, self.scaling["low_freq_factor"], self.scaling["high_freq_factor"]
            )
        if kind == "longrope":
            factors = self.scaling["long_factor" if (context_len or L) > L else "short_factor"]
            return rope_inv_freq(d, self.base) / torch.tensor(factors, dtype=torch.float64)
        if kind == "proportional":  # as HF: pairs from int(F * d // 2) on at frequency 0, the exponent over all d
            kept = torch.arange(d // 2) < int(self.scaling["fraction"] * d // 2)
            return torch.where(kept, rope_inv_freq(d, self.base) / s, 0.0)
        return rope_inv_freq(d, self.base)

    def refill_length(self) -> Optional[int]:
        """LongRoPE with ``switch: refill``: the original length L, past which a cached generation
        recomputes its keys once; else None."""
        return self.scaling["original_max_positions"] if self.scaling.get("switch") == "refill" else None

    @property
    def prefix_invariant(self) -> bool:
        return self.scaling["type"] not in ("dynamic", "longrope")  # these read context_len

    def attention_scale(self) -> float:
        """Factor on cos and sin (YaRN's mscale, LongRoPE's attention factor; 1 otherwise)."""
        return self.scaling.get("attention_factor", 1.0)

    def cos_sin(self, pos: torch.Tensor, context_len: int, dtype: torch.dtype):
        """(T, rot) cos and sin tables, memoised for the layers of one forward pass."""
        cos, signed_sin = self.tables(pos, context_len, dtype)
        half = signed_sin.shape[-1] // 2
        return cos, torch.cat((-signed_sin[..., :half], signed_sin[..., half:]), dim=-1)

    def start(self, pos: torch.Tensor, context_len: int):
        """The pass's scheme: a ``RopePass`` that computes the cos/sin tables of its positions once
        for every layer; under ``torch.compile`` the scheme itself (the graph computes them once)."""
        return self if torch.compiler.is_compiling() else RopePass(self, pos, context_len)

    def frequencies(self, context_len: int, device: torch.device) -> torch.Tensor:
        """``inv_freq(context_len)`` in float32 on ``device``, kept for the passes that follow at the
        same length (every decode step of a generation): a function of the settings and these two
        arguments only, so keeping it carries nothing from one pass to another."""
        held = self._frequencies
        if held is not None and held[0] == context_len and held[1] == device and not torch.compiler.is_compiling():
            return held[2]
        inv = self.inv_freq(context_len).to(device=device, dtype=torch.float32)
        if not torch.compiler.is_compiling():
            self._frequencies = (context_len, device, inv)
        return inv

    def tables(self, pos: torch.Tensor, context_len: int, dtype: torch.dtype):
        """(cos, signed sin): ``cos_sin``'s cos and its sin table with the first half negated, which
        ``_rotate`` multiplies by x rolled by half the rotated dims: rotate_half(x) * sin is then
        ``x.roll(rot/2) * signed_sin``, the same products without a negation and a concatenation."""
        if self._by_positions and pos.numel() and not pos.is_meta:
            context_len = int(pos.max()) + 1  # transformers' longrope: this pass's own length picks the factors
        angles = pos.to(torch.float32)[:, None] * self.frequencies(context_len, pos.device)[None, :]
        scale = self.attention_scale()
        cos, sin = angles.cos(), angles.sin()
        if scale != 1.0:  # x * 1.0 is x: two operations fewer per pass where nothing scales
            cos, sin = cos * scale, sin * scale
        return torch.cat((cos, cos), dim=-1).to(dtype), torch.cat((-sin, sin), dim=-1).to(dtype)

    def rotate(self, q, k, pos, context_len):
        cos, signed_sin = self.tables(pos, context_len, q.dtype)
        return self._rotate(q, cos, signed_sin), self._rotate(k, cos, signed_sin)

    def rotate_stacked(self, qk, n_q, pos, context_len):
        """q and k rotated alike, in one pass over their stack: the same products as ``rotate``."""
        cos, signed_sin = self.tables(pos, context_len, qk.dtype)
        both = self._rotate(qk, cos, signed_sin)
        return both[:, :n_q], both[:, n_q:]

    def _rotate(self, x, cos, signed_sin):
        """x * cos + rotate_half(x) * sin over the first ``rot`` dims, with the signed sin of
        ``tables``: rotate_half(x) * sin = x.roll(rot/2) * signed_sin, the same products."""
        if self.rot == x.shape[-1]:
            return x * cos + x.roll(self.rot // 2, dims=-1) * signed_sin
        head, tail = x[..., : self.rot], x[..., self.rot :]
        return torch.cat((head * cos + head.roll(self.rot // 2, dims=-1) * signed_sin, tail), dim=-1)


class RopePass(SchemePass):
    """A RoPE scheme (or xPos) over one forward pass: the float32 tables of the pass's own positions
    (``start``'s tensor, which every layer is handed) computed when the pass starts, once for every
    layer, and cast once per dtype; other positions (rows of their own, renumbered keys) and other
    lengths get tables of their own. Computed before ``GPT.body`` runs, the tables reach a compiled
    body as inputs: inside its graph the compiler would fold cos and sin into every rotated element."""

    def __init__(self, scheme: RoPE, pos: torch.Tensor, context_len: int):
        super().__init__(scheme, pos, context_len)
        self._rotate = scheme._rotate
        self.held = {torch.float32: scheme.tables(pos, context_len, torch.float32)}

    def tables(self, pos: torch.Tensor, context_len: int, dtype: torch.dtype):
        if pos is not self.pos or context_len != self.context_len:
            return self.scheme.tables(pos, context_len, dtype)
        if dtype not in self.held:  # the float32 tables rounded: what scheme.tables gives in dtype
            self.held[dtype] = tuple(table.to(dtype) for table in self.held[torch.float32])
        return self.held[dtype]
