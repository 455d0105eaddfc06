"""The optimisers: Muon's orthogonalisation and update against hand computations, which
parameters go where, the schedule's shape, and a bad optimizer name."""

import math

import pytest
import torch

from minilm import GPT, ModelConfig
from minilm.config import ConfigError, TrainConfig
from minilm.training import optim
from minilm.training.optim import Muon, gram_iteration, make_optimizer, orthogonalize


@pytest.mark.parametrize("shape", [(16, 48), (48, 16), (3, 24, 24)])
def test_orthogonalize_keeps_the_singular_vectors_and_brings_singular_values_near_one(shape):
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    out = orthogonalize(g)
    u, s, vh = torch.linalg.svd(g, full_matrices=False)
    inner = u.mT @ out @ vh.mT  # diagonal when out = U S' V^T
    diagonal = torch.diagonal(inner, dim1=-2, dim2=-1)
    off = inner - torch.diag_embed(diagonal)
    assert off.abs().max() < 1e-6
    # the quintic iteration (5 steps) leaves every singular value in roughly (0.5, 1.5), not at 1
    assert diagonal.min() > 0.5 and diagonal.max() < 1.5


@pytest.mark.parametrize("shape", [(2, 12, 48), (3, 40, 16), (24, 60)])
def test_the_gram_form_is_the_same_iteration(shape, monkeypatch):
    """Float32 matrices at least twice as wide as tall are orthogonalised on their Gram matrix
    (gram_iteration); in float64, where the plain iteration runs, both forms agree to rounding
    for any number of steps, and the float32 result stays within 2e-5 of the float64 one, for
    gradient-like matrices (low rank plus noise) too."""
    gen = torch.Generator().manual_seed(1)
    noise = torch.randn(*shape, generator=gen, dtype=torch.float64)
    low_rank = torch.randn(*shape[:-1], 3, generator=gen, dtype=torch.float64) @ torch.randn(
        *shape[:-2], 3, shape[-1], generator=gen, dtype=torch.float64
    )
    calls = []
    monkeypatch.setattr(optim, "gram_iteration", lambda x, steps: calls.append(x.dtype) or gram_iteration(x, steps))
    for g in (noise, low_rank + 0.01 * noise):
        wide = g.mT if g.shape[-2] > g.shape[-1] else g
        x = (wide / (wide.norm(dim=(-2, -1), keepdim=True) + 1e-7)).reshape(-1, *wide.shape[-2:])  # as orthogonalize
        for steps in range(7):
            plain = orthogonalize(g, steps)  # float64: the plain iteration
            assert (
                gram_iteration(x, steps).reshape(wide.shape) - (plain.mT if wide is not g else plain)
            ).abs().max() < 1e-12
        assert calls == []
        assert (orthogonalize(g.float()).double() - orthogonalize(g)).abs().max() < 2e-5
        assert calls.pop() == torch.float32


def test_muon_first_step_by_hand():
    torch.manual_seed(0)
    weight = torch.randn(6, 10)
    grad = torch.randn(6, 10)
    param = torch.nn.Parameter(weight.clone())
    param.grad = grad.clone()
    lr, wd, mu = 0.01, 0.1, 0.95
    Muon([param], lr=lr, weight_decay=wd, momentum=mu).step()
    # buffer = g, Nesterov update = g + mu g; scale 0.2 sqrt(max(6, 10))
    expected = weight * (1 - lr * wd) - lr * 0.2 * math.sqrt(10) * orthogonalize(grad + mu * grad)
    assert torch.allclose(param.detach(), expected, atol=1e-6)


def test_muon_batches_tall_and_wide_matrices_each_by_its_own_orthogonalisation():
    torch.manual_seed(1)
    wide, tall = torch.nn.Parameter(torch.randn(6, 10)), torch.nn.Parameter(torch.randn(10, 6))
    grads = [torch.randn(6, 10), torch.randn(10, 6)]
    before = [wide.detach().clone(), tall.detach().clone()]
    for param, grad in zip((wide, tall), grads):
        param.grad = grad.clone()
    Muon([wide, tall], lr=0.01, momentum=0.0, nesterov=False).step()
    for param, start, grad in zip((wide, tall), before, grads):
        assert torch.allclose(param.detach(), start - 0.01 * 0.2 * math.sqrt(10) * orthogonalize(grad), atol=1e-6)


def test_muon_orthogonalises_a_fused_qkv_projection_as_three_matrices():
    """train.muon_split_qkv: the q, k and v rows of a (GQA) attention's fused projection move by
    their own orthogonalised updates, each scaled by 0.2 sqrt(its longer side)."""
    model = GPT(ModelConfig(vocab_size=50, n_layer=1, n_head=4, n_kv_head=2, d_model=16, block_size=8))
    qkv = model.blocks[0].attn.qkv.weight  # q 16 rows, k 8, v 8
    grad = torch.randn(qkv.shape, generator=torch.Generator().manual_seed(2))
    moved = []
    for split in (True, False):
        start = qkv.detach().clone()
        muon = make_optimizer(
            model, TrainConfig(optimizer="muon", muon_split_qkv=split, weight_decay=0.0), torch.device("cpu")
        ).parts[0]
        muon.param_groups[0]["lr"] = 0.01
        qkv.grad = grad.clone()
        muon.step()
        moved.append(qkv.detach() - start)
    g = grad * 1.95  # the first Nesterov update: g + 0.95 g
    expected = torch.cat(
        [-0.01 * 0.2 * math.sqrt(max(rows.shape)) * orthogonalize(rows) for rows in (g[:16], g[16:24], g[24:])]
    )
    torch.testing.assert_close(moved[0], expected, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(moved[1], -0.01 * 0.2 * math.sqrt(32) * orthogonalize(g), atol=1e-6, rtol=1e-4)


def test_muon_lr_scale_multiplies_the_schedules_rate_for_muon_only():
    model = GPT(ModelConfig(vocab_size=300, n_layer=1, n_head=2, d_model=16, block_size=8))
    opt = make_optimizer(model, TrainConfig(optimizer="muon", muon_lr_scale=3.0), torch.device("cpu"))
    opt.set_lr(0.002)
    muon, adamw = opt.parts
    assert {g["lr"] for g in muon.param_groups} == {0.006} and {g["lr"] for g in adamw.param_groups} == {0.002}
    with pytest.raises(ConfigError, match="train.muon_lr_scale=0 is invalid: expected a number > 0"):
        TrainConfig(muon_lr_scale=0)


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    model = GPT(
        ModelConfig(
            vocab_size=300, n_layer=2, n_head=2, d_model=16, block_size=8, bias=True, position={"kind": "learned"}
        )
    )
    opt = make_optimizer(model, TrainConfig(optimizer="muon"), torch.device("cpu"))
    muon, adamw = opt.parts
    assert isinstance(muon, Muon) and isinstance(adamw, torch.optim.AdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    assert in_muon == {
        f"blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
    }
    in_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert {"wte.weight", "positions.table.weight", "ln_f.weight", "blocks.0.attn.qkv.bias"} <= in_adamw
    assert not in_muon & in_adamw


def test_a_bad_optimizer_name_is_one_line():
    with pytest.raises(ConfigError, match="train.optimizer='sgd' is invalid: valid: adamw, muon"):
        TrainConfig(optimizer="sgd")


def test_position_lr_scale_gives_the_position_parameters_their_own_rate_without_decay():
    model = GPT(ModelConfig(vocab_size=300, n_layer=1, n_head=2, d_model=16, block_size=8, position={"kind": "t5"}))
    names = {id(p): n for n, p in model.named_parameters()}
    plain = make_optimizer(model, TrainConfig(weight_decay=0.1), torch.device("cpu"))
    assert len(plain.param_groups) == 2  # as before the option: an old optimiser state still loads
    scaled = make_optimizer(model, TrainConfig(weight_decay=0.1, position_lr_scale=25.0), torch.device("cpu"))
    scaled.set_lr(0.002)
    *_, positions = scaled.param_groups
    assert {names[id(p)] for p in positions["params"]} == {"positions.relative_bias.weight"}
    assert positions["lr"] == pytest.approx(0.05) and positions["weight_decay"] == 0.0
    assert {g["lr"] for g in scaled.param_groups[:2]} == {0.002}
    # one AdamW step moves each bias by about the group's rate (Adam's first step is lr * sign(g))
    table = model.positions.relative_bias.weight
    before = table.detach().clone()
    model(torch.randint(0, 300, (2, 8))).sum().backward()
    scaled.step()
    moved = (table.detach() - before)[table.grad != 0].abs()
    assert moved.numel() and torch.allclose(moved, torch.full_like(moved, 0.05), rtol=1e-3)
    with pytest.raises(ConfigError, match="train.position_lr_scale=0 is invalid: expected a number > 0"):
        TrainConfig(position_lr_scale=0)


def test_embedding_init_std_sets_the_token_embedding_only():
    torch.manual_seed(0)
    model = GPT(
        ModelConfig(
            vocab_size=4000,
            n_layer=1,
            n_head=2,
            d_model=64,
            block_size=8,
            tie_embeddings=False,
            embedding_init_std=64**-0.5,
        )
    )
    assert model.wte.weight.std().item() == pytest.approx(0.125, rel=0.02)
    assert model.lm_head.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert GPT(
        ModelConfig(vocab_size=4000, n_layer=1, n_head=2, d_model=64, block_size=8)
    ).wte.weight.std().item() == pytest.approx(0.02, rel=0.02)
    tied = GPT(ModelConfig(vocab_size=4000, n_layer=1, n_head=2, d_model=64, block_size=8, embedding_init_std=0.125))
    assert tied.lm_head.weight is tied.wte.weight and tied.wte.weight.std().item() == pytest.approx(0.125, rel=0.02)
    with pytest.raises(ConfigError, match="model.embedding_init_std=-1 is invalid: expected a number > 0"):
        ModelConfig(embedding_init_std=-1)
