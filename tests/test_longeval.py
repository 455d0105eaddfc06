"""``python -m minilm longeval``: the long-context suite end to end on a minilm checkpoint (the
tables, the CSV and the heatmaps); an imported model's run is in tests/test_hf.py."""

import csv

import numpy as np
import pytest
import torch

from minilm.__main__ import main
from minilm.checkpoints import format as checkpoint
from minilm.config import build_config
from minilm.data.corpus import prepare
from minilm.data.retrieval import SUITE, Task
from minilm.model.gpt import GPT
from tests.conftest import tiny_text


@pytest.fixture(scope="module")
def random_checkpoint(tiny_corpus):
    data = {"corpus": str(tiny_corpus / "corpus.txt"), "vocab_size": 400, "dir": str(tiny_corpus / "data")}
    config = build_config(
        {
            "model": {
                "vocab_size": 400,
                "n_layer": 1,
                "n_head": 2,
                "d_model": 16,
                "block_size": 64,
                "position": {"kind": "alibi"},
            },
            "data": data,
            "out_dir": str(tiny_corpus / "longeval-run"),
        }
    )
    prepared = prepare(config.data, quiet=True)
    torch.manual_seed(0)
    return checkpoint.save(
        {
            "model": GPT(config.model).state_dict(),
            "config": config.to_dict(),
            "tokenizer": prepared.tokenizer.to_bytes(),
            "step": 0,
        },
        config.out_dir,
    )


def test_longeval_prints_a_table_per_task_and_writes_cells_and_heatmaps(random_checkpoint, tmp_path, capsys):
    figure, cells = tmp_path / "suite.png", tmp_path / "suite.csv"
    assert (
        main(
            [
                "longeval",
                random_checkpoint,
                "--lengths",
                "64,128",
                "--depths",
                "0,1",
                "--trials",
                "2",
                "--items",
                "3",
                "--csv",
                str(cells),
                "--figure",
                str(figure),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for name in SUITE:
        assert f"\n{name} (2 probes per cell" in out
    rows = list(csv.DictReader(cells.open()))
    assert len(rows) == len(SUITE) * 2 * 2 and {r["task"] for r in rows} == set(SUITE)
    assert all(0 <= int(r["correct"]) <= int(r["trials"]) == 2 for r in rows)
    if pytest.importorskip("matplotlib"):
        assert figure.stat().st_size > 1000


def test_longeval_on_a_text_file_of_ones_own(random_checkpoint, tmp_path, capsys):
    from tests.conftest import tiny_text

    text = tmp_path / "mine.txt"
    text.write_text(tiny_text(800, seed=7))
    assert (
        main(
            [
                "longeval",
                random_checkpoint,
                "--tasks",
                "vartrack",
                "--lengths",
                "64",
                "--trials",
                "2",
                "--text",
                str(text),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "vartrack (2 probes per cell" in out and "| all |" in out


def test_text_gives_the_haystacks_and_the_run_its_task(random_checkpoint, tmp_path, capsys, monkeypatch):
    """--text cuts the haystacks from other text; the task's ids are still chosen from the run's own
    training split, as its training rows chose them (another text leaves other ids unused)."""
    chosen, original = [], Task.from_tokens.__func__

    def from_tokens(cls, tokens, *args, **kwargs):
        chosen.append(np.asarray(tokens).copy())
        return original(cls, tokens, *args, **kwargs)

    monkeypatch.setattr(Task, "from_tokens", classmethod(from_tokens))
    other = tmp_path / "other.txt"
    other.write_text(tiny_text(600, seed=5).replace("king", "emperor"))
    probe = ["longeval", random_checkpoint, "--tasks", "single", "--lengths", "64", "--depths", "0", "--trials", "1"]
    assert main([*probe, "--text", str(other)]) == 0 and main(probe) == 0
    assert np.array_equal(chosen[0], chosen[1])
