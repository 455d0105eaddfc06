"""The fused LM-head cross-entropy against the unfused one: value and both gradients."""

import pytest
import torch
import torch.nn.functional as F

from minilm.training import losses
from minilm.training.losses import lm_loss


def unfused(hidden, weight, targets, softcap=0.0):
    logits = hidden @ weight.t()
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)  # Gemma 2's final logit soft-capping, written out
    return F.cross_entropy(logits.reshape(-1, weight.shape[0]), targets.reshape(-1))  # float32 under autocast


@pytest.mark.parametrize("softcap", [0.0, 2.5])  # 2.5: well inside tanh's bend for logits of N(0, 24)
@pytest.mark.parametrize("rows", [7, 2 * losses.CHUNK_ROWS + 5])  # one chunk, and three with a short last one
def test_value_and_gradients_equal_the_unfused_loss(rows, softcap):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, rows, 24, generator=g, dtype=torch.float64)
    weight = torch.randn(50, 24, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 50, (1, rows), generator=g)
    results = []
    for fn in (unfused, lm_loss):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = fn(h, w, targets, softcap)
        (3.0 * loss).backward()  # a non-unit upstream gradient
        results.append((loss.detach(), h.grad, w.grad))
    for ours, reference in zip(results[1], results[0]):
        assert torch.allclose(ours, reference, rtol=1e-10, atol=1e-12)


def test_under_bfloat16_autocast_it_matches_the_unfused_loss_closely():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 16, 32, generator=g).requires_grad_()
    weight = torch.randn(64, 32, generator=g).requires_grad_()
    targets = torch.randint(0, 64, (2, 16), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = lm_loss(hidden, weight, targets)
        reference = unfused(hidden, weight, targets)
    assert fused.dtype == torch.float32
    assert torch.allclose(fused, reference, rtol=1e-3, atol=1e-3)
    fused.backward()
    assert hidden.grad.dtype == hidden.dtype and weight.grad.dtype == weight.dtype


def test_a_frozen_head_takes_no_gradient_and_the_hidden_states_the_same_one():
    """A LoRA run freezes the head: the fused loss then forms no dL/dW (nor its accumulator), and
    dL/dh is what it is with the head trained."""
    torch.manual_seed(0)
    hidden = torch.randn(2, 9, 16, requires_grad=True)
    weight, targets = torch.randn(50, 16), torch.randint(0, 50, (2, 9))
    lm_loss(hidden, weight, targets).backward()
    frozen = hidden.grad.clone()
    hidden.grad = None
    trained = weight.clone().requires_grad_(True)
    lm_loss(hidden, trained, targets).backward()
    assert weight.grad is None and trained.grad is not None and torch.allclose(hidden.grad, frozen)
