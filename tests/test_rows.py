"""Rows of their own (minilm.model.attention.attend_rows): documents packed into one row, where
a token's logits do not see the document before it, and prompts of different lengths decoded
together, where every row gets what it gets alone (greedy, every position scheme)."""

import json

import pytest
import torch

from minilm.cli import generate as generate_command
from minilm.generation.decode import GenerationError, Sampling, context_size, generate_ids, generate_rows
from minilm.model.attention import document_layout
from tests.test_generate_cli import checkpoints, run  # noqa: F401  (checkpoints is a fixture)
from tests.test_generation import scheme_id, schemes

GREEDY = Sampling(temperature=0)
EOT = 2


def test_document_layout_numbers_documents_and_positions_within_them():
    idx = torch.tensor([[5, 6, EOT, 7, 8, 9, EOT, EOT, 4]])
    documents, within = document_layout(idx, EOT)
    assert documents.tolist() == [[0, 0, 0, 1, 1, 1, 1, 2, 3]]
    assert within.tolist() == [[0, 1, 2, 0, 1, 2, 3, 0, 0]]


def packed(first_document, last_document):
    return torch.cat([first_document, torch.tensor([EOT]), last_document])[None]


@pytest.mark.parametrize("position", schemes(), ids=scheme_id)
def test_a_document_does_not_see_the_one_before_it(random_gpt, position):
    model = random_gpt(position, block_size=32).eval()
    g = torch.Generator().manual_seed(0)
    last = torch.randint(3, 97, (9,), generator=g)
    before, other = torch.randint(3, 97, (12,), generator=g), torch.randint(3, 97, (12,), generator=g)
    shorter = torch.randint(3, 97, (5,), generator=g)
    # one context length for every pass: dynamic NTK and LongRoPE read it (the scheme, not the mask)
    with torch.no_grad():
        masked = model(packed(before, last), end_of_text=EOT, context_len=32)[0, -9:]
        # the same length before it: only attention could carry the earlier document's content
        assert torch.allclose(
            masked, model(packed(other, last), end_of_text=EOT, context_len=32)[0, -9:], rtol=1e-4, atol=1e-4
        )
        unmasked = model(packed(before, last), context_len=32)[0, -9:]
        assert not torch.allclose(masked, unmasked, atol=1e-3)  # without the mask it does see it
        restarted = model(packed(before, last), end_of_text=EOT, restart_positions=True, context_len=32)[0, -9:]
        # positions restarted: any length before it, and the document as if it stood alone
        assert torch.allclose(
            restarted,
            model(packed(shorter, last), end_of_text=EOT, restart_positions=True, context_len=32)[0, -9:],
            rtol=1e-4,
            atol=1e-4,
        )
        assert torch.allclose(restarted, model(last[None], context_len=32)[0], rtol=1e-4, atol=1e-4)


def test_the_first_document_of_a_row_is_unchanged_by_the_mask(random_gpt):
    model = random_gpt({"kind": "alibi"}).eval()
    x = torch.randint(3, 97, (2, 20), generator=torch.Generator().manual_seed(1))
    x[:, 12] = EOT
    with torch.no_grad():
        assert torch.allclose(model(x, end_of_text=EOT)[:, :13], model(x)[:, :13], rtol=1e-4, atol=1e-4)


def test_documents_are_refused_with_a_cache(random_gpt):
    model = random_gpt({"kind": "rope"})
    with pytest.raises(ValueError, match="end_of_text"):
        model(torch.zeros(1, 3, dtype=torch.long), model.new_cache(1, 8), end_of_text=EOT)


def greedy(model, prompts, n, **kw):
    return torch.stack(list(generate_rows(model, prompts, max_new_tokens=n, sampling=GREEDY, **kw)), 1).tolist()


@pytest.mark.parametrize("position", schemes(), ids=scheme_id)
def test_prompts_of_different_lengths_decode_as_each_alone(random_gpt, position):
    model = random_gpt(position, block_size=32)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (3, 11, 6)]
    bounded = model.positions.position_limit() is not None
    new = context_size(model) - 11 if bounded else 60  # rolling schemes go far past the context (the cache wraps)
    together = greedy(model, prompts, new)
    alone = [greedy(model, [p], new)[0] for p in prompts]
    assert together == alone
    assert len({t for row in together for t in row}) >= 10  # not vacuous: greedy decoding wanders


def test_rows_of_one_length_are_the_samples_of_generate_ids(random_gpt):
    model = random_gpt({"kind": "rope"})
    rows = greedy(model, [[4, 5, 6]] * 2, 10)
    ids = torch.stack(list(generate_ids(model, [4, 5, 6], num_samples=2, max_new_tokens=10, sampling=GREEDY)), 1)
    assert rows == ids.tolist()


@pytest.mark.parametrize(
    "options, match",
    [
        ({"use_cache": False}, "--no-cache"),
        ({"sinks": 2}, "--sink-tokens"),
        ({"compile": True}, "--compile"),
    ],
)
def test_different_lengths_refuse_what_needs_one_length(random_gpt, options, match):
    model = random_gpt({"kind": "rope"})
    with pytest.raises(GenerationError, match=match):
        greedy(model, [[1, 2], [3, 4, 5]], 4, **options)


def test_a_bounded_scheme_refuses_prompts_that_would_slide(random_gpt):
    model = random_gpt({"kind": "learned"}, block_size=16)
    with pytest.raises(GenerationError, match="must fit the context together"):
        greedy(model, [[1, 2], [3, 4, 5]], 20)


def test_an_empty_prompt_among_many_is_named(random_gpt):
    with pytest.raises(GenerationError, match="prompt 2 is empty"):
        greedy(random_gpt({"kind": "rope"}), [[1], []], 3)


# --------------------------------------------------------------------------- generate --prompts-file


def run_generate(argv, capsys):
    status, out, err = run(capsys, *argv)
    return status, out, err


def test_prompts_file_prints_each_prompt_as_it_would_alone(checkpoints, tmp_path, capsys):  # noqa: F811
    prompts = ["ROMEO:", "JULIET: O Romeo, Romeo", "A"]  # of different lengths
    lines = tmp_path / "prompts.txt"
    lines.write_text("\n".join(prompts[:2]) + "\n\n" + prompts[2] + "\n")
    common = ["--checkpoint", checkpoints["rope"], "--temperature", "0", "--max-new-tokens", "12", "--ignore-eos"]
    status, out, err = run_generate(common + ["--prompts-file", str(lines)], capsys)
    assert status == 0, err
    together = out.split(f"{generate_command.SEPARATOR}\n")
    alone = []
    for prompt in prompts:
        status, single, err = run_generate(common + [prompt], capsys)
        assert status == 0, err
        alone.append(single)
    assert together == alone
    assert [t.startswith(p) for t, p in zip(together, prompts)] == [True] * 3

    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text("".join(json.dumps(p if i % 2 else {"prompt": p}) + "\n" for i, p in enumerate(prompts)))
    status, from_jsonl, err = run_generate(common + ["--prompts-file", str(jsonl)], capsys)
    assert status == 0, err
    assert from_jsonl == out
    loud = tmp_path / "PROMPTS.JSONL"  # the extension in any case, a byte-order mark before the first line
    loud.write_bytes(b"\xef\xbb\xbf" + jsonl.read_bytes())
    status, from_loud, err = run_generate(common + ["--prompts-file", str(loud)], capsys)
    assert status == 0 and from_loud == out, err


def test_a_prompt_line_keeps_characters_that_python_would_split_at(checkpoints, tmp_path, capsys):  # noqa: F811
    prompts = ["ROMEO:\u2028a", "JULIET:\x0cb"]  # a line separator and a form feed inside lines
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    text = tmp_path / "p.txt"
    text.write_text("\r\n".join(prompts) + "\r\n")
    outs = []
    for source in (path, text):
        status, out, err = run_generate(
            [
                "--checkpoint",
                checkpoints["rope"],
                "--prompts-file",
                str(source),
                "--max-new-tokens",
                "2",
                "--temperature",
                "0",
            ],
            capsys,
        )
        assert status == 0, err
        samples = out.split(f"{generate_command.SEPARATOR}\n")
        assert [s.startswith(p) for s, p in zip(samples, prompts)] == [True, True] and len(samples) == 2
        outs.append(out)
    assert outs[0] == outs[1]


@pytest.mark.parametrize(
    "content, name, match",
    [
        ("\n\n", "p.txt", "holds no prompt"),
        ('{"text": "x"}\n', "p.jsonl", "line 1: expected a JSON string"),
        ('"a"\nnot json\n', "p.jsonl", "line 2"),
    ],
)
def test_bad_prompts_files_are_one_line_errors(checkpoints, tmp_path, capsys, content, name, match):  # noqa: F811
    path = tmp_path / name
    path.write_text(content)
    status, out, err = run_generate(["--checkpoint", checkpoints["rope"], "--prompts-file", str(path)], capsys)
    assert status == 2 and out == ""
    assert match in err and len(err.strip().splitlines()) == 1


def test_prompts_file_and_a_prompt_are_not_both_given(checkpoints, tmp_path, capsys):  # noqa: F811
    path = tmp_path / "p.txt"
    path.write_text("a\n")
    status, _, err = run_generate(["--checkpoint", checkpoints["rope"], "--prompts-file", str(path), "ROMEO"], capsys)
    assert status == 2 and "either with --prompts-file" in err


def test_a_sink_placement_that_contradicts_the_cache_is_refused(random_gpt):
    model = random_gpt({"kind": "rope"})
    cache = model.new_cache(1, 8, rolling=True, sinks=2, sink_positions="cache")
    with pytest.raises(ValueError, match="differs from the cache's placement"):
        model(torch.zeros(1, 3, dtype=torch.long), cache, sink_positions="absolute")
    model(torch.zeros(1, 3, dtype=torch.long), cache, sink_positions="cache")  # repeating it is fine


# --------------------------------------------------------------------------- training with documents


@pytest.fixture(scope="module")
def short_documents(tmp_path_factory):
    """A .jsonl corpus of 400 short documents: a training row of 32 tokens spans several."""
    from tests.conftest import tiny_text

    root = tmp_path_factory.mktemp("documents")
    lines = [line for line in tiny_text(1200).splitlines() if line.strip()]
    with open(root / "docs.jsonl", "w") as f:
        for i in range(0, len(lines), 3):
            f.write(json.dumps({"text": "\n".join(lines[i : i + 3])}) + "\n")
    return root


def document_run(root, tmp_path, mode):
    from minilm.config import resolve_config
    from minilm.configfile import load_config
    from minilm.training.loop import train

    overrides = [
        f"data.corpus={root / 'docs.jsonl'}",
        "data.vocab_size=400",
        f"data.dir={root / 'data'}",
        "data.end_of_text=true",
        f"data.document_mask={mode}",
        "model.position.kind=learned",
        "model.n_layer=1",
        "model.n_head=2",
        "model.d_model=32",
        "model.block_size=32",
        "train.batch_size=4",
        "train.max_steps=3",
        "train.warmup_steps=1",
        "train.eval_iters=1",
        "train.log_interval=1",
        "train.sample_tokens=0",
        "train.final_eval_tokens=500",
        "train.dtype=float32",
        "train.device=cpu",
        f"out_dir={tmp_path / mode}",
    ]
    summary = train(resolve_config(load_config(None, overrides)), quiet=True)
    with open(tmp_path / mode / "metrics.jsonl") as f:
        losses = [r["loss"] for r in map(json.loads, f) if r.get("event") == "train"]
    return summary, losses


def test_training_masks_documents_as_configured(short_documents, tmp_path):
    runs = {mode: document_run(short_documents, tmp_path, mode) for mode in ("none", "mask", "restart")}
    first = {mode: losses[0] for mode, (_, losses) in runs.items()}
    # the same weights and batches: only what each token sees differs, so the first losses differ
    # (positions restarting matter to absolute positions, learned here; to rope they would not)
    assert len(set(first.values())) == 3
    assert all(summary["final_val_loss"] > 0 for summary, _ in runs.values())


def test_a_document_mask_without_end_of_text_is_a_config_error():
    from minilm.config import ConfigError
    from minilm.configfile import load_config

    with pytest.raises(ConfigError, match="data.document_mask='mask' needs documents marked"):
        load_config(None, ["data.document_mask=mask"])


def test_held_out_and_length_evaluation_mask_documents_as_training_does(random_gpt):
    from minilm.config import DataConfig
    from minilm.evaluation.scoring import document_forward, heldout_loss, score_many
    from minilm.training.distributed import Dist

    model = random_gpt({"kind": "learned"}, block_size=32).eval()
    x = torch.randint(3, 97, (3, 33), generator=torch.Generator().manual_seed(4))
    x[:, 10] = EOT
    batches, one = [(x[:, :-1], x[:, 1:])], Dist()
    forward = document_forward(DataConfig(end_of_text=True, document_mask="restart"), EOT)
    assert forward == {"end_of_text": EOT, "restart_positions": True}
    assert document_forward(DataConfig(), EOT) == {}
    masked = heldout_loss(model, batches, torch.device("cpu"), None, one, **forward)
    assert masked != pytest.approx(heldout_loss(model, batches, torch.device("cpu"), None, one), rel=1e-6)
    stream = x.flatten()[:97]
    scored = score_many(model, stream, [(32, "nonoverlapping", None)], forward=forward)[0]
    by_hand = torch.cat(
        [
            torch.nn.functional.cross_entropy(
                model(stream[None, s : s + 32], **forward)[0], stream[s + 1 : s + 33], reduction="none"
            )
            for s in (0, 32, 64)
        ]
    )
    assert scored == pytest.approx(by_hand.mean().item(), rel=1e-5)


def test_restart_positions_needs_end_of_text(random_gpt):
    with pytest.raises(ValueError, match="give end_of_text too"):
        random_gpt({"kind": "rope"})(torch.zeros(1, 3, dtype=torch.long), restart_positions=True)


@pytest.mark.parametrize("kind", ["rope", "alibi", "shaw", "learned"])
def test_a_batch_masks_each_row_at_its_own_documents(random_gpt, kind):
    """Under shared positions the mask covers the whole batch at once: each row as if alone."""
    position = {"kind": kind, "values": True} if kind == "shaw" else {"kind": kind}
    model = random_gpt(position).eval()
    x = torch.randint(3, 97, (3, 24), generator=torch.Generator().manual_seed(5))
    x[0, 5], x[1, 12], x[1, 18] = EOT, EOT, EOT  # row 2: one document
    with torch.no_grad():
        together = model(x, end_of_text=EOT)
        alone = torch.cat([model(x[b : b + 1], end_of_text=EOT) for b in range(3)])
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-4)
