"""Relative position representations (Shaw et al. 2018, "Self-Attention with Relative Position
Representations"), causal: a learned key embedding a^K_r for each clipped distance
r = min(i - j, max_distance), shared by all heads and layers, that the query attends to as if
it were part of the key,

    logit(i, j) = (q_i . k_j + q_i . a^K_{r(i,j)}) / sqrt(d_head),

and, with ``values: true``, a learned value embedding a^V_r added to what each key contributes,
z_i = sum_j w_ij (v_j + a^V_{r(i,j)}). The key term is a bias that reads the query (the
``q`` argument of the ``bias`` hook); the value term needs the attention weights
(``value_term``), so attention is then written out instead of SDPA's fused kernel.

Both terms depend on the query, the weights and the distance between absolute positions
only, so they are the same with a cache. q . a^K is computed once per distance bucket
(max_distance + 1 of them) and gathered, never as a (Tq, Tk, d_head) tensor.
"""

import math

import torch
from torch import nn

from minilm.positions.base import MAX_POSITIONS, PositionScheme, check_number, register


@register("shaw")
class Shaw(PositionScheme):
    """Shaw et al.'s learned relative key (and, with ``values``, value) embeddings per distance
    clipped at ``max_distance`` (the module docstring)."""

    description = "learned relative key (and value) embeddings per clipped distance (Shaw et al. 2018)"
    options = {"max_distance": 16, "values": False}
    has_bias = True

    def __init__(self, *, max_distance: int, values: bool, **kw):
        check_number("shaw", "max_distance", max_distance, low=1, low_open=False, integer=True, high=MAX_POSITIONS)
        super().__init__(**kw)
        self.max_distance = int(max_distance)
        self.keys = nn.Embedding(self.max_distance + 1, self.head_dim)
        nn.init.normal_(self.keys.weight, std=0.02)
        self.values = None
        if values:
            self.values = nn.Embedding(self.max_distance + 1, self.head_dim)
            nn.init.normal_(self.values.weight, std=0.02)
        self.has_value_term = self.values is not None

    def buckets(self, q_pos, k_pos) -> torch.Tensor:
        """(Tq, Tk) clipped distances r = min(i - j, max_distance), 0 for future keys (masked anyway)."""
        return (q_pos[:, None] - k_pos[None, :]).floor().clamp(min=0, max=self.max_distance).long()

    def bias(self, q_pos, k_pos, q=None):
        if q is None:  # nothing to attend with: a query of ones shows the embeddings' sums (for pictures)
            q = torch.ones(1, self.n_head, len(q_pos), self.head_dim, device=q_pos.device)
        per_bucket = q @ self.keys.weight.to(q.dtype).t() / math.sqrt(self.head_dim)  # (B, H, Tq, buckets)
        index = self.buckets(q_pos, k_pos).expand(*per_bucket.shape[:2], -1, -1)
        return per_bucket.gather(-1, index)  # (B, H, Tq, Tk)

    def value_term(self, weights, q_pos, k_pos):
        if self.values is None:
            return None
        index = self.buckets(q_pos, k_pos).expand_as(weights)
        per_bucket = torch.zeros(
            *weights.shape[:-1], self.max_distance + 1, dtype=weights.dtype, device=weights.device
        ).scatter_add_(-1, index, weights)
        return per_bucket @ self.values.weight.to(weights.dtype)

    def extra_repr(self):
        return f"kind=shaw, max_distance={self.max_distance}, values={self.values is not None}"
