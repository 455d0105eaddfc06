"""Byte-fallback BPE tokenizer: a thin wrapper around sentencepiece.

The tokenizer is lossless on any text without U+2581: ``decode(encode(text)) == text``
holds, newlines, indentation and runs of spaces included. To get there the
trainer runs with the ``identity`` normalization (no NFKC, no whitespace folding),
without a dummy-prefix space, with ``"\\n"`` as a user-defined symbol (so a newline
is always its own token, id 3) and with byte fallback (characters outside the
vocabulary become UTF-8 byte tokens instead of ``<unk>``). The one loss: ``"\\u2581"``
(``SPACE_MARK``) is sentencepiece's own mark for a space, so a text's ``"\\u2581"`` is
read as a space and decodes as ``" "`` (``decode(encode("a\\u2581b")) == "a b"``; a Hugging
Face export does the same). Keeping it would give ids the export cannot give, so it is not
kept: ``minilm.data.corpus.prepare`` says how many a corpus holds (``note_space_marks``).
Tokenizer training leaves out lines longer than ``MAX_LINE_BYTES`` (64 KiB); a text with no
shorter line is a TokenizerError that says so.

Because the newline is a piece of its own, no token ever spans a line break, so a
long text can be encoded in chunks that end at a newline with the same result as
encoding it at once: ``StreamEncoder`` encodes a text of any length that way as it is read
(checking first that the tokenizer, perhaps a Hugging Face one, allows it), for
``minilm.data.corpus``.

Ids: 0 ``<unk>``, 1 ``<s>`` (bos), 2 ``</s>`` (eos), 3 ``"\\n"``, then the 256 byte
pieces, then the learned pieces. There is no padding id. The serialized model
(``to_bytes``) is all that is needed to rebuild the tokenizer; it travels inside
checkpoints.
"""

from __future__ import annotations

import io
import os
import re
import sys
from typing import Optional, Sequence

import numpy as np
import sentencepiece as spm

from minilm.common import MinilmError

# Bump when the trainer settings below change, so prepared data is rebuilt.
SETTINGS_VERSION = 1

MAX_VOCAB_SIZE = 2**32  # ids fit the token files' widest dtype, uint32 (token_dtype)
UINT16_VOCAB = 2**16  # the largest vocabulary whose ids fit uint16
# 3 specials + newline + 256 byte pieces; sentencepiece also needs one id per distinct character
MIN_VOCAB_SIZE = 3 + 1 + 256 + 1

TRAINER_SETTINGS = dict(
    model_type="bpe",
    byte_fallback=True,
    character_coverage=1.0,
    normalization_rule_name="identity",
    remove_extra_whitespaces=False,
    add_dummy_prefix=False,
    split_digits=True,
    allow_whitespace_only_pieces=True,
    user_defined_symbols=["\n"],
    unk_id=0,
    bos_id=1,
    eos_id=2,
    pad_id=-1,
    max_sentence_length=1 << 16,  # bytes (MAX_LINE_BYTES); longer lines are left out of training only
    input_sentence_size=1_000_000,  # at most this many lines are sampled for training
    shuffle_input_sentence=True,
    num_threads=1,
    hard_vocab_limit=True,
)
MAX_LINE_BYTES = TRAINER_SETTINGS["max_sentence_length"]  # a line of at most this many bytes trains the tokenizer
SPACE_MARK = "\u2581"  # sentencepiece's mark for a space: a text's own one is read as a space
RANDOM_SEED = 1234  # sentencepiece samples lines when a corpus has more than input_sentence_size
ENCODE_CHUNK_CHARS = 1 << 16  # long texts are encoded in chunks of about this many characters
ENCODE_THREADS = max(1, min(8, os.cpu_count() or 1))  # encoding threads (the ids do not depend on them)


class TokenizerError(MinilmError):
    """A tokenizer could not be trained, loaded or used; the message is one line."""


class Tokenizer:
    """A trained sentencepiece BPE model with ``encode``/``decode`` and (de)serialization."""

    def __init__(self, processor: spm.SentencePieceProcessor, model_bytes: bytes):
        self._sp = processor
        self._bytes = model_bytes

    # ------------------------------------------------------------------ building

    @classmethod
    def train(cls, text_file_path: str, vocab_size: int, *, name: Optional[str] = None) -> "Tokenizer":
        """Train a BPE model with ``vocab_size`` pieces on a UTF-8 text file (one sentence per line).

        Deterministic: the same file and vocab size give the same model bytes.
        Raises TokenizerError for a bad vocab size, a missing/empty file, a text with no line
        of at most MAX_LINE_BYTES bytes (longer ones are left out of training), or when the
        text cannot support the requested vocabulary. ``name`` describes the text in
        error messages (default: the file path).
        """
        check_vocab_size(vocab_size)
        if not os.path.isfile(text_file_path):
            raise TokenizerError(f"tokenizer training file {text_file_path!r} does not exist")
        if os.path.getsize(text_file_path) == 0:
            raise TokenizerError(f"tokenizer training file {text_file_path!r} is empty")
        model = io.BytesIO()
        spm.set_random_generator_seed(RANDOM_SEED)
        with open(os.devnull, "w") as devnull:
            try:
                spm.SentencePieceTrainer.train(
                    input=text_file_path,
                    model_writer=model,
                    vocab_size=vocab_size,
                    logstream=devnull if _has_fileno(sys.stderr) else None,  # sentencepiece dup2s fd 2
                    minloglevel=2,
                    **TRAINER_SETTINGS,
                )
            except RuntimeError as exc:
                raise _training_error(exc, text_file_path, vocab_size, name or repr(text_file_path)) from None
        return cls.from_bytes(model.getvalue())

    @classmethod
    def from_bytes(cls, model_bytes: bytes) -> "Tokenizer":
        """Rebuild a tokenizer from ``to_bytes()`` output (a serialized sentencepiece model)."""
        if not isinstance(model_bytes, (bytes, bytearray)) or not model_bytes:
            raise TokenizerError(f"tokenizer model must be non-empty bytes, got {type(model_bytes).__name__}")
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(bytes(model_bytes))
        except (RuntimeError, OSError) as exc:
            raise TokenizerError(f"not a valid sentencepiece model: {str(exc).strip()[:200]}") from None
        return cls(processor, bytes(model_bytes))

    def to_bytes(self) -> bytes:
        """The serialized sentencepiece model; ``Tokenizer.from_bytes`` restores it."""
        return self._bytes

    # ------------------------------------------------------------------ use

    @property
    def vocab_size(self) -> int:
        return self._sp.GetPieceSize()

    @property
    def bos_id(self) -> Optional[int]:
        value = self._sp.bos_id()
        return value if value >= 0 else None

    @property
    def eos_id(self) -> Optional[int]:
        value = self._sp.eos_id()
        return value if value >= 0 else None

    @property
    def stop_ids(self) -> tuple:
        """The ids that end a generation: the eos id (minilm's corpora hold none, so a model
        trained on them seldom produces it)."""
        return () if self.eos_id is None else (self.eos_id,)

    def encode(self, text: str) -> list[int]:
        """Token ids for ``text`` (no bos/eos added)."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects a str, got {type(text).__name__}")
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """Token ids for each text of ``texts``; same result as ``encode`` on each."""
        texts = list(texts)
        if not all(isinstance(t, str) for t in texts):
            raise TokenizerError("encode_batch expects a sequence of str")
        return self._sp.encode(texts, num_threads=num_threads)

    def decode(self, ids: Sequence[int]) -> str:
        """The text for token ids (a list, tuple, numpy array or 1-D tensor of ints)."""
        return self._sp.decode(checked_ids(ids, self.vocab_size))

    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary piece for one id (for inspection and debugging)."""
        return self._sp.id_to_piece(checked_ids([token_id], self.vocab_size)[0])

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_id={self.eos_id})"


def _training_error(exc: RuntimeError, path: str, vocab_size: int, name: str) -> TokenizerError:
    """The one-line error of a failed training: a text whose every line is too long for sentencepiece
    (it then finds no sentence to train on) says so; any other failure is the vocabulary's, naming the
    lines that were too long, if any."""
    short, long = _line_lengths(path)
    if not short:
        return TokenizerError(
            f"{name} has no line of at most {MAX_LINE_BYTES:,} bytes ({long:,} longer ones), and sentencepiece "
            f"trains the tokenizer on such lines only: break the text into lines (a line break every few "
            f"thousand characters)"
        )
    detail = " ".join(str(exc).split()).rpartition("] ")[2] or type(exc).__name__
    left_out = f" ({long:,} lines longer than {MAX_LINE_BYTES:,} bytes were left out of training)" if long else ""
    return TokenizerError(f"vocab_size={vocab_size} does not fit {name}: {detail}{left_out}")


def _line_lengths(path: str, limit: int = MAX_LINE_BYTES, block: int = 1 << 20) -> tuple[int, int]:
    """(lines of 1 to ``limit`` bytes, lines of more) of a file, read in blocks (a line is never held
    whole); empty lines count as neither, as sentencepiece skips them."""
    short = long = length = 0  # length: the bytes of the line read so far
    with open(path, "rb") as f:
        for data in iter(lambda: f.read(block), b""):
            *ended, rest = data.split(b"\n")
            for part in ended:
                length += len(part)
                short, long, length = short + (0 < length <= limit), long + (length > limit), 0
            length += len(rest)
    return short + (0 < length <= limit), long + (length > limit)


def note_space_marks(tokenizer, marks: int, where: str) -> None:
    """One note on stderr when ``where`` (a corpus) holds ``marks`` > 0 SPACE_MARK characters and ``tokenizer``
    (minilm's or a Hugging Face one) cannot give them back: minilm's reads them as spaces."""
    if marks and SPACE_MARK not in tokenizer.decode(tokenizer.encode(f"a{SPACE_MARK}b")):
        print(
            f"[data] note: {where} holds {marks:,} '{SPACE_MARK}' (U+2581) characters, sentencepiece's space "
            f"marker: the tokenizer reads them as spaces, so its tokens decode them as ' '",
            file=sys.stderr,
            flush=True,
        )


def checked_ids(ids: Sequence[int], vocab_size: int) -> list[int]:
    """``ids`` (a list, tuple, numpy array or 1-D tensor of ints) as a list of ints, each in
    0..vocab_size-1, else a one-line TokenizerError naming the first bad one."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    ids = [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise TokenizerError(f"token id {bad[0]} is out of range: valid ids are 0..{vocab_size - 1}")
    return ids


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest dtype of a token file for ``vocab_size`` tokens (ids 0..vocab_size - 1)."""
    return np.dtype(np.uint16 if vocab_size <= UINT16_VOCAB else np.uint32)


def check_vocab_size(vocab_size) -> None:
    """Raise TokenizerError unless ``vocab_size`` is an int in [MIN_VOCAB_SIZE, MAX_VOCAB_SIZE]."""
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
        raise TokenizerError(f"vocab_size={vocab_size!r} is invalid: expected an integer")
    if vocab_size > MAX_VOCAB_SIZE:
        raise TokenizerError(
            f"vocab_size={vocab_size} is too large: token files hold uint32 ids, valid: "
            f"{MIN_VOCAB_SIZE}..{MAX_VOCAB_SIZE}"
        )
    if vocab_size < MIN_VOCAB_SIZE:
        raise TokenizerError(
            f"vocab_size={vocab_size} is too small: byte fallback needs 260 ids plus one per distinct character, "
            f"valid: {MIN_VOCAB_SIZE}..{MAX_VOCAB_SIZE}"
        )


def settings() -> dict:
    """The tokenizer settings recorded in data manifests (a change means re-preparing)."""
    return {"version": SETTINGS_VERSION, "random_seed": RANDOM_SEED, **TRAINER_SETTINGS}


# --------------------------------------------------------------------------- long texts

BREAK = re.compile(r"(?<=\S\n)(?=\S)")  # after a newline that has a non-space character on each side
BREAK_PROBES = ("a\nb", "Ab.\nCd", "x:\n1", "\u00e9\n\u6771")


def newline_chunks(text: str, size: int = ENCODE_CHUNK_CHARS) -> list[str]:
    """Pieces of about ``size`` characters that end at a newline between two non-space characters
    (minilm's tokenizer never merges across a newline; regex pre-tokenizers such as GPT-2's
    start a new word there too)."""
    pieces, start = [], 0
    while start < len(text):
        found = BREAK.search(text, start + size)
        end = found.start() if found else len(text)
        pieces.append(text[start:end])
        start = end
    return pieces


def splits_at_newlines(tokenizer) -> bool:
    """Whether encoding text in ``newline_chunks`` gives the same ids as one ``encode``: false for a
    tokenizer that adds something at the start of every text (a dummy-prefix space)."""
    return all(
        tokenizer.encode(probe) == tokenizer.encode(probe[: cut + 1]) + tokenizer.encode(probe[cut + 1 :])
        for probe in BREAK_PROBES
        for cut in [probe.index("\n")]
    )


class StreamEncoder:
    """Encodes a text handed over in pieces (``add``) with any tokenizer (minilm's or a Hugging Face
    one), writing the ids (``token_dtype``) to ``out`` (anything with ``write(bytes)``) in order:
    the text is cut into ``newline_chunks`` as it comes (the same ids as one ``encode``), and the
    chunks are encoded together once about ``batch`` chunks' worth wait. ``end`` closes a stretch
    (a document) and may put an id after it; ``finish`` writes all that waits. A tokenizer that
    cannot be split at a newline gets each stretch whole. ``tokens`` counts the ids written, ``marks``
    the SPACE_MARK characters added."""

    def __init__(self, tokenizer, out, chunk_chars: Optional[int] = None, batch: int = 16):
        self.tokenizer, self.out, self.size = tokenizer, out, chunk_chars or ENCODE_CHUNK_CHARS
        self.aligned = splits_at_newlines(tokenizer)
        self.dtype = token_dtype(tokenizer.vocab_size)
        self.pending, self.pending_chars, self.threshold = [], 0, self.size * batch
        self.ready, self.ready_chars, self.batch_chars, self.tokens, self.marks = [], 0, self.size * batch, 0, 0

    def add(self, text: str) -> None:
        self.pending.append(text)
        self.pending_chars, self.marks = self.pending_chars + len(text), self.marks + text.count(SPACE_MARK)
        if self.aligned and self.pending_chars >= self.threshold:
            pieces = newline_chunks("".join(self.pending), self.size)
            rest = pieces.pop()  # after the last break found: it may go on
            self._queue(pieces)
            self.pending, self.pending_chars = [rest], len(rest)
            self.threshold = max(self.batch_chars, 2 * len(rest))  # no break in sight: wait for more

    def end(self, token_id: Optional[int] = None) -> None:
        text = "".join(self.pending)
        self.pending, self.pending_chars, self.threshold = [], 0, self.batch_chars
        self._queue(newline_chunks(text, self.size) if self.aligned else [text] if text else [])
        if token_id is not None:
            self.ready.append(token_id)

    def finish(self) -> None:
        self.end()
        self._flush()

    def _queue(self, pieces: list[str]) -> None:
        self.ready.extend(pieces)
        self.ready_chars += sum(len(p) for p in pieces)
        if self.ready_chars >= self.batch_chars:
            self._flush()

    def _flush(self) -> None:
        texts = [r for r in self.ready if isinstance(r, str)]
        encoded = iter(self.tokenizer.encode_batch(texts, num_threads=ENCODE_THREADS) if texts else [])
        for item in self.ready:
            data = np.asarray(next(encoded) if isinstance(item, str) else [item], dtype=self.dtype)
            self.out.write(data.tobytes())
            self.tokens += len(data)
        self.ready, self.ready_chars = [], 0


def _has_fileno(stream) -> bool:
    """Whether ``stream`` is a real file (an in-process caller may have put a StringIO there)."""
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    return True
