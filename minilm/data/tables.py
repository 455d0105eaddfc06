"""Table corpora: Parquet files and Arrow files (the IPC file or stream format; ``datasets`` writes
streams), read with ``pyarrow`` one record batch at a time.

Each row's ``data.text_field`` column is one document, numbered from 1 in the file's order, as
``minilm.data.sources`` numbers the lines of a ``.jsonl`` file. A file without that column, a row
whose value is null, or a column that does not hold strings is a DataError naming the file, the
row and the field. ``table_rows`` yields (row, text) of every row with text, or of given rows
only, holding one record batch of the text column at a time: ``BATCH_ROWS`` rows of a Parquet file
(which pyarrow decodes a row group's column at a time), an Arrow file's batches as written (the
file memory-mapped, so only the pages of the column read are loaded).

A dataset saved by ``datasets`` (``save_to_disk``: ``dataset_info.json``, ``state.json`` and
``data-*.arrow``) is a directory of Arrow files whose ``state.json`` lists them: ``listed_arrow``
gives that list, so cache files that ``datasets`` later writes beside them (``cache-*.arrow``)
are not read.

``pyarrow`` (which ``datasets`` installs) is imported when a table is first read; without it the
first read is a one-line DataError saying how to install it (the ``datasets`` extra).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, Optional

from minilm.common import MinilmError, suggest

TABLE_SUFFIXES = (".parquet", ".arrow")
BATCH_ROWS = 1024  # Parquet rows read at a time
INSTALL = 'reading .parquet and .arrow corpora needs pyarrow: pip install -e ".[datasets]" (or pip install pyarrow)'


class TableError(MinilmError):
    """A table corpus that cannot be read; ``minilm.data.sources`` raises it as its DataError."""


def is_table(rel: str) -> bool:
    """Whether a corpus file is a table (``.parquet`` or ``.arrow``, in any case)."""
    return rel.lower().endswith(TABLE_SUFFIXES)


def _pyarrow():
    """(pyarrow, pyarrow.parquet), or a TableError saying how to install them."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise TableError(INSTALL) from None
    return pyarrow, pyarrow.parquet


def listed_arrow(directory: Path) -> Optional[set]:
    """The names of the Arrow files a ``datasets`` ``save_to_disk`` directory holds (its state.json's
    ``_data_files``), or None when the directory is not one."""
    try:
        state = json.loads((directory / "state.json").read_text(encoding="utf-8"))
        return {entry["filename"] for entry in state["_data_files"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _is_text_type(pa, kind) -> bool:
    """Whether an Arrow type holds strings (plain, large, a view, or a dictionary of them)."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    view = getattr(pa.types, "is_string_view", lambda _: False)
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or view(kind)


def _check_schema(pa, path: Path, schema, field: str) -> None:
    """A TableError unless ``schema`` has a string column ``field`` (the rows' documents)."""
    if field not in schema.names:
        raise TableError(f"{path} row 1 has no field {field!r} (data.text_field): {suggest(field, schema.names)}")
    kind = schema.field(field).type
    if not _is_text_type(pa, kind) and not pa.types.is_null(kind):
        raise TableError(f"{path} row 1: field {field!r} (data.text_field) is {kind}, expected a string")


def _columns(path: Path, field: str) -> Iterator:
    """The ``field`` column of each record batch of a table file, in order."""
    pa, pq = _pyarrow()
    if path.name.lower().endswith(".parquet"):
        try:
            table = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as exc:
            raise TableError(f"{path} is not a Parquet file ({_reason(exc)})") from None
        _check_schema(pa, path, table.schema_arrow, field)
        for batch in table.iter_batches(batch_size=BATCH_ROWS, columns=[field]):
            yield batch.column(0)
        return
    with pa.memory_map(str(path)) as source:
        try:
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:  # not the file format: the stream format, as datasets writes
            source.seek(0)
            try:
                batches = reader = pa.ipc.open_stream(source)
            except (pa.ArrowException, OSError) as exc:
                raise TableError(f"{path} is not an Arrow IPC file or stream ({_reason(exc)})") from None
        _check_schema(pa, path, reader.schema, field)
        for batch in batches:
            yield batch.column(field)


def _reason(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _text(value, path: Path, row: int, field: str) -> str:
    """The document of one row: its ``field``, a string."""
    if not isinstance(value, str):
        shown = "null" if value is None else type(value).__name__
        raise TableError(f"{path} row {row}: field {field!r} (data.text_field) is {shown}, expected a string")
    return value


def table_rows(path: Path, field: str, wanted: Optional[Iterator[int]] = None) -> Iterator[tuple[int, str]]:
    """(row, document text) of a table file: every row whose text is not only whitespace, or only the
    rows ``wanted`` gives (1-based, ascending), read a record batch at a time."""
    target = next(wanted, None) if wanted is not None else 0
    start = 1  # the number of the batch's first row
    for column in _columns(path, field):
        if target is None:
            return
        if wanted is None:
            for offset, value in enumerate(column.to_pylist()):
                text = _text(value, path, start + offset, field)
                if text.strip():
                    yield start + offset, text
        else:
            while target is not None and target < start + len(column):
                yield target, _text(column[target - start].as_py(), path, target, field)
                target = next(wanted, None)
        start += len(column)
