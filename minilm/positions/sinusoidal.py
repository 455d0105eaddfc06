"""Fixed sinusoidal positions (Vaswani et al. 2017, "Attention Is All You Need").

PE[p, 2i] = sin(p / base^(2i/d)),  PE[p, 2i+1] = cos(p / base^(2i/d)),  added to the
token embedding. Computed on the fly in float32, so any (fractional) position works.

The table has unit amplitude (norm sqrt(d/2)) while GPT-2-initialised token embeddings have
std 0.02 (norm 0.02 sqrt(d)): added as they are, the positions drown the tokens, and such a
model trains far worse at its own length than the other schemes. Vaswani et al. (section
3.4) multiply the embeddings by sqrt(d_model) before adding the positions; so does minilm
for this scheme (``scaled_embedding``: ``model.embedding_scale: auto``), which puts token
and position on the same footing (norm 0.02 d vs sqrt(d/2): equal near d = 1250, within a
factor 3 at the default d = 192).

``dim_dropout: [high, low]`` (default [0, 0], off) is dimension-specific dropout on the table,
from the teaching notes minilm grew from: in training each dimension of a row's encoding is
dropped with its own probability, a linear ramp from ``high`` on the fastest-turning pair
(i = 0) to ``low`` on the slowest, on the idea that the high frequencies are what a model
overfits to. A kept dimension is divided by 1 - p (inverted dropout, as ``nn.Dropout``), so the
expected encoding in training is the one used at evaluation, where nothing is dropped. The
draws are per row and dimension, shared by every position of the row. A sin and a cos of the
same frequency have the same rate.
"""

import torch

from minilm.positions.base import MAX_BASE, PositionError, PositionScheme, check_number, register


def sinusoidal_table(pos: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """(T, dim) matrix of interleaved sin/cos values for float positions ``pos``."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device) / dim)
    angles = pos.to(torch.float64)[:, None] * inv_freq[None, :]
    table = torch.stack((angles.sin(), angles.cos()), dim=-1).reshape(len(pos), dim)
    return table.to(torch.float32)


@register("sinusoidal")
class Sinusoidal(PositionScheme):
    """The fixed sin/cos table at ``base`` added to the token embedding (the module docstring)."""

    description = "fixed sin/cos added to the token embedding (Vaswani et al. 2017)"
    options = {"base": 10000.0, "dim_dropout": [0.0, 0.0]}
    scaled_embedding = True

    def __init__(self, *, base: float, dim_dropout, d_model: int, **kw):
        check_number("sinusoidal", "base", base, low=1, high=MAX_BASE)
        if d_model % 2:
            raise PositionError(f"sinusoidal: d_model={d_model} is odd: sin/cos pairs need an even d_model")
        if not isinstance(dim_dropout, (list, tuple)) or len(dim_dropout) != 2:
            raise PositionError(
                f"sinusoidal: dim_dropout={dim_dropout!r} is invalid: expected [high, low], two "
                f"rates from 0 to below 1 (e.g. [0.2, 0.1])"
            )
        for rate in dim_dropout:
            check_number("sinusoidal", "dim_dropout rate", rate, low=0, low_open=False, high=0.99)
        super().__init__(d_model=d_model, **kw)
        self.base = float(base)
        self.dim_dropout = [float(r) for r in dim_dropout]
        self.register_buffer("drop_rates", dropout_ramp(d_model, *self.dim_dropout), persistent=False)

    def embed(self, x, pos):
        table = sinusoidal_table(pos, self.d_model, self.base).to(x.dtype)
        if self.training and any(self.dim_dropout):
            keep = 1 - self.drop_rates.to(x.dtype)
            mask = torch.rand(x.shape[0], 1, self.d_model, device=x.device) < keep  # per row and dimension
            table = table * mask / keep
        return x + table

    def extra_repr(self):
        return f"base={self.base:g}" + (f", dim_dropout={self.dim_dropout}" if any(self.dim_dropout) else "")


def dropout_ramp(dim: int, high: float, low: float) -> torch.Tensor:
    """(dim,) drop probabilities: ``high`` on the first (fastest) sin/cos pair, ``low`` on the last,
    linear in the pair index i between them; both members of a pair share their pair's rate."""
    pairs = dim // 2
    ramp = torch.linspace(high, low, pairs) if pairs > 1 else torch.tensor([high])
    return ramp.repeat_interleave(2)
