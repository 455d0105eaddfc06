"""p-RoPE (Barbero et al. 2025), rope's ``scaling: {type: proportional, fraction: F}``: against
transformers' ``proportional`` rope type, by hand, in attention scores and in the model."""

import pytest
import torch

from minilm import GPT, ModelConfig
from minilm.positions import PositionError, build, describe


def make(position, head_dim=8, n_head=1, block_size=64):
    return build(position, d_model=head_dim * n_head, n_head=n_head, block_size=block_size)


def proportional(fraction, **scaling):
    return {"kind": "rope", "scaling": {"type": "proportional", "fraction": fraction, **scaling}}


@pytest.mark.parametrize("factor", [None, 1.0, 4.0])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("base", [1e4, 1e6])
@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_inverse_frequencies_match_transformers(fraction, base, head_dim, factor):
    """transformers' ``_compute_proportional_rope_parameters``: int(F * head_dim // 2) pairs at
    base^(-2i/head_dim), the rest 0, all divided by ``factor`` (default 1); attention factor 1."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "proportional", "rope_theta": base, "partial_rotary_factor": fraction}
    scaling = {}
    if factor is not None:  # transformers' validation calls factor "unrecognized" here, yet divides by it
        params["factor"] = scaling["factor"] = factor
    hf_config = transformers.LlamaConfig(
        hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim, rope_parameters=params
    )
    hf_inv, hf_attention = ROPE_INIT_FUNCTIONS["proportional"](hf_config, "cpu")
    ours = make({**proportional(fraction, **scaling), "base": base}, head_dim=head_dim)
    assert ours.inv_freq().shape == (head_dim // 2,)  # the whole head, as transformers'
    torch.testing.assert_close(ours.inv_freq().float(), hf_inv, rtol=1e-6, atol=0)
    assert ours.attention_scale() == hf_attention == 1.0
    assert ours.prefix_invariant  # it reads no sequence length


def test_inverse_frequencies_by_hand():
    base = 10000.0
    half = make({**proportional(0.5), "base": base}, head_dim=8).inv_freq()
    torch.testing.assert_close(half, torch.tensor([1.0, base ** (-2 / 8), 0.0, 0.0], dtype=torch.float64))
    # the exponent runs over the whole width, not over the kept pairs: base^(-2/8), not base^(-2/4)
    quarter = make({**proportional(0.75, factor=2), "base": base}, head_dim=8).inv_freq()
    torch.testing.assert_close(quarter, torch.tensor([1.0, base**-0.25, base**-0.5, 0.0], dtype=torch.float64) / 2)
    assert torch.equal(make(proportional(0.0)).inv_freq(), torch.zeros(4, dtype=torch.float64))
    plain, full = make({"kind": "rope"}), make(proportional(1.0))
    assert torch.equal(full.inv_freq(), plain.inv_freq())  # fraction 1: plain rope
    assert torch.equal(make(proportional(None)).inv_freq(), plain.inv_freq())  # None: unset, 1


def test_with_rotary_fraction_it_acts_within_the_rotated_dims():
    """rotary_fraction 0.5 of a 16-wide head rotates 8 dims; fraction 0.5 keeps 2 of their 4 pairs."""
    scheme = make({**proportional(0.5), "rotary_fraction": 0.5}, head_dim=16)
    torch.testing.assert_close(scheme.inv_freq(), torch.tensor([1.0, 1e4 ** (-2 / 8), 0.0, 0.0], dtype=torch.float64))
    q = torch.randn(1, 1, 5, 16)
    rq, _ = scheme.rotate(q, q, torch.arange(5.0), 5)
    assert torch.equal(rq[..., 8:], q[..., 8:])  # past the rotated dims: untouched
    assert torch.equal(rq[..., [2, 3, 6, 7]], q[..., [2, 3, 6, 7]])  # the zero-frequency pairs


def test_pairs_at_zero_frequency_are_not_rotated_and_their_scores_ignore_positions():
    """head_dim 16, fraction 0.5: pairs 4..7 (dims 4..7 with 12..15, the halves layout) have frequency
    0, so rotate() leaves them alone and q_m . k_n over them is the same at every (m, n)."""
    torch.manual_seed(0)
    head_dim, T = 16, 12
    scheme = make(proportional(0.5), head_dim=head_dim)
    still = torch.tensor([4, 5, 6, 7, 12, 13, 14, 15])
    moving = torch.tensor([0, 1, 2, 3, 8, 9, 10, 11])
    assert torch.equal(scheme.inv_freq()[4:], torch.zeros(4, dtype=torch.float64))
    q = torch.randn(2, 1, T, head_dim)
    k = torch.randn(2, 1, T, head_dim)
    rq, rk = scheme.rotate(q, k, torch.arange(float(T)), T)
    assert torch.equal(rq[..., still], q[..., still]) and torch.equal(rk[..., still], k[..., still])
    assert not torch.allclose(rq[..., 1:, :][..., moving], q[..., 1:, :][..., moving])  # the others do turn
    # one query vector and one key vector at every position: the scores of the still dims are constant
    qv, kv = torch.randn(head_dim).expand(1, 1, T, head_dim), torch.randn(head_dim).expand(1, 1, T, head_dim)
    rq, rk = scheme.rotate(qv, kv, torch.arange(float(T)), T)
    scores = rq[0, 0][:, still] @ rk[0, 0][:, still].T  # (m, n)
    torch.testing.assert_close(scores, torch.full_like(scores, float(qv[0, 0, 0, still] @ kv[0, 0, 0, still])))
    rotating = rq[0, 0][:, moving] @ rk[0, 0][:, moving].T
    assert rotating.std() > 1e-3  # ... while the kept pairs' scores do depend on positions


def test_model_builds_and_cached_decoding_equals_the_full_forward():
    torch.manual_seed(0)
    position = proportional(0.5)
    model = GPT(ModelConfig(vocab_size=64, n_layer=2, n_head=2, d_model=32, block_size=16, position=position))
    model.eval()
    idx = torch.randint(0, 64, (2, 16))
    P = 6
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 16)
        steps = [model(idx[:, :P], cache)] + [model(idx[:, t : t + 1], cache) for t in range(P, 16)]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= 1e-5
    assert describe(position) == "rope+proportional fraction=0.5"
    assert describe(proportional(0.25, factor=2)) == "rope+proportional x2 fraction=0.25"


@pytest.mark.parametrize(
    "scaling, message",
    [
        ({"type": "proportional", "fraction": 1.5}, "scaling.fraction=1.5 is invalid: expected a number >= 0 and <= 1"),
        ({"type": "proportional", "fraction": -0.1}, "scaling.fraction=-0.1 is invalid"),
        ({"type": "proportional", "fraction": "x"}, "scaling.fraction='x' is invalid: expected a number"),
        ({"type": "proportional", "fraction": True}, "scaling.fraction=True is invalid"),
        ({"type": "yarn", "factor": 2, "fraction": 0.5}, "scaling.fraction is not an option of scaling.type=yarn"),
        ({"fraction": 0.5}, "scaling.fraction is not an option of scaling.type=none, only of proportional"),
        ({"type": "proportional", "factor": 0}, "scaling.factor=0 is invalid"),
        ({"type": "proportional", "short_factor": [1.0] * 4}, "scaling.short_factor is not an option"),
    ],
)
def test_bad_settings_are_one_line_errors(scaling, message):
    with pytest.raises(PositionError, match=message.replace("(", r"\(")) as caught:
        make({"kind": "rope", "scaling": scaling})
    assert "\n" not in str(caught.value)
