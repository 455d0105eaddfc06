"""The GPT and its KV cache: cached == uncached logits, causality, position limits."""

import pytest
import torch

from minilm import GPT, ModelConfig
from minilm.positions import available

BASE_KINDS = [k for k in available() if k != "interpolated"]
ALL_POSITIONS = (
    [{"kind": k} for k in BASE_KINDS]
    + [{"kind": "interpolated", "base": {"kind": k}, "factor": 2} for k in BASE_KINDS]
    + [{"kind": "randomized", "inner": {"kind": k}} for k in BASE_KINDS if k != "randomized"]
    + [
        {"kind": "rope", "scaling": {"type": t, "factor": 2, "original_max_positions": 24}}
        for t in ("linear", "ntk", "dynamic", "yarn", "llama3")
    ]
    + [
        {
            "kind": "rope",
            "scaling": {
                "type": "longrope",
                "original_max_positions": 24,
                "short_factor": [1.0, 1.5, 2.0, 3.0],
                "long_factor": [2.0, 4.0, 8.0, 16.0],
            },
        }
    ]
    + [
        {"kind": "rope", "rotary_fraction": 0.5},
        {"kind": "shaw", "values": True, "max_distance": 5},
        {"kind": "kerple", "variant": "power"},
    ]
)
IDS = [str(p).replace(" ", "") for p in ALL_POSITIONS]
T = 40


def tiny(position, block_size=48, n_layer=2, n_head=3, d_model=24, seed=0):
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=61, n_layer=n_layer, n_head=n_head, d_model=d_model, block_size=block_size, position=position
    )
    model = GPT(config).eval()
    if any("relative_bias" in n for n, _ in model.named_parameters()):  # T5 starts at zero: make it matter
        with torch.no_grad():
            model.positions.relative_bias.weight.normal_() if hasattr(
                model.positions, "relative_bias"
            ) else model.positions.inner.relative_bias.weight.normal_()
    return model


def decode_in_pieces(model, idx, pieces):
    cache = model.new_cache(idx.shape[0], idx.shape[1])
    outs, start = [], 0
    for size in pieces:
        outs.append(model(idx[:, start : start + size], cache=cache))
        start += size
    assert cache.length == idx.shape[1]
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("position", ALL_POSITIONS, ids=IDS)
@pytest.mark.parametrize("batch", [1, 3])
def test_cached_decoding_equals_full_forward(position, batch):
    model = tiny(position)
    idx = torch.randint(0, 61, (batch, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)
        for prefill in (1, 7, 32):
            cached = decode_in_pieces(model, idx, [prefill] + [1] * (T - prefill))
            assert (cached - full).abs().max().item() <= 1e-5, f"prefill {prefill}"
        chunked = decode_in_pieces(model, idx, [5, 3] + [1] * (T - 8))
        assert (chunked - full).abs().max().item() <= 1e-5


@pytest.mark.parametrize("position", ALL_POSITIONS, ids=IDS)
def test_causality(position):
    model = tiny(position)
    idx = torch.randint(0, 61, (2, T), generator=torch.Generator().manual_seed(2))
    t = 17
    changed = idx.clone()
    changed[:, t + 1 :] = torch.randint(0, 61, (2, T - t - 1), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert torch.equal(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


@pytest.mark.parametrize("kind", ["rope", "alibi", "t5", "none", "sinusoidal"])
def test_rolling_cache_equals_sliding_window(kind):
    model = tiny({"kind": kind}, block_size=16)
    idx = torch.randint(0, 61, (2, 50), generator=torch.Generator().manual_seed(4))
    window = 12
    with torch.no_grad():
        reference = model(idx, window=window, context_len=window)
        cache = model.new_cache(2, window, rolling=True)
        outs = [model(idx[:, :window], cache=cache)] + [
            model(idx[:, t : t + 1], cache=cache) for t in range(window, 50)
        ]
    assert (torch.cat(outs, dim=1) - reference).abs().max().item() <= 1e-5
    assert cache.length == 50


def test_a_pass_refuses_a_window_that_hides_every_key():
    """A window of no keys, or of sinks only, leaves a query nothing to attend to (its scores were NaN);
    a cache refuses the same capacities (new_cache)."""
    model = tiny({"kind": "rope"}, block_size=16)
    idx = torch.randint(0, 61, (1, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        for window, sinks in ((0, 0), (-3, 0), (4, 4), (4, -1), (2.5, 0), (True, 0)):
            with pytest.raises(ValueError, match=rf"window={window!r} with sinks={sinks} is invalid: expected an"):
                model(idx, window=window, sinks=sinks)
        assert torch.isfinite(model(idx, window=1)).all() and torch.isfinite(model(idx, window=4, sinks=3)).all()


@pytest.mark.parametrize("kind", ["rope", "alibi", "t5", "none", "sinusoidal", "kerple", "xpos"])
def test_a_rolling_cache_takes_chunks_across_its_wrap(kind):
    """Chunks of up to the capacity that cross the ring's end: each query sees the keys held
    before its chunk and the chunk's own, within its window, as sliding-window attention does."""
    model = tiny({"kind": kind}, block_size=16)
    idx = torch.randint(0, 61, (2, 50), generator=torch.Generator().manual_seed(4))
    window, outs, t = 12, [], 0
    with torch.no_grad():
        reference = model(idx, window=window, context_len=window)
        cache = model.new_cache(2, window, rolling=True)
        for size in (5, 9, 12, 3, 12, 9):  # 50 tokens
            outs.append(model(idx[:, t : t + size], cache=cache))
            t += size
        assert (torch.cat(outs, dim=1) - reference).abs().max().item() <= 1e-5 and cache.length == 50
        with pytest.raises(ValueError, match="chunks of at most its capacity"):
            model(idx[:, :13], cache=cache)
        sinks = model.new_cache(2, window, rolling=True, sinks=2, sink_positions="absolute")
        model(idx[:, :window], cache=sinks)
        with pytest.raises(ValueError, match="with sinks or static one token at a time"):
            model(idx[:, window : window + 2], cache=sinks)
        static = model.new_cache(2, window, rolling=True, static=True)  # a compiled decoder's cache
        model(idx[:, :window], cache=static)
        with pytest.raises(ValueError, match="with sinks or static one token at a time"):
            model(idx[:, window : window + 2], cache=static)


@pytest.mark.parametrize("kind", ["rope", "alibi", "sinusoidal", "none", "t5"])
def test_unbounded_schemes_run_past_block_size(kind):
    model = tiny({"kind": kind}, block_size=16)
    with torch.no_grad():
        logits = model(torch.randint(0, 61, (1, 40)))
    assert logits.shape == (1, 40, 61) and torch.isfinite(logits).all()


def test_learned_past_table_is_a_clear_error():
    model = tiny({"kind": "learned"}, block_size=16)
    with pytest.raises(ValueError, match=r"position 19 is past the learned position table \(positions 0..15\)"):
        model(torch.randint(0, 61, (1, 20)))
    cache = model.new_cache(1, 40)
    model(torch.randint(0, 61, (1, 16)), cache=cache)
    held = cache.slot_pos.clone()
    with pytest.raises(ValueError, match="position 16 is past"):
        model(torch.randint(0, 61, (1, 1)), cache=cache)
    assert cache.length == 16 and torch.equal(cache.slot_pos, held)  # refused before the cache was touched


def test_full_cache_is_a_clear_error():
    model = tiny({"kind": "rope"})
    cache = model.new_cache(1, 4)
    model(torch.randint(0, 61, (1, 4)), cache=cache)
    with pytest.raises(ValueError, match="KV cache full"):
        model(torch.randint(0, 61, (1, 1)), cache=cache)


def test_num_params_counts_tied_head_once():
    model = tiny({"kind": "none"}, n_layer=1, n_head=2, d_model=8)
    per_block = 8 + (8 * 24 + 8 * 8) + 8 + (8 * 32 + 32 * 8)  # LN (no bias), attn, LN, MLP
    assert model.num_params() == 61 * 8 + per_block + 8
    assert model.lm_head.weight is model.wte.weight


def test_residual_projections_use_scaled_init():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=64, n_layer=8, n_head=4, d_model=256, block_size=16))
    std_proj = model.blocks[0].attn.proj.weight.std().item()
    std_fc = model.blocks[0].mlp.fc.weight.std().item()
    assert std_fc == pytest.approx(0.02, rel=0.05)
    assert std_proj == pytest.approx(0.02 / 4, rel=0.05)


def test_bad_model_shape_is_a_clear_error():
    from minilm.config import ConfigError

    with pytest.raises(ConfigError, match="not divisible by model.n_head=5"):
        ModelConfig(d_model=64, n_head=5)


def test_bfloat16_autocast_runs_with_cache():
    model = tiny({"kind": "alibi"})
    idx = torch.randint(0, 61, (1, 10))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full = model(idx)
        cached = decode_in_pieces(model, idx, [4] + [1] * 6)
    assert (cached.float() - full.float()).abs().max().item() < 0.1


@pytest.mark.parametrize("kind", ["rope", "alibi"])
def test_a_bf16_model_on_the_cpu_caches_in_float32_and_matches_its_full_forward(kind):
    model = tiny({"kind": kind}).to(torch.bfloat16)
    assert model.new_cache(1, 8).keys[0].dtype == torch.float32  # attention runs in float32 over it
    idx = torch.randint(0, 61, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(idx)
        cached = decode_in_pieces(model, idx, [4] + [1] * 6)
    assert cached.dtype == torch.bfloat16
    torch.testing.assert_close(cached.float(), full.float(), rtol=0.05, atol=0.05)


def test_embedding_scale_multiplies_the_tokens_before_the_positions():
    from minilm.config import ConfigError

    idx = torch.randint(0, 61, (1, 8))
    cases = [
        ({"kind": "sinusoidal"}, "auto", 24**0.5),
        ({"kind": "rope"}, "auto", 1.0),
        ({"kind": "interpolated", "inner": {"kind": "sinusoidal"}}, "auto", 24**0.5),
        ({"kind": "learned"}, "sqrt_d_model", 24**0.5),
        ({"kind": "sinusoidal"}, 2.5, 2.5),
    ]
    for position, scale, expected in cases:
        torch.manual_seed(0)
        model = GPT(
            ModelConfig(
                vocab_size=61, n_layer=1, n_head=3, d_model=24, block_size=16, position=position, embedding_scale=scale
            )
        ).eval()
        assert model.embedding_scale == pytest.approx(expected)
        captured = {}
        model.blocks[0].register_forward_pre_hook(lambda m, args: captured.update(x=args[0]))  # what the blocks read
        with torch.no_grad():
            model(idx)
        pos = torch.arange(8, dtype=torch.float32)
        assert torch.allclose(captured["x"], model.positions.embed(model.wte(idx) * expected, pos), atol=1e-6)
    for bad in (0, -1.0, "sqrt", float("inf")):
        with pytest.raises(ConfigError, match="model.embedding_scale"):
            ModelConfig(embedding_scale=bad)
