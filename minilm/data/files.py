"""Which files a user corpus holds (``user_files``), and ``DataError``, the error of corpora and prepared data.

A corpus path is a file (itself, whatever its name) or a directory: every file below it whose name ends in
``.txt``, ``.jsonl``, ``.parquet`` or ``.arrow`` (``SUFFIXES``, matched in any case: ``a.TXT``, ``docs.JSONL``),
recursively, sorted by relative path; hidden files and folders are left out, and in a folder that
``datasets`` saved (``save_to_disk``: its ``state.json`` lists its Arrow files) the Arrow files it does not
list. Below a directory a caller names in ``skip`` (``prepare`` names ``data.dir``), the prepared
corpora minilm wrote are left out, each a folder holding ``PREPARED`` files: with ``corpus: .`` and
``data.dir: data`` (or ``data.dir`` the corpus directory itself) their ``val.txt`` is never read back
as a document, which would leak validation text into training and change the corpus's fingerprint at
every run; the user's own files there stay documents.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional, Union

from minilm.common import MinilmError
from minilm.data.tables import listed_arrow

SUFFIXES = (".txt", ".jsonl", ".parquet", ".arrow")  # a corpus directory's files, matched in any case
PREPARED = ("manifest.json", "tokenizer.model", "train.bin", "val.bin")  # a prepared corpus's folder holds one
KINDS = ".txt, .jsonl, .parquet or .arrow"


class DataError(MinilmError):
    """A corpus or prepared data problem; the message is one line meant for the user."""


def user_files(path: Union[str, Path], skip: Optional[Mapping[str, str]] = None) -> list[tuple[str, Path]]:
    """(relative path, file) of a user corpus: the file itself, or every file of SUFFIXES (in any case) below a
    directory, hidden files and folders left out (of a ``datasets`` folder, only the Arrow files its state.json
    lists). ``skip`` ({setting: directory}, such as ``{"data.dir": "data"}``): below each that lies in the corpus
    directory (or is it), the prepared corpora's folders (any holding a ``PREPARED`` file) are left out."""
    root = Path(os.path.expanduser(str(path)))
    if root.is_file():
        return [(root.name, root)]
    if not root.exists():
        raise DataError(
            f"data.corpus={str(path)!r} does not exist: expected 'shakespeare', a {KINDS} file "
            f"or a directory of them (a checkpoint's corpus that has moved: give its new place "
            f"as data.corpus=NEW)"
        )
    if not root.is_dir():
        raise DataError(f"data.corpus={str(path)!r} is neither a file nor a directory")
    prepared_in = _inside(root, skip or {})
    files = []
    for folder, dirs, names in os.walk(root):
        here = Path(folder)
        rel = here.relative_to(root)
        dirs[:] = [
            d for d in dirs if not d.startswith(".") and not (_below(rel / d, prepared_in) and _is_prepared(here / d))
        ]
        arrow = any(name.lower().endswith(".arrow") for name in names)
        listed = listed_arrow(here) if arrow else None  # a save_to_disk folder's state.json
        for name in names:
            if name.startswith(".") or not name.lower().endswith(SUFFIXES) or not (here / name).is_file():
                continue
            if listed is None or not name.lower().endswith(".arrow") or name in listed:
                files.append(((rel / name).as_posix(), here / name))
    if not files:
        raise DataError(f"data.corpus={str(path)!r} is a directory without {KINDS} files")
    return sorted(files)


def _inside(root: Path, skip: Mapping[str, str]) -> set[tuple[str, ...]]:
    """The relative path (its parts; () for ``root`` itself) of each directory of ``skip`` that is the
    corpus directory ``root`` or lies inside it."""
    real, parts = root.resolve(), set()
    for directory in skip.values():
        target = Path(os.path.expanduser(str(directory))).resolve()
        if target == real or real in target.parents:
            parts.add(target.relative_to(real).parts)
    return parts


def _below(rel: Path, tops: set) -> bool:
    """Whether the relative path ``rel`` lies strictly below one of ``tops`` (relative paths' parts)."""
    return any(len(rel.parts) > len(top) and rel.parts[: len(top)] == top for top in tops)


def _is_prepared(folder: Path) -> bool:
    """A folder minilm prepared a corpus into: it holds one of ``PREPARED``."""
    return any((folder / name).is_file() for name in PREPARED)
