"""Learned absolute positions (GPT-2): a trained table of ``max_positions`` rows added to
the token embedding. Fractional positions (from ``interpolated``) interpolate linearly
between neighbouring rows. Positions past the table are a clear error, never an index error:
``GPT.forward`` checks them (``PositionScheme.check_positions``) before any lookup, and
``embed`` takes positions already checked.
"""

from torch import nn

from minilm.positions.base import MAX_POSITIONS, PositionScheme, check_number, register


@register("learned")
class Learned(PositionScheme):
    """A trained table of ``max_positions`` absolute positions added to the token embedding."""

    description = "trained table of absolute positions added to the token embedding (GPT-2); bounded"
    options = {"max_positions": None}  # None: the model's block_size

    def __init__(self, *, max_positions, block_size: int, **kw):
        if max_positions is None:
            max_positions = block_size
        check_number("learned", "max_positions", max_positions, low=1, low_open=False, integer=True, high=MAX_POSITIONS)
        super().__init__(block_size=block_size, **kw)
        self.table = nn.Embedding(int(max_positions), self.d_model)
        nn.init.normal_(self.table.weight, std=0.02)

    def position_limit(self):
        return self.table.num_embeddings

    def embed(self, x, pos):
        lower = pos.floor()
        frac = (pos - lower).to(x.dtype)[:, None]
        lower = lower.long()
        upper = (lower + 1).clamp(max=self.table.num_embeddings - 1)
        # at whole positions frac is 0 and this is exactly the row (no data-dependent branch,
        # which would break a compiled graph)
        rows = self.table(lower) * (1 - frac) + self.table(upper) * frac
        return x + rows.to(x.dtype)
