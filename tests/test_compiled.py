"""The static KV cache (every slot attended, empty ones masked by position) and the decode
step compiled by torch.compile (minilm.generation.compiled): the same logits and greedy tokens as the
eager cache, past the context too, and a fresh compile whenever the weights change. As training
runs: rope's tables reaching a compiled body as its inputs, the compiled step equal to the eager
one, when ``train.compile`` compiles, and forward passes that compile whole (no graph breaks)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from minilm.config import TrainConfig
from minilm.generation.compiled import compiled_body
from minilm.generation.decode import Decoder, GenerationError, Sampling, Stats, generate_ids
from minilm.model.attention import WRITTEN_OUT_MAX, written_out_pays
from minilm.positions import available
from minilm.training.loop import COMPILE_PAYS_AFTER, TrainingError, compiles, train
from tests.conftest import REPO, tiny_overrides

GREEDY = Sampling(temperature=0)
# a compiled pass writes short causal attention out where eager runs SDPA's kernel: float32 sums in another order
AS_EAGER = dict(rtol=1e-4, atol=1e-4)


def greedy_tokens(model, prompt, n, **kw):
    return [
        t[0] for t in torch.stack(list(generate_ids(model, prompt, max_new_tokens=n, sampling=GREEDY, **kw))).tolist()
    ]


def cached_logits(model, seq, capacity, static):
    """Next-token logits after every prefix of ``seq`` (from the 4th token on), fed through one cache."""
    rolling = model.positions.position_limit() is None
    cache = model.new_cache(1, capacity, rolling=rolling, static=static)
    idx = torch.tensor([seq])
    out = [model(idx[:, :4], cache)[0, -1]]
    for t in range(4, len(seq)):
        out.append(model(idx[:, t : t + 1], cache)[0, -1])
    return torch.stack(out)


@pytest.mark.parametrize("kind", available())
def test_static_cache_gives_the_logits_of_the_growing_cache(random_gpt, kind):
    position = {"kind": kind, "base": {"kind": "rope"}, "factor": 2.0} if kind == "interpolated" else {"kind": kind}
    model = random_gpt(position, block_size=16).eval()
    bounded = model.positions.position_limit() is not None
    seq = torch.randint(0, 97, (16 if bounded else 40,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.inference_mode():  # unbounded schemes roll past the 16 slots: empty slots, then a full ring
        growing = cached_logits(model, seq, 16, static=False)
        static = cached_logits(model, seq, 16, static=True)
    torch.testing.assert_close(static, growing, rtol=1e-4, atol=1e-4)  # the same sums in another order


@pytest.mark.slow
@pytest.mark.parametrize("position", [{"kind": "rope"}, {"kind": "alibi"}], ids=["rope", "alibi"])
def test_compiled_decoding_equals_eager_decoding_past_the_context(random_gpt, position):
    model = random_gpt(position, block_size=16)
    prompt = [5, 17, 42, 8, 61, 3, 29]
    eager = greedy_tokens(model, prompt, 40)
    stats = Stats()
    assert (
        greedy_tokens(model, prompt, 40, compile=True, stats=stats) == eager
    )  # 47 tokens through a 16-slot rolling cache
    assert len(set(eager)) >= 5
    lines = stats.lines()  # the step that compiled is reported apart, not inside the decode rate
    assert lines[2].startswith("compile: the first decode step took") and lines[3].startswith("decode: 38 tokens in")
    seq = torch.randint(0, 97, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        decoders = [Decoder(model, 1, max_context=16, compile=compile) for compile in (False, True)]
        logits = [d.prefill(torch.tensor([seq[:3]])) for d in decoders]
        for token in seq[3:]:
            torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-4)
            logits = [d.step(torch.tensor([token])) for d in decoders]


@pytest.mark.slow
def test_the_compiled_step_is_reused_until_a_weight_changes(random_gpt):
    model = random_gpt({"kind": "rope"}, block_size=16)
    first = compiled_body(model)
    assert compiled_body(model) is first
    with torch.no_grad():
        model.blocks[0].mlp.fc.weight.mul_(3.0)  # what an optimiser step does: in place
    assert compiled_body(model) is not first
    prompt = [1, 2, 3, 4]
    assert greedy_tokens(model, prompt, 12, compile=True) == greedy_tokens(model, prompt, 12)


def test_compile_needs_the_cache(random_gpt):
    model = random_gpt({"kind": "rope"}, block_size=16)
    with pytest.raises(GenerationError, match="compile=True compiles the cached decode step: it needs use_cache=True"):
        greedy_tokens(model, [1, 2], 3, compile=True, use_cache=False)


@pytest.mark.parametrize(
    "position",
    [
        {"kind": "learned"},
        {"kind": "rope"},
        {"kind": "interpolated", "inner": {"kind": "learned"}, "factor": 2.0},
        {"kind": "randomized", "inner": {"kind": "learned"}},
    ],
    ids=["learned", "rope", "interpolated", "randomized"],
)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_a_forward_pass_compiles_whole(random_gpt, position, training):
    """The whole forward pass compiles too (torch.compile of the model, as a user may): the position check
    and the position hooks leave no graph break (fullgraph=True fails on one), and the logits are the eager ones."""
    model = random_gpt(position, block_size=16).train(training)  # dropout 0: the same function in both modes
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))  # within every table
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    torch.manual_seed(1)
    got = compiled(idx)
    torch.manual_seed(1)
    torch.testing.assert_close(got, model(idx), **AS_EAGER)


def test_rope_tables_reach_a_compiled_body_as_inputs(random_gpt):
    """GPT.forward starts rope's pass before the body: a compiled body is handed the cos/sin tables,
    and computes no cos or sin of its own (folded into every rotated element, they cost more than the
    rotation), with the eager logits."""
    model = random_gpt({"kind": "rope"}, block_size=16)
    torch._dynamo.reset()  # GPT.body's code compiled by the tests before (decoding) holds its own cache entries
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(str(graph_module.graph))
        return graph_module.forward

    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    got = model(idx, body=torch.compile(model.body, backend=capture))
    assert len(graphs) == 1  # one graph: no break
    assert not any(op in graphs[0] for op in ("torch.cos", "torch.sin", ".cos()", ".sin()"))
    torch.testing.assert_close(got, model(idx), **AS_EAGER)


def test_a_compiled_cpu_pass_writes_short_attention_out(random_gpt):
    """A compiled pass on the CPU over at most WRITTEN_OUT_MAX tokens writes causal attention out (two
    products and a float32 softmax, which inductor fuses; faster than SDPA's CPU flash kernel on an EPYC
    without AMX) with the eager pass's logits, SDPA's; a longer one keeps SDPA's causal kernel (no T x T
    scores). Eager passes never write it out."""
    model = random_gpt({"kind": "rope"}, block_size=WRITTEN_OUT_MAX + 8)
    for length, writes in ((12, True), (WRITTEN_OUT_MAX, True), (WRITTEN_OUT_MAX + 1, False)):
        torch._dynamo.reset()
        graphs = []

        def capture(graph_module, example_inputs):
            graphs.append(str(graph_module.graph))
            return graph_module.forward

        idx = torch.randint(0, 97, (1, length), generator=torch.Generator().manual_seed(length))
        got = model(idx, body=torch.compile(model.body, backend=capture))
        assert ("scaled_dot_product_attention" not in graphs[0]) == writes, length
        torch.testing.assert_close(got, model(idx), **AS_EAGER)
    assert not written_out_pays(torch.zeros(1, 1, 12, 8))  # eager: SDPA


@pytest.mark.slow
def test_a_compiled_run_trains_as_the_eager_run(tiny_config, monkeypatch):
    """train.compile=true (GPT.body compiled): every training pass runs the compiled body, and in
    float32 the losses are the eager run's, step by step, with the same held-out figure at the end."""
    runs, calls, real = {}, [], torch.compile

    def counted(fn, **options):  # the compiled function, counting the passes that run it
        compiled = real(fn, **options)

        def run(*args, **kwargs):
            calls.append(fn.__name__)
            return compiled(*args, **kwargs)

        return run

    monkeypatch.setattr(torch, "compile", counted)
    for compile in ("false", "true"):
        config = tiny_config(f"train.compile={compile}", "train.max_steps=6", out=f"run-{compile}")
        summary = train(config, quiet=True)
        with open(os.path.join(config.out_dir, "metrics.jsonl")) as f:
            losses = [r["loss"] for r in map(json.loads, f) if r.get("event") == "train"]
        runs[compile] = (losses, summary["final_val_loss"])
        assert calls == ([] if compile == "false" else ["body"] * 6)  # one compiled pass a step, evaluation eager
    assert runs["true"][0] == pytest.approx(runs["false"][0], rel=1e-4)
    assert runs["true"][1] == pytest.approx(runs["false"][1], rel=1e-4)


def test_when_a_run_compiles(monkeypatch):
    """train.compile: false never; auto from COMPILE_PAYS_AFTER steps on a CPU where the C++ compiler is
    found ($CXX), in bf16 or float16 autocast (a float32 step was no faster compiled), not under FSDP, nor
    on CUDA or MPS (where it was not measured); true always, refused in one line where that compiler is
    missing."""
    cpu, bf16, f32 = torch.device("cpu"), torch.bfloat16, torch.float32
    monkeypatch.setenv("CXX", sys.executable)  # a program that exists
    assert not compiles(TrainConfig(compile=False, max_steps=10**6), cpu, bf16)
    assert not compiles(TrainConfig(compile="auto", max_steps=COMPILE_PAYS_AFTER - 1), cpu, bf16)
    assert compiles(TrainConfig(compile="auto", max_steps=COMPILE_PAYS_AFTER), cpu, bf16)
    assert compiles(TrainConfig(compile="auto", max_steps=COMPILE_PAYS_AFTER), cpu, torch.float16)
    assert not compiles(TrainConfig(compile="auto", max_steps=COMPILE_PAYS_AFTER), cpu, f32)
    assert not compiles(TrainConfig(compile="auto", max_steps=COMPILE_PAYS_AFTER), cpu, bf16, sharded=True)
    for device in ("cuda", "mps"):
        assert not compiles(TrainConfig(compile="auto", max_steps=10**6), torch.device(device), bf16)
        assert compiles(TrainConfig(compile=True, max_steps=5), torch.device(device), f32)
    assert compiles(TrainConfig(compile=True, max_steps=5), cpu, f32)
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert not compiles(TrainConfig(compile="auto", max_steps=10**6), cpu, bf16)
    with pytest.raises(TrainingError, match=r"^train.compile=true compiles .* no-such-compiler-here was not found"):
        compiles(TrainConfig(compile=True, max_steps=5), cpu, f32)


@pytest.mark.slow
def test_train_compile_true_without_a_compiler_is_one_line(tiny_corpus, tmp_path):
    """From the command line: exit status 2 and the missing compiler named, before any step."""
    argv = [sys.executable, "train.py", *tiny_overrides(tiny_corpus, tmp_path / "run", "train.compile=true")]
    env = dict(os.environ, CXX="no-such-compiler-here")
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "no-such-compiler-here was not found" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "run" / "ckpt.pt").exists()
