"""The families people extend today, both ways: Qwen3 (q/k norms, head_dim apart from the
width; sliding layers by layer_types, as Qwen2's from max_window_layers and Mistral's on every layer),
SmolLM3 in (NoPE layers, its sliding ones), Cohere2 in (a parallel block, interleaved RoPE
beside global NoPE layers, logit_scale), Phi-3 (fused projections, partial rotary, LongRoPE with
transformers' switch between its factors) and MPT (ALiBi), random weights in temporary directories. Logits must equal
transformers' to 1e-4 in float32 with and without the KV cache, and greedy text 20 tokens
past the original context must be transformers'. Every shipped config trains and exports, or
is refused in one line."""

import json
import os

import pytest
import torch

from tests import test_hf
from tests.conftest import REPO, tiny_overrides
from tests.test_hf import TOLERANCE, cached_logits, greedy_both, hf_model_dir, import_matches, minilm_checkpoint, tokens

transformers = pytest.importorskip("transformers")

from minilm.checkpoints.loading import load_model  # noqa: E402
from minilm.generation.decode import Sampling, generate_ids  # noqa: E402
from minilm.hf.export import export_model  # noqa: E402
from minilm.hf.family import HFError  # noqa: E402
from minilm.hf.reading import read_model_tree  # noqa: E402
from tests.forkrun import run_python  # noqa: E402

ORIGINAL = 16  # the original context of the LongRoPE cases; sequences of 40 pass it
LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "short_factor": [1.0, 1.1, 1.3, 1.6],
    "long_factor": [1.5, 2.5, 4.0, 7.0],
    "original_max_position_embeddings": ORIGINAL,
}

FAMILY_CASES = {
    "qwen3-gqa-tied-head-dim": lambda v: transformers.Qwen3Config(
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    ),
    "qwen3-untied-yarn": lambda v: transformers.Qwen3Config(
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 2.0,
            "original_max_position_embeddings": 32,
        },
    ),
    "qwen3-longrope": lambda v: transformers.Qwen3Config(
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        rope_parameters=dict(LONGROPE),
    ),
    "phi3-gqa-untied": lambda v: transformers.Phi3Config(
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        original_max_position_embeddings=64,
        tie_word_embeddings=False,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    ),
    "phi3-longrope-tied": lambda v: transformers.Phi3Config(
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        original_max_position_embeddings=ORIGINAL,
        tie_word_embeddings=True,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        rope_parameters=dict(LONGROPE),
    ),
    "phi3-longrope-partial": lambda v: transformers.Phi3Config(
        vocab_size=v,
        hidden_size=64,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        original_max_position_embeddings=ORIGINAL,
        partial_rotary_factor=0.5,
        tie_word_embeddings=False,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        rope_parameters={**LONGROPE, "attention_factor": 1.3, "partial_rotary_factor": 0.5},
    ),
    "mistral-sliding": lambda v: transformers.MistralConfig(
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=8,
        tie_word_embeddings=False,
    ),
    "qwen2-sliding-from-max-window-layers": lambda v: transformers.Qwen2Config(
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=1,
        tie_word_embeddings=False,
    ),
    "qwen3-layer-types": lambda v: transformers.Qwen3Config(
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        use_sliding_window=True,
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        tie_word_embeddings=False,
    ),
    "smollm3-nope-every-2nd": lambda v: transformers.SmolLM3Config(
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        no_rope_layer_interval=2,
        tie_word_embeddings=True,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    ),
    "smollm3-sliding-nope": lambda v: transformers.SmolLM3Config(
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        no_rope_layers=[1, 0],
        use_sliding_window=True,
        sliding_window=8,
        tie_word_embeddings=False,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    ),
    "gemma2-softcaps-gqa": lambda v: transformers.Gemma2Config(  # window 4: the prompts are 10 tokens or more
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=4,
        query_pre_attn_scalar=12,  # not head_dim: the scale folded into the queries
        attn_logit_softcapping=3.0,
        final_logit_softcapping=4.0,
        tie_word_embeddings=False,  # tied, a random model's greedy text repeats its input (below: tied logits)
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    ),
    "gemma3-text-two-bases-untied": lambda v: transformers.Gemma3TextConfig(
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        },
        tie_word_embeddings=False,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    ),
    "exaone4-lllg-gqa": lambda v: transformers.Exaone4Config(  # 3 local RoPE layers in a window of 4, 1 global NoPE
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=4,
        sliding_window_pattern=4,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    ),
    "exaone4-no-window-tied": lambda v: transformers.Exaone4Config(  # no window: RoPE and full attention everywhere
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        sliding_window=None,  # (with a sliding_attention layer transformers' own cache cannot be made)
        layer_types=["full_attention", "full_attention"],
        tie_word_embeddings=True,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    ),
    "olmo3-yarn-on-full-layers": lambda v: transformers.Olmo3Config(  # 3 sliding : 1 full, YaRN on the full
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=4,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    ),
    "ministral3-query-scale-yarn": lambda v: transformers.Ministral3Config(  # the scale grows every 4 positions
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=None,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 4,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "llama_4_scaling_beta": 0.5,
        },
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    ),
    "cohere2-lllg-gqa-tied": lambda v: transformers.Cohere2Config(  # 3 local RoPE (interleaved) : 1 global NoPE
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=4,
        logit_scale=0.25,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    ),
    "cohere2-untied-base": lambda v: transformers.Cohere2Config(  # untied, another base, layer_types given
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        tie_word_embeddings=False,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    ),
    "mpt-tied": lambda v: transformers.MptConfig(
        vocab_size=v, d_model=32, n_heads=4, n_layers=2, max_seq_len=64, expansion_ratio=4, tie_word_embeddings=True
    ),
    "mpt-untied-8-heads": lambda v: transformers.MptConfig(
        vocab_size=v, d_model=32, n_heads=8, n_layers=2, max_seq_len=64, expansion_ratio=4, tie_word_embeddings=False
    ),
}
LONGROPE_CASES = sorted(c for c in FAMILY_CASES if "longrope" in c)


@pytest.fixture(autouse=True)
def family_cases(monkeypatch):
    """``hf_model_dir`` of tests/test_hf.py builds these cases too."""
    monkeypatch.setattr(test_hf, "HF_CASES", {**test_hf.HF_CASES, **FAMILY_CASES})


def reference_cached_logits(reference, ids, prefill):
    """transformers' logits with its own KV cache: ``prefill`` tokens, then one at a time."""
    out = reference(ids[:, :prefill], use_cache=True)
    parts, past = [out.logits], out.past_key_values
    for t in range(prefill, ids.shape[1]):
        out = reference(ids[:, t : t + 1], past_key_values=past, use_cache=True)
        parts.append(out.logits)
        past = out.past_key_values
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("case", sorted(FAMILY_CASES))
def test_imported_family_matches_transformers_cached_and_uncached(case, hf_tokenizer_dir, tmp_path):
    reference, loaded = import_matches(case, hf_tokenizer_dir, tmp_path)
    # the model's architecture is what the config says, not a near miss that rounds alike
    cfg, m = reference.config, loaded.config.model
    assert (m.n_kv_head or m.n_head) == getattr(cfg, "num_key_value_heads", None) or cfg.model_type == "mpt"
    if cfg.model_type == "qwen3":
        assert m.qk_norm and m.head_dim == cfg.head_dim


def test_a_tied_gemma_with_transformers_defaults_matches(hf_tokenizer_dir, tmp_path, monkeypatch):
    """Gemma 2 as its config class leaves it: tied embeddings, soft-caps 50 and 30, query_pre_attn_scalar
    256, alternating layers (a tied random Gemma's greedy text only repeats its input: logits alone)."""
    case = lambda v: transformers.Gemma2Config(  # noqa: E731
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
        sliding_window=6,
    )
    monkeypatch.setitem(test_hf.HF_CASES, "gemma2-defaults", case)
    _, loaded = import_matches("gemma2-defaults", hf_tokenizer_dir, tmp_path)
    m = loaded.config.model
    assert m.tie_embeddings and m.logit_softcap == 30.0 and m.layers["sliding"] == {"window": 6, "softcap": 50.0}


@pytest.mark.parametrize("case", sorted(FAMILY_CASES))
def test_greedy_text_past_the_original_context_is_transformers(case, hf_tokenizer_dir, tmp_path):
    """A 10-token prompt and 20 new tokens: past the LongRoPE cases' original 16 positions, where
    transformers switches to the long factors for the new tokens only."""
    reference, directory = hf_model_dir(case, hf_tokenizer_dir, tmp_path)
    model = load_model(str(directory)).model
    prompt = tokens(n=10)[:1]
    with torch.no_grad():
        theirs = reference.generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)[
            0, 10:
        ].tolist()
        ours = [
            int(t) for t in generate_ids(model, prompt[0].tolist(), max_new_tokens=20, sampling=Sampling(temperature=0))
        ]
    assert ours == theirs and len(set(ours)) > 2


@pytest.mark.parametrize("case", LONGROPE_CASES)
def test_longrope_switches_as_transformers_does_with_a_cache(case, hf_tokenizer_dir, tmp_path):
    """transformers picks LongRoPE's factors in each forward pass by its largest position: a
    10-token prefill is rotated with the short factors, the tokens after position 16 with the
    long ones, and the cached keys keep the short rotation. The imported model (``switch:
    positions``) does the same, so its cached logits are transformers' cached logits and differ
    from the uncached ones past the original context; minilm's own ``switch: context`` picks by
    the generation's length instead and is cached == uncached."""
    reference, directory = hf_model_dir(case, hf_tokenizer_dir, tmp_path)
    ids = tokens()
    loaded = load_model(str(directory))
    assert loaded.config.model.position["scaling"]["switch"] == ("refill" if case.startswith("phi3") else "positions")
    with torch.no_grad():
        theirs = reference_cached_logits(reference, ids, prefill=10)
        ours = cached_logits(loaded.model, ids, prefill=10)
        assert (ours - theirs).abs().max() < TOLERANCE
        uncached = reference(ids).logits
        assert (ours[:, ORIGINAL:] - uncached[:, ORIGINAL:]).abs().max() > 1e-2  # stale short keys, as theirs
        scaling = {**loaded.config.model.position["scaling"], "switch": "context"}
        ours_context = load_model(str(directory), [f"model.position.scaling={scaling}"]).model
        assert (cached_logits(ours_context, ids, prefill=10) - uncached).abs().max() < TOLERANCE


@pytest.mark.parametrize("case", [c for c in LONGROPE_CASES if c.startswith("phi3")])
def test_phi3_generation_refills_its_cache_past_the_original_context(case, hf_tokenizer_dir, tmp_path):
    """transformers' Phi-3 ``generate`` drops its cache at the step that passes the original
    length, so every key is rotated with the long factors after it: greedy text equals the
    uncached model's, step by step. With ``switch: positions`` (the stale keys kept) it differs."""
    _, directory = hf_model_dir(case, hf_tokenizer_dir, tmp_path)
    prompt = tokens(n=10)[0].tolist()
    greedy = dict(max_new_tokens=20, sampling=Sampling(temperature=0))
    with torch.no_grad():
        refill = load_model(str(directory)).model
        ours = [int(t) for t in generate_ids(refill, prompt, **greedy)]
        assert ours == [int(t) for t in generate_ids(refill, prompt, use_cache=False, **greedy)]
        scaling = {**load_model(str(directory)).config.model.position["scaling"], "switch": "positions"}
        stale = load_model(str(directory), [f"model.position.scaling={scaling}"]).model
        assert [int(t) for t in generate_ids(stale, prompt, **greedy)] != ours


GEMMA = dict(sublayer_norms="sandwich", mlp="geglu_tanh", norm="rmsnorm", embedding_scale="sqrt_d_model")
EXAONE = dict(
    position={"kind": "rope"}, sublayer_norms="post", qk_norm=True, norm="rmsnorm", mlp="swiglu", tie_embeddings=False
)
EXPORT_FAMILY_CASES = {  # minilm model settings, the family asked for (None: the first that takes it) -> model_type
    "rope-qwen3-gqa-head-dim": (
        dict(
            position={"kind": "rope", "base": 1e6}, norm="rmsnorm", mlp="swiglu", qk_norm=True, n_kv_head=2, head_dim=16
        ),
        None,
        "qwen3",
    ),
    "rope-qwen3-untied-yarn": (
        dict(
            position={"kind": "rope", "scaling": {"type": "yarn", "factor": 2, "original_max_positions": 16}},
            norm="rmsnorm",
            mlp="swiglu",
            qk_norm=True,
            tie_embeddings=False,
        ),
        None,
        "qwen3",
    ),
    "rope-phi3-longrope-partial": (
        dict(
            position={
                "kind": "rope",
                "rotary_fraction": 0.5,
                "scaling": {
                    "type": "longrope",
                    "original_max_positions": 8,
                    "short_factor": [1.0, 1.5],
                    "long_factor": [2.0, 5.0],
                    "switch": "refill",
                },
            },
            norm="rmsnorm",
            mlp="swiglu",
            n_kv_head=2,
            tie_embeddings=False,
        ),
        "phi3",
        "phi3",
    ),
    "rope-phi3-tied": (dict(position={"kind": "rope"}, norm="rmsnorm", mlp="swiglu"), "phi3", "phi3"),
    "alibi-mpt-untied": (dict(position={"kind": "alibi"}, tie_embeddings=False), None, "mpt"),
    "rope-smollm3-nope-layers": (
        dict(
            position={"kind": "rope"},
            norm="rmsnorm",
            mlp="swiglu",
            n_kv_head=2,
            tie_embeddings=False,
            layers={"pattern": ["rope", "nope"], "rope": {}, "nope": {"position": {"kind": "none"}}},
        ),
        None,
        "smollm3",
    ),
    "rope-smollm3-sliding-nope": (
        dict(
            position={"kind": "rope"},
            norm="rmsnorm",
            mlp="swiglu",
            tie_embeddings=False,
            layers={"pattern": ["rope", "nope"], "rope": {}, "nope": {"position": {"kind": "none"}, "window": 4}},
        ),
        None,
        "smollm3",
    ),
    "rope-exaone4-local-global-nope": (
        dict(
            EXAONE,
            n_kv_head=2,
            layers={"pattern": ["local", "global"], "local": {"window": 4}, "global": {"position": {"kind": "none"}}},
        ),
        None,
        "exaone4",
    ),
    "rope-exaone4-uniform": (dict(EXAONE, tie_embeddings=True), None, "exaone4"),
    "rope-olmo3-sliding-yarn-full": (
        dict(
            EXAONE,
            qk_norm_span="projection",
            n_kv_head=2,
            position={"kind": "rope", "scaling": {"type": "yarn", "factor": 4, "original_max_positions": 16}},
            layers={
                "pattern": ["local", "global"],
                "local": {"window": 4, "position": {"kind": "rope"}},
                "global": {},
            },
        ),
        None,
        "olmo3",
    ),
    "rope-gemma3-uniform": (
        dict(GEMMA, position={"kind": "rope", "base": 5e5}, qk_norm=True, tie_embeddings=False),
        None,
        "gemma3_text",
    ),
    "rope-olmo3-uniform": (dict(EXAONE, qk_norm_span="projection"), None, "olmo3"),
    "rope-gemma3-two-bases": (
        dict(
            GEMMA,
            position={"kind": "rope", "base": 1e6, "scaling": {"type": "linear", "factor": 4}},
            qk_norm=True,
            n_kv_head=2,
            tie_embeddings=False,
            layers={"pattern": ["local", "global"], "local": {"window": 5, "position": {"kind": "rope"}}, "global": {}},
        ),
        None,
        "gemma3_text",
    ),
    "rope-gemma2-softcaps-untied": (
        dict(
            GEMMA,
            position={"kind": "rope"},
            logit_softcap=5.0,
            tie_embeddings=False,
            layers={"pattern": ["sliding", "full"], "sliding": {"window": 4, "softcap": 8.0}, "full": {"softcap": 8.0}},
        ),
        None,
        "gemma2",
    ),
    "rope-qwen3-sliding-layers": (
        dict(
            position={"kind": "rope"},
            norm="rmsnorm",
            mlp="swiglu",
            qk_norm=True,
            tie_embeddings=False,
            layers={"pattern": ["sliding", "full"], "sliding": {"window": 5}, "full": {}},
        ),
        None,
        "qwen3",
    ),
}


def test_an_imported_phi3_longrope_goes_back_out_as_phi3(hf_tokenizer_dir, tmp_path):
    """Phi-3 refills its cache past the original length (``switch: refill``); Llama's code keeps the stale
    keys, so the re-export is written as Phi-3, and greedy text past the original length stays Phi-3's."""
    _, directory = hf_model_dir("phi3-longrope-tied", hf_tokenizer_dir, tmp_path)
    loaded = load_model(str(directory))
    assert export_model(loaded.model, loaded.tokenizer, loaded.config, str(tmp_path / "back"))["family"] == "phi3"
    ours, theirs = greedy_both(load_model(str(tmp_path / "back")), tmp_path / "back")
    assert ours == theirs


@pytest.mark.parametrize("case", sorted({**test_hf.HF_CASES, **FAMILY_CASES}))
def test_keys_a_config_leaves_out_are_read_as_transformers_fills_them(case, tmp_path):
    """config.json without rope_theta, partial rotary or tie_word_embeddings: each family's transformers
    config class fills them (GPT-NeoX turns a quarter of the head, SmolLM3's base is 2,000,000, Gemma and
    SmolLM3 tie), and minilm reads what it fills."""
    (tmp_path / "config.json").write_text({**test_hf.HF_CASES, **FAMILY_CASES}[case](300).to_json_string())
    hf = json.loads((tmp_path / "config.json").read_text())
    params = hf.get("rope_parameters") or {}
    gone = ("rope_theta", "rotary_emb_base", "tie_word_embeddings") + (
        () if params.get("rope_type") == "longrope" else ("partial_rotary_factor", "rotary_pct")
    )  # LongRoPE's factors are as many as the pairs its partial rotary turns
    for where in [hf] + ([params] if params.get("rope_type") not in (None, "proportional") else []):
        for key in gone:
            where.pop(key, None)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    reference = transformers.AutoConfig.from_pretrained(tmp_path)
    model = read_model_tree(str(tmp_path))[2]
    assert model["tie_embeddings"] == reference.tie_word_embeddings
    rope = getattr(reference, "rope_parameters", None)
    if rope and model["position"]["kind"] == "rope":
        rope = rope.get("full_attention", rope)  # per layer type: the full layers' are model.position
        turned = rope.get("partial_rotary_factor", 1.0) if reference.model_type in ("gpt_neox", "phi3") else 1.0
        assert model["position"]["base"] == rope["rope_theta"]
        assert model["position"]["rotary_fraction"] == turned or rope.get("rope_type") == "proportional"


@pytest.mark.parametrize("case", sorted(EXPORT_FAMILY_CASES))
def test_exported_family_loads_in_transformers_and_comes_back(case, gen_tokenizer, tmp_path):
    settings, family, model_type = EXPORT_FAMILY_CASES[case]
    model = minilm_checkpoint(settings, gen_tokenizer, tmp_path / "ckpt.pt")
    loaded = load_model(str(tmp_path / "ckpt.pt"))
    done = export_model(loaded.model, loaded.tokenizer, loaded.config, str(tmp_path / "hf"), family=family)
    assert done["family"] == model_type
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    assert reference.config.model_type == model_type
    ids = tokens(n=32, vocab_size=gen_tokenizer.vocab_size)
    back = load_model(str(tmp_path / "hf")).model  # read back as minilm: the same model again
    with torch.no_grad():
        assert (reference(ids).logits - model(ids)).abs().max() < TOLERANCE
        assert (back(ids) - model(ids)).abs().max() < TOLERANCE
        prompt = ids[0, :6].tolist()
        ours = [int(t) for t in generate_ids(model, prompt, max_new_tokens=20, sampling=Sampling(temperature=0))]
        reference.generation_config.eos_token_id = None
        theirs = reference.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, pad_token_id=0)[
            0, 6:
        ].tolist()
    assert ours == theirs and len(set(ours)) > 2


@pytest.mark.parametrize(
    "settings, family, message",
    [
        (
            dict(position={"kind": "rope"}, norm="rmsnorm", mlp="swiglu", qk_norm=True, qkv_bias=True),
            None,
            "cannot export as Qwen3",
        ),
        (
            dict(position={"kind": "rope"}, norm="rmsnorm", mlp="swiglu", qk_norm=True),
            "phi3",
            "cannot be written as Phi-3: it exports as llama",
        ),
        (  # transformers' Llama turns the whole head: part of it turned goes out as Phi-3, which turns part
            dict(position={"kind": "rope", "rotary_fraction": 0.5}, norm="rmsnorm", mlp="swiglu"),
            "llama",
            r"cannot be written as Llama \(rotary_fraction=0.5: transformers' Llama turns the whole head\): it exports "
            "as phi3",
        ),
        (
            dict(position={"kind": "rope", "rotary_fraction": 0.5}, norm="rmsnorm", mlp="swiglu", qk_norm=True),
            None,
            r"no transformers family runs this model's rope as minilm does \(llama: rotary_fraction=0.5",
        ),
        (  # minilm's default LongRoPE switch (at the context length) is no transformers family's
            dict(
                position={
                    "kind": "rope",
                    "scaling": {
                        "type": "longrope",
                        "original_max_positions": 8,
                        "short_factor": [1.0, 1.1, 1.3, 1.5],
                        "long_factor": [2.0, 3.0, 4.0, 5.0],
                    },
                },
                norm="rmsnorm",
                mlp="swiglu",
            ),
            None,
            r"\(llama: LongRoPE with scaling.switch=context: transformers' Llama switches its factors as switch "
            "positions does; phi3: LongRoPE with scaling.switch=context",
        ),
        (
            dict(position={"kind": "rope"}),
            "gpt5",
            "family 'gpt5' is unknown: did you mean gpt2, mpt, gpt_neox",
        ),
        (
            dict(
                EXAONE,
                qk_norm_span="projection",
                position={"kind": "rope", "scaling": {"type": "yarn", "factor": 2, "truncate": False}},
                layers={"pattern": ["local", "global"], "local": {"window": 4}, "global": {}},
            ),
            None,
            "cannot export as OLMo 3: the sliding_attention layers' yarn has truncate: false",
        ),
        (
            dict(
                GEMMA, position={"kind": "rope"}, layers={"pattern": ["a", "b"], "a": {"window": 4}, "b": {"window": 6}}
            ),
            None,
            "cannot export as Gemma 2: its model.layers is more than sliding layers of one window",
        ),
        (dict(position={"kind": "rope"}, head_dim=16), None, "model.head_dim=16 has no GPT-NeoX equivalent"),
    ],
)
def test_a_family_that_cannot_hold_the_model_is_refused(settings, family, message, gen_tokenizer, tmp_path):
    minilm_checkpoint(settings, gen_tokenizer, tmp_path / "ckpt.pt")
    loaded = load_model(str(tmp_path / "ckpt.pt"))
    with pytest.raises(HFError, match=message) as info:
        export_model(loaded.model, loaded.tokenizer, loaded.config, str(tmp_path / "hf"), family=family)
    assert "\n" not in str(info.value) and not (tmp_path / "hf").exists()


@pytest.mark.parametrize(
    "case, change, message",
    [
        ("mpt-tied", {"attn_config": {"clip_qkv": 6.0}}, "MPT attention settings {'clip_qkv': 6.0} are not supported"),
        ("mpt-tied", {"attn_config": {"alibi_bias_max": 16}}, "alibi_bias_max"),
        ("phi3-gqa-untied", {"sliding_window": 8}, "sliding_window=8 is not supported"),
        ("gemma2-softcaps-gqa", {"use_bidirectional_attention": True}, "use_bidirectional_attention=true is not"),
        ("gemma2-softcaps-gqa", {"hidden_activation": "relu"}, "hidden_activation='relu' is not supported for gemma2"),
        ("gemma2-softcaps-gqa", {"layer_types": ["sliding_attention", "chunked_attention"]}, "layer_types="),
        ("gemma2-softcaps-gqa", {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar=0 is invalid: expected a number"),
        ("cohere2-untied-base", {"sliding_window": None}, "sliding_window=null is not supported for cohere2"),
        ("cohere2-untied-base", {"attention_bias": True}, "attention_bias=true is not supported for Cohere2"),
        ("cohere2-untied-base", {"hidden_act": "gelu"}, "hidden_act='gelu' is not supported for cohere2"),
        # issue 59: a count of 0 is refused, never read as absent; a setting's mapping that is none
        ("phi3-gqa-untied", {"num_key_value_heads": 0}, "num_key_value_heads=0 is invalid: expected an integer >= 1"),
        ("phi3-longrope-tied", {"original_max_position_embeddings": 0}, "original_max_position_embeddings=0 is"),
        ("phi3-gqa-untied", {"sliding_window": 0}, "sliding_window=0 is invalid"),
        ("gpt2", {"n_inner": 0}, "n_inner=0 is invalid: expected an integer >= 1, or leave it out \\(4 n_embd\\)"),
        ("gemma2-softcaps-gqa", {"sliding_window_pattern": 0}, "sliding_window_pattern=0 is invalid"),
        ("smollm3-nope-every-2nd", {"no_rope_layer_interval": 0, "no_rope_layers": None}, "no_rope_layer_interval=0"),
        ("smollm3-nope-every-2nd", {"no_rope_layers": []}, "no_rope_layers=\\[\\] is invalid: expected a list of 4"),
        (
            "ministral3-query-scale-yarn",
            {"rope_parameters": {"original_max_position_embeddings": 0}},
            "rope_parameters.original_max_position_embeddings=0 is invalid",
        ),
        ("mpt-tied", {"n_heads": 0}, "n_heads=0 is invalid"),
        ("mpt-tied", {"attn_config": "alibi"}, "attn_config='alibi' is invalid: expected a mapping"),
    ],
)
def test_unsupported_family_settings_are_one_line_errors(case, change, message, hf_tokenizer_dir, tmp_path):
    import json

    _, directory = hf_model_dir(case, hf_tokenizer_dir, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    for key, value in change.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFError, match=message) as info:
        load_model(str(directory))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "case, tensor",
    [
        ("phi3-gqa-untied", "model.layers.0.self_attn.qkv_proj.weight"),  # split into q, k, v on the way in
        ("gemma2-softcaps-gqa", "model.layers.1.post_feedforward_layernorm.weight"),  # read as 1 + w in float32
        ("cohere2-untied-base", "model.norm.weight"),  # multiplied by logit_scale on the way in
        ("mpt-tied", "transformer.blocks.0.attn.Wqkv.weight"),
    ],
)
def test_a_damaged_weight_is_refused_by_its_file_name_in_every_family(case, tensor, hf_tokenizer_dir, tmp_path):
    """The weights are checked as they are read, before a family splits, shifts or scales them: a NaN
    and an integer tensor (which 1 + w or a scale would cast without a word) are refused by the name
    they have in the file (issue 59)."""
    from safetensors.torch import load_file, save_file

    _, directory = hf_model_dir(case, hf_tokenizer_dir, tmp_path)
    tensors = load_file(directory / "model.safetensors")
    for damaged, message in (
        (tensors[tensor] * float("nan"), "with NaN or infinite values"),
        (tensors[tensor].to(torch.int32), "as int32: expected floating point"),
    ):
        save_file({**tensors, tensor: damaged}, directory / "model.safetensors")
        with pytest.raises(HFError, match=f"model.safetensors holds tensor '{tensor}' {message}") as info:
            load_model(str(directory))
        assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- every shipped config

SHIPPED = sorted(
    name
    for name in os.listdir(os.path.join(REPO, "minilm", "configs"))
    if not name.startswith("extend") and not name.endswith("_shape.yaml")
)
EXPORTS = {"rope.yaml": "qwen3", "learned.yaml": "gpt2", "alibi.yaml": "mpt"}
# the per-layer configs train one pass of their pattern of 4 (a shorter model is refused: a type unused):
# NoPE layers beside q/k norms, which no transformers family holds (SmolLM3 has NoPE layers, no q/k norms)
PATTERN_OF_4 = ("rnope_swa.yaml", "smollm3_nope.yaml")


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_trains_and_exports_or_is_refused(name, tiny_corpus, tmp_path):
    """The shipped configs' own layout (norms, MLP, q/k norms, positions) at the tiny size, a few
    steps, then ``minilm export``: the exportable kinds load in transformers with no custom code
    and generate minilm's greedy text; the others get one line naming the kinds that export."""
    env = {**os.environ, "PYTHONPATH": REPO}
    tiny = tiny_overrides(
        tiny_corpus,
        tmp_path / "run",
        "train.max_steps=3",
        "train.eval_interval=3",
        "train.sample_tokens=0",
        "train.final_eval_tokens=0",
        "model.n_head=4",
        *(["model.n_layer=4"] if name in PATTERN_OF_4 else []),
    )
    train = run_python(["-m", "minilm", "train", "--config", name, *tiny], cwd=tmp_path, env=env)
    assert train.returncode == 0, train.stderr[-2000:]
    result = run_python(["-m", "minilm", "export", tmp_path / "run", tmp_path / "hf"], cwd=tmp_path, env=env)
    if name not in EXPORTS:
        assert result.returncode == 2 and not (tmp_path / "hf").exists()
        lines = result.stderr.strip().splitlines()
        said = ("NoPE layers, which SmolLM3 holds",) if name in PATTERN_OF_4 else ("exportable: rope", "alibi (MPT)")
        assert len(lines) == 1 and all(s in lines[0] for s in said), result.stderr
        return
    assert result.returncode == 0, result.stderr[-2000:]
    assert transformers.AutoConfig.from_pretrained(tmp_path / "hf").model_type == EXPORTS[name]
    ours, theirs = greedy_both(load_model(str(tmp_path / "run")), tmp_path / "hf")
    assert ours == theirs


@pytest.mark.slow
def test_memory_counts_an_imported_familys_cache_per_layer_type(hf_tokenizer_dir, tmp_path):
    """``minilm memory`` reads a family's layer design from config.json alone (``train.init_from``):
    EXAONE 4's three local layers keep their window of keys, its global one the whole context."""
    _, directory = hf_model_dir("exaone4-lllg-gqa", hf_tokenizer_dir, tmp_path)
    done = run_python(
        ["-m", "minilm", "memory", "rope.yaml", f"train.init_from={directory}", "--context", "64"], cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert "| local | 3 | 4 |" in done.stdout and "| global | 1 | 64 |" in done.stdout


def test_an_imported_cohere2_is_not_written_back(hf_tokenizer_dir, tmp_path):
    """Cohere2 is read only: asked for by name it says so; a parallel LayerNorm SwiGLU block with
    NoPE layers is held by no family, and the export says which setting in one line."""
    _, directory = hf_model_dir("cohere2-untied-base", hf_tokenizer_dir, tmp_path)
    loaded = load_model(str(directory))
    for family, message in ((None, "model.layers="), ("cohere2", "family 'cohere2' is read only: valid: llama")):
        with pytest.raises(HFError, match=message) as info:
            export_model(loaded.model, loaded.tokenizer, loaded.config, str(tmp_path / "hf"), family=family)
        assert "\n" not in str(info.value) and not (tmp_path / "hf").exists()


def test_a_missing_sliding_window_is_transformers_default(hf_tokenizer_dir, tmp_path):
    """Gemma 3's config.json without ``sliding_window``: transformers' default, 4096, so its sliding
    layers keep their own RoPE base (here every layer sees the whole short prompt)."""
    import json

    _, directory = hf_model_dir("gemma3-text-two-bases-untied", hf_tokenizer_dir, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    del config["sliding_window"]
    (directory / "config.json").write_text(json.dumps(config))
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    loaded = load_model(str(directory))
    assert loaded.config.model.layers["sliding"]["window"] == reference.config.sliding_window == 4096
    ids = tokens()
    with torch.no_grad():
        assert (loaded.model(ids) - reference(ids).logits).abs().max() < TOLERANCE
