"""GPT-OSS's attention, layer by layer, against transformers' ``GptOssAttention`` with random weights:
sliding (window 4) and full layers, one learned sink logit per head, YaRN with ``truncate: false``,
biases on q, k, v and o, grouped-query heads; with and without minilm's KV cache. The whole model
(a mixture of experts) stays out: this holds the attention minilm would give it."""

import pytest
import torch

from minilm import GPT, ModelConfig
from minilm.model.layer import ForwardPass

transformers = pytest.importorskip("transformers")
from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function  # noqa: E402
from transformers.models.gpt_oss import modeling_gpt_oss  # noqa: E402

WINDOW, T, B = 4, 14, 2
# head_dim 32 and L = 4096: the ramp runs from pair 4.05 to 8.70, so truncate decides its ends (4 and 9)
YARN = {
    "type": "yarn",
    "factor": 4.0,
    "original_max_positions": 4096,
    "truncate": False,
    "beta_fast": 32,
    "beta_slow": 1,
}


def hf_config():
    config = transformers.GptOssConfig(
        vocab_size=16,
        hidden_size=32,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_local_experts=2,
        num_experts_per_tok=1,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        attention_bias=True,
        max_position_embeddings=16384,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
        },
    )
    config._attn_implementation = "eager"
    return config


def minilm_model():
    return GPT(
        ModelConfig(
            vocab_size=16,
            n_layer=2,
            n_head=4,
            n_kv_head=2,
            d_model=32,
            head_dim=32,
            block_size=64,
            bias=True,
            position={"kind": "rope", "base": 150000.0, "scaling": YARN},
            layers={
                "pattern": ["sliding", "full"],
                "sliding": {"window": WINDOW, "sinks": "learned"},
                "full": {"sinks": "learned"},
            },
        )
    ).eval()


def hf_mask(layer_type: str) -> torch.Tensor:
    """transformers' own mask function for the layer type, as the additive mask eager attention adds."""
    allowed = sliding_window_causal_mask_function(WINDOW) if layer_type == "sliding_attention" else causal_mask_function
    index = torch.arange(T)
    grid = allowed(torch.tensor(0), torch.tensor(0), index[:, None], index[None, :])
    return torch.zeros(T, T).masked_fill(~grid, float("-inf"))[None, None]


def pass_of(model, pos, context_len, cache=None) -> ForwardPass:
    return ForwardPass(pos, model.positions.start(pos, context_len), cache, None, 0, context_len)


@pytest.mark.parametrize("layer", [0, 1], ids=["sliding", "full"])
def test_attention_equals_gpt_oss(layer):
    torch.manual_seed(layer)
    config = hf_config()
    theirs = modeling_gpt_oss.GptOssAttention(config, layer).eval()
    with torch.no_grad():
        for param in theirs.parameters():
            param.normal_(0, 0.3)
    ours = minilm_model()
    attention = ours.blocks[layer].attn
    with torch.no_grad():
        attention.qkv.weight.copy_(torch.cat([getattr(theirs, f"{p}_proj").weight for p in "qkv"]))
        attention.qkv.bias.copy_(torch.cat([getattr(theirs, f"{p}_proj").bias for p in "qkv"]))
        attention.proj.weight.copy_(theirs.o_proj.weight)
        attention.proj.bias.copy_(theirs.o_proj.bias)
        attention.sink_logits.copy_(theirs.sinks)
    x = torch.randn(B, T, 32)
    rotary = modeling_gpt_oss.GptOssRotaryEmbedding(config)
    mask = hf_mask(config.layer_types[layer])
    with torch.no_grad():
        for offset in (0, 3000):  # far out, YaRN's ramp (truncated or not) shows in the low frequencies
            expected, _ = theirs(x, rotary(x, torch.arange(offset, offset + T)[None].expand(B, T)), mask)
            pos = torch.arange(offset, offset + T, dtype=torch.float32)
            got = attention(x, layer, pass_of(ours, pos, T))  # float32 angles near 3000 round apart by ~1e-4
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 if offset == 0 else 1e-4)
        expected, _ = theirs(x, rotary(x, torch.arange(T)[None].expand(B, T)), mask)
        cache = ours.new_cache(B, T)  # a prefill of 5, then one token at a time, past the window
        steps = []
        for start, end in [(0, 5)] + [(t, t + 1) for t in range(5, T)]:
            pos = cache.begin(end - start)
            steps.append(attention(x[:, start:end], layer, pass_of(ours, pos, cache.capacity, cache)))
            cache.commit()
        # one token at a time sums in another order than the whole sequence: outputs near 6 differ by up to
        # ~2e-6 relative on an AVX2-only CPU (1.1e-5 absolute), where a wrong position moves them by O(1)
        torch.testing.assert_close(torch.cat(steps, dim=1), expected, rtol=1e-5, atol=1e-5)
