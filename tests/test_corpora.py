"""Tests for corpus sources and streaming preparation: .jsonl files, directories mixing .txt and
.jsonl, the validation split by name hash, end-of-text ids between documents, the cheap source
fingerprint and --reprepare (minilm.data.sources, minilm.data.corpus)."""

import hashlib
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from minilm.config import DataConfig
from minilm.data import corpus as data
from minilm.data import sources
from minilm.data import tokenizer as tokenizer_module
from minilm.data.corpus import DataError, prepare
from minilm.data.hf_tokenizer import HFTokenizer, sentencepiece_to_json
from minilm.data.sources import corpus_documents, join_documents, source_fingerprint
from minilm.data.tokenizer import Tokenizer
from tests.conftest import tiny_text

VOCAB = 400


def trainings(monkeypatch) -> list:
    """Tokenizer.train calls made from now on (each one is a preparation that was not reused)."""
    calls, original = [], Tokenizer.train.__func__

    def train(cls, *args, **kwargs):
        calls.append(args)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(Tokenizer, "train", classmethod(train))
    return calls


def write_jsonl(path, records, field="text"):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")


@pytest.fixture
def mixed(tmp_path):
    """A directory of 4 .txt files and a .jsonl file of 16 documents (a blank line, an empty text)."""
    root = tmp_path / "mixed"
    (root / "sub").mkdir(parents=True)
    for i in range(4):
        (root / ("sub" if i % 2 else "") / f"play{i}.txt").write_text("\n" + tiny_text(60, seed=i) + "\n\n")
    records = [{"id": i, "text": tiny_text(25, seed=100 + i)} for i in range(16)]
    records[3:3] = ["   ", {"id": "empty", "text": " \n"}]  # lines 4 and 5: skipped
    write_jsonl(root / "sub" / "lines.jsonl", records)
    (root / ".hidden.jsonl").write_text("not json\n")
    (root / "notes.md").write_text("ignored\n")
    return root


# =========================================================================== sources


def test_a_jsonl_file_is_one_document_per_line(tmp_path):
    path = tmp_path / "docs.jsonl"
    write_jsonl(
        path,
        [{"body": "first\n", "n": 1}, "", {"body": "\n\nsecond\nline"}, {"body": "  "}, {"body": "third \u00e9\u6771"}],
    )
    train, val = corpus_documents(str(path), "body")
    assert [n for n, _ in train] == ["docs.jsonl#1", "docs.jsonl#3", "docs.jsonl#5"]  # 1-based line numbers
    # fewer than 10 documents: each is cut (at a line break where there is one); one too short to cut stays whole
    assert [n for n, _ in val] == ["docs.jsonl#3#val", "docs.jsonl#5#val"]
    docs = {name: text + dict(val).get(name + "#val", "") for name, text in train}
    assert docs["docs.jsonl#1"] == "first\n" and docs["docs.jsonl#3"] == "\n\nsecond\nline"
    assert docs["docs.jsonl#5"] == "third \u00e9\u6771" and dict(train)["docs.jsonl#3"] == "\n\nsecond\n"
    (one := tmp_path / "one.jsonl").write_text(json.dumps({"text": tiny_text(50)}) + "\n")
    ((train_name, train_text),) = corpus_documents(str(one))[0]
    ((val_name, val_text),) = corpus_documents(str(one))[1]
    assert (train_name, val_name) == ("one.jsonl#1", "one.jsonl#1#val")
    assert (train_text, val_text) == sources.split_text(tiny_text(50))  # a single document: cut at 90%


@pytest.mark.parametrize(
    "line, words",
    [
        ("{not json", ["line 2", "not valid JSON", "'text'"]),
        ('["a", "list"]', ["line 2", "is an array, not an object", "'text'"]),
        ('{"txt": "x", "id": 1}', ["line 2", "no field 'text'", "did you mean txt"]),
        ('{"text": 7}', ["line 2", "field 'text'", "is a number, expected a string"]),
        ('{"text": null}', ["line 2", "field 'text'", "is null, expected a string"]),
        ('{"text": "\\ud800"}', ["line 2", "unpaired surrogate"]),
        (b'{"text": "caf\xe9"}', ["line 2", "not valid JSON (not UTF-8)"]),
    ],
)
def test_bad_jsonl_lines_are_one_line_errors_naming_file_line_and_field(tmp_path, line, words):
    path = tmp_path / "bad.jsonl"
    head = json.dumps({"text": "fine"}).encode() + b"\n"
    path.write_bytes(head + (line if isinstance(line, bytes) else line.encode()) + b"\n")
    with pytest.raises(DataError) as info:
        prepare(DataConfig(corpus=str(path), vocab_size=VOCAB, dir=str(tmp_path / "d")), quiet=True)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    for word in words:
        assert word in message
    assert not (tmp_path / "d").exists() or not os.listdir(tmp_path / "d")


def test_a_directory_mixes_txt_and_jsonl_and_splits_by_name_hash(mixed):
    train, val = corpus_documents(str(mixed))
    names = [n for n, _ in train + val]
    jsonl_lines = [1, 2, 3] + list(range(6, 19))
    expected = ["play0.txt", "play2.txt", "sub/lines.jsonl", "sub/play1.txt", "sub/play3.txt"]
    everything = [n for e in expected for n in ([f"{e}#{i}" for i in jsonl_lines] if e.endswith("jsonl") else [e])]
    assert sorted(names) == sorted(everything) and len(names) == 20
    assert [n for n in everything if n in dict(train)] == [n for n, _ in train]  # corpus order kept
    by_hash = sorted(everything, key=lambda n: hashlib.sha1(n.encode()).hexdigest())
    assert sorted(n for n, _ in val) == sorted(by_hash[:2])  # 10% of 20, smallest SHA-1 of the name
    assert dict(train + val)["sub/play1.txt"] == (mixed / "sub" / "play1.txt").read_text()
    assert dict(train + val)["sub/lines.jsonl#6"] == tiny_text(25, seed=103)


@pytest.mark.parametrize("files", [1, 2, 9])
def test_a_corpus_of_few_documents_gives_validation_the_last_tenth_of_each(tmp_path, files):
    """Fewer than 10 documents, where 10% of them is less than one (a two-file directory once gave one
    file of two, 50%, to validation): each document's text from the first line break at or after 90%
    is validation, so the share is near 10% whatever the lengths, and no text is lost or in both."""
    root = tmp_path / "few"
    root.mkdir()
    texts = {f"doc{i}.txt": tiny_text(200 * 5 ** (i % 2), seed=i) for i in range(files)}  # 8k and 40k characters
    for name, text in texts.items():
        (root / name).write_text(text)
    train, val = corpus_documents(str(root / "doc0.txt" if files == 1 else root))
    assert [n for n, _ in train] == list(texts) and [n for n, _ in val] == [f"{n}#val" for n in texts]
    for (name, head), (_, tail) in zip(train, val):
        assert head + tail == texts[name] and head.endswith("\n") and tail.strip()  # cut at a line break
        assert 0.09 < len(tail) / len(texts[name]) <= 0.1
    assert 0.09 < sum(len(t) for _, t in val) / sum(map(len, texts.values())) <= 0.1
    (root / "doc9.txt").write_text(tiny_text(50, seed=9))
    for i in range(files, 9):
        (root / f"more{i}.txt").write_text(tiny_text(50, seed=i))
    train, val = corpus_documents(str(root))  # 10 documents: validation takes one of them, whole
    assert len(train) == 9 and len(val) == 1 and not val[0][0].endswith("#val")
    assert dict(val)[val[0][0]] == (root / val[0][0]).read_text()


def test_a_prepared_corpus_of_few_documents_split_whole_is_prepared_again(tmp_path, monkeypatch):
    """A directory prepared when a two-file corpus gave one whole file to validation is not reused."""
    root = tmp_path / "two"
    root.mkdir()
    for i in range(2):
        (root / f"doc{i}.txt").write_text(tiny_text(300, seed=i))
    cfg = DataConfig(corpus=str(root), vocab_size=VOCAB, dir=str(tmp_path / "d"))
    p = prepare(cfg, quiet=True)
    assert p.manifest["val"]["documents"] == ["doc0.txt#val", "doc1.txt#val"]
    assert 0.09 < p.val_chars / (p.train_chars + p.val_chars) < 0.11
    calls = trainings(monkeypatch)
    prepare(cfg, quiet=True)
    assert not calls  # today's split: reused
    manifest = json.loads((p.dir / "manifest.json").read_text())
    manifest["train"]["documents"], manifest["val"]["documents"] = ["doc0.txt"], ["doc1.txt"]  # the old split
    (p.dir / "manifest.json").write_text(json.dumps(manifest))
    again = prepare(cfg, quiet=True)
    assert len(calls) == 1 and again.manifest["val"]["documents"] == ["doc0.txt#val", "doc1.txt#val"]


def test_text_is_read_in_blocks_exactly_as_read_text(tmp_path, monkeypatch):
    text = "\u00e9t\u00e9\r\n" + "\n".join(f"{i} caf\u00e9 \u6771\u4eac\r" for i in range(300)) + "\r\nend\n"
    path = tmp_path / "a.txt"
    path.write_bytes(text.encode("utf-8"))
    monkeypatch.setattr(sources, "READ_BYTES", 7)  # blocks that cut characters and \r\n pairs
    train, val = corpus_documents(str(path))
    assert train[0][1] + val[0][1] == path.read_text(encoding="utf-8")
    assert (train[0][1], val[0][1]) == sources.split_text(path.read_text(encoding="utf-8"))
    path.write_bytes(b"x" * 20 + b"\xff" + b"y\n")
    with pytest.raises(DataError, match=r"not UTF-8 text \(byte 20\)"):
        corpus_documents(str(path))


# =========================================================================== streaming preparation


def test_streaming_gives_the_ids_of_encoding_the_joined_text_at_once(mixed, tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "READ_BYTES", 999)  # many blocks per file
    monkeypatch.setattr(tokenizer_module, "ENCODE_CHUNK_CHARS", 50)  # many chunks, pending text carried over
    monkeypatch.setattr(data, "LISTED_DOCUMENTS", 5)
    p = prepare(DataConfig(corpus=str(mixed), vocab_size=VOCAB, dir=str(tmp_path / "d")), quiet=True)
    train, val = corpus_documents(str(mixed))
    assert p.train.tolist() == p.tokenizer.encode(join_documents(train))
    assert p.val.tolist() == p.tokenizer.encode(join_documents(val))
    assert p.val_text() == join_documents(val) and p.val_chars == len(p.val_text())
    assert p.train_chars == len(join_documents(train)) and p.eot_id is None
    assert p.manifest["train"]["documents"] == [n for n, _ in train][:5]  # at most LISTED_DOCUMENTS named
    assert p.manifest["train"]["more_documents"] == len(train) - 5 and "more_documents" not in p.manifest["val"]
    for name, info in p.manifest["files"].items():  # hashed as written: what is on disk
        assert info["sha256"] == hashlib.sha256((p.dir / name).read_bytes()).hexdigest()
    assert not [f for f in os.listdir(p.dir) if f.startswith(".")]  # no temporaries left


def test_end_of_text_after_every_document_and_only_there(mixed, tmp_path, monkeypatch):
    calls = trainings(monkeypatch)
    cfg = DataConfig(corpus=str(mixed), vocab_size=VOCAB, dir=str(tmp_path / "d"), end_of_text=True)
    p = prepare(cfg, quiet=True)
    assert p.eot_id == p.tokenizer.eos_id == 2
    assert p.manifest["end_of_text"] is True and p.manifest["eot_id"] == 2
    for ids, docs in ((p.train, corpus_documents(str(mixed))[0]), (p.val, corpus_documents(str(mixed))[1])):
        ids = ids.tolist()
        assert ids[-1] == 2 and ids.count(2) == len(docs)
        ends = [i for i, t in enumerate(ids) if t == 2]
        pieces = [ids[a + 1 : b] for a, b in zip([-1] + ends, ends)]
        assert [p.tokenizer.decode(piece) for piece in pieces] == [text.strip("\n") + "\n" for _, text in docs]
        assert pieces == [p.tokenizer.encode(text.strip("\n") + "\n") for _, text in docs]
    val_docs = corpus_documents(str(mixed))[1]
    assert p.val_text() == join_documents(val_docs) and p.val_chars == len(p.val_text())  # joined as without
    plain = prepare(DataConfig(corpus=str(mixed), vocab_size=VOCAB, dir=str(tmp_path / "other")), quiet=True)
    assert (plain.train_chars, plain.val_chars) == (p.train_chars, p.val_chars)
    assert [plain.tokenizer.id_to_piece(i) for i in range(VOCAB)] == [p.tokenizer.id_to_piece(i) for i in range(VOCAB)]
    assert len(calls) == 2

    assert prepare(cfg, quiet=True).dir == p.dir and len(calls) == 2  # reused
    off = prepare(DataConfig(corpus=str(mixed), vocab_size=VOCAB, dir=cfg.dir), quiet=True)  # a directory beside it
    assert len(calls) == 3 and off.dir != p.dir and off.eot_id is None and 2 not in off.train.tolist()
    assert p.dir.name == off.dir.name + "-eot"
    assert "end_of_text" not in off.manifest and "eot_id" not in off.manifest
    assert prepare(cfg, quiet=True).eot_id == 2 and len(calls) == 3  # both kept: switching back rebuilds nothing


def test_end_of_text_with_a_given_tokenizer(mixed, tmp_path):
    sp = prepare(DataConfig(corpus=str(mixed), vocab_size=VOCAB, dir=str(tmp_path / "d")), quiet=True).tokenizer
    cfg = DataConfig(corpus=str(mixed), dir=str(tmp_path / "d"), end_of_text=True)
    given = prepare(cfg, quiet=True, tokenizer=HFTokenizer.from_sentencepiece(sp))
    assert given.eot_id == 2 and given.train.tolist().count(2) == len(corpus_documents(str(mixed))[0])
    no_eos = HFTokenizer(sentencepiece_to_json(sp.to_bytes()))
    with pytest.raises(DataError, match=r"data.end_of_text=true needs the tokenizer's end-of-text .* has none"):
        prepare(cfg, quiet=True, tokenizer=no_eos)


# =========================================================================== fingerprint and reprepare


def big_file(path, size=1 << 20):
    path.write_bytes(bytes(i % 251 for i in range(size)))
    return path


def test_the_fingerprint_sees_a_new_mtime_and_a_changed_middle_byte(tmp_path):
    path = big_file(tmp_path / "big.txt")
    before = source_fingerprint(str(path))
    stat = path.stat()

    def rewrite(offset, mtime_ns):
        data = bytearray(path.read_bytes())
        data[offset] ^= 1
        path.write_bytes(bytes(data))
        os.utime(path, ns=(stat.st_atime_ns, mtime_ns))

    rewrite(300_000, stat.st_mtime_ns + 10**9)  # same size, a byte no sample reads, a new mtime
    assert source_fingerprint(str(path)) != before
    rewrite(300_000, stat.st_mtime_ns)  # back, and the mtime too: the same fingerprint
    assert source_fingerprint(str(path)) == before
    rewrite(stat.st_size // 2, stat.st_mtime_ns)  # the middle byte, same size and mtime
    assert source_fingerprint(str(path)) != before
    (tmp_path / "x.jsonl").write_text('{"text": "a"}\n')  # a .jsonl file: the text field counts
    assert source_fingerprint(str(tmp_path)) != source_fingerprint(str(tmp_path), "body")


def test_the_fingerprint_does_not_read_whole_files(tmp_path):
    path = tmp_path / "sparse.txt"
    with open(path, "wb") as f:
        f.truncate(4 << 30)  # 4 GiB, sparse: reading all of it would take seconds
    started = time.perf_counter()
    source_fingerprint(str(path))
    assert time.perf_counter() - started < 1.0


def test_reprepare_rebuilds_what_the_fingerprint_cannot_see(tmp_path, monkeypatch):
    head = tiny_text(1500)
    text = head + "a b c\n" * 150_000 + tiny_text(300, seed=1)  # about 1 MB, mostly lines no sample reads
    path = tmp_path / "c.txt"
    path.write_text(text)
    cfg = DataConfig(corpus=str(path), vocab_size=VOCAB, dir=str(tmp_path / "d"))
    first = prepare(cfg, quiet=True)
    calls = trainings(monkeypatch)
    stat = path.stat()
    at = len(head) + 6 * 30_000  # 'a b c' -> 'x b c' at about 240 KB: the same size
    path.write_text(text[:at] + "x" + text[at + 1 :])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same mtime
    stale = prepare(cfg, quiet=True)
    assert len(calls) == 0 and "x b c" not in stale.tokenizer.decode(stale.train)
    rebuilt = prepare(cfg, quiet=True, reprepare=True)
    assert len(calls) == 1 and rebuilt.dir == first.dir and "x b c" in rebuilt.tokenizer.decode(rebuilt.train)
    assert prepare(cfg, quiet=True).dir == first.dir and len(calls) == 1  # valid again
    given = prepare(cfg, quiet=True, tokenizer=rebuilt.tokenizer, reprepare=True)  # a given tokenizer: its own dir
    assert len(calls) == 1 and given.dir.name.startswith(first.dir.name.rsplit("-", 1)[0] + "-tok")


def test_a_default_corpus_config_without_the_new_keys_still_prepares(tmp_path):
    """prepare takes any object with corpus / vocab_size / dir (older callers): no end of text."""
    path = tmp_path / "c.txt"
    path.write_text(tiny_text(800))
    p = prepare(SimpleNamespace(corpus=str(path), vocab_size=VOCAB, dir=str(tmp_path / "d")), quiet=True)
    assert p.eot_id is None and "end_of_text" not in p.manifest


# =========================================================================== bounded memory

PREPARE_AND_REPORT_RSS = """
import resource, sys
from minilm.config import DataConfig
from minilm.data.corpus import prepare
from minilm.data.tokenizer import Tokenizer
tokenizer = Tokenizer.train(sys.argv[3], 400)
prepare(DataConfig(corpus=sys.argv[1], vocab_size=400, dir=sys.argv[2]), quiet=True, tokenizer=tokenizer)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux
"""


def peak_rss_mib(corpus, data_dir, tokenizer_text) -> float:
    out = subprocess.run(
        [sys.executable, "-c", PREPARE_AND_REPORT_RSS, str(corpus), str(data_dir), str(tokenizer_text)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.split()[-1]) / 1024


@pytest.mark.slow
def test_preparing_a_corpus_32_times_larger_takes_about_the_same_memory(tmp_path):
    """Peak RSS of preparing 1.2 MB and 38 MB of text (in processes of their own, the same given
    tokenizer): the streamed preparation holds a chunk at a time, so 37 MB more text adds far
    less than that: 19 MiB measured, where reading it whole took about 8.6x the text (1.7 GiB for
    200 MB), some 260 MiB here."""
    block = tiny_text(10000, seed=3)  # about 0.4 MB
    tokenizer_text = tmp_path / "tokenizer.txt"
    tokenizer_text.write_text(block[:100_000])
    sizes = {}
    for name, files in (("small", 1), ("large", 32)):
        root = tmp_path / name
        root.mkdir()
        for i in range(files):
            (root / f"part{i:02d}.txt").write_text(block * 3)
        sizes[name] = peak_rss_mib(root, tmp_path / f"data-{name}", tokenizer_text)
    grown = sizes["large"] - sizes["small"]
    assert grown < 64, f"peak RSS grew by {grown:.0f} MiB for 32x more text ({sizes})"
