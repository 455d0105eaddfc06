"""Hugging Face tokenizers in minilm, and minilm's tokenizer as a Hugging Face one.

``HFTokenizer`` wraps a ``tokenizers.Tokenizer`` (a tokenizer.json) behind the interface of
``minilm.data.tokenizer.Tokenizer``: ``encode`` adds no special tokens and never reads special
tokens out of the text (``"<s>"`` in a text is text, as with sentencepiece), ``decode``
leaves special tokens out. Its bytes (``to_bytes``) are UTF-8 JSON::

    {"format": "minilm-hf-tokenizer", "version": 1, "tokenizer": "<tokenizer.json>",
     "bos_id": 1, "eos_id": 2, "stop_ids": [2, 7]}   # stop_ids only where not [eos_id]

which never starts like a sentencepiece model (a protobuf, never ``{``), so
``tokenizer_from_bytes`` tells the two apart; checkpoints and prepared data directories
(``tokenizer.model``) hold either.

``save_pretrained_tokenizer(tokenizer, directory)`` writes tokenizer.json,
tokenizer_config.json and special_tokens_map.json, which ``transformers.AutoTokenizer``
loads with no custom code. A minilm sentencepiece model becomes a ``tokenizers`` BPE with
byte fallback that gives the same ids:

* vocabulary: every piece at its sentencepiece id (specials, ``"\\n"``, ``<0xNN>`` bytes);
* merges: for every normal piece, every split of it into two normal pieces, ranked by the
  piece's score (sentencepiece merges, at each step, the adjacent pair whose concatenation
  is the best-scoring piece);
* normalizer: a space becomes ``"▁"`` (identity otherwise, no dummy prefix);
* pre-tokenizer: ``"\\n"`` alone, and words of a ``"▁"`` run followed by what is not ``"▁"``
  (a piece holds ``"▁"`` only as its prefix or is all ``"▁"``, so no piece crosses them);
* user-defined pieces (``"\\n"``) are added tokens, ``<unk>``, ``<s>`` and ``</s>`` special;
* decoder: ``"▁"`` -> space, byte pieces -> UTF-8.

Differences that remain, both outside what ``encode`` produces: ``decode`` of ``<unk>``
gives "" (sentencepiece: " ⁇ "), and an invalid UTF-8 byte run decodes to one U+FFFD per
byte of the run (sentencepiece decodes a valid byte after an invalid one as itself).

``tokenizers`` is the optional ``hf`` extra; without it minilm imports and only these
classes and functions raise a one-line ``TokenizerError``.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Optional, Sequence, Union

try:  # the hf extra
    import tokenizers
except ImportError:  # pragma: no cover - reported by _require
    tokenizers = None

from minilm.common import atomic_write
from minilm.data.tokenizer import Tokenizer, TokenizerError, checked_ids

FORMAT = "minilm-hf-tokenizer"
VERSION = 1
INSTALL = 'Hugging Face tokenizers need the hf extra: pip install -e ".[hf]"'
SPACE = "\u2581"  # sentencepiece's "▁"
# sentencepiece piece types (sentencepiece_model.proto)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def _require():
    """The ``tokenizers`` module, or a one-line TokenizerError saying how to install it."""
    if tokenizers is None:
        raise TokenizerError(INSTALL)
    return tokenizers


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


class HFTokenizer:
    """A Hugging Face tokenizer (tokenizer.json) with the interface of ``minilm.data.tokenizer.Tokenizer``."""

    def __init__(
        self,
        tokenizer_json: str,
        bos_id: Optional[int] = None,
        eos_id: Optional[int] = None,
        stop_ids: Optional[Sequence[int]] = None,
    ):
        backend = _require()
        if not isinstance(tokenizer_json, str):
            raise TokenizerError(f"tokenizer.json must be text, got {type(tokenizer_json).__name__}")
        try:
            self._tok = backend.Tokenizer.from_str(tokenizer_json)
        except Exception as exc:  # tokenizers raises plain Exceptions
            raise TokenizerError(f"not a valid tokenizer.json: {_one_line(exc)}") from None
        self._tok.encode_special_tokens = True  # "<s>" in a text is text, as with sentencepiece
        self._json = tokenizer_json
        ids = self._tok.get_vocab(with_added_tokens=True).values()
        self._vocab_size = max(ids) + 1 if ids else 0
        for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
            if value is not None and (not isinstance(value, int) or not 0 <= value < self._vocab_size):
                raise TokenizerError(f"{name}={value!r} is invalid: valid ids are 0..{self._vocab_size - 1}")
        self._bos, self._eos = bos_id, eos_id
        self._stops = self._valid_ids([eos_id] if stop_ids is None else stop_ids)  # None: the eos id alone

    # ------------------------------------------------------------------ building

    @classmethod
    def from_directory(cls, path: str) -> "HFTokenizer":
        """The tokenizer of a Hugging Face model directory: tokenizer.json, bos / eos from
        tokenizer_config.json (``bos_token`` / ``eos_token``, strings or {"content": ...}),
        else config.json's ``bos_token_id`` / ``eos_token_id``; the ids that end a generation
        (``stop_ids``) are those transformers' ``generate`` stops at: the ``eos_token_id`` of
        generation_config.json (one id or a list, as Llama 3 gives three), else config.json's,
        else the eos token."""
        _require()
        file = os.path.join(path, "tokenizer.json")
        try:
            with open(file, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise TokenizerError(f"{path}: no tokenizer.json (minilm reads Hugging Face tokenizers from it)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"cannot read {file}: {_one_line(exc)}") from None
        tokenizer = cls(text)
        settings, config = _read_json(path, "tokenizer_config.json"), _read_json(path, "config.json")
        generation = _read_json(path, "generation_config.json")
        for where, source in (("config.json", config), ("generation_config.json", generation)):
            for key in ("bos_token_id", "eos_token_id"):
                tokenizer._check_ids(source.get(key), f"{path}: {where} {key}")
        tokenizer._bos = tokenizer._special_id(settings.get("bos_token"), config.get("bos_token_id"))
        tokenizer._eos = tokenizer._special_id(settings.get("eos_token"), config.get("eos_token_id"))
        listed = generation.get("eos_token_id", config.get("eos_token_id", tokenizer._eos))
        tokenizer._stops = tokenizer._valid_ids(listed if isinstance(listed, list) else [listed])
        return tokenizer

    @classmethod
    def from_sentencepiece(cls, tokenizer: Tokenizer) -> "HFTokenizer":
        """minilm's sentencepiece tokenizer as a ``tokenizers`` BPE with the same ids."""
        return cls(sentencepiece_to_json(tokenizer.to_bytes()), tokenizer.bos_id, tokenizer.eos_id, tokenizer.stop_ids)

    @classmethod
    def from_bytes(cls, data: bytes) -> "HFTokenizer":
        """Rebuild a tokenizer from ``to_bytes()`` output."""
        try:
            wrapper = json.loads(bytes(data).decode("utf-8"))
        except (TypeError, ValueError) as exc:
            raise TokenizerError(f"not a minilm Hugging Face tokenizer: {_one_line(exc)}") from None
        if not isinstance(wrapper, dict) or wrapper.get("format") != FORMAT:
            raise TokenizerError(f"not a minilm Hugging Face tokenizer: expected format {FORMAT!r}")
        if wrapper.get("version") != VERSION:
            raise TokenizerError(
                f"Hugging Face tokenizer version {wrapper.get('version')!r} is not supported "
                f"(this minilm reads version {VERSION})"
            )
        return cls(wrapper.get("tokenizer"), wrapper.get("bos_id"), wrapper.get("eos_id"), wrapper.get("stop_ids"))

    def to_bytes(self) -> bytes:
        """UTF-8 JSON of the tokenizer.json text, the bos / eos ids and the stop ids where they are
        not the eos id alone; ``from_bytes`` restores it."""
        wrapper = {
            "format": FORMAT,
            "version": VERSION,
            "tokenizer": self._json,
            "bos_id": self._bos,
            "eos_id": self._eos,
        }
        if self._stops != self._valid_ids([self._eos]):  # only when they say more (the bytes, and so the
            wrapper["stop_ids"] = list(self._stops)  # prepared data's hash, stay as they were)
        return json.dumps(wrapper, ensure_ascii=False).encode("utf-8")

    def tokenizer_json(self) -> str:
        """The tokenizer.json text."""
        return self._json

    def _special_id(self, token, fallback) -> Optional[int]:
        """The id of a tokenizer_config.json token (a string or {"content": ...}), else config.json's id."""
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str):
            found = self._tok.token_to_id(token)
            if found is not None:
                return found
        if isinstance(fallback, list):  # several eos ids (Llama 3): the first
            fallback = fallback[0] if fallback else None
        if isinstance(fallback, int) and not isinstance(fallback, bool) and 0 <= fallback < self._vocab_size:
            return fallback
        return None

    def _check_ids(self, ids, where: str) -> None:
        """A TokenizerError unless ``ids`` is None, an id of the vocabulary, or a list of them."""
        for i in ids if isinstance(ids, list) else [ids]:
            if i is not None and (isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self._vocab_size):
                raise TokenizerError(
                    f"{where}={ids!r} is invalid: expected token ids from 0 to "
                    f"{self._vocab_size - 1} (the tokenizer's vocabulary)"
                )

    def _valid_ids(self, ids) -> tuple:
        """The distinct ids of ``ids`` that are in the vocabulary, in order (None and others dropped)."""
        ids = ids if isinstance(ids, (list, tuple)) else []
        valid = [i for i in ids if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < self._vocab_size]
        return tuple(dict.fromkeys(valid))

    # ------------------------------------------------------------------ use

    @property
    def stop_ids(self) -> tuple:
        """The ids that end a generation (end of text); empty when the tokenizer names none."""
        return self._stops

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def bos_id(self) -> Optional[int]:
        return self._bos

    @property
    def eos_id(self) -> Optional[int]:
        return self._eos

    def encode(self, text: str) -> list[int]:
        """Token ids for ``text`` (no bos/eos added)."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """Token ids for each text of ``texts``; same result as ``encode`` on each. More than
        one thread lets ``tokenizers`` encode in parallel (its own thread pool)."""
        texts = list(texts)
        if not all(isinstance(t, str) for t in texts):
            raise TokenizerError("encode_batch expects a sequence of str")
        if num_threads <= 1 or len(texts) < 2:
            return [self._tok.encode(t, add_special_tokens=False).ids for t in texts]
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """The text for token ids (a list, tuple, numpy array or 1-D tensor of ints); special
        tokens (bos, eos, ...) decode to nothing."""
        return self._tok.decode(checked_ids(ids, self.vocab_size), skip_special_tokens=True)

    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary piece for one id (for inspection and debugging)."""
        return self._tok.id_to_token(checked_ids([token_id], self.vocab_size)[0]) or ""

    def __repr__(self) -> str:
        return f"HFTokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_id={self.eos_id})"


AnyTokenizer = Union[Tokenizer, HFTokenizer]


def _read_json(directory: str, name: str) -> dict:
    """A JSON object file of a model directory, {} when it is absent."""
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot read {path}: {_one_line(exc)}") from None
    return value if isinstance(value, dict) else {}


# =========================================================================== dispatch


def tokenizer_from_bytes(data: bytes) -> AnyTokenizer:
    """The tokenizer serialized in ``data``: a minilm HF wrapper (JSON, starts with ``{``) or a
    sentencepiece model (a protobuf, never starts with ``{``)."""
    if isinstance(data, (bytes, bytearray)) and bytes(data[:1]) == b"{":
        return HFTokenizer.from_bytes(data)
    return Tokenizer.from_bytes(data)


def load_tokenizer(path: str) -> AnyTokenizer:
    """Read a tokenizer file (``tokenizer.model``) holding either kind."""
    try:
        with open(path, "rb") as f:
            return tokenizer_from_bytes(f.read())
    except FileNotFoundError:
        raise TokenizerError(f"tokenizer model file {path!r} does not exist") from None


# =========================================================================== sentencepiece -> tokenizers


def _varint(data: bytes, i: int) -> tuple:
    value = shift = 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if byte < 0x80:
            return value, i


def _fields(data: bytes) -> list:
    """(field number, value) of a protobuf message: ints for varints, bytes otherwise."""
    out, i = [], 0
    while i < len(data):
        key, i = _varint(data, i)
        kind = key & 7
        if kind == 0:
            value, i = _varint(data, i)
        elif kind in (1, 5):
            size = 8 if kind == 1 else 4
            value, i = data[i : i + size], i + size
        elif kind == 2:
            size, i = _varint(data, i)
            value, i = data[i : i + size], i + size
        else:
            raise TokenizerError(f"not a sentencepiece model: protobuf wire type {kind}")
        out.append((key >> 3, value))
    return out


def _read_model(model: bytes) -> tuple:
    """(pieces as (text, score, type), trainer spec fields, normalizer spec fields) of a
    serialized sentencepiece ModelProto."""
    pieces, trainer, normalizer = [], {}, {}
    for number, value in _fields(model):
        if number == 1:
            piece = dict(_fields(value))
            score = struct.unpack("<f", piece[2])[0] if 2 in piece else 0.0
            pieces.append((piece.get(1, b"").decode("utf-8"), score, piece.get(3, NORMAL)))
        elif number == 2:
            trainer = dict(_fields(value))
        elif number == 3:
            normalizer = dict(_fields(value))
    return pieces, trainer, normalizer


def _check_settings(trainer: dict, normalizer: dict) -> None:
    """Refuse a sentencepiece model whose settings the conversion does not reproduce
    (proto2 defaults where a field is absent)."""
    wanted = [
        ("model_type BPE", trainer.get(3, 1) == 2),
        ("byte_fallback", trainer.get(35, 0) == 1),
        ("split_by_whitespace", trainer.get(22, 1) == 1),
        ("no treat_whitespace_as_suffix", trainer.get(24, 0) == 0),
        ("the identity normalization", normalizer.get(1, b"") == b"identity"),
        ("no dummy prefix", normalizer.get(3, 1) == 0),
        ("no whitespace removal", normalizer.get(4, 1) == 0),
        ("escaped spaces", normalizer.get(5, 1) == 1),
    ]
    missing = [name for name, ok in wanted if not ok]
    if missing:
        raise TokenizerError(
            "cannot convert this sentencepiece model to a Hugging Face tokenizer: it lacks "
            f"{', '.join(missing)} (minilm's trainer settings)"
        )


def _merges(pieces: list) -> list:
    """Every split of a normal piece into two normal pieces, best-scoring piece first."""
    normal = {text for text, _, kind in pieces if kind == NORMAL}
    ranked = sorted(
        (-score, i, text) for i, (text, score, kind) in enumerate(pieces) if kind == NORMAL and len(text) > 1
    )
    return [
        (text[:k], text[k:])
        for _, _, text in ranked
        for k in range(1, len(text))
        if text[:k] in normal and text[k:] in normal
    ]


def sentencepiece_to_json(model: bytes) -> str:
    """The tokenizer.json text of a ``tokenizers`` BPE that tokenizes like the serialized
    sentencepiece model ``model`` (minilm's trainer settings; see the module docstring)."""
    tk = _require()
    pieces, trainer, normalizer = _read_model(model)
    _check_settings(trainer, normalizer)
    vocab = {text: i for i, (text, _, _) in enumerate(pieces)}
    unk = next((text for text, _, kind in pieces if kind == UNKNOWN), None)
    tok = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=_merges(pieces), unk_token=unk, byte_fallback=True))
    tok.normalizer = tk.normalizers.Replace(" ", SPACE)
    words = tk.Regex(f"\n|{SPACE}*[^{SPACE}\n]+|{SPACE}+")
    tok.pre_tokenizer = tk.pre_tokenizers.Split(words, behavior="isolated")
    tok.decoder = tk.decoders.Sequence(
        [tk.decoders.Replace(SPACE, " "), tk.decoders.ByteFallback(), tk.decoders.Fuse()]
    )
    tok.add_tokens(
        [tk.AddedToken(text, special=False, normalized=True) for text, _, kind in pieces if kind == USER_DEFINED]
    )
    tok.add_special_tokens(
        [tk.AddedToken(text, special=True, normalized=False) for text, _, kind in pieces if kind in (UNKNOWN, CONTROL)]
    )
    return tok.to_str()


# =========================================================================== export


def save_pretrained_tokenizer(tokenizer: AnyTokenizer, directory: str) -> list[str]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into
    ``directory`` (created if needed) for ``transformers.AutoTokenizer``; returns the paths.
    A sentencepiece tokenizer is converted (same ids); an ``HFTokenizer`` writes its own.
    Special tokens in a text are text there too (``split_special_tokens``), as in ``encode``."""
    hf = tokenizer if isinstance(tokenizer, HFTokenizer) else HFTokenizer.from_sentencepiece(tokenizer)
    special = {}
    for name, token_id in (("bos_token", hf.bos_id), ("eos_token", hf.eos_id)):
        if token_id is not None:
            special[name] = hf.id_to_piece(token_id)
    unk = json.loads(hf.tokenizer_json()).get("model", {}).get("unk_token")
    if unk is not None:
        special["unk_token"] = unk
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": True,
        "model_input_names": ["input_ids", "attention_mask"],
    }
    if not isinstance(tokenizer, HFTokenizer):  # minilm adds no bos / eos; a tokenizer.json's post-processor decides
        settings.update(add_bos_token=False, add_eos_token=False)
    os.makedirs(directory, exist_ok=True)
    files = {
        "tokenizer.json": hf.tokenizer_json(),
        "tokenizer_config.json": json.dumps(settings, indent=2, ensure_ascii=False) + "\n",
        "special_tokens_map.json": json.dumps(special, indent=2, ensure_ascii=False) + "\n",
    }
    paths = []
    for name, text in files.items():
        paths.append(os.path.join(directory, name))
        atomic_write(paths[-1], text)
    return paths
