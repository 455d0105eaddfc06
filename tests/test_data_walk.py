"""Tests for what a corpus directory yields and what preparing says about text it cannot keep: the
prepared data (data.dir) inside a corpus directory is never read back as documents, extensions match
in any case, a text without a line short enough for sentencepiece is refused for that reason, and
U+2581 (sentencepiece's space marker) is counted in a note (minilm.data.sources, minilm.data.corpus,
minilm.data.tokenizer)."""

import json

import pytest

from minilm.config import DataConfig
from minilm.data import tokenizer as tokenizer_module
from minilm.data.corpus import DataError, prepare
from minilm.data.sources import corpus_documents
from minilm.data.tokenizer import MAX_LINE_BYTES
from tests.conftest import tiny_text
from tests.test_corpora import trainings

VOCAB = 400


def one_line(info) -> str:
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.fixture
def folder(tmp_path):
    """A corpus directory of two text files."""
    root = tmp_path / "texts"
    root.mkdir()
    for i in range(2):
        (root / f"doc{i}.txt").write_text(tiny_text(150, seed=i))
    return root


# =========================================================================== data.dir inside the corpus


@pytest.mark.parametrize("where", ["inside", "dot"])
def test_a_corpus_directory_leaves_out_the_prepared_data_inside_it(folder, monkeypatch, where):
    """data.corpus=DIR data.dir=DIR/data, and corpus '.' with the default data.dir: the second run reuses
    the first's files, and no prepared file (val.txt) is a document."""
    if where == "dot":
        monkeypatch.chdir(folder)
        cfg = DataConfig(corpus=".", vocab_size=VOCAB)  # data.dir: data, inside '.'
    else:
        cfg = DataConfig(corpus=str(folder), vocab_size=VOCAB, dir=str(folder / "data"))
    calls = trainings(monkeypatch)
    first = prepare(cfg, quiet=True)
    again = prepare(cfg, quiet=True)
    assert len(calls) == 1 and again.dir == first.dir  # reused: the fingerprint settled
    names = again.manifest["train"]["documents"] + again.manifest["val"]["documents"]
    assert sorted(names) == ["doc0.txt", "doc0.txt#val", "doc1.txt", "doc1.txt#val"]


def test_data_dir_keeps_the_users_own_files_and_may_be_the_corpus_directory(folder, monkeypatch):
    """Below data.dir only the prepared corpora's folders are left out: a text of the user's there is a
    document; data.dir the corpus directory itself works alike (its prepared folders lie beside the texts)."""
    (folder / "data").mkdir()
    (folder / "data" / "notes.txt").write_text(tiny_text(60, seed=7))
    inside = DataConfig(corpus=str(folder), vocab_size=VOCAB, dir=str(folder / "data"))
    calls = trainings(monkeypatch)
    prepare(inside, quiet=True)
    again = prepare(inside, quiet=True)
    assert len(calls) == 1 and "data/notes.txt" in again.manifest["train"]["documents"]
    (folder / "data" / "notes.txt").unlink()
    itself = DataConfig(corpus=str(folder), vocab_size=VOCAB, dir=str(folder))
    first = prepare(itself, quiet=True)
    assert prepare(itself, quiet=True).dir == first.dir and len(calls) == 2  # reused, its own files no documents
    assert sorted(first.manifest["train"]["documents"]) == ["doc0.txt", "doc1.txt"]


# =========================================================================== extensions


def test_extensions_match_in_any_case(tmp_path):
    root = tmp_path / "mixed"
    root.mkdir()
    (root / "a.TXT").write_text("loud text\n")
    (root / "b.txt").write_text("quiet text\n")
    (root / "c.Jsonl").write_text(json.dumps({"text": "a line's text"}) + "\n")
    train, val = corpus_documents(str(root))  # 3 documents: each cut, the end validation
    assert [name for name, _ in train] == ["a.TXT", "b.txt", "c.Jsonl#1"]
    assert dict(train)["c.Jsonl#1"] + dict(val)["c.Jsonl#1#val"] == "a line's text"  # the field, not the JSON
    single = tmp_path / "docs.JSONL"  # one file: JSON lines, not raw text
    single.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(3)))
    train, _ = corpus_documents(str(single))
    assert [name for name, _ in train] == ["docs.JSONL#1", "docs.JSONL#2", "docs.JSONL#3"]


# =========================================================================== long lines


def test_a_text_without_a_short_line_is_refused_for_its_lines_not_its_vocabulary(tmp_path):
    corpus = tmp_path / "one-line.txt"
    corpus.write_text(("word " * 20_000).strip())  # 100 KB, no line break: the train split is one long line
    with pytest.raises(DataError) as info:
        prepare(DataConfig(corpus=str(corpus), vocab_size=VOCAB, dir=str(tmp_path / "d")), quiet=True)
    message = one_line(info)
    assert f"no line of at most {MAX_LINE_BYTES:,} bytes" in message and "break the text into lines" in message
    assert str(corpus) in message and "vocab_size" not in message and "sentences_" not in message


def test_line_lengths_are_counted_across_blocks(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_bytes(b"abc\n\nabcdefg\nab")  # short: abc, ab; long: abcdefg; the empty line is neither
    for block in (1, 3, 100):
        assert tokenizer_module._line_lengths(str(path), limit=5, block=block) == (2, 1)


# =========================================================================== U+2581


def test_the_space_marker_is_counted_in_a_note_when_prepared(tmp_path, capsys):
    tok_text = tmp_path / "plain.txt"
    tok_text.write_text(tiny_text(150))
    plain = prepare(DataConfig(corpus=str(tok_text), vocab_size=VOCAB, dir=str(tmp_path / "d")), quiet=True)
    assert "U+2581" not in capsys.readouterr().err  # no marker, no note
    assert plain.tokenizer.decode(plain.tokenizer.encode("a\u2581b")) == "a b"  # the loss the note is about
    marked = tmp_path / "marked.txt"
    marked.write_text(tiny_text(150).replace("king", "k\u2581ing", 3))
    prepare(DataConfig(corpus=str(marked), vocab_size=VOCAB, dir=str(tmp_path / "d")), quiet=True)
    notes = [line for line in capsys.readouterr().err.splitlines() if "U+2581" in line]
    assert len(notes) == 1 and "holds 3 '\u2581' (U+2581) characters" in notes[0] and "as ' '" in notes[0]
