"""Position interpolation as a wrapper (Chen et al. 2023, "Extending Context Window of Large
Language Models via Positional Interpolation"): it holds another scheme and hands it
positions divided by ``factor``, so a model trained on L positions sees L*factor tokens
inside its familiar range. Works for rope (same as linear scaling), sinusoidal, learned
(linear interpolation between table rows) and alibi / t5 (scaled distances).

The wrapped scheme is the option ``inner`` (it was called ``base`` before, a name that read
like rope's base frequency; old settings are translated by ``positions.canonical``).
"""

from typing import Optional

from minilm.positions.base import MAX_FACTOR, PositionScheme, SchemePass, build, check_number, register


@register("interpolated")
class Interpolated(PositionScheme):
    """Another scheme (``inner``) at positions divided by ``factor`` (the module docstring)."""

    description = "wraps another kind and divides its positions by factor (position interpolation)"
    options = {"inner": {"kind": "rope"}, "factor": 2.0}
    renamed_options = {"base": "inner"}
    setting_options = ("inner",)

    def __init__(
        self, *, inner: dict, factor: float, d_model: int, n_head: int, block_size: int, head_dim: Optional[int] = None
    ):
        check_number("interpolated", "factor", factor, low=0, high=MAX_FACTOR)
        super().__init__(d_model=d_model, n_head=n_head, block_size=block_size, head_dim=head_dim)
        self.factor = float(factor)
        # the wrapped scheme was trained at block_size / factor positions
        inner_block = max(1, int(round(block_size / self.factor)))
        self.inner = build(inner, d_model=d_model, n_head=n_head, block_size=inner_block, head_dim=head_dim)
        self.has_bias, self.has_value_term = self.inner.has_bias, self.inner.has_value_term
        self.scaled_embedding = self.inner.scaled_embedding

    @property
    def prefix_invariant(self):
        return self.inner.prefix_invariant

    def position_limit(self):
        limit = self.inner.position_limit()
        return None if limit is None else (limit - 1) * self.factor + 1

    def unwrap(self):
        inner, factor = self.inner.unwrap()
        return inner, factor * self.factor

    def _scaled(self, pos):
        return pos / self.factor

    def inner_length(self, context_len: int) -> int:
        """The context length the wrapped scheme sees: ``context_len`` in its own positions."""
        return max(1, int(round(context_len / self.factor)))

    def start(self, pos, context_len):
        """The pass's scheme: an ``InterpolatedPass`` that divides the pass's positions once for
        every layer and holds the wrapped scheme's own pass at them."""
        scaled = self._scaled(pos)
        return InterpolatedPass(
            self, pos, context_len, scaled, self.inner.start(scaled, self.inner_length(context_len))
        )

    def embed(self, x, pos):
        scaled, limit = self._scaled(pos), self.inner.position_limit()
        if limit is not None:  # pos / factor in float32 may overshoot the last row by an ulp
            scaled = scaled.clamp(max=limit - 1)
        return self.inner.embed(x, scaled)

    def rotate(self, q, k, pos, context_len):
        return self.inner.rotate(q, k, self._scaled(pos), self.inner_length(context_len))

    def bias(self, q_pos, k_pos, q=None):
        return self.inner.bias(q_pos / self.factor, k_pos / self.factor, q)

    def value_term(self, weights, q_pos, k_pos):
        return self.inner.value_term(weights, q_pos / self.factor, k_pos / self.factor)

    def extra_repr(self):
        return f"factor={self.factor}"


class InterpolatedPass(SchemePass):
    """An interpolated scheme over one forward pass: its positions divided once (``scaled``), and
    ``inner`` the wrapped scheme's pass at them."""

    def __init__(self, scheme: Interpolated, pos, context_len: int, scaled, inner):
        super().__init__(scheme, pos, context_len)
        self.scaled, self.inner = scaled, inner

    def _scaled(self, pos):
        return self.scaled if pos is self.pos else pos / self.scheme.factor
