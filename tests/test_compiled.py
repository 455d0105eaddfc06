"""The static KV cache (every slot attended, empty ones masked by position) and the decode
step compiled by torch.compile (minilm.generation.compiled): the same logits and greedy tokens as the
eager cache, past the context too, and a fresh compile whenever the weights change. Under
torch.compile as training runs it: bf16 attention written out for the compiler and still
exact causal attention, and forward passes that compile whole (no graph breaks)."""

import pytest
import torch
import torch.nn.functional as F

from minilm.generation.compiled import compiled_body
from minilm.generation.decode import Decoder, GenerationError, Sampling, Stats, generate_ids
from minilm.model.attention import attend
from minilm.positions import available

GREEDY = Sampling(temperature=0)


def greedy_tokens(model, prompt, n, **kw):
    return [
        t[0] for t in torch.stack(list(generate_ids(model, prompt, max_new_tokens=n, sampling=GREEDY, **kw))).tolist()
    ]


def cached_logits(model, seq, capacity, static):
    """Next-token logits after every prefix of ``seq`` (from the 4th token on), fed through one cache."""
    rolling = model.positions.position_limit() is None
    cache = model.new_cache(1, capacity, rolling=rolling, static=static)
    idx = torch.tensor([seq])
    out = [model(idx[:, :4], cache)[0, -1]]
    for t in range(4, len(seq)):
        out.append(model(idx[:, t : t + 1], cache)[0, -1])
    return torch.stack(out)


@pytest.mark.parametrize("kind", available())
def test_static_cache_gives_the_logits_of_the_growing_cache(random_gpt, kind):
    position = {"kind": kind, "base": {"kind": "rope"}, "factor": 2.0} if kind == "interpolated" else {"kind": kind}
    model = random_gpt(position, block_size=16).eval()
    bounded = model.positions.position_limit() is not None
    seq = torch.randint(0, 97, (16 if bounded else 40,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.inference_mode():  # unbounded schemes roll past the 16 slots: empty slots, then a full ring
        growing = cached_logits(model, seq, 16, static=False)
        static = cached_logits(model, seq, 16, static=True)
    torch.testing.assert_close(static, growing, rtol=1e-4, atol=1e-4)  # the same sums in another order


@pytest.mark.slow
@pytest.mark.parametrize("position", [{"kind": "rope"}, {"kind": "alibi"}], ids=["rope", "alibi"])
def test_compiled_decoding_equals_eager_decoding_past_the_context(random_gpt, position):
    model = random_gpt(position, block_size=16)
    prompt = [5, 17, 42, 8, 61, 3, 29]
    eager = greedy_tokens(model, prompt, 40)
    stats = Stats()
    assert (
        greedy_tokens(model, prompt, 40, compile=True, stats=stats) == eager
    )  # 47 tokens through a 16-slot rolling cache
    assert len(set(eager)) >= 5
    lines = stats.lines()  # the step that compiled is reported apart, not inside the decode rate
    assert lines[2].startswith("compile: the first decode step took") and lines[3].startswith("decode: 38 tokens in")
    seq = torch.randint(0, 97, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        decoders = [Decoder(model, 1, max_context=16, compile=compile) for compile in (False, True)]
        logits = [d.prefill(torch.tensor([seq[:3]])) for d in decoders]
        for token in seq[3:]:
            torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-4)
            logits = [d.step(torch.tensor([token])) for d in decoders]


@pytest.mark.slow
def test_the_compiled_step_is_reused_until_a_weight_changes(random_gpt):
    model = random_gpt({"kind": "rope"}, block_size=16)
    first = compiled_body(model)
    assert compiled_body(model) is first
    with torch.no_grad():
        model.blocks[0].mlp.fc.weight.mul_(3.0)  # what an optimiser step does: in place
    assert compiled_body(model) is not first
    prompt = [1, 2, 3, 4]
    assert greedy_tokens(model, prompt, 12, compile=True) == greedy_tokens(model, prompt, 12)


def test_compile_needs_the_cache(random_gpt):
    model = random_gpt({"kind": "rope"}, block_size=16)
    with pytest.raises(GenerationError, match="compile=True compiles the cached decode step: it needs use_cache=True"):
        greedy_tokens(model, [1, 2], 3, compile=True, use_cache=False)


def test_compiled_bf16_attention_is_written_out_and_is_causal_attention(random_gpt):
    """Compiled on the CPU in bf16, the full-sequence attention is written out for inductor to
    fuse (minilm.model.attention.fused_by_compiler): no SDPA in the graph, and still causal softmax
    attention, gradients too."""
    scheme = random_gpt({"kind": "rope"}).positions
    pos = torch.arange(24, dtype=torch.float32)
    exact = [torch.randn(2, 3, 24, 16, generator=torch.Generator().manual_seed(i)).requires_grad_() for i in range(3)]
    half = [t.detach().to(torch.bfloat16).requires_grad_() for t in exact]

    def attention(q, k, v):
        return attend(q, k, v, pos, pos, scheme, cached=False, window=None)

    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(str(graph_module.graph))
        return graph_module.forward

    torch.compile(attention, backend=capture)(*half)
    assert graphs and "scaled_dot_product_attention" not in graphs[0] and "softmax" in graphs[0]
    out = torch.compile(attention)(*half)
    out.float().square().sum().backward()
    expected = F.scaled_dot_product_attention(*exact, is_causal=True)
    expected.square().sum().backward()
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=3e-2, rtol=3e-2)
    for got, want in zip(half, exact):
        torch.testing.assert_close(got.grad.float(), want.grad, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize(
    "position",
    [
        {"kind": "learned"},
        {"kind": "rope"},
        {"kind": "interpolated", "inner": {"kind": "learned"}, "factor": 2.0},
        {"kind": "randomized", "inner": {"kind": "learned"}},
    ],
    ids=["learned", "rope", "interpolated", "randomized"],
)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_a_forward_pass_compiles_whole(random_gpt, position, training):
    """train.compile compiles the model's forward: the position check and the position hooks
    leave no graph break (fullgraph=True fails on one), and the logits are the eager ones."""
    model = random_gpt(position, block_size=16).train(training)  # dropout 0: the same function in both modes
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))  # within every table
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    torch.manual_seed(1)
    got = compiled(idx)
    torch.manual_seed(1)
    torch.testing.assert_close(got, model(idx))
