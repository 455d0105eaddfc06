"""Positions per layer (``model.layers``, ``minilm.positions.layers``): cached == uncached logits for
every layer pattern x every scheme that can sit in a layer, past every window, with chunked prefill and
left-padded rows; what each layer's window and chunk hide; learned sinks and the query scaling against
transformers' own functions; each layer's own cache ring; the lean decode step bit for bit; bad designs."""

import math

import pytest
import torch

from minilm.config import ConfigError, ModelConfig, build_config
from minilm.generation.lean import lean_body
from minilm.model.attention import attend
from minilm.model.gpt import GPT
from minilm.positions import available, scheme_class
from minilm.positions.layers import LayerType, describe_design, query_scale_factor
from minilm.training.source import starting_config

PATTERNS = {
    "uniform": None,
    "3local-1global-none": {
        "pattern": ["local", "local", "local", "global"],
        "local": {"window": 5},
        "global": {"position": {"kind": "none"}},
    },
    "sliding-full-learned-sinks": {
        "pattern": ["sliding", "full"],
        "sliding": {"window": 4, "sinks": "learned"},
        "full": {"sinks": "learned"},
    },
    "chunked": {"pattern": ["chunked", "chunked", "global"], "chunked": {"chunk": 4}, "global": None},
    "soft-capped": {"pattern": ["capped"], "capped": {"softcap": 2.0, "window": 6}},
    "query-scaled": {
        "pattern": ["local", "global"],
        "local": {"window": 5},
        "global": {"position": {"kind": "none"}, "query_scale": {"beta": 0.5, "floor": 3, "offset": 1}},
    },
    "rope-bases": {
        "pattern": ["local", "global"],
        "local": {"window": 3},
        "global": {"position": {"kind": "rope", "base": 1e6, "scaling": {"type": "linear", "factor": 8}}},
    },
}


def layer_schemes():
    """Every registered kind that acts inside attention (the embedding schemes add once, before any
    layer), interpolated over rope, and the rope scalings, p-RoPE and Shaw's value term among them."""
    out = []
    for kind in available():
        if kind == "interpolated":
            out.append({"kind": kind, "inner": {"kind": "rope"}, "factor": 2.0})
        elif kind not in ("sinusoidal", "learned"):
            out.append({"kind": kind})
    return out + [
        {"kind": "rope", "scaling": {"type": "yarn", "factor": 2.0, "original_max_positions": 8}},
        {"kind": "rope", "scaling": {"type": "dynamic", "factor": 2.0, "original_max_positions": 8}},
        {"kind": "rope", "scaling": {"type": "proportional", "fraction": 0.5}},
        {"kind": "shaw", "values": True, "max_distance": 6},
    ]


def scheme_id(position):
    inner = position.get("inner", {}).get("kind", "")
    scaling = (position.get("scaling") or {}).get("type", "")
    return "-".join(p for p in (position["kind"], inner, scaling, "values" * bool(position.get("values"))) if p)


def hybrid(layers, position=None, *, n_layer=4, seed=0, **options):
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=53,
        n_layer=n_layer,
        n_head=2,
        d_model=16,
        block_size=24,
        position=position or {"kind": "rope"},
        layers=layers,
        **options,
    )
    model = GPT(config).eval()
    with torch.no_grad():  # learned sinks start at 0: give them values that matter
        for name, param in model.named_parameters():
            if name.endswith("sink_logits"):
                param.normal_(0, 1.5)
    return model


def cached_logits(model, ids, chunks, capacity):
    """The logits of ``ids`` fed through a cache of ``capacity`` in prefill ``chunks``, then a token at a time."""
    cache, out, start = model.new_cache(ids.shape[0], capacity), [], 0
    for size in chunks:
        out.append(model(ids[:, start : start + size], cache))
        start += size
    out += [model(ids[:, t : t + 1], cache) for t in range(start, ids.shape[1])]
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("position", layer_schemes(), ids=scheme_id)
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_cached_equals_uncached_past_every_window(pattern, position):
    """Prefill in chunks longer than every window (7, then 6), then single tokens to 22: the logits of
    every token equal the full sequence's, for each pattern with the scheme as model.position."""
    model = hybrid(PATTERNS[pattern], position)
    ids = torch.randint(0, 53, (2, 22))
    with torch.no_grad():
        full = model(ids)
        cached = cached_logits(model, ids, [7, 6], capacity=22)
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("position", layer_schemes(), ids=scheme_id)
@pytest.mark.parametrize("pattern", [p for p in PATTERNS if p != "uniform"])
def test_left_padded_rows_equal_each_row_alone(pattern, position):
    """Prompts of 9 and 14 tokens left-padded into one batch, decoded 6 steps: each row's logits equal
    that row run alone through the model, windows and chunks counted in the row's own positions."""
    if position.get("scaling", {}).get("type") == "dynamic":
        pytest.skip("dynamic NTK reads the context length: a row alone is processed at another one")
    model = hybrid(PATTERNS[pattern], position)
    rows = [torch.randint(0, 53, (n,)) for n in (15, 20)]  # prompt + 6 new tokens each
    prompts = [rows[0][:9], rows[1][:14]]
    padded = torch.stack([torch.cat([torch.zeros(5, dtype=torch.long), prompts[0]]), prompts[1]])
    with torch.no_grad():
        cache = model.new_cache(2, 20, offsets=[5, 0])
        last = [model(padded, cache)[:, -1]]
        for step in range(6):
            token = torch.stack([rows[0][9 + step], rows[1][14 + step]])[:, None]
            last.append(model(token, cache)[:, -1])
        for b, row in enumerate(rows):
            alone = model(row[None])[0]
            start = len(prompts[b]) - 1
            torch.testing.assert_close(torch.stack([x[b] for x in last]), alone[start : start + 7], atol=1e-5, rtol=0)


def test_a_window_hides_exactly_the_keys_it_should():
    """One layer with window 4: the logits at t move with the token at t - 3 and not with t - 4; with
    chunks of 4, they move with the first token of t's own chunk and not with the previous chunk's last."""
    ids = torch.randint(0, 53, (1, 12))
    t = 10
    for settings, seen, hidden in (({"window": 4}, t - 3, t - 4), ({"chunk": 4}, 8, 7)):
        model = hybrid({"pattern": ["only"], "only": settings}, {"kind": "none"}, n_layer=1)
        base = model(ids)[0, t]
        for position, moves in ((seen, True), (hidden, False)):
            other = ids.clone()
            other[0, position] = (other[0, position] + 1) % 53
            assert torch.allclose(model(other)[0, t], base) is not moves


def test_a_model_without_layers_is_the_model_it_was():
    """A uniform design keeps today's weight names, and a one-type pattern with nothing set computes
    exactly what no ``model.layers`` computes."""
    plain, same = hybrid(None), hybrid({"pattern": ["all"], "all": {}})
    assert list(plain.state_dict()) == list(same.state_dict())
    assert not any(name.startswith("layer_positions") or "sink" in name for name in plain.state_dict())
    ids = torch.randint(0, 53, (2, 20))
    assert torch.equal(plain(ids), same(ids))


def test_one_scheme_per_distinct_setting():
    """Two layer types with the same position setting share one module (one set of T5 buckets)."""
    t5 = {"kind": "t5"}
    model = hybrid({"pattern": ["a", "b", "c"], "a": {"position": t5, "window": 4}, "b": {"position": t5}, "c": {}})
    assert list(model.layer_positions) == ["a"]
    assert model.layer_schemes[0] is model.layer_schemes[1] is model.layer_positions["a"]
    assert model.layer_schemes[2] is model.positions


def test_learned_sinks_match_gpt_oss_attention():
    """``attend`` with learned sinks over a sliding window equals transformers' GPT-OSS eager attention."""
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    torch.manual_seed(0)
    B, H, T, D, W = 2, 4, 11, 8, 4
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    sinks = torch.randn(H)
    pos = torch.arange(T, dtype=torch.float32)
    ours = attend(
        q,
        k,
        v,
        pos,
        pos,
        scheme_class("none")(d_model=32, n_head=H, block_size=T),
        cached=False,
        window=None,
        layer=LayerType("sliding", {"kind": "none"}, window=W),
        sink_logits=sinks,
    )
    distance = pos[:, None] - pos[None, :]
    mask = torch.where((distance >= 0) & (distance < W), 0.0, float("-inf"))[None, None].expand(B, 1, T, T)
    module = torch.nn.Module()
    module.sinks, module.num_key_value_groups, module.training = sinks, 1, False
    theirs, _ = gpt_oss.eager_attention_forward(module, q, k, v, mask, scaling=D**-0.5, dropout=0.0)
    torch.testing.assert_close(ours.transpose(1, 2), theirs, atol=1e-5, rtol=0)


def test_query_scale_matches_ministral3_and_llama4():
    """``query_scale`` with offset 0 is Ministral 3's ``get_llama_4_attn_scale``; offset 1 is Llama 4's
    log1p(floor((p + 1) / floor)) * beta + 1, i.e. Ministral's at p + 1."""
    ministral = pytest.importorskip("transformers.models.ministral3.modeling_ministral3")
    pos = torch.arange(0, 40000, 7, dtype=torch.float32)
    for offset in (0, 1):
        ours = query_scale_factor(pos, {"beta": 0.1, "floor": 8192.0, "offset": float(offset)})
        theirs = ministral.get_llama_4_attn_scale((pos + offset)[None], 0.1, 8192)[0, 0, :, 0]
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    assert query_scale_factor(torch.tensor([8191.0]), {"beta": 0.1, "floor": 8192.0, "offset": 1.0}) == pytest.approx(
        1 + 0.1 * math.log(2)
    )


def test_each_window_keeps_a_ring_of_its_own():
    """A 5:1 local/global model at a context 8x its window holds the local layers' last W keys only:
    (5 W + 8 W) / (6 x 8 W) = 13/48 of the uniform model's cache."""
    design = {"pattern": ["local"] * 5 + ["global"], "local": {"window": 8}, "global": None}
    uniform, local = hybrid(None, n_layer=6), hybrid(design, n_layer=6)
    caches = [m.new_cache(1, 64) for m in (uniform, local)]
    assert [local_cache.capacity_of(i) for i, local_cache in enumerate([caches[1]] * 6)] == [8] * 5 + [64]
    assert caches[1].nbytes() * 48 == caches[0].nbytes() * 13


@pytest.mark.parametrize("pattern", [p for p in PATTERNS if p != "uniform"])
def test_the_lean_decode_step_equals_the_model_bit_for_bit(pattern):
    model = hybrid(PATTERNS[pattern])
    ids = torch.randint(0, 53, (2, 22))
    with torch.no_grad():
        cache = model.new_cache(2, 22)
        model(ids[:, :6], cache)
        expected = [model(ids[:, t : t + 1], cache) for t in range(6, 22)]
        cache, lean = model.new_cache(2, 22), lean_body(model)
        model(ids[:, :6], cache, body=lean)
        got = [model(ids[:, t : t + 1], cache, body=lean) for t in range(6, 22)]
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


def test_a_rolling_cache_with_sinks_and_layer_windows():
    """A stream (rolling cache of 10, 2 sinks at absolute positions) over a 3-local/1-global model
    equals the full pass with the same window and sinks."""
    model = hybrid(PATTERNS["3local-1global-none"])
    ids = torch.randint(0, 53, (1, 30))
    with torch.no_grad():
        full = model(ids, window=10, sinks=2, sink_positions="absolute")
        cache = model.new_cache(1, 10, rolling=True, sinks=2, sink_positions="absolute")
        stepped = torch.cat([model(ids[:, t : t + 1], cache) for t in range(30)], dim=1)
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="windows or chunks of their own"):
        model.new_cache(1, 10, rolling=True, sinks=2)


BAD = [
    ({"pattern": "local"}, "model.layers.pattern='local' is invalid: expected a list of layer type names"),
    ({"local": {"window": 4}}, "expected a mapping with a 'pattern'"),
    (
        {"pattern": ["local", "globl"], "local": {}, "global": {}},
        "names 'globl', which model.layers does not define: did you mean global",
    ),
    ({"pattern": ["local"], "local": {}, "global": {}}, "model.layers.global is not in model.layers.pattern"),
    ({"pattern": ["a"], "a": {"windows": 4}}, "model.layers.a: unknown key 'windows'.*window"),
    ({"pattern": ["a"], "a": {"window": 0}}, "model.layers.a.window=0 is invalid: expected an integer from 1"),
    ({"pattern": ["a"], "a": {"chunk": 2.5}}, "model.layers.a.chunk=2.5 is invalid"),
    ({"pattern": ["a"], "a": {"sinks": "yes"}}, "model.layers.a.sinks='yes' is invalid: valid: learned"),
    ({"pattern": ["a"], "a": {"softcap": -1}}, "model.layers.a.softcap=-1 is invalid: expected 0 .off. or a number"),
    ({"pattern": ["a"], "a": {"query_scale": {"beta": 0.1}}}, "model.layers.a.query_scale needs beta and floor"),
    ({"pattern": ["a"], "a": {"position": {"kind": "ropee"}}}, "unknown position kind 'ropee'"),
]


@pytest.mark.parametrize("layers, message", BAD, ids=[m[:30] for _, m in BAD])
def test_bad_designs_are_one_line(layers, message):
    with pytest.raises(ConfigError, match=message) as error:
        ModelConfig(n_layer=2, layers=layers)
    assert "\n" not in str(error.value)


def test_a_pattern_longer_than_the_model_is_refused_where_a_run_starts_and_loads_where_one_was_saved():
    """A type only past the model's last layer would never be used: a run built from scratch is refused in
    one line; a model (or a checkpoint's config) built so before the check still builds as the model it is."""
    layers = {"pattern": ["local", "local", "local", "global"], "local": {"window": 4}, "global": {}}
    config = build_config({"model": {"n_layer": 2, "layers": layers}})
    with pytest.raises(ConfigError, match="longer than model.n_layer=2: no layer would be of type global") as e:
        starting_config(config)
    assert "\n" not in str(e.value)
    assert [t.name for t in GPT(config.model).layer_types] == ["local", "local"]


def test_the_design_label_counts_the_models_layers():
    """describe_design counts the layers the model has (two passes of the pattern here), not the pattern's names."""
    layers = {"pattern": ["local", "global"], "local": {"window": 4}, "global": {"position": {"kind": "none"}}}
    assert describe_design({"kind": "rope"}, layers, 4) == "rope; local x2 window=4, global x2 none"
    longer = {"pattern": ["local", "global", "local", "global"], "local": {"window": 4}, "global": {}}
    assert describe_design({"kind": "rope"}, longer, 2) == "rope; local window=4, global as model.position"


def test_a_layer_type_cannot_embed_positions():
    tree = {"model": {"layers": {"pattern": ["a"], "a": {"position": {"kind": "learned"}}}}}
    with pytest.raises(ConfigError, match="model.layers.a.position is learned, which adds positions to the emb"):
        build_config(tree)
    tree = {"model": {"layers": {"pattern": ["a"], "a": {"position": {"kind": "rope", "base": 0.5}}}}}
    with pytest.raises(ConfigError, match="model.layers: rope: base=0.5 is invalid"):
        build_config(tree)


def test_a_scheme_with_only_a_value_term_is_not_skipped():
    """``attend`` takes the written-out path for a value term without a bias (it looked at the bias alone)."""

    class ValuesOnly(scheme_class("none")):
        has_value_term = True

        def value_term(self, weights, q_pos, k_pos):
            return torch.ones(*weights.shape[:3], 4)

    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    pos = torch.arange(5.0)
    plain = attend(
        q, k, v, pos, pos, scheme_class("none")(d_model=8, n_head=2, block_size=8), cached=False, window=None
    )
    added = attend(q, k, v, pos, pos, ValuesOnly(d_model=8, n_head=2, block_size=8), cached=False, window=None)
    torch.testing.assert_close(added, plain + 1)


@pytest.mark.parametrize("pattern", ["3local-1global-none", "sliding-full-learned-sinks", "rope-bases"])
def test_windows_in_chunks_of_queries_over_their_bands(pattern, monkeypatch):
    """A windowed layer's queries in chunks as wide as its window, each over its band of keys, give the
    logits and the attention weights of one chunk over every key; documents (end-of-text) too."""
    model = hybrid(PATTERNS[pattern], {"kind": "alibi"})
    ids = torch.randint(0, 53, (2, 22))
    ids[:, 9] = 0
    with torch.no_grad():
        whole = [model(ids, weights_of=0), model(ids, end_of_text=0, restart_positions=True)]
        monkeypatch.setattr("minilm.model.attention.WINDOW_CHUNK", 1)
        banded = [model(ids, weights_of=0), model(ids, end_of_text=0, restart_positions=True)]
    for a, b in zip((*whole[0], whole[1]), (*banded[0], banded[1])):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_a_model_position_that_no_layer_uses_is_refused_where_it_has_parameters():
    """Every layer type sets its own position: a t5 model.position's table would never train (and DDP fails
    on it), refused in one line; a rope one has no parameters, and learned positions act on the embeddings."""
    layers = {"pattern": ["a"], "a": {"position": {"kind": "none"}}}
    with pytest.raises(ConfigError, match=r"model.position \(t5\) is no layer's, and its parameters would never"):
        build_config({"model": {"position": {"kind": "t5"}, "layers": layers}})
    for kind in ("rope", "learned"):
        build_config({"model": {"position": {"kind": kind}, "layers": layers}})
