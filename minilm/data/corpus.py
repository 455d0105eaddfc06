"""Prepared corpora: token files, cached and manifest-checked (batches: ``minilm.data.batches``). What a corpus
is, its documents and their split: ``minilm.data.sources``.

``prepare`` turns a corpus into ``<dir>/<name>-<vocab_size>/`` holding ``tokenizer.model``
(trained on the train split only), ``train.bin`` / ``val.bin`` (ids as uint16, or uint32 past
65,536 tokens: ``tokenizer.token_dtype``, named in the manifest; none named is uint16, as
before; ``np.memmap``-friendly), ``val.txt`` and ``manifest.json``. Files are written to
temporary names and moved into place, the old manifest is removed first and the new one
written last, so a directory is valid exactly when its manifest matches the source, the
settings, the files' hashes and the split's rule (a corpus of fewer than 10 documents prepared
when such a corpus gave whole ones to validation is not); anything else is rebuilt
(``reprepare=True``: a valid one too). A directory this call created is removed when preparing
fails, temporaries of killed preparations at the next one; a full disk is one DataError.
Progress goes to stderr unless ``quiet``. ``<name>`` is ``corpus_name``: ``shakespeare``, or the
corpus path's last part (less ``.txt``, ``.jsonl``, ``.parquet``, ``.arrow``) and the first 8 hex
digits of the SHA-1 of its absolute path, so two corpora of one name in different places never
share a directory. A corpus directory leaves ``<dir>`` out (``minilm.data.files``); U+2581 gets a note.

Preparing streams, so its memory does not grow with the corpus: documents are read one at a
time, the tokenizer's training text goes to a temporary file as they come (sentencepiece
samples at most ``input_sentence_size`` of its lines), and each split is encoded in
newline-aligned chunks appended to its token file (``tokenizer.StreamEncoder``), hashed and
counted as it is written. (A tokenizer that cannot be split at a line break, a Hugging Face
one that adds a space at the start of every text, gets each split whole, as before, or each
document with ``end_of_text``.)

A split's token stream: its documents joined as ``sources.join_documents`` joins them (each
stripped of leading and trailing newlines, two blank lines between them, a newline at the
end), or with ``data.end_of_text`` each document stripped, ``"\\n"``, then the tokenizer's
eos id (``Prepared.eot_id``; 2 for minilm's): one after every document, the last included.
Either way the tokenizer is trained on the joined text (the same tokenizer), ``val.txt`` holds
the joined validation text and ``chars`` counts the joined text's characters, so bits per
character compare across the two. The manifest records ``end_of_text`` (and ``eot_id``) only
when true, so a directory prepared before the option stays valid.

``prepare(data_cfg, tokenizer=tok)`` encodes the corpus with a given tokenizer instead of
training one (``train.init_from`` fine-tunes with the source checkpoint's tokenizer;
evaluation scores with the checkpoint's). It may be a Hugging Face tokenizer
(``minilm.data.hf_tokenizer.HFTokenizer``, of any vocabulary size: Llama 3's 128,256, Qwen2's
151,936); ``tokenizer.model`` holds either kind's bytes (``load_tokenizer`` reads both). It
reuses ``<name>-<vocab_size>/`` when that holds the same tokenizer, else prepares (or with
``reprepare`` rebuilds) ``<name>-tok<sha256 prefix>/``, whose manifest records its hash.
``data.tokenizer`` names such a tokenizer by its directory (``configured_tokenizer``): without a
given one, ``prepare`` encodes with it, the same way.

Bits per character: ``Prepared.bits_per_char(mean_loss_nats, split)`` =
mean token loss * tokens / characters / ln 2, with the counts of that split.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

import numpy as np
from tqdm import tqdm

from minilm.common import WriteError, atomic_write, remove_stale_temporaries, temporary_path
from minilm.data import tokenizer as tokenizer_module
from minilm.data.files import DataError
from minilm.data.hf_tokenizer import AnyTokenizer, HFTokenizer, load_tokenizer
from minilm.data.shakespeare import SHAKESPEARE
from minilm.data.sources import (
    DOC_SEPARATOR,
    WHOLE_DOCUMENTS,
    Split,
    listed_names,
    plan,
    source_fingerprint,
    strip_newlines,
)
from minilm.data.tokenizer import (
    ENCODE_CHUNK_CHARS,
    StreamEncoder,
    Tokenizer,
    TokenizerError,
    note_space_marks,
    token_dtype,
)

FORMAT_VERSION = 1  # layout of the prepared directory and manifest
LISTED_DOCUMENTS = 100_000  # a manifest names at most this many documents of a split ("more_documents": the rest)


def corpus_name(corpus: str) -> str:
    """Directory-friendly name: 'shakespeare', or the path's basename plus a hash of its absolute path."""
    if corpus == SHAKESPEARE:
        return SHAKESPEARE
    absolute = os.path.abspath(os.path.expanduser(corpus))
    base = Path(absolute).name
    base = re.sub(r"\.(txt|jsonl|parquet|arrow)$", "", base)
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-.")[:40] or "corpus"
    return f"{base}-{hashlib.sha1(absolute.encode('utf-8')).hexdigest()[:8]}"


def configured_tokenizer(data_cfg) -> Optional[HFTokenizer]:
    """The transformers tokenizer of the directory ``data.tokenizer`` names (None when unset); a
    missing or unreadable one is a DataError naming the value and what is valid."""
    path = getattr(data_cfg, "tokenizer", None)
    if path is None:
        return None
    try:
        if not isinstance(path, str) or not os.path.isdir(os.path.expanduser(path)):
            raise TokenizerError("no such directory")
        return HFTokenizer.from_directory(os.path.expanduser(path))
    except TokenizerError as exc:
        raise DataError(
            f"data.tokenizer={path!r} cannot be read ({exc}): expected a transformers tokenizer directory "
            f"(tokenizer.json, as save_pretrained writes it) or null"
        ) from None


# =========================================================================== prepared data


@dataclass
class Prepared:
    """A tokenized corpus: the tokenizer, token arrays (``token_dtype``) and character counts of both splits."""

    dir: Path
    tokenizer: AnyTokenizer
    train: np.ndarray  # np.memmap of token ids (uint16 or uint32)
    val: np.ndarray
    train_chars: int  # characters of the joined text of each split (as val.txt), with or without end_of_text
    val_chars: int
    manifest: dict = field(repr=False, default_factory=dict)
    eot_id: Optional[int] = None  # the id after every document (data.end_of_text), else None
    holdout: np.ndarray = field(
        default_factory=lambda: np.zeros(0, np.uint16)
    )  # data.holdout_tokens: never sampled for training

    def tokens_per_char(self, split: str) -> float:
        """Tokens per character of the 'train', 'val' or 'holdout' text (the holdout's: the train split's)."""
        tokens, chars = self._split(split)
        return len(tokens) / chars

    def bits_per_char(self, mean_loss_nats: float, split: str = "val") -> float:
        """Convert a mean next-token loss (nats) on a split into bits per character."""
        return float(mean_loss_nats) * self.tokens_per_char(split) / math.log(2)

    def val_text(self) -> str:
        """The validation text: exactly what was tokenized into ``val``, or with ``eot_id`` its
        documents joined by two blank lines where ``val`` has "\\n" and the eot id."""
        return (self.dir / "val.txt").read_text(encoding="utf-8")

    def _split(self, split: str):
        if split in ("train", "holdout"):
            return self.train, self.train_chars
        if split == "val":
            return self.val, self.val_chars
        raise DataError(f"split={split!r} is invalid: valid: train, val, holdout")

    def tokens(self, split: str) -> np.ndarray:
        return self.holdout if split == "holdout" else self._split(split)[0]


def prepared_dir(data_cfg) -> Path:
    """Where ``prepare`` puts a corpus: ``<dir>/<corpus name>-<vocab_size>``, ``-eot`` added for end_of_text."""
    return Path(data_cfg.dir) / f"{corpus_name(data_cfg.corpus)}-{data_cfg.vocab_size}{_eot_suffix(data_cfg)}"


def holds_prepared(data_dir: str, corpus: str) -> bool:
    """Whether ``data_dir`` holds a prepared copy of ``corpus`` as ``prepare`` names them (a manifest
    in ``<corpus name>-<vocab_size>`` or ``<corpus name>-tok<hash>``, ``-eot`` or not)."""
    if not isinstance(corpus, str) or not corpus:
        return False
    name, rest = corpus_name(corpus), re.compile(r"-(\d+|tok[0-9a-f]+)(-eot)?")
    try:
        return any(
            entry.name.startswith(name)
            and rest.fullmatch(entry.name[len(name) :])
            and (entry / "manifest.json").is_file()
            for entry in Path(data_dir).iterdir()
        )
    except OSError:  # no such directory, or not one
        return False


def _eot_suffix(data_cfg) -> str:
    return "-eot" if getattr(data_cfg, "end_of_text", False) else ""


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _end_of_text(data_cfg) -> bool:
    return bool(getattr(data_cfg, "end_of_text", False))


def _expected(data_cfg, fingerprint: str, tokenizer_hash: Optional[str] = None) -> dict:
    """The manifest fields that must match for prepared files to be reused: the tokenizer
    settings of a trained tokenizer, or the hash of a given one; end_of_text when true."""
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
    if _end_of_text(data_cfg):
        expected["end_of_text"] = True
    return expected


def _valid_manifest(directory: Path, expected: dict) -> Optional[dict]:
    """The manifest if it matches ``expected`` and every file it lists is intact, else None."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if (
        not isinstance(manifest, dict)
        or any(manifest.get(k) != v for k, v in expected.items())
        or manifest.get("end_of_text", False) != expected.get("end_of_text", False)
        or manifest.get("token_dtype", "uint16") != token_dtype(expected["vocab_size"]).name
    ):  # a width not its own
        return None
    files = manifest.get("files")
    if not isinstance(files, dict) or set(files) != {"tokenizer.model", "train.bin", "val.bin", "val.txt"}:
        return None
    if not _split_rule_holds(manifest):
        return None
    for name, info in files.items():
        path = directory / name
        try:
            if path.stat().st_size != info["bytes"] or _sha256_file(path) != info["sha256"]:
                return None
        except (OSError, KeyError, TypeError):
            return None
    return manifest


def _split_rule_holds(manifest: dict) -> bool:
    """Whether a manifest's split follows today's rule (``minilm.data.sources``): a corpus of fewer
    than WHOLE_DOCUMENTS documents has only cut documents (``<name>#val``) in validation, so one
    prepared when such a corpus gave whole documents to validation is rebuilt, and no other."""
    try:
        train, val = manifest["train"]["documents"], manifest["val"]["documents"]
        documents = set(train) | {name[: -len("#val")] if name.endswith("#val") else name for name in val}
        few = len(documents) < WHOLE_DOCUMENTS and not manifest["train"].get("more_documents")
        return not few or all(name.endswith("#val") for name in val)
    except (TypeError, KeyError, AttributeError):
        return False


# =========================================================================== encoding


class _Hashed:
    """A binary file that hashes and counts the bytes written to it."""

    def __init__(self, file):
        self.file, self.sha256, self.bytes = file, hashlib.sha256(), 0

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.sha256.update(data)
        self.bytes += len(data)

    def info(self) -> dict:
        return {"bytes": self.bytes, "sha256": self.sha256.hexdigest()}


def encode_text(
    tokenizer: AnyTokenizer,
    text: str,
    desc: str = "encode",
    quiet: bool = True,
    chunk_chars: int = ENCODE_CHUNK_CHARS,
    batch: int = 16,
) -> np.ndarray:
    """Encode a long text in newline-aligned chunks into an array of ``token_dtype`` (same ids as one
    ``encode``; in one piece for a tokenizer that cannot be split there), as ``prepare`` does.

    Shows a progress bar on stderr unless ``quiet``.
    """
    out = io.BytesIO()
    encoder = StreamEncoder(tokenizer, out, chunk_chars, batch)
    with tqdm(
        total=len(text), desc=desc, unit="char", unit_scale=True, disable=quiet, file=sys.stderr, leave=False
    ) as bar:
        for i in range(0, len(text), chunk_chars):
            encoder.add(text[i : i + chunk_chars])
            bar.update(len(text[i : i + chunk_chars]))
        encoder.finish()
    return np.frombuffer(out.getvalue(), dtype=encoder.dtype).copy()


def _read_split(
    split: Split, *, tokens: Optional[StreamEncoder] = None, text=None, eot: Optional[int] = None, bar=None
) -> int:
    """Read a split's documents once: their joined text (DOC_SEPARATOR between them, a newline at
    the end) to ``text`` (a binary file) and to ``tokens``, or with ``eot`` each document, "\\n"
    and ``eot`` to ``tokens``. Returns the characters of the joined text."""
    chars = 0

    def emit(piece: str, to_tokens: bool = True) -> None:
        nonlocal chars
        chars += len(piece)
        if text is not None:
            text.write(piece.encode("utf-8"))
        if tokens is not None and to_tokens:
            tokens.add(piece)

    for i, (_, pieces) in enumerate(split.documents()):
        if i:
            emit(DOC_SEPARATOR, eot is None)
        for piece in strip_newlines(pieces):
            emit(piece)
            if bar is not None:
                bar.update(len(piece))
        if eot is not None:
            tokens.add("\n")
            tokens.end(eot)
    emit("\n", eot is None)
    if tokens is not None:
        tokens.finish()
    return chars


# =========================================================================== preparing


def _log(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"[data] {message}", file=sys.stderr, flush=True)


def _check_cfg(data_cfg, tokenizer: Optional[AnyTokenizer] = None) -> None:
    if not isinstance(data_cfg.corpus, str) or not data_cfg.corpus:
        raise DataError(f"data.corpus={data_cfg.corpus!r} is invalid: expected 'shakespeare' or a path")
    text_field = getattr(data_cfg, "text_field", "text")
    if not isinstance(text_field, str) or not text_field:
        raise DataError(
            f"data.text_field={text_field!r} is invalid: expected the name of the field of a .jsonl "
            f"line or a table's row that holds its text, such as 'text'"
        )
    if tokenizer is not None:  # a given tokenizer: token files hold any vocabulary (uint32 ids at most)
        if _end_of_text(data_cfg) and tokenizer.eos_id is None:
            raise DataError(
                f"data.end_of_text=true needs the tokenizer's end-of-text (eos) id, and the given "
                f"{tokenizer.vocab_size}-piece tokenizer has none: set data.end_of_text=false"
            )
        return
    try:
        tokenizer_module.check_vocab_size(data_cfg.vocab_size)
    except TokenizerError as exc:
        raise DataError(f"data.{exc}") from None


def _load(directory: Path, manifest: dict, holdout: int = 0) -> Prepared:
    """The prepared files; the last ``holdout`` tokens of the train split (``data.holdout_tokens``)
    become ``Prepared.holdout``, and the train split every run samples from ends before them."""
    dtype = np.dtype(manifest.get("token_dtype", "uint16"))  # manifests before uint32 files: uint16

    def tokens(name: str) -> np.ndarray:
        path = directory / name
        return np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype=dtype)

    train = tokens("train.bin")
    if holdout > len(train) // 2:
        raise DataError(
            f"data.holdout_tokens={holdout} is invalid: the train split has {len(train)} tokens; hold "
            f"out at most half of them ({len(train) // 2})"
        )
    keep = len(train) - holdout
    chars = manifest["train"]["chars"] * keep // max(1, len(train))  # the kept text's share, in proportion
    return Prepared(
        dir=directory,
        tokenizer=load_tokenizer(str(directory / "tokenizer.model")),
        train=train[:keep],
        val=tokens("val.bin"),
        train_chars=chars,
        val_chars=manifest["val"]["chars"],
        manifest=manifest,
        eot_id=manifest.get("eot_id"),
        holdout=train[keep:],
    )


def prepare(
    data_cfg,
    quiet: bool = False,
    tokenizer: Optional[AnyTokenizer] = None,
    reprepare: bool = False,
    announce: bool = False,
) -> Prepared:
    """Tokenize ``data_cfg.corpus`` once (cached under ``prepared_dir(data_cfg)``) and load it.

    The first call trains the tokenizer on the train split and writes the token files;
    later calls reuse them while the manifest matches the source files, the vocab size,
    the tokenizer settings and ``end_of_text``; ``reprepare`` rebuilds them anyway. With
    ``tokenizer`` given, no tokenizer is trained: the corpus is encoded with that one
    (``data_cfg.vocab_size`` is then ignored), see the module docstring; without it, with
    ``data.tokenizer`` set, that one (``configured_tokenizer``). Raises DataError for a bad corpus,
    vocab size or tokenizer directory. ``announce``: preparing is said in one stderr line naming the
    directory even when ``quiet`` (an evaluation that must tokenize again says so and where).
    """
    tokenizer_hash, holdout = None, getattr(data_cfg, "holdout_tokens", 0)  # configs from before the option: none
    configured = tokenizer is None and getattr(data_cfg, "tokenizer", None) is not None
    tokenizer = configured_tokenizer(data_cfg) if configured else tokenizer
    if tokenizer is not None:
        data_cfg = replace(data_cfg, vocab_size=tokenizer.vocab_size)
        tokenizer_hash = hashlib.sha256(tokenizer.to_bytes()).hexdigest()
    _check_cfg(data_cfg, tokenizer)
    directory = prepared_dir(data_cfg)
    skip = {"data.dir": data_cfg.dir}  # inside a corpus directory, the prepared corpora are no documents
    fingerprint = source_fingerprint(data_cfg.corpus, getattr(data_cfg, "text_field", "text"), skip)
    if tokenizer is not None:  # the standard directory, if it holds this very tokenizer
        manifest = None if reprepare else _valid_manifest(directory, _expected(data_cfg, fingerprint))
        if manifest is not None and manifest["files"]["tokenizer.model"]["sha256"] == tokenizer_hash:
            _log(f"reusing {directory}", quiet)
            return _load(directory, manifest, holdout)
        directory = directory.with_name(
            f"{corpus_name(data_cfg.corpus)}-tok{tokenizer_hash[:12]}{_eot_suffix(data_cfg)}"
        )
    expected = _expected(data_cfg, fingerprint, tokenizer_hash)
    manifest = None if reprepare else _valid_manifest(directory, expected)
    if manifest is not None:
        _log(f"reusing {directory}", quiet)
        return _load(directory, manifest, holdout)

    started = time.time()
    how = (
        f"a {data_cfg.vocab_size}-piece tokenizer"
        if tokenizer is None
        else f"a given {tokenizer.vocab_size}-piece tokenizer"
        + (f" (data.tokenizer={data_cfg.tokenizer!r})" if configured else "")
    )
    _log(f"preparing {data_cfg.corpus!r} with {how} into {directory.absolute()}", quiet and not announce)
    train, val = plan(data_cfg.corpus, getattr(data_cfg, "text_field", "text"), skip)
    created = not directory.exists()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        try:
            manifest = _build(data_cfg, directory, expected, train, val, quiet, started, tokenizer)
        except BaseException:
            if created:  # ours and incomplete (no manifest): nothing of it is left behind
                shutil.rmtree(directory, ignore_errors=True)
            raise
    except (OSError, WriteError) as exc:
        reason = exc.reason if isinstance(exc, WriteError) else exc.strerror or exc
        raise DataError(
            f"cannot write the prepared corpus to {str(directory)!r} (data.dir={data_cfg.dir!r}): {reason}"
        ) from None
    return _load(directory, manifest, holdout)


def _progress(desc: str, total: int, quiet: bool) -> tqdm:
    return tqdm(total=total, desc=desc, unit="char", unit_scale=True, disable=quiet, file=sys.stderr, leave=False)


def _train_tokenizer(data_cfg, directory: Path, train: Split, quiet: bool) -> Tokenizer:
    """A sentencepiece BPE tokenizer trained on the train split's joined text, written to a
    temporary file as the documents are read."""
    train_file = str(temporary_path(directory / "train.txt"))
    try:
        with open(train_file, "xb") as f, _progress("tokenizer text", train.chars, quiet) as bar:
            chars = _read_split(train, text=f, bar=bar)
        _log(
            f"training a sentencepiece tokenizer of {data_cfg.vocab_size:,} tokens on {chars:,} characters "
            f"(no progress to show: seconds to minutes)...",
            quiet,
        )
        started = time.time()
        try:
            tokenizer = Tokenizer.train(train_file, data_cfg.vocab_size, name=f"the train split of {data_cfg.corpus!r}")
        except TokenizerError as exc:  # a message about the vocabulary names its setting, data.vocab_size
            raise DataError(f"data.{exc}" if str(exc).startswith("vocab_size=") else str(exc)) from None
        _log(f"trained the tokenizer in {time.time() - started:.1f}s", quiet)
    finally:
        if os.path.exists(train_file):
            os.unlink(train_file)
    return tokenizer


def _encode_split(
    directory: Path,
    name: str,
    tokenizer: AnyTokenizer,
    split: Split,
    eot: Optional[int],
    quiet: bool,
    text_name: Optional[str] = None,
) -> tuple[dict, dict, int]:
    """Encode a split into ``name`` (and its joined text into ``text_name``), each written through
    ``atomic_write``; returns (the split's manifest entry, the files' entries, how many SPACE_MARK it holds)."""
    files, counts = {}, {}

    def write_tokens(f) -> None:
        encoder = StreamEncoder(tokenizer, _Hashed(f))

        def read(g=None) -> None:
            text = None if g is None else _Hashed(g)
            with _progress(f"encode {name[:-4]}", split.chars, quiet) as bar:
                counts["chars"] = _read_split(split, tokens=encoder, text=text, eot=eot, bar=bar)
            if text is not None:
                files[text_name] = text.info()

        if text_name is None:
            read()
        else:
            atomic_write(directory / text_name, read)
        counts["tokens"], counts["marks"], files[name] = encoder.tokens, encoder.marks, encoder.out.info()

    atomic_write(directory / name, write_tokens)
    entry = {"documents": listed_names(split, LISTED_DOCUMENTS), "chars": counts["chars"], "tokens": counts["tokens"]}
    if len(split) > LISTED_DOCUMENTS:
        entry["more_documents"] = len(split) - LISTED_DOCUMENTS
    return entry, files, counts["marks"]


def _build(
    data_cfg,
    directory: Path,
    expected: dict,
    train: Split,
    val: Split,
    quiet: bool,
    started: float,
    tokenizer: Optional[AnyTokenizer] = None,
) -> dict:
    """Train the tokenizer (unless given), encode both splits and write the files, the manifest
    last; returns the manifest."""
    (directory / "manifest.json").unlink(missing_ok=True)  # invalid until everything is rewritten
    remove_stale_temporaries(directory)
    _log(f"{len(train):,} train / {len(val):,} validation documents", quiet)
    if tokenizer is None:
        tokenizer = _train_tokenizer(data_cfg, directory, train, quiet)
    eot = tokenizer.eos_id if _end_of_text(data_cfg) else None
    model = tokenizer.to_bytes()
    atomic_write(directory / "tokenizer.model", model)
    files = {"tokenizer.model": {"bytes": len(model), "sha256": hashlib.sha256(model).hexdigest()}}
    train_entry, train_files, train_marks = _encode_split(directory, "train.bin", tokenizer, train, eot, quiet)
    val_entry, val_files, val_marks = _encode_split(
        directory, "val.bin", tokenizer, val, eot, quiet, text_name="val.txt"
    )
    note_space_marks(tokenizer, train_marks + val_marks, f"data.corpus={data_cfg.corpus!r}")
    if not train_entry["tokens"] or not val_entry["tokens"]:
        raise DataError(f"corpus {data_cfg.corpus!r} gives an empty train or validation split")
    files.update({**train_files, **val_files})
    manifest = dict(expected)
    if eot is not None:
        manifest["eot_id"] = eot
    manifest.update(
        {
            "token_dtype": token_dtype(tokenizer.vocab_size).name,
            "train": train_entry,
            "val": val_entry,
            "files": {name: files[name] for name in ("tokenizer.model", "train.bin", "val.bin", "val.txt")},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seconds": round(time.time() - started, 2),
        }
    )
    atomic_write(directory / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    _log(
        f"prepared {train_entry['tokens']:,} train / {val_entry['tokens']:,} val tokens "
        f"in {time.time() - started:.1f}s",
        quiet,
    )
    return manifest
