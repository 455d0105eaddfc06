"""Shared test setup. Tests use tiny models, for which one thread is fastest and avoids
thread oversubscription when the suite shares the machine (subprocesses inherit it too)."""

import os
import sys

import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


# --------------------------------------------------------------------------- tiny training runs
import random  # noqa: E402

import pytest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # also through a link to tests/


def tiny_text(n_lines: int = 2500, seed: int = 0) -> str:
    """Deterministic play-like text (about 100k characters) for tiny training runs."""
    words = (
        "the king queen lord lady sword crown night day love death fair foul speak hear what where "
        "when why how thou thee thy art hath doth shall will would must come go"
    ).split()
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        if i % 6 == 0:
            lines += ["", rng.choice(["ROMEO", "JULIET", "HAMLET"]) + ":"]
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))).capitalize() + rng.choice(".,!?"))
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    """A small user corpus (one .txt file) and a data dir where it is prepared once per session."""
    root = tmp_path_factory.mktemp("tiny_corpus")
    (root / "corpus.txt").write_text(tiny_text())
    return root


def tiny_overrides(corpus_root, out_dir, *extra) -> list:
    """Dotted overrides for a tiny, fast run on the tiny corpus (vocab 300, 2 layers x 32)."""
    return [
        f"data.corpus={corpus_root / 'corpus.txt'}",
        "data.vocab_size=400",
        f"data.dir={corpus_root / 'data'}",
        "model.n_layer=2",
        "model.n_head=2",
        "model.d_model=32",
        "model.block_size=32",
        "train.batch_size=4",
        "train.max_steps=12",
        "train.warmup_steps=2",
        "train.lr=3e-3",
        "train.min_lr=3e-4",
        "train.eval_interval=6",
        "train.eval_iters=2",
        "train.log_interval=1",
        "train.checkpoint_interval=6",
        "train.sample_tokens=8",
        "train.final_eval_tokens=2000",
        "train.dtype=float32",
        "train.device=cpu",
        f"out_dir={out_dir}",
        *extra,
    ]


@pytest.fixture
def tiny_config(tiny_corpus, tmp_path):
    """tiny_config(*overrides, out='run') -> a resolved Config for a tiny run writing under tmp_path."""
    from minilm.config import resolve_config
    from minilm.configfile import load_config

    def make(*extra, out="run"):
        return resolve_config(load_config(None, tiny_overrides(tiny_corpus, tmp_path / out, *extra)))

    return make


# --------------------------------------------------------------------------- generation
@pytest.fixture(scope="session")
def gen_tokenizer(tmp_path_factory):
    """A 400-piece tokenizer trained on a little tiny_text()."""
    from minilm.data.tokenizer import Tokenizer

    path = tmp_path_factory.mktemp("gen_tokenizer") / "text.txt"
    path.write_text(tiny_text(400))
    return Tokenizer.train(str(path), 400)


def _random_gpt(position, *, vocab_size=97, block_size=32, n_layer=2, seed=0):
    """A tiny GPT with large random weights: small token embeddings, strong layers and a
    sharp final norm make greedy decoding wander over many tokens (an untrained GPT-2 init
    repeats one token, which would make cached-vs-uncached comparisons vacuous)."""
    from minilm import GPT, ModelConfig

    torch.manual_seed(seed)
    model = GPT(
        ModelConfig(
            vocab_size=vocab_size, n_layer=n_layer, n_head=4, d_model=32, block_size=block_size, position=position
        )
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name == "wte.weight":
                param.normal_(0, 0.3)
            elif param.dim() >= 2:
                param.normal_(0, 3.0 / param.shape[-1] ** 0.5)
        model.ln_f.weight.fill_(3.0)
    return model.eval()


@pytest.fixture(scope="session")
def random_gpt():
    """random_gpt(position, vocab_size=97, block_size=32, n_layer=2, seed=0) -> a tiny random GPT."""
    return _random_gpt


@pytest.fixture(scope="session")
def hf_tokenizer_dir(tmp_path_factory):
    """A byte-level BPE tokenizer (GPT-2 style) of about 300 tokens, saved by transformers."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([tiny_text(300)], trainer)
    directory = tmp_path_factory.mktemp("hf_tokenizer")
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    ).save_pretrained(directory)
    return directory


# The files that take longest, started first: a file runs whole in one worker (``--dist loadfile``), so
# one started last would run on alone after the other worker has finished (their times: --durations).
LONGEST_FIRST = ("test_docs.py", "test_experiments.py", "test_fsdp.py", "test_bad_inputs.py")


def pytest_collection_modifyitems(items):
    """Run the files of ``LONGEST_FIRST`` first, in that order; every other test keeps its place."""
    order = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: order.get(item.path.name, len(order)))


def pytest_terminal_summary(terminalreporter):
    """What tests/test_docs.py ran of README.md and the manual: its count of commands."""
    docs = sys.modules.get("tests.test_docs") or sys.modules.get("test_docs")
    for line in getattr(docs, "SUMMARY", []):
        terminalreporter.write_line(line)
