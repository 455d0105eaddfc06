"""Tests for minilm.config and the config side of minilm train: lookup, overrides, errors, the shipped configs."""

import dataclasses
import os
import typing

import pytest
import yaml

from minilm.cli import smoke
from minilm.cli import train as train_command
from minilm.common import MinilmError, Range, check_number
from minilm.config import (
    Config,
    ConfigError,
    DataConfig,
    LoRAConfig,
    ModelConfig,
    TrainConfig,
    build_config,
    resolve_config,
)
from minilm.configfile import find_config_file, load_config
from minilm.model.gpt import GPT
from tests.conftest import REPO
from tests.forkrun import run_python

CONFIGS = ("sinusoidal", "learned", "rope", "alibi", "t5", "nope", "interpolated")


def run_cli(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    return run_python(["train.py", *args], cwd=REPO, env=env, timeout=120)


def test_overrides_are_typed_as_yaml():
    config = load_config(
        "rope.yaml",
        [
            "train.max_steps=200",
            "model.position.kind=alibi",
            "train.lr=3e-3",
            "train.compile=true",
            "train.init_from=out/rope",
            "model.dropout=0",
        ],
    )
    assert config.train.max_steps == 200 and config.model.position == {"kind": "alibi"}
    assert config.train.lr == 3e-3 and isinstance(config.train.lr, float)
    assert config.train.compile is True and config.train.init_from == "out/rope"
    assert config.model.dropout == 0.0 and isinstance(config.model.dropout, float)
    nested = load_config("rope.yaml", ["model.position={kind: rope, scaling: {type: yarn, factor: 4}}"])
    assert nested.model.position["scaling"] == {"type": "yarn", "factor": 4}


@pytest.mark.parametrize(
    "value, on",
    [("", False), (" ", False), ("0", False), ("false", False), ("no", False), ("off", False), ("False", False)]
    + [("1", True), ("true", True), ("yes", True), ("ON", True)],
)
def test_the_smoke_switch_reads_as_a_configs_boolean(monkeypatch, value, on):
    monkeypatch.setenv("MINILM_SMOKE", value)
    assert smoke.active() is on


def test_a_smoke_switch_that_is_no_boolean_is_refused(monkeypatch):
    monkeypatch.setenv("MINILM_SMOKE", "maybe")
    with pytest.raises(ConfigError, match="MINILM_SMOKE='maybe' is invalid: expected 1, true, yes or on"):
        smoke.active()


def test_integers_read_as_yaml_1_2_in_files_and_overrides(tmp_path):
    """``010`` is ten (YAML 1.1: eight), ``0o17`` fifteen, ``0x10`` sixteen; ``1:20`` is text, not 80."""
    (tmp_path / "ints.yaml").write_text("train:\n  max_steps: 010\n  eval_interval: 0o17\n")
    config = load_config(str(tmp_path / "ints.yaml"), ["train.log_interval=0x10"])
    assert (config.train.max_steps, config.train.eval_interval, config.train.log_interval) == (10, 15, 16)
    with pytest.raises(ConfigError, match="train.max_steps='1:20' has the wrong type"):
        load_config("rope.yaml", ["train.max_steps=1:20"])


@pytest.mark.parametrize(
    "override, expected",
    [
        ("train.max_step=5", r"unknown key 'train.max_step': did you mean max_steps"),
        ("trian.lr=1", r"unknown key 'trian': did you mean train"),
        ("model.nlayer=2", r"unknown key 'model.nlayer': did you mean n_layer"),
        ("train.max_steps=abc", r"train.max_steps='abc' has the wrong type: expected int"),
        ("train.lr=fast", r"train.lr='fast' has the wrong type: expected float"),
        ("train.dtype=fp16", r"train.dtype='fp16' is invalid: valid: auto, float32, bfloat16"),
        ("train.batch_size=0", r"train.batch_size=0 is invalid"),
        ("train.grad_clip=-1", r"train.grad_clip=-1.0 is invalid"),
        ("train.beta2=1.5", r"train.beta2=1.5 is invalid"),
        ("train.min_lr=1", r"train.min_lr=1.0 are invalid"),
        ("train.schedule=linear", r"train.schedule='linear' is invalid: valid: cosine, wsd"),
        ("train.cooldown=0", r"train.cooldown=0.0 is invalid: expected a fraction of max_steps, 0 < cooldown <= 1"),
        ("model.position.kind=rop", r"unknown position kind 'rop': did you mean rope"),
        ("model.position.bsae=5", r"unknown option 'bsae' for position kind 'rope': did you mean base"),
        ("model.n_head=5", r"model.d_model=192 is not divisible by model.n_head=5"),
        ("train.max_steps", r"has no value: write it as train.max_steps=VALUE"),
    ],
)
def test_errors_are_one_line_and_name_the_key(override, expected):
    with pytest.raises(ConfigError, match=expected) as info:
        load_config("rope.yaml", [override])
    assert "\n" not in str(info.value)


def test_config_lookup_a_users_path_then_configs_then_the_shipped_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert os.path.samefile(find_config_file("rope.yaml"), os.path.join(REPO, "minilm", "configs", "rope.yaml"))
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "rope.yaml").write_text("out_dir: in-configs\n")
    assert load_config("rope.yaml").out_dir == "in-configs"
    (tmp_path / "rope.yaml").write_text("out_dir: mine\n")
    assert find_config_file("rope.yaml") == "rope.yaml"
    assert load_config("rope.yaml").out_dir == "mine"
    with pytest.raises(ConfigError, match=r"config file 'ropee.yaml' not found.*did you mean rope.yaml"):
        load_config("ropee.yaml")
    (tmp_path / "bad.yaml").write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config("bad.yaml")


EXPORT_LAYOUTS = {  # what a transformers family needs: rope as Qwen3, learned as GPT-2, alibi as MPT
    "rope": {"norm": "rmsnorm", "mlp": "swiglu", "d_ff": 512},
    "learned": {"qk_norm": False},
    "alibi": {"qk_norm": False},
}


def test_shipped_configs_differ_only_in_position_out_dir_and_export_layout():
    """... and rope.yaml, the main job, compiles its step (train.compile: auto; the others train eager)."""
    base = None
    for name in CONFIGS:
        config = load_config(f"{name}.yaml")
        assert config.out_dir == f"out/{name}"
        GPT(resolve_config(config).model)  # every one builds
        tree = config.to_dict()
        assert tree["train"].pop("compile") == ("auto" if name == "rope" else False), name
        del tree["out_dir"], tree["model"]["position"]
        layout = EXPORT_LAYOUTS.get(name, {})
        assert {k: tree["model"][k] for k in layout} == layout, name
        for key in set(layout) | {k for other in EXPORT_LAYOUTS.values() for k in other}:
            del tree["model"][key]  # the layout keys are checked above (the others' shared values below)
        base = base or tree
        assert tree == base, name
    shared = load_config("sinusoidal.yaml").model
    assert (shared.norm, shared.mlp, shared.qk_norm) == ("layernorm", "gelu", True)
    positions = {name: load_config(f"{name}.yaml").model.position["kind"] for name in CONFIGS}
    assert positions == {
        "sinusoidal": "sinusoidal",
        "learned": "learned",
        "rope": "rope",
        "alibi": "alibi",
        "t5": "t5",
        "nope": "none",
        "interpolated": "interpolated",
    }


def test_vocab_size_follows_the_tokenizer_setting():
    config = resolve_config(load_config("rope.yaml", ["data.vocab_size=1000"]))
    assert config.model.vocab_size == 1000


@pytest.mark.slow
def test_print_config_prints_the_resolved_yaml():
    result = run_cli("--config", "alibi.yaml", "--print-config", "train.max_steps=7", "data.vocab_size=2000")
    assert result.returncode == 0, result.stderr
    tree = yaml.safe_load(result.stdout)
    assert tree["train"]["max_steps"] == 7 and tree["model"]["position"] == {"kind": "alibi"}
    assert tree["model"]["vocab_size"] == 2000 and tree["out_dir"] == "out/alibi"
    assert (
        load_config("alibi.yaml", ["train.max_steps=7", "data.vocab_size=2000", "model.vocab_size=2000"]).to_dict()
        == tree
    )


@pytest.mark.slow
def test_cli_config_errors_exit_2_with_one_line():
    result = run_cli("--config", "rope.yaml", "train.max_step=5")
    assert result.returncode == 2
    assert result.stderr.startswith("error: unknown key 'train.max_step'") and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    result = run_cli("--config", "missing.yaml", "--print-config")
    assert result.returncode == 2 and result.stderr.startswith("error: config file 'missing.yaml' not found")


def test_configs_roundtrip_through_yaml():
    from minilm.config import build_config

    assert load_config(None, ["seed=1"]).seed == 1  # no file: the defaults
    for config in (Config(), load_config("interpolated.yaml", ["train.lr=2e-3"])):
        assert build_config(yaml.safe_load(config.to_yaml())) == config


def test_train_help_lists_every_config_key_with_its_default_and_what_it_does(capsys):
    with pytest.raises(SystemExit) as exit_:
        train_command.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for section, cls in (
        ("model", ModelConfig),
        ("data", DataConfig),
        ("train", TrainConfig),
        ("train.lora", LoRAConfig),
        (None, Config),
    ):
        for f in dataclasses.fields(cls):
            if f.name in ("model", "data", "train", "lora"):  # sections: their keys are listed
                continue
            key = f"{section}.{f.name}" if section else f.name
            assert f.metadata.get("help"), f"{key} has no help"
            line = next((x for x in out.splitlines() if x.startswith(f"  {key} = ")), None)
            assert line is not None and line.endswith(f.metadata["help"]), key
    assert "  train.optimizer = adamw (adamw | muon): muon: Muon" in out
    assert "  model.position = {kind: rope}: the position scheme" in out
    assert "  train.snapshot_steps = []: " in out and "  out_dir = out/run: " in out
    assert "  train.lora.targets = [q, k, v, o]: the linears that get adapters" in out


CHECKED_APART = {  # numbers whose valid values depend on another setting or are not a range
    "ModelConfig.embedding_scale": "a name (auto, sqrt) or a number",
    "ModelConfig.concat_position_dims": "even, below d_model",
    "ModelConfig.n_kv_head": "a divisor of n_head",
    "DataConfig.vocab_size": "the tokenizer's own check (check_vocab_size)",
    "TrainConfig.lr": "with min_lr: 0 <= min_lr <= lr",
    "TrainConfig.min_lr": "with lr",
    "TrainConfig.retrieval_share": "up to 1 only with retrieval_weight",
}


def test_every_number_setting_declares_its_range_on_its_option():
    """A numeric setting is checked by the ``Range`` its ``option`` declares (one validator,
    ``common.check_number``), unless it is listed with the reason it is checked apart."""
    undeclared = set()
    for cls in (ModelConfig, DataConfig, TrainConfig, LoRAConfig, Config):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kinds = {hints[f.name], *typing.get_args(hints[f.name])}
            if kinds & {int, float} and f.metadata.get("valid") is None:
                undeclared.add(f"{cls.__name__}.{f.name}")
    assert undeclared == set(CHECKED_APART)


@pytest.mark.parametrize(
    "valid, said, inside, outside",
    [
        (Range(1, 1024, integer=True), "an integer from 1 to 1,024", [1, 1024], [0, 1025, 2.0, True, None, "3"]),
        (Range(0, 1, high_open=True), "a number >= 0 and < 1", [0, 0.5], [1, -0.1, float("nan")]),
        (Range(0, low_open=True), "a number > 0", [1e-9, 10**400], [0, float("inf"), -1]),
        (Range(0, note=" (0 disables)"), "a number >= 0 (0 disables)", [0, 3.5], [-1]),
        (Range(1, integer=True, optional=True), "an integer >= 1", [None, 7], [0, 7.0]),
        (Range(0, 1e4, text="a weight up to 1e4"), "a weight up to 1e4", [1e4], [1e4 + 1]),
    ],
)
def test_the_one_numeric_check_says_its_range(valid, said, inside, outside):
    assert str(valid) == said
    assert [check_number("x", v, valid) for v in inside] == inside
    for value in outside:
        with pytest.raises(MinilmError) as caught:
            check_number("train.x", value, valid, ConfigError)
        assert type(caught.value) is ConfigError
        assert str(caught.value) == f"train.x={value!r} is invalid: expected {said}"


def test_a_weight_decay_that_flips_the_weights_sign_is_refused():
    """Decoupled decay multiplies each weight by 1 - rate x decay: at or past 1 the weights flip and blow up
    (a NaN later blamed on the rate); Muon's rate counts its scale."""
    with pytest.raises(ConfigError, match=r"train.weight_decay=5000 is invalid .* expected weight_decay below 100"):
        build_config({"train": {"lr": 0.01, "min_lr": 0.001, "weight_decay": 5000}})
    with pytest.raises(ConfigError, match="peak rate of 0.03"):
        muon = {"optimizer": "muon", "muon_lr_scale": 3}
        build_config({"train": {"lr": 0.01, "min_lr": 0.001, "weight_decay": 40, **muon}})
    build_config({"train": {"lr": 0.01, "min_lr": 0.001, "weight_decay": 40}})
