"""Perplexity vs length (minilm.evaluation, evaluate.py) and passkey retrieval (minilm.evaluation.passkey)."""

import csv
import math
import os
import random
import re
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import minilm.model.attention
from minilm import GPT
from minilm.checkpoints import format as checkpoint
from minilm.checkpoints.format import CheckpointError
from minilm.checkpoints.loading import load_model
from minilm.cli import evaluate as evaluate_command
from minilm.cli import passkey as passkey_cli
from minilm.config import ConfigError, DataConfig, build_config, resolve_config
from minilm.configfile import load_config
from minilm.data.corpus import prepare
from minilm.evaluation import lengths as evaluation
from minilm.evaluation import passkey, scoring
from minilm.positions import available
from minilm.training.loop import train
from tests.conftest import tiny_overrides, tiny_text
from tests.forkrun import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = "the grass is green sky blue sun yellow here we go there and back again king queen night 0 1 2 3 4 5 6 7 8 9"


def write_corpus(directory, lines=2500, seed=0):
    rng = random.Random(seed)
    words = WORDS.split()
    os.makedirs(directory, exist_ok=True)
    text = "\n".join(
        " ".join(rng.choice(words) for _ in range(rng.randint(4, 12))).capitalize() + "." for _ in range(lines)
    )
    with open(os.path.join(directory, "tiny.txt"), "w") as f:
        f.write(text + "\n")
    return str(directory)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalcorpus")
    data = {"corpus": write_corpus(root / "corpus"), "vocab_size": 340, "dir": str(root / "data")}
    return root, data, prepare(build_config({"data": data}).data, quiet=True)


def tiny_checkpoint(corpus, kind, block_size=16, seed=0, **position):
    root, data, prepared = corpus
    config = build_config(
        {
            "model": {
                "vocab_size": 340,
                "n_layer": 2,
                "n_head": 2,
                "d_model": 16,
                "block_size": block_size,
                "position": {"kind": kind, **position},
            },
            "data": data,
            "out_dir": str(root / f"{kind}-{seed}"),
        }
    )
    torch.manual_seed(seed)
    model = GPT(config.model)
    with torch.no_grad():  # make positions matter in an untrained model
        for name, p in model.named_parameters():
            if name.startswith("positions") or name.endswith("qkv.weight"):
                p.normal_(0, 0.5)
    path = checkpoint.save(
        {
            "model": model.state_dict(),
            "config": config.to_dict(),
            "tokenizer": prepared.tokenizer.to_bytes(),
            "step": 0,
        },
        config.out_dir,
    )
    return path, model.eval()


def test_checkpoints_of_one_name_keep_a_row_each(corpus, tmp_path):
    """Two snapshots of a run (or two runs of one name) would share the default row name, and the
    tables would show one of them: each row is named by the shortest end of its path that differs."""
    snapshots = tmp_path / "run" / "snapshots"
    snapshots.mkdir(parents=True)
    for step, seed in ((1, 0), (2, 1)):
        shutil.copy(tiny_checkpoint(corpus, "rope", seed=seed)[0], snapshots / f"step-{step}.pt")
    paths = [str(snapshots / "step-1.pt"), str(snapshots / "step-2.pt")]
    results = evaluation.evaluate_checkpoints(paths, lengths=[16], max_tokens=64, quiet=True)
    assert [r.label for r in results] == ["snapshots/step-1", "snapshots/step-2"]
    assert results[0].ppl != results[1].ppl
    assert evaluation.markdown_table(results).count("snapshots/step-") == 2
    for folder, seed in (("a", 0), ("b", 1)):  # two runs of one name in two folders
        shutil.copytree(os.path.dirname(tiny_checkpoint(corpus, "rope", seed=seed)[0]), tmp_path / folder / "rope")
    runs = evaluation.evaluate_checkpoints([str(tmp_path / f / "rope") for f in "ab"], lengths=[16], max_tokens=64)
    assert [r.label for r in runs] == ["a/rope", "b/rope"]


def direct_nll(model, tokens, length):
    """Reference: full logits on each non-overlapping segment, mean cross-entropy."""
    n = len(tokens) - 1
    total = 0.0
    with torch.no_grad():
        for b in range(0, n, length):
            e = min(b + length, n)
            logits = model(tokens[None, b:e])
            total += F.cross_entropy(logits[0], tokens[b + 1 : e + 1], reduction="sum").item()
    return total / n


# --------------------------------------------------------------------------- segments and scores


@pytest.mark.parametrize("n,length,stride", [(64, 16, None), (70, 16, 5), (64, 64, None), (10, 16, 3)])
def test_windows_score_every_target_once(n, length, stride):
    for mode in scoring.MODES:
        scored, step = [], stride or (3 if mode == "fixed-stride" else length // 2)
        for begin, end, count in scoring.segments(n, length, mode, step if mode == "fixed-stride" else stride):
            assert 0 <= begin < end <= n and end - begin <= length and 1 <= count <= end - begin
            scored += list(range(end - count, end))
            if mode != "nonoverlapping" and begin > 0:  # every token after the first segment sees >= T - stride
                assert end - count - begin >= length - step
        assert scored == list(range(n)), mode


def test_the_fixed_stride_is_the_same_at_every_length_and_must_be_given():
    for length in (8, 16, 32):
        starts = [b for b, _, _ in scoring.segments(100, length, "fixed-stride", 4)]
        assert all(b % 4 == 0 for b in starts)  # segments of every length start on the same grid: runs are shared
        ends = [e for _, e, _ in scoring.segments(100, length, "fixed-stride", 4)]
        assert all(b - a == 4 for a, b in zip(ends, ends[1:-1]))
    with pytest.raises(scoring.ScoringError, match="fixed-stride' needs its stride"):
        scoring.segments(100, 8, "fixed-stride")


def test_loss_by_position_is_the_mean_over_segments_at_each_position(corpus):
    _, model = tiny_checkpoint(corpus, "rope")
    tokens = torch.randint(0, 340, (70,), generator=torch.Generator().manual_seed(2))
    curves = []
    scoring.score_many(model, tokens, [(16, "nonoverlapping", None), (16, "sliding", None)], by_position=curves)
    with torch.no_grad():
        rows = [
            F.cross_entropy(model(tokens[None, b : b + 16])[0], tokens[b + 1 : b + 17], reduction="none")
            for b in range(0, 64, 16)
        ]
        last = F.cross_entropy(model(tokens[None, 64:69])[0], tokens[65:70], reduction="none")
    expected = torch.stack(rows).double().sum(dim=0)
    expected[:5] += last.double()
    counts = torch.tensor([5.0] * 5 + [4.0] * 11, dtype=torch.float64)
    assert curves[1] is None and torch.allclose(curves[0], expected / counts, rtol=1e-5)


def test_nonoverlapping_score_matches_direct_cross_entropy(corpus):
    _, model = tiny_checkpoint(corpus, "rope")
    tokens = torch.randint(0, 340, (97,), generator=torch.Generator().manual_seed(0))
    for length in (8, 16, 40):
        got = scoring.score(model, tokens, length, "nonoverlapping", batch_tokens=32)
        assert got == pytest.approx(direct_nll(model, tokens, length), rel=1e-5)


def test_sliding_scores_the_last_stride_tokens_of_each_window(corpus):
    _, model = tiny_checkpoint(corpus, "alibi")
    tokens = torch.randint(0, 340, (65,), generator=torch.Generator().manual_seed(1))
    a = scoring.score(model, tokens, 16, "nonoverlapping")
    b = scoring.score(model, tokens, 16, "sliding", stride=16)
    assert a == pytest.approx(b, rel=1e-6)
    total = 0.0
    with torch.no_grad():
        for begin, end, count in scoring.segments(64, 16, "sliding", 5):
            logits = model(tokens[None, begin:end])[0, -count:]
            total += F.cross_entropy(logits, tokens[end - count + 1 : end + 1], reduction="sum").item()
    assert scoring.score(model, tokens, 16, "sliding", stride=5, batch_tokens=48) == pytest.approx(total / 64)


SHARED_REQUESTS = [(t, mode, 4 if mode == "fixed-stride" else None) for mode in scoring.MODES for t in (8, 16, 32)] + [
    (16, "sliding", 5)
]
LENGTH_READERS = [
    {"kind": "rope", "scaling": {"type": "dynamic", "factor": 4.0}},
    {"kind": "interpolated", "inner": {"kind": "rope", "scaling": {"type": "dynamic", "factor": 2.0}}, "factor": 2.0},
]


def windows_one_by_one(model, tokens, length, mode, stride):
    """Reference: each segment through the model by itself, its scored targets summed (mean per target)."""
    n, total = len(tokens) - 1, 0.0
    with torch.no_grad():
        for begin, end, count in scoring.segments(n, length, mode, stride):
            logits = model(tokens[None, begin:end])[0, -count:]
            total += F.cross_entropy(logits.double(), tokens[end - count + 1 : end + 1], reduction="sum").item()
    return total / n


@pytest.mark.parametrize(
    "position",
    [{"kind": k} for k in available() if k != "interpolated"]
    + LENGTH_READERS
    + [{"kind": "interpolated", "inner": {"kind": "rope"}, "factor": 2.0}],
    ids=lambda p: (
        p["kind"]
        + ("-" + p.get("scaling", p.get("inner", {})).get("type", "") if "scaling" in p or "inner" in p else "")
    ),
)
def test_score_many_equals_every_window_scored_alone(random_gpt, position):
    """Several lengths and both modes in one pass (segments sharing a start share a run)
    give each request the perplexity of its segments run one by one."""
    model = random_gpt(position, block_size=32).eval()
    tokens = torch.randint(0, 97, (101,), generator=torch.Generator().manual_seed(3))
    got = scoring.score_many(model, tokens, SHARED_REQUESTS, batch_tokens=40)
    expected = [windows_one_by_one(model, tokens, *request) for request in SHARED_REQUESTS]
    assert got == pytest.approx(expected, rel=1e-5)


def test_scoring_records_no_autograd_history(random_gpt):
    """Held-out scoring runs its forward passes without autograd (a graph over every segment cost
    4x the time of the study's evaluation and its memory), whatever the caller's grad mode."""
    model = random_gpt({"kind": "rope"}, block_size=32).eval()
    tracked = []
    model.register_forward_hook(lambda module, args, output: tracked.append(output.requires_grad))
    tokens = torch.randint(0, 97, (101,), generator=torch.Generator().manual_seed(3))
    with torch.enable_grad():
        scoring.score_many(model, tokens, SHARED_REQUESTS, batch_tokens=40)
        scoring.score(model, tokens, 16)
    assert tracked and not any(tracked)


def test_schemes_that_read_the_sequence_length_are_not_prefix_invariant(random_gpt):
    """Dynamic NTK rescales with the length processed, so a segment's logits differ inside a
    longer one: such a scheme must run each segment alone (and says so)."""
    for position in LENGTH_READERS:
        model = random_gpt(position, block_size=8).eval()
        assert not model.positions.prefix_invariant
        tokens = torch.randint(0, 97, (1, 32), generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            assert not torch.allclose(model(tokens[:, :16])[0], model(tokens)[0, :16], atol=1e-4)
    for kind in [k for k in available() if k != "interpolated"]:
        assert random_gpt({"kind": kind}).positions.prefix_invariant, kind


def test_one_pass_runs_five_n_positions_for_four_lengths_in_both_modes():
    """L, 2L, 4L, 8L in both modes: each segment start runs once, as far as its longest
    segment reaches: 5 N token positions instead of the 12 N of running every segment."""
    L = 16
    requests = [(t, mode, None) for mode in ("nonoverlapping", "sliding") for t in (L, 2 * L, 4 * L, 8 * L)]
    fixed = [(t, "fixed-stride", L) for t in (L, 2 * L, 4 * L, 8 * L)]
    for n in (16 * 8 * 6, 16 * 8 * 20):  # 5 N, less the last stretches cut short by the end of the text
        assert 5 * n - 8 * L <= sum(e - b for b, e in scoring._runs(n, requests, shared=True)) <= 5 * n
        separately = sum(e - b for t, mode, stride in requests for b, e, _ in scoring.segments(n, t, mode, stride))
        assert 12 * n - 16 * L <= separately <= 12 * n  # each request run by itself
        # a fixed stride of L starts a segment at every multiple of L, as far as 8L: with the other two modes
        # (whose L-sliding segments also start halfway) at most 9 N positions, where alone they take 25-27 N
        shared = sum(e - b for b, e in scoring._runs(n, requests + fixed, shared=True))
        alone = sum(e - b for t, mode, stride in requests + fixed for b, e, _ in scoring.segments(n, t, mode, stride))
        assert shared <= 9 * n and 25 * n <= alone <= 27 * n


@pytest.mark.parametrize("kind", ["alibi", "t5", "rope", "learned"])
def test_chunked_paths_give_the_same_perplexity(corpus, kind, monkeypatch):
    _, model = tiny_checkpoint(corpus, kind, block_size=64)
    tokens = torch.randint(0, 340, (129,), generator=torch.Generator().manual_seed(2))
    whole = scoring.score(model, tokens, 64, "sliding", stride=16)
    monkeypatch.setattr(minilm.model.attention, "MASK_BUDGET", 2 * 64 * 5)  # 5 query rows per chunk
    monkeypatch.setattr(scoring, "LOSS_CHUNK", 7)
    chunked = scoring.score(model, tokens, 64, "sliding", stride=16, batch_tokens=64)
    assert chunked == pytest.approx(whole, rel=1e-5)


def test_bits_per_char_formula():
    r = evaluation.Result(
        label="m",
        checkpoint="c",
        position="rope",
        train_length=8,
        length=8,
        mode="nonoverlapping",
        stride=None,
        tokens=1000,
        chars=4000,
        nll=2.0,
    )
    assert r.ppl == pytest.approx(math.exp(2.0))
    assert r.bpc == pytest.approx(2.0 * 1000 / 4000 / math.log(2))


def test_the_header_names_each_rows_scored_text_when_they_differ():
    def row(label, tokens, chars, length):
        return evaluation.Result(label, "c", "rope", 8, length, "nonoverlapping", None, tokens, chars, 2.0)

    same = [row("a", 1000, 4000, 8), row("a", 1000, 4000, 16), row("b", 1000, 4000, 8)]
    assert evaluate_command.scored(same) == "1,000 scored tokens (4,000 characters)"
    other = [row("a", 1000, 4000, 8), row("a", 1000, 4000, 16), row("hf:gpt2", 800, 4100, 8)]
    assert evaluate_command.scored(other) == (
        "scored text by row: a 1,000 scored tokens (4,000 characters); hf:gpt2 800 scored tokens (4,100 characters)"
    )


# --------------------------------------------------------------------------- checkpoints


def test_evaluate_checkpoints_same_tokens_and_bounded_learned(corpus):
    rope, _ = tiny_checkpoint(corpus, "rope")
    learned, _ = tiny_checkpoint(corpus, "learned")
    results = evaluation.evaluate_checkpoints([rope, learned], multiples=[1, 2, 4], max_tokens=200, quiet=True)
    assert [(r.label, r.length, r.status) for r in results] == [
        ("rope-0", 16, "ok"),
        ("rope-0", 32, "ok"),
        ("rope-0", 64, "ok"),
        ("learned-0", 16, "ok"),
        ("learned-0", 32, "bounded"),
        ("learned-0", 64, "bounded"),
    ]
    assert {r.tokens for r in results} == {192}  # 200 rounded down to a multiple of the longest length
    table = evaluation.markdown_table(results)
    assert "n/a (bounded)" in table and table.count("\n") == 3
    ok = [r for r in results if r.status == "ok"]
    assert all(0 < r.bpc and 1 < r.ppl < 10 * 340 for r in ok)


def test_evaluation_time_scaling_factor_one_changes_nothing(corpus):
    rope, _ = tiny_checkpoint(corpus, "rope")
    kwargs = dict(lengths=[16, 48], max_tokens=96, quiet=True)
    plain = evaluation.evaluate_checkpoints([rope], **kwargs)
    yarn1 = evaluation.evaluate_checkpoints(
        [rope], overrides=["model.position.scaling={type: yarn, factor: 1}"], **kwargs
    )
    pi4 = evaluation.evaluate_checkpoints(
        [rope], overrides=["model.position.scaling.type=linear", "model.position.scaling.factor=4"], **kwargs
    )
    assert [r.nll for r in yarn1] == pytest.approx([r.nll for r in plain], rel=1e-6)
    assert pi4[0].nll != pytest.approx(plain[0].nll, rel=1e-4)
    assert pi4[0].position == "rope+linear x4" and "[rope+linear x4]" in pi4[0].label
    model, *_ = load_model(
        rope, ["model.position.scaling.type=yarn", "model.position.scaling.factor=4", "model.block_size=64"]
    )
    assert model.positions.scaling["original_max_positions"] == 16  # the checkpoint's length, not the new one


def test_zero_shot_interpolation_of_a_learned_table(corpus):
    learned, src = tiny_checkpoint(corpus, "learned")
    results = evaluation.evaluate_checkpoints(
        [learned],
        lengths=[16, 32, 64],
        max_tokens=128,
        quiet=True,
        overrides=["model.position.kind=interpolated", "model.position.factor=4"],
    )
    assert [r.status for r in results] == ["ok", "ok", "bounded"]  # 15 * 4 + 1 = 61 positions
    assert results[0].position == "interpolated(learned max_positions=16) x4"
    model, *_ = load_model(learned, ["model.position.kind=interpolated", "model.block_size=64"])
    assert model.positions.factor == pytest.approx(63 / 15)  # the last position on the last trained row
    stretched = ["model.position.kind=interpolated", "model.block_size=64"]
    [row] = evaluation.evaluate_checkpoints([learned], lengths=[64], max_tokens=128, quiet=True, overrides=stretched)
    assert row.label.endswith("[model.block_size=64]")  # another model than the run's
    assert torch.equal(model.positions.inner.table.weight, src.positions.table.weight)
    with pytest.raises(CheckpointError, match="trained with 'learned' positions, not 'alibi'"):
        load_model(learned, ["model.position.kind=alibi"])


def test_bad_requests_are_one_line_errors(corpus):
    rope, _ = tiny_checkpoint(corpus, "rope")
    with pytest.raises(ConfigError, match="not allowed at evaluation time"):
        evaluation.evaluate_checkpoints([rope], overrides=["model.d_model=32"], quiet=True)
    with pytest.raises(evaluation.EvaluationError, match="fewer than the longest length"):
        evaluation.evaluate_checkpoints([rope], lengths=[10**6], quiet=True)
    with pytest.raises(scoring.ScoringError, match="stride=99 is invalid"):
        evaluation.evaluate_checkpoints([rope], lengths=[16], mode="sliding", stride=99, quiet=True)
    with pytest.raises(ConfigError, match="scaling.type"):
        evaluation.evaluate_checkpoints([rope], overrides=["model.position.scaling.type=bogus"], quiet=True)


def run_cli(*args):
    env = {**os.environ, "PYTHONPATH": ROOT}
    return run_python([os.path.join(ROOT, "evaluate.py"), *args], cwd=ROOT, env=env)


@pytest.mark.slow
def test_the_holdout_split_scores_the_held_out_training_text(corpus, tmp_path):
    root, data, _ = corpus
    held = {**data, "holdout_tokens": 400}
    prepared = prepare(build_config({"data": held}).data, quiet=True)
    rope, model = tiny_checkpoint((root, held, prepared), "rope")
    [result] = evaluation.evaluate_checkpoints([rope], lengths=[16], split="holdout", max_tokens=None, quiet=True)
    tokens = torch.from_numpy(np.asarray(prepared.holdout[:385], dtype=np.int64))  # 399 scorable -> 384
    assert result.tokens == 384 and result.nll == pytest.approx(direct_nll(model, tokens, 16), rel=1e-5)
    [val] = evaluation.evaluate_checkpoints([rope], lengths=[16], max_tokens=384, quiet=True)
    assert val.nll != pytest.approx(result.nll, rel=1e-6)  # another text
    with pytest.raises(evaluation.EvaluationError, match="data.holdout_tokens=800 but the run held out 400 tokens"):
        evaluation.evaluate_checkpoints([rope], lengths=[16], split="holdout", overrides=["data.holdout_tokens=800"])
    out = run_cli(rope, "--split", "holdout", "--lengths", "16", "--no-files", "--quiet")
    assert out.returncode == 0 and out.stdout.startswith("held-out training text perplexity"), out.stderr
    plain, _ = tiny_checkpoint(corpus, "rope", seed=1)  # trained without a holdout
    out = run_cli(plain, "--split", "holdout", "--lengths", "16", "--no-files", "--quiet")
    assert (
        out.returncode == 2
        and "the holdout split is empty: the model was trained with data.holdout_tokens=0" in out.stderr
        and "Traceback" not in out.stderr
    )


@pytest.mark.slow
def test_cli_both_modes_table_csv_and_errors(corpus, tmp_path):
    rope, _ = tiny_checkpoint(corpus, "rope")
    learned, _ = tiny_checkpoint(corpus, "learned")
    out = run_cli(
        rope,
        learned,
        "--multiples",
        "1,2",
        "--max-tokens",
        "128",
        "--csv",
        str(tmp_path / "a.csv"),
        "--plot",
        str(tmp_path / "a.png"),
        "--quiet",
    )
    assert out.returncode == 0, out.stderr
    assert "| learned-0 | learned | 16 |" in out.stdout and "n/a (bounded)" in out.stdout
    assert "bits/char @ 32" in out.stdout
    rows = list(csv.DictReader(open(tmp_path / "a.csv")))
    assert len(rows) == 4 and rows[-1]["status"] == "bounded" and rows[-1]["ppl"] == ""
    assert os.path.getsize(tmp_path / "a.png") > 1000
    out = run_cli(
        rope,
        "--mode",
        "sliding",
        "--stride",
        "4",
        "--lengths",
        "16",
        "--max-tokens",
        "64",
        "--position.scaling.type=dynamic",
        "--no-files",
        "--quiet",
    )
    assert out.returncode == 0, out.stderr
    assert "sliding segments (stride 4)" in out.stdout and "rope+dynamic" in out.stdout
    nll = float(re.search(r"\| rope-0 \[rope\+dynamic\] \| rope\+dynamic \| 16 \| ([0-9.]+) \|", out.stdout).group(1))
    assert 1 < nll < 3000
    for bad, message in [
        (["--position.scaling.type=bogus"], "scaling.type='bogus'"),
        (["--bogus"], "unrecognized argument"),
    ]:
        out = run_cli(rope, "--no-files", "--quiet", "--max-tokens", "64", *bad)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr
    out = run_cli(str(tmp_path / "missing"))
    assert out.returncode == 2 and out.stderr.startswith("error: checkpoint")


@pytest.mark.slow
def test_evaluating_from_another_directory_reads_the_data_the_run_prepared(tiny_corpus, tmp_path, monkeypatch, capsys):
    """A run with a relative data.dir and corpus, evaluated from elsewhere, scores the data the run prepared
    and makes no ./data there; once the run's tree has moved, its corpus's new path is tokenized again in the
    tree, said in one line."""
    run_dir, elsewhere, moved = tmp_path / "A", tmp_path / "B", tmp_path / "moved"
    run_dir.mkdir(), elsewhere.mkdir()
    shutil.copy(tiny_corpus / "corpus.txt", run_dir / "corpus.txt")
    monkeypatch.chdir(run_dir)
    relative = ("data.corpus=corpus.txt", "data.dir=data", "train.max_steps=2", "train.sample_tokens=0")
    train(resolve_config(load_config(None, tiny_overrides(tiny_corpus, "out/run", *relative))), quiet=True)
    [result] = evaluation.evaluate_checkpoints(["out/run"], lengths=[32], max_tokens=256, quiet=True)
    ppl = f"| {math.exp(result.nll):.2f} |"
    options = ["--lengths", "32", "--max-tokens", "256", "--no-files", "--quiet"]
    out = run_python(  # a process of its own: nothing read in this one helps it
        ["-m", "minilm", "evaluate", str(run_dir / "out/run"), *options],
        cwd=elsewhere,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert out.returncode == 0 and out.stderr == "" and ppl in out.stdout, out.stderr
    assert os.listdir(elsewhere) == []
    os.rename(run_dir, moved)  # the recorded run directory is gone: the relative out_dir places the tree
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert evaluate_command.main([str(moved / "out/run"), *options]) == 0
    out = capsys.readouterr()
    assert out.err.count("\n") == 1 and f"preparing '{moved / 'corpus.txt'}'" in out.err, out.err
    assert f"into {moved / 'data'}" in out.err and ppl in out.out and os.listdir(elsewhere) == []


# --------------------------------------------------------------------------- passkey


def test_passkey_prompt_length_depth_and_answer(corpus):
    tokenizer = corpus[2].tokenizer
    sentence = max(len(tokenizer.encode(" " + s.strip() + ".")) for s in passkey.FILLER.split(".") if s.strip())
    for length in (passkey.min_length(tokenizer), 150, 301):
        for depth in (0.0, 0.3, 1.0):
            prompt = passkey.make_prompt(tokenizer, length, depth, "40213")
            text = tokenizer.decode(prompt.ids)
            assert len(prompt.ids) == length and text.endswith("What is the pass key? The pass key is")
            assert tokenizer.decode(prompt.ids[prompt.key_start :]).startswith(" The pass key is 40213.")
            assert abs(prompt.key_start - depth * prompt.filler_tokens) <= sentence  # within one filler sentence
    with pytest.raises(passkey.PasskeyError, match="too short"):
        passkey.make_prompt(tokenizer, 10, 0.5, "40213")


def test_passkey_scoring_with_a_generator_that_knows_the_key(corpus):
    tokenizer = corpus[2].tokenizer
    _, model = tiny_checkpoint(corpus, "rope")

    def oracle(ids, max_new):
        key = re.search(r"pass key is (\d{5})", tokenizer.decode(ids)).group(1)
        return passkey.answer_ids(tokenizer, key)

    def liar(ids, max_new):
        return passkey.answer_ids(tokenizer, "00000")

    rows = passkey.accuracy(model, tokenizer, [120, 200], [0, 0.5, 1], trials=3, generate=oracle)
    assert [r["accuracy"] for r in rows] == [1.0] * 6
    assert all(r["accuracy"] == 0 for r in passkey.accuracy(model, tokenizer, [120], [0.5], 3, generate=liar))
    assert passkey.is_correct(" 12345.", "12345") and not passkey.is_correct(" 123456", "12345")
    learned, _ = tiny_checkpoint(corpus, "learned", block_size=128)
    model_l, *_ = load_model(learned)
    rows = passkey.accuracy(model_l, tokenizer, [100, 200], [0.5], 1, generate=oracle)
    assert [r["accuracy"] for r in rows] == [1.0, None] and "n/a (bounded)" in passkey.markdown(rows)


def test_passkey_greedy_decoding_uses_the_cache_consistently(corpus):
    _, model = tiny_checkpoint(corpus, "alibi")
    ids = list(range(5, 40))
    out = passkey.greedy(model, ids, 4)
    seq = list(ids)
    with torch.no_grad():
        for _ in range(4):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    assert out == seq[len(ids) :]


def test_passkey_corpus_documents_end_with_the_answer_and_mix_in_text(corpus):
    tokenizer = corpus[2].tokenizer
    text = corpus[2].val_text()
    out = corpus[0] / "pk"
    paths = passkey.write_corpus(str(out), tokenizer, n=7, length=150, per_file=3, mix_text=text, mix=0.5)
    key_files = [p for p in paths if os.path.basename(p).startswith("passkey-")]
    text_files = [p for p in paths if os.path.basename(p).startswith("text-")]
    assert len(key_files) == 3 and text_files
    docs = [d for p in key_files for d in open(p).read().strip().split("\n\n")]
    assert len(docs) == 7
    for doc in docs:
        key = re.search(r"The pass key is (\d{5})\. Remember", doc).group(1)
        assert doc.endswith(f"What is the pass key? The pass key is {key}.")
        assert len(tokenizer.encode(doc)) <= 150
    key_chars = sum(len(open(p).read()) for p in key_files)
    mixed_chars = sum(len(open(p).read()) for p in text_files)
    assert 0.45 < mixed_chars / (key_chars + mixed_chars) < 0.6
    assert all(chunk in text for p in text_files for chunk in open(p).read().strip().split("\n\n"))
    with pytest.raises(passkey.PasskeyError, match="mix=1.0 is invalid"):
        passkey.write_corpus(str(out), tokenizer, n=1, length=150, mix=1.0)


def test_passkey_command_line(corpus, tmp_path, capsys):
    rope, _ = tiny_checkpoint(corpus, "rope")
    assert passkey_cli.main(["eval", rope, "--lengths", "100,140", "--depths", "0,1", "--trials", "2"]) == 0
    out = capsys.readouterr().out
    assert "| length | depth 0 | depth 1 | mean |" in out and "| 140 | " in out
    assert (
        passkey_cli.main(["make-corpus", str(tmp_path / "pk"), "--checkpoint", rope, "--n", "3", "--length", "120"])
        == 0
    )
    assert len(os.listdir(tmp_path / "pk")) == 1
    assert (
        passkey_cli.main(
            ["make-corpus", str(tmp_path / "mix"), "--checkpoint", rope, "--n", "3", "--length", "120", "--mix", "0.5"]
        )
        == 0
    )
    assert sorted(os.listdir(tmp_path / "mix"))[0] == "passkey-0000.txt" and "text-0000.txt" in os.listdir(
        tmp_path / "mix"
    )
    assert passkey_cli.main(["eval", rope, "--lengths", "5"]) == 2
    assert "error: length=5 is too short" in capsys.readouterr().err


def test_characters_are_counted_as_the_prepared_corpus_counts_them(tmp_path):
    """With data.end_of_text the tokens hold "\\n" and the end-of-text id where the joined text (whose
    characters the training's bits/char divide by) holds two blank lines: the evaluation counts the same."""
    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(12):
        (texts / f"doc{i}.txt").write_text(tiny_text(40, seed=i))
    for end_of_text in (True, False):
        prepared = prepare(
            DataConfig(corpus=str(texts), vocab_size=400, dir=str(tmp_path / "d"), end_of_text=end_of_text), quiet=True
        )
        eot = prepared.eot_id if end_of_text else None
        assert evaluation.scored_chars(prepared.tokenizer, prepared.val.tolist(), eot, True) == prepared.val_chars
