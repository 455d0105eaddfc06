"""FIRE (Li et al. 2023, "Functional Interpolation for Relative Positions Improves Long Context
Transformers"): the bias of every head is a small learned function of the normalised distance,

    bias(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),    psi(x) = log(c x + 1),

with i the query's absolute position and j the key's. f_theta is an MLP 1 -> 32 -> heads
(ReLU), shared by all layers like T5's bias; c > 0 and the threshold L > 0 are learned,
initialised at 1 and at the training length. The paper gives no parameterisation for L; held
as a number of positions (up to 512), an Adam step moves it by about the learning rate, so in
the study it moved less than one position in 500 steps. It is learned as log L instead
(``log_threshold``): an Adam step is then a relative change, the same at any L (checkpoints
that hold ``threshold`` load as its log: ``minilm.checkpoints.format.upgraded_weights``). c is kept positive by its
absolute value. The
normalisation by psi(max(L, i)) maps every distance into [0, 1], which is what lets the
function interpolate rather than extrapolate at long lengths ("progressive interpolation").
The bias depends on absolute positions only, so it is the same with a cache. The MLP's
hidden layer is evaluated in slices of query rows so that memory stays linear in length.
"""

import math

import torch
from torch import nn

from minilm.positions.base import PositionScheme, check_number, register

HIDDEN_BUDGET = 1 << 22  # hidden activations (query rows x keys x width) computed at once


@register("fire")
class Fire(PositionScheme):
    """FIRE's learned per-head bias: an MLP of the log-normalised distance (the module docstring)."""

    description = "learned MLP of the log-normalised distance per head on attention logits (Li et al. 2023)"
    options = {"hidden": 32}
    has_bias = True

    def __init__(self, *, hidden: int, **kw):
        check_number("fire", "hidden", hidden, low=1, low_open=False, integer=True, high=4096)
        super().__init__(**kw)
        self.hidden = int(hidden)
        self.mlp = nn.Sequential(nn.Linear(1, self.hidden), nn.ReLU(), nn.Linear(self.hidden, self.n_head))
        self.c = nn.Parameter(torch.tensor(1.0))
        self.log_threshold = nn.Parameter(torch.tensor(math.log(self.block_size)))

    def normalised_distance(self, q_pos, k_pos):
        """psi(i - j) / psi(max(L, i)) for every query (rows) and key (columns), in [0, 1] for j <= i."""
        c, threshold = self.c.abs(), self.log_threshold.exp()
        distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0)  # future keys are masked anyway
        reach = torch.maximum(q_pos, threshold)[:, None]
        return torch.log1p(c * distance) / torch.log1p(c * reach)

    def bias(self, q_pos, k_pos, q=None):
        rows = max(1, HIDDEN_BUDGET // max(1, len(k_pos) * self.hidden))
        dtype = self.mlp[0].weight.dtype  # a model cast to bf16 (generation) takes bf16 inputs, as autocast gives it
        parts = [
            self.mlp(self.normalised_distance(q_pos[s : s + rows], k_pos)[..., None].to(dtype))
            for s in range(0, len(q_pos), rows)
        ]
        return torch.cat(parts, dim=0).permute(2, 0, 1)  # (heads, Tq, Tk)

    def extra_repr(self):
        return f"kind=fire, hidden={self.hidden}"
