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
    scaled_embedding = True

    def __init__(self, *, base: float, d_model: int, **kw):
        check_number("sinusoidal", "base", base, low=1)
        if d_model % 2:
            raise PositionError(f"sinusoidal: d_model={d_model} is odd: sin/cos pairs need an even d_model")
        super().__init__(d_model=d_model, **kw)
        self.base = float(base)

    def embed(self, x, pos):
        return x + sinusoidal_table(pos, self.d_model, self.base).to(x.dtype)
