"""ALiBi (Press et al. 2022, "Train Short, Test Long"): no embedding; each head h adds
-m_h * (i - j) to the logit of query position i attending to key position j <= i.

Slopes: for n heads a power of two, m_h = 2^(-8h/n), h = 1..n. Otherwise, with
p = 2^floor(log2 n): slopes(p) followed by slopes(2p)[0::2][:n - p].
The bias is built from absolute query and key positions, so it is the same with a cache.
"""

import math

import torch

from minilm.positions.base import PositionScheme, register


def alibi_slopes(n_head: int) -> list:
    """Per-head slopes of the ALiBi paper, for any number of heads."""

    def power_of_two(n):
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    p = 2 ** int(math.floor(math.log2(n_head)))
    if p == n_head:
        return power_of_two(n_head)
    return power_of_two(p) + power_of_two(2 * p)[0::2][: n_head - p]


@register("alibi")
class ALiBi(PositionScheme):
    """ALiBi's per-head linear distance penalty on the attention logits (the module docstring)."""

    description = "linear distance penalty per head on attention logits (Press et al. 2022)"
    options = {}
    has_bias = True

    def __init__(self, **kw):
        super().__init__(**kw)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(self.n_head), dtype=torch.float32), persistent=False)

    def bias(self, q_pos, k_pos, q=None):
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0)  # future keys are masked anyway
        return -self.slopes[:, None, None] * distance[None]
