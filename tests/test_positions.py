"""Position formulas against known values and independent reference computations."""

import math

import pytest
import torch

from minilm.checkpoints.format import upgraded_weights
from minilm.positions import available, build
from minilm.positions import fire as fire_module
from minilm.positions.alibi import alibi_slopes
from minilm.positions.rope import dynamic_ntk_base, ntk_base, rope_inv_freq, yarn_bounds, yarn_inv_freq, yarn_mscale
from minilm.positions.sinusoidal import sinusoidal_table
from minilm.positions.t5 import t5_bucket


def make(position, d_model=64, n_head=1, block_size=2048):
    return build(position, d_model=d_model, n_head=n_head, block_size=block_size)


def test_registry_lists_every_kind():
    assert available() == sorted(
        [
            "alibi",
            "fire",
            "interpolated",
            "kerple",
            "learned",
            "none",
            "randomized",
            "rope",
            "shaw",
            "sinusoidal",
            "t5",
            "xpos",
        ]
    )


# ----------------------------------------------------------------------------- sinusoidal


def test_sinusoidal_known_values():
    row = sinusoidal_table(torch.tensor([1.0]), 4)[0]
    assert torch.allclose(row, torch.tensor([0.8415, 0.5403, 0.0100, 0.99995]), atol=1e-4)


def test_sinusoidal_embed_adds_table():
    scheme = make({"kind": "sinusoidal"}, d_model=4)
    x = torch.zeros(1, 3, 4)
    out = scheme.embed(x, torch.arange(3.0))
    assert torch.allclose(out[0, 0], torch.tensor([0.0, 1.0, 0.0, 1.0]))
    assert torch.allclose(out[0, 1], torch.tensor([0.8415, 0.5403, 0.0100, 0.99995]), atol=1e-4)


# ----------------------------------------------------------------------------- alibi


def reference_slopes(n):
    """Independent computation: the geometric sequence starting at 2^(-8/n), as in the paper's
    code; non-powers of two interleave the extra heads from the 2n sequence."""

    def geometric(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return geometric(n)
    closest = 2 ** math.floor(math.log2(n))
    return geometric(closest) + reference_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("n_head", range(1, 65))
def test_alibi_slopes_match_reference(n_head):
    assert alibi_slopes(n_head) == pytest.approx(reference_slopes(n_head), rel=1e-12)


def test_alibi_slopes_twelve_heads():
    expected = [2**-e for e in (1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5)]
    assert alibi_slopes(12) == pytest.approx(expected)
    assert len(alibi_slopes(6)) == 6 and len(alibi_slopes(24)) == 24


def test_alibi_bias_uses_absolute_positions():
    scheme = make({"kind": "alibi"}, d_model=8, n_head=2)
    q_pos, k_pos = torch.tensor([10.0]), torch.arange(11.0)
    bias = scheme.bias(q_pos, k_pos)
    assert bias.shape == (2, 1, 11)
    assert torch.allclose(bias[0, 0], -0.0625 * (10 - k_pos))  # 2 heads: slopes 2^-4, 2^-8


# ----------------------------------------------------------------------------- rope


def test_rope_inv_freq():
    inv = rope_inv_freq(64, 10000.0)
    assert inv[0] == 1.0 and inv[1] == pytest.approx(10000 ** (-2 / 64))
    assert inv[-1] == pytest.approx(10000 ** (-62 / 64))


def test_ntk_base_d64_s4():
    assert ntk_base(10000.0, 4.0, 64) == pytest.approx(41829, rel=1e-4)
    scheme = make({"kind": "rope", "scaling": {"type": "ntk", "factor": 4}})
    assert torch.allclose(scheme.inv_freq(), rope_inv_freq(64, ntk_base(1e4, 4.0, 64)))


def test_yarn_worked_example():
    assert yarn_bounds(64, 10000.0, 2048) == (8, 21)
    assert yarn_mscale(4.0) == pytest.approx(1.1386, abs=1e-4)
    inv = yarn_inv_freq(64, 10000.0, 4.0, 2048)
    plain = rope_inv_freq(64, 10000.0)
    assert torch.equal(inv[:9], plain[:9])  # high frequencies (i <= low) kept
    assert torch.allclose(inv[21:], plain[21:] / 4)  # low frequencies (i >= high) interpolated
    i = 14
    g = (i - 8) / 13
    assert inv[i] == pytest.approx(plain[i] / 4 * g + plain[i] * (1 - g))


def test_yarn_uses_original_length_and_scales_cos_sin():
    scheme = make(
        {"kind": "rope", "scaling": {"type": "yarn", "factor": 4, "original_max_positions": 2048}}, block_size=8192
    )
    assert torch.allclose(scheme.inv_freq(), yarn_inv_freq(64, 1e4, 4.0, 2048))
    cos, sin = scheme.cos_sin(torch.tensor([0.0]), 8192, torch.float32)
    assert cos[0, 0].item() == pytest.approx(1.1386, abs=1e-4)


def test_linear_scaling_divides_frequencies():
    scheme = make({"kind": "rope", "scaling": {"type": "linear", "factor": 4}})
    assert torch.allclose(scheme.inv_freq(), rope_inv_freq(64, 1e4) / 4)


def test_dynamic_ntk_only_past_original_length():
    scheme = make(
        {"kind": "rope", "scaling": {"type": "dynamic", "factor": 2, "original_max_positions": 128}}, block_size=512
    )
    assert torch.allclose(scheme.inv_freq(100), rope_inv_freq(64, 1e4))
    expected_base = 1e4 * ((2 * 512 / 128) - 1) ** (64 / 62)
    assert dynamic_ntk_base(1e4, 2.0, 64, 512, 128) == pytest.approx(expected_base)
    assert torch.allclose(scheme.inv_freq(512), rope_inv_freq(64, expected_base))


def test_rope_angles_in_float32_precision():
    scheme = make({"kind": "rope"})
    cos, sin = scheme.cos_sin(torch.tensor([1995.0]), 2048, torch.float32)
    assert sin[0, 0].item() == pytest.approx(math.sin(1995.0), abs=1e-3)


@pytest.mark.parametrize("scaling", [None, {"type": "linear", "factor": 2}, {"type": "yarn", "factor": 4}])
def test_rope_score_depends_only_on_distance(scaling):
    torch.manual_seed(0)
    scheme = make({"kind": "rope", "scaling": scaling}, d_model=32, n_head=1, block_size=64)
    q, k = torch.randn(1, 1, 1, 32), torch.randn(1, 1, 1, 32)

    def score(m, n):
        qm, _ = scheme.rotate(q, q, torch.tensor([float(m)]), 64)
        kn, _ = scheme.rotate(k, k, torch.tensor([float(n)]), 64)
        return (qm * kn).sum().item()

    for delta in (0, 1, 5, 17, 40):
        reference = score(delta, 0)
        for n in (3, 11, 100, 513):
            assert score(n + delta, n) == pytest.approx(reference, abs=1e-4)


def test_rotary_fraction_leaves_tail_untouched():
    scheme = make({"kind": "rope", "rotary_fraction": 0.25}, d_model=32, n_head=1)
    q = torch.randn(1, 1, 5, 32)
    rotated, _ = scheme.rotate(q, q, torch.arange(5.0) + 3, 64)
    assert torch.equal(rotated[..., 8:], q[..., 8:])
    assert not torch.allclose(rotated[..., :8], q[..., :8])


def test_rope_is_halves_layout():
    """Dim i pairs with dim i + rot/2 (rotate_half): a vector in dims (0, rot/2) stays in them."""
    scheme = make({"kind": "rope"}, d_model=8, n_head=1)
    q = torch.zeros(1, 1, 1, 8)
    q[..., 0] = 1.0
    rotated, _ = scheme.rotate(q, q, torch.tensor([1.0]), 8)
    assert rotated[0, 0, 0, 0].item() == pytest.approx(math.cos(1.0))
    assert rotated[0, 0, 0, 4].item() == pytest.approx(math.sin(1.0))


@pytest.mark.parametrize("fraction", [1.0, 0.375])
def test_rope_rotation_is_bit_for_bit_the_rotate_half_formula(fraction):
    """q cos + rotate_half(q) sin, with rotate_half(x) = cat(-x2, x1) over the rotated dims,
    written out here: the same floats, so checkpoints score exactly as they always did."""
    scheme = make({"kind": "rope", "rotary_fraction": fraction}, d_model=64, n_head=1)
    g = torch.Generator().manual_seed(0)
    q, pos = torch.randn(2, 1, 9, 64, generator=g), torch.arange(9.0) * 37
    cos, sin = scheme.cos_sin(pos, 64, torch.float32)
    rot = cos.shape[-1]
    head, tail = q[..., :rot], q[..., rot:]
    turned = torch.cat((-head[..., rot // 2 :], head[..., : rot // 2]), dim=-1)
    expected = torch.cat((head * cos + turned * sin, tail), dim=-1)
    assert torch.equal(scheme.rotate(q, q, pos, 64)[0], expected)


def test_rope_tables_follow_positions_changed_in_place():
    """The cos/sin tables are computed once per forward pass (``start``) and shared by its layers;
    they travel with the pass, so positions changed in place (here under inference mode, where
    tensors keep no version counter) between passes, or outside any pass, get tables of their own."""
    scheme = make({"kind": "rope"}, d_model=16, n_head=1)
    q = torch.randn(1, 1, 3, 16)
    with torch.inference_mode():

        def fresh(shift):
            return scheme.rotate(q, q, torch.arange(3.0) + shift, 64)[0]

        pos = torch.arange(3.0)
        scheme.rotate(q, q, pos, 64)
        pos.add_(10)
        assert torch.equal(scheme.rotate(q, q, pos, 64)[0], fresh(10))
        for shift in (15, 20):  # a pass of its own each time
            first = scheme.start(pos, 64)
            assert torch.equal(first.rotate(q, q, pos, 64)[0], first.rotate(q, q, pos, 64)[0])
            pos.add_(5)
            assert torch.equal(scheme.start(pos, 64).rotate(q, q, pos, 64)[0], fresh(shift))


@pytest.mark.parametrize("kind", sorted(set(available()) - {"randomized"}))
def test_a_pass_asks_the_schemes_own_hooks(kind):
    """What ``start`` returns answers every hook as the scheme itself does (it only computes what it
    can once per pass): the same rotation, bias, value term and embedding, at the pass's own
    positions and at others, and every other attribute is the scheme's."""
    torch.manual_seed(0)
    scheme = make({"kind": kind}, d_model=16, n_head=2).eval()
    pos, other = torch.arange(6.0), torch.arange(6.0) + 3
    q, k, x = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 6, 16)
    weights = torch.softmax(torch.randn(1, 2, 6, 6), dim=-1)
    run = scheme.start(pos, 12)
    assert run.kind == scheme.kind and run.has_bias == scheme.has_bias and run.embeds == scheme.embeds
    for at in (pos, other):
        assert all(torch.equal(a, b) for a, b in zip(run.rotate(q, k, at, 12), scheme.rotate(q, k, at, 12)))
        assert torch.equal(run.embed(x, at), scheme.embed(x, at))
        if scheme.has_bias:
            assert torch.equal(run.bias(at, pos, q), scheme.bias(at, pos, q))
        if scheme.has_value_term:
            assert torch.equal(run.value_term(weights, at, pos), scheme.value_term(weights, at, pos))


# ----------------------------------------------------------------------------- t5 / learned / interpolated


def test_t5_buckets_exact_then_logarithmic():
    d = torch.tensor([0.0, 1, 15, 16, 32, 64, 127, 128, 1000])
    buckets = t5_bucket(d, 32, 128).tolist()
    assert buckets[:3] == [0, 1, 15]
    assert buckets[3] == 16
    assert buckets == sorted(buckets)
    assert buckets[-2] == buckets[-1] == 31


def test_learned_interpolates_rows():
    scheme = make({"kind": "interpolated", "base": {"kind": "learned"}, "factor": 2}, d_model=4, block_size=8)
    table = scheme.inner.table.weight
    x = torch.zeros(1, 3, 4)
    out = scheme.embed(x, torch.tensor([0.0, 1.0, 2.0]))
    assert torch.allclose(out[0, 1], (table[0] + table[1]) / 2)
    assert torch.allclose(out[0, 2], table[1])


def test_interpolated_alibi_scales_distances():
    plain = make({"kind": "alibi"}, d_model=8, n_head=2)
    wrapped = make({"kind": "interpolated", "base": {"kind": "alibi"}, "factor": 4}, d_model=8, n_head=2)
    q, k = torch.tensor([8.0]), torch.arange(9.0)
    assert torch.allclose(wrapped.bias(q, k), plain.bias(q, k) / 4)


def test_interpolated_rope_equals_linear_scaling():
    a = make({"kind": "interpolated", "base": {"kind": "rope"}, "factor": 4}, d_model=16)
    b = make({"kind": "rope", "scaling": {"type": "linear", "factor": 4}}, d_model=16)
    q = torch.randn(1, 1, 6, 16)
    pos = torch.arange(6.0) * 7
    assert torch.allclose(a.rotate(q, q, pos, 64)[0], b.rotate(q, q, pos, 64)[0], atol=1e-6)


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "position, message",
    [
        ({"kind": "ropee"}, "did you mean rope"),
        ({"kind": "rope", "bsae": 10}, "did you mean base"),
        ({"kind": "rope", "rotary_fraction": 1.5}, "rotary_fraction=1.5"),
        ({"kind": "rope", "rotary_fraction": 0}, "rotary_fraction=0"),
        ({"kind": "rope", "scaling": {"type": "yarn"}}, "needs scaling.factor"),
        ({"kind": "rope", "scaling": {"type": "lineer", "factor": 2}}, "did you mean linear"),
        ({"kind": "rope", "scaling": {"type": "linear", "factor": 0}}, "scaling.factor=0"),
        ({"kind": "rope", "scaling": {"type": "linear", "factor": -2}}, "scaling.factor=-2"),
        ({"kind": "interpolated", "factor": 0}, "factor=0"),
        ({"kind": "interpolated", "base": {"kind": "nope"}}, "unknown position kind 'nope'"),
        ({"kind": "t5", "num_buckets": 1}, "num_buckets=1"),
        ({"kind": "learned", "max_positions": 0}, "max_positions=0"),
    ],
)
def test_bad_options_are_one_line_errors(position, message):
    with pytest.raises(ValueError) as info:
        make(position)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_odd_dimensions_rejected():
    with pytest.raises(ValueError, match="head dimension 5"):
        build({"kind": "rope"}, d_model=10, n_head=2, block_size=8)
    with pytest.raises(ValueError, match="d_model=9 is odd"):
        build({"kind": "sinusoidal"}, d_model=9, n_head=1, block_size=8)


# --------------------------------------------------------------------------- llama3 and longrope


def llama3_reference(dim, base, factor, original, low, high):
    """The Llama 3.1 rule written out pair by pair, in plain Python."""
    out = []
    for i in range(dim // 2):
        inv = base ** (-2 * i / dim)
        wavelength = 2 * math.pi / inv
        if wavelength < original / high:
            out.append(inv)
        elif wavelength > original / low:
            out.append(inv / factor)
        else:
            g = (original / wavelength - low) / (high - low)
            out.append((1 - g) * inv / factor + g * inv)
    return out


@pytest.mark.parametrize(
    "dim, base, factor, original, low, high",
    [(64, 10000.0, 8.0, 8192, 1.0, 4.0), (64, 500000.0, 8.0, 8192, 1.0, 4.0), (16, 10000.0, 4.0, 128, 2.0, 8.0)],
)
def test_llama3_frequencies_pair_by_pair(dim, base, factor, original, low, high):
    scheme = make(
        {
            "kind": "rope",
            "base": base,
            "scaling": {
                "type": "llama3",
                "factor": factor,
                "original_max_positions": original,
                "low_freq_factor": low,
                "high_freq_factor": high,
            },
        },
        d_model=dim,
    )
    expected = torch.tensor(llama3_reference(dim, base, factor, original, low, high), dtype=torch.float64)
    assert torch.allclose(scheme.inv_freq(), expected, rtol=1e-12)
    assert scheme.attention_scale() == 1.0
    inv, plain = scheme.inv_freq(), rope_inv_freq(dim, base)
    assert inv[0] == plain[0] and inv[-1] == pytest.approx(plain[-1] / factor)  # fastest kept, slowest interpolated


def test_longrope_switches_factors_at_the_original_length():
    short, long = [1.0, 1.5, 2.0, 3.0], [2.0, 4.0, 8.0, 16.0]
    scheme = make(
        {
            "kind": "rope",
            "scaling": {"type": "longrope", "original_max_positions": 64, "short_factor": short, "long_factor": long},
        },
        d_model=8,
        block_size=256,
    )
    plain = rope_inv_freq(8, 10000.0)
    assert torch.allclose(scheme.inv_freq(64), plain / torch.tensor(short, dtype=torch.float64))
    assert torch.allclose(scheme.inv_freq(65), plain / torch.tensor(long, dtype=torch.float64))
    assert scheme.scaling["factor"] == 4.0  # block_size / original by default
    assert scheme.attention_scale() == pytest.approx(math.sqrt(1 + math.log(4) / math.log(64)))
    given = make(
        {
            "kind": "rope",
            "scaling": {
                "type": "longrope",
                "original_max_positions": 64,
                "factor": 2,
                "attention_factor": 1.25,
                "short_factor": short,
                "long_factor": long,
            },
        },
        d_model=8,
    )
    assert given.attention_scale() == 1.25
    cos, _ = scheme.cos_sin(torch.zeros(1), 256, torch.float32)  # cos(0) carries the attention factor
    assert torch.allclose(cos, torch.full_like(cos, scheme.attention_scale()))


@pytest.mark.parametrize(
    "scaling, message",
    [
        ({"type": "llama3"}, "needs scaling.factor"),
        ({"type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1}, "high_freq_factor=1"),
        ({"type": "longrope", "short_factor": [1.0], "long_factor": [1.0] * 4}, "short_factor: a list of 4"),
        ({"type": "yarn", "factor": 2, "short_factor": [1.0] * 4}, "not an option of scaling.type=yarn"),
        (  # its attention factor divides by ln L: a traceback at the first pass before
            {"type": "longrope", "original_max_positions": 1, "short_factor": [1.0] * 4, "long_factor": [1.0] * 4},
            "original_max_positions=1 is invalid for longrope: expected an integer >= 2",
        ),
    ],
)
def test_llama3_and_longrope_bad_settings(scaling, message):
    with pytest.raises(ValueError, match=message):
        make({"kind": "rope", "scaling": scaling}, d_model=8)


HF_CASES = [  # (head_dim, theta, rope parameters)
    (
        64,
        10000.0,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    (
        128,
        500000.0,
        {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    (
        16,
        10000.0,
        {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 2.0,
            "high_freq_factor": 8.0,
            "original_max_position_embeddings": 128,
        },
    ),
    (
        8,
        10000.0,
        {
            "rope_type": "longrope",
            "factor": 4.0,
            "short_factor": [1.0, 1.2, 1.9, 2.5],
            "long_factor": [1.5, 3.0, 6.0, 12.0],
            "original_max_position_embeddings": 64,
        },
    ),
    (
        16,
        50000.0,
        {
            "rope_type": "longrope",
            "factor": 16.0,
            "short_factor": [1.0] * 8,
            "long_factor": [1.0 + i for i in range(8)],
            "original_max_position_embeddings": 256,
        },
    ),
]


@pytest.mark.parametrize("head_dim, theta, params", HF_CASES)
@pytest.mark.parametrize("length", ["short", "long"])
def test_llama3_and_longrope_match_transformers(head_dim, theta, params, length):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    original = params["original_max_position_embeddings"]
    seq_len = original if length == "short" else 2 * original
    hf_config = transformers.LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        max_position_embeddings=int(original * params["factor"]),
        rope_parameters={**params, "rope_theta": theta},
    )
    hf_inv, hf_attention = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf_config, "cpu", seq_len=seq_len)
    scaling = {
        "type": params["rope_type"],
        "factor": params["factor"],
        "original_max_positions": original,
        **{
            k: v
            for k, v in params.items()
            if k in ("low_freq_factor", "high_freq_factor", "short_factor", "long_factor")
        },
    }
    ours = make(
        {"kind": "rope", "base": theta, "scaling": scaling},
        d_model=head_dim,
        block_size=int(original * params["factor"]),
    )
    torch.testing.assert_close(ours.inv_freq(seq_len).float(), hf_inv, rtol=1e-6, atol=0)
    assert ours.attention_scale() == pytest.approx(hf_attention, rel=1e-12)


# --------------------------------------------------------------------------- kerple


def test_t5_and_fire_start_as_their_references_and_fire_learns_its_threshold_in_relative_steps():
    """T5's table starts N(0, d_model^-1/2) as transformers' T5 (not zero); FIRE's threshold
    starts at the training length and one Adam step moves it by a fraction of itself (about the
    rate), at a threshold of 128 as at 4,096, where a threshold held in positions would move by
    about the rate in positions."""
    torch.manual_seed(0)
    t5 = make({"kind": "t5"}, d_model=64, n_head=128)
    assert float(t5.relative_bias.weight.std()) == pytest.approx(64**-0.5, rel=0.05)
    for L in (128, 4096):
        fire = make({"kind": "fire"}, d_model=8, n_head=2, block_size=L)
        assert float(fire.log_threshold.exp()) == pytest.approx(L)
        optimizer = torch.optim.Adam([fire.log_threshold], lr=0.01)
        q = torch.arange(1.0, L, 16.0)  # queries before the threshold are normalised by it
        fire.normalised_distance(q, torch.zeros(1)).sum().backward()  # a larger threshold lowers them all
        optimizer.step()
        assert float(fire.log_threshold.exp()) / L == pytest.approx(math.exp(0.01), rel=1e-4)


def test_kerple_starts_and_stays_where_the_reference_code_keeps_it():
    """chijames/KERPLE: log's multiplier U(0, 2) and inner scale U(0, 1); power's multiplier
    U(0, 1) and exponent U(0, 2); each projected onto [1e-2, ...) (the exponent onto [1e-2, 2])
    before every training pass."""
    torch.manual_seed(0)
    log = make({"kind": "kerple", "floor": 1e-2}, d_model=8, n_head=512)
    power = make({"kind": "kerple", "variant": "power", "floor": 1e-2}, d_model=8, n_head=512)
    for param, high in ((log.r1, 2.0), (log.r2, 1.0), (power.r1, 1.0), (power.r2, 2.0)):
        assert 0 <= float(param.min()) < 0.02 * high and 0.98 * high < float(param.max()) < high
        assert float(param.mean()) == pytest.approx(high / 2, rel=0.1)
    with torch.no_grad():
        power.r2[:2] = torch.tensor([-1.0, 3.0])
    power.start(torch.arange(4.0), 4)  # what every forward pass calls first
    assert power.r2[:2].tolist() == pytest.approx([0.01, 2.0]) and float(power.r1.min()) >= 0.01 - 1e-9
    default = make({"kind": "kerple"}, d_model=8, n_head=2)  # minilm's clamp before the option: saved models load alike
    assert default.floor == 1e-4 and "floor=0.0001" in repr(default)


def test_kerple_log_and_power_kernels():
    log = make({"kind": "kerple"}, d_model=8, n_head=4)
    with torch.no_grad():
        log.r1.copy_(torch.tensor([0.5, 1.0, 2.0, 3.0]))
        log.r2.copy_(torch.tensor([0.1, 0.2, 0.5, 1.0]))
    q, k = torch.tensor([5.0]), torch.arange(6, dtype=torch.float32)
    bias = log.bias(q, k)
    for h, (r1, r2) in enumerate([(0.5, 0.1), (1.0, 0.2), (2.0, 0.5), (3.0, 1.0)]):
        for j in range(6):
            assert float(bias[h, 0, j]) == pytest.approx(-r1 * math.log(1 + r2 * (5 - j)), rel=1e-6)
    power = make({"kind": "kerple", "variant": "power"}, d_model=8, n_head=4)
    alibi = make({"kind": "alibi"}, d_model=8, n_head=4)
    with torch.no_grad():
        power.r1.copy_(alibi.slopes)
        power.r2.fill_(1.0)
    assert torch.allclose(power.bias(q, k), alibi.bias(q, k))  # power with exponent 1 and ALiBi's slopes is ALiBi
    with torch.no_grad():
        power.r2.fill_(1.5)
    assert float(power.bias(q, k)[0, 0, 1]) == pytest.approx(-float(power.r1[0]) * 4**1.5, rel=1e-6)
    power.bias(q, k).sum().backward()  # distance 0 included: gradients stay finite
    assert torch.isfinite(power.r2.grad).all() and torch.isfinite(power.r1.grad).all()
    with pytest.raises(ValueError, match="variant='cubic'"):
        make({"kind": "kerple", "variant": "cubic"}, d_model=8, n_head=4)


# --------------------------------------------------------------------------- fire


def test_fire_bias_is_the_mlp_of_the_normalised_log_distance():
    fire = make({"kind": "fire"}, d_model=8, n_head=2, block_size=16)
    with torch.no_grad():
        fire.c.fill_(0.5)
        fire.log_threshold.fill_(math.log(10.0))
    q, k = torch.tensor([4.0, 20.0]), torch.tensor([0.0, 3.0, 4.0])
    bias = fire.bias(q, k)
    for row, i in enumerate((4.0, 20.0)):
        for col, j in enumerate((0.0, 3.0, 4.0)):
            x = math.log(0.5 * max(i - j, 0) + 1) / math.log(0.5 * max(10.0, i) + 1)
            expected = fire.mlp(torch.tensor([[x]]))[0]
            assert torch.allclose(bias[:, row, col], expected, atol=1e-6)
    assert torch.all(fire.normalised_distance(q, k) <= 1) and float(fire.normalised_distance(q, k)[0, 2]) == 0.0
    old = {f"positions.{k}": v for k, v in fire.state_dict().items() if k != "log_threshold"}
    old["positions.threshold"] = torch.tensor(10.0)  # a checkpoint from before the log, as every load reads it
    older = make({"kind": "fire"}, d_model=8, n_head=2, block_size=16)
    older.load_state_dict({k[len("positions.") :]: v for k, v in upgraded_weights(old).items()})
    assert torch.allclose(older.bias(q, k), bias, atol=1e-6)

    whole = fire.bias(torch.arange(40.0), torch.arange(40.0))
    old = fire_module.HIDDEN_BUDGET
    fire_module.HIDDEN_BUDGET = 40 * 32 * 3  # three query rows at a time
    try:
        assert torch.allclose(fire.bias(torch.arange(40.0), torch.arange(40.0)), whole)
    finally:
        fire_module.HIDDEN_BUDGET = old


# --------------------------------------------------------------------------- xpos


def test_xpos_scales_q_and_k_by_zeta_to_the_distance():
    xpos = make({"kind": "xpos", "scale_base": 8.0}, d_model=8)
    rope = make({"kind": "rope"}, d_model=8)
    zeta = [(2 * i / 8 + 0.4) / 1.4 for i in range(4)]
    assert torch.allclose(xpos.zeta, torch.tensor(zeta))
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    for n, m in ((5, 2), (30, 30), (40, 3)):
        qx, _ = xpos.rotate(q, q, torch.tensor([float(n)]), 64)
        _, kx = xpos.rotate(k, k, torch.tensor([float(m)]), 64)
        qr, _ = rope.rotate(q, q, torch.tensor([float(n)]), 64)
        _, kr = rope.rotate(k, k, torch.tensor([float(m)]), 64)
        decay = torch.tensor([z ** ((n - m) / 8.0) for z in zeta] * 2)
        assert float((qx * kx).sum()) == pytest.approx(float((qr * kr * decay).sum()), rel=1e-4, abs=1e-6)
    # the reference position cancels: another context length gives the same scores
    a = xpos.rotate(q, k, torch.tensor([7.0]), 16)
    b = xpos.rotate(q, k, torch.tensor([7.0]), 200)
    assert float((a[0] * a[1]).sum()) == pytest.approx(float((b[0] * b[1]).sum()), rel=1e-4)
    with pytest.raises(ValueError, match="float32 would overflow"):
        xpos.rotate(q, k, torch.tensor([600.0]), 64)  # scale_base 8: 510 positions of reach


def test_xpos_in_float16_refuses_positions_whose_scales_would_overflow():
    xpos = make({"kind": "xpos", "scale_base": 8.0}, d_model=8)
    q, k = torch.randn(1, 1, 2, 8), torch.randn(1, 1, 2, 8)
    near = torch.tensor([40.0, 70.0])  # 38 from the reference 32: within float16's reach at scale_base 8
    half = xpos.rotate(q.half(), k.half(), near, 64)
    full = xpos.rotate(q, k, near, 64)
    assert all(torch.isfinite(h).all() for h in half)
    assert torch.allclose((half[0].float() * half[1].float()).sum(-1), (full[0] * full[1]).sum(-1), rtol=1e-2)
    # 78 from the reference: zeta_0^-(78 / 8) is about e^12, past float16's 65,504 (it was inf, then NaN scores)
    with pytest.raises(ValueError, match=r"position 110 is more than 51 .* float16 would overflow; use bfloat16"):
        xpos.rotate(q.half(), k.half(), torch.tensor([40.0, 110.0]), 64)
    assert all(torch.isfinite(t).all() for t in xpos.rotate(q, k, torch.tensor([40.0, 110.0]), 64))  # float32 has room


# --------------------------------------------------------------------------- randomized


def test_randomized_positions_are_random_in_training_and_plain_in_evaluation():
    scheme = make(
        {"kind": "randomized", "inner": {"kind": "sinusoidal"}, "max_positions": 100}, d_model=8, block_size=10
    )
    plain = make({"kind": "sinusoidal"}, d_model=8)
    pos, x = torch.arange(10, dtype=torch.float32), torch.zeros(1, 10, 8)
    torch.manual_seed(0)
    scheme.train()
    samples = []
    for _ in range(3):
        run = scheme.start(pos, 10)
        drawn = run._map(pos)
        assert len(set(drawn.tolist())) == 10 and torch.all(drawn[1:] > drawn[:-1])  # distinct, sorted
        assert 0 <= float(drawn.min()) and float(drawn.max()) < 100 and drawn.tolist() == [int(p) for p in drawn]
        assert torch.equal(run.embed(x, pos), plain.embed(x, drawn))
        # every position of the pass is mapped by its one draw
        assert torch.equal(run.embed(x[:, :4], pos[:4]), plain.embed(x[:, :4], drawn[:4]))
        assert torch.equal(scheme.embed(x, pos), plain.embed(x, pos))  # the module keeps no draw
        samples.append(drawn.tolist())
    assert samples[0] != samples[1] != samples[2]  # a fresh draw every forward pass
    scheme.eval()
    assert torch.equal(scheme.start(pos, 10).embed(x, pos), plain.embed(x, pos))
    with pytest.raises(ValueError, match="max_positions=5 is smaller than block_size=10"):
        make({"kind": "randomized", "max_positions": 5}, d_model=8, block_size=10)


def test_randomized_model_trains_on_other_positions_and_evaluates_on_its_own():
    from minilm import GPT, ModelConfig

    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=50,
        n_layer=1,
        n_head=2,
        d_model=16,
        block_size=16,
        position={"kind": "randomized", "inner": {"kind": "learned"}},
    )
    model = GPT(config)
    assert model.positions.inner.table.num_embeddings == 128  # 8 x block_size rows
    idx = torch.randint(0, 50, (1, 16))
    with torch.no_grad():
        model.train()
        assert not torch.equal(model(idx), model(idx))  # dropout is 0: only the positions differ
        model.eval()
        plain = model.wte(idx) + model.positions.inner.table.weight[:16]
        assert torch.equal(model(idx), model(idx))
        hidden = model.positions.embed(model.wte(idx), torch.arange(16, dtype=torch.float32))
        assert torch.equal(hidden, plain)


def test_randomized_sampled_at_evaluation_draws_as_in_training_and_refuses_a_cache():
    """eval_positions: sampled (the official code's behaviour): a model in eval mode draws a sorted
    sample from [0, max_positions) at every forward pass; the draw follows torch's generator; not
    prefix-invariant; a KV cache and a sequence longer than max_positions are refused in one line."""
    from minilm import GPT, ModelConfig
    from minilm.positions import PositionError

    config = ModelConfig(
        vocab_size=50,
        n_layer=1,
        n_head=2,
        d_model=16,
        block_size=16,
        position={"kind": "randomized", "inner": {"kind": "rope"}, "eval_positions": "sampled"},
    )
    torch.manual_seed(0)
    model = GPT(config).eval()
    assert model.positions.draws_at_evaluation and not model.positions.prefix_invariant
    idx = torch.randint(0, 50, (1, 16))
    with torch.no_grad():
        torch.manual_seed(1)
        first = model(idx)
        torch.manual_seed(1)  # the pass's draw, as the forward pass made it
        plain = torch.arange(16, dtype=torch.float32)
        drawn = model.positions.start(plain, 16)._map(plain)
        assert len(set(drawn.tolist())) == 16 and torch.all(drawn[1:] > drawn[:-1]) and float(drawn.max()) < 128
        assert float(drawn.max()) > 15  # not the plain positions
        assert not torch.equal(first, model(idx))  # a fresh draw
        torch.manual_seed(1)
        assert torch.equal(first, model(idx))  # the same draw from the same generator state
        pair = model(idx.repeat(2, 1))  # one draw per row: two copies of a sequence are scored apart
        assert not torch.allclose(pair[0], pair[1])
        torch.manual_seed(1)
        assert torch.allclose(model(idx.repeat(2, 1))[0], first, atol=1e-6)  # the first row takes the first draw
        plain = GPT(ModelConfig(**{**config.__dict__, "position": {"kind": "randomized", "inner": {"kind": "rope"}}}))
        plain.load_state_dict(model.state_dict())
        plain.eval()
        assert plain.positions.prefix_invariant and torch.equal(plain(idx), plain(idx))
        assert not torch.allclose(plain(idx), first)
        with pytest.raises(PositionError, match="cannot be drawn from max_positions=128"):
            model(torch.randint(0, 50, (1, 129)))
    with pytest.raises(PositionError, match="eval_positions: sampled.*model.position.eval_positions=plain"):
        model.new_cache(1, 32)
    with pytest.raises(ValueError, match="eval_positions='random' is invalid: valid: plain, sampled"):
        make({"kind": "randomized", "eval_positions": "random"}, d_model=8, block_size=10)


# --------------------------------------------------------------------------- shaw


def test_shaw_keys_and_values_against_attention_written_out():
    from minilm.model.attention import attend

    torch.manual_seed(0)
    shaw = make({"kind": "shaw", "max_distance": 3, "values": True}, d_model=8, n_head=2)
    with torch.no_grad():
        shaw.keys.weight.normal_()
        shaw.values.weight.normal_()
    T, d = 6, 4
    q, k, v = torch.randn(1, 2, T, d), torch.randn(1, 2, T, d), torch.randn(1, 2, T, d)
    pos = torch.arange(T, dtype=torch.float32)
    out = attend(q, k, v, pos, pos, shaw, cached=False, window=None)
    expected = torch.zeros_like(out)
    for h in range(2):
        for i in range(T):
            r = [min(i - j, 3) for j in range(i + 1)]
            logits = torch.stack(
                [(q[0, h, i] @ (k[0, h, j] + shaw.keys.weight[r[j]])) / math.sqrt(d) for j in range(i + 1)]
            )
            w = torch.softmax(logits, dim=0)
            expected[0, h, i] = sum(w[j] * (v[0, h, j] + shaw.values.weight[r[j]]) for j in range(i + 1))
    assert torch.allclose(out, expected, atol=1e-5)
    assert shaw.buckets(torch.tensor([9.0]), torch.arange(10.0)).tolist() == [[3, 3, 3, 3, 3, 3, 3, 2, 1, 0]]


@pytest.mark.parametrize("kind", ["ntk", "dynamic"])
def test_an_ntk_base_needs_more_than_two_rotated_dims(kind):
    """s^(d/(d-2)) divides by zero at d = 2: refused in one line where the scheme is built, not a traceback
    at its first pass."""
    with pytest.raises(ValueError, match=f"scaling.type={kind} changes the base by .* rotates 2 of 8"):
        make({"kind": "rope", "rotary_fraction": 0.25, "scaling": {"type": kind, "factor": 2}}, d_model=8)
