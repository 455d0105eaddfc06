"""T5 relative position bias (Raffel et al. 2020): one learned scalar per head and per
relative-distance bucket, shared by all layers, added to the attention logits.

Causal (unidirectional) bucketing of the distance n = i - j >= 0: the first half of the
buckets hold n = 0 .. num_buckets/2 - 1 exactly; the rest cover larger distances on a
log scale up to ``max_distance``; everything farther shares the last bucket. The table starts
as transformers' T5 does (``T5PreTrainedModel._init_weights``): normal with standard deviation
d_model^-1/2 (factor 1), not zero, so the heads start with distinct biases.
"""

import math

import torch
from torch import nn

from minilm.positions.base import MAX_POSITIONS, PositionScheme, check_number, register


def t5_bucket(distance: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Bucket index for non-negative (possibly fractional) distances."""
    n = distance.clamp(min=0).floor()
    max_exact = num_buckets // 2
    scaled = torch.log(n.clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + scaled * (num_buckets - max_exact)).floor().clamp(max=num_buckets - 1)
    return torch.where(n < max_exact, n, large).long()


@register("t5")
class T5Bias(PositionScheme):
    """T5's learned per-head bias per log-spaced distance bucket (the module docstring)."""

    description = "learned per-head bias per log-spaced relative-distance bucket (Raffel et al. 2020)"
    options = {"num_buckets": 32, "max_distance": 128}
    has_bias = True

    def __init__(self, *, num_buckets: int, max_distance: int, **kw):
        check_number("t5", "num_buckets", num_buckets, low=2, low_open=False, integer=True, high=4096)
        check_number("t5", "max_distance", max_distance, low=num_buckets // 2, integer=True, high=MAX_POSITIONS)
        super().__init__(**kw)
        self.num_buckets, self.max_distance = int(num_buckets), int(max_distance)
        self.relative_bias = nn.Embedding(self.num_buckets, self.n_head)
        nn.init.normal_(self.relative_bias.weight, std=self.d_model**-0.5)

    def bias(self, q_pos, k_pos, q=None):
        buckets = t5_bucket(q_pos[:, None] - k_pos[None, :], self.num_buckets, self.max_distance)
        return self.relative_bias(buckets).permute(2, 0, 1).float()  # (heads, Tq, Tk)
