"""The training loss: the LM head's matmul and the cross-entropy over the vocabulary, fused.

For hidden states h (N x C), head weights W (V x C) and targets y, the mean token loss is

    loss = 1/N sum_i [ logsumexp_v (h_i . W_v) - h_i . W_{y_i} ]

and its gradients are dL/dh = (P - Y) W / N and dL/dW = (P - Y)^T h / N, with P the softmax
of the logits and Y the one-hot targets. Computed a chunk of rows at a time in the forward
pass, this never holds the N x V logits (or their log-softmax and its gradient) at once,
and the softmax is turned into P - Y in place: about a quarter less time than
``cross_entropy(h @ W^T)`` and its backward for the main job's 2,048 x 4,096 logits
(measured on the CPU; the same matmuls, less memory traffic). Under autocast the matmuls run
in the autocast dtype and the softmax in float32, as they would unfused.

With a logit soft-cap c (``model.logit_softcap``; Gemma 2) the logits are z = c tanh(s / c) of
s = h . W, and the chain rule through tanh multiplies P - Y by dz/ds = 1 - tanh(s / c)^2 before
the two matmuls of the gradients. A head that takes no gradient (frozen: a LoRA run) skips
dL/dW and its V x C accumulator.
"""

from __future__ import annotations

import contextlib

import torch

CHUNK_ROWS = 512  # rows of logits held at once: 512 x vocab floats


class LinearCrossEntropy(torch.autograd.Function):
    """The LM head and the cross-entropy in one autograd function: mean loss of ``hidden`` @
    ``weight``.T against ``targets`` (logits soft-capped at ``softcap`` when > 0), the logits formed
    a chunk of rows at a time and never kept for the backward pass."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, softcap):
        device = hidden.device.type
        autocasting = device != "meta" and torch.is_autocast_enabled(device)  # meta: the memory command's dry run
        dtype = torch.get_autocast_dtype(device) if autocasting else hidden.dtype
        with torch.autocast(device, enabled=False) if autocasting else contextlib.nullcontext():
            h, w = hidden.to(dtype), weight.to(dtype)
            n, wide = h.shape[0], torch.promote_types(dtype, torch.float32)  # the softmax's dtype
            grad_h = torch.empty_like(hidden)
            need_w = ctx.needs_input_grad[1]  # a frozen head (a LoRA run) takes no gradient: none is formed
            grad_w = torch.zeros(weight.shape, dtype=wide, device=weight.device) if need_w else None
            total = torch.zeros((), dtype=wide, device=hidden.device)
            # meta (the memory dry run): every chunk holds the same at its peak, so one stands for all
            for start in range(0, CHUNK_ROWS if device == "meta" else n, CHUNK_ROWS):
                rows, y = h[start : start + CHUNK_ROWS], targets[start : start + CHUNK_ROWS]
                logits = (rows @ w.t()).to(wide)
                if softcap:
                    slope = logits.div_(softcap).tanh_()  # tanh(s / c), then z = c tanh(s / c)
                    logits = slope * softcap
                    slope = slope.square_().neg_().add_(1.0)  # dz/ds
                target_logit = logits.gather(1, y[:, None]).squeeze(1)
                peak = logits.amax(dim=-1, keepdim=True)
                p = logits.sub_(peak).exp_()  # one exponential per logit, in place
                mass = p.sum(dim=-1, keepdim=True)
                total += (peak + mass.log()).squeeze(1).sub_(target_logit).sum()  # logsumexp - target logit
                p.div_(mass)  # softmax
                p[torch.arange(len(y), device=p.device), y] -= 1.0  # P - Y
                if softcap:
                    p.mul_(slope)
                p = p.to(dtype)
                grad_h[start : start + CHUNK_ROWS] = p @ w
                if need_w and dtype == wide:
                    grad_w.addmm_(p.t(), rows)
                elif need_w:
                    grad_w += (p.t() @ rows).to(wide)
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype) if need_w else None)
        ctx.n = n
        return total / n

    @staticmethod
    def backward(ctx, grad_loss):
        grad_h, grad_w = ctx.saved_tensors
        scale = grad_loss / ctx.n
        return grad_h * scale, None if grad_w is None else grad_w * scale, None, None


def lm_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, softcap: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy of ``hidden`` (B, T, C) through the LM head ``weight`` (V, C), its
    logits soft-capped at ``softcap`` (0: none), against ``targets`` (B, T), without
    materialising the (B, T, V) logits."""
    return LinearCrossEntropy.apply(hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1), softcap)
