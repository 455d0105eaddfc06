"""LoRA (minilm.model.lora, minilm.training.adapters): adapters on an imported Llama-shaped
base, the trainable count against the formula, frozen weights that do not move, a checkpoint
of what trains and the base's hash, merged logits equal to the adapted model's, resume, and
the merged model exported to transformers."""

import os
import shutil

import pytest
import torch
import transformers

from minilm.checkpoints import format as checkpoint_format
from minilm.checkpoints.format import CheckpointError
from minilm.checkpoints.format import load as load_checkpoint
from minilm.checkpoints.loading import load_model
from minilm.cli import export as export_command
from minilm.config import Config, ConfigError, DataConfig, LoRAConfig, ModelConfig, build_config
from minilm.configfile import load_config
from minilm.hf.export import export_model
from minilm.model.gpt import GPT
from minilm.model.lora import LoRALinear, adapter_parameter_count, add_adapters, merge_adapters
from minilm.training.adapters import check_fits
from minilm.training.loop import setup, train, train_step
from minilm.training.mixture import mixed_loss
from minilm.training.resume import StopFlag
from tests.conftest import tiny_overrides
from tests.forkrun import run_python
from tests.test_hf import greedy_both, scramble

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA = dict(
    position={"kind": "rope"},
    norm="rmsnorm",
    mlp="swiglu",
    n_kv_head=2,
    tie_embeddings=False,
    d_model=128,
    n_head=4,
    n_layer=2,
    d_ff=512,
    block_size=32,
)


NEOX = dict(
    position={"kind": "rope", "rotary_fraction": 0.5},
    norm="layernorm",
    mlp="gelu",
    bias=True,
    tie_embeddings=False,
    d_model=128,
    n_head=4,
    n_layer=2,
    d_ff=512,
    block_size=32,
)


def llama_base(tokenizer, directory, seed=0, scrambled=True, shape=None):
    """A random-weight Llama-shaped model (or another ``shape``: NEOX) written as a Hugging Face
    directory (what an import reads); ``scrambled``: large weights, whose greedy text wanders (else
    GPT-2's initialisation)."""
    torch.manual_seed(seed)
    model_config = ModelConfig(vocab_size=tokenizer.vocab_size, **(shape or LLAMA))
    model = scramble(GPT(model_config), seed) if scrambled else GPT(model_config)
    config = Config(model=model_config, data=DataConfig(vocab_size=tokenizer.vocab_size))
    family = export_model(model, tokenizer, config, str(directory))["family"]
    assert family == {"layernorm": "gpt_neox"}.get(model_config.norm, "qwen3" if model_config.qk_norm else "llama")
    return model


def lora_overrides(corpus, base, out, *extra):
    """A LoRA extension of ``base`` to 2x its length with YaRN: adapters of rank 2 on q, k, v, o, norms trained."""
    tiny = [
        o
        for o in tiny_overrides(corpus, out, "train.sample_tokens=0", "train.final_eval_tokens=0", "train.batch_size=2")
        if not o.startswith("model.")
    ]  # the base's shape
    return [
        *tiny,
        f"train.init_from={base}",
        "train.lora.r=2",
        "train.lora.alpha=4",
        "train.lora.targets=[q, k, v, o]",
        "train.lora.also_train=[norms]",
        "model.block_size=64",
        "model.position={kind: rope, scaling: {type: yarn, factor: 2}}",
        "train.lr=1e-2",
        "train.min_lr=1e-3",
        *extra,
    ]


def test_adapters_start_at_the_base_and_merge_into_the_same_function():
    torch.manual_seed(0)
    model = scramble(GPT(ModelConfig(vocab_size=61, **LLAMA))).double()  # float64: the algebra, not rounding
    ids = torch.randint(0, 61, (2, 20))
    with torch.no_grad():
        before = model(ids)
    trainable = add_adapters(model, ["q", "v", "mlp"], r=3, alpha=6.0)
    c = model.config
    # r (d_in + d_out) per adapter: q (128 -> 128), v (128 -> 64), gate and up (128 -> 512), down (512 -> 128)
    per_layer = 3 * ((128 + 128) + (128 + 64) + 2 * (128 + 512) + (512 + 128))
    assert trainable == adapter_parameter_count(model, ["q", "v", "mlp"], 3) == c.n_layer * per_layer
    assert isinstance(model.blocks[0].attn.qkv, LoRALinear) and not model.blocks[0].attn.qkv.weight.requires_grad
    with torch.no_grad():
        assert torch.equal(model(ids), before)  # B starts at zero: the base's function exactly
        for name, param in model.named_parameters():
            if ".lora_b." in name:
                param.normal_(std=0.1)
        adapted = model(ids)
        merged = merge_adapters(model)(ids)
    assert (adapted - before).abs().max() > 1e-2  # the adapters change the function ...
    assert (merged - adapted).abs().max() < 1e-10  # ... and merged weights compute what they computed
    assert not any(isinstance(m, LoRALinear) for m in model.modules())


def test_a_lora_run_trains_only_adapters_and_the_named_parameters(tiny_corpus, gen_tokenizer, tmp_path):
    llama_base(gen_tokenizer, tmp_path / "base", scrambled=False)
    config = load_config(None, lora_overrides(tiny_corpus, tmp_path / "base", tmp_path / "run"))
    run = setup(config, quiet=True)
    base = load_model(str(tmp_path / "base")).model.state_dict()
    trained = {name for name, p in run.raw.named_parameters() if p.requires_grad}
    assert all(".lora_" in n or "ln_" in n or "norm" in n for n in trained) and any(".lora_a." in n for n in trained)
    optimised = {id(p) for part in run.optimizer.parts for group in part.param_groups for p in group["params"]}
    assert optimised == {id(p) for p in run.raw.parameters() if p.requires_grad}  # no optimiser state for the rest
    with StopFlag() as stop:
        for _ in range(4):
            train_step(run, stop)
    for name, param in run.raw.named_parameters():
        if not param.requires_grad:  # frozen: bit-identical to the base, and never given a gradient
            assert param.grad is None and torch.equal(param.detach(), base[name]), name
    assert any(not torch.equal(p.detach(), base[n]) for n, p in run.raw.named_parameters() if "ln_" in n)
    ids = torch.randint(0, gen_tokenizer.vocab_size, (2, 64))
    with torch.no_grad():  # in float32, after training: the merged model computes what the adapted one does
        adapted = run.raw.eval()(ids)
        merged = merge_adapters(run.raw)(ids)
    assert (merged - adapted).abs().max() < 1e-5


@pytest.mark.slow
def test_lora_extension_from_the_command_line_exports_to_transformers(tiny_corpus, gen_tokenizer, tmp_path):
    """A 20-step LoRA extension (YaRN 2x) of an imported Llama-shaped model: the trainable count is the
    formula's, the checkpoint holds only that (under a tenth of the base's weights), and the export
    (adapters merged) generates minilm's greedy text in transformers."""
    llama_base(gen_tokenizer, tmp_path / "base")
    env = {**os.environ, "PYTHONPATH": REPO}
    args = lora_overrides(tiny_corpus, tmp_path / "base", tmp_path / "run", "train.max_steps=20")
    done = run_python(["-m", "minilm", "train", *args], cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    state = load_checkpoint(str(tmp_path / "run" / "ckpt.pt"))
    shape = GPT(ModelConfig(vocab_size=gen_tokenizer.vocab_size, **LLAMA))
    norms = sum(p.numel() for n, p in shape.named_parameters() if "ln_" in n)
    formula = adapter_parameter_count(shape, ["q", "k", "v", "o"], 2) + norms
    assert sum(t.numel() for t in state["model"].values()) == formula
    assert f"{formula:,} trained, LoRA" in done.stderr
    assert state["lora_base"]["path"] == str(tmp_path / "base") and len(state["lora_base"]["sha256"]) == 64
    weights = os.path.getsize(tmp_path / "base" / "model.safetensors")
    assert os.path.getsize(tmp_path / "run" / "ckpt.pt") < weights / 10
    exported = run_python(
        ["-m", "minilm", "export", str(tmp_path / "run"), str(tmp_path / "hf")], cwd=tmp_path, env=env, timeout=300
    )
    assert exported.returncode == 0, exported.stderr[-2000:]
    (tmp_path / "plain.txt").write_text("x")  # every exported file has an ordinary file's permissions
    modes = {path.stat().st_mode & 0o777 for path in (tmp_path / "hf").iterdir()}
    assert modes == {(tmp_path / "plain.txt").stat().st_mode & 0o777}
    ours, theirs = greedy_both(load_model(str(tmp_path / "run")), tmp_path / "hf")
    assert ours == theirs and len(set(ours)) > 2


def test_a_resumed_lora_run_continues_exactly_and_a_changed_base_is_refused(tiny_corpus, gen_tokenizer, tmp_path):
    llama_base(gen_tokenizer, tmp_path / "base")
    constant = ["train.min_lr=1e-2", "train.warmup_steps=0", "train.checkpoint_interval=3", "train.eval_interval=3"]
    whole = load_config(
        None, lora_overrides(tiny_corpus, tmp_path / "base", tmp_path / "whole", "train.max_steps=6", *constant)
    )
    train(whole, quiet=True)
    half = load_config(
        None, lora_overrides(tiny_corpus, tmp_path / "base", tmp_path / "half", "train.max_steps=3", *constant)
    )
    train(half, quiet=True)
    again = load_config(
        None, lora_overrides(tiny_corpus, tmp_path / "base", tmp_path / "half", "train.max_steps=6", *constant)
    )
    train(again, resume=True, quiet=True)
    a, b = (load_checkpoint(str(tmp_path / run / "ckpt.pt"))["model"] for run in ("whole", "half"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    settings = lora_overrides(tiny_corpus, tmp_path / "base", tmp_path / "half", "train.max_steps=9", *constant)
    forgotten = [o for o in settings if not o.startswith("train.lora.")]  # the same run without train.lora
    with pytest.raises(ConfigError, match=r"is a LoRA run's \(train.lora.r=2\) but train.lora.r is 0"):
        train(load_config(None, forgotten), resume=True, quiet=True)
    llama_base(gen_tokenizer, tmp_path / "other", seed=1)  # the base's weights are replaced by others
    shutil.copy(tmp_path / "other" / "model.safetensors", tmp_path / "base" / "model.safetensors")
    with pytest.raises(CheckpointError, match="has changed since the adapters were trained"):
        load_model(str(tmp_path / "whole"))
    with pytest.raises(CheckpointError, match="not the base this run's adapters were trained on"):
        train(load_config(None, settings), resume=True, quiet=True)  # steps left (at 6 the run is finished)


def test_a_lora_run_finds_its_base_moved_beside_it_and_refuses_a_damaged_record(tiny_corpus, gen_tokenizer, tmp_path):
    """The base is recorded by absolute path and by its place from the run: the two moved together
    still load (the hash proves it is the same base); a record that is not one is a one-line error."""
    llama_base(gen_tokenizer, tmp_path / "a" / "base")
    train(load_config(None, lora_overrides(tiny_corpus, tmp_path / "a" / "base", tmp_path / "a" / "run")), quiet=True)
    ids = torch.randint(0, gen_tokenizer.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = load_model(str(tmp_path / "a" / "run")).model(ids)
        shutil.move(tmp_path / "a", tmp_path / "b")
        assert torch.equal(load_model(str(tmp_path / "b" / "run")).model(ids), expected)
    state = {k: v for k, v in load_checkpoint(str(tmp_path / "b" / "run")).items() if k != "path"}
    for damaged in ("../base", "", {"path": 3, "sha256": "x"}):
        path = checkpoint_format.save({**state, "lora_base": damaged}, str(tmp_path / "damaged"))
        with pytest.raises(CheckpointError, match="is not the record of a base") as error:
            load_model(path)
        assert "\n" not in str(error.value)


def test_lora_settings_that_cannot_take_effect_on_the_model_are_refused():
    """A rank above the adapted linears' width, or the head trained apart from a tied head."""
    model = GPT(ModelConfig(vocab_size=50, n_layer=1, n_head=2, d_model=32, block_size=16, tie_embeddings=True))
    with pytest.raises(ConfigError, match=r"train.lora.r=33 is invalid for this model: .* a rank from 1 to 32"):
        check_fits(model, LoRAConfig(r=33))
    with pytest.raises(ConfigError, match="has head, but this model's head is its token embedding"):
        check_fits(model, LoRAConfig(r=4, also_train=["head"]))
    check_fits(model, LoRAConfig(r=32, also_train=["embeddings"]))


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"lora": {"r": 4}}, "needs train.init_from"),
        ({"lora": {"r": 4}, "init_from": "x", "optimizer": "muon"}, "train.optimizer=adamw"),
        ({"lora": {"r": 4, "targets": ["qkv"]}, "init_from": "x"}, "train.lora.targets=['qkv'] is invalid"),
        ({"lora": {"r": 4, "targets": []}, "init_from": "x"}, "train.lora.targets=[] is invalid"),
        ({"lora": {"r": -1}}, "train.lora.r=-1 is invalid"),
        ({"lora": {"targets": ["q"]}}, "train.lora.targets=['q'] has no effect without adapters: set train.lora.r"),
        ({"lora": {"alpha": 8}}, "train.lora.alpha=8.0 has no effect without adapters"),
        ({"lora": {"also_train": ["norms"]}}, "train.lora.also_train=['norms'] has no effect without adapters"),
        (
            {"lora": {"also_train": ["bias"]}},
            "also_train=['bias'] is invalid: expected a list of distinct names among norms, embeddings, position, head",
        ),
    ],
)
def test_bad_lora_settings_are_one_line_errors(setting, message):
    with pytest.raises(ConfigError) as error:
        build_config({"train": setting})
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape",
    [None, {**LLAMA, "tie_embeddings": True}, {**LLAMA, "qk_norm": True}, NEOX],
    ids=["llama", "llama-tied", "qwen3", "gpt_neox"],
)
def test_adapters_export_in_peft_format_and_peft_computes_the_same_model(
    shape, tiny_corpus, gen_tokenizer, tmp_path, capsys
):
    """Adapters on every target, norms and the token embedding trained too: peft puts the exported
    adapter on the transformers base, and its logits are minilm's (the run's checkpoint, merged).
    GPT-NeoX holds q, k and v in one linear: minilm's three adapters are one of rank 3r there."""
    peft = pytest.importorskip("peft")
    llama_base(gen_tokenizer, tmp_path / "base", shape=shape)
    env = {**os.environ, "PYTHONPATH": REPO}
    args = [
        o
        for o in lora_overrides(
            tiny_corpus,
            tmp_path / "base",
            tmp_path / "run",
            "train.max_steps=8",
            "train.lora.targets=[q, k, v, o, mlp]",
            "train.lora.also_train=[norms, embeddings]",
        )
        if not o.startswith("model.")
    ]
    done = run_python(["-m", "minilm", "train", *args], cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    exported = run_python(
        ["-m", "minilm", "export", str(tmp_path / "run"), str(tmp_path / "peft"), "--adapter"],
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert sorted(os.listdir(tmp_path / "peft")) == ["adapter_config.json", "adapter_model.safetensors"]
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(base, str(tmp_path / "peft")).eval()
    ours = load_model(str(tmp_path / "run")).model
    ids = torch.randint(0, gen_tokenizer.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32)(ids).logits
        delta = (theirs(ids).logits - ours(ids)).abs().max()
    assert delta < 1e-4 and (plain - ours(ids)).abs().max() > 100 * delta  # the adapters matter, and match
    refused = run_python(
        ["-m", "minilm", "export", str(tmp_path / "base"), str(tmp_path / "x"), "--adapter"],
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert refused.returncode == 2 and "is not a LoRA run's checkpoint" in refused.stderr
    if shape is None:  # --family names the base's family: written as it, or refused, never ignored
        assert (
            export_command.main([str(tmp_path / "run"), str(tmp_path / "gpt2"), "--adapter", "--family", "gpt2"]) == 2
        )
        assert "cannot be written as GPT-2" in capsys.readouterr().err and not (tmp_path / "gpt2").exists()


def test_adapters_train_alike_with_activation_checkpointing():
    """Recomputing each block in the backward pass gives the adapters the same gradients."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=61, **LLAMA))
    add_adapters(model, ["q", "k", "v", "o", "mlp"], r=2, alpha=4.0, also_train=["norms"])
    for name, param in model.named_parameters():
        if ".lora_b." in name:
            torch.nn.init.normal_(param, std=0.02)
    ids = torch.randint(0, 61, (2, 24))
    grads = []
    for checkpointing in (False, True):
        model.zero_grad(set_to_none=True)
        model.checkpoint_blocks = checkpointing
        model.train()(ids, head=lambda hidden, weight, cap: mixed_loss(hidden, weight, cap, ids, None)).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
        assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
    assert grads[0].keys() == grads[1].keys() and all(
        torch.allclose(grads[0][k], grads[1][k], atol=1e-6) for k in grads[0]
    )
