"""The Hugging Face bridge: transformers models imported (GPT-2, GPT-NeoX, the Llama family)
and minilm models exported (GPT-NeoX, Llama, GPT-2, MPT), with random weights built in
temporary directories. Logits must agree with transformers to 1e-4 in float32, cached and
uncached; greedy generation and tokenization must agree. Nothing is downloaded."""

import dataclasses
import json
import os
import re
import shutil

import pytest
import torch

from tests.conftest import REPO, tiny_text

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

from minilm import GPT, ModelConfig  # noqa: E402
from minilm.checkpoints.format import save  # noqa: E402
from minilm.checkpoints.loading import load_model  # noqa: E402
from minilm.config import Config, DataConfig  # noqa: E402
from minilm.generation.decode import Sampling, generate_ids  # noqa: E402
from minilm.hf.export import convert, export_model  # noqa: E402
from minilm.hf.family import HFError  # noqa: E402
from tests.forkrun import run_python  # noqa: E402

TOLERANCE = 1e-4
LENGTH = 40


def scramble(model, seed=0):
    """Large random weights (norm gains near 1), so that every weight matters in the logits."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if "norm" in name or "ln_" in name:
                param.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * noise)
            else:
                param.copy_(noise * (2.0 / max(param.shape[-1], 1) ** 0.5 if param.dim() > 1 else 0.1))
    return model.eval()


def vocab(tokenizer_dir) -> int:
    return tokenizers.Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()


HF_CASES = {
    "gpt2": lambda v: transformers.GPT2Config(
        vocab_size=v,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        activation_function="gelu_new",
        bos_token_id=0,
        eos_token_id=0,
    ),
    "neox-parallel-untied-partial-padded": lambda v: transformers.GPTNeoXConfig(
        vocab_size=v + 12,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    ),
    "neox-sequential-tied-linear": lambda v: transformers.GPTNeoXConfig(
        vocab_size=v,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        use_parallel_residual=False,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "partial_rotary_factor": 0.25, "factor": 2.0},
    ),
    "llama-gqa-untied-yarn": lambda v: transformers.LlamaConfig(
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 2.0,
            "original_max_position_embeddings": 32,
        },
    ),
    "llama-yarn-every-key": lambda v: transformers.LlamaConfig(  # GPT-OSS's truncate, DeepSeek's mscale pair
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "beta_fast": 8,
            "beta_slow": 0.5,
            "truncate": False,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
        },
    ),
    "llama-proportional": lambda v: transformers.LlamaConfig(  # p-RoPE: half the pairs at frequency 0
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    ),
    "llama-tied-llama3": lambda v: transformers.LlamaConfig(
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "qwen2-qkv-bias-gqa": lambda v: transformers.Qwen2Config(
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        use_sliding_window=False,
    ),
    "mistral": lambda v: transformers.MistralConfig(
        vocab_size=v,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=None,
        tie_word_embeddings=False,
    ),
}


def hf_model_dir(case: str, tokenizer_dir, root, seed=0):
    """A random-weight transformers model of ``case`` saved with save_pretrained, plus the tokenizer."""
    config = HF_CASES[case](vocab(tokenizer_dir))
    torch.manual_seed(seed)
    model = scramble(transformers.AutoModelForCausalLM.from_config(config).float(), seed)
    directory = root / case
    model.save_pretrained(directory)
    for name in os.listdir(tokenizer_dir):
        shutil.copy(tokenizer_dir / name, directory / name)
    return model, directory


def tokens(n=LENGTH, vocab_size=290, seed=1):
    return torch.randint(0, vocab_size, (2, n), generator=torch.Generator().manual_seed(seed))


def cached_logits(model, ids, prefill):
    """minilm logits with a KV cache: ``prefill`` tokens at once, then one token at a time."""
    cache = model.new_cache(ids.shape[0], ids.shape[1])
    parts = [model(ids[:, :prefill], cache)]
    parts += [model(ids[:, t : t + 1], cache) for t in range(prefill, ids.shape[1])]
    return torch.cat(parts, dim=1)


def import_matches(case, tokenizer_dir, root):
    """Import ``case`` and hold its logits to transformers', uncached and cached (a 25-token
    prefill, then one token at a time); the transformers model and the loaded run."""
    reference, directory = hf_model_dir(case, tokenizer_dir, root)
    ids = tokens()
    loaded = load_model(str(directory))
    with torch.no_grad():
        expected = reference(ids).logits
        assert (loaded.model(ids) - expected).abs().max() < TOLERANCE
        assert (cached_logits(loaded.model, ids, prefill=25) - expected).abs().max() < TOLERANCE
    return reference, loaded


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_imported_model_matches_transformers_cached_and_uncached(case, hf_tokenizer_dir, tmp_path):
    import_matches(case, hf_tokenizer_dir, tmp_path)


def test_imported_architecture_follows_the_config(hf_tokenizer_dir, tmp_path):
    _, directory = hf_model_dir("llama-gqa-untied-yarn", hf_tokenizer_dir, tmp_path)
    loaded = load_model(str(directory))
    m = loaded.config.model
    assert (m.norm, m.mlp, m.n_kv_head, m.tie_embeddings, m.parallel_residual) == ("rmsnorm", "swiglu", 2, False, False)
    assert m.position["scaling"]["type"] == "yarn" and m.position["scaling"]["original_max_positions"] == 32
    text = "The king hath spoken."
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    assert loaded.tokenizer.encode(text) == reference(text, add_special_tokens=False)["input_ids"]


def test_a_minilm_scaling_applies_on_top_of_an_import(hf_tokenizer_dir, tmp_path):
    reference, directory = hf_model_dir("neox-parallel-untied-partial-padded", hf_tokenizer_dir, tmp_path)
    scaled = load_model(str(directory), ["model.position.scaling={type: yarn, factor: 4}"]).model
    assert scaled.positions.scaling["type"] == "yarn" and scaled.positions.scaling["original_max_positions"] == 64
    ids = tokens()
    with torch.no_grad():
        assert (scaled(ids) - reference(ids).logits).abs().max() > 1e-3  # the rotation really changed
        assert (cached_logits(scaled, ids, 10) - scaled(ids)).abs().max() < TOLERANCE


def test_hf_name_is_read_from_the_local_cache_only(hf_tokenizer_dir, tmp_path, monkeypatch):
    _, directory = hf_model_dir("gpt2", hf_tokenizer_dir, tmp_path)
    repo = tmp_path / "hub" / "models--someone--tiny-gpt2"
    shutil.copytree(directory, repo / "snapshots" / "0123abc")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert load_model("hf:someone/tiny-gpt2").config.model.position["kind"] == "learned"
    with pytest.raises(HFError, match="never downloads"):
        load_model("hf:someone/absent")


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"model_type": "bloom"},
            "supported: cohere2, exaone4, gemma2, gemma3_text, gpt2, gpt_neox, llama, ministral3, mistral, mpt, olmo3",
        ),
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0, "truncate": "no"}},
            "truncate='no'",
        ),
        ({"rope_parameters": {"rope_type": "su", "rope_theta": 1e4}}, "supported: default, linear"),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "lacks or garbles 'short_factor'"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope scaling 'yarn' needs a factor"),
        ({"hidden_act": "relu"}, "supported: silu"),
        # transformers' Llama turns the whole head whatever the factor says (it reads it in some scalings only)
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5 is not supported for llama"),
        (
            {"model_type": "ministral3", "architectures": ["Ministral3ForCausalLM"], "rope_parameters": None},
            "ministral3 without rope_parameters is not supported",
        ),
        (
            {"sliding_window": 0, "model_type": "mistral", "architectures": ["MistralForCausalLM"]},
            "sliding_window=0 is invalid",
        ),
        (
            {
                "model_type": "qwen2",
                "architectures": ["Qwen2ForCausalLM"],
                "use_sliding_window": True,
                "sliding_window": 8,
                "layer_types": ["x"],
            },
            "layer_types=",
        ),
        ({"architectures": ["GPT2LMHeadModel"]}, "contradict model_type='llama'"),
        # a count of 0, a negative or a bool is refused, never read as absent (issue 59)
        ({"num_key_value_heads": 0}, "num_key_value_heads=0 is invalid: expected an integer >= 1, or leave it out"),
        ({"num_key_value_heads": True}, "num_key_value_heads=True is invalid"),
        ({"head_dim": 0}, "head_dim=0 is invalid: expected an integer >= 1"),
        ({"num_attention_heads": 0}, "num_attention_heads=0 is invalid"),
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "original_max_position_embeddings": 0}},
            "rope_parameters.original_max_position_embeddings=0 is invalid",
        ),
        (
            {
                "model_type": "qwen2",
                "architectures": ["Qwen2ForCausalLM"],
                "use_sliding_window": True,
                "sliding_window": 8,
                "max_window_layers": -1,
            },
            "max_window_layers=-1 is invalid: expected an integer >= 0",
        ),
    ],
)
def test_unsupported_architectures_are_one_line_errors(change, message, hf_tokenizer_dir, tmp_path):
    _, directory = hf_model_dir("llama-tied-llama3", hf_tokenizer_dir, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config.update(change)
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFError, match=re.escape(message)) as info:
        load_model(str(directory))
    assert "\n" not in str(info.value)


def test_an_absent_count_keeps_its_default(hf_tokenizer_dir, tmp_path):
    """num_key_value_heads and head_dim absent or null: one k/v head per query head, hidden_size / heads
    wide, as transformers reads them (only a 0 is refused)."""
    _, directory = hf_model_dir("llama-tied-llama3", hf_tokenizer_dir, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    del config["head_dim"]
    (directory / "config.json").write_text(json.dumps({**config, "num_key_value_heads": None}))
    m = load_model(str(directory)).config.model
    assert (m.n_kv_head or m.n_head) == 4 and m.head_dim == 8


def write_weights(directory, tensors: dict, source: str, poisoned: str) -> str:
    """``tensors`` written into ``directory`` as ``source`` (model.safetensors, pytorch_model.bin, or two
    safetensors shards and their index, ``poisoned`` in the second) in place of the weights there; returns
    the file that holds ``poisoned``."""
    from safetensors.torch import save_file

    for file in os.listdir(directory):
        if file.endswith((".safetensors", ".bin", ".index.json")):
            os.remove(directory / file)
    if source == "bin":
        torch.save(tensors, directory / "pytorch_model.bin")
        return "pytorch_model.bin"
    if source == "safetensors":
        save_file(tensors, directory / "model.safetensors")
        return "model.safetensors"
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    where = {name: shards[name == poisoned] for name in tensors}
    for shard in shards:
        save_file({k: v for k, v in tensors.items() if where[k] == shard}, directory / shard)
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": where}))
    return shards[1]


FAULTS = {
    "nan": (lambda w: w.index_fill(0, torch.tensor([1]), float("nan")), "with NaN or infinite values (32 of 4,096)"),
    "inf": (lambda w: w.index_fill(0, torch.tensor([0]), float("-inf")), "with NaN or infinite values (32 of 4,096)"),
    "int32": (lambda w: (w * 100).to(torch.int32), "as int32: expected floating point (float32, bfloat16, float16)"),
}  # a damage to a (128, 32) weight -> what the refusal says of it


@pytest.mark.parametrize("source", ["safetensors", "bin", "sharded"])
def test_every_source_of_weights_is_checked_as_a_minilm_checkpoint_is(source, hf_tokenizer_dir, tmp_path):
    """A NaN, inf or integer tensor in model.safetensors, pytorch_model.bin or a shard of an index is one
    line naming it and its file (``minilm.model.gpt.weight_fault``, the check of minilm's own checkpoints),
    never a model that computes NaN or weights cast without a word. The causal masks older GPT-2 files
    keep beside the weights (bool) are no weights: they are left out, and such a file loads."""
    from safetensors.torch import load_file

    _, directory = hf_model_dir("gpt2", hf_tokenizer_dir, tmp_path)
    tensors = {**load_file(directory / "model.safetensors")}
    tensors.update(
        {f"transformer.h.{i}.attn.bias": torch.ones(1, 1, 64, 64, dtype=torch.bool).tril() for i in range(2)}
    )
    name = "transformer.h.1.mlp.c_proj.weight"  # Conv1D (128, 32)
    write_weights(directory, tensors, source, name)
    assert torch.isfinite(load_model(str(directory)).model.state_dict()["blocks.1.mlp.proj.weight"]).all()
    for damage, message in FAULTS.values():
        file = write_weights(directory, {**tensors, name: damage(tensors[name])}, source, name)
        with pytest.raises(HFError) as info:
            load_model(str(directory))
        assert str(info.value).startswith(f"{directory / file} holds tensor {name!r} {message}"), info.value
        assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- export

EXPORT_CASES = {  # minilm model settings -> the family transformers loads
    "rope-neox": (dict(position={"kind": "rope", "rotary_fraction": 0.5}, bias=True), "gpt_neox"),
    "rope-neox-parallel-untied-ntk": (
        dict(
            position={"kind": "rope", "scaling": {"type": "ntk", "factor": 4}},
            parallel_residual=True,
            tie_embeddings=False,
            mlp="gelu_tanh",
        ),
        "gpt_neox",
    ),
    "rope-llama-gqa-yarn": (
        dict(
            position={"kind": "rope", "scaling": {"type": "yarn", "factor": 2, "original_max_positions": 16}},
            norm="rmsnorm",
            mlp="swiglu",
            n_kv_head=2,
            tie_embeddings=False,
        ),
        "llama",
    ),
    "rope-llama-yarn-every-key": (
        dict(
            position={
                "kind": "rope",
                "scaling": {
                    "type": "yarn",
                    "factor": 4,
                    "original_max_positions": 16,
                    "beta_fast": 8,
                    "truncate": False,
                },
            },
            norm="rmsnorm",
            mlp="swiglu",
        ),
        "llama",
    ),
    "rope-llama-proportional": (
        dict(
            position={"kind": "rope", "scaling": {"type": "proportional", "fraction": 0.25}},
            norm="rmsnorm",
            mlp="swiglu",
        ),
        "llama",
    ),
    "rope-qwen2": (
        dict(position={"kind": "rope", "base": 1e6}, norm="rmsnorm", mlp="swiglu", qkv_bias=True, n_kv_head=1),
        "qwen2",
    ),
    "learned-gpt2": (dict(position={"kind": "learned"}, bias=True), "gpt2"),
    "alibi-mpt": (dict(position={"kind": "alibi"}), "mpt"),
}


def export(checkpoint: str, directory: str) -> dict:
    """What ``python -m minilm export`` does: load the checkpoint, write the directory."""
    model, tokenizer, config, _ = load_model(checkpoint)
    return export_model(model, tokenizer, config, directory)


def minilm_checkpoint(settings: dict, tokenizer, path, seed=0):
    model_config = ModelConfig(
        vocab_size=tokenizer.vocab_size, n_layer=2, n_head=4, d_model=32, block_size=32, **settings
    )
    torch.manual_seed(seed)
    model = scramble(GPT(model_config), seed)
    config = Config(model=model_config, data=DataConfig(vocab_size=tokenizer.vocab_size))
    save({"model": model.state_dict(), "config": config.to_dict(), "tokenizer": tokenizer.to_bytes()}, str(path))
    return model


@pytest.mark.parametrize("case", sorted(EXPORT_CASES))
def test_exported_model_matches_in_transformers(case, gen_tokenizer, tmp_path):
    settings, family = EXPORT_CASES[case]
    model = minilm_checkpoint(settings, gen_tokenizer, tmp_path / "ckpt.pt")
    assert export(str(tmp_path / "ckpt.pt"), str(tmp_path / "hf"))["family"] == family
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    assert reference.config.model_type == family
    ids = tokens(n=32, vocab_size=gen_tokenizer.vocab_size)
    with torch.no_grad():
        assert (reference(ids).logits - model(ids)).abs().max() < TOLERANCE
        prompt = ids[0, :8].tolist()
        ours = [int(t) for t in generate_ids(model, prompt, max_new_tokens=16, sampling=Sampling(temperature=0))]
        reference.generation_config.eos_token_id = None  # minilm's generate_ids runs on past an end token too
        theirs = reference.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, pad_token_id=0)[
            0, 8:
        ].tolist()
    assert ours == theirs and len(set(ours)) > 1


def test_exported_tokenizer_tokenizes_like_minilm(gen_tokenizer, tmp_path):
    minilm_checkpoint(EXPORT_CASES["rope-neox"][0], gen_tokenizer, tmp_path / "ckpt.pt")
    export(str(tmp_path / "ckpt.pt"), str(tmp_path / "hf"))
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = tiny_text(60) + "  two  spaces, 1234 digits, café, 東京 and an emoji 🙂\n\n end"
    assert theirs(text, add_special_tokens=False)["input_ids"] == gen_tokenizer.encode(text)
    assert theirs.decode(gen_tokenizer.encode(text)) == text


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(position={"kind": "sinusoidal"}), "no transformers equivalent"),
        (dict(position={"kind": "t5"}), "no transformers equivalent"),
        (dict(position={"kind": "alibi"}, bias=True), "MPT"),
        (dict(position={"kind": "rope"}, norm="rmsnorm"), "GPT-NeoX"),
        (dict(position={"kind": "learned"}, tie_embeddings=False), "tied head"),
        (dict(position={"kind": "rope"}, qk_norm=True), "model.qk_norm=True has no GPT-NeoX equivalent"),
        (dict(position={"kind": "rope"}, mlp="relu2"), "GPT-NeoX"),
        (dict(position={"kind": "rope"}, logit_softcap=30.0), "model.logit_softcap=30.0 has no GPT-NeoX equivalent"),
        (dict(position={"kind": "alibi"}, value_embeddings=True), "model.value_embeddings=True has no MPT equivalent"),
    ],
)
def test_export_refuses_what_transformers_cannot_hold(settings, message, gen_tokenizer, tmp_path):
    minilm_checkpoint(settings, gen_tokenizer, tmp_path / "ckpt.pt")
    with pytest.raises(HFError, match=message) as info:
        export(str(tmp_path / "ckpt.pt"), str(tmp_path / "hf"))
    assert "\n" not in str(info.value) and not (tmp_path / "hf").exists()


@pytest.mark.parametrize("case", sorted(EXPORT_CASES))
def test_a_new_model_option_is_refused_until_its_family_handles_it(case):
    """A ModelConfig field added later (here a fake one) stops every family's export while it is
    away from its default, instead of being dropped from the exported model."""
    settings, _ = EXPORT_CASES[case]
    fancy_config = dataclasses.make_dataclass("FancyModelConfig", [("fancy_option", bool, False)], bases=(ModelConfig,))
    shape = dict(vocab_size=97, n_layer=2, n_head=4, d_model=32, block_size=32, **settings)
    state_dict = GPT(ModelConfig(**shape)).state_dict()
    assert convert(fancy_config(**shape), state_dict)[0] == EXPORT_CASES[case][1]  # at its default: exported
    with pytest.raises(HFError, match="model.fancy_option=True has no .* equivalent") as info:
        convert(fancy_config(**shape, fancy_option=True), state_dict)
    assert "\n" not in str(info.value)


def test_export_never_writes_into_a_used_directory(gen_tokenizer, tmp_path):
    minilm_checkpoint(EXPORT_CASES["rope-neox"][0], gen_tokenizer, tmp_path / "ckpt.pt")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "notes.txt").write_text("mine")
    with pytest.raises(HFError, match="not empty"):
        export(str(tmp_path / "ckpt.pt"), str(tmp_path / "hf"))
    assert os.listdir(tmp_path / "hf") == ["notes.txt"]


# --------------------------------------------------------------------------- the command lines


def cli(*args, cwd):
    result = run_python([*args], cwd=cwd, env={**os.environ, "PYTHONPATH": REPO}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.slow
def test_an_imported_model_through_the_command_lines(hf_tokenizer_dir, tiny_corpus, tmp_path):
    _, directory = hf_model_dir("llama-gqa-untied-yarn", hf_tokenizer_dir, tmp_path)
    data = [f"data.corpus={tiny_corpus / 'corpus.txt'}", f"data.dir={tmp_path / 'data'}"]
    out = cli(
        os.path.join(REPO, "generate.py"),
        "--checkpoint",
        str(directory),
        "The king",
        "--max-new-tokens",
        "8",
        "--temperature",
        "0",
        cwd=tmp_path,
    )
    assert out.startswith("The king")
    out = cli(
        os.path.join(REPO, "evaluate.py"),
        str(directory),
        "--lengths",
        "32,128",
        "--max-tokens",
        "1024",
        "--position.scaling.type=yarn",
        "--position.scaling.factor=4",
        "--no-files",
        "--quiet",
        *[x for d in data for x in ("--set", d)],
        cwd=tmp_path,
    )
    assert "128" in out
    out = cli(
        os.path.join(REPO, "evaluate.py"),
        str(directory),
        "--stream",
        "--stream-tokens",
        "160",
        "--max-context",
        "32",
        "--no-files",
        "--quiet",
        *[x for d in data for x in ("--set", d)],
        cwd=tmp_path,
    )
    assert "| window 32, 4 sinks at cache positions |" in out and "| 128-159 |" in out
    cli(
        os.path.join(REPO, "train.py"),
        f"train.init_from={directory}",
        "model.block_size=128",
        "model.position={kind: rope, scaling: {type: yarn, factor: 2}}",
        *data,
        "train.max_steps=3",
        "train.batch_size=2",
        "train.warmup_steps=1",
        "train.eval_interval=3",
        "train.eval_iters=1",
        "train.sample_tokens=0",
        "train.final_eval_tokens=0",
        "train.dtype=float32",
        "train.device=cpu",
        f"out_dir={tmp_path / 'tuned'}",
        cwd=tmp_path,
    )
    cli("-m", "minilm", "export", str(tmp_path / "tuned"), str(tmp_path / "tuned-hf"), cwd=tmp_path)
    tuned = load_model(str(tmp_path / "tuned")).model
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "tuned-hf", dtype=torch.float32)
    assert reference.config.max_position_embeddings == 128
    ids = tokens(n=100)
    with torch.no_grad():
        assert (reference(ids).logits - tuned(ids)).abs().max() < TOLERANCE


def test_passkey_and_position_plots_take_an_imported_directory(hf_tokenizer_dir, tmp_path, capsys):
    from minilm.__main__ import main

    _, directory = hf_model_dir("neox-parallel-untied-partial-padded", hf_tokenizer_dir, tmp_path)
    assert main(["passkey", "eval", str(directory), "--lengths", "128", "--depths", "0.5", "--trials", "1"]) == 0
    assert "128" in capsys.readouterr().out
    assert (
        main(
            [
                "passkey",
                "make-corpus",
                str(tmp_path / "keys"),
                "--checkpoint",
                str(directory),
                "--n",
                "3",
                "--length",
                "120",
            ]
        )
        == 0
    )
    assert len(os.listdir(tmp_path / "keys")) >= 1
    assert (
        main(
            [
                "passkey",
                "make-corpus",
                str(tmp_path / "mixed"),
                "--checkpoint",
                str(directory),
                "--n",
                "3",
                "--length",
                "120",
                "--mix",
                "0.3",
            ]
        )
        == 2
    )
    assert "training text" in capsys.readouterr().err
    pytest.importorskip("matplotlib")
    assert main(["positions", "plot", "--checkpoint", str(directory), "--out", str(tmp_path / "rope.png")]) == 0
    assert (tmp_path / "rope.png").stat().st_size > 1000


# =========================================================================== vocabularies past uint16

BIG_CASES = {  # Llama-3-shaped (128,256 tokens, tied and untied) and Qwen2-shaped (151,936)
    "llama3-untied": lambda v: transformers.LlamaConfig(
        vocab_size=v,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "llama3-tied": lambda v: transformers.LlamaConfig(
        vocab_size=v,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    ),
    "qwen2": lambda v: transformers.Qwen2Config(
        vocab_size=v,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        use_sliding_window=False,
    ),
}
BIG_VOCAB = {"llama3-untied": 128_256, "llama3-tied": 128_256, "qwen2": 151_936}


def big_model_dir(case: str, root, text: str):
    """A random model of ``case`` with a word-level tokenizer of its full vocabulary, whose words
    (those of ``text``) have the highest ids, so every encoded token is past 65,535."""
    size = BIG_VOCAB[case]
    words = sorted(set(text.split()))
    filler = size - len(words)
    vocab = {**{f"<{i}>": i for i in range(filler)}, **{w: filler + i for i, w in enumerate(words)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins words with spaces
    directory = root / case
    torch.manual_seed(0)
    model = scramble(transformers.AutoModelForCausalLM.from_config(BIG_CASES[case](size)).float())
    model.save_pretrained(directory)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<1>").save_pretrained(directory)
    return model, directory, filler


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BIG_CASES))
def test_a_vocabulary_past_uint16_imports_exactly(case, tiny_corpus, tmp_path):
    reference, directory, first_word = big_model_dir(case, tmp_path, (tiny_corpus / "corpus.txt").read_text())
    ids = tokens(vocab_size=BIG_VOCAB[case]) % (BIG_VOCAB[case] - first_word) + first_word
    with torch.no_grad():
        expected = reference(ids).logits
        loaded = load_model(str(directory))
        assert loaded.model.config.vocab_size == BIG_VOCAB[case] == loaded.tokenizer.vocab_size
        assert (loaded.model(ids) - expected).abs().max() < TOLERANCE
        assert (cached_logits(loaded.model, ids, prefill=25) - expected).abs().max() < TOLERANCE


@pytest.mark.slow
def test_a_llama3_sized_model_through_the_command_lines(tiny_corpus, tmp_path):
    """generate, evaluate (uint32 token files), a few init_from steps and export, at 128,256 tokens."""
    text = (tiny_corpus / "corpus.txt").read_text()
    _, directory, _ = big_model_dir("llama3-untied", tmp_path, text)
    data = [f"data.corpus={tiny_corpus / 'corpus.txt'}", f"data.dir={tmp_path / 'data'}"]
    prompt = " ".join(text.split()[:3])
    out = cli(
        os.path.join(REPO, "generate.py"),
        "--checkpoint",
        str(directory),
        prompt,
        "--max-new-tokens",
        "4",
        "--temperature",
        "0",
        cwd=tmp_path,
    )
    assert out.startswith(prompt)
    out = cli(
        os.path.join(REPO, "evaluate.py"),
        str(directory),
        "--lengths",
        "32,64",
        "--max-tokens",
        "256",
        "--no-files",
        "--quiet",
        *[x for d in data for x in ("--set", d)],
        cwd=tmp_path,
    )
    assert "64" in out
    cli(
        os.path.join(REPO, "train.py"),
        f"train.init_from={directory}",
        "model.block_size=64",
        *data,
        "train.max_steps=2",
        "train.batch_size=2",
        "train.warmup_steps=1",
        "train.eval_interval=2",
        "train.eval_iters=1",
        "train.sample_tokens=0",
        "train.final_eval_tokens=0",
        "train.dtype=float32",
        "train.device=cpu",
        f"out_dir={tmp_path / 'tuned'}",
        cwd=tmp_path,
    )
    cli("-m", "minilm", "export", str(tmp_path / "tuned"), str(tmp_path / "tuned-hf"), cwd=tmp_path)
    tuned = load_model(str(tmp_path / "tuned")).model
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "tuned-hf", dtype=torch.float32)
    assert reference.config.vocab_size == 128_256
    ids = tokens(n=50, vocab_size=128_256)
    with torch.no_grad():
        # 128,256 logits a position from random weights reach tens: float32 rounds them apart by about 1e-6 of that
        torch.testing.assert_close(tuned(ids), reference(ids).logits, rtol=1e-5, atol=TOLERANCE)


@pytest.mark.slow
def test_greedy_generation_stops_where_transformers_stops(hf_tokenizer_dir, tmp_path):
    """generation_config.json names two end-of-text ids; the first one greedy decoding reaches
    ends the sample in minilm as in transformers' generate (which keeps it as the last token)."""
    reference, directory = hf_model_dir("llama-gqa-untied-yarn", hf_tokenizer_dir, tmp_path)
    prompt = tokens(n=6)[:1]
    with torch.no_grad():
        free = reference.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)[
            0, 6:
        ].tolist()
    eos = [free[7], free[4]]  # both in reach; free[4] comes first (unless it repeats earlier)
    reference.generation_config.eos_token_id = eos
    reference.generation_config.save_pretrained(directory)
    with torch.no_grad():
        expected = reference.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)[0, 6:].tolist()
    assert expected[-1] in eos and len(expected) < 12
    from minilm.generation.text import generate

    loaded = load_model(str(directory))
    assert set(eos) <= set(loaded.tokenizer.stop_ids)
    got = [
        p.token
        for p in generate(
            loaded.model, loaded.tokenizer, prompt[0].tolist(), max_new_tokens=12, sampling=Sampling(temperature=0)
        )
    ]
    assert got == expected
    ignored = [
        p.token
        for p in generate(
            loaded.model,
            loaded.tokenizer,
            prompt[0].tolist(),
            max_new_tokens=12,
            sampling=Sampling(temperature=0),
            stop_ids=(),
        )
    ]
    assert ignored == free
    export_model(loaded.model, loaded.tokenizer, loaded.config, str(tmp_path / "again"))  # both ids go out and back
    assert json.loads((tmp_path / "again" / "generation_config.json").read_text())["eos_token_id"] == eos
    assert load_model(str(tmp_path / "again")).tokenizer.stop_ids == tuple(eos)
    # the command line: an end-of-text id that "The king" reaches greedily ends the sample, --ignore-eos goes on
    text_free = [
        p.token
        for p in generate(
            loaded.model, loaded.tokenizer, "The king", max_new_tokens=12, sampling=Sampling(temperature=0), stop_ids=()
        )
    ]
    reference.generation_config.eos_token_id = text_free[3]
    reference.generation_config.save_pretrained(directory)
    counts = []
    for flags in ([], ["--ignore-eos"]):
        result = run_python(
            [
                os.path.join(REPO, "generate.py"),
                "--checkpoint",
                str(directory),
                "The king",
                "--max-new-tokens",
                "12",
                "--temperature",
                "0",
                "--stats",
                *flags,
            ],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": REPO},
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        counts.append(int(result.stderr.split("new: ")[1].split(" tokens")[0]))
    assert counts == [text_free.index(text_free[3]) + 1, 12]


def test_longeval_takes_an_imported_directory(hf_tokenizer_dir, tiny_corpus, tmp_path, capsys):
    from minilm.__main__ import main

    _, directory = hf_model_dir("llama-tied-llama3", hf_tokenizer_dir, tmp_path)
    figure = tmp_path / "suite.png"
    assert (
        main(
            [
                "longeval",
                str(directory),
                "--lengths",
                "64,128",
                "--depths",
                "0,1",
                "--trials",
                "2",
                "--tasks",
                "single,multiquery,vartrack",
                "--items",
                "2",
                "--text",
                str(tiny_corpus / "corpus.txt"),
                "--set",
                "model.position.scaling={type: yarn, factor: 4}",
                "--figure",
                str(figure),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "single (2 probes per cell" in out and "vartrack (2 probes per cell" in out
    if pytest.importorskip("matplotlib"):
        assert figure.stat().st_size > 1000


def greedy_both(loaded, directory, new_tokens=20, text="The king hath"):
    """(minilm's greedy continuation of ``text`` with ``loaded``, transformers' with the model exported to
    ``directory``): token ids, every one forced (no end-of-text stop)."""
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    prompt = loaded.tokenizer.encode(text)
    with torch.no_grad():
        ours = [
            int(t)
            for t in generate_ids(loaded.model, prompt, max_new_tokens=new_tokens, sampling=Sampling(temperature=0))
        ]
        reference.generation_config.eos_token_id = None
        theirs = reference.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)[
            0, len(prompt) :
        ].tolist()
    return ours, theirs
