"""Every rope type a config.json may name, read by the bridge (``minilm.hf.rope.rope_position``) and
built as minilm's scheme, against transformers' own rope initialisation (``ROPE_INIT_FUNCTIONS``):
the inverse frequencies and the factor on cos and sin, over a grid of settings; and written back
(``rope_parameters``) to what transformers computes the same from."""

import itertools
import math

import pytest
import torch

from minilm.config import ModelConfig
from minilm.hf.rope import rope_parameters, rope_position
from minilm.positions import PositionError, build
from minilm.positions.rope import yarn_bounds

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

HEAD_DIM, MAXIMUM = 64, 4096


def yarn_grid():
    """yarn over every key: betas (0 is transformers' default), truncate, a given attention factor,
    DeepSeek's mscale pair (and mscale alone, which transformers ignores), factors below and above 1."""
    out = []
    for fast, slow, truncate in itertools.product((None, 0, 16, 32, 64), (None, 0.5, 1, 2), (None, True, False)):
        out.append({"factor": 8.0, "beta_fast": fast, "beta_slow": slow, "truncate": truncate})
    for factor in (0.5, 1.0, 4.0, 32.0):
        out.append({"factor": factor, "original_max_position_embeddings": 1024})
        out.append({"factor": factor, "original_max_position_embeddings": 1024, "mscale": 0.707})
        out.append({"factor": factor, "original_max_position_embeddings": 1024, "mscale": 1, "mscale_all_dim": 0.5})
        out.append({"factor": factor, "original_max_position_embeddings": 512, "attention_factor": 1.3})
    return [{"rope_type": "yarn", **{k: v for k, v in p.items() if v is not None}} for p in out]


GRID = (
    [{"rope_type": "linear", "factor": f} for f in (0.5, 2.0, 8.0)]
    + [{"rope_type": "dynamic", "factor": f} for f in (2.0, 4.0)]
    + yarn_grid()
    + [
        {"rope_type": "llama3", "factor": f, "low_freq_factor": lo, "high_freq_factor": hi}
        for f, lo, hi in ((8.0, 1.0, 4.0), (32.0, 1.0, 4.0), (16.0, 2.0, 8.0))
    ]
    + [
        {"rope_type": "proportional", "partial_rotary_factor": fraction, **({"factor": f} if f else {})}
        for fraction, f in itertools.product((0.0, 0.25, 0.5, 1.0), (None, 1.0, 8.0))
    ]
)


def hf_config(params: dict, base: float):
    kind = params["rope_type"]
    params = {"rope_theta": base, **params}
    if kind not in ("dynamic", "proportional") and "original_max_position_embeddings" not in params:
        params["original_max_position_embeddings"] = 2048
    return transformers.LlamaConfig(
        hidden_size=2 * HEAD_DIM,
        num_attention_heads=2,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAXIMUM,
        rope_parameters=params,
    )


def ours(config) -> object:
    """minilm's scheme as the bridge reads ``config``."""
    position = rope_position(config.to_dict(), "config.json")
    return build(position, d_model=2 * HEAD_DIM, n_head=2, block_size=MAXIMUM, head_dim=HEAD_DIM)


@pytest.mark.parametrize("base", [1e4, 5e5])
@pytest.mark.parametrize("params", GRID, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_the_bridge_reads_every_rope_type_as_transformers_computes_it(params, base):
    config = hf_config(params, base)
    hf_inv, hf_attention = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    scheme = ours(config)
    length = config.max_position_embeddings  # dynamic at its original length: the plain frequencies
    torch.testing.assert_close(scheme.inv_freq(length).float(), hf_inv, rtol=2e-6, atol=0)
    assert scheme.attention_scale() == pytest.approx(hf_attention, rel=1e-12)


@pytest.mark.parametrize("params", [p for p in GRID if p["rope_type"] != "dynamic"][::3], ids=str)
def test_what_the_bridge_writes_transformers_computes_the_same_from(params):
    """Read, then written back as ``rope_parameters``: transformers' frequencies and attention
    factor from what minilm wrote equal those from the original config."""
    config = hf_config(params, 1e4)
    expected = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    position = rope_position(config.to_dict(), "config.json")
    model = ModelConfig(n_layer=1, n_head=2, d_model=2 * HEAD_DIM, block_size=MAXIMUM, position=position)
    written, maximum = rope_parameters(model)
    again = transformers.LlamaConfig(
        hidden_size=2 * HEAD_DIM,
        num_attention_heads=2,
        head_dim=HEAD_DIM,
        max_position_embeddings=maximum,
        rope_parameters=written,
    )
    got = ROPE_INIT_FUNCTIONS[written["rope_type"]](again, "cpu")
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
    assert got[1] == pytest.approx(expected[1], rel=1e-12)


def test_yarn_bounds_by_hand():
    """d = 64, base 1e4, L = 2048: the pair turning 32 times over L is 64 ln(2048 / (64 pi)) / (2 ln 1e4)
    = 8.064..., the one turning once 20.105...; truncate rounds them out to 8 and 21 (the paper's code),
    GPT-OSS's ``truncate: false`` keeps the fractions."""
    exact = [64 * math.log(2048 / (2 * math.pi * b)) / (2 * math.log(1e4)) for b in (32, 1)]
    assert exact == pytest.approx([8.0640, 20.1052], abs=1e-4)
    assert yarn_bounds(64, 1e4, 2048) == (8, 21)
    assert yarn_bounds(64, 1e4, 2048, truncate=False) == pytest.approx(exact)
    assert yarn_bounds(64, 1e4, 2048, beta_fast=1e6, beta_slow=1e-6, truncate=False) == (0, 63)  # clipped


@pytest.mark.parametrize(
    "scaling, message",
    [
        ({"truncate": "no"}, "scaling.truncate='no' is invalid: expected true or false"),
        ({"beta_fast": -1}, "scaling.beta_fast=-1 is invalid"),
        ({"mscale": "big"}, "scaling.mscale='big' is invalid"),
        ({"attention_factor": 0}, "scaling.attention_factor=0 is invalid"),
    ],
)
def test_bad_yarn_settings_are_one_line_errors(scaling, message):
    with pytest.raises(PositionError, match=message) as info:
        build(
            {"kind": "rope", "scaling": {"type": "yarn", "factor": 4, **scaling}}, d_model=64, n_head=1, block_size=64
        )
    assert "\n" not in str(info.value)


def test_yarn_keys_belong_to_yarn():
    with pytest.raises(PositionError, match="scaling.beta_fast is not an option of scaling.type=linear, only of yarn"):
        build(
            {"kind": "rope", "scaling": {"type": "linear", "factor": 2, "beta_fast": 4}},
            d_model=8,
            n_head=1,
            block_size=8,
        )


PER_TYPE = [  # Gemma 3's rope_parameters by layer type: a scaling on the full layers only, two bases
    {"rope_type": "linear", "factor": 8.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "beta_fast": 16},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "truncate": False},
    {
        "rope_type": "llama3",
        "factor": 8.0,
        "original_max_position_embeddings": 1024,
        "low_freq_factor": 1,
        "high_freq_factor": 4,
    },
    {"rope_type": "default"},
]


@pytest.mark.parametrize("full", PER_TYPE, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_rope_parameters_per_layer_type_are_read_as_transformers_computes_them(full):
    """Each layer type's frequencies and attention factor against transformers' (with ``layer_type``).
    yarn's ``truncate: false`` inside a type is not seen by transformers, which looks for it beside the
    types: such a type truncates, there and here."""
    from minilm.hf.gemma import type_positions

    config = transformers.Gemma3TextConfig(
        hidden_size=2 * HEAD_DIM,
        num_attention_heads=2,
        head_dim=HEAD_DIM,
        num_hidden_layers=2,
        max_position_embeddings=MAXIMUM,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_theta": 1e6, **full},
        },
    )
    positions = type_positions(config.to_dict(), "config.json")
    for layer_type in ("sliding_attention", "full_attention"):
        kind = config.rope_parameters[layer_type]["rope_type"]
        init = ROPE_INIT_FUNCTIONS.get(kind)
        if init is None:  # the default type: base^(-2i/d)
            hf_inv = 1.0 / config.rope_parameters[layer_type]["rope_theta"] ** (torch.arange(0, HEAD_DIM, 2) / HEAD_DIM)
            hf_attention = 1.0
        else:
            hf_inv, hf_attention = init(config, "cpu", layer_type=layer_type)
        scheme = build(positions[layer_type], d_model=2 * HEAD_DIM, n_head=2, block_size=MAXIMUM, head_dim=HEAD_DIM)
        torch.testing.assert_close(scheme.inv_freq(MAXIMUM).float(), hf_inv.float(), rtol=2e-6, atol=0)
        assert scheme.attention_scale() == pytest.approx(hf_attention, rel=1e-12)
