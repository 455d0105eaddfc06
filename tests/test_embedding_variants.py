"""The absolute-position variants of the ablation experiment: dimension-specific dropout on
the sinusoidal table (a linear ramp of rates by frequency, inverted scaling, nothing dropped at
evaluation) and the position encoding concatenated to the token embedding at equal width
(the layout written out, cached == uncached, training, one-line errors)."""

import pytest
import torch

from minilm import GPT, ModelConfig
from minilm.config import ConfigError, build_config
from minilm.hf.export import export_model
from minilm.hf.family import HFError
from minilm.positions import build
from minilm.positions.sinusoidal import sinusoidal_table


def sinusoidal(d_model=8, **options):
    return build({"kind": "sinusoidal", **options}, d_model=d_model, n_head=1, block_size=64)


# --------------------------------------------------------------------------- dimension dropout


def test_the_ramp_runs_linearly_by_frequency_pair():
    rates = sinusoidal(dim_dropout=[0.4, 0.1]).drop_rates
    # 4 pairs: 0.4, 0.3, 0.2, 0.1, the sin and the cos of a pair alike; pair 0 turns fastest
    torch.testing.assert_close(rates, torch.tensor([0.4, 0.4, 0.3, 0.3, 0.2, 0.2, 0.1, 0.1]))


def test_nothing_is_dropped_at_evaluation_or_by_default():
    x, pos = torch.randn(3, 5, 8), torch.arange(5.0)
    table = sinusoidal_table(pos, 8)
    scheme = sinusoidal(dim_dropout=[0.5, 0.5]).eval()
    torch.testing.assert_close(scheme.embed(x, pos), x + table)
    plain = sinusoidal().train()  # [0, 0]: training changes nothing either
    torch.testing.assert_close(plain.embed(x, pos), x + table)


def test_training_drops_whole_dimensions_of_a_row_at_their_rates_and_keeps_the_expectation():
    torch.manual_seed(0)
    scheme = sinusoidal(dim_dropout=[0.6, 0.0]).train()
    rows, pos = 20000, torch.arange(1.0, 4.0)  # position 0's sin entries are 0: start at 1
    table = sinusoidal_table(pos, 8)
    out = scheme.embed(torch.zeros(rows, 3, 8), pos)
    kept = out != 0
    # a dimension is kept or dropped for every position of the row at once
    assert torch.equal(kept[:, 0], kept[:, 1]) and torch.equal(kept[:, 1], kept[:, 2])
    dropped = 1 - kept[:, 0].float().mean(0)
    torch.testing.assert_close(dropped, scheme.drop_rates, atol=0.015, rtol=0)
    # kept entries are scaled by 1 / (1 - p), so the mean over rows is the table itself
    torch.testing.assert_close(out.mean(0), table, atol=0.03, rtol=0)
    assert torch.equal(kept[:, :, 6:], torch.ones_like(kept[:, :, 6:]))  # the slowest pair: rate 0


@pytest.mark.parametrize("value", [[0.2], [0.2, 1.0], [-0.1, 0.1], 0.2, ["a", 0.1]])
def test_bad_dropout_rates_are_one_line_errors(value):
    with pytest.raises(ValueError) as info:
        sinusoidal(dim_dropout=value)
    assert "sinusoidal: dim_dropout" in str(info.value) and "\n" not in str(info.value)


def test_a_model_with_the_ramp_trains_stochastically_and_evaluates_deterministically():
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=50,
        n_layer=1,
        n_head=2,
        d_model=16,
        block_size=16,
        position={"kind": "sinusoidal", "dim_dropout": [0.3, 0.1]},
    )
    model, idx = GPT(config), torch.randint(0, 50, (2, 16))
    model.train()
    assert not torch.equal(model(idx), model(idx))
    model.eval()
    assert torch.equal(model(idx), model(idx))


# --------------------------------------------------------------------------- concatenation


def concat_model(kind="sinusoidal", dims=8, d_model=16, **options):
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=50,
        n_layer=2,
        n_head=2,
        d_model=d_model,
        block_size=32,
        position={"kind": kind},
        concat_position_dims=dims,
        tie_embeddings=False,
        **options,
    )
    model = GPT(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.3)
    return model


def test_concatenation_keeps_the_width_and_splits_the_embedding():
    learned = concat_model("learned")
    assert learned.wte.weight.shape == (50, 8) and learned.positions.table.weight.shape == (32, 8)
    added = GPT(
        ModelConfig(
            vocab_size=50,
            n_layer=2,
            n_head=2,
            d_model=16,
            block_size=32,
            position={"kind": "learned"},
            tie_embeddings=False,
        )
    )
    # every transformer weight is the same shape; the two tables are half as wide
    assert added.num_params() - learned.num_params() == 50 * 8 + 32 * 8


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_the_residual_stream_starts_as_tokens_then_positions(kind):
    model, idx = concat_model(kind), torch.randint(0, 50, (2, 10))
    seen = {}
    model.blocks[0].register_forward_pre_hook(lambda module, args: seen.update(x=args[0]))
    with torch.no_grad():
        model(idx)
    pos = torch.arange(10.0)
    encoding = sinusoidal_table(pos, 8) if kind == "sinusoidal" else model.positions.table.weight[:10]
    expected = torch.cat([model.wte(idx) * model.embedding_scale, encoding.expand(2, 10, 8)], dim=-1)
    torch.testing.assert_close(seen["x"], expected)


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_concatenated_positions_cached_equal_uncached(kind):
    model, idx = concat_model(kind), torch.randint(0, 50, (2, 16))
    cache = model.new_cache(2, 16)
    with torch.no_grad():
        full = model(idx)
        steps = [model(idx[:, :9], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(9, 16)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def test_concatenated_model_trains_every_parameter():
    model = concat_model("learned").train()
    idx = torch.randint(0, 50, (4, 17))
    logits = model(idx[:, :-1])
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize(
    "model, message",
    [
        ({"concat_position_dims": 7}, "model.concat_position_dims=7 is invalid: expected 0 (added) or an even number"),
        ({"concat_position_dims": 32}, "model.concat_position_dims=32 is invalid"),
        ({"concat_position_dims": 8}, "an LM head of d_model cannot share: set model.tie_embeddings false"),
        (
            {"concat_position_dims": 8, "tie_embeddings": False, "position": {"kind": "rope"}},
            "model.position: rope acts inside attention and adds nothing to the embeddings",
        ),
    ],
)
def test_bad_concatenation_settings_are_one_line_errors(model, message):
    with pytest.raises(ConfigError) as info:
        build_config({"model": {"d_model": 32, "n_head": 4, "position": {"kind": "sinusoidal"}, **model}})
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_concatenated_model_is_not_exported_as_a_transformers_model(tmp_path, gen_tokenizer):
    model = concat_model("learned", dims=8, d_model=16)
    model.config.vocab_size = gen_tokenizer.vocab_size
    config = build_config({"model": {**model.config.__dict__}})
    with pytest.raises(HFError, match="model.concat_position_dims=8 has no GPT-2 equivalent"):
        export_model(GPT(config.model), gen_tokenizer, config, str(tmp_path / "hf"))
