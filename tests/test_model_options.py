"""Architecture options of ModelConfig (RMSNorm, SwiGLU / tanh GELU, grouped-query attention,
q/k/v-only bias, parallel residual, untied LM head): each against a forward pass written out
here from the weights, GQA against MHA with duplicated k/v heads, cached == uncached, the
default model unchanged, training, old checkpoints and one-line errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from minilm import GPT, ModelConfig
from minilm.checkpoints import format as checkpoint
from minilm.checkpoints.format import CheckpointError
from minilm.checkpoints.loading import load_model
from minilm.config import ConfigError, build_config
from minilm.evaluation.scoring import token_losses
from minilm.figures.attention import attention_weights
from minilm.generation import decode as generation
from minilm.positions import available
from minilm.training.loop import train
from minilm.training.mixture import mixed_loss
from minilm.training.source import source_model

LLAMA = dict(norm="rmsnorm", mlp="swiglu", tie_embeddings=False, n_kv_head=2)
NEOX = dict(parallel_residual=True, norm="layernorm", mlp="gelu", bias=True)
OPTIONS = {
    "default": {},
    "llama": LLAMA,
    "mqa-rms-eps": dict(norm="rmsnorm", norm_eps=0.5, n_kv_head=1),
    "neox": NEOX,
    "neox-eps-untied": dict(NEOX, norm_eps=0.5, tie_embeddings=False),
    "gpt2": dict(mlp="gelu_tanh", bias=True),
    "qwen2": dict(LLAMA, qkv_bias=True),
    "parallel-swiglu-gqa": dict(parallel_residual=True, mlp="swiglu", n_kv_head=2, qkv_bias=True),
    "speedrun": dict(mlp="relu2", qk_norm=True, logit_softcap=3.0, tie_embeddings=False, value_embeddings=True),
    "value-embeddings-gqa-odd": dict(value_embeddings=True, n_kv_head=2, n_layer=3),
    "qknorm-gqa-rms": dict(qk_norm=True, n_kv_head=1, norm="rmsnorm", norm_eps=0.5),
    "gemma": dict(
        sublayer_norms="sandwich", mlp="geglu_tanh", norm="rmsnorm", qk_norm=True, n_kv_head=2, logit_softcap=5.0
    ),
    "sandwich-parallel-layernorm": dict(sublayer_norms="sandwich", parallel_residual=True, bias=True),
    "post-norms-qknorm-gqa": dict(sublayer_norms="post", norm="rmsnorm", mlp="swiglu", qk_norm=True, n_kv_head=2),
    "olmo": dict(
        sublayer_norms="post", norm="rmsnorm", mlp="swiglu", qk_norm=True, qk_norm_span="projection", n_kv_head=2
    ),
}
NORMS = ("ln_1", "ln_2", "ln_f", "q_norm", "k_norm", "post_attn_norm", "post_mlp_norm")


def make(position="rope", *, n_head=4, d_model=32, n_layer=2, vocab_size=61, block_size=64, seed=0, **options):
    """A tiny model with every parameter random (norm weights around 1, biases nonzero), so that
    no weight or bias of an option can go unused unnoticed."""
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=vocab_size,
        n_layer=n_layer,
        n_head=n_head,
        d_model=d_model,
        block_size=block_size,
        position={"kind": position},
        **options,
    )
    model = GPT(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(0, 0.3)
            if name.split(".")[-2] in NORMS and name.endswith("weight"):
                param.add_(1.0)
    return model


def tokens(batch=2, length=20, vocab_size=61, seed=1):
    return torch.randint(0, vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- written-out reference


def norm_ref(x, sd, prefix, c):
    """LayerNorm (x - mean) / sqrt(var + eps) * w + b, or RMSNorm x / sqrt(mean(x^2) + eps) * w."""
    w = sd[prefix + ".weight"]
    if c.norm == "rmsnorm":
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.norm_eps) * w
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + c.norm_eps) * w + sd.get(prefix + ".bias", 0.0)


def linear_ref(x, sd, prefix):
    return x @ sd[prefix + ".weight"].T + sd.get(prefix + ".bias", 0.0)


def mlp_ref(h, sd, prefix, c):
    a = linear_ref(h, sd, prefix + ".fc")
    if c.mlp == "swiglu":  # Shazeer 2020: silu(gate) * up, gate the first d_ff outputs of fc
        gate, up = a[..., : c.d_ff], a[..., c.d_ff :]
        a = gate * torch.sigmoid(gate) * up
    elif c.mlp == "geglu_tanh":  # the same paper's GEGLU with GELU's tanh approximation (Gemma)
        gate, up = a[..., : c.d_ff], a[..., c.d_ff :]
        a = 0.5 * gate * (1 + torch.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3))) * up
    elif c.mlp == "relu2":  # So et al. 2021 (Primer): squared ReLU
        a = torch.where(a > 0, a * a, torch.zeros_like(a))
    elif c.mlp == "gelu_tanh":
        a = 0.5 * a * (1 + torch.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)))
    else:
        a = 0.5 * a * (1 + torch.erf(a / math.sqrt(2)))
    return linear_ref(a, sd, prefix + ".proj")


def attention_ref(h, sd, prefix, c, added_values=0.0):
    """Causal attention without positions, head by head; query head i reads k/v head i // g.
    ``added_values``: the value embedding of the tokens, added to v."""
    H, D, T = c.n_head, c.head_dim, h.shape[1]
    kv = c.n_kv_head or H
    qkv = linear_ref(h, sd, prefix + ".qkv")
    q, k, v = qkv[..., : H * D], qkv[..., H * D : (H + kv) * D], qkv[..., (H + kv) * D :] + added_values
    assert v.shape[-1] == kv * D
    if c.qk_norm:  # every head's q and k RMS-normalised over its D dims, one weight vector for all heads

        def rms(x, name):
            return x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.norm_eps) * sd[f"{prefix}.{name}.weight"]

        if c.qk_norm_span == "projection":  # OLMo 2/3: all heads' q at once, all heads' k at once
            q, k = rms(q, "q_norm"), rms(k, "k_norm")
        else:
            q = torch.cat([rms(q[..., i * D : (i + 1) * D], "q_norm") for i in range(H)], dim=-1)
            k = torch.cat([rms(k[..., j * D : (j + 1) * D], "k_norm") for j in range(kv)], dim=-1)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    heads = []
    for i in range(H):
        j = i // (H // kv)
        qi, kj, vj = q[..., i * D : (i + 1) * D], k[..., j * D : (j + 1) * D], v[..., j * D : (j + 1) * D]
        scores = (qi @ kj.transpose(-1, -2) / math.sqrt(D)).masked_fill(future, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ vj)
    return linear_ref(torch.cat(heads, dim=-1), sd, prefix + ".proj")


def reference_logits(model, idx):
    """The whole forward pass in float64 from the state dict (position kind 'none')."""
    c = model.config
    sd = {k: v.double() for k, v in model.state_dict().items()}
    x = sd["wte.weight"][idx]
    for layer in range(c.n_layer):
        p = f"blocks.{layer}."
        # value embeddings: table j serves layers j and n_layer - 1 - j (0 and 2 of 3 layers share table 0)
        table = next(j for j in range(c.n_layer) if layer in (j, c.n_layer - 1 - j)) if c.value_embeddings else None
        added = 0.0 if table is None else sd[f"value_embeds.{table}.weight"][idx]
        pre = (lambda h, name: h) if c.sublayer_norms == "post" else (lambda h, name: norm_ref(h, sd, p + name, c))
        attended = attention_ref(pre(x, "ln_1"), sd, p + "attn", c, added)
        if c.sublayer_norms != "pre":  # Gemma 2, OLMo 2: each sublayer's output normalised before it is added
            attended = norm_ref(attended, sd, p + "post_attn_norm", c)

        def fed(h):
            out = mlp_ref(pre(h, "ln_2"), sd, p + "mlp", c)
            return out if c.sublayer_norms == "pre" else norm_ref(out, sd, p + "post_mlp_norm", c)

        if c.parallel_residual:  # GPT-NeoX: both branches read the block input
            x = x + attended + fed(x)
        else:
            x = x + attended
            x = x + fed(x)
    logits = norm_ref(x, sd, "ln_f", c) @ sd["lm_head.weight"].T
    return c.logit_softcap * torch.tanh(logits / c.logit_softcap) if c.logit_softcap else logits


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_options_match_the_written_out_forward_pass(options):
    model = make("none", **options)
    idx = tokens()
    with torch.no_grad():
        got = model(idx).double()
    torch.testing.assert_close(got, reference_logits(model, idx), rtol=1e-4, atol=1e-4)


def test_rmsnorm_is_computed_in_float32_and_cast_back():
    model = make("none", norm="rmsnorm", norm_eps=1e-3)
    norm = model.blocks[0].ln_1
    x = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(0)).mul(4).to(torch.bfloat16)
    h = x.float()
    expected = norm.weight.detach() * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-3)).to(torch.bfloat16)
    with torch.no_grad():
        got = norm(x)
    assert torch.equal(got, expected)
    assert "blocks.0.ln_1.bias" not in model.state_dict()  # RMSNorm has no bias


def test_untied_head_is_its_own_parameter_and_counted():
    tied, untied = make(), make(tie_embeddings=False)
    assert tied.lm_head.weight is tied.wte.weight
    assert untied.lm_head.weight is not untied.wte.weight
    assert untied.num_params() == tied.num_params() + 61 * 32
    assert sorted(tied.state_dict()) == sorted(untied.state_dict())


def test_parameter_names_and_layouts():
    sd = make(n_kv_head=1, mlp="swiglu", qkv_bias=True, n_layer=1).state_dict()
    assert sd["blocks.0.attn.qkv.weight"].shape == ((4 + 2 * 1) * 8, 32)  # [q: 4 heads; k: 1; v: 1] x head_dim 8
    assert sd["blocks.0.attn.qkv.bias"].shape == (48,)
    assert sd["blocks.0.mlp.fc.weight"].shape == (2 * 128, 32)  # [gate; up]
    assert sd["blocks.0.mlp.proj.weight"].shape == (32, 128)
    assert not any(k.endswith("bias") and "qkv" not in k for k in sd)  # qkv_bias puts a bias there only


# --------------------------------------------------------------------------- grouped-query attention


def as_multi_head(gqa):
    """An MHA model with the GQA model's weights, each k/v head duplicated for its query group."""
    c = gqa.config
    mha = GPT(ModelConfig(**{**c.__dict__, "n_kv_head": None})).eval()
    H, kv, D = c.n_head, c.n_kv_head, c.head_dim
    weights = dict(gqa.state_dict())
    for name, value in gqa.state_dict().items():
        if ".attn.qkv." in name:
            q, k, v = value.split((H * D, kv * D, kv * D))
            dup = [
                t.reshape(kv, D, *t.shape[1:]).repeat_interleave(H // kv, dim=0).reshape(H * D, *t.shape[1:])
                for t in (k, v)
            ]
            weights[name] = torch.cat([q, *dup])
    mha.load_state_dict(weights)
    return mha


@pytest.mark.parametrize("kind", [k for k in available() if k != "interpolated"])
@pytest.mark.parametrize("n_kv_head", [1, 2])
def test_gqa_equals_mha_with_duplicated_kv_heads(kind, n_kv_head):
    gqa = make(kind, n_kv_head=n_kv_head, qkv_bias=True)
    mha = as_multi_head(gqa)
    idx = tokens()
    with torch.no_grad():
        torch.testing.assert_close(gqa(idx), mha(idx), rtol=1e-5, atol=1e-5)
        placement = "absolute" if gqa.positions.embeds else "cache"  # embedded positions cannot be renumbered
        torch.testing.assert_close(
            gqa(idx, window=7, sinks=2, sink_positions=placement),
            mha(idx, window=7, sinks=2, sink_positions=placement),
            rtol=1e-5,
            atol=1e-5,
        )


# --------------------------------------------------------------------------- KV cache

CACHED = {
    name: OPTIONS[name]
    for name in (
        "default",
        "llama",
        "mqa-rms-eps",
        "neox",
        "qwen2",
        "parallel-swiglu-gqa",
        "speedrun",
        "qknorm-gqa-rms",
        "value-embeddings-gqa-odd",
        "gemma",
        "post-norms-qknorm-gqa",
        "olmo",
    )
}


@pytest.mark.parametrize("position", ["rope", "alibi", "xpos", "shaw"])
@pytest.mark.parametrize("options", CACHED.values(), ids=CACHED.keys())
def test_cached_equals_uncached(position, options):
    model = make(position, **options)
    idx = tokens(length=16)
    cache = model.new_cache(2, 16)
    kv = options.get("n_kv_head") or 4
    assert all(t.shape == (2, kv, 16, 8) for t in cache.keys + cache.values)
    with torch.no_grad():
        full = model(idx)
        steps = [model(idx[:, :10], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(10, 16)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sink_positions", ["cache", "absolute"])
@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_rolling_cache_with_gqa_equals_the_sliding_window(position, sink_positions):
    model = make(position, **LLAMA)
    idx = tokens(length=24)
    cache = model.new_cache(2, 8, rolling=True, sinks=2, sink_positions=sink_positions)
    with torch.no_grad():
        full = model(idx, window=8, sinks=2, sink_positions=sink_positions)
        steps = [model(idx[:, :6], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(6, 24)]
    assert cache.keys[0].shape[1] == 2
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def test_cache_memory_estimate_counts_the_kv_heads(monkeypatch):
    model = make(n_kv_head=1)  # 2 layers x (k, v) x 1 head x head_dim 8 x 4 bytes = 128 bytes per token
    monkeypatch.setattr(generation, "available_memory", lambda device: 128 * 100)
    generation.check_cache_memory(model, 1, 100)
    with pytest.raises(generation.GenerationError, match="KV cache of 101 tokens"):
        generation.check_cache_memory(model, 1, 101)


def test_attention_maps_recompute_gqa_attention():
    model = make("rope", n_kv_head=2, n_layer=1)
    ids = tokens(batch=1)[0]
    capture = attention_weights(model, ids)
    attn, T = model.blocks[-1].attn, len(ids)
    with torch.no_grad():
        v = attn.qkv(capture.x)[0, :, 48:].reshape(T, 2, 8).transpose(0, 1)  # [q: 32; k: 16; v: 16]
        heads = capture.weights @ v.repeat_interleave(2, dim=0)  # query heads 0, 1 read v head 0; 2, 3 head 1
        y = attn.proj(heads.transpose(0, 1).reshape(1, T, -1))
    torch.testing.assert_close(y, capture.output, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- the default is unchanged


def test_default_config_has_the_original_parameters():
    model = GPT(ModelConfig(vocab_size=61, n_layer=1, n_head=4, d_model=32, block_size=16, bias=True))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes == {
        "wte.weight": (61, 32),
        "lm_head.weight": (61, 32),
        "ln_f.weight": (32,),
        "ln_f.bias": (32,),
        "blocks.0.ln_1.weight": (32,),
        "blocks.0.ln_1.bias": (32,),
        "blocks.0.attn.qkv.weight": (96, 32),
        "blocks.0.attn.qkv.bias": (96,),
        "blocks.0.attn.proj.weight": (32, 32),
        "blocks.0.attn.proj.bias": (32,),
        "blocks.0.ln_2.weight": (32,),
        "blocks.0.ln_2.bias": (32,),
        "blocks.0.mlp.fc.weight": (128, 32),
        "blocks.0.mlp.fc.bias": (128,),
        "blocks.0.mlp.proj.weight": (32, 128),
        "blocks.0.mlp.proj.bias": (32,),
    }
    assert model.lm_head.weight is model.wte.weight
    assert all(
        getattr(model.config, k) == v
        for k, v in dict(
            parallel_residual=False,
            tie_embeddings=True,
            norm="layernorm",
            norm_eps=1e-5,
            mlp="gelu",
            n_kv_head=None,
            qkv_bias=False,
        ).items()
    )


def test_a_checkpoint_without_the_new_keys_loads_unchanged(tmp_path, gen_tokenizer):
    config = build_config(
        {
            "model": {"vocab_size": 53, "n_layer": 2, "n_head": 2, "d_model": 16, "block_size": 16},
            "out_dir": str(tmp_path),
        }
    )
    torch.manual_seed(0)
    model = GPT(config.model).eval()
    tree = config.to_dict()
    for key in (
        "parallel_residual",
        "tie_embeddings",
        "norm",
        "norm_eps",
        "mlp",
        "n_kv_head",
        "qkv_bias",
        "qk_norm",
        "value_embeddings",
        "logit_softcap",
    ):
        del tree["model"][key]
    path = checkpoint.save(
        {"model": model.state_dict(), "config": tree, "tokenizer": gen_tokenizer.to_bytes()}, str(tmp_path)
    )
    loaded = load_model(path)
    assert loaded.config.model == config.model
    idx = tokens(vocab_size=53)
    with torch.no_grad():
        assert torch.equal(loaded.model(idx), model(idx))


def test_qk_norm_normalises_keys_before_the_rotation_and_caches_them_so():
    """The cache holds rope(k_norm(k)): with norm weights that differ per dimension the other
    order, k_norm(rope(k)), gives other keys."""
    model = make("rope", qk_norm=True, n_layer=1)
    idx, pos = tokens(batch=1, length=5), torch.arange(5.0)
    cache = model.new_cache(1, 8)
    with torch.no_grad():
        model(idx, cache=cache)
        attn = model.blocks[0].attn
        _, k, _ = attn.qkv(model.blocks[0].ln_1(model.wte(idx))).view(1, 5, 3, 4, 8).unbind(2)
        k = k.transpose(1, 2)
        w = attn.k_norm.weight
        normed = k / torch.sqrt((k * k).mean(-1, keepdim=True) + model.config.norm_eps) * w
        expected = model.positions.rotate(normed, normed, pos, 8)[1]
        other_order = model.positions.rotate(k, k, pos, 8)[1]
        other_order = other_order / torch.sqrt((other_order**2).mean(-1, keepdim=True) + model.config.norm_eps) * w
    torch.testing.assert_close(cache.keys[0][:, :, :5], expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(expected, other_order, atol=1e-3)


def test_a_capped_model_trains_and_scores_on_the_logits_it_generates_from():
    """The logits (generation), the fused training loss and evaluation's token losses all see
    the soft-capped logits, which differ from the head's plain ones."""
    model = make("rope", logit_softcap=2.0)
    idx = tokens(length=12)
    x, y = idx[:, :-1], idx[:, 1:]
    with torch.no_grad():
        logits = model(x)
        plain = torch.nn.functional.linear(model(x, return_hidden=True), model.lm_head.weight)
        by_hand = F.cross_entropy(logits.reshape(-1, 61), y.reshape(-1), reduction="none").view(y.shape)
        training = model(x, head=lambda h, w, cap: mixed_loss(h, w, cap, y, None))
        scored = token_losses(model, x, y)
    assert logits.abs().max() < 2.0 and not torch.allclose(logits, plain, atol=1e-2)
    torch.testing.assert_close(scored, by_hand, rtol=1e-5, atol=1e-5)
    assert training.item() == pytest.approx(by_hand.mean().item(), rel=1e-5)


# --------------------------------------------------------------------------- training and extension


@pytest.mark.parametrize(
    "options",
    [dict(LLAMA, dropout=0.1), dict(NEOX, dropout=0.1), dict(OPTIONS["speedrun"], dropout=0.1)],
    ids=["llama", "neox", "speedrun"],
)
def test_a_few_training_steps_lower_the_loss_and_reach_every_parameter(options):
    model = make("rope", **options).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    idx = tokens(batch=4, length=17)
    losses = []
    for _ in range(8):
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_the_speedrun_options_train_through_the_fused_loss_and_load_back(tiny_config):
    """qk_norm, relu2, value embeddings and the logit soft-cap through train.py (Muon, the fused
    loss with the cap), and a checkpoint that loads back with them."""
    overrides = [
        "model.qk_norm=true",
        "model.mlp=relu2",
        "model.value_embeddings=true",
        "model.logit_softcap=5",
        "train.optimizer=muon",
        "train.max_steps=6",
    ]
    summary = train(tiny_config(*overrides), quiet=True)
    assert math.isfinite(summary["final_val_loss"])
    model, _, config, _ = load_model(summary["checkpoint"])
    m = config.model
    assert (m.qk_norm, m.mlp, m.value_embeddings, m.logit_softcap) == (True, "relu2", True, 5.0)
    assert len(model.value_embeds) == (m.n_layer + 1) // 2 and model.blocks[0].attn.q_norm.weight.shape == (m.head_dim,)


def test_training_run_with_llama_options_saves_and_loads_them(tiny_config):
    overrides = [
        "model.norm=rmsnorm",
        "model.mlp=swiglu",
        "model.tie_embeddings=false",
        "model.n_kv_head=1",
        "model.qkv_bias=true",
        "model.norm_eps=1e-6",
        "train.max_steps=3",
        "train.sample_tokens=0",
    ]
    config = tiny_config(*overrides)
    train(config, quiet=True)
    loaded = load_model(config.out_dir)
    assert loaded.config.model == config.model
    assert loaded.model.blocks[0].attn.qkv.weight.shape == ((2 + 2) * 16, 32)
    assert loaded.model.lm_head.weight is not loaded.model.wte.weight


def test_extension_keeps_the_source_architecture(tmp_path, gen_tokenizer):
    model_tree = {"vocab_size": 53, "n_layer": 1, "n_head": 4, "d_model": 16, "block_size": 16, **LLAMA}
    config = build_config({"model": model_tree, "out_dir": str(tmp_path)})
    model = make(vocab_size=53, n_layer=1, n_head=4, d_model=16, block_size=16, **LLAMA)
    path = checkpoint.save(
        {"model": model.state_dict(), "config": config.to_dict(), "tokenizer": gen_tokenizer.to_bytes()}, str(tmp_path)
    )
    plain = {"vocab_size": 53, "n_layer": 1, "n_head": 4, "d_model": 16, "block_size": 32}
    extended, source, _ = source_model(build_config({"model": plain, "train": {"init_from": path}}))
    assert (extended.model.norm, extended.model.mlp, extended.model.n_kv_head) == ("rmsnorm", "swiglu", 2)
    assert not extended.model.tie_embeddings and extended.model.block_size == 32
    idx = tokens(vocab_size=53, length=16)
    with torch.no_grad():
        assert torch.allclose(source.model(idx), model(idx), atol=1e-6)
    with pytest.raises(CheckpointError, match=r"model.mlp=gelu_tanh but the source has swiglu"):
        source_model(build_config({"model": {**plain, "mlp": "gelu_tanh"}, "train": {"init_from": path}}))


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(norm="batchnorm"), "model.norm='batchnorm' is invalid: valid: layernorm, rmsnorm"),
        (dict(mlp="relu"), "model.mlp='relu' is invalid: valid: gelu, gelu_tanh, swiglu, geglu_tanh, relu2"),
        (dict(logit_softcap=-1.0), "model.logit_softcap=-1.0 is invalid: expected 0 (no cap) or a number > 0"),
        (dict(logit_softcap=float("inf")), "model.logit_softcap=inf is invalid"),
        (dict(qk_norm="yes"), "model.qk_norm='yes' is invalid: expected true or false"),
        (dict(n_kv_head=3), "model.n_kv_head=3 is invalid: expected a divisor of model.n_head=4 (1, 2, 4)"),
        (dict(n_kv_head=0), "model.n_kv_head=0 is invalid: expected a divisor of model.n_head=4"),
        (dict(norm_eps=0.0), "model.norm_eps=0.0 is invalid: expected a number > 0 and < 1"),
        (dict(parallel_residual="yes"), "model.parallel_residual='yes' is invalid: expected true or false"),
    ],
)
def test_bad_values_are_one_line_errors(options, message):
    with pytest.raises(ConfigError) as info:
        ModelConfig(n_head=4, d_model=32, **options)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_bad_values_from_yaml_name_the_key():
    with pytest.raises(ConfigError, match=r"^model.mlp='relu' is invalid"):
        build_config({"model": {"mlp": "relu"}})
    with pytest.raises(ConfigError, match=r"^model.qkv_bias=1 has the wrong type: expected bool"):
        build_config({"model": {"qkv_bias": 1}})
