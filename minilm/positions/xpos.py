"""xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer"): RoPE whose rotated q and k are
also scaled per dimension pair, so that q . k decays smoothly with distance.

With zeta_i = (2i/d + gamma) / (1 + gamma) for pair i of the d rotated dims (gamma = 0.4),
the query at position n is multiplied by zeta_i^(n / scale_base) and the key at position m by
zeta_i^(-m / scale_base) (scale_base = 512), on top of the rotation (halves layout, as
``rope``). Their product carries zeta_i^((n - m) / scale_base) <= 1: a decay per pair that
depends only on the distance.

Overflow, exactly with a cache: zeta_0 = 0.4 / 1.4, so zeta_0^(-m/512) passes float32's range
(about e^88) near m = 36,000. Any common reference position r cancels in the product
(zeta^((n - r)/b) * zeta^(-(m - r)/b) = zeta^((n - m)/b)), so the exponents are taken from
r = context_len // 2: the context length is fixed for a whole cached generation (as for
dynamic NTK), so keys cached at their absolute positions and queries decoded later use the
same r, and the full forward pass uses it too. Positions farther from r than the reach,
80 scale_base / ln(1 / zeta_0) (about 32,700 positions at the defaults, where the scales
stay below e^80), are a clear error rather than an overflow. In float16 (largest value 65,504,
about e^11) the scaled q and k overflow far sooner: there the scales stay below e^8, leaving room
for the vectors they multiply (a reach of about 3,270 positions at the defaults).
"""

import math

import torch

from minilm.positions.base import MAX_POSITIONS, PositionError, PositionScheme, check_number, register
from minilm.positions.rope import RoPE

LOG_SCALE_LIMIT = 80.0  # largest |log| of a scale: float32 (and bfloat16) end near e^88
HALF_LOG_SCALE_LIMIT = 8.0  # in float16, which ends near e^11: room for the |q|, |k| the scales multiply


@register("xpos")
class XPos(RoPE):
    """RoPE whose q and k carry a per-pair decay with distance (the module docstring)."""

    description = "RoPE with a per-pair decay of q.k with distance (Sun et al. 2022)"
    options = {"base": 10000.0, "rotary_fraction": 1.0, "scale_base": 512.0, "gamma": 0.4}

    def __init__(self, *, scale_base: float, gamma: float, base: float, rotary_fraction: float, **kw):
        super().__init__(base=base, rotary_fraction=rotary_fraction, scaling=None, **kw)
        check_number("xpos", "scale_base", scale_base, low=0, high=MAX_POSITIONS)
        check_number("xpos", "gamma", gamma, low=0, high=100)
        self.scale_base, self.gamma = float(scale_base), float(gamma)
        pairs = torch.arange(0, self.rot, 2, dtype=torch.float64) / self.rot
        self.register_buffer("zeta", ((pairs + self.gamma) / (1 + self.gamma)).float(), persistent=False)
        smallest = float(torch.tensor(self.gamma / (1 + self.gamma), dtype=torch.float32, device="cpu"))  # zeta[0]
        self.reach = self.reach_for(LOG_SCALE_LIMIT, smallest)
        self.half_reach = self.reach_for(HALF_LOG_SCALE_LIMIT, smallest)

    def reach_for(self, log_limit: float, smallest: float):
        """Positions from the reference at which the largest scale, 1 / smallest^(offset / scale_base),
        reaches e^log_limit (None: no pair decays, no scale grows)."""
        return int(log_limit * self.scale_base / -math.log(smallest)) if smallest < 1 else None

    def scales(self, pos: torch.Tensor, context_len: int, dtype: torch.dtype):
        """(T, rot) factors of q and of k: zeta^((pos - r) / scale_base) and its inverse."""
        offset = pos.to(torch.float32) - float(context_len // 2)
        half = dtype == torch.float16
        reach = self.half_reach if half else self.reach
        if reach is not None and offset.numel() and not offset.is_meta and float(offset.abs().max()) > reach:
            far = float(pos.reshape(-1)[offset.abs().argmax()])
            raise PositionError(
                f"xpos: position {far:g} is more than {reach} positions from the reference "
                f"{context_len // 2} (half the context length {context_len}): {'float16' if half else 'float32'} "
                f"would overflow; use {'bfloat16 or float32, or ' if half else ''}a shorter sequence or generation "
                "context"
            )
        log_scale = offset[:, None] / self.scale_base * self.zeta.log().to(pos.device)[None, :]
        log_scale = torch.cat((log_scale, log_scale), dim=-1)  # both dims of a pair (halves layout)
        return log_scale.exp().to(dtype), (-log_scale).exp().to(dtype)

    def rotate(self, q, k, pos, context_len):
        cos, signed_sin = self.tables(pos, context_len, q.dtype)
        q_scale, k_scale = self.scales(pos, context_len, q.dtype)
        return (
            self._rotate(q, cos * q_scale, signed_sin * q_scale),
            self._rotate(k, cos * k_scale, signed_sin * k_scale),
        )

    rotate_stacked = PositionScheme.rotate_stacked  # q and k are scaled apart: no stack

    def extra_repr(self):
        return f"kind=xpos, scale_base={self.scale_base:g}, gamma={self.gamma:g}"
