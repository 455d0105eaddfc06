"""Fixed sinusoidal positions (Vaswani et al. 2017, "Attention Is All You Need").

PE[p, 2i] = sin(p / base^(2i/d)),  PE[p, 2i+1] = cos(p / base^(2i/d)),  added to the
token embedding. Computed on the fly in float32, so any (fractional) position works.
"""
import torch

from minilm.positions.base import PositionError, PositionScheme, check_number, register


def sinusoidal_table(pos: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """(T, dim) matrix of interleaved sin/cos values for float positions ``pos``."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = pos.to(torch.float64)[:, None] * inv_freq[None, :]
    table = torch.stack((angles.sin(), angles.cos()), dim=-1).reshape(len(pos), dim)
    return table.to(torch.float32)


@register("sinusoidal")
class Sinusoidal(PositionScheme):
    description = "fixed sin/cos added to the token embedding (Vaswani et al. 2017)"
    options = {"base": 10000.0}

    def __init__(self, *, base: float, d_model: int, **kw):
        check_number("sinusoidal", "base", base, low=1)
        if d_model % 2:
            raise PositionError(f"sinusoidal: d_model={d_model} is odd: sin/cos pairs need an even d_model")
        super().__init__(d_model=d_model, **kw)
        self.base = float(base)

    def embed(self, x, pos):
        return x + sinusoidal_table(pos, self.d_model, self.base).to(x.dtype)
