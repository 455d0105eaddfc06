"""Your own tokenizer and datasets: ``data.corpus`` naming Parquet and Arrow files, directories of
them and datasets saved by ``datasets`` (``minilm.data.tables``, ``minilm.data.sources``), and
``data.tokenizer``, a transformers tokenizer directory used instead of training sentencepiece
(``minilm.data.corpus.configured_tokenizer``, ``minilm.training.source.check_tokenizer``)."""

import hashlib
import json
import sys

import pytest

from minilm.__main__ import main
from minilm.config import DataConfig
from minilm.data import tables
from minilm.data.corpus import DataError, prepare
from minilm.data.hf_tokenizer import HFTokenizer, save_pretrained_tokenizer
from minilm.data.sources import plan, source_fingerprint
from tests.conftest import tiny_overrides, tiny_text

try:  # the datasets extra installs it
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError:
    pa = pq = None
needs_pyarrow = pytest.mark.skipif(pa is None, reason="pyarrow is not installed (the datasets extra)")

TEXTS = [tiny_text(20, seed=i) for i in range(30)]
SAMPLE = "ROMEO: What light through yonder window breaks?\nJULIET: Thou art the king.\n"


def write_parquet(path, texts=TEXTS, field="text", **columns):
    pq.write_table(pa.table({"id": list(range(len(texts))), field: texts, **columns}), path, row_group_size=7)
    return path


def write_jsonl(path, texts=TEXTS):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def write_arrow(path, texts=TEXTS, stream=True):
    """An Arrow IPC stream (as ``datasets`` writes) or file, of record batches of 4 rows."""
    schema = pa.schema([("text", pa.string())])
    with pa.OSFile(str(path), "wb") as sink:
        writer = pa.ipc.new_stream(sink, schema) if stream else pa.ipc.new_file(sink, schema)
        for i in range(0, len(texts), 4):
            writer.write_batch(pa.record_batch([pa.array(texts[i : i + 4])], names=["text"]))
        writer.close()
    return path


def documents(corpus, field="text"):
    """({name: text} of train, of validation) of a corpus, as ``plan`` reads them back."""
    train, val = plan(str(corpus), field)
    return dict(train.materialized()), dict(val.materialized())


def smallest_hashes(names, k):
    return sorted(sorted(names, key=lambda n: hashlib.sha1(n.encode()).digest())[:k])


# =========================================================================== tables as corpora


@needs_pyarrow
@pytest.mark.parametrize("kind", ["parquet", "arrow stream", "arrow file"])
def test_a_table_is_one_document_per_row_and_gives_a_tenth_of_them_by_name_hash(tmp_path, monkeypatch, kind):
    monkeypatch.setattr(tables, "BATCH_ROWS", 3)  # rows read back across batch boundaries
    texts = TEXTS[:5] + ["  \n", ""] + TEXTS[5:]  # rows 6 and 7 hold no text: not documents
    if kind == "parquet":
        corpus = write_parquet(tmp_path / "rows.parquet", texts)
    else:
        corpus = write_arrow(tmp_path / "rows.arrow", texts, stream=kind == "arrow stream")
    train, val = documents(corpus)
    rel = corpus.name
    names = [f"{rel}#{row}" for row in range(1, len(texts) + 1) if row not in (6, 7)]
    assert sorted(val) == smallest_hashes(names, 3)  # 10% of 30 documents, by the SHA-1 of their names
    assert sorted([*train, *val]) == sorted(names) and not set(train) & set(val)
    assert {**train, **val} == {f"{rel}#{row}": texts[row - 1] for row in range(1, len(texts) + 1) if row not in (6, 7)}


@needs_pyarrow
@pytest.mark.parametrize("name", ["rows.parquet", "rows.arrow"])
def test_tables_are_read_a_record_batch_at_a_time_never_whole(tmp_path, monkeypatch, name):
    def whole(*args, **kwargs):
        raise AssertionError("a table read whole")

    for owner, method in ((pq.ParquetFile, "read"), (pa.ipc.RecordBatchStreamReader, "read_all")):
        monkeypatch.setattr(owner, method, whole)
    monkeypatch.setattr(pq, "read_table", whole)
    monkeypatch.setattr(tables, "BATCH_ROWS", 5)
    sizes, columns = [], tables._columns

    def counted(path, field):
        for column in columns(path, field):
            sizes.append(len(column))
            yield column

    monkeypatch.setattr(tables, "_columns", counted)
    corpus = write_parquet(tmp_path / name) if name.endswith(".parquet") else write_arrow(tmp_path / name)
    train, val = documents(corpus)
    assert sorted({**train, **val}.values()) == sorted(TEXTS)
    assert max(sizes) == (5 if name.endswith(".parquet") else 4) and sum(sizes) >= 2 * len(TEXTS)  # scanned, read back


@needs_pyarrow
def test_a_table_of_few_rows_is_cut_within_each_row(tmp_path):
    corpus = write_parquet(tmp_path / "few.parquet", TEXTS[:3])
    train, val = documents(corpus)
    assert list(train) == [f"few.parquet#{i}" for i in (1, 2, 3)]
    assert list(val) == [f"few.parquet#{i}#val" for i in (1, 2, 3)]
    for i in (1, 2, 3):  # no character lost or in both
        assert train[f"few.parquet#{i}"] + val[f"few.parquet#{i}#val"] == TEXTS[i - 1]


@needs_pyarrow
def test_a_directory_mixes_tables_with_text_files(tmp_path):
    root = tmp_path / "mixed"
    (root / "sub").mkdir(parents=True)
    write_parquet(root / "sub" / "a.parquet", TEXTS[:12])
    write_arrow(root / "b.arrow", TEXTS[12:20])
    (root / "c.txt").write_text(TEXTS[20])
    (root / "notes.md").write_text("not read\n")
    train, val = documents(root)
    names = ["b.arrow#%d" % i for i in range(1, 9)] + ["c.txt"] + ["sub/a.parquet#%d" % i for i in range(1, 13)]
    assert sorted({**train, **val}) == sorted(names) and len(val) == 2  # round(0.1 * 21)
    assert list(train) == [n for n in names if n in train]  # corpus order: sorted relative paths, then rows


@needs_pyarrow
def test_a_dataset_saved_by_datasets_is_read_from_its_listed_arrow_files(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the datasets extra is not installed")
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": TEXTS, "n": list(range(30))}).save_to_disk(str(saved))
    write_arrow(saved / "cache-0123.arrow", ["not listed in state.json"] * 12)  # as .map() leaves beside them
    train, val = documents(saved)
    files = json.loads((saved / "state.json").read_text())["_data_files"]
    assert [f["filename"] for f in files] == ["data-00000-of-00001.arrow"]
    assert {**train, **val} == {f"data-00000-of-00001.arrow#{i + 1}": t for i, t in enumerate(TEXTS)}
    assert len(val) == 3


@needs_pyarrow
def test_the_text_field_names_the_column(tmp_path):
    corpus = write_parquet(tmp_path / "body.parquet", TEXTS, field="body", text=["other"] * 30)
    train, val = documents(corpus, "body")
    assert sorted({**train, **val}.values()) == sorted(TEXTS)
    assert source_fingerprint(str(corpus), "body") != source_fingerprint(str(corpus), "text")


@needs_pyarrow
@pytest.mark.parametrize(
    "table, words",
    [
        ({"text": ["a text", None]}, ["row 2", "'text'", "null"]),
        ({"body": ["a text"]}, ["row 1", "no field 'text'", "valid: body"]),
        ({"text": [1, 2]}, ["row 1", "'text'", "int64", "expected a string"]),
    ],
)
def test_bad_rows_are_one_line_errors_naming_file_row_and_field(tmp_path, table, words):
    pq.write_table(pa.table(table), tmp_path / "bad.parquet")
    with pytest.raises(DataError) as caught:
        plan(str(tmp_path / "bad.parquet"))
    message = str(caught.value)
    assert "\n" not in message and "bad.parquet" in message and all(w in message for w in words), message


@needs_pyarrow
@pytest.mark.parametrize("name, words", [("x.parquet", "not a Parquet file"), ("x.arrow", "not an Arrow IPC")])
def test_a_file_that_is_not_a_table_is_one_line(tmp_path, name, words):
    (tmp_path / name).write_text("plain text, not a table\n")
    with pytest.raises(DataError, match=words):
        plan(str(tmp_path / name))


def test_without_pyarrow_reading_a_table_says_how_to_install_it(tmp_path, monkeypatch):
    corpus = tmp_path / "rows.parquet"
    corpus.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    with pytest.raises(DataError) as caught:
        plan(str(corpus))
    assert str(caught.value) == tables.INSTALL


# =========================================================================== data.tokenizer


@pytest.fixture(scope="module")
def minilm_tokenizer_dir(tmp_path_factory):
    """minilm's own 400-piece sentencepiece tokenizer, trained on tiny text and saved for transformers."""
    root = tmp_path_factory.mktemp("minilm_tokenizer")
    (root / "text.txt").write_text(tiny_text(400))
    tokenizer = prepare(DataConfig(corpus=str(root / "text.txt"), vocab_size=400, dir=str(root / "data")), quiet=True)
    save_pretrained_tokenizer(tokenizer.tokenizer, str(root / "exported"))
    return root / "exported"


def test_a_tokenizer_directory_encodes_the_corpus_in_a_directory_of_its_own(
    hf_tokenizer_dir, minilm_tokenizer_dir, tmp_path
):
    corpus = write_jsonl(tmp_path / "docs.jsonl")

    def prepared_with(directory):
        return prepare(DataConfig(corpus=str(corpus), tokenizer=str(directory), dir=str(tmp_path / "data")), quiet=True)

    given, prepared = HFTokenizer.from_directory(str(hf_tokenizer_dir)), prepared_with(hf_tokenizer_dir)
    assert prepared.tokenizer.to_bytes() == given.to_bytes() and prepared.manifest["vocab_size"] == given.vocab_size
    digest = hashlib.sha256(given.to_bytes()).hexdigest()
    assert prepared.manifest["tokenizer_sha256"] == digest and prepared.dir.name.endswith(f"-tok{digest[:12]}")
    assert given.decode(prepared.val.tolist()) == prepared.val_text()  # the ids are the given tokenizer's
    assert len(prepared.manifest["train"]["documents"]) == 27 and len(prepared.manifest["val"]["documents"]) == 3
    other = prepared_with(minilm_tokenizer_dir)  # another tokenizer never reuses it
    assert other.dir != prepared.dir and other.tokenizer.vocab_size == 400
    assert prepared_with(hf_tokenizer_dir).dir == prepared.dir  # the same one does


@pytest.mark.parametrize("what", ["missing", "empty", "a file"])
def test_an_unreadable_tokenizer_directory_is_one_line_exit_2(tmp_path, capsys, what):
    corpus = write_jsonl(tmp_path / "docs.jsonl")
    path = tmp_path / "tok"
    if what == "empty":
        path.mkdir()
    elif what == "a file":
        path.write_text("{}")
    status = train(tmp_path, "out", f"data.corpus={corpus}", f"data.tokenizer={path}")
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err, err
    assert f"data.tokenizer='{path}'" in err and "transformers tokenizer directory" in err


# =========================================================================== training


def train(tmp_path, out, *extra) -> int:
    return main(["train", *tiny_overrides(tmp_path, tmp_path / out, "train.max_steps=4", *extra)])


@pytest.mark.slow
@needs_pyarrow
def test_training_from_a_parquet_file(tmp_path, capsys):
    corpus = write_parquet(tmp_path / "rows.parquet")
    assert train(tmp_path, "run", f"data.corpus={corpus}") == 0
    manifest = json.loads(next((tmp_path / "data").glob("rows-*-400/manifest.json")).read_text())
    names = [f"rows.parquet#{i}" for i in range(1, 31)]
    assert manifest["val"]["documents"] == [n for n in names if n in smallest_hashes(names, 3)]
    assert len(manifest["train"]["documents"]) == 27
    assert (tmp_path / "run" / "ckpt.pt").is_file()


@pytest.mark.slow
@needs_pyarrow
def test_training_from_a_dataset_saved_by_datasets(tmp_path, capsys):
    datasets = pytest.importorskip("datasets", reason="the datasets extra is not installed")
    datasets.Dataset.from_dict({"text": TEXTS}).save_to_disk(str(tmp_path / "saved"))
    assert train(tmp_path, "run", f"data.corpus={tmp_path / 'saved'}") == 0
    manifest = json.loads(next((tmp_path / "data").glob("saved-*-400/manifest.json")).read_text())
    assert len(manifest["train"]["documents"]) + len(manifest["val"]["documents"]) == 30


@pytest.mark.slow
def test_training_with_a_tokenizer_directory_keeps_it_in_the_checkpoint(
    hf_tokenizer_dir, minilm_tokenizer_dir, tmp_path, capsys
):
    from minilm.checkpoints.loading import load_model

    corpus = write_jsonl(tmp_path / "docs.jsonl")
    given = HFTokenizer.from_directory(str(hf_tokenizer_dir))
    assert train(tmp_path, "run", f"data.corpus={corpus}", f"data.tokenizer={hf_tokenizer_dir}") == 0
    loaded = load_model(str(tmp_path / "run"))
    assert loaded.tokenizer.encode(SAMPLE) == given.encode(SAMPLE) and loaded.tokenizer.to_bytes() == given.to_bytes()
    assert loaded.config.model.vocab_size == loaded.config.data.vocab_size == given.vocab_size
    # from that run, the same tokenizer may be named again; another one is one line, exit 2
    source = (f"data.corpus={corpus}", f"train.init_from={tmp_path / 'run'}")
    assert train(tmp_path, "tuned", *source, f"data.tokenizer={hf_tokenizer_dir}") == 0
    capsys.readouterr()
    assert train(tmp_path, "refused", *source, f"data.tokenizer={minilm_tokenizer_dir}") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"data.tokenizer='{minilm_tokenizer_dir}'" in err and "train.init_from" in err, err
    assert not (tmp_path / "refused" / "ckpt.pt").exists()
