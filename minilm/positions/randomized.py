"""Randomized positional encodings (Ruoss et al. 2023, "Randomized Positional Encodings Boost
Length Generalization of Transformers") as a wrapper, like ``interpolated``: it holds another
scheme (``inner``) and, in training, hands it a sorted random sample of T distinct integer
positions from [0, max_positions) instead of 0..T-1, drawn afresh for every forward pass.
The model thus meets positions up to max_positions while training on T tokens.

At evaluation (``model.eval()``) ``eval_positions`` decides. ``plain`` (the default) hands on
the ordinary positions 0..T-1, so the cache and every length behave as for the wrapped scheme.
``sampled`` draws a sorted sample at evaluation too, as the official code does (its noisy
encodings sample on every call, training or not), one per row of a batch (``GPT.forward``): the model then sees at
test time the
kind of positions it was trained on (a mean gap of max_positions / T between neighbours,
8 in the study at L, where plain positions have a gap of 1). A sampled evaluation is not
prefix-invariant (a segment's positions depend on its length) and cannot be cached (the
positions of tokens not yet generated are not drawn): ``new_cache`` refuses it, and a
sequence longer than max_positions cannot be drawn.

The paper's variants are the schemes it wraps: randomized sinusoidal, learned (a table of
max_positions rows), rope and alibi are ``inner: {kind: ...}``. ``max_positions`` defaults to
8 x block_size (the paper trains on at most 40 tokens with max_positions 2048). The sample
comes from torch's global generator, whose state a checkpoint saves, so resuming continues
exactly.
"""

from typing import Optional

import torch

from minilm.positions.base import (
    MAX_POSITIONS,
    PositionError,
    PositionScheme,
    SchemePass,
    build,
    check_number,
    register,
)

DEFAULT_RANGE = 8  # max_positions unless given: this many block_sizes
EVAL_POSITIONS = ("plain", "sampled")  # what a model in eval mode is handed (module docstring)


@register("randomized")
class Randomized(PositionScheme):
    """Another scheme (``inner``) trained at sorted random positions from [0, ``max_positions``)
    (the module docstring); ``eval_positions`` says which positions evaluation takes."""

    description = "wraps another kind; trains on sorted random positions from [0, max_positions) (Ruoss et al. 2023)"
    options = {"inner": {"kind": "rope"}, "max_positions": None, "eval_positions": "plain"}  # None: 8 x block_size
    setting_options = ("inner",)

    def __init__(
        self,
        *,
        inner: dict,
        max_positions,
        eval_positions: str,
        d_model: int,
        n_head: int,
        block_size: int,
        head_dim: Optional[int] = None,
    ):
        if isinstance(inner, dict) and inner.get("kind") == "randomized":
            raise PositionError(
                "randomized: inner={kind: randomized} is invalid: positions drawn from drawn "
                "positions have no meaning; wrap a plain scheme (rope, alibi, ...)"
            )
        if max_positions is None:
            max_positions = DEFAULT_RANGE * block_size
        check_number(
            "randomized", "max_positions", max_positions, low=1, low_open=False, integer=True, high=MAX_POSITIONS
        )
        if eval_positions not in EVAL_POSITIONS:
            raise PositionError(
                f"randomized: eval_positions={eval_positions!r} is invalid: valid: {', '.join(EVAL_POSITIONS)}"
            )
        if max_positions < block_size:
            raise PositionError(
                f"randomized: max_positions={max_positions} is smaller than block_size={block_size}: "
                f"T distinct positions need at least T to choose from"
            )
        super().__init__(d_model=d_model, n_head=n_head, block_size=block_size, head_dim=head_dim)
        self.max_positions = int(max_positions)
        self.inner = build(inner, d_model=d_model, n_head=n_head, block_size=self.max_positions, head_dim=head_dim)
        self.has_bias, self.has_value_term = self.inner.has_bias, self.inner.has_value_term
        self.scaled_embedding = self.inner.scaled_embedding
        self.eval_positions = eval_positions
        self.draws_at_evaluation = eval_positions == "sampled"

    @property
    def prefix_invariant(self):
        return self.inner.prefix_invariant and not self.draws_at_evaluation

    def position_limit(self):
        return self.inner.position_limit()

    def unwrap(self):
        return self.inner.unwrap()  # at evaluation the wrapped scheme sees the plain positions

    def start(self, pos, context_len):
        """The pass's scheme: in training (or with ``eval_positions: sampled``) a ``RandomizedPass``
        that holds this pass's draw, T distinct positions of 0..max_positions-1 in order, for every
        layer; else the scheme itself, which hands the wrapped scheme the plain positions."""
        if not (self.training or self.draws_at_evaluation):
            inner = self.inner.start(pos, context_len)
            return self if inner is self.inner else RandomizedPass(self, pos, context_len, None, inner)
        if len(pos) > self.max_positions:
            raise PositionError(
                f"randomized: {len(pos)} positions cannot be drawn from max_positions="
                f"{self.max_positions}: keep sequences within {self.max_positions} tokens or "
                f"evaluate with eval_positions=plain"
            )
        table = torch.randperm(self.max_positions)[: len(pos)].sort().values.to(device=pos.device, dtype=torch.float32)
        drawn = table[pos.long()]
        return RandomizedPass(self, pos, context_len, table, self.inner.start(drawn, context_len), drawn)

    def _map(self, pos):
        """The positions the wrapped scheme sees: the module's own are the plain ones."""
        return pos

    def embed(self, x, pos):
        return self.inner.embed(x, self._map(pos))

    def rotate(self, q, k, pos, context_len):
        return self.inner.rotate(q, k, self._map(pos), context_len)

    def bias(self, q_pos, k_pos, q=None):
        return self.inner.bias(self._map(q_pos), self._map(k_pos), q)

    def value_term(self, weights, q_pos, k_pos):
        return self.inner.value_term(weights, self._map(q_pos), self._map(k_pos))

    def extra_repr(self):
        return f"max_positions={self.max_positions}, eval_positions={self.eval_positions}"


class RandomizedPass(SchemePass):
    """A randomized scheme over one forward pass: ``table`` (the drawn position of each position
    0..T-1, or None: plain positions), the pass's own positions mapped once (``drawn``), and
    ``inner`` the wrapped scheme's pass at them."""

    def __init__(self, scheme: Randomized, pos, context_len: int, table, inner, drawn=None):
        super().__init__(scheme, pos, context_len)
        self.table, self.inner, self.drawn = table, inner, drawn

    def _map(self, pos):
        if self.table is None:
            return pos
        return self.drawn if pos is self.pos else self.table[pos.long()]
