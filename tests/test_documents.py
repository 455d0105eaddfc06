"""data.min_document_tokens (minilm.data.batches.Documents): rows for long-context training, cut
from documents long enough, each row holding as few documents as it can, and the share of rows
that crossed a document boundary in the run's summary."""

import json

import numpy as np
import pytest
import torch

from minilm.config import ConfigError, build_config
from minilm.configfile import load_config
from minilm.data.batches import Documents, crossing_rows, get_batch
from minilm.evaluation.lengths import evaluate_checkpoints
from minilm.evaluation.streaming import stream_checkpoint
from minilm.training.loop import train

EOT = 0


def stream(lengths, seed=0):
    """Documents of ``lengths`` tokens (the last of each the eot id), each filled with its own id (1, 2, ...)."""
    rng = np.random.default_rng(seed)
    parts = [np.r_[np.full(n - 1, i + 1), EOT] for i, n in enumerate(lengths)]
    return np.concatenate(parts).astype(np.uint16), rng


def test_long_enough_documents_hold_whole_rows_and_short_ones_are_skipped():
    tokens, _ = stream([3, 50, 5, 120, 8, 40])
    documents = Documents(tokens, EOT, min_tokens=40)
    x, y = documents.batch(400, 32, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (400, 32) and torch.equal(x[:, 1:], y[:, :-1])
    rows = torch.cat([x, y[:, -1:]], dim=1)
    ids = {int(v) for v in rows.unique()} - {EOT}
    assert ids <= {2, 4, 6}  # the 50-, 120- and 40-token documents; 3, 5 and 8 tokens are skipped
    assert crossing_rows(x, EOT) == 0  # a row of 33 tokens fits in each kept document
    assert all(len(set(r.tolist()) - {EOT}) == 1 for r in rows)  # one document a row
    # documents are drawn in proportion to their length: 50 / 210, 120 / 210, 40 / 210 of the rows
    share = {i: float((rows[:, 0] == i).float().mean()) for i in (2, 4, 6)}
    assert share[4] == pytest.approx(120 / 210, abs=0.07) and share[2] == pytest.approx(50 / 210, abs=0.06)


def test_a_row_longer_than_its_document_is_filled_by_the_next_kept_ones():
    tokens, _ = stream([50, 7, 120])
    documents = Documents(tokens, EOT, min_tokens=40)
    x, y = documents.batch(300, 100, torch.Generator().manual_seed(1))
    starts_short = x[:, 0] == 1
    # a row started in the 50-token document continues into the 120-token one, never the 7-token one
    assert bool((x[starts_short] != 2).all()) and bool((x[starts_short][:, 50] == 3).all())
    assert crossing_rows(x, EOT) == int(starts_short.sum()) > 0
    assert float(starts_short.float().mean()) == pytest.approx(50 / 170, abs=0.08)
    again = documents.batch(300, 100, torch.Generator().manual_seed(1))[0]
    assert torch.equal(again, x)  # the generator decides: a resumed run draws the same rows
    with pytest.raises(Exception, match="no document of the split has that many tokens"):
        Documents(tokens, EOT, min_tokens=500)


def test_windows_of_the_stream_cross_far_more_often():
    tokens, _ = stream([30, 25, 200, 35] * 20)
    plain, _ = get_batch(tokens, 500, 64, torch.Generator().manual_seed(0))
    kept, _ = Documents(tokens, EOT, min_tokens=150).batch(500, 64, torch.Generator().manual_seed(0))
    assert crossing_rows(plain, EOT) / 500 > 0.5 and crossing_rows(kept, EOT) == 0


def test_the_run_says_how_many_rows_crossed_a_document_boundary(tmp_path, capfd):
    from tests.conftest import tiny_text

    text = tiny_text(2000)
    lines = text.split("\n")
    docs, at = [], 0
    for i, size in enumerate([3, 60, 4, 80, 2, 70, 5, 90] * 6):  # short and long documents, alternating
        docs.append(" ".join(lines[at : at + size]))
        at = (at + size) % (len(lines) - 100)
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    shares = {}
    for n in (0, 600):
        config = load_config(
            None,
            [
                f"data.corpus={corpus}",
                "data.vocab_size=400",
                f"data.dir={tmp_path / 'data'}",
                "data.end_of_text=true",
                f"data.min_document_tokens={n}",
                "model.n_layer=1",
                "model.n_head=2",
                "model.d_model=32",
                "model.block_size=128",
                "train.batch_size=8",
                "train.max_steps=4",
                "train.eval_interval=4",
                "train.eval_iters=1",
                "train.sample_tokens=0",
                "train.final_eval_tokens=0",
                "train.device=cpu",
                "train.dtype=float32",
                f"out_dir={tmp_path / str(n)}",
            ],
        )
        shares[n] = train(config, quiet=False)["rows_crossing_documents"]
        assert f"{100 * shares[n]:.1f}% of the rows crossed a document boundary" in capfd.readouterr().out
    assert shares[600] < 0.25 < shares[0]
    masked = load_config(
        None,
        [
            f"data.corpus={corpus}",
            "data.vocab_size=400",
            f"data.dir={tmp_path / 'data'}",
            "data.end_of_text=true",
            "data.min_document_tokens=300",
            "data.document_mask=restart",
            "model.n_layer=1",
            "model.n_head=2",
            "model.d_model=32",
            "model.block_size=128",
            "train.batch_size=8",
            "train.max_steps=2",
            "train.eval_interval=2",
            "train.eval_iters=1",
            "train.sample_tokens=0",
            "train.final_eval_tokens=0",
            "train.device=cpu",
            "train.dtype=float32",
            f"out_dir={tmp_path / 'masked'}",
        ],
    )
    assert 0 <= train(masked, quiet=True)["rows_crossing_documents"] < 1  # with the document masks too
    streams = stream_checkpoint(masked.out_dir, tokens=256, quiet=True)  # masked as it trained, as evaluate masks
    full = next(s for s in streams if s.setup == "full")
    scored = evaluate_checkpoints([masked.out_dir], lengths=[256], max_tokens=256, quiet=True)[0]
    assert full.losses.mean() == pytest.approx(scored.nll, rel=1e-5)
    assert all(s.reason.startswith("n/a (documents masked") for s in streams if s.setup != "full")
    with pytest.raises(ConfigError, match="with data.end_of_text=true"):
        build_config({"data": {"min_document_tokens": 100}})
