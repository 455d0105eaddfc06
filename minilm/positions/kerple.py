"""KERPLE (Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation"): a learned, conditionally positive definite kernel of the distance, added to
the attention logits of every layer (no embedding, no rotation).

* ``log`` variant (the paper's best):  bias_h(i, j) = -r1_h * log(1 + r2_h * (i - j))
* ``power`` variant:                   bias_h(i, j) = -r1_h * (i - j) ** r2_h,  0 < r2_h <= 2

r1_h, r2_h > 0 are learned per head and shared by all layers. Initialised and kept positive as
the paper's code does (chijames/KERPLE, ``megatron/mpu/layers.py``, ParallelKerpleLog and
ParallelKerplePower): the multiplier uniform in [0, 1) for power (``bias_a``) and in [0, 2) for
log (``bias_p``), the other parameter uniform in [0, 1) for log (``bias_a``) and [0, 2) for
power (the exponent ``bias_p``, at most 2); every training pass first projects them onto
[``floor``, ...) in place (the reference's ``.data.clamp(min=...)``), so a parameter pushed
below the floor comes back to it and keeps its gradient. The reference's floor is 1e-2, which
the study sets; the default stays 1e-4, minilm's clamp before the option, because a saved
model records only the options it was given and must load unchanged. The bias is built from
absolute query and key positions, so it is the same with a cache.
"""

import torch
from torch import nn

from minilm.positions.base import PositionError, PositionScheme, check_number, register

VARIANTS = ("log", "power")


@register("kerple")
class Kerple(PositionScheme):
    """KERPLE's learned per-head log or power kernel of the distance (the module docstring)."""

    description = "learned log (or power) kernel of the distance per head on attention logits (Chi et al. 2022)"
    options = {"variant": "log", "floor": 1e-4}  # the reference code's floor: 1e-2 (module docstring)
    has_bias = True

    def __init__(self, *, variant: str, floor: float, **kw):
        if variant not in VARIANTS:
            raise PositionError(f"kerple: variant={variant!r} is unknown: valid: {', '.join(VARIANTS)}")
        check_number("kerple", "floor", floor, low=0, high=1)
        super().__init__(**kw)
        self.variant, self.floor = variant, float(floor)
        multiplier, inner = (2.0, 1.0) if variant == "log" else (1.0, 2.0)  # the reference's uniform ranges
        self.r1 = nn.Parameter(torch.rand(self.n_head) * multiplier)
        self.r2 = nn.Parameter(torch.rand(self.n_head) * inner)

    def start(self, pos, context_len):
        if self.training:  # the reference's projection, once per forward pass and before any use
            with torch.no_grad():
                self.r1.clamp_(min=self.floor)
                self.r2.clamp_(min=self.floor, max=None if self.variant == "log" else 2.0)
        return self

    def bias(self, q_pos, k_pos, q=None):
        top = None if self.variant == "log" else 2.0
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0)[None]  # future keys are masked anyway
        r1 = self.r1.clamp(min=self.floor)[:, None, None]  # a no-op after the projection (weights loaded as they are)
        r2 = self.r2.clamp(min=self.floor, max=top)[:, None, None]
        if self.variant == "log":
            return -r1 * torch.log1p(r2 * distance)
        powered = distance.clamp(min=1e-6).pow(r2)  # clamped: the gradient of 0 ** r2 in r2 is not finite
        return -r1 * torch.where(distance > 0, powered, torch.zeros_like(powered))

    def extra_repr(self):
        return f"kind=kerple, variant={self.variant}, floor={self.floor:g}"
