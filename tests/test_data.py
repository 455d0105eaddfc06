"""Tests for minilm.data.tokenizer and minilm.data: corpus conversion and split, tokenizer, preparation, batches."""

import hashlib
import json
import os
import random
import re

import numpy as np
import pytest
import torch

from minilm.config import ConfigError, DataConfig
from minilm.data import corpus as data
from minilm.data import shakespeare as plays
from minilm.data import sources
from minilm.data import tokenizer as tokenizer_module
from minilm.data.batches import get_batch
from minilm.data.corpus import DataError, prepare
from minilm.data.tokenizer import Tokenizer, TokenizerError

WORDS = (
    "the king queen lord lady sword crown night day love death fair foul speak hear "
    "what where when why how thou thee thy art hath doth shall will would must come go"
).split()


def make_text(n_lines: int, seed: int = 0) -> str:
    """Deterministic play-like text with speakers, indentation, digits and blank lines."""
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        if i % 7 == 0:
            lines.append("")
            lines.append(rng.choice(["ROMEO", "JULIET", "First Citizen"]) + ":")
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10)))
        lines.append(("    " if i % 5 == 0 else "") + words.capitalize() + rng.choice([",", ".", "!", "?", f" {i}."]))
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def shakespeare():
    return plays.shakespeare_documents()


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "train.txt"
    path.write_text(make_text(1500))
    return Tokenizer.train(str(path), 400)


def counting_train(monkeypatch):
    """Count Tokenizer.train calls made by prepare."""
    calls = []
    original = Tokenizer.train.__func__

    def train(cls, *args, **kwargs):
        calls.append(args)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(Tokenizer, "train", classmethod(train))
    return calls


# =========================================================================== Shakespeare


def test_shakespeare_split_is_hamlet_and_tempest_only(shakespeare):
    train, val = shakespeare
    train_names, val_names = [n for n, _ in train], [n for n, _ in val]
    assert sorted(val_names) == ["hamlet", "the-tempest"]
    assert not set(train_names) & set(val_names)
    assert len(train_names) == len(set(train_names)) >= 30
    assert all("Hamlet" != text.splitlines()[0] for _, text in train)
    val_text = sources.join_documents(val)
    fraction = len(val_text) / (len(val_text) + len(sources.join_documents(train)))
    assert 0.04 < fraction < 0.07
    assert "HAMLET:\nTo be, or not to be" in val_text
    assert "To be, or not to be" not in sources.join_documents(train)
    files = {os.path.basename(rel)[:-3]: path for rel, path in plays.shakespeare_files()}
    assert sorted(files) == sorted(train_names + val_names)
    assert plays.play_to_text(files["hamlet"].read_text(), "Hamlet") == dict(val)["hamlet"]  # deterministic


def test_shakespeare_text_format(shakespeare):
    train, val = shakespeare
    hamlet = dict(val)["hamlet"]
    assert hamlet.startswith(
        "Hamlet\n\nACT I\n\nSCENE I. Elsinore. A platform before the castle.\n\n"
        "[FRANCISCO at his post. Enter to him BERNARDO]\n\nBERNARDO:\nWho's there?\n\n"
    )
    for name, text in train + val:
        assert not re.search(r"[#*_\\`<>|]", text), name  # no markdown left
        assert text.endswith("\n") and "\n\n\n" not in text, name
        for block in text.split("\n\n"):
            first = block.split("\n")[0]
            assert first.strip() == first and first, (name, block[:80])
            if first.startswith("["):
                assert first.endswith("]"), (name, first)
    names = {m for _, text in train for m in re.findall(r"^([A-Z][A-Za-z' &,.-]*):$", text, re.M)}
    assert {"ROMEO", "JULIET", "BISHOP OF WINCHESTER", "COUNTESS OF AUVERGNE"} <= names


def test_play_to_text_handles_the_markdown_quirks():
    markdown = (
        "\n".join(
            [
                "# A Play",
                "",
                "## ACT I",
                "",
                "### SCENE I. A wood. TITANIA",
                "",
                "lying asleep.",
                "",
                "_Enter ROMEO, with",
                "a torch_",
                "",
                "**ROMEO**  ",
                "But soft!  ",
                "_\\[Aside]_  ",
                "What light \\--",
                "",
                "_Exit JULIET_",
                "",
                "Through yonder window.",
                "",
                "**JULIET**  ",
                "Ay me.  ",
                "BISHOP",
                "",
                "**OF WINCHESTER**  ",
                "Peace.",
                "",
                "A PLAY",
                "",
                "*Exeunt.*",
                "",
            ]
        )
        + "\n"
    )
    assert plays.play_to_text(markdown) == (
        "A Play\n\nACT I\n\nSCENE I. A wood. TITANIA lying asleep.\n\n[Enter ROMEO, with a torch]\n\n"
        "ROMEO:\nBut soft!\n[Aside]\nWhat light --\n\n[Exit JULIET]\n\nROMEO:\nThrough yonder window.\n\n"
        "JULIET:\nAy me.\n\nBISHOP OF WINCHESTER:\nPeace.\n\n[Exeunt.]\n"
    )
    assert plays.play_to_text("## ACT I\n\n**A**  \nHi.\n", "measure-for-measure").startswith(
        "measure-for-measure\n\nACT I"
    )
    assert plays.title_from_name("measure-for-measure") == "Measure for Measure"


# =========================================================================== tokenizer


def test_tokenizer_round_trip_and_serialization(small_tokenizer, tmp_path):
    tok = small_tokenizer
    assert tok.vocab_size == 400 and tok.bos_id == 1 and tok.eos_id == 2
    samples = [
        "ROMEO:\nBut soft, what light through yonder window breaks?\n\n[Exit.]\n",
        "  two leading spaces\n\n\n    indented\n\ttab\ttrailing   \n",
        " x",
        "",
        "\n",
        "digits 12345 and 007",
        "unseen: é ñ 中文 😀 Ω\n",
    ]
    for text in samples:
        assert tok.decode(tok.encode(text)) == text
    ids = tok.encode(samples[0])
    assert ids.count(3) == samples[0].count("\n")  # the newline is its own token
    clone = Tokenizer.from_bytes(tok.to_bytes())
    assert clone.encode(samples[1]) == tok.encode(samples[1]) and clone.vocab_size == 400
    text = make_text(300, seed=5)
    assert data.encode_text(tok, text, chunk_chars=100).tolist() == tok.encode(text)
    assert tok.decode(np.array(ids, dtype=np.uint16)) == samples[0]
    with pytest.raises(TokenizerError, match="out of range"):
        tok.decode([400])
    with pytest.raises(TokenizerError):
        Tokenizer.from_bytes(b"not a model")


def test_tokenizer_training_is_deterministic_and_checks_vocab(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(make_text(400, seed=1))
    assert Tokenizer.train(str(path), 340).to_bytes() == Tokenizer.train(str(path), 340).to_bytes()
    with pytest.raises(TokenizerError, match="too large"):
        Tokenizer.train(str(path), 2**32 + 1)
    with pytest.raises(TokenizerError, match="too small"):
        Tokenizer.train(str(path), 100)
    with pytest.raises(TokenizerError, match="too high"):
        Tokenizer.train(str(path), 20000)
    with pytest.raises(TokenizerError, match="does not exist"):
        Tokenizer.train(str(tmp_path / "missing.txt"), 340)


# =========================================================================== prepare


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "my corpus.txt"
    path.write_text(make_text(1500, seed=2))
    return path


def test_prepare_writes_and_reuses(corpus_file, tmp_path, monkeypatch):
    calls = counting_train(monkeypatch)
    cfg = DataConfig(corpus=str(corpus_file), vocab_size=400, dir=str(tmp_path / "data"))
    p = prepare(cfg, quiet=True)
    assert len(calls) == 1
    assert re.fullmatch(r"my-corpus-[0-9a-f]{8}-400", p.dir.name) and p.dir.parent == tmp_path / "data"
    assert sorted(os.listdir(p.dir)) == ["manifest.json", "tokenizer.model", "train.bin", "val.bin", "val.txt"]
    assert p.train.dtype == np.uint16 and p.val.dtype == np.uint16
    assert len(p.train) > 10 * len(p.val) / 2 > 0
    assert p.tokenizer.decode(p.val) == p.val_text() and len(p.val_text()) == p.val_chars
    assert p.tokenizer.decode(p.train[:200]) in corpus_file.read_text()
    assert p.train_chars + p.val_chars == pytest.approx(len(corpus_file.read_text()), abs=3)
    assert p.bits_per_char(1.0, "val") == pytest.approx(len(p.val) / p.val_chars / np.log(2))
    manifest = json.loads((p.dir / "manifest.json").read_text())
    assert manifest["train"]["tokens"] == len(p.train) and manifest["val"]["chars"] == p.val_chars
    mtime = (p.dir / "train.bin").stat().st_mtime_ns

    again = prepare(cfg, quiet=True)
    assert len(calls) == 1 and (p.dir / "train.bin").stat().st_mtime_ns == mtime
    assert np.array_equal(again.train, p.train)

    bigger = prepare(DataConfig(corpus=str(corpus_file), vocab_size=420, dir=cfg.dir), quiet=True)
    assert len(calls) == 2 and bigger.dir.name.endswith("-420") and bigger.tokenizer.vocab_size == 420

    corpus_file.write_text(corpus_file.read_text() + "A new last line.\n")
    changed = prepare(cfg, quiet=True)
    assert len(calls) == 3 and changed.dir == p.dir and changed.val_text().endswith("A new last line.\n")

    monkeypatch.setattr(tokenizer_module, "SETTINGS_VERSION", tokenizer_module.SETTINGS_VERSION + 1)
    prepare(cfg, quiet=True)
    assert len(calls) == 4


def test_the_holdout_is_the_end_of_the_train_split_and_never_sampled(corpus_file, tmp_path):
    whole = prepare(DataConfig(corpus=str(corpus_file), vocab_size=400, dir=str(tmp_path / "data")), quiet=True)
    held = prepare(
        DataConfig(corpus=str(corpus_file), vocab_size=400, dir=str(tmp_path / "data"), holdout_tokens=500), quiet=True
    )
    assert held.dir == whole.dir  # the same prepared files: the holdout is a view of them
    assert len(held.holdout) == 500 and len(held.train) == len(whole.train) - 500
    assert np.array_equal(np.concatenate([held.train, held.holdout]), whole.train)
    assert np.array_equal(held.tokens("holdout"), held.holdout) and np.array_equal(held.val, whole.val)
    for bad in (-5, 1.5, True):
        with pytest.raises(ConfigError, match=r"data.holdout_tokens=.* is invalid: expected 0 \(none\) or a number"):
            DataConfig(corpus=str(corpus_file), holdout_tokens=bad)
    with pytest.raises(
        DataError,
        match=r"data.holdout_tokens=\d+ is invalid: the train split has \d+ tokens; hold out "
        r"at most half",
    ):
        prepare(
            DataConfig(
                corpus=str(corpus_file), vocab_size=400, dir=str(tmp_path / "data"), holdout_tokens=len(whole.train)
            ),
            quiet=True,
        )


def test_prepare_with_a_given_tokenizer(corpus_file, small_tokenizer, tmp_path, monkeypatch):
    calls = counting_train(monkeypatch)
    cfg = DataConfig(corpus=str(corpus_file), vocab_size=400, dir=str(tmp_path / "data"))
    own = prepare(cfg, quiet=True)
    assert len(calls) == 1
    # the same tokenizer as the standard directory's: those files are reused
    same = prepare(cfg, quiet=True, tokenizer=own.tokenizer)
    assert same.dir == own.dir and len(calls) == 1
    # another tokenizer (another vocab size too): encoded with it, never trained, in its own directory
    other = prepare(
        DataConfig(corpus=str(corpus_file), vocab_size=999, dir=cfg.dir), quiet=True, tokenizer=small_tokenizer
    )
    assert len(calls) == 1 and other.dir != own.dir and re.search(r"-tok[0-9a-f]{12}$", other.dir.name)
    assert other.tokenizer.to_bytes() == small_tokenizer.to_bytes()
    assert other.val.tolist() == small_tokenizer.encode(other.val_text())
    assert other.val_text() == own.val_text()
    manifest = json.loads((other.dir / "manifest.json").read_text())
    assert manifest["vocab_size"] == small_tokenizer.vocab_size == 400
    mtime = (other.dir / "train.bin").stat().st_mtime_ns
    assert prepare(cfg, quiet=True, tokenizer=small_tokenizer).dir == other.dir
    assert (other.dir / "train.bin").stat().st_mtime_ns == mtime
    # a changed source re-encodes with the given tokenizer, still without training one
    corpus_file.write_text(corpus_file.read_text() + "A new last line.\n")
    changed = prepare(cfg, quiet=True, tokenizer=small_tokenizer)
    assert len(calls) == 1 and changed.dir == other.dir and changed.val_text().endswith("A new last line.\n")


def test_preparing_says_what_it_does_around_the_silent_tokenizer_training(
    corpus_file, small_tokenizer, tmp_path, capsys
):
    cfg = DataConfig(corpus=str(corpus_file), vocab_size=400, dir=str(tmp_path / "data"))
    assert not data.holds_prepared(cfg.dir, cfg.corpus)
    prepared = prepare(cfg)
    err = capsys.readouterr().err
    before = err.index(f"training a sentencepiece tokenizer of 400 tokens on {prepared.train_chars:,} characters")
    assert re.search(r"trained the tokenizer in \d+\.\ds", err[before:])
    assert data.holds_prepared(cfg.dir, cfg.corpus) and not data.holds_prepared(cfg.dir, str(tmp_path / "other.txt"))
    prepare(cfg, quiet=True, tokenizer=small_tokenizer, announce=True)  # another tokenizer: prepared, and said
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("[data] preparing") and str(tmp_path / "data") in err
    prepare(cfg, quiet=True, tokenizer=small_tokenizer, announce=True)  # reused: nothing to say
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("damage", ["no manifest", "bad manifest", "truncated bin", "swapped val", "crash"])
def test_stale_or_half_written_dirs_are_rebuilt(damage, corpus_file, tmp_path, monkeypatch):
    cfg = DataConfig(corpus=str(corpus_file), vocab_size=400, dir=str(tmp_path / "data"))
    p = prepare(cfg, quiet=True)
    reference = np.array(p.train)
    calls = counting_train(monkeypatch)
    if damage == "no manifest":
        (p.dir / "manifest.json").unlink()
    elif damage == "bad manifest":
        (p.dir / "manifest.json").write_text("{not json")
    elif damage == "truncated bin":
        (p.dir / "train.bin").write_bytes((p.dir / "train.bin").read_bytes()[:-2])
    elif damage == "swapped val":
        (p.dir / "val.txt").write_text("something else\n")
    elif damage == "crash":  # a source change, then a crash mid-prepare
        corpus_file.write_text(corpus_file.read_text() + "More.\n")

        def boom(*args, **kwargs):
            raise KeyboardInterrupt

        with monkeypatch.context() as m:
            m.setattr(Tokenizer, "encode_batch", boom)
            with pytest.raises(KeyboardInterrupt):
                prepare(cfg, quiet=True)
        assert not (p.dir / "manifest.json").exists()
        assert not [f for f in os.listdir(p.dir) if f.endswith(".tmp")]
        calls.clear()
    rebuilt = prepare(cfg, quiet=True)
    assert len(calls) == 1
    assert rebuilt.tokenizer.decode(rebuilt.val) == rebuilt.val_text()
    if damage != "crash":
        assert np.array_equal(rebuilt.train, reference)  # deterministic rebuild


def test_directory_corpus_split_is_deterministic(tmp_path):
    def build(root, order):
        for i in order:
            sub = root / ("sub" if i % 3 else "") / f"doc{i:02d}.txt"
            sub.parent.mkdir(parents=True, exist_ok=True)
            sub.write_text(make_text(20, seed=i))
        (root / ".hidden.txt").write_text("ignored\n")
        (root / "notes.md").write_text("ignored\n")
        (root / "empty.txt").write_text("\n")

    build(tmp_path / "a", range(20))
    build(tmp_path / "b", reversed(range(20)))
    train_a, val_a = sources.corpus_documents(str(tmp_path / "a"))
    train_b, val_b = sources.corpus_documents(str(tmp_path / "b"))
    assert [n for n, _ in val_a] == [n for n, _ in val_b] and len(val_a) == 2
    assert train_a == train_b and len(train_a) == 18
    assert not {n for n, _ in train_a} & {n for n, _ in val_a}
    assert all(not n.startswith(".") and n.endswith(".txt") for n, _ in train_a + val_a)
    assert [n for n, _ in train_a] == sorted(n for n, _ in train_a)

    two = tmp_path / "two"  # fewer than 10 documents: each is cut; one too short to cut stays whole in train
    two.mkdir()
    (two / "x.txt").write_text("one text\n")
    (two / "y.txt").write_text("another text\n")
    train, val = sources.corpus_documents(str(two))
    assert train == [("x.txt", "one text\n"), ("y.txt", "another tex")] and val == [("y.txt#val", "t\n")]

    train, val = sources.corpus_documents(str(tmp_path / "a" / "doc00.txt"))  # single file: last ~10% at a line break
    text = (tmp_path / "a" / "doc00.txt").read_text()
    assert train[0][1] + val[0][1] == text and train[0][1].endswith("\n")
    assert 0.03 < len(val[0][1]) / len(text) < 0.2


def test_clear_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        prepare(DataConfig(corpus=str(tmp_path / "nope"), dir=str(tmp_path / "d")), quiet=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="without .txt, .jsonl, .parquet or .arrow files"):
        prepare(DataConfig(corpus=str(tmp_path / "empty"), dir=str(tmp_path / "d")), quiet=True)
    (tmp_path / "empty" / "a.txt").write_text("  \n")
    with pytest.raises(DataError, match="has no text"):
        sources.corpus_documents(str(tmp_path / "empty"))
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match="UTF-8"):
        sources.corpus_documents(str(tmp_path / "latin1.txt"))
    with pytest.raises(DataError, match="too large"):
        prepare(DataConfig(vocab_size=2**32 + 1, dir=str(tmp_path / "d")), quiet=True)
    tiny = tmp_path / "tiny.txt"
    tiny.write_text(make_text(30))
    with pytest.raises(DataError, match=r"data.vocab_size=5000 .*too high"):
        prepare(DataConfig(corpus=str(tiny), vocab_size=5000, dir=str(tmp_path / "d")), quiet=True)
    assert not (tmp_path / "d").exists() or not os.listdir(tmp_path / "d")


# =========================================================================== batches


def test_get_batch_shapes_and_determinism():
    tokens = np.arange(1000, dtype=np.uint16)
    g = torch.Generator().manual_seed(0)
    x, y = get_batch(tokens, 4, 16, g)
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y - x, torch.ones_like(x))
    state = g.get_state()
    x2, _ = get_batch(tokens, 4, 16, g)
    g.set_state(state)
    x3, _ = get_batch(tokens, 4, 16, g)
    assert torch.equal(x2, x3) and not torch.equal(x, x2)
    xt, yt = get_batch(torch.arange(1000), 4, 16, torch.Generator().manual_seed(0))
    assert torch.equal(xt, x) and torch.equal(yt, y)
    x, y = get_batch(np.arange(17, dtype=np.uint16), 3, 16, g)  # exactly block_size + 1 tokens
    assert torch.equal(x[0], torch.arange(16)) and torch.equal(y[2], torch.arange(1, 17))
    with pytest.raises(DataError, match="fewer than block_size"):
        get_batch(np.arange(16, dtype=np.uint16), 2, 16, g)


@pytest.mark.slow
def test_prepare_shakespeare_with_real_vocab(tmp_path, monkeypatch, shakespeare):
    """One full preparation of the default corpus (about 5 s; the plays are converted once per module)."""
    monkeypatch.setattr(plays, "shakespeare_documents", lambda: shakespeare)
    p = prepare(DataConfig(vocab_size=4096, dir=str(tmp_path)), quiet=True)
    assert p.dir.name == "shakespeare-4096" and p.tokenizer.vocab_size == 4096
    assert p.manifest["val"]["documents"] == ["the-tempest", "hamlet"]
    # without data.end_of_text the manifest is what earlier versions wrote, so their directories stay valid
    assert list(p.manifest) == [
        "format_version",
        "corpus",
        "source_fingerprint",
        "vocab_size",
        "tokenizer_settings",
        "token_dtype",
        "train",
        "val",
        "files",
        "created",
        "seconds",
    ]
    assert list(p.manifest["train"]) == list(p.manifest["val"]) == ["documents", "chars", "tokens"]
    assert p.eot_id is None and p.manifest["format_version"] == 1
    earlier = hashlib.sha256(f"converter={plays.CONVERTER_VERSION}\n".encode())  # every byte of every play
    for rel, path in plays.shakespeare_files():
        earlier.update(f"{rel}\0{path.stat().st_size}\0".encode() + path.read_bytes())
    assert p.manifest["source_fingerprint"] == earlier.hexdigest()
    assert 0.25 < p.tokens_per_char("train") < 0.4 and 0.25 < p.tokens_per_char("val") < 0.45
    assert p.tokenizer.decode(p.val) == p.val_text()
    assert p.val_text().startswith("The Tempest\n\nACT I\n")
