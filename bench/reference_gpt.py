"""A nanoGPT-style reference model and training step, written out plainly for the benchmark.

The same shape as ours (pre-norm blocks, LayerNorm, GELU MLP of 4 * d_model, tied LM head,
no biases) with learned absolute positions and a standard attention block: one q/k/v
projection, ``scaled_dot_product_attention(is_causal=True)``, an output projection. Its
step is nanoGPT's: the loss over every position, backward, gradient clipping at 1.0, then
AdamW with betas (0.9, 0.95) and weight decay on 2-D weights, fused only on CUDA (as
nanoGPT's ``configure_optimizers`` does). Nothing from minilm is used, so the ratio compares
minilm's model and step with what a plain implementation of the same thing achieves.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d_model, bias=False)
        self.c_attn = nn.Linear(d_model, 3 * d_model, bias=False)
        self.c_proj = nn.Linear(d_model, d_model, bias=False)
        self.ln_2 = nn.LayerNorm(d_model, bias=False)
        self.c_fc = nn.Linear(d_model, 4 * d_model, bias=False)
        self.mlp_proj = nn.Linear(4 * d_model, d_model, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class ReferenceGPT(nn.Module):
    def __init__(self, vocab_size: int, n_layer: int, n_head: int, d_model: int, block_size: int):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(block_size, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model, bias=False)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def reference_optimizer(
    model: nn.Module, device: torch.device, lr: float = 1e-3, weight_decay: float = 0.1
) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def reference_step(model, optimizer, x, y, ctx) -> None:
    with ctx:
        loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
