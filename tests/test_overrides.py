"""One settings syntax for every verb (issue 60): ``section.key=value`` arguments anywhere among the
others, read by ``minilm.configfile.apply_overrides`` for every verb that takes settings; the old
spellings (``--set``, ``evaluate --position.KEY=VALUE``, ``positions plot --KEY VALUE``) still work with
a one-line note naming the new one; a partial mapping merges onto the default; suggestions that know
the RoPE scalings and the Hugging Face families."""

import pytest
import torch

from minilm.__main__ import main
from minilm.checkpoints import format as checkpoint
from minilm.checkpoints.loading import load_model
from minilm.cli import Parser, is_setting, split_settings
from minilm.cli import positions as positions_cli
from minilm.config import ConfigError, build_config
from minilm.configfile import load_config
from minilm.data.corpus import prepare
from minilm.model.gpt import GPT
from minilm.positions import scheme_class


@pytest.fixture(scope="module")
def rope_run(tiny_corpus):
    """An out_dir holding a random-weight rope checkpoint (block_size 32) on the tiny corpus."""
    data = {"corpus": str(tiny_corpus / "corpus.txt"), "vocab_size": 400, "dir": str(tiny_corpus / "data")}
    config = build_config(
        {
            "model": {"vocab_size": 400, "n_layer": 1, "n_head": 2, "d_model": 16, "block_size": 32},
            "data": data,
            "out_dir": str(tiny_corpus / "overrides-run"),
        }
    )
    prepared = prepare(config.data, quiet=True)
    torch.manual_seed(0)
    state = {"model": GPT(config.model).state_dict(), "config": config.to_dict(), "step": 0}
    checkpoint.save({**state, "tokenizer": prepared.tokenizer.to_bytes()}, config.out_dir)
    return config.out_dir


def run(capsys, argv):
    """``minilm ARGV`` in this process: (exit status, stdout, stderr)."""
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def one_line_error(status, err, *named):
    """Exit status 2 and one ``error:`` line on stderr (after any notes) naming each of ``named``."""
    lines = [line for line in err.splitlines() if not line.startswith("note: ")]
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    for text in named:
        assert text in lines[0], (text, lines[0])


# --------------------------------------------------------------------------- the one syntax, every verb

# verb -> (argv with {run} and {tmp}, the settings, the stream that shows them, what it shows)
VERBS = {
    "train": (
        ["train", "--print-config"],
        ["model.position.scaling.type=yarn", "model.position.scaling.factor=4"],
        "out",
        "type: yarn",
    ),
    "memory": (["memory", "--ranks", "1"], ["model.block_size=512"], "out", "x 512 tokens per process"),
    "generate": (
        ["generate", "--checkpoint", "{run}", "--max-new-tokens", "1", "--stats", "hi"],
        ["model.block_size=48"],
        "err",
        "context 48,",
    ),
    "evaluate": (
        ["evaluate", "{run}", "--lengths", "16", "--max-tokens", "64", "--no-files", "--quiet"],
        ["model.position.scaling.type=dynamic"],
        "out",
        "rope+dynamic",
    ),
    "longeval": (
        ["longeval", "{run}", "--tasks", "single", "--depths", "0", "--trials", "1", "--quiet"],
        ["model.block_size=40"],
        "out",
        "| depth | 40 | 80 | 160 |",
    ),
    "passkey eval": (
        ["passkey", "eval", "{run}", "--depths", "0", "--trials", "1"],
        ["model.block_size=100"],
        "out",
        "| 400 |",
    ),
    "positions plot": (
        ["positions", "plot", "rope", "--out", "{tmp}/rope.png"],
        ["model.position.scaling.type=yarn", "model.position.scaling.factor=4"],
        "out",
        "scaling: {type: yarn, factor: 4}",
    ),
    "positions plot --checkpoint": (
        ["positions", "plot", "--checkpoint", "{run}", "--out", "{tmp}/trained.png"],
        ["model.position.scaling.type=dynamic"],
        "out",
        "type: dynamic",
    ),
    "positions layers": (["positions", "layers"], ["model.n_layer=3"], "out", "rope.yaml: 3 layers"),
}


def filled(argv, rope_run, tmp_path):
    return [a.format(run=rope_run, tmp=tmp_path) for a in argv]


SLOW_VERBS = ("memory", "positions plot", "positions plot --checkpoint")  # a meta model of rope.yaml; matplotlib


@pytest.mark.parametrize("verb", [pytest.param(v, marks=pytest.mark.slow) if v in SLOW_VERBS else v for v in VERBS])
def test_every_verb_takes_settings_as_section_key_value(verb, rope_run, tmp_path, capsys):
    """The settings change what the verb does, wherever they stand: after the options, and first."""
    if verb.startswith("positions plot"):
        pytest.importorskip("matplotlib")
    argv, settings, stream, shown = VERBS[verb]
    argv = filled(argv, rope_run, tmp_path)
    words = 2 if verb.split(" ")[0] in ("passkey", "positions") else 1  # the verb and its command
    for order in (argv + settings, argv[:words] + settings + argv[words:]):
        status, out, err = run(capsys, order)
        assert status == 0, err
        assert shown in (out if stream == "out" else err), (out, err)
        assert "note:" not in err


@pytest.mark.slow
def test_lmeval_takes_settings_as_section_key_value(rope_run, tmp_path, capsys, monkeypatch):
    """lmeval's settings reach the model it scores (lm_eval's table does not show them)."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("accelerate")
    from minilm.evaluation import harness

    (tmp_path / "docs.jsonl").write_text('{"context": "The king is", "choices": [" dead", " here"], "label": 1}\n')
    (tmp_path / "choice.yaml").write_text(
        "task: minilm_choice\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {tmp_path / 'docs.jsonl'}\n"
        'test_split: test\ndoc_to_text: "{{context}}"\noutput_type: multiple_choice\n'
        'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\nmetric_list:\n  - metric: acc\n'
    )
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    positions = []

    def spy(*args, **kwargs):
        loaded = load_model(*args, **kwargs)
        positions.append(loaded.config.model.position)
        return loaded

    monkeypatch.setattr(harness, "load_model", spy)
    argv = ["lmeval", rope_run, "--tasks", "minilm_choice", "--include-path", str(tmp_path), "--limit", "1"]
    for old, extra in (
        (False, ["model.position.scaling.type=dynamic"]),
        (True, ["--set", "model.position.scaling.type=ntk"]),
    ):
        status, out, err = run(capsys, argv + extra + ["model.position.scaling.factor=2"])
        assert status == 0, err
        assert "minilm_choice" in out and positions[-1]["scaling"]["type"] == extra[-1].split("=")[1]
        assert (
            "note: --set model.position.scaling.type=ntk is now written model.position.scaling.type=ntk" in err
        ) == old


@pytest.mark.parametrize("verb", [["generate"], ["evaluate"], ["longeval"], ["lmeval"], ["passkey", "eval"]])
def test_the_help_shows_the_settings_in_its_usage_and_says_what_they_change(verb, capsys):
    status, out, _ = run(capsys, [*verb, "--help"])
    usage = out.split("\n\n")[0]
    assert status == 0 and usage.count("[section.key=value ...]") == 1, usage
    assert "\nsettings:\n  section.key=value arguments anywhere" in out and "model.position" in out


def test_what_is_a_setting():
    for token in ("model.position.scaling.type=yarn", "data.dir=x", "train.lr=1e-3", "model.layers.local.window=8"):
        assert is_setting(token), token
    for token in (
        "out/rope",
        "ROMEO: x=1",
        "modle.position.kind=alibi",
        "model=1",
        "position.scaling.type=yarn",
        "rope",
    ):
        assert not is_setting(token), token


def test_an_options_value_and_what_follows_two_dashes_are_never_settings():
    parser = Parser(prog="t")
    parser.add_argument("--stop", action="append", default=[])
    parser.add_argument("--quiet", action="store_true")
    argv = ["--stop", "data.x=1", "--quiet", "model.block_size=64", "--stop=model.y=2", "--", "model.z=3"]
    rest, settings = split_settings(parser, argv)
    assert settings == ["model.block_size=64"]
    assert rest == ["--stop", "data.x=1", "--quiet", "--stop=model.y=2", "--", "model.z=3"]


def test_a_prompt_that_looks_like_a_setting_goes_after_two_dashes(rope_run, capsys):
    argv = ["generate", "--checkpoint", rope_run, "--max-new-tokens", "1", "--temperature", "0", "--", "model.x=1"]
    status, out, err = run(capsys, argv)
    assert status == 0 and out.startswith("model.x=1"), err


def test_a_verb_without_settings_refuses_one(rope_run, tmp_path, capsys):
    argv = ["passkey", "make-corpus", str(tmp_path / "keys"), "--checkpoint", rope_run, "--length", "64"]
    status, _, err = run(capsys, argv + ["model.block_size=64"])
    one_line_error(status, err, "unrecognized arguments: model.block_size=64")


def test_a_setting_a_loaded_model_cannot_take_is_one_line(rope_run, capsys):
    status, _, err = run(capsys, ["evaluate", rope_run, "model.n_layer=3", "--quiet", "--no-files"])
    one_line_error(status, err, "model.n_layer=3", "only model.block_size, model.dropout, model.position, data.*")


# --------------------------------------------------------------------------- the old spellings, one release

# verb -> (argv, the old spelling, its note, the stream that shows the setting, what it shows)
OLD = {
    "generate --set": (
        VERBS["generate"][0],
        ["--set", "model.block_size=48"],
        "note: --set model.block_size=48 is now written model.block_size=48",
        "err",
        "context 48,",
    ),
    "evaluate --set": (
        VERBS["evaluate"][0],
        ["--set", "model.position.scaling={type: dynamic}"],
        "note: --set model.position.scaling='{type: dynamic}' is now written model.position.scaling='{type: dynamic}'",
        "out",
        "rope+dynamic",
    ),
    "evaluate --position.": (
        VERBS["evaluate"][0],
        ["--position.scaling.type=dynamic"],
        "note: --position.scaling.type=dynamic is now written model.position.scaling.type=dynamic",
        "out",
        "rope+dynamic",
    ),
    "longeval --set=": (
        VERBS["longeval"][0],
        ["--set=model.block_size=40"],
        "note: --set model.block_size=40 is now written model.block_size=40",
        "out",
        "| depth | 40 | 80 | 160 |",
    ),
    "passkey eval --set": (
        VERBS["passkey eval"][0],
        ["--set", "model.block_size=100"],
        "note: --set model.block_size=100 is now written model.block_size=100",
        "out",
        "| 400 |",
    ),
    "positions plot --KEY VALUE": (
        VERBS["positions plot"][0],
        ["--scaling.type", "yarn", "--scaling.factor=4"],
        "note: --scaling.type yarn is now written model.position.scaling.type=yarn\n"
        "note: --scaling.factor 4 is now written model.position.scaling.factor=4",
        "out",
        "scaling: {type: yarn, factor: 4}",
    ),
}


@pytest.mark.parametrize("spelling", OLD)
def test_the_old_spellings_do_the_same_with_a_note(spelling, rope_run, tmp_path, capsys):
    if spelling.startswith("positions plot"):
        pytest.importorskip("matplotlib")
    argv, old, note, stream, shown = OLD[spelling]
    status, out, err = run(capsys, filled(argv, rope_run, tmp_path) + old)
    assert status == 0, err
    assert shown in (out if stream == "out" else err), (out, err)
    assert note + "\n" in err


def test_an_old_spelling_in_an_error_is_a_note_and_one_error_line(rope_run, capsys):
    status, _, err = run(capsys, ["evaluate", rope_run, "--position.scaling.type=bogus", "--quiet", "--no-files"])
    assert err.startswith("note: --position.scaling.type=bogus is now written model.position.scaling.type=bogus\n")
    one_line_error(status, err, "scaling.type='bogus'")


# --------------------------------------------------------------------------- a partial mapping merges onto the default


def test_a_position_setting_without_a_kind_merges_onto_the_default():
    config = load_config(None, ["model.position.scaling.type=yarn", "model.position.scaling.factor=4"])
    assert config.model.position == {"kind": "rope", "scaling": {"type": "yarn", "factor": 4}}
    assert "model.position.scaling.type" in config.given and "model.position.kind" not in config.given
    assert load_config(None, ["model.position.base=5000"]).model.position == {"kind": "rope", "base": 5000}
    whole = load_config(None, ["model.position={kind: alibi}"]).model.position
    assert whole == {"kind": "alibi"}  # a setting with its own kind is taken whole


def test_a_config_file_with_a_partial_position_merges_too(tmp_path):
    path = tmp_path / "partial.yaml"
    path.write_text("model:\n  position:\n    base: 500000\n")
    assert load_config(str(path)).model.position == {"kind": "rope", "base": 500000}


def test_an_option_of_another_kind_without_the_kind_says_how_to_name_it():
    with pytest.raises(
        ConfigError,
        match=r"max_positions.*without a kind is the default kind rope with these options: set model.position.kind",
    ):
        load_config(None, ["model.position.max_positions=64"])


def test_train_from_a_run_with_a_scaling_alone_takes_the_default_kind(rope_run, capsys):
    """The issue's command: train.init_from and a scaling, no --config, no kind."""
    argv = [
        "train",
        f"train.init_from={rope_run}",
        "model.position.scaling.type=yarn",
        "model.position.scaling.factor=2",
    ]
    status, out, err = run(capsys, argv + ["--print-config"])
    assert status == 0, err
    assert "kind: rope" in out and "type: yarn" in out


def test_a_run_from_a_source_with_a_scaling_alone_trains_it(rope_run, tiny_corpus, tmp_path, capsys):
    out_dir = tmp_path / "yarn"
    argv = [
        "train",
        f"train.init_from={rope_run}",
        f"data.corpus={tiny_corpus / 'corpus.txt'}",
        f"data.dir={tiny_corpus / 'data'}",
        "model.position.scaling.type=yarn",
        "model.position.scaling.factor=2",
        "train.max_steps=1",
        "train.batch_size=2",
        "train.eval_iters=1",
        "train.sample_tokens=0",
        "train.final_eval_tokens=0",
        "train.device=cpu",
        f"out_dir={out_dir}",
        "--quiet",
    ]
    status, _, err = run(capsys, argv)
    assert status == 0, err
    trained = load_model(str(out_dir)).config.model
    assert trained.block_size == 64 and trained.position["scaling"]["type"] == "yarn"
    assert trained.position["scaling"]["original_max_positions"] == 32


# --------------------------------------------------------------------------- suggestions


@pytest.mark.parametrize(
    "name, setting",
    [
        ("yarn", "model.position.scaling.type=yarn model.position.scaling.factor=N"),
        ("linear", "model.position.scaling.type=linear"),
        ("pi", "model.position.scaling.type=linear"),
        ("PI", "model.position.scaling.type=linear"),
        ("ntk", "model.position.scaling.type=ntk"),
        ("dynamic", "model.position.scaling.type=dynamic"),
        ("longrope", "model.position.scaling.type=longrope"),
        ("llama3", "model.position.scaling.type=llama3"),
        ("p-rope", "model.position.scaling.type=proportional"),
    ],
)
def test_a_scaling_given_as_a_kind_points_to_the_scaling(name, setting, capsys):
    status, _, err = run(capsys, ["train", "--print-config", f"model.position.kind={name}"])
    one_line_error(
        status, err, f"unknown position kind {name!r}", f"model.position.kind=rope {setting}", "kinds: alibi"
    )
    assert "did you mean" not in err


def test_a_misspelt_kind_still_gets_the_closest_kinds(capsys):
    status, _, err = run(capsys, ["train", "--print-config", "model.position.kind=alibbi"])
    one_line_error(status, err, "unknown position kind 'alibbi': did you mean alibi?")


@pytest.mark.parametrize(
    "setting, named",
    [
        ("model.position.factor=4", "unknown option 'factor' for position kind 'rope': did you mean scaling.factor?"),
        ("model.position.type=yarn", "did you mean scaling.type?"),
        ("model.position.scaling.type=pi", "scaling.type='pi' is unknown: pi is written scaling.type=linear"),
        ("model.position.scaling.type=yarm", "did you mean yarn"),
    ],
)
def test_a_scaling_option_out_of_place_says_where_it_goes(setting, named, capsys):
    status, _, err = run(capsys, ["train", "--print-config", setting])
    one_line_error(status, err, named)


@pytest.mark.parametrize(
    "family, named",
    [
        ("lama", "family 'lama' is unknown: did you mean llama?"),
        ("neox", "did you mean gpt_neox?"),
        ("qwen3", "family 'qwen3' is no --family of its own: Llama models are written by --family llama"),
        ("cohere2", "family 'cohere2' is read only: valid: llama, "),
    ],
)
def test_a_mistyped_family_is_suggested_from_the_families(family, named, rope_run, tmp_path, capsys):
    status, _, err = run(capsys, ["export", rope_run, str(tmp_path / "hf"), "--family", family])
    one_line_error(status, err, named)
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize(
    "setting, current",
    [
        ("model.position.base=alibi", "model.position.inner=alibi"),
        ("model.position.base.kind=t5", "model.position.inner.kind=t5"),
        ("model.position.base={kind: alibi, x: 1.5}", "model.position.inner={kind: alibi, x: 1.5}"),
        ("model.position.factor=2.5", "model.position.factor=2.5"),
    ],
)
def test_a_figure_setting_under_an_old_option_name_takes_the_current_name(setting, current):
    """interpolated's old ``base`` is its ``inner``, whatever the value holds (dots included)."""
    assert positions_cli._current_name(scheme_class("interpolated"), setting) == current
