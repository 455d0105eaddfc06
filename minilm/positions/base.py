"""The position interface shared by every scheme, and the registry that builds them.

Every scheme acts through five hooks; the base class answers each with "nothing":

* ``start(pos, context_len)`` once per forward pass, before the others: the scheme this pass's
  hooks are asked of (``SchemePass``: rope's cos/sin tables, interpolation's divided positions and
  randomized's drawn ones are computed once per pass and travel with it, never kept on the module)
* ``embed(x, pos)``            -> x + PE(pos), once after the token embedding (sinusoidal, learned)
* ``rotate(q, k, pos, context_len)`` -> q', k' in every attention layer, before the cache
  write (rope and its scalings); ``rotate_stacked`` takes q and k stacked on the head dimension
* ``bias(q_pos, k_pos, q)``    -> (heads, Tq, Tk) added to the attention logits (alibi, t5, kerple,
  fire), or (B, heads, Tq, Tk) for a scheme whose bias reads the queries (shaw)
* ``value_term(weights, q_pos, k_pos)`` -> (B, heads, Tq, head_dim) added to the attention
  output, from the attention weights (shaw's relative values); used when ``has_value_term``

A wrapper (``interpolated``, ``randomized``) holds another scheme as ``inner``, hands every
hook on to it, and answers ``unwrap()`` for it; ``unwrap_setting`` does the same for settings.

Positions are explicit float32 tensors of absolute indices (shape (T,), shared by the
batch); they are floats so that position interpolation can hand on fractions.
``context_len`` is the length the sequence is being processed at (the full sequence
length without a cache, the cache capacity with one); only dynamic NTK reads it.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Optional

import torch
from torch import nn

from minilm.common import MinilmError, Range, suggest
from minilm.common import check_number as check_setting

_REGISTRY: Dict[str, type] = {}


class PositionError(MinilmError):
    """Position settings that cannot be built; the message is one line for the user."""


def register(name: str) -> Callable[[type], type]:
    """Class decorator: make a PositionScheme subclass buildable as ``{"kind": name}``."""

    def wrap(cls: type) -> type:
        if name in _REGISTRY:
            raise PositionError(f"position kind {name!r} is registered twice")
        cls.kind = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def available() -> list:
    """Sorted names of every registered position kind."""
    return sorted(_REGISTRY)


def scheme_class(kind: Any) -> type:
    """The registered class of ``kind``; an unknown kind is a PositionError that suggests the closest
    kinds, or, for the name of a variant of one (``yarn``: a RoPE scaling, ``variants``), its setting."""
    if kind not in _REGISTRY:
        raise PositionError(f"unknown position kind {kind!r}: {variant_hint(kind) or suggest(kind, _REGISTRY)}")
    return _REGISTRY[kind]


def variant_hint(name: Any) -> str:
    """'yarn is a setting of rope, not a kind: write model.position.kind=rope model.position.scaling.type=yarn
    ...' when a registered scheme lists ``name`` (in any case, with - or _) among its ``variants``; else ''."""
    key = str(name).lower().replace("-", "_")
    for cls in _REGISTRY.values():
        if key in cls.variants:
            settings = " ".join(f"model.position.{s}" for s in (f"kind={cls.kind}", *cls.variants[key]))
            return f"{name} is a setting of {cls.kind}, not a kind: write {settings}; kinds: {', '.join(available())}"
    return ""


def canonical(position: Any) -> Any:
    """``position`` with every renamed option under its current name and every wrapped scheme
    as a mapping (a new dict; nested settings included). This is the one translation of old
    and short settings: each scheme lists its old names in ``renamed_options``
    (``interpolated``: ``base`` is now ``inner``) and the options that hold another scheme's
    settings in ``setting_options`` (``inner: alibi`` means ``inner: {kind: alibi}``)."""
    if not isinstance(position, dict) or position.get("kind") not in _REGISTRY:
        return copy.deepcopy(position)
    cls = _REGISTRY[position["kind"]]
    out = {}
    for key, value in position.items():
        new = cls.renamed_options.get(key, key)
        if new != key and new in position:
            raise PositionError(f"{cls.kind}: give {new!r} only ({key!r} is its old name)")
        if new in cls.setting_options and isinstance(value, str):
            value = {"kind": value}  # a wrapped scheme may be named by its kind alone
        out[new] = canonical(value) if isinstance(value, dict) else copy.deepcopy(value)
    return out


def unwrap_setting(position: dict) -> dict:
    """The setting of the scheme inside any wrappers (``interpolated``, ``randomized``): the
    scheme whose parameters the weights hold, as ``PositionScheme.unwrap`` finds it."""
    while isinstance(position, dict) and "inner" in getattr(_REGISTRY.get(position.get("kind")), "setting_options", ()):
        position = position.get("inner", _REGISTRY[position["kind"]].options["inner"])
    return position


def describe(position: dict) -> str:
    """A short label of a setting: 'rope', 'rope+yarn x4', 'interpolated(learned) x4.02',
    'randomized(rope) max_positions=1024'."""
    kind = position.get("kind")
    cls = _REGISTRY.get(kind)
    text, shown = kind, {"kind", "scaling"}
    if cls is not None and "inner" in cls.setting_options:
        text, shown = f"{kind}({describe(position.get('inner', cls.options['inner']))})", {"kind", "inner", "factor"}
        if "factor" in cls.options:
            text += f" x{float(position.get('factor', cls.options['factor'])):.3g}"
    elif kind == "rope" and isinstance(position.get("scaling"), dict):
        scaling = position["scaling"]
        if scaling.get("type", "none") != "none":
            text += f"+{scaling['type']}"
            if scaling.get("factor") is not None:
                text += f" x{float(scaling['factor']):.3g}"
            if scaling.get("fraction") is not None:
                text += f" fraction={float(scaling['fraction']):g}"
    extras = {k: v for k, v in position.items() if k not in shown}
    if extras:
        text += " " + ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in extras.items())
    return text


def build(
    position: dict, *, d_model: int, n_head: int, block_size: int, head_dim: Optional[int] = None
) -> "PositionScheme":
    """Build the scheme described by a plain dict such as ``{"kind": "rope", "base": 10000}``;
    ``head_dim`` is each attention head's width (None: d_model / n_head)."""
    if not isinstance(position, dict) or "kind" not in position:
        raise PositionError(
            f"position settings {position!r} must be a mapping with a 'kind' ({', '.join(available())})"
        )
    cls = scheme_class(position["kind"])
    position = canonical(position)
    options = {k: v for k, v in position.items() if k != "kind"}
    for key in options:
        if key not in cls.options:
            raise PositionError(f"unknown option {key!r} for position kind {cls.kind!r}: {option_hint(cls, key)}")
    merged = {**cls.options, **options}
    return cls(d_model=d_model, n_head=n_head, block_size=block_size, head_dim=head_dim, **merged)


def option_hint(cls: type, key: str) -> str:
    """What to write instead of ``key``, no option of ``cls``: where it sits when it is a key of one of its
    ``nested_options`` (rope's ``factor`` is ``scaling.factor``), else the closest options."""
    homes = [f"{outer}.{key}" for outer, keys in cls.nested_options.items() if key in keys]
    if homes:
        return f"did you mean {homes[0]}? valid: {', '.join(cls.options)}"
    return suggest(key, cls.options) if cls.options else "it takes no options"


def validate(position: dict, model_config, *, reach: bool = True) -> None:
    """Raise PositionError when ``position`` cannot be built for this model shape, or (with
    ``reach``) when its positions do not reach the training length ``model_config.block_size``."""
    block, concat = model_config.block_size, getattr(model_config, "concat_position_dims", 0)
    scheme = build(
        position,
        d_model=concat or model_config.d_model,
        n_head=model_config.n_head,
        block_size=block,
        head_dim=getattr(model_config, "head_dim", None),
    )
    if concat and not scheme.embeds:
        raise PositionError(
            f"{describe(position)} acts inside attention and adds nothing to the embeddings, so "
            f"model.concat_position_dims={concat} has nothing to concatenate: use 0, or a scheme "
            f"that embeds (sinusoidal, learned)"
        )
    limit = scheme.position_limit()
    if reach and limit is not None and limit < block - 1e-6:
        raise PositionError(
            f"{position} covers positions 0..{limit - 1:g} but model.block_size={block} needs "
            f"0..{block - 1}: leave out the factor of interpolated to have it computed, or give "
            f"the learned table more rows"
        )


MAX_BASE = 1e10  # a rope / sinusoidal base: Llama 3 has 5e5, Qwen 1e6; above, float32 angles lose their slow pairs
MAX_FACTOR = 1e4  # a length factor (scalings, interpolation): 4-128 in practice
MAX_POSITIONS = 2**24  # positions, lengths and distances an option names (16.7M tokens)


def check_number(
    kind: str,
    name: str,
    value: Any,
    *,
    low: float = None,
    high: float = None,
    low_open: bool = True,
    integer: bool = False,
) -> None:
    """One-line PositionError, '``kind``: ``name``=VALUE is invalid: expected ...', unless ``value``
    is a number from ``low`` (above it where ``low_open``) to ``high``; with ``integer`` a whole
    number (4.0 too, as YAML may write it). ``minilm.common.check_number``, the one numeric check."""
    whole = integer and isinstance(value, float) and value.is_integer()
    check_setting(
        f"{kind}: {name}",
        int(value) if whole else value,
        Range(low, high, low_open=low_open, integer=integer),
        PositionError,
    )


class PositionScheme(nn.Module):
    """Base class: no positional information at all. Subclasses override what they use."""

    kind: str = "?"
    description: str = ""
    options: Dict[str, Any] = {}
    renamed_options: Dict[str, str] = {}  # old option name -> current name, for old configs and checkpoints
    setting_options: tuple = ()  # options that hold another scheme's settings (a mapping with a kind)
    variants: Dict[str, tuple] = {}  # names that are no kind but settings of this one: yarn -> (scaling.type=yarn, ...)
    nested_options: Dict[str, tuple] = {}  # an option holding a mapping -> its keys (rope: scaling -> type, ...)
    has_bias: bool = False  # True when bias() returns a tensor (the attention then needs a mask)
    has_value_term: bool = False  # True when value_term() adds to the attention output
    scaled_embedding: bool = False  # True when model.embedding_scale auto means sqrt(d_model) (a unit-amplitude table)
    draws_at_evaluation: bool = False  # True when positions are drawn at random in eval mode too (no cache then)

    def __init__(self, *, d_model: int, n_head: int, block_size: int, head_dim: Optional[int] = None):
        super().__init__()
        self.d_model, self.n_head, self.block_size = d_model, n_head, block_size
        self.head_dim = head_dim or d_model // n_head  # the width q and k have in each head

    def position_limit(self) -> Optional[float]:
        """Largest usable position + 1, or None when any position works."""
        return None

    def refill_length(self) -> Optional[int]:
        """The sequence length past which a cached generation must recompute its keys once
        (their rotation changes there: LongRoPE's ``switch: refill``), or None: never."""
        return None

    @property
    def prefix_invariant(self) -> bool:
        """True when a token's output does not depend on the length of the sequence being
        processed (the scheme ignores ``context_len``): its scores in an evaluation segment then equal
        those inside any longer segment that starts at the same token
        (``minilm.evaluation.scoring.score_many``)."""
        return True

    def check_positions(self, last: float) -> None:
        """Raise a clear PositionError before any indexing when the largest position ``last``
        is out of range. A number, not the positions tensor: reading a tensor's maximum
        would break a ``torch.compile`` graph in two at every forward pass."""
        limit = self.position_limit()
        if limit is not None and last > limit - 1:
            raise PositionError(
                f"position {last:g} is past the {self.kind} position table "
                f"(positions 0..{limit - 1:g}): keep sequences within {limit:g} tokens, or use a "
                f"relative scheme (rope, alibi, t5, none) or interpolated"
            )

    def unwrap(self) -> tuple:
        """(the scheme that acts at evaluation, the factor it divides positions by): the scheme
        itself and 1; a wrapper answers for what it wraps (``interpolated`` multiplies the
        factor by its own, ``randomized`` hands on plain positions at evaluation)."""
        return self, 1.0

    @property
    def embeds(self) -> bool:
        """True when the scheme that acts at evaluation adds positions to the token embeddings
        (``embed``): its positions are in every hidden state, not only inside attention."""
        inner, _ = self.unwrap()
        return type(inner).embed is not PositionScheme.embed

    def start(self, pos: torch.Tensor, context_len: int) -> "PositionScheme":
        """Called once at the start of every forward pass with the new tokens' positions and the
        pass's context length, before any other hook; returns what the pass asks its hooks of:
        the scheme itself, or where it computes something once per pass a ``SchemePass`` that
        holds it (the forward pass carries it: ``ForwardPass.scheme``)."""
        return self

    def embed(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return x

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, context_len: int):
        return q, k

    def rotate_stacked(self, qk: torch.Tensor, n_q: int, pos: torch.Tensor, context_len: int):
        """``rotate`` of q = qk[:, :n_q] and k = qk[:, n_q:], given stacked on the head dimension as
        the attention's projection makes them; (q', k'). A scheme that rotates q and k alike (rope)
        rotates the stack at once."""
        return self.rotate(qk[:, :n_q], qk[:, n_q:], pos, context_len)

    def bias(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, q: Optional[torch.Tensor] = None
    ) -> Optional[torch.Tensor]:
        """Added to the logits of queries at ``q_pos`` over keys at ``k_pos``; ``q`` (B, heads, Tq,
        head_dim) are the rotated queries, for a scheme whose bias depends on them."""
        return None

    def value_term(self, weights: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> Optional[torch.Tensor]:
        """Added to the attention output, from its weights (B, heads, Tq, Tk); None adds nothing."""
        return None

    def extra_repr(self) -> str:
        return f"kind={self.kind}"


class SchemePass:
    """One forward pass of a scheme: what ``start`` returns where the scheme computes something
    once per pass (rope's cos/sin tables, interpolation's divided positions, randomized's drawn
    ones). It runs the scheme's own hooks with itself in the scheme's place, so that the methods a
    subclass defines here (``tables``, ``_scaled``, ``_map``) answer from this pass, and answers
    every other attribute from the scheme. The pass's state lives here and ends with the pass:
    nothing of one pass is kept on the module for the next."""

    def __init__(self, scheme: PositionScheme, pos: torch.Tensor, context_len: int):
        self.has_bias, self.has_value_term = scheme.has_bias, scheme.has_value_term  # read in every layer
        self.scheme, self.pos, self.context_len = scheme, pos, context_len

    def __getattr__(self, name: str):  # called only for names not set here: the scheme's
        if name == "scheme":
            raise AttributeError(name)
        return getattr(self.scheme, name)

    def embed(self, x, pos):
        return type(self.scheme).embed(self, x, pos)

    def rotate(self, q, k, pos, context_len):
        return type(self.scheme).rotate(self, q, k, pos, context_len)

    def rotate_stacked(self, qk, n_q, pos, context_len):
        return type(self.scheme).rotate_stacked(self, qk, n_q, pos, context_len)

    def bias(self, q_pos, k_pos, q=None):
        return type(self.scheme).bias(self, q_pos, k_pos, q)

    def value_term(self, weights, q_pos, k_pos):
        return type(self.scheme).value_term(self, weights, q_pos, k_pos)
