"""Streaming evaluation as StreamingLLM does it (minilm.evaluation.streaming, evaluate.py --stream):
each set-up's one-pass losses equal a rolling cache fed one token at a time, the bands, the n/a
cells and the command line."""

import csv
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from minilm.cli import evaluate as evaluate_command
from minilm.evaluation import streaming
from tests.test_evaluation import corpus, run_cli, tiny_checkpoint  # noqa: F401  (corpus is a fixture)


def decoded_losses(model, tokens, window, sinks, sink_positions):
    """Per-token losses from a rolling cache fed one token at a time (the decode loop's way)."""
    cache = model.new_cache(1, window, rolling=True, sinks=sinks, sink_positions=sink_positions)
    losses = []
    with torch.no_grad():
        for t in range(len(tokens) - 1):
            logits = model(tokens[None, t : t + 1], cache, context_len=window)[0, -1]
            losses.append(F.cross_entropy(logits[None], tokens[t + 1 : t + 2]).item())
    return losses


@pytest.mark.parametrize("kind", ["rope", "alibi", "fire"])
@pytest.mark.parametrize("setup", ["window", "sinks-absolute", "sinks-cache"])
def test_one_pass_equals_a_rolling_cache_token_by_token(corpus, kind, setup):  # noqa: F811
    _, model = tiny_checkpoint(corpus, kind)
    tokens = torch.randint(0, 340, (70,), generator=torch.Generator().manual_seed(0))
    sinks = 0 if setup == "window" else 3
    one_pass = streaming.stream_losses(model, tokens, setup, window=12, sinks=3)
    stepped = decoded_losses(model, tokens, 12, sinks, "cache" if setup == "sinks-cache" else "absolute")
    assert one_pass.shape == (69,)
    torch.testing.assert_close(torch.tensor(one_pass), torch.tensor(stepped, dtype=torch.float64), rtol=1e-4, atol=1e-4)


def test_the_set_ups_differ_only_past_the_window(corpus):  # noqa: F811
    _, model = tiny_checkpoint(corpus, "rope")
    tokens = torch.randint(0, 340, (80,), generator=torch.Generator().manual_seed(1))
    losses = {s: streaming.stream_losses(model, tokens, s, window=16, sinks=4) for s in streaming.SETUPS}
    for setup in streaming.SETUPS[1:]:  # the same until the window is full, then not
        assert abs(losses[setup][:16] - losses["full"][:16]).max() < 1e-5
        assert abs(losses[setup][16:] - losses["full"][16:]).max() > 1e-3
    assert abs(losses["sinks-cache"][20:] - losses["sinks-absolute"][20:]).max() > 1e-3


def test_bands_double_after_the_first_window():
    assert streaming.bands(256, 16) == [(0, 16), (16, 32), (32, 64), (64, 128), (128, 256)]
    assert streaming.bands(100, 16) == [(0, 16), (16, 32), (32, 64), (64, 100)]
    assert streaming.bands(10, 16) == [(0, 10)]


def test_bounded_and_embedded_positions_are_reported_as_not_run(corpus):  # noqa: F811
    learned, _ = tiny_checkpoint(corpus, "learned")
    sinusoidal, _ = tiny_checkpoint(corpus, "sinusoidal")
    streams = streaming.stream_checkpoint(learned, tokens=64, sinks=2, quiet=True)
    assert [s.reason for s in streams] == ["n/a (learned positions are bounded)"] * 4
    streams = streaming.stream_checkpoint(sinusoidal, tokens=64, sinks=2, quiet=True)
    assert [s.losses is None for s in streams] == [False, False, False, True]
    assert streams[3].reason == "n/a (sinusoidal positions are in the embeddings)"
    table = streaming.band_table(streams)
    assert table.count("\n") == 5 and "| 0-15 | 16-31 | 32-63 |" in table


@pytest.mark.slow
def test_cli_table_csv_figure_and_errors(corpus, tmp_path, capsys):  # noqa: F811
    rope, _ = tiny_checkpoint(corpus, "rope")
    out = run_cli(
        rope,
        "--stream",
        "--stream-tokens",
        "96",
        "--sink-tokens",
        "2",
        "--csv",
        str(tmp_path / "s.csv"),
        "--plot",
        str(tmp_path / "s.png"),
        "--quiet",
    )
    assert out.returncode == 0, out.stderr
    assert "96 tokens of the validation split" in out.stdout
    assert "| window 16, 2 sinks at cache positions |" in out.stdout
    rows = list(csv.DictReader(open(tmp_path / "s.csv")))
    assert len(rows) == 4 * 4 and {r["setup"] for r in rows} == set(streaming.SETUPS)
    assert all(float(r["loss"]) > 0 for r in rows)
    assert os.path.getsize(tmp_path / "s.png") > 1000
    for bad, message in [
        (["--sink-tokens", "16"], "--sink-tokens=16 leaves no room in a window of 16"),
        (["--max-context", "0"], "--max-context=0 is invalid: expected an integer >= 1"),
        (["--stream-tokens", "999999"], "fewer than the 1,000,000 a stream of 999,999 needs"),
        (["--lengths", "16"], "leave out --lengths"),
        (["--multiples", "1,2"], "leave out --lengths, --multiples"),
        (["--max-tokens", "100"], "--max-tokens and --batch-tokens"),
        (["--batch-tokens", "100"], "--max-tokens and --batch-tokens"),
    ]:
        try:  # in-process: the same main as the script (a process start costs seconds)
            status = evaluate_command.main([rope, "--stream", "--no-files", "--quiet", *bad])
        except SystemExit as exc:
            status = exc.code
        err = capsys.readouterr().err
        assert status == 2 and message in err and err.count("\n") == 1, err
    for alone in (["--max-context", "8"], ["--sink-tokens", "8"]):
        with pytest.raises(SystemExit):
            evaluate_command.main([rope, *alone, "--no-files"])
        assert "options of --stream" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_models_of_different_lengths_each_get_their_own_bands(corpus):  # noqa: F811
    short, _ = tiny_checkpoint(corpus, "rope")
    long, _ = tiny_checkpoint(corpus, "alibi", block_size=32)
    out = run_cli(short, long, "--stream", "--stream-tokens", "128", "--no-files", "--quiet")
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.split("alibi-0/ckpt.pt: streaming loss")
    assert "| 0-15 | 16-31 | 32-63 | 64-127 |" in first and "| window 16 |" in first
    assert "| 0-31 | 32-63 | 64-127 |" in second and "| window 32 |" in second and "nan" not in out.stdout


def test_the_plotted_curve_covers_every_position():
    """Bins of the window's quarter, the last one the rest: a stream shorter than a bin is one point, and
    the tail past the last whole bin is drawn, not dropped."""
    x, y = streaming.smoothed(np.ones(100), 128)
    assert list(x) == [50.0] and list(y) == [1.0]
    x, y = streaming.smoothed(np.arange(10.0), 4)
    assert list(x) == [2.0, 6.0, 9.0] and list(y) == [1.5, 5.5, 8.5]
