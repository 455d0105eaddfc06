"""Which files a user corpus holds (``user_files``), and ``DataError``, the error of corpora and prepared data.

A corpus path is a file (itself, whatever its name) or a directory: every file below it whose name ends in
``.txt``, ``.jsonl``, ``.parquet`` or ``.arrow`` (``SUFFIXES``, matched in any case: ``a.TXT``, ``docs.JSONL``),
recursively, sorted by relative path; hidden files and folders are left out, and in a folder that
``datasets`` saved (``save_to_disk``: its ``state.json`` lists its Arrow files) the Arrow files it does not
list. The directories a caller names in ``skip`` are left out too where they lie inside the corpus:
``prepare`` names ``data.dir``, so with ``corpus: .`` and ``data.dir: data`` the prepared corpora
(``data/<name>/val.txt``) are never read back as documents, which would leak validation text into
training and change the corpus's fingerprint at every run. A ``skip`` directory that is the corpus
directory itself is a DataError: its prepared files would lie among the documents.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional, Union

from minilm.common import MinilmError
from minilm.data.tables import listed_arrow

SUFFIXES = (".txt", ".jsonl", ".parquet", ".arrow")  # a corpus directory's files, matched in any case
KINDS = ".txt, .jsonl, .parquet or .arrow"


class DataError(MinilmError):
    """A corpus or prepared data problem; the message is one line meant for the user."""


def user_files(path: Union[str, Path], skip: Optional[Mapping[str, str]] = None) -> list[tuple[str, Path]]:
    """(relative path, file) of a user corpus: the file itself, or every file of SUFFIXES (in any case) below a
    directory, hidden files and folders left out (of a ``datasets`` folder, only the Arrow files its state.json
    lists). ``skip`` ({setting: directory}, such as ``{"data.dir": "data"}``): a directory left out where it lies
    inside the corpus directory, a DataError naming the setting where it is the corpus directory itself."""
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
    left_out = _inside(str(path), root, skip or {})
    files = []
    for folder, dirs, names in os.walk(root):
        here = Path(folder)
        rel = here.relative_to(root)
        dirs[:] = [d for d in dirs if not d.startswith(".") and (rel / d).parts not in left_out]
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


def _inside(corpus: str, root: Path, skip: Mapping[str, str]) -> set[tuple[str, ...]]:
    """The relative path (its parts) of each directory of ``skip`` that lies inside the corpus directory
    ``root``; a DataError when one is ``root`` itself (its prepared files would be read back as documents)."""
    real, parts = root.resolve(), set()
    for setting, directory in skip.items():
        target = Path(os.path.expanduser(str(directory))).resolve()
        if target == real:
            raise DataError(
                f"{setting}={str(directory)!r} is the corpus directory (data.corpus={corpus!r}) itself: its prepared "
                f"files would be read back as documents; expected a directory outside it or one inside it "
                f"(such as {str(Path(corpus) / 'data')!r}), which the corpus leaves out"
            )
        if real in target.parents:
            parts.add(target.relative_to(real).parts)
    return parts
