"""minilm.data.hf_tokenizer: Hugging Face tokenizers behind minilm's tokenizer interface, and minilm's
sentencepiece tokenizer exported as a Hugging Face one that gives the very same ids (checked on
the whole Shakespeare validation split, on whitespace, digits, byte-fallback and random text,
and through transformers.AutoTokenizer)."""

import io
import json
import random
import subprocess
import sys

import numpy as np
import pytest
import sentencepiece as spm

from minilm.config import DataConfig
from minilm.data import corpus as data
from minilm.data.corpus import prepare
from minilm.data.shakespeare import shakespeare_documents
from minilm.data.sources import join_documents
from minilm.data.tokenizer import Tokenizer, TokenizerError, newline_chunks
from tests.conftest import REPO, tiny_text

tokenizers = pytest.importorskip("tokenizers")

from minilm.data import hf_tokenizer  # noqa: E402
from minilm.data.hf_tokenizer import HFTokenizer, load_tokenizer, save_pretrained_tokenizer, tokenizer_from_bytes  # noqa: E402

NASTY = [
    "",
    " ",
    "   ",
    " leading",
    "trailing ",
    "  both  ",
    "many     spaces   inside",
    "\t",
    "tab\tand \t mixed\t",
    "\n",
    "\n\n\n",
    "  \n  ",
    " \n\n \t\n",
    "line one\nline two\n",
    "12345 3.14",
    "0",
    "year 1606, act 3",
    "café naïve Ñoño façade",
    "東京 日本語のテキスト",
    "emoji 🙂👍🏽 and 🇫🇷",
    "mixed 東京 café 42\n\t🙂",
    "<s> </s> <unk> <0x41> are text",
    "\x00\x01 control \x7f",
    "a\r\nb",
    "no\u00a0break\u2003space",
    "HAMLET:\nTo be, or not to be, that is the question:\n",
]
# a vocabulary that learns whitespace runs, tabs, accents and a little CJK, beside the byte fallback
SMALL_TEXT = (
    tiny_text(300)
    + "\n".join(
        [
            "\tindented\twith\ttabs",
            "    four spaces",
            "        eight spaces",
            "café naïve crème brûlée",
            "東京 京都 東京都",
            "1 22 333 4444 3.14 2.71",
        ]
        * 30
    )
    + "\n"
)


def _one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message and message
    return message


@pytest.fixture(scope="module")
def shakespeare_text():
    train, val = shakespeare_documents()
    return join_documents(train), join_documents(val)


@pytest.fixture(scope="module")
def shakespeare_sp(shakespeare_text, tmp_path_factory):
    path = tmp_path_factory.mktemp("shakespeare") / "train.txt"
    path.write_text(shakespeare_text[0], encoding="utf-8")
    return Tokenizer.train(str(path), 1024)


@pytest.fixture(scope="module")
def small_sp(tmp_path_factory):
    path = tmp_path_factory.mktemp("small") / "train.txt"
    path.write_text(SMALL_TEXT, encoding="utf-8")
    return Tokenizer.train(str(path), 420)


@pytest.fixture(scope="module")
def exported(shakespeare_sp, tmp_path_factory):
    """The Shakespeare tokenizer saved for transformers and read back as an HFTokenizer."""
    directory = tmp_path_factory.mktemp("exported")
    save_pretrained_tokenizer(shakespeare_sp, str(directory))
    return directory, HFTokenizer.from_directory(str(directory))


def byte_level_json(vocab_size: int = 300) -> str:
    """A GPT-2 style byte-level BPE tokenizer.json with an <|endoftext|> special token."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([tiny_text(300)], trainer)
    return tok.to_str()


@pytest.fixture(scope="module")
def byte_level():
    return HFTokenizer(byte_level_json(), bos_id=0, eos_id=0)


# =========================================================================== exact export


@pytest.mark.slow
def test_export_matches_sentencepiece_on_the_shakespeare_validation_split(shakespeare_sp, exported, shakespeare_text):
    _, hf = exported
    val = shakespeare_text[1]
    ids = shakespeare_sp.encode(val)
    assert len(ids) > 100_000
    assert hf.encode(val) == ids
    assert hf.decode(ids) == val
    assert (hf.vocab_size, hf.bos_id, hf.eos_id) == (1024, shakespeare_sp.bos_id, shakespeare_sp.eos_id)
    assert [hf.id_to_piece(i) for i in range(hf.vocab_size)] == [
        shakespeare_sp.id_to_piece(i) for i in range(shakespeare_sp.vocab_size)
    ]


@pytest.mark.parametrize("which", ["shakespeare", "small"])
def test_export_matches_sentencepiece_on_nasty_text(which, shakespeare_sp, small_sp):
    sp = shakespeare_sp if which == "shakespeare" else small_sp
    hf = HFTokenizer.from_sentencepiece(sp)
    for text in NASTY + [SMALL_TEXT]:
        ids = sp.encode(text)
        assert hf.encode(text) == ids, text
        assert hf.decode(ids) == sp.decode(ids) == text, text
    assert hf.encode_batch(NASTY) == sp.encode_batch(NASTY) == hf.encode_batch(NASTY, num_threads=2)
    # a literal "▁" is a space to sentencepiece (its decode gives a space back): the same here
    assert hf.encode("a\u2581b") == sp.encode("a\u2581b") == sp.encode("a b")
    assert any(sp.id_to_piece(i).startswith("<0x") for i in sp.encode("🙂"))  # the byte fallback was exercised


def test_export_matches_sentencepiece_on_random_text(small_sp):
    hf = HFTokenizer.from_sentencepiece(small_sp)
    rng = random.Random(0)
    alphabet = sorted(set(SMALL_TEXT)) + list("  \t\n\n0123456789éü東京🙂<>/▁")
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(500)]
    assert [hf.encode(t) for t in texts] == small_sp.encode_batch(texts)


def test_autotokenizer_loads_the_export_with_the_same_ids(exported, shakespeare_sp, shakespeare_text):
    transformers = pytest.importorskip("transformers")
    directory, _ = exported
    theirs = transformers.AutoTokenizer.from_pretrained(str(directory))
    for text in NASTY + [shakespeare_text[1][:50_000]]:
        ids = shakespeare_sp.encode(text)
        assert theirs(text, add_special_tokens=False)["input_ids"] == ids, text
        assert theirs.decode(ids) == shakespeare_sp.decode(ids) == text
    assert (theirs.bos_token_id, theirs.eos_token_id) == (shakespeare_sp.bos_id, shakespeare_sp.eos_id)
    assert (
        theirs.decode(
            [shakespeare_sp.bos_id, *shakespeare_sp.encode("Hi"), shakespeare_sp.eos_id], skip_special_tokens=True
        )
        == "Hi"
    )


def test_a_foreign_sentencepiece_model_is_refused(tmp_path):
    """A model with a dummy prefix and NFKC (sentencepiece's defaults) is not minilm's: one line."""
    path = tmp_path / "text.txt"
    path.write_text(tiny_text(200))
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(input=str(path), model_writer=model, vocab_size=300, model_type="bpe", minloglevel=2)
    with pytest.raises(TokenizerError) as exc:
        HFTokenizer.from_sentencepiece(Tokenizer.from_bytes(model.getvalue()))
    assert "dummy prefix" in _one_line(exc)


# =========================================================================== HFTokenizer


def test_bytes_round_trip_and_dispatch(byte_level, small_sp):
    raw = byte_level.to_bytes()
    wrapper = json.loads(raw.decode("utf-8"))
    assert raw[:1] == b"{" and wrapper["format"] == "minilm-hf-tokenizer" and wrapper["version"] == 1
    assert json.loads(wrapper["tokenizer"])["model"]["type"] == "BPE"
    again = tokenizer_from_bytes(raw)
    assert isinstance(again, HFTokenizer) and again.to_bytes() == raw
    assert repr(again) == repr(byte_level) == f"HFTokenizer(vocab_size={byte_level.vocab_size}, bos_id=0, eos_id=0)"
    text = tiny_text(20) + "  émigré 🙂 <|endoftext|>\n"
    assert again.encode(text) == byte_level.encode(text) and again.decode(again.encode(text)) == text
    assert 0 not in byte_level.encode("<|endoftext|>")  # special tokens in a text are text
    assert byte_level.decode([0] + byte_level.encode("ok") + [0]) == "ok"
    sp = tokenizer_from_bytes(small_sp.to_bytes())
    assert isinstance(sp, Tokenizer) and sp.to_bytes() == small_sp.to_bytes()
    for bad in (
        b"",
        b"not a tokenizer",
        b'{"format": "other"}',
        b'{"format": "minilm-hf-tokenizer", "version": 9}',
        b"{broken json",
    ):
        with pytest.raises(TokenizerError) as exc:
            tokenizer_from_bytes(bad)
        _one_line(exc)


def test_load_tokenizer_reads_either_kind(byte_level, small_sp, tmp_path):
    (tmp_path / "hf.model").write_bytes(byte_level.to_bytes())
    (tmp_path / "sp.model").write_bytes(small_sp.to_bytes())
    assert isinstance(load_tokenizer(str(tmp_path / "hf.model")), HFTokenizer)
    assert isinstance(load_tokenizer(str(tmp_path / "sp.model")), Tokenizer)
    with pytest.raises(TokenizerError) as exc:
        load_tokenizer(str(tmp_path / "missing.model"))
    assert "does not exist" in _one_line(exc)


def test_out_of_range_ids_are_one_line_errors_like_sentencepiece(byte_level, small_sp):
    for tok in (byte_level, small_sp):
        n = tok.vocab_size
        for call in (lambda: tok.decode([1, n]), lambda: tok.decode(np.array([-1])), lambda: tok.id_to_piece(n)):
            with pytest.raises(TokenizerError) as exc:
                call()
            assert _one_line(exc).endswith(f"is out of range: valid ids are 0..{n - 1}")
    with pytest.raises(TokenizerError):
        byte_level.encode(b"bytes")


@pytest.mark.parametrize(
    "settings, config, expected",
    [
        ({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}, {}, (0, 0)),
        (
            {"bos_token": {"content": "<|endoftext|>", "special": True}, "eos_token": {"content": "<|endoftext|>"}},
            {"bos_token_id": 7},
            (0, 0),
        ),
        (None, {"bos_token_id": 5, "eos_token_id": [6, 9]}, (5, 6)),
        ({"bos_token": None, "eos_token": "<|not in the vocabulary|>"}, {"bos_token_id": 3, "eos_token_id": 4}, (3, 4)),
        (None, None, (None, None)),
    ],
)
def test_bos_and_eos_come_from_the_model_directory(settings, config, expected, tmp_path):
    (tmp_path / "tokenizer.json").write_text(byte_level_json(), encoding="utf-8")
    for name, value in (("tokenizer_config.json", settings), ("config.json", config)):
        if value is not None:
            (tmp_path / name).write_text(json.dumps(value))
    tok = HFTokenizer.from_directory(str(tmp_path))
    assert (tok.bos_id, tok.eos_id) == expected
    assert (tokenizer_from_bytes(tok.to_bytes()).bos_id, tokenizer_from_bytes(tok.to_bytes()).eos_id) == expected


def test_directory_errors_are_one_line(tmp_path):
    with pytest.raises(TokenizerError) as exc:
        HFTokenizer.from_directory(str(tmp_path))
    assert "tokenizer.json" in _one_line(exc)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError) as exc:
        HFTokenizer.from_directory(str(tmp_path))
    _one_line(exc)


def test_saving_an_hf_tokenizer_writes_its_own_json(byte_level, tmp_path):
    save_pretrained_tokenizer(byte_level, str(tmp_path))
    assert (tmp_path / "tokenizer.json").read_text(encoding="utf-8") == byte_level.tokenizer_json()
    again = HFTokenizer.from_directory(str(tmp_path))
    assert again.to_bytes() == byte_level.to_bytes()
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    text = tiny_text(10) + " café 🙂"
    assert theirs(text, add_special_tokens=False)["input_ids"] == byte_level.encode(text)


@pytest.mark.slow
def test_without_the_extra_minilm_imports_and_hf_tokenizers_say_how_to_install(byte_level, small_sp, monkeypatch):
    code = (
        "import sys; sys.modules['tokenizers'] = None; sys.modules['transformers'] = None\n"
        "import minilm, minilm.data, minilm.checkpoints.loading\n"
        "from minilm.data.hf_tokenizer import HFTokenizer, tokenizer_from_bytes\n"
        "from minilm.data.tokenizer import TokenizerError\n"
        "try:\n    tokenizer_from_bytes(sys.stdin.buffer.read())\nexcept TokenizerError as exc:\n"
        "    print('error:', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=byte_level.to_bytes(), cwd=REPO, capture_output=True, timeout=120
    )
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().strip() == 'error: Hugging Face tokenizers need the hf extra: pip install -e ".[hf]"'
    monkeypatch.setattr(hf_tokenizer, "tokenizers", None)
    assert isinstance(tokenizer_from_bytes(small_sp.to_bytes()), Tokenizer)  # sentencepiece needs no extra
    with pytest.raises(TokenizerError, match=r'pip install -e "\.\[hf\]"'):
        save_pretrained_tokenizer(small_sp, "unused")


# =========================================================================== prepared data


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(tiny_text(1500, seed=3) + "  café 🙂 東京\n\tend\n", encoding="utf-8")
    return path


def test_prepare_with_an_hf_tokenizer_round_trips(byte_level, corpus_file, tmp_path, monkeypatch):
    monkeypatch.setattr(Tokenizer, "train", None)  # a given tokenizer is never trained
    cfg = DataConfig(corpus=str(corpus_file), dir=str(tmp_path / "data"))
    p = prepare(cfg, quiet=True, tokenizer=byte_level)
    assert isinstance(p.tokenizer, HFTokenizer) and p.tokenizer.to_bytes() == byte_level.to_bytes()
    assert (p.dir / "tokenizer.model").read_bytes() == byte_level.to_bytes()
    assert p.val.tolist() == byte_level.encode(p.val_text()) and p.tokenizer.decode(p.val) == p.val_text()
    assert p.tokenizer.decode(p.train) in corpus_file.read_text(encoding="utf-8")
    assert "café 🙂 東京" in p.val_text()
    mtime = (p.dir / "train.bin").stat().st_mtime_ns
    again = prepare(cfg, quiet=True, tokenizer=byte_level)
    assert again.dir == p.dir and (p.dir / "train.bin").stat().st_mtime_ns == mtime
    assert np.array_equal(again.train, p.train) and isinstance(again.tokenizer, HFTokenizer)


def test_chunked_encoding_equals_one_encode_or_is_not_chunked(byte_level, small_sp, tmp_path):
    """Newline-aligned chunks give one encode's ids; a tokenizer that adds a space at the start
    of every text (a Metaspace dummy prefix) is encoded in one piece."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(prepend_scheme="always")
    tok.decoder = tokenizers.decoders.Metaspace(prepend_scheme="always")
    tok.train_from_iterator(
        [tiny_text(300)], tokenizers.trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>"], show_progress=False)
    )
    prefixed = HFTokenizer(tok.to_str())
    text = tiny_text(200, seed=5) + "  two  spaces\n\n\tand 12 digits.\n"
    for tokenizer in (byte_level, small_sp, HFTokenizer.from_sentencepiece(small_sp), prefixed):
        assert data.encode_text(tokenizer, text, chunk_chars=100).tolist() == tokenizer.encode(text)
    assert len(newline_chunks(text, 100)) > 10


def test_a_vocabulary_past_uint16_gets_uint32_token_files(corpus_file, tmp_path):
    """A Llama-3-sized vocabulary: ids past 65,535 are written, read back and reused exactly."""
    words = sorted(set(corpus_file.read_text(encoding="utf-8").split()))
    filler = 128_256 - len(words)
    vocab = {**{f"<{i}>": i for i in range(filler)}, **{w: filler + i for i, w in enumerate(words)}}  # words last
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    big = HFTokenizer(tok.to_str())
    assert big.vocab_size == 128_256
    cfg = DataConfig(corpus=str(corpus_file), dir=str(tmp_path / "data"))
    p = prepare(cfg, quiet=True, tokenizer=big)
    assert p.train.dtype == np.uint32 and p.val.dtype == np.uint32 and p.manifest["token_dtype"] == "uint32"
    assert int(p.train.max()) > 65_535 and p.val.tolist() == big.encode(p.val_text())
    mtime = (p.dir / "train.bin").stat().st_mtime_ns
    again = prepare(cfg, quiet=True, tokenizer=big)
    assert (p.dir / "train.bin").stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert again.train.dtype == np.uint32 and np.array_equal(again.train, p.train)
    assert data.token_dtype(65_536) == np.uint16 and data.token_dtype(65_537) == np.uint32


def test_a_prepared_directory_without_a_token_dtype_reads_as_uint16(byte_level, corpus_file, tmp_path):
    """Manifests written before uint32 token files name no dtype: their files are uint16."""
    cfg = DataConfig(corpus=str(corpus_file), dir=str(tmp_path / "data"))
    p = prepare(cfg, quiet=True, tokenizer=byte_level)
    manifest = json.loads((p.dir / "manifest.json").read_text())
    assert manifest.pop("token_dtype") == "uint16"
    (p.dir / "manifest.json").write_text(json.dumps(manifest))
    old = prepare(cfg, quiet=True, tokenizer=byte_level)
    assert "token_dtype" not in old.manifest  # read as it was, not rebuilt
    assert old.train.dtype == np.uint16 and np.array_equal(old.train, p.train)
    manifest["token_dtype"] = "uint32"  # a width the vocabulary does not need: rebuilt as uint16
    (p.dir / "manifest.json").write_text(json.dumps(manifest))
    rebuilt = prepare(cfg, quiet=True, tokenizer=byte_level)
    assert rebuilt.manifest["token_dtype"] == "uint16" and np.array_equal(rebuilt.train, p.train)
