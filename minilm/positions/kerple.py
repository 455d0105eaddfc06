"""KERPLE (Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation"): a learned, conditionally positive definite kernel of the distance, added to
the attention logits of every layer (no embedding, no rotation).

* ``log`` variant (the paper's best):  bias_h(i, j) = -r1_h * log(1 + r2_h * (i - j))
* ``power`` variant:                   bias_h(i, j) = -r1_h * (i - j) ** r2_h,  0 < r2_h <= 2

r1_h, r2_h > 0 are learned per head and shared by all layers; they are kept positive by
clamping at ``MIN_PARAMETER`` in the forward pass, as the paper's code does. Initial values:
log: r1 = 1 and r2 the ALiBi slopes 2^(-8h/n) (every head its own reach); power: r1 the
ALiBi slopes and r2 = 1, which is exactly ALiBi at initialisation. The bias is built from
absolute query and key positions, so it is the same with a cache.
"""
import torch
from torch import nn

from minilm.positions.alibi import alibi_slopes
from minilm.positions.base import PositionError, PositionScheme, register

MIN_PARAMETER = 1e-4  # below the smallest ALiBi slope, 2^-8
VARIANTS = ("log", "power")


@register("kerple")
class Kerple(PositionScheme):
    description = "learned log (or power) kernel of the distance per head on attention logits (Chi et al. 2022)"
    options = {"variant": "log"}
    has_bias = True

    def __init__(self, *, variant: str, **kw):
        if variant not in VARIANTS:
            raise PositionError(f"kerple: variant={variant!r} is unknown: valid: {', '.join(VARIANTS)}")
        super().__init__(**kw)
        self.variant = variant
        slopes = torch.tensor(alibi_slopes(self.n_head), dtype=torch.float32)
        ones = torch.ones(self.n_head)
        self.r1 = nn.Parameter(ones.clone() if variant == "log" else slopes.clone())
        self.r2 = nn.Parameter(slopes.clone() if variant == "log" else ones.clone())

    def bias(self, q_pos, k_pos, q=None):
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0)[None]  # future keys are masked anyway
        r1 = self.r1.clamp(min=MIN_PARAMETER)[:, None, None]
        if self.variant == "log":
            r2 = self.r2.clamp(min=MIN_PARAMETER)[:, None, None]
            return -r1 * torch.log1p(r2 * distance)
        r2 = self.r2.clamp(min=MIN_PARAMETER, max=2.0)[:, None, None]
        powered = distance.clamp(min=1e-6).pow(r2)  # clamped: the gradient of 0 ** r2 in r2 is not finite
        return -r1 * torch.where(distance > 0, powered, torch.zeros_like(powered))

    def extra_repr(self):
        return f"kind=kerple, variant={self.variant}"
