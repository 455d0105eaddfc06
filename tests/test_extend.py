"""``minilm extend`` (minilm.cli.extend, minilm.training.extend): a minilm run and a transformers directory
extended, the shape, tokenizer and original length taken from the source and the new length in the
written checkpoint; the shipped config's settings; LoRA; and the one-line refusals (a block_size that is
not the source's length x the factor, a bad method or factor, an unreadable source, no RoPE for a rope
scaling, positions scaled already, keys the command decides)."""

import dataclasses
import os
import re

import pytest
import torch

from minilm.checkpoints.format import load as load_checkpoint
from minilm.checkpoints.format import save
from minilm.cli.extend import main as extend
from minilm.config import Config, DataConfig, ModelConfig
from minilm.configfile import load_config
from minilm.hf.export import export_model
from minilm.model.gpt import GPT
from minilm.training.extend import default_out_dir, plan_extension

SHAPE = dict(n_layer=2, n_head=2, d_model=32, block_size=32)  # the source's; the configs say 4 x 192
LLAMA = dict(n_layer=2, n_head=2, n_kv_head=1, d_model=32, d_ff=64, block_size=32, norm="rmsnorm", mlp="swiglu")


def source_run(tokenizer, out_dir, **settings):
    """A minilm run's out_dir holding the checkpoint of a random model of ``SHAPE`` and ``settings``."""
    model_config = ModelConfig(vocab_size=tokenizer.vocab_size, **{**SHAPE, **settings})
    torch.manual_seed(0)
    config = Config(model=model_config, data=DataConfig(vocab_size=tokenizer.vocab_size))
    state = {"model": GPT(model_config).state_dict(), "config": config.to_dict(), "tokenizer": tokenizer.to_bytes()}
    save(state, str(out_dir))
    return str(out_dir)


def transformers_dir(tokenizer, directory, **settings):
    """A random Llama-shaped model written as a transformers model directory."""
    model_config = ModelConfig(vocab_size=tokenizer.vocab_size, tie_embeddings=False, **{**LLAMA, **settings})
    torch.manual_seed(0)
    config = Config(model=model_config, data=DataConfig(vocab_size=tokenizer.vocab_size))
    assert export_model(GPT(model_config), tokenizer, config, str(directory))["family"] == "llama"
    return str(directory)


def quick(corpus, *extra) -> list:
    """Overrides for a two-step extension on the tiny corpus (the shipped config's budget is 200 steps)."""
    return [
        f"data.corpus={corpus / 'corpus.txt'}",
        f"data.dir={corpus / 'data'}",
        "train.batch_size=2",
        "train.max_steps=2",
        "train.warmup_steps=1",
        "train.eval_interval=2",
        "train.eval_iters=1",
        "train.checkpoint_interval=2",
        "train.sample_tokens=0",
        "train.final_eval_tokens=0",
        "train.dtype=float32",
        "train.device=cpu",
        *extra,
    ]


def paragraph(err: str) -> str:
    """What the command said it will train, its lines joined."""
    return re.search(r"extend .*? into \S+\.(?= |$)", " ".join(err.split())).group(0)


def refused(capsys, *argv) -> str:
    """The one error line of a refused ``minilm extend``, after checking its status 2."""
    try:
        status = extend(list(argv))
    except SystemExit as exit:  # argparse's own refusals
        status = exit.code
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


@pytest.mark.slow
def test_a_minilm_run_is_extended_with_its_own_shape_and_length(gen_tokenizer, tiny_corpus, tmp_path, capsys):
    """The source's 2 layers x 32 where extend_rope_yarn.yaml says 4 x 192 (the refusal a plain
    train.init_from gave), its 32 tokens as the original length, 2 x 32 as the new one."""
    source = source_run(gen_tokenizer, tmp_path / "rope", position={"kind": "rope"})
    assert extend([source, "--method", "yarn", "--factor", "2", *quick(tiny_corpus)]) == 0
    said = paragraph(capsys.readouterr().err)
    assert "a minilm run of 2 layers x d_model 32" in said and "trained at 32 tokens" in said
    assert "every weight" in said and "32 x 2 = 64 tokens" in said and "2 steps" in said
    assert f"into {tmp_path / 'rope-yarn-x2'}" in said and "extend_rope_yarn.yaml" in said
    state = load_checkpoint(str(tmp_path / "rope-yarn-x2"))  # beside the source, not in it
    model = state["config"]["model"]
    assert (model["n_layer"], model["n_head"], model["d_model"], model["block_size"]) == (2, 2, 32, 64)
    assert model["vocab_size"] == gen_tokenizer.vocab_size
    assert model["position"]["scaling"] == {**model["position"]["scaling"], "type": "yarn", "factor": 2.0}
    assert model["position"]["scaling"]["original_max_positions"] == 32
    assert state["config"]["train"]["lr"] == 2.5e-4  # the shipped config's schedule


@pytest.mark.slow
def test_a_transformers_directory_is_extended_with_lora(gen_tokenizer, tiny_corpus, tmp_path, capsys):
    """A Llama directory (grouped-query heads, its own tokenizer) extended 2x with linear scaling and the
    adapters of extend_yarn_lora.yaml: only what LoRA trains is in the checkpoint, the base named."""
    base = transformers_dir(gen_tokenizer, tmp_path / "llama")
    out = tmp_path / "ext"
    assert extend([base, "--method", "pi", "--factor", "2", "--lora", "--out", str(out), *quick(tiny_corpus)]) == 0
    said = paragraph(capsys.readouterr().err)
    assert "a transformers Llama model of 2 layers" in said and "LoRA adapters (rank 8 on q, k, v, o" in said
    state = load_checkpoint(str(out))
    model, lora = state["config"]["model"], state["config"]["train"]["lora"]
    assert (model["n_kv_head"], model["d_ff"], model["norm"], model["block_size"]) == (1, 64, "rmsnorm", 64)
    assert model["position"]["scaling"]["type"] == "linear" and model["position"]["scaling"]["factor"] == 2.0
    assert model["position"]["scaling"]["original_max_positions"] == 32
    assert (lora["r"], lora["alpha"], lora["also_train"]) == (8, 16, ["norms", "embeddings"])
    assert state["lora_base"]["path"] == os.path.abspath(base)
    assert any(".lora_a." in name for name in state["model"])
    assert not any(name.endswith("qkv.weight") for name in state["model"])  # the base's frozen weights stay out


def test_the_run_is_the_shipped_configs_with_the_sources_shape(gen_tokenizer, tmp_path):
    """What ``minilm train --config extend_rope_yarn.yaml train.init_from=SOURCE`` trains, at factor x the
    source's length; the interpolation of a learned table takes extend_learned_interp.yaml."""
    source = source_run(gen_tokenizer, tmp_path / "rope", position={"kind": "rope"})
    plan = plan_extension(source, "yarn", 4.0)
    config, shipped = load_config(plan.config_path, plan.overrides), load_config("extend_rope_yarn.yaml")
    assert config.train == dataclasses.replace(shipped.train, init_from=source)
    assert config.data == shipped.data and config.seed == shipped.seed
    assert config.model.block_size == 128 and config.model.n_layer == 2 and config.model.d_model == 32
    assert config.model.position == {"kind": "rope", "scaling": {"type": "yarn", "factor": 4.0}}
    assert config.out_dir == str(tmp_path / "rope-yarn-x4")
    learned = plan_extension(source_run(gen_tokenizer, tmp_path / "learned", position={"kind": "learned"}), "interp", 4)
    assert os.path.basename(learned.config_path) == "extend_learned_interp.yaml" and learned.new_length == 128
    assert load_config(learned.config_path, learned.overrides).model.position["kind"] == "interpolated"


def test_a_minilm_source_is_extended_on_the_text_it_was_trained_on(gen_tokenizer, tmp_path, monkeypatch):
    """The run reads the source's corpus and text field (found from another directory as evaluation finds
    it), not the config's plays, cut as the source's was (end-of-text ids, document masks, the held-out
    tail: else it would train on the text the source held out); ``data.corpus`` given wins, and so does
    each setting given; a transformers source has the config's."""
    texts = tmp_path / "mine" / "texts.jsonl"
    texts.parent.mkdir()
    texts.write_text('{"body": "words"}\n')
    source = source_run(gen_tokenizer, tmp_path / "mine" / "out", position={"kind": "rope"})
    state = torch.load(os.path.join(source, "ckpt.pt"), weights_only=True)
    cut = {"end_of_text": True, "document_mask": "mask", "min_document_tokens": 8, "holdout_tokens": 100}
    state["config"]["data"].update(corpus="texts.jsonl", text_field="body", **cut)
    state["run_dir"] = str(tmp_path / "mine")
    save(state, source)
    monkeypatch.chdir(tmp_path)  # elsewhere: the relative corpus is found under the run's directory
    config = load_config((plan := plan_extension(source, "yarn", 2.0)).config_path, plan.overrides)
    assert (config.data.corpus, config.data.text_field) == (str(texts), "body")
    assert {key: getattr(config.data, key) for key in cut} == cut
    kept = plan_extension(source, "yarn", 2.0, overrides=["data.holdout_tokens=0"])
    assert load_config(kept.config_path, kept.overrides).data.holdout_tokens == 0
    plain = plan_extension(source, "yarn", 2.0, overrides=["data.end_of_text=false"])  # no ids: no masks either
    data = load_config(plain.config_path, plain.overrides).data
    assert (data.end_of_text, data.document_mask, data.min_document_tokens, data.holdout_tokens) == (
        False,
        "none",
        0,
        100,
    )
    given = plan_extension(source, "yarn", 2.0, overrides=["data.corpus=other.txt"])
    assert load_config(given.config_path, given.overrides).data.corpus == "other.txt"
    hf = plan_extension(transformers_dir(gen_tokenizer, tmp_path / "hf"), "yarn", 2.0)
    assert load_config(hf.config_path, hf.overrides).data.corpus == load_config("extend_rope_yarn.yaml").data.corpus


def test_the_default_out_dir_is_beside_the_source(tmp_path):
    (tmp_path / "run" / "snapshots").mkdir(parents=True)
    (tmp_path / "run" / "ckpt.pt").write_bytes(b"")
    (tmp_path / "run" / "snapshots" / "step-100.pt").write_bytes(b"")
    assert default_out_dir(str(tmp_path / "run") + "/", "yarn", 4.0) == str(tmp_path / "run-yarn-x4")
    assert default_out_dir(str(tmp_path / "run" / "ckpt.pt"), "yarn", 4.0) == str(tmp_path / "run-yarn-x4")
    snapshot = str(tmp_path / "run" / "snapshots" / "step-100.pt")
    assert default_out_dir(snapshot, "ntk", 2.5) == str(tmp_path / "run-step-100-ntk-x2.5")
    assert default_out_dir("hf:HuggingFaceTB/SmolLM2-135M", "yarn", 4) == os.path.join("out", "SmolLM2-135M-yarn-x4")
    assert default_out_dir(str(tmp_path / "run"), "yarn", 4, lora=True) == str(tmp_path / "run-yarn-x4-lora")


def test_a_block_size_other_than_the_factors_is_refused(gen_tokenizer, tmp_path, capsys):
    source = source_run(gen_tokenizer, tmp_path / "rope", position={"kind": "rope"})
    err = refused(capsys, source, "--method", "yarn", "--factor", "4", "model.block_size=1024")
    assert "model.block_size=1024 is not the new length 128 (the source's 32 x --factor 4)" in err
    assert not (tmp_path / "rope-yarn-x4").exists()
    assert extend(["model.block_size=128", source, "--method", "yarn", "--factor", "4", "--print-config"]) == 0
    assert "block_size: 128" in capsys.readouterr().out  # the derived length itself may be given, before SOURCE too


@pytest.mark.parametrize(
    "args, message",
    [
        (["--method", "yarnn", "--factor", "4"], "--method 'yarnn' is invalid: did you mean yarn?"),
        (["--method", "yarn", "--factor", "1"], "--factor 1.0 is invalid: expected a number > 1"),
        (["--method", "yarn", "--factor", "0.5"], "--factor 0.5 is invalid"),
        (["--method", "yarn", "--factor", "nan"], "--factor nan is invalid"),
        (["--method", "yarn", "--factor", "1.001"], "no longer; give a factor of at least"),
        (["--method", "yarn"], "the following arguments are required: --factor"),
        (["--method", "yarn", "--factor", "4", "model.position.scaling.type=ntk"], "give --method instead"),
        (["--method", "yarn", "--factor", "4", "model.position.scaling.factor=8"], "give --factor instead"),
        (["--method", "yarn", "--factor", "4", "train.init_from=out/x"], "give SOURCE instead"),
        (["--method", "yarn", "--factor", "4", "train={max_steps: 2}"], "replaces the whole train section"),
        (["--method", "yarn", "--factor", "4", "out/other"], "takes one SOURCE (a minilm run or a transformers"),
    ],
)
def test_bad_methods_factors_and_overrides_are_one_line_errors(args, message, gen_tokenizer, tmp_path, capsys):
    source = source_run(gen_tokenizer, tmp_path / "rope", position={"kind": "rope"})
    assert message in refused(capsys, source, *args)
    assert sorted(os.listdir(tmp_path)) == ["rope"]


def test_sources_that_cannot_be_extended_are_one_line_errors(gen_tokenizer, tmp_path, capsys):
    missing = str(tmp_path / "nothing")
    err = refused(capsys, missing, "--method", "yarn", "--factor", "4")
    assert f"cannot extend {missing!r}" in err and "or a transformers model directory" in err
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "ckpt.pt").write_bytes(b"not a checkpoint")
    assert "cannot extend" in refused(capsys, str(tmp_path / "junk"), "--method", "yarn", "--factor", "4")
    learned = source_run(gen_tokenizer, tmp_path / "learned", position={"kind": "learned"})
    err = refused(capsys, learned, "--method", "yarn", "--factor", "4")
    assert "--method yarn is a rope scaling, but" in err and "'learned' positions, no RoPE" in err
    assert "valid for it: --method interpolated" in err
    ntk = {"kind": "rope", "scaling": {"type": "ntk", "factor": 2}}
    scaled = source_run(gen_tokenizer, tmp_path / "scaled", position=ntk)
    assert "has positions rope+ntk x2, scaled already" in refused(capsys, scaled, "--method", "yarn", "--factor", "2")
    directory = transformers_dir(gen_tokenizer, tmp_path / "llama")
    err = refused(capsys, directory, "--method", "yarn", "--factor", "2", "model.n_layer=4")
    assert f"model.n_layer=4 is not the architecture of {directory!r}, which has 2" in err
    assert not os.path.exists(directory + "-yarn-x2")  # refused before anything is written
