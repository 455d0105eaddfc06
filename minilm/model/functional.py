"""What the model's small modules compute, as plain functions of tensors: the modules of
``minilm.model.gpt`` call them, and so does the eager decode step (``minilm.generation.lean``),
so that the two compute the same thing in the same order, bit for bit."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minilm.config import GATED_MLPS
from minilm.model.lora import LoRALinear


def linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` without ``nn.Module.__call__``, whose checks for hooks cost about 3 us a call
    (docs/benchmarks.md, "Training step and decoding"). Nothing hooks these layers: hooks (FSDP's,
    the attention figure's, the
    memory count's) go on blocks and on attention. A layer with low-rank adapters
    (``minilm.model.lora``) adds theirs."""
    out = F.linear(x, layer.weight, layer.bias)
    return layer.adapt(x, out) if type(layer) is LoRALinear else out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization"), as Llama has it:
    weight * (x / sqrt(mean(x^2) + eps)), the mean over the last dimension computed in float32
    and the result cast back to x's dtype before the weight; no bias, no mean subtracted."""
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def activation(kind: str, h: torch.Tensor) -> torch.Tensor:
    """The MLP's nonlinearity of its first layer's output ``h``, by ``model.mlp``: GELU (``gelu``),
    its tanh approximation (``gelu_tanh``, GPT-2's gelu_new), relu(h)^2 (``relu2``; So et al. 2021,
    "Primer") or silu(gate) * up of h = [gate; up] (``swiglu``; Shazeer 2020, "GLU Variants Improve
    Transformer"), or gelu_tanh(gate) * up (``geglu_tanh``, the same paper's GEGLU as Gemma has it)."""
    if kind in GATED_MLPS:
        gate, up = h.chunk(2, dim=-1)
        return (F.silu(gate) if kind == "swiglu" else F.gelu(gate, approximate="tanh")) * up
    if kind == "relu2":
        return F.relu(h).square()
    return F.gelu(h, approximate="tanh" if kind == "gelu_tanh" else "none")
