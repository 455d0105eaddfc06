"""Context extension (minilm.checkpoints.extension, through minilm.checkpoints.loading and train.init_from): the
source's weights move into the extended model."""

import pytest
import torch

from minilm import GPT
from minilm.checkpoints import format as checkpoint
from minilm.checkpoints.extension import complete_position, load_source_weights
from minilm.checkpoints.format import CheckpointError
from minilm.checkpoints.loading import load_model
from minilm.config import ConfigError, build_config
from minilm.configfile import load_config
from minilm.positions import build, describe, unwrap_setting
from minilm.training.source import source_model

MODEL = {"vocab_size": 53, "n_layer": 2, "n_head": 2, "d_model": 16}
TOKENIZER = {}


@pytest.fixture(autouse=True)
def tokenizer_bytes(gen_tokenizer):
    """Checkpoints carry a real tokenizer: the loader reads it."""
    TOKENIZER["bytes"] = gen_tokenizer.to_bytes()


def source(tmp_path, kind, block_size=16, **position):
    config = build_config(
        {
            "model": {**MODEL, "block_size": block_size, "position": {"kind": kind, **position}},
            "out_dir": str(tmp_path / kind),
        }
    )
    torch.manual_seed(0)
    model = GPT(config.model).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("positions") or name.endswith("qkv.weight"):
                p.normal_(0, 0.5)
    path = checkpoint.save(
        {"model": model.state_dict(), "config": config.to_dict(), "tokenizer": TOKENIZER["bytes"]}, config.out_dir
    )
    return path, model


def extend(path, block_size, position, **model):
    config = build_config(
        {"model": {**MODEL, **model, "block_size": block_size, "position": position}, "train": {"init_from": path}}
    )
    config, source, _ = source_model(config)
    return config, source.model


def same_weights(a, b, skip=()):
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa if k in sb and k not in skip)


def test_rope_to_yarn_factor_one_gives_identical_logits(tmp_path):
    path, src = source(tmp_path, "rope")
    config, new = extend(path, 64, {"kind": "rope", "scaling": {"type": "yarn", "factor": 1}})
    assert config.model.position["scaling"]["original_max_positions"] == 16
    idx = torch.randint(0, 53, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(new(idx), src(idx), atol=1e-6)


@pytest.mark.parametrize("scaling", ["linear", "ntk", "dynamic", "yarn"])
def test_rope_scalings_take_the_original_length_from_the_source(tmp_path, scaling):
    path, src = source(tmp_path, "rope")
    config, new = extend(path, 64, {"kind": "rope", "scaling": {"type": scaling, "factor": 4}})
    resolved = {"type": scaling, "factor": 4.0, "original_max_positions": 16}
    assert {key: new.positions.scaling[key] for key in resolved} == resolved  # yarn adds its resolved defaults
    assert same_weights(src, new)
    kept = extend(path, 64, {"kind": "rope", "scaling": {"type": scaling, "factor": 4, "original_max_positions": 8}})[1]
    assert kept.positions.scaling["original_max_positions"] == 8  # given values win


def test_rope_to_linear_equals_interpolated_positions(tmp_path):
    path, src = source(tmp_path, "rope")
    _, linear = extend(path, 64, {"kind": "rope", "scaling": {"type": "linear", "factor": 4}})
    _, wrapped = extend(path, 64, {"kind": "interpolated"})  # base and factor from the source
    idx = torch.randint(0, 53, (1, 64), generator=torch.Generator().manual_seed(1))
    assert wrapped.positions.factor == 4.0
    with torch.no_grad():
        assert torch.allclose(linear(idx), wrapped(idx), atol=1e-5)


def test_learned_table_grows_by_linear_interpolation(tmp_path):
    path, src = source(tmp_path, "learned")
    _, new = extend(path, 64, {"kind": "learned"})
    old, grown = src.positions.table.weight, new.positions.table.weight
    assert grown.shape == (64, 16)
    assert torch.allclose(grown[0], old[0]) and torch.allclose(grown[63], old[15])
    assert torch.allclose(grown[21], old[5], atol=1e-6)  # 21 * 15/63 = 5 exactly
    assert torch.allclose(grown[42], old[10], atol=1e-6)
    assert torch.allclose(grown[10], old[2] + (old[3] - old[2]) * (10 * 15 / 63 - 2), atol=1e-6)
    assert same_weights(src, new, skip={"positions.table.weight"})


def test_a_shorter_block_size_keeps_a_learned_tables_first_rows(tmp_path):
    """model.block_size below the training length (at evaluation or generation) is the same model on the
    positions it keeps: the table's first rows as they are, not the table squeezed over fewer rows."""
    path, src = source(tmp_path, "learned")
    _, short = extend(path, 8, {"kind": "learned"})
    assert torch.equal(short.positions.table.weight, src.positions.table.weight[:8])
    idx = torch.randint(0, 53, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(short(idx), src(idx))


@pytest.mark.parametrize("kind", ["learned", "sinusoidal", "t5", "alibi", "rope", "none"])
def test_any_kind_to_interpolated_of_the_same_kind(tmp_path, kind):
    path, src = source(tmp_path, kind)
    config, new = extend(path, 64, {"kind": "interpolated"})
    position = config.model.position
    assert position["inner"]["kind"] == kind
    expected = 63 / 15 if kind == "learned" else 4.0  # learned: the last new position lands on the last row
    assert position["factor"] == pytest.approx(expected)
    src_state, new_state = src.state_dict(), new.state_dict()
    for key, value in src_state.items():
        moved = key.replace("positions.", "positions.inner.") if key.startswith("positions.") else key
        assert torch.equal(new_state[moved], value), key
    idx = torch.randint(0, 53, (1, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = new(idx)  # every position of the new block_size is usable
        assert torch.allclose(out[0, 0], src(idx[:, :1])[0, 0], atol=1e-5)  # position 0 is unchanged


def test_interpolated_learned_handles_float_rounding_of_positions(tmp_path):
    path, _ = source(tmp_path, "learned", block_size=64)  # 255 / (255/63) rounds to 63.000004 in float32
    config, new = extend(path, 256, {"kind": "interpolated"})
    with torch.no_grad():
        assert new(torch.zeros((1, 256), dtype=torch.long)).isfinite().all()


def test_mismatches_are_clear_errors(tmp_path):
    path, _ = source(tmp_path, "rope")
    with pytest.raises(CheckpointError, match="model.d_model=32 but the source has 16"):
        extend(path, 64, {"kind": "rope"}, d_model=32)
    with pytest.raises(CheckpointError, match="trained with 'rope' positions, not 'alibi'"):
        extend(path, 64, {"kind": "alibi"})
    with pytest.raises(CheckpointError, match="not 'learned'"):
        extend(path, 64, {"kind": "interpolated", "inner": {"kind": "learned", "max_positions": 64}})
    learned, _ = source(tmp_path, "learned")
    with pytest.raises(ConfigError, match="covers positions 0..60 but model.block_size=64"):
        extend(learned, 64, {"kind": "interpolated", "factor": 4})
    with pytest.raises(CheckpointError, match="does not exist"):
        extend(str(tmp_path / "missing"), 64, {"kind": "rope"})
    state = checkpoint.load(learned)
    state["model"]["positions.table.weight"] = torch.zeros(16, 8)  # a wrong width cannot be interpolated
    with pytest.raises(CheckpointError, match="shape mismatch"):
        load_source_weights(
            GPT(build_config({"model": {**MODEL, "block_size": 64, "position": {"kind": "learned"}}}).model), state
        )


def test_complete_position_leaves_its_input_alone():
    position = {"kind": "interpolated"}
    out = complete_position(position, {"position": {"kind": "sinusoidal", "base": 100.0}, "block_size": 8}, 32)
    assert position == {"kind": "interpolated"}
    assert out == {"kind": "interpolated", "inner": {"kind": "sinusoidal", "base": 100.0}, "factor": 4.0}


@pytest.mark.parametrize(
    "name,source_config",
    [
        ("extend_rope_pi", "rope.yaml"),
        ("extend_rope_ntk", "rope.yaml"),
        ("extend_rope_yarn", "rope.yaml"),
        ("extend_learned_interp", "learned.yaml"),
        ("extend_sinusoidal_interp", "sinusoidal.yaml"),
    ],
)
def test_shipped_extension_configs_load_their_source(tmp_path, name, source_config):
    src = load_config(source_config, [f"out_dir={tmp_path / 'src'}", "model.vocab_size=4096"])
    torch.manual_seed(0)
    src_model = GPT(src.model)
    path = checkpoint.save(
        {"model": src_model.state_dict(), "config": src.to_dict(), "tokenizer": TOKENIZER["bytes"]}, src.out_dir
    )
    config = load_config(f"{name}.yaml", [f"train.init_from={path}"])
    assert config.model.block_size == 4 * src.model.block_size and config.train.lr < src.train.lr
    assert config.train.max_steps < src.train.max_steps
    config, source, _ = source_model(config)
    new = source.model
    position = config.model.position
    if position["kind"] == "rope":
        assert position["scaling"]["factor"] == 4
        assert new.positions.scaling["original_max_positions"] == src.model.block_size
    else:
        assert position["inner"]["kind"] == src.model.position["kind"]
        assert new.positions.position_limit() is None or new.positions.position_limit() >= config.model.block_size
    assert same_weights(src_model, new) or position["kind"] == "interpolated"


def test_a_scaling_factor_sets_the_length_from_any_source(tmp_path):
    """extend_yarn_lora.yaml names no block_size: from a source of 16 positions its factor 4 trains at
    64, not at a length written for another base; a block_size set apart from the factor is said."""
    path, _ = source(tmp_path, "rope", block_size=16)
    config = load_config(
        "extend_yarn_lora.yaml", [f"train.init_from={path}", "train.lora.r=0", "train.lora.also_train=[]"]
    )
    config, _, said = source_model(config)
    assert config.model.block_size == 64 and config.model.position["scaling"]["factor"] == 4
    assert "block_size 16 -> 64" in said and "note" not in said
    config = load_config("extend_yarn_lora.yaml", [f"train.init_from={path}", "model.block_size=512"])
    config, _, said = source_model(config)
    assert config.model.block_size == 512 and "model.block_size=512 is not the scaling's factor x" in said


def test_old_checkpoints_and_configs_with_interpolated_base_still_load(tmp_path):
    """Before 'inner', interpolated called its wrapped scheme 'base': both keep loading."""

    config = build_config(
        {
            "model": {
                **MODEL,
                "block_size": 31,
                "position": {"kind": "interpolated", "base": {"kind": "learned"}, "factor": 2},
            },
            "out_dir": str(tmp_path / "old"),
        }
    )
    assert config.model.position == {"kind": "interpolated", "inner": {"kind": "learned"}, "factor": 2}
    torch.manual_seed(0)
    model = GPT(config.model).eval()
    old_tree = config.to_dict()
    old_tree["model"]["position"] = {"kind": "interpolated", "base": {"kind": "learned"}, "factor": 2}  # the old name
    path = checkpoint.save(
        {"model": model.state_dict(), "config": old_tree, "tokenizer": TOKENIZER["bytes"]}, config.out_dir
    )
    loaded = load_model(path)
    assert loaded.config.model.position["inner"] == {"kind": "learned"}
    idx = torch.randint(0, 53, (1, 31), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded.model(idx), model(idx))
    rescaled = load_model(path, ["model.position.inner.kind=learned"])  # overrides use the new name
    assert rescaled.model.positions.factor == 2.0
    assert torch.equal(rescaled.model.positions.inner.table.weight, model.positions.inner.table.weight)
    yaml_file = tmp_path / "old.yaml"
    yaml_file.write_text("model:\n  position:\n    kind: interpolated\n    base: {kind: alibi}\n")
    assert load_config(str(yaml_file)).model.position["inner"] == {"kind": "alibi"}
    with pytest.raises(ConfigError, match="give 'inner' only"):
        build_config(
            {"model": {"position": {"kind": "interpolated", "base": {"kind": "rope"}, "inner": {"kind": "rope"}}}}
        )


def test_checkpoints_from_before_embedding_scale_load_unscaled(tmp_path):
    config = build_config(
        {
            "model": {**MODEL, "block_size": 16, "position": {"kind": "sinusoidal"}, "embedding_scale": 1.0},
            "out_dir": str(tmp_path / "old"),
        }
    )
    model = GPT(config.model).eval()
    tree = config.to_dict()
    del tree["model"]["embedding_scale"]  # written before the option existed
    path = checkpoint.save(
        {"model": model.state_dict(), "config": tree, "tokenizer": TOKENIZER["bytes"]}, config.out_dir
    )
    loaded = load_model(path)
    assert loaded.model.embedding_scale == 1.0
    idx = torch.randint(0, 53, (1, 16))
    with torch.no_grad():
        assert torch.equal(loaded.model(idx), model(idx))


def test_a_randomized_model_loads_as_its_wrapped_scheme_with_the_same_evaluation_logits(tmp_path):
    """randomized hands its wrapped scheme the plain positions at evaluation, so a randomized
    learned model is the learned model its table makes: loading sees through the wrapper (the
    kind inside it is what must match) and moves positions.inner.table.weight out of it."""
    path, src = source(tmp_path, "randomized", inner={"kind": "learned"}, max_positions=32)
    plain = load_model(path, ["model.position={kind: learned, max_positions: 32}"]).model
    assert torch.equal(plain.state_dict()["positions.table.weight"], src.state_dict()["positions.inner.table.weight"])
    idx = torch.randint(0, 53, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(plain(idx), src(idx))
    with pytest.raises(CheckpointError, match="trained with 'learned' positions, not 'rope'"):
        load_model(path, ["model.position={kind: randomized, inner: rope}"])


def test_unwrap_agrees_for_settings_and_schemes():
    setting = {"kind": "interpolated", "factor": 4.0, "inner": {"kind": "randomized", "inner": {"kind": "learned"}}}
    scheme = build(setting, d_model=16, n_head=2, block_size=64)
    inner, factor = scheme.unwrap()
    assert inner.kind == unwrap_setting(setting)["kind"] == "learned" and factor == 4.0
    assert build({"kind": "rope"}, d_model=16, n_head=2, block_size=8).unwrap()[1] == 1.0
    assert describe(setting) == "interpolated(randomized(learned)) x4"


def test_a_longer_block_size_at_load_keeps_each_layer_types_trained_positions(tmp_path):
    """model.block_size changed at evaluation or generation: a layer type's own rope scaling keeps its
    original length and randomized positions keep the range they trained on, as model.position's do (the
    same logits on what the model trained on)."""
    layers = {
        "pattern": ["a", "g"],
        "a": {},
        "g": {"position": {"kind": "rope", "scaling": {"type": "yarn", "factor": 4}}},
    }
    config = build_config({"model": {**MODEL, "block_size": 32, "position": {"kind": "rope"}, "layers": layers}})
    torch.manual_seed(0)
    model = GPT(config.model).eval()
    state = {"model": model.state_dict(), "config": config.to_dict(), "tokenizer": TOKENIZER["bytes"]}
    path = checkpoint.save(state, str(tmp_path / "layered"))
    longer = load_model(path, ["model.block_size=64"])
    scaling = longer.config.model.layers["g"]["position"]["scaling"]
    assert scaling["original_max_positions"] == 32
    idx = torch.randint(0, 53, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(longer.model(idx), model(idx), atol=1e-5)
    drawn, _ = source(tmp_path, "randomized", block_size=16, inner={"kind": "rope"})
    assert load_model(drawn, ["model.block_size=32"]).config.model.position["max_positions"] == 128  # 8 x 16
