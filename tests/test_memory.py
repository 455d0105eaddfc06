"""minilm.training.memory and ``minilm memory``: the meta-device count of activations equals
what a real CPU training pass keeps, and the weights, gradients and optimiser state follow
their formulas under DDP and FSDP."""

import dataclasses
import os
from functools import partial

import pytest
import torch

from minilm import GPT, ModelConfig
from minilm.checkpoints import format as checkpoint
from minilm.cli import memory as memory_command
from minilm.cli.memory import counted_model
from minilm.common import MinilmError
from minilm.config import ConfigError, LoRAConfig
from minilm.configfile import load_config
from minilm.model.lora import add_adapters
from minilm.training import memory
from minilm.training.memory import LAYOUTS, activation_bytes, lora_counts, parameter_counts, step_memory
from tests.conftest import REPO
from tests.forkrun import run_python

SHAPES = {
    "rope": dict(position={"kind": "rope"}),
    "alibi": dict(position={"kind": "alibi"}),
    "t5": dict(position={"kind": "t5"}),
    "xpos": dict(position={"kind": "xpos"}),
    "llama-like": dict(
        position={"kind": "rope", "base": 500000.0}, mlp="swiglu", norm="rmsnorm", n_kv_head=1, tie_embeddings=False
    ),
    "sinusoidal, parallel": dict(position={"kind": "sinusoidal"}, parallel_residual=True, bias=True),
}


@pytest.mark.parametrize(
    "dtype, gathered",
    [(torch.float32, True), (torch.bfloat16, True), (torch.bfloat16, False)],
    ids=["float32", "bf16-weights (fsdp)", "bf16-autocast (ddp)"],
)
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_meta_count_equals_a_real_cpu_pass(shape, checkpointing, dtype, gathered):
    """The dry run (meta device, flash attention standing in for SDPA, autocast's casts
    emulated) keeps exactly the bytes a real forward pass and loss keep on the CPU, where SDPA
    runs its flash kernel: in float32, with bf16 weights, and with float32 weights under bf16
    autocast."""
    config = ModelConfig(vocab_size=300, n_layer=2, n_head=2, d_model=32, block_size=24, **SHAPES[shape])
    real = activation_bytes(config, 3, dtype, checkpointing, gathered=gathered, device="cpu")
    counted = activation_bytes(config, 3, dtype, checkpointing, gathered=gathered)
    if dtype == torch.bfloat16 and gathered and config.norm == "layernorm":
        # the CPU's bf16 LayerNorm keeps each row's mean and 1/std in bf16, the meta kernel (as CUDA's) in float32
        norms = (2 * config.n_layer + 1) if not checkpointing else 1
        assert counted - real == norms * 2 * 3 * 24 * 2
    else:
        assert counted == real
    assert real > 0


def test_activations_grow_with_tokens_and_checkpointing_keeps_only_block_inputs():
    config = ModelConfig(vocab_size=300, n_layer=4, n_head=2, d_model=32, block_size=64)
    full, kept = (activation_bytes(config, 2, torch.float32, c) for c in (False, True))
    longer = ModelConfig(vocab_size=300, n_layer=4, n_head=2, d_model=32, block_size=128)
    assert activation_bytes(longer, 2, torch.float32, False) == pytest.approx(2 * full, rel=0.05)  # flash: linear in T
    assert kept < full / 3
    assert activation_bytes(config, 2, torch.bfloat16, False) < 0.75 * full


def test_weights_gradients_and_optimizer_follow_their_formulas():
    config = ModelConfig(vocab_size=300, n_layer=2, n_head=2, d_model=32, block_size=16)
    total, matrices, root, block = parameter_counts(config)
    assert total == sum(p.numel() for p in GPT(config).parameters())
    assert total == root + 2 * block and 0 < matrices < total
    rows = {(r["parallel"], r["checkpointing"]): r for r in step_memory(config, 2, 4, torch.bfloat16, "adamw")}
    assert set(rows) == set(LAYOUTS)
    ddp, fsdp = rows["ddp", False], rows["fsdp", False]
    assert ddp["weights"] == 4 * total and ddp["gradients"] == 8 * total and ddp["optimizer"] == 8 * total
    assert fsdp["weights"] == total and fsdp["gradients"] == total and fsdp["optimizer"] == 2 * total
    assert fsdp["gathered"] == 2 * (root + 2 * block) and ddp["gathered"] == 0
    assert ddp["activations"] > fsdp["activations"] > rows["fsdp", True]["activations"]  # autocast's weight copies
    float32 = step_memory(config, 2, 4, torch.float32, "adamw")
    assert float32[0]["activations"] == float32[2]["activations"]  # no copies without autocast
    assert all(
        r["total"] == sum(r[k] for k in ("weights", "gradients", "optimizer", "gathered", "activations"))
        for r in rows.values()
    )
    muon = step_memory(config, 2, 4, torch.bfloat16, "muon")[0]
    assert muon["optimizer"] == 4 * matrices + 8 * (total - matrices)


DEEP = {
    "uniform, 13 layers": dict(n_layer=13),
    "local x2 + global NoPE, 17 layers": dict(
        n_layer=17,
        layers={
            "pattern": ["local", "local", "global"],
            "local": {"window": 8},
            "global": {"position": {"kind": "none"}},
        },
    ),
    "value embeddings, pattern of 3, 27 layers": dict(
        n_layer=27,
        value_embeddings=True,
        layers={"pattern": ["a", "b", "c"], "a": {"window": 4}, "b": {"sinks": "learned"}, "c": {}},
    ),
    "value embeddings, 9 layers, untied": dict(n_layer=9, value_embeddings=True, tie_embeddings=False),
}


@pytest.mark.slow
@pytest.mark.parametrize("shape", DEEP)
def test_a_deep_model_is_counted_from_shallow_ones_as_whole(shape, monkeypatch):
    """``by_depth`` (three models of at most two periods of layers) gives the very bytes and
    parameters that counting the whole model gives, in every layout and with LoRA, with layer
    patterns whose period does not divide the depth and value embeddings (a table per pair)."""
    config = ModelConfig(vocab_size=300, n_head=2, d_model=32, block_size=16, **DEEP[shape])
    assert config.n_layer > 4 * memory.period(config)  # the shallow path is taken
    lora = LoRAConfig(r=2, targets=["q", "v"], also_train=["norms"])
    shallow = step_memory(config, 2, 4, torch.bfloat16, "muon"), parameter_counts(config), lora_counts(config, lora)
    shallow_lora = step_memory(config, 2, 4, torch.bfloat16, "adamw", lora=lora)
    monkeypatch.setattr(memory, "by_depth", lambda count, model_config: count(model_config))
    whole = step_memory(config, 2, 4, torch.bfloat16, "muon"), parameter_counts(config), lora_counts(config, lora)
    assert shallow == whole
    assert shallow_lora == step_memory(config, 2, 4, torch.bfloat16, "adamw", lora=lora)
    assert whole[1][0] == sum(p.numel() for p in GPT(config).parameters())


def test_a_step_that_cannot_fit_is_refused_and_a_lora_step_counts_its_frozen_weights(monkeypatch, tmp_path):
    """check_step_fits refuses a step past the free memory in one line; a LoRA run keeps its frozen weights
    in the compute dtype with no gradients or moments, so memory that refuses full training can fit it
    (it was counted as full training: the runs LoRA exists for were refused)."""
    shape = ["model.n_layer=2", "model.d_model=256", "model.n_head=4", "model.block_size=64", "train.batch_size=2"]
    full = load_config("rope.yaml", shape)
    adapted = load_config(
        "rope.yaml", [*shape, "train.optimizer=adamw", "train.lora.r=2", f"train.init_from={tmp_path / 'base'}"]
    )
    device, dtype = torch.device("cpu"), torch.bfloat16
    need = {
        name: step_memory(c.model, 2, 1, dtype, c.train.optimizer, ((c.train.parallel, False),), lora=lora)[0]["total"]
        for name, c, lora in (("full", full, None), ("lora", adapted, adapted.train.lora))
    }
    assert need["lora"] < need["full"] / 3
    free = (need["lora"] + need["full"]) / 2
    monkeypatch.setattr(memory, "available_memory", lambda device: free)
    memory.check_step_fits(adapted, device, dtype, 1)
    with pytest.raises(MinilmError, match=r"^train.batch_size=2 x model.block_size=64 .*parameters\): a training step"):
        memory.check_step_fits(full, device, dtype, 1)
    monkeypatch.setattr(memory, "available_memory", lambda device: need["lora"] / 2)
    with pytest.raises(
        MinilmError, match=r"lora.r=2\): a training step needs (at least )?[\d.]+ MiB .* but [\d.]+ MiB is free on cpu"
    ):
        memory.check_step_fits(adapted, device, dtype, 1)


def test_a_count_too_long_for_the_dry_run_is_refused_before_or_while_it_runs(monkeypatch):
    """Written-out attention (ALiBi's bias here) is counted chunk by chunk, so its work grows with
    the length: past ``DRY_RUN_OPERATIONS`` the count is refused with the largest length that fits
    (estimated from two short dry runs), or stops where the estimate fell short; SDPA's is not."""
    alibi = ModelConfig(vocab_size=300, n_layer=2, n_head=2, d_model=32, block_size=4096, position={"kind": "alibi"})
    monkeypatch.setattr(memory, "DRY_RUN_OPERATIONS", 3000)
    with pytest.raises(
        memory.DryRunTooLong, match=r"model.block_size=4096: .* count at model.block_size <= [0-9,]+\)?$"
    ):
        step_memory(alibi, 2, 4, torch.float32, "adamw")
    largest = int(
        str(pytest.raises(memory.DryRunTooLong, step_memory, alibi, 2, 4, torch.float32, "adamw").value)
        .rsplit("<= ", 1)[1]
        .replace(",", "")
    )
    step_memory(dataclasses.replace(alibi, block_size=largest // 2), 2, 4, torch.float32, "adamw")  # counted
    monkeypatch.setattr(memory, "check_countable", lambda *args: None)  # the estimate passes it: the dry run stops
    with pytest.raises(memory.DryRunTooLong, match="3,001 or more torch operations"):
        step_memory(alibi, 2, 4, torch.float32, "adamw")
    rope = dataclasses.replace(alibi, position={"kind": "rope"}, block_size=2**24)
    assert step_memory(rope, 2, 4, torch.float32, "adamw")[0]["activations"] > 2**24 * 32 * 4


@pytest.mark.slow
def test_the_memory_command_answers_at_its_largest_depth_and_length_in_seconds():
    env = {**os.environ, "PYTHONPATH": REPO}
    run = partial(run_python, cwd=REPO, env=env, timeout=120)
    deep = run(["-m", "minilm", "memory", "model.n_layer=1024", "model.block_size=16777216"])
    assert deep.returncode == 0, deep.stderr
    assert "1024 layers x d_model 192, vocabulary 4,096, 8 x 16777216 tokens per process" in deep.stdout
    long = run(["-m", "minilm", "memory", "alibi.yaml", "model.block_size=16777216"])
    assert long.returncode == 2 and long.stderr.count("\n") == 1, long.stderr
    assert long.stderr.startswith("error: model.block_size=16777216: the count would run") and "<= " in long.stderr


@pytest.mark.slow
def test_the_memory_command_counts_a_llama_3_8b_shape_without_allocating_it():
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = run_python(
        ["-m", "minilm", "memory", "llama3_8b_shape.yaml", "--ranks", "8"], cwd=REPO, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "32 layers x d_model 4096, vocabulary 128,256, 1 x 8192 tokens per process, 8 processes" in proc.stdout
    rows = [
        line.split("|")[1:-1]
        for line in proc.stdout.splitlines()
        if line.startswith("| ddp") or line.startswith("| fsdp")
    ]
    weights = {(r[0].strip(), r[1].strip()): float(r[2]) for r in rows}
    assert weights["ddp", "no"] == pytest.approx(8.03e9 * 4 / 2**30, rel=0.01)  # 8.03B float32 weights
    assert weights["fsdp", "yes"] == pytest.approx(weights["ddp", "no"] / 8, abs=0.06)  # one decimal
    bad = run_python(["-m", "minilm", "memory", "--ranks", "0"], cwd=REPO, env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr == "error: --ranks 0 is invalid: expected a number of processes >= 1\n"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_lora_step_is_counted_as_it_runs(checkpointing, dtype):
    """A LoRA run's step: the dry run of the adapted model keeps what a real CPU pass keeps
    (frozen weights in the compute dtype, adapters float32 under autocast), and weights,
    gradients and optimiser state follow the trained / frozen split."""
    config = ModelConfig(vocab_size=300, n_layer=2, n_head=2, d_model=32, block_size=24, **SHAPES["llama-like"])
    lora = LoRAConfig(r=4, targets=["q", "v", "mlp"], also_train=["norms"])
    real = activation_bytes(config, 3, dtype, checkpointing, gathered=False, device="cpu", lora=lora)
    assert activation_bytes(config, 3, dtype, checkpointing, gathered=False, lora=lora) == real > 0
    model = GPT(config)
    trainable = add_adapters(model, lora.targets, lora.r, lora.alpha, lora.also_train)
    frozen = sum(p.numel() for p in model.parameters()) - trainable
    assert lora_counts(config, lora) == (trainable, frozen)
    width = torch.empty((), dtype=dtype).element_size()
    rows = step_memory(config, 3, 4, dtype, "adamw", lora=lora)
    assert [(r["parallel"], r["checkpointing"]) for r in rows] == [("ddp", False), ("ddp", True)]
    assert rows[0]["weights"] == 4 * trainable + width * frozen
    assert rows[0]["gradients"] == 8 * trainable and rows[0]["optimizer"] == 8 * trainable
    full = step_memory(config, 3, 4, dtype, "adamw")[0]
    state = lambda row: row["weights"] + row["gradients"] + row["optimizer"]  # noqa: E731
    assert state(rows[0]) < state(full) / 2 and rows[0]["total"] < full["total"]


def test_memory_counts_the_model_train_init_from_would_train(tmp_path, gen_tokenizer):
    """With ``train.init_from`` a minilm run, the run's architecture is counted, not the config's; a
    rope factor over it asks for factor x its length; a source that cannot be read is refused."""
    source = load_config("rope.yaml", ["model.n_layer=2", "model.block_size=64", f"out_dir={tmp_path / 'src'}"])
    model_config = dataclasses.replace(source.model, vocab_size=gen_tokenizer.vocab_size)
    checkpoint.save(
        {
            "model": GPT(model_config).state_dict(),
            "config": dataclasses.replace(source, model=model_config).to_dict(),
            "tokenizer": gen_tokenizer.to_bytes(),
        },
        source.out_dir,
    )
    scaled = load_config(
        "extend_yarn_lora.yaml", [f"train.init_from={source.out_dir}", "train.lora.r=0", "train.lora.also_train=[]"]
    )
    model, said = counted_model(scaled)
    assert (model.n_layer, model.block_size) == (2, 256) and model.position["scaling"]["factor"] == 4
    assert said == f" (the architecture of train.init_from={source.out_dir})"
    gone = load_config("rope.yaml", [f"train.init_from={tmp_path / 'gone'}"])
    with pytest.raises(ConfigError, match="train.init_from=.* cannot be read .*; memory counts the model that run"):
        counted_model(gone)


def test_memory_counts_the_vocabulary_of_data_tokenizer(hf_tokenizer_dir, capsys):
    """A run with ``data.tokenizer`` has that tokenizer's vocabulary (its embedding, head and logits), not
    data.vocab_size, the size of a tokenizer to train."""
    assert memory_command.main(["rope.yaml", f"data.tokenizer={hf_tokenizer_dir}", "model.n_layer=1"]) == 0
    vocabulary = memory_command.configured_tokenizer(
        load_config("rope.yaml", [f"data.tokenizer={hf_tokenizer_dir}"]).data
    )
    assert f"1 layers x d_model 192, vocabulary {vocabulary.vocab_size:,}, " in capsys.readouterr().out


def test_a_bad_context_is_refused_before_anything_is_printed(capsys):
    assert memory_command.main(["rope.yaml", "--context", "0"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "error: --context 0 is invalid: expected a number of tokens >= 1\n"
