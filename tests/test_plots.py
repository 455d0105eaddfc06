"""Figures of the position schemes (python -m minilm positions) and attention maps (minilm.figures.attention)."""

import os
import sys

import pytest
import torch

pytest.importorskip("matplotlib")

from minilm import GPT, ModelConfig  # noqa: E402
from minilm.checkpoints import format as checkpoint  # noqa: E402
from minilm.checkpoints.loading import load_model  # noqa: E402
from minilm.cli import positions as cli  # noqa: E402
from minilm.config import Config  # noqa: E402
from minilm.data.tokenizer import Tokenizer  # noqa: E402
from minilm.figures import attention as attention_maps  # noqa: E402
from minilm.figures import positions as plots
from minilm.figures.canvas import PlotError  # noqa: E402
from minilm.positions import available, build, scheme_class  # noqa: E402
from minilm.positions.alibi import alibi_slopes  # noqa: E402
from minilm.positions.t5 import t5_bucket  # noqa: E402
from tests.forkrun import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = dict(d_model=64, n_head=4, block_size=64)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path, min_kb=10):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert len(data) > min_kb * 1024, f"{path} is only {len(data)} bytes"
    from matplotlib.image import imread

    pixels = imread(path)[..., :3]
    drawn = (pixels < 0.9).any(axis=-1).mean()  # share of pixels that are not (near) white
    assert drawn > 0.03, f"{path} is almost blank ({drawn:.1%} drawn)"


def figure_lines(fig, axis_index):
    return {line.get_label(): line for line in fig.axes[axis_index].lines}


def suptitle(fig):
    return fig.get_suptitle()


def position(kind, **options):
    return {"kind": kind, **options}


# --------------------------------------------------------------------------- every scheme


@pytest.mark.slow
@pytest.mark.parametrize("kind", available())
def test_every_registered_kind_plots_a_png(kind, tmp_path):
    settings = cli.plot_settings(kind, [])[0]
    scheme = build(settings, **SHAPE)
    path = plots.plot_scheme(scheme, settings, str(tmp_path / f"{kind}.png"))
    assert_png(path)


def test_p_rope_plots_with_its_pairs_at_frequency_zero(tmp_path):
    """p-RoPE (``scaling.type: proportional``) zeroes the lowest frequencies: they never turn, so they
    are left off the log axes instead of breaking them."""
    settings = {"kind": "rope", "scaling": {"type": "proportional", "fraction": 0.25}}
    assert_png(plots.plot_scheme(build(settings, **SHAPE), settings, str(tmp_path / "p-rope.png")))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fire", "kerple", "t5", "learned", "shaw"])
def test_a_learned_schemes_figure_is_the_same_every_time(kind, tmp_path):
    """Initial values from seed 0, whatever the caller's random state: the manual's figures redraw
    byte for byte, and the caller's generator is left as it was."""

    def draw(name):
        argv = ["plot", kind, "--d-model", "64", "--n-head", "4", "--block-size", "32", "--out", str(tmp_path / name)]
        assert cli.main(argv) == 0

    torch.manual_seed(7)
    expected = torch.rand(1)
    torch.manual_seed(7)
    draw("a.png")
    assert torch.equal(torch.rand(1), expected)  # the caller's generator did not move
    torch.manual_seed(99)
    draw("b.png")
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()


@pytest.mark.parametrize("inner", [k for k in available() if k != "interpolated"])
def test_interpolated_draws_the_wrapped_schemes_figure(inner):
    settings = cli.plot_settings("interpolated", [f"model.position.inner.kind={inner}", "model.position.factor=2"])[0]
    fig = plots.scheme_figure(build(settings, **SHAPE), settings)
    plain = plots.scheme_figure(build(position(inner), **SHAPE), position(inner))
    assert [ax.get_xlabel() for ax in fig.axes] == [ax.get_xlabel() for ax in plain.axes]
    if inner != "none":
        assert f"{inner} sees every position divided by 2" in suptitle(fig)


def test_alibi_figure_draws_each_heads_slope():
    scheme = build(position("alibi"), d_model=96, n_head=12, block_size=64)
    fig = plots.scheme_figure(scheme, position("alibi"))
    lines = fig.axes[0].lines
    assert len(lines) == 12
    for h, (line, slope) in enumerate(zip(lines, alibi_slopes(12))):
        distance, bias = line.get_xdata(), line.get_ydata()
        assert torch.allclose(
            torch.as_tensor(bias), torch.as_tensor(-slope * distance, dtype=torch.float32), atol=1e-5
        ), f"head {h}"
    # the bias-only attention of each head sums to one over the keys
    for line in fig.axes[1].lines:
        assert abs(line.get_ydata().sum() - 1) < 1e-4


def test_interpolated_alibi_divides_distances():
    settings = cli.plot_settings("interpolated", ["model.position.base=alibi", "model.position.factor=4"])[0]
    fig = plots.scheme_figure(build(settings, **SHAPE), settings)
    line = fig.axes[0].lines[0]
    slope = alibi_slopes(SHAPE["n_head"])[0]
    assert torch.allclose(
        torch.as_tensor(line.get_ydata()),
        torch.as_tensor(-slope / 4 * line.get_xdata(), dtype=torch.float32),
        atol=1e-5,
    )
    assert "divided by 4" in suptitle(fig)


def test_rope_figure_shows_each_scaling_against_the_original():
    settings = cli.plot_settings("rope", ["model.position.scaling.type=yarn", "model.position.scaling.factor=4"])[0]
    scheme = build(settings, **SHAPE)
    fig = plots.scheme_figure(scheme, settings)
    ratio = figure_lines(fig, 1)
    assert ratio["linear / PI \u00d74"].get_ydata() == pytest.approx(0.25)  # PI divides every frequency by s
    assert ratio["none (original rope)"].get_ydata() == pytest.approx(1.0)
    ntk = ratio["NTK-aware \u00d74"].get_ydata()
    assert ntk[0] == pytest.approx(1.0) and ntk[-1] < 0.3  # NTK keeps the highest frequency, slows the lowest
    yarn = ratio["YaRN \u00d74"].get_ydata()
    assert yarn[0] == pytest.approx(1.0) and yarn[-1] == pytest.approx(0.25)
    selected = ratio["selected: yarn \u00d74"].get_ydata()
    assert selected == pytest.approx(yarn)  # the highlighted curve is the scheme's own inv_freq
    expected = (scheme.inv_freq(256) / build(position("rope"), **SHAPE).inv_freq(64)).numpy()
    assert selected == pytest.approx(expected)
    # q.k of the same content: 1 at distance 0 without scaling, YaRN's temperature squared with it
    qk = figure_lines(fig, 2)
    assert qk["none (original rope)"].get_ydata()[0] == pytest.approx(1.0, abs=1e-5)
    assert qk["selected: yarn \u00d74"].get_ydata()[0] == pytest.approx(scheme.attention_scale() ** 2, abs=1e-4)


def test_dynamic_rope_is_drawn_at_two_lengths():
    settings = cli.plot_settings("rope", ["model.position.scaling.type=dynamic", "model.position.scaling.factor=2"])[0]
    fig = plots.scheme_figure(build(settings, **SHAPE), settings)
    wave = figure_lines(fig, 0)
    at_2l, at_4l = wave["dynamic NTK \u00d72 at T=2L"].get_ydata(), wave["dynamic NTK \u00d72 at T=4L"].get_ydata()
    assert at_2l[0] == pytest.approx(at_4l[0])  # the fastest pair is never scaled
    assert at_4l[-1] > at_2l[-1] > wave["none (original rope)"].get_ydata()[-1]


def test_additive_figure_is_the_embedding():
    settings = position("sinusoidal", base=10000.0)
    scheme = build(settings, **SHAPE)
    fig = plots.scheme_figure(scheme, settings)
    heatmap = fig.axes[0].images[0].get_array()
    pe = scheme.embed(torch.zeros(1, 64, 64), torch.arange(64.0))[0]
    assert torch.allclose(torch.as_tensor(heatmap), pe, atol=1e-6)
    assert heatmap[1, :2].tolist() == pytest.approx([0.8415, 0.5403], abs=1e-4)  # sin(1), cos(1)
    # sinusoidal similarity depends only on the offset: the curves of every reference position agree
    curves = [line for label, line in figure_lines(fig, 2).items() if label.startswith("p = ")]
    assert len(curves) == 3
    by_offset = [dict(zip(line.get_xdata().tolist(), line.get_ydata().tolist())) for line in curves]
    for offset in (-5.0, 3.0, 20.0):
        values = [c[offset] for c in by_offset if offset in c]
        assert len(values) >= 2 and max(values) - min(values) < 1e-5


def test_untrained_parameters_are_labelled():
    learned = build(position("learned"), **SHAPE)
    assert "UNTRAINED" in suptitle(plots.scheme_figure(learned, position("learned")))
    assert "trained values from out/x" in suptitle(plots.scheme_figure(learned, position("learned"), source="out/x"))
    sinusoidal = build(position("sinusoidal"), **SHAPE)
    assert "no trained parameters" in suptitle(plots.scheme_figure(sinusoidal, position("sinusoidal")))
    assert "no trained parameters (settings from out/x)" in suptitle(
        plots.scheme_figure(sinusoidal, position("sinusoidal"), source="out/x")
    )
    t5 = build(position("t5"), **SHAPE)  # its table starts random (transformers' T5 initialisation)
    assert "UNTRAINED: initial values at init" in suptitle(plots.scheme_figure(t5, position("t5")))
    fire = build(position("fire"), **SHAPE)
    with torch.no_grad():
        for param in fire.parameters():
            param.zero_()
    assert "UNTRAINED: all zero at init" in suptitle(plots.scheme_figure(fire, position("fire")))


def test_none_explains_itself():
    fig = plots.scheme_figure(build(position("none"), **SHAPE), position("none"))
    text = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "causal mask" in text and scheme_class("none").description in text


# --------------------------------------------------------------------------- the command line


def test_list_covers_every_registered_kind(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for kind in available():
        cls = scheme_class(kind)
        assert any(line.startswith(kind) and cls.description in line for line in out.splitlines()), kind
        for option in cls.options:
            assert f"{option}=" in out


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["plot", "rope", "model.position.bse=500"],
            "unknown option 'bse' for position kind 'rope': did you mean base?",
        ),
        (
            ["plot", "alibi", "model.position.slope=1"],
            "unknown option 'slope' for position kind 'alibi': it takes no options",
        ),
        (["plot", "rope", "model.position.base=-1"], "rope: base=-1 is invalid: expected a number > 1"),
        (["plot", "rope", "model.position.scaling.typ=yarn"], "unknown scaling option 'typ'"),
        (["plot", "rope", "model.position.scaling.type=yarm"], "did you mean yarn"),
        (["plot", "ropee"], "unknown position kind 'ropee': did you mean rope?"),
        (["plot", "alibi", "--n-head", "three"], "--n-head='three' is invalid"),
        (["plot", "alibi", "model.n_head=three"], "model.n_head='three' is invalid"),
        (["plot", "rope", "--d-model", "30", "--n-head", "4"], "not divisible"),
        (["plot", "sinusoidal", "model.position.base.kind=x"], "'base' is a value, not a section"),
        (["plot", "rope", "model.n_layer=2"], "model.n_layer=2' is not allowed in a figure of a scheme"),
        (["plot", "rope", "position.scaling.type=yarn"], "is no setting: a figure's settings are written"),
        (["plot", "yarn"], "write model.position.kind=rope model.position.scaling.type=yarn"),
        (["plot"], "give a position kind"),
        (["draw", "rope"], "unknown command 'draw'"),
    ],
)
def test_bad_arguments_give_one_line_errors(argv, expected, tmp_path, capsys):
    out = str(tmp_path / "x.png")
    assert cli.main(argv + ["--out", out] if argv[0] == "plot" else argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert expected in err
    assert not os.path.exists(out)


def test_missing_out_and_unknown_format(tmp_path, capsys):
    assert cli.main(["plot", "rope"]) == 2
    assert capsys.readouterr().err == "error: plot needs --out FILE.png\n"
    assert cli.main(["plot", "rope", "--out", str(tmp_path / "x.bmpx")]) == 2
    assert "unknown image format 'bmpx'" in capsys.readouterr().err


def test_missing_matplotlib_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    assert cli.main(["plot", "rope", "--out", str(tmp_path / "x.png")]) == 2
    assert capsys.readouterr().err == 'error: plotting needs matplotlib: pip install -e ".[plot]"\n'
    with pytest.raises(PlotError, match="plotting needs matplotlib"):
        attention_maps.attention_map(object(), [1], object(), str(tmp_path / "a.png"))


@pytest.mark.slow
def test_cli_subprocess_writes_the_png(tmp_path):
    out = tmp_path / "figs" / "alibi_pi.png"
    result = run_python(
        [
            "-m",
            "minilm",
            "positions",
            "plot",
            "interpolated",
            "--inner.kind",
            "alibi",
            "--factor=3",
            "--d-model",
            "64",
            "--n-head",
            "2",
            "--block-size",
            "64",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"wrote {out}: interpolated {{inner: {{kind: alibi}}, factor: 3}}\n"
    assert_png(out)


@pytest.mark.slow
def test_the_old_invocation_names_the_new_one():
    result = run_python(["-m", "minilm.positions", "list"], cwd=ROOT, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "error: this command moved: use python -m minilm positions ...\n"


# --------------------------------------------------------------------------- checkpoints and attention


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    text = tmp_path_factory.mktemp("tok") / "text.txt"
    text.write_text("\n".join(f"the cat {i} sat on the mat, and the dog saw the cat." for i in range(100)))
    return Tokenizer.train(str(text), 320)


def tiny_model(kind_settings, vocab_size, block_size=32, n_layer=2):
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=vocab_size, n_layer=n_layer, n_head=4, d_model=32, block_size=block_size, position=kind_settings
    )
    model = GPT(config)
    for name, param in model.positions.named_parameters():  # give zero-initialised biases some structure
        if name.endswith("relative_bias.weight"):
            torch.nn.init.normal_(param)
    return model.eval()


@pytest.mark.slow
def test_checkpoint_figure_shows_the_trained_biases(tokenizer, tmp_path, capsys):
    model = tiny_model(position("t5", num_buckets=8, max_distance=16), tokenizer.vocab_size)
    config = Config(model=model.config)
    checkpoint.save(
        {"model": model.state_dict(), "config": config.to_dict(), "tokenizer": tokenizer.to_bytes()},
        str(tmp_path / "run"),
    )
    out = tmp_path / "t5.png"
    assert cli.main(["plot", "--checkpoint", str(tmp_path / "run"), "--out", str(out)]) == 0
    assert f"(from {tmp_path / 'run'})" in capsys.readouterr().out
    assert_png(out)
    assert cli.main(["plot", "t5", "--checkpoint", str(tmp_path / "run"), "--out", str(out)]) == 0
    assert cli.main(["plot", "alibi", "--checkpoint", str(tmp_path / "run"), "--out", str(out)]) == 2
    assert "has position kind 't5', not 'alibi'" in capsys.readouterr().err
    # settings change the loaded model as at evaluation: a table of other buckets than the trained one is refused
    assert (
        cli.main(["plot", "--checkpoint", str(tmp_path / "run"), "model.position.num_buckets=4", "--out", str(out)])
        == 2
    )
    assert "do not fit the new model" in capsys.readouterr().err
    assert cli.main(["plot", "--checkpoint", str(tmp_path / "run"), "--d-model", "64", "--out", str(out)]) == 2
    assert "the model shape comes from the checkpoint: drop --d-model" in capsys.readouterr().err
    layered = ModelConfig(  # a layer type with positions of its own: the figure is model.position's, said so
        vocab_size=tokenizer.vocab_size,
        n_layer=2,
        n_head=4,
        d_model=32,
        block_size=32,
        position={"kind": "rope"},
        layers={"pattern": ["rope", "nope"], "rope": {}, "nope": {"position": {"kind": "none"}}},
    )
    state = {"model": GPT(layered).state_dict(), "config": Config(model=layered).to_dict()}
    checkpoint.save({**state, "tokenizer": tokenizer.to_bytes()}, str(tmp_path / "layered"))
    assert cli.main(["plot", "--checkpoint", str(tmp_path / "layered"), "--out", str(tmp_path / "l.png")]) == 0
    assert "layers of type nope have positions of their own: rope; rope as model.position, nope none" in (
        capsys.readouterr().err
    )

    loaded, _, loaded_config, _ = load_model(str(tmp_path / "run"))
    fig = plots.scheme_figure(loaded.positions, loaded_config.model.position, source="run")
    weights = model.positions.relative_bias.weight.detach()
    for h, line in enumerate(fig.axes[0].lines):
        buckets = t5_bucket(torch.as_tensor(line.get_xdata()), 8, 16)
        assert torch.allclose(torch.as_tensor(line.get_ydata()), weights[buckets, h])


ATTENTION_KINDS = [
    position("rope"),
    position("rope", scaling={"type": "yarn", "factor": 4}),
    position("rope", rotary_fraction=0.5, scaling={"type": "dynamic", "factor": 2, "original_max_positions": 8}),
    position("alibi"),
    position("t5", num_buckets=8, max_distance=16),
    position("learned"),
    position("sinusoidal"),
    position("none"),
    position("interpolated", base={"kind": "alibi"}, factor=2),
]


@pytest.mark.parametrize("settings", ATTENTION_KINDS, ids=lambda s: str(s))
def test_recomputed_attention_reproduces_the_layer_output(settings):
    """weights @ v, projected, must equal what the model's own (SDPA) attention returned."""
    model = tiny_model(settings, vocab_size=50)
    ids = torch.randint(0, 50, (20,), generator=torch.Generator().manual_seed(1))
    capture = attention_maps.attention_weights(model, ids)
    attn = model.blocks[-1].attn
    T = len(ids)
    weights = capture.weights
    assert weights.shape == (4, T, T)
    assert torch.allclose(weights.sum(-1), torch.ones(4, T), atol=1e-5)
    assert torch.all(weights.triu(1) == 0)  # causal
    with torch.no_grad():
        v = attn.qkv(capture.x).view(1, T, 3, attn.n_head, attn.head_dim)[:, :, 2].transpose(1, 2)[0]
        y = attn.proj((weights @ v).transpose(0, 1).reshape(1, T, -1))
    assert torch.allclose(y, capture.output, atol=1e-5), (y - capture.output).abs().max()
    tail = attention_maps.attention_weights(model, ids, last_queries=5).weights  # only the last queries' rows
    assert tail.shape == (4, 5, T) and torch.allclose(tail, weights[:, -5:], atol=1e-6)
    # and the check has teeth: uniform causal attention does not reproduce it
    uniform = torch.ones(T, T).tril() / torch.arange(1, T + 1)[:, None]
    with torch.no_grad():
        y_uniform = attn.proj((uniform @ v).transpose(0, 1).reshape(1, T, -1))
    assert not torch.allclose(y_uniform, capture.output, atol=1e-5)


def test_attention_map_labels_tokens_and_caps_length(tokenizer, tmp_path):
    model = tiny_model(position("alibi"), tokenizer.vocab_size)
    ids = tokenizer.encode("the cat sat on the mat\nthe dog")
    fig = attention_maps.attention_figure(model, ids, tokenizer, max_tokens=6)
    assert f"showing the last 6 of {len(ids)} tokens" in suptitle(fig)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    expected = [attention_maps._token_label(tokenizer, t) for t in ids[-6:]]
    assert labels == expected and "dog" in "".join(labels)
    path = attention_maps.attention_map(model, ids, tokenizer, str(tmp_path / "attention.png"))
    assert_png(path)


def test_attention_map_shows_the_generations_window(tokenizer):
    """A generation in a window of 8 (with 2 sinks) attends to nothing else: the map shows that attention,
    every key outside the sinks and the last 8 positions at zero, and says so."""
    model = tiny_model(position("rope"), tokenizer.vocab_size, n_layer=1)
    ids = tokenizer.encode("the cat sat on the mat, and the dog saw the cat. " * 2)
    assert len(ids) > 12
    fig = attention_maps.attention_figure(model, ids, tokenizer, context=8, sinks=2)
    assert "attention in the generation's window of 8 tokens, 2 sinks" in suptitle(fig)
    forward = dict(window=8, sinks=2, sink_positions="absolute", context_len=8)
    last = attention_maps.attention_weights(model, ids, last_queries=1, forward=forward).weights[:, 0]
    seen = (last > 0).any(dim=0).nonzero().flatten().tolist()
    assert seen == [0, 1] + list(range(len(ids) - 6, len(ids)))  # the sinks, then the window's other 6


def test_attention_map_crops_to_a_learned_table(tokenizer):
    model = tiny_model(position("learned"), tokenizer.vocab_size, block_size=16, n_layer=1)
    ids = tokenizer.encode("the cat sat on the mat, and the dog saw the cat. " * 3)
    assert len(ids) > 16
    fig = attention_maps.attention_figure(model, ids, tokenizer)
    assert f"model run on the last 16 of {len(ids)} tokens" in suptitle(fig)
    assert len(fig.axes[0].get_yticklabels()) == 16
