"""minilm.generation: sampling, the KV-cached decode loop (cached == uncached for every
position scheme, past the context too), incremental detokenization and stop strings."""

import warnings

import pytest
import torch

from minilm.config import ModelConfig
from minilm.generation import decode
from minilm.generation.decode import (
    Decoder,
    GenerationError,
    GenerationWarning,
    Sampling,
    Stats,
    context_size,
    generate_ids,
    generate_rows,
    repetition_penalty,
    sample,
)
from minilm.generation.lean import lean_body
from minilm.generation.text import TextStream, generate, generate_text
from minilm.model.gpt import GPT
from minilm.model.lora import add_adapters
from minilm.positions import available

GREEDY = Sampling(temperature=0)


def schemes():
    """Every registered kind; interpolated both over an unbounded (rope) and a bounded (learned) one;
    plus the rope scalings whose frequencies depend on the context length."""
    out = []
    for kind in available():
        if kind == "interpolated":
            out += [
                {"kind": kind, "base": {"kind": "rope"}, "factor": 2.0},
                {"kind": kind, "base": {"kind": "learned"}, "factor": 2.0},
            ]
        else:
            out.append({"kind": kind})
    out += [
        {"kind": "rope", "scaling": {"type": "dynamic", "factor": 2.0, "original_max_positions": 16}},
        {"kind": "rope", "scaling": {"type": "yarn", "factor": 2.0, "original_max_positions": 16}},
        {"kind": "rope", "scaling": {"type": "llama3", "factor": 2.0, "original_max_positions": 16}},
        {"kind": "shaw", "values": True, "max_distance": 6},
        {
            "kind": "rope",
            "scaling": {
                "type": "longrope",
                "original_max_positions": 16,
                "short_factor": [1.0, 1.5, 2.0, 3.0],
                "long_factor": [2.0, 4.0, 8.0, 16.0],
            },
        },
    ]
    return out


def scheme_id(position):
    base = position.get("base", {}).get("kind", "") if isinstance(position.get("base"), dict) else ""
    scaling = position.get("scaling", {}).get("type", "") if position.get("scaling") else ""
    return "-".join(p for p in (position["kind"], base, scaling) if p)


def greedy_tokens(model, prompt, n, **kw):
    return [
        t[0] for t in torch.stack(list(generate_ids(model, prompt, max_new_tokens=n, sampling=GREEDY, **kw))).tolist()
    ]


# --------------------------------------------------------------------------- cached == uncached


@pytest.mark.parametrize("position", schemes(), ids=scheme_id)
def test_cached_greedy_equals_no_cache_far_past_the_context(random_gpt, position):
    model = random_gpt(position, block_size=32)
    prompt = [5, 17, 42, 8, 61, 3, 29]
    cached = greedy_tokens(model, prompt, 200)
    uncached = greedy_tokens(model, prompt, 200, use_cache=False)
    assert len(prompt) + 200 > 6 * 32  # the window slid far
    assert cached == uncached
    assert len(set(cached)) >= 10  # the comparison is not vacuous: greedy decoding wanders


def reference_logits(model, seq, max_context):
    """Next-token logits straight from the model, written independently of the Decoder:
    sliding-window re-encoding for bounded schemes, banded causal attention otherwise."""
    idx = torch.tensor([seq])
    if model.positions.position_limit() is not None:
        return model(idx[:, -max_context:], context_len=max_context)[0, -1]
    return model(idx, window=max_context, context_len=max_context)[0, -1]


@pytest.mark.parametrize("kind", ["learned", "rope", "alibi", "t5"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_decoder_logits_match_the_model_run_on_the_whole_sequence(random_gpt, kind, use_cache):
    model = random_gpt({"kind": kind}, block_size=16)
    seq = torch.randint(0, 97, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    decoder = Decoder(model, 1, max_context=16, use_cache=use_cache)
    with torch.inference_mode():
        logits = decoder.prefill(torch.tensor([seq[:5]]))
        for t in range(5, len(seq) + 1):
            expected = reference_logits(model, seq[:t], 16)
            torch.testing.assert_close(logits[0], expected, rtol=1e-4, atol=1e-4)
            if t < len(seq):
                logits = decoder.step(torch.tensor([seq[t]]))


@pytest.mark.parametrize("kind", ["rope", "alibi", "sinusoidal"])
def test_prompt_longer_than_the_window_is_prefilled_in_chunks_of_the_window(random_gpt, kind):
    model = random_gpt({"kind": kind}, block_size=16)
    prompt = torch.randint(0, 97, (50,), generator=torch.Generator().manual_seed(1)).tolist()
    cached = greedy_tokens(model, prompt, 30)
    assert cached == greedy_tokens(model, prompt, 30, use_cache=False)
    with torch.inference_mode():
        first = reference_logits(model, prompt, 16).argmax().item()
    assert cached[0] == first


@pytest.mark.parametrize("kind", ["rope", "alibi"])
def test_left_padded_prompts_past_the_window_decode_as_each_alone(random_gpt, kind):
    """Two prompts of different lengths, both longer than the rolling window, in one batch (left-padded,
    prefilled in chunks): each row's greedy text is what it gets alone and what recomputation gives."""
    from minilm.generation.decode import generate_rows

    model = random_gpt({"kind": kind}, block_size=16)
    prompts = [torch.randint(0, 97, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (53, 37)]

    def greedy(rows, **kw):
        steps = generate_rows(model, rows, max_new_tokens=12, sampling=Sampling(temperature=0.0), max_context=16, **kw)
        return torch.stack(list(steps), dim=1).tolist()

    together = greedy(prompts)
    for row, prompt in zip(together, prompts):
        assert [row] == greedy([prompt]) == greedy([prompt], use_cache=False)


def test_a_prompt_of_many_windows_shows_its_prefill_progress(random_gpt, capsys):
    from minilm.generation.decode import PROGRESS_CHUNKS, generate_rows

    model = random_gpt({"kind": "rope"}, block_size=16)
    for windows, shown in ((PROGRESS_CHUNKS + 1, True), (3, False)):
        prompt = torch.randint(0, 97, (16 * windows,), generator=torch.Generator().manual_seed(2)).tolist()
        list(generate_rows(model, [prompt], max_new_tokens=1, sampling=Sampling(temperature=0.0), max_context=16))
        assert ("prefill" in capsys.readouterr().err) == shown


def test_dynamic_ntk_uses_the_same_context_length_with_and_without_cache(random_gpt):
    model = random_gpt(
        {"kind": "rope", "scaling": {"type": "dynamic", "factor": 2.0, "original_max_positions": 16}}, block_size=32
    )
    seq = torch.randint(0, 97, (20,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.inference_mode():
        decoder = Decoder(model, 1, max_context=32, use_cache=False)
        got = decoder.prefill(torch.tensor([seq]))[0]
        scaled = model(torch.tensor([seq]), context_len=32)[0, -1]
        unscaled = model(torch.tensor([seq]))[0, -1]  # context_len defaults to 20: another NTK base
    torch.testing.assert_close(got, scaled)
    assert not torch.allclose(got, unscaled, atol=1e-4)


def test_learned_prompt_longer_than_the_table_is_cropped_with_a_warning(random_gpt):
    model = random_gpt({"kind": "learned"}, block_size=16)
    prompt = list(range(40))
    with pytest.warns(GenerationWarning, match="last 16 tokens"):
        tokens = greedy_tokens(model, prompt, 20)
    assert tokens == greedy_tokens(model, prompt[-16:], 20)


def test_context_size_defaults_and_limits(random_gpt):
    assert context_size(random_gpt({"kind": "rope"}, block_size=32)) == 32
    assert context_size(random_gpt({"kind": "rope"}, block_size=32), 100) == 100  # relative: any window
    learned = random_gpt({"kind": "learned"}, block_size=32)
    assert context_size(learned) == 32
    with pytest.raises(GenerationError, match="at most 32 positions"):
        context_size(learned, 33)
    # interpolated over learned: a 16-row table stretched by 2 covers positions 0..30
    interp = random_gpt({"kind": "interpolated", "base": {"kind": "learned"}, "factor": 2.0}, block_size=32)
    assert context_size(interp) == 31
    with pytest.raises(GenerationError, match="max_context=0"):
        context_size(learned, 0)


def test_num_samples_are_decoded_as_one_batch(random_gpt):
    model = random_gpt({"kind": "rope"})
    steps = list(generate_ids(model, [1, 2, 3], max_new_tokens=40, sampling=GREEDY, num_samples=3))
    assert all(s.shape == (3,) for s in steps)
    tokens = torch.stack(steps)
    assert (tokens == tokens[:, :1]).all()  # greedy: identical samples
    assert tokens[:, 0].tolist() == greedy_tokens(model, [1, 2, 3], 40)
    sampled = torch.stack(
        list(
            generate_ids(
                model,
                [1, 2, 3],
                max_new_tokens=40,
                num_samples=3,
                seed=0,
                sampling=Sampling(temperature=1.0, top_k=None),
            )
        )
    )
    assert len({tuple(sampled[:, i].tolist()) for i in range(3)}) == 3


def test_seed_makes_sampling_reproducible(random_gpt):
    model = random_gpt({"kind": "alibi"})
    options = dict(max_new_tokens=30, sampling=Sampling(temperature=1.2, top_k=None), num_samples=2)
    a = torch.stack(list(generate_ids(model, [4, 5], seed=7, **options)))
    b = torch.stack(list(generate_ids(model, [4, 5], seed=7, **options)))
    c = torch.stack(list(generate_ids(model, [4, 5], seed=8, **options)))
    assert torch.equal(a, b) and not torch.equal(a, c)
    stats = Stats()
    list(generate_ids(model, [4, 5], stats=stats, **options))
    assert isinstance(stats.seed, int)  # a random seed is recorded so the run can be repeated
    again = torch.stack(list(generate_ids(model, [4, 5], seed=stats.seed, **options)))
    assert again.shape == a.shape


def test_stats_count_tokens_and_time(random_gpt):
    model = random_gpt({"kind": "rope"})
    stats = Stats()
    list(generate_ids(model, [1, 2, 3, 4], max_new_tokens=12, sampling=GREEDY, num_samples=2, stats=stats))
    assert (stats.prompt_tokens, stats.new_tokens, stats.num_samples) == (4, 12, 2)
    assert stats.prefill_seconds > 0 and stats.decode_seconds > 0
    lines = stats.lines()
    assert "prompt: 4 tokens, new: 12 tokens x 2 samples" in lines[0]
    assert "decode: 22 tokens" in lines[2]  # 11 steps after the prefill, 2 sequences
    assert lines[3].startswith("peak memory: ")


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(max_new_tokens=-1), "max_new_tokens=-1"),
        (dict(num_samples=0), "num_samples=0"),
        (dict(sampling=Sampling(temperature=-0.5)), "temperature=-0.5"),
        (dict(sampling=Sampling(top_p=0.0)), r"top_p=0.0 .*\(0, 1\]"),
        (dict(sampling=Sampling(top_p=1.5)), "top_p=1.5"),
        (dict(sampling=Sampling(top_k=-1)), "top_k=-1"),
        (dict(sampling=Sampling(repetition_penalty=0)), "repetition_penalty=0"),
        (dict(max_context=64), "at most 32 positions"),
    ],
)
def test_bad_settings_are_one_line_errors(random_gpt, bad, match):
    model = random_gpt({"kind": "learned"})
    with pytest.raises(GenerationError, match=match) as info:
        list(generate_ids(model, [1, 2], **bad))
    assert "\n" not in str(info.value)


def test_out_of_range_prompt_ids_are_an_error(random_gpt):
    with pytest.raises(GenerationError, match="token id 97 is out of range: valid ids are 0..96"):
        list(generate_ids(random_gpt({"kind": "rope"}), [1, 97], max_new_tokens=2))


def test_zero_new_tokens_yields_nothing(random_gpt):
    assert list(generate_ids(random_gpt({"kind": "rope"}), [1, 2], max_new_tokens=0)) == []


# --------------------------------------------------------------------------- sampling


def test_greedy_is_argmax_and_top_k_1_is_greedy():
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample(logits, GREEDY), logits.argmax(-1))
    g = torch.Generator().manual_seed(0)
    assert torch.equal(sample(logits, Sampling(temperature=5.0, top_k=1), g), logits.argmax(-1))


def test_top_k_keeps_only_the_k_most_likely():
    logits = torch.randn(1, 30, generator=torch.Generator().manual_seed(1)).expand(4000, -1)
    got = set(sample(logits, Sampling(temperature=3.0, top_k=4), torch.Generator().manual_seed(0)).tolist())
    assert got == set(logits[0].topk(4).indices.tolist())


def test_an_uncached_generation_past_the_window_says_what_it_will_cost(random_gpt, monkeypatch):
    """Without the cache a rolling scheme recomputes the whole sequence at every step: past the
    window that is said first, with the time estimated from the prompt's pass; a bounded scheme
    recomputes only its window, and a cached generation nothing: neither warns."""
    monkeypatch.setattr(decode, "RECOMPUTE_WARNING_SECONDS", 0.0)
    options = dict(max_new_tokens=3, sampling=Sampling(temperature=0), max_context=8)
    for position, use_cache, warns in (("rope", False, True), ("rope", True, False), ("learned", False, False)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", GenerationWarning)
            list(generate_ids(random_gpt({"kind": position}), list(range(1, 13)), use_cache=use_cache, **options))
        said = [str(w.message) for w in caught if "without the cache" in str(w.message)]
        assert bool(said) == warns and all("each of the 2 steps left recomputes all 12+ tokens" in s for s in said)


def test_top_k_0_keeps_every_token_as_transformers_reads_it():
    logits = torch.randn(1, 30, generator=torch.Generator().manual_seed(1)).expand(4000, -1)
    off = sample(logits, Sampling(temperature=3.0, top_k=0), torch.Generator().manual_seed(0))
    assert torch.equal(off, sample(logits, Sampling(temperature=3.0, top_k=None), torch.Generator().manual_seed(0)))
    assert len(set(off.tolist())) > 20


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    logits = probs.log().expand(4000, -1)
    g = torch.Generator().manual_seed(0)
    assert set(sample(logits, Sampling(temperature=1.0, top_k=None, top_p=0.75), g).tolist()) == {1, 3}
    assert set(sample(logits, Sampling(temperature=1.0, top_k=None, top_p=0.85), g).tolist()) == {1, 2, 3}
    assert set(sample(logits, Sampling(temperature=1.0, top_k=None, top_p=0.3), g).tolist()) == {1}
    assert set(sample(logits, Sampling(temperature=1.0, top_k=None, top_p=1.0), g).tolist()) == {0, 1, 2, 3}


def test_min_p_matches_transformers_and_keeps_what_reaches_p_times_the_top():
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    logits = probs.log().expand(4000, -1)
    g = torch.Generator().manual_seed(0)
    assert set(sample(logits, Sampling(temperature=1.0, top_k=None, min_p=0.5), g).tolist()) == {1, 3}
    assert set(sample(logits, Sampling(temperature=1.0, top_k=None, min_p=0.2), g).tolist()) == {1, 2, 3}
    assert set(sample(logits, Sampling(temperature=1.0, top_k=None, min_p=1.0), g).tolist()) == {1}
    warpers = pytest.importorskip("transformers.generation.logits_process")
    scores = torch.randn(64, 500, generator=torch.Generator().manual_seed(2)) * 3
    for min_p in (0.01, 0.1, 0.5):
        kept = warpers.MinPLogitsWarper(min_p=min_p)(None, scores.clone()).isfinite()
        draws = torch.stack(
            [sample(scores, Sampling(temperature=1.0, top_k=None, min_p=min_p), g) for _ in range(200)], dim=1
        )  # (64, 200) ids drawn per row
        assert kept.gather(1, draws).all()  # never a token transformers drops
        assert (kept.sum(dim=1) > 1).any()  # and the filter leaves a choice: the draws above mean something
    with pytest.raises(GenerationError, match="min_p=-0.1"):
        Sampling(min_p=-0.1).check()


def test_temperature_samples_follow_softmax_of_scaled_logits():
    logits = torch.tensor([[1.0, 0.0, -1.0]]).expand(20000, -1)
    g = torch.Generator().manual_seed(0)
    for temperature in (0.5, 2.0):
        counts = torch.bincount(sample(logits, Sampling(temperature=temperature, top_k=None), g), minlength=3)
        expected = (logits[0] / temperature).softmax(-1)
        assert torch.allclose(counts / 20000, expected, atol=0.015)


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    logits = torch.tensor([[2.0, -1.0, 1.0, -3.0]])
    seen = torch.tensor([[True, True, False, False]])
    assert torch.equal(repetition_penalty(logits, seen, 2.0), torch.tensor([[1.0, -2.0, 1.0, -3.0]]))
    # greedy with the penalty: token 0 (seen) drops from 2.0 to 0.8, below token 2
    assert sample(logits, Sampling(temperature=0, repetition_penalty=2.5), seen=seen).item() == 2


def test_repetition_penalty_in_the_loop_avoids_repeats(random_gpt):
    model = random_gpt({"kind": "rope"})
    plain = greedy_tokens(model, [1, 2, 3], 60)
    penalised = [
        t[0]
        for t in torch.stack(
            list(
                generate_ids(
                    model, [1, 2, 3], max_new_tokens=60, sampling=Sampling(temperature=0, repetition_penalty=1e6)
                )
            )
        ).tolist()
    ]
    assert len(set(penalised)) == 60 and len(set(plain)) < 60  # each token at most once (vocab 97)
    assert not set(penalised) & {1, 2, 3}  # the prompt's tokens count as present


# --------------------------------------------------------------------------- text


def test_text_stream_joins_to_the_decoded_continuation(gen_tokenizer):
    tok = gen_tokenizer
    prompt = tok.encode("ROMEO:")
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        ids = torch.randint(0, tok.vocab_size, (80,), generator=g).tolist()  # byte pieces included
        stream = TextStream(tok, prompt)
        pieces = [stream.push(t, final=i == len(ids) - 1) for i, t in enumerate(ids)]
        full = tok.decode(prompt + ids)
        assert "".join(pieces) == full[len(tok.decode(prompt)) :] == stream.text


def test_longrope_refill_decodes_as_uncached_or_is_refused(random_gpt):
    """Phi-3's LongRoPE (``switch: refill``) rotates every key again once the sequence passes L = 16: from
    a cache that holds more than L tokens the greedy text is the uncached text, prompts longer than the
    cache's window and with sinks included; where the refill cannot be one pass, or padded prompts of
    different lengths would pass L at different steps, the generation is refused in one line."""
    scaling = {"type": "longrope", "factor": 2, "short_factor": [1.0] * 4, "long_factor": [2.0, 3.0, 4.0, 5.0]}
    model = random_gpt({"kind": "rope", "scaling": {**scaling, "switch": "refill"}}, block_size=16)
    for prompt, options in ((6, {}), (30, {}), (30, {"sinks": 2, "sink_positions": "absolute"})):
        options = dict(max_new_tokens=20, max_context=24, **options)
        ids = [list(range(1, prompt + 1))]
        assert greedy_rows(model, ids, **options) == greedy_rows(model, ids, use_cache=False, **options)
    with pytest.raises(GenerationError, match="which a cache of 16 cannot hold: give --max-context above 16"):
        greedy_rows(model, [list(range(1, 7))], max_new_tokens=20)
    with pytest.raises(GenerationError, match="prompts of different lengths pass at different steps"):
        greedy_rows(model, [[1, 2, 3], [4, 5, 6, 7]], max_new_tokens=20, max_context=24)
    past = [list(range(1, 21)), list(range(3, 26))]  # both past L from the start: nothing left to pass
    together = greedy_rows(model, past, max_new_tokens=10, max_context=40)
    assert together == [greedy_rows(model, [p], max_new_tokens=10, max_context=40)[0] for p in past]


def greedy_rows(model, prompts, **options):
    return torch.stack(list(generate_rows(model, prompts, sampling=GREEDY, **options)), 1).tolist()


def test_rows_past_the_tokenizer_are_never_drawn(random_gpt, gen_tokenizer):
    """An embedding padded past the tokenizer (Pythia: 50,304 rows for 50,277 tokens): its extra rows are
    no tokens, so sampling and greedy decoding draw only the tokenizer's, even where those rows win."""
    tok = gen_tokenizer
    model = random_gpt({"kind": "rope"}, vocab_size=tok.vocab_size + 12)
    with torch.no_grad():
        model.lm_head.weight[tok.vocab_size :] *= 50  # the padding rows would take most of the mass
    for sampling in (Sampling(temperature=1.0, top_k=0), Sampling(temperature=0)):
        pieces = list(generate(model, tok, "ROMEO:", max_new_tokens=12, sampling=sampling, seed=1, stop_ids=()))
        assert len(pieces) == 12 and all(p.token < tok.vocab_size for p in pieces)
    padded = list(decode.generate_ids(model, tok.encode("ROMEO:"), max_new_tokens=12, seed=1))
    assert any(int(t) >= tok.vocab_size for t in padded)  # without the tokenizer's size every row is drawn


def test_text_stream_never_splits_a_multibyte_character(gen_tokenizer):
    tok = gen_tokenizer
    ids = tok.encode("ab €é ok")
    pieces_of = [tok.id_to_piece(i) for i in ids]
    assert "<0xE2><0x82><0xAC><0xC3><0xA9>" in "".join(pieces_of)  # byte fallback: 3 + 2 bytes
    stream = TextStream(tok, tok.encode("x"))
    pieces = [stream.push(t) for t in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == "ab €é ok"
    assert "€" in pieces and "é" in pieces  # each shown whole, once its last byte arrived
    # an incomplete character at the very end is flushed as the tokenizer decodes it
    stream = TextStream(tok, [])
    euro = [i for i in ids if tok.id_to_piece(i).startswith("<0xE2>")]
    assert stream.push(euro[0], final=True) == tok.decode(euro)


def test_stop_string_ends_the_text_before_it(gen_tokenizer):
    tok = gen_tokenizer
    ids = tok.encode("the king said: STOP now and more")
    stream = TextStream(tok, [], stop=["STOP"])
    pieces = []
    for t in ids:
        pieces.append(stream.push(t))
        if stream.stopped:
            break
    assert stream.text == "the king said: " == "".join(pieces)
    assert stream.push(ids[-1]) == ""  # nothing after the stop
    assert tok.decode(stream.tokens).startswith("the king said: ST")  # up to the token that completed it


def test_an_end_of_text_id_ends_the_stream_and_flushes_what_was_held(gen_tokenizer):
    tok = gen_tokenizer
    eos = tok.eos_id
    assert tok.stop_ids == (eos,)
    stream = TextStream(tok, [], stop=["kingdom"], stop_ids=[eos])
    shown = "".join(stream.push(t) for t in tok.encode("the king"))
    assert not shown.endswith("king")  # held back: it could begin "kingdom"
    assert shown + stream.push(eos) == "the king" == stream.text  # the end of text adds no text
    assert stream.stopped and stream.tokens[-1] == eos and stream.push(tok.encode("x")[0]) == ""
    ignoring = TextStream(tok, [], stop_ids=())
    ignoring.push(eos)
    assert not ignoring.stopped


def test_stop_prefix_is_held_back_until_it_is_not_a_stop(gen_tokenizer):
    tok = gen_tokenizer
    stream = TextStream(tok, [], stop=["kingdom", "\n\n"])
    shown = ""
    for t in tok.encode("the king said\nhi"):
        shown += stream.push(t)
        assert not shown.endswith("k") and not shown.endswith("\n")  # "k..." or "\n" could start a stop
    assert not stream.stopped
    assert shown + stream.push(tok.encode(".")[0], final=True) == "the king said\nhi."


def test_generate_streams_pieces_and_handles_stops_per_sample(random_gpt, gen_tokenizer):
    tok = gen_tokenizer
    model = random_gpt({"kind": "rope"}, vocab_size=tok.vocab_size)
    options = dict(max_new_tokens=60, num_samples=3, seed=3, sampling=Sampling(temperature=1.0, top_k=None))
    free = generate_text(model, tok, "ROMEO:", **options)
    stop = next(c for c in "etaoins" if sum(c in t for t in free) in (1, 2))  # some samples stop, some do not
    pieces = list(generate(model, tok, "ROMEO:", stop=[stop], **options))
    texts = ["".join(p.text for p in pieces if p.sample == i) for i in range(3)]
    for free_text, text in zip(free, texts):
        assert stop not in text
        assert text == free_text.split(stop)[0]  # same seed, same batch: the same continuation, cut
    done = [p for p in pieces if p.done]
    assert sorted(p.sample for p in done) == [0, 1, 2]  # each sample finishes exactly once
    assert max(sum(p.sample == i for p in pieces) for i in range(3)) == 60  # an unstopped one ran to the end


def test_generate_stops_early_when_every_sample_stopped(random_gpt, gen_tokenizer):
    tok = gen_tokenizer
    model = random_gpt({"kind": "alibi"}, vocab_size=tok.vocab_size)
    text = generate_text(model, tok, "ROMEO:", max_new_tokens=100, sampling=GREEDY)[0]
    stop = text[5:7]
    stats = Stats()
    cut = generate_text(model, tok, "ROMEO:", max_new_tokens=500, sampling=GREEDY, stop=[stop], stats=stats)[0]
    assert cut == text.split(stop)[0] and len(cut) <= 5
    assert stats.new_tokens < 100


def test_empty_prompt_starts_from_bos(random_gpt, gen_tokenizer):
    tok = gen_tokenizer
    model = random_gpt({"kind": "rope"}, vocab_size=tok.vocab_size)
    assert generate_text(model, tok, "", max_new_tokens=10, sampling=GREEDY) == generate_text(
        model, tok, [tok.bos_id], max_new_tokens=10, sampling=GREEDY
    )


def test_empty_prompt_without_bos_is_an_error():
    class NoBos:
        bos_id = None

        def encode(self, text):
            return []

    with pytest.raises(GenerationError, match="prompt is empty"):
        list(generate(None, NoBos(), "", max_new_tokens=3))


ROLLING = [
    p for p in schemes() if p["kind"] != "learned" and p.get("inner", p.get("base", {})).get("kind") != "learned"
]


def embeds(position) -> bool:
    return (
        position["kind"] == "sinusoidal" or position.get("inner", position.get("base", {})).get("kind") == "sinusoidal"
    )


@pytest.mark.slow
@pytest.mark.parametrize("position", ROLLING, ids=scheme_id)
def test_attention_sinks_cached_equals_no_cache_far_past_the_context(random_gpt, position):
    model = random_gpt(position, block_size=32)
    prompt = [5, 17, 42, 8, 61, 3, 29]
    cached = greedy_tokens(model, prompt, 200, sinks=4, sink_positions="absolute")
    uncached = greedy_tokens(model, prompt, 200, use_cache=False, sinks=4, sink_positions="absolute")
    assert cached == uncached and len(set(cached)) >= 5  # not vacuous: decoding wanders
    assert cached != greedy_tokens(model, prompt, 200)  # the sinks change what is seen past the context


# every scheme's numbering, cached and not, is pinned at every query below; decoding here
SINKS_DECODED = [{"kind": k} for k in ("rope", "alibi", "fire", "xpos")] + [
    {"kind": "rope", "scaling": {"type": "dynamic", "factor": 2.0, "original_max_positions": 16}}
]


@pytest.mark.parametrize("position", SINKS_DECODED, ids=scheme_id)
def test_sinks_at_cache_positions_cached_equals_no_cache_far_past_the_context(random_gpt, position):
    model = random_gpt(position, block_size=16)  # 4 windows past the context (uncached, each query is attended alone)
    prompt = [5, 17, 42, 8, 61, 3, 29]
    cached = greedy_tokens(model, prompt, 60, sinks=4, sink_positions="cache")
    uncached = greedy_tokens(model, prompt, 60, use_cache=False, sinks=4, sink_positions="cache")
    assert cached == uncached and len(set(cached)) >= 5


NUMBERED = [
    {"kind": "rope"},
    {"kind": "xpos"},
    {"kind": "fire"},
    {"kind": "alibi"},
    {"kind": "kerple"},
    {"kind": "shaw"},
    {"kind": "t5"},
    {"kind": "interpolated", "inner": {"kind": "rope"}, "factor": 2.0},
    {"kind": "rope", "scaling": {"type": "dynamic", "factor": 4.0, "original_max_positions": 4}},
]


@pytest.mark.parametrize("n_kv_head", [None, 1])
@pytest.mark.parametrize("position", NUMBERED, ids=scheme_id)
def test_sinks_at_cache_positions_are_where_the_paper_puts_them(position, n_kv_head):
    """StreamingLLM numbers positions within the cache. In one layer, every query of a stream
    (before, at and after its window fills; cached and not) therefore sees exactly what the same
    model sees in a fresh sequence: the tokens so far while they fit the window, then the sinks
    followed by the window (sinks at 0..S-1, the window at S..W-1). With absolute positions
    it does not."""
    torch.manual_seed(0)
    model = GPT(
        ModelConfig(
            n_layer=1, n_head=4, d_model=32, block_size=16, vocab_size=50, position=position, n_kv_head=n_kv_head
        )
    ).eval()
    with torch.no_grad():  # learned position parameters away from their start, so that every one matters
        for p in model.positions.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    window, sinks, n = 10, 3, 40
    idx = torch.randint(0, 50, (2, n), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        streamed = model(idx, window=window, sinks=sinks, sink_positions="cache", context_len=window)
        cache = model.new_cache(2, window, rolling=True, sinks=sinks, sink_positions="cache")
        cached = torch.cat(
            [model(idx[:, :5], cache, context_len=window)]
            + [model(idx[:, t : t + 1], cache, context_len=window) for t in range(5, n)],
            dim=1,
        )
        for p in range(n):
            seen = (
                idx[:, : p + 1]
                if p < window
                else torch.cat([idx[:, :sinks], idx[:, p - window + sinks + 1 : p + 1]], 1)
            )
            fresh = model(seen, context_len=window)[:, -1]
            torch.testing.assert_close(streamed[:, p], fresh, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(cached[:, p], fresh, rtol=1e-5, atol=1e-5)
        absolute = model(idx, window=window, sinks=sinks, sink_positions="absolute", context_len=window)
    if position["kind"] in ("rope", "xpos", "fire", "alibi", "kerple"):
        assert not torch.allclose(absolute[:, -1], streamed[:, -1], rtol=1e-5, atol=1e-6)


def test_sink_positions_change_rope_generation_far_past_the_context(random_gpt):
    model = random_gpt({"kind": "rope"}, block_size=32)
    prompt = [5, 17, 42, 8, 61, 3, 29]
    assert greedy_tokens(model, prompt, 200, sinks=4) != greedy_tokens(
        model, prompt, 200, sinks=4, sink_positions="absolute"
    )


def test_sinks_keep_the_first_tokens_in_view(random_gpt):
    model = random_gpt({"kind": "rope"}, block_size=16)
    idx = torch.randint(0, 97, (1, 60), generator=torch.Generator().manual_seed(0))
    other = idx.clone()
    other[0, 1] = (idx[0, 1] + 1) % 97  # change a token that is far behind the last query
    with torch.no_grad():
        plain = [model(x, window=16, context_len=16)[0, -1] for x in (idx, other)]
        sunk = [model(x, window=16, sinks=2, context_len=16)[0, -1] for x in (idx, other)]
    assert torch.equal(plain[0], plain[1])  # out of the window: no influence
    assert not torch.allclose(sunk[0], sunk[1])  # a sink: still seen


def test_bad_sinks(random_gpt):
    with pytest.raises(GenerationError, match="sink_tokens=32 leaves no room"):
        list(generate_ids(random_gpt({"kind": "rope"}), [1, 2], max_new_tokens=2, sinks=32))
    with pytest.raises(GenerationError, match="learned positions are bounded"):
        list(generate_ids(random_gpt({"kind": "learned"}), [1, 2], max_new_tokens=2, sinks=2))
    with pytest.raises(GenerationError, match="sink_positions='middle' is invalid: expected one of cache, absolute"):
        list(generate_ids(random_gpt({"kind": "rope"}), [1, 2], max_new_tokens=2, sinks=2, sink_positions="middle"))
    with pytest.raises(
        GenerationError, match="sinusoidal positions are added to the embeddings: use sink_positions=ab"
    ):
        list(generate_ids(random_gpt({"kind": "sinusoidal"}), [1, 2], max_new_tokens=2, sinks=2))
    with pytest.raises(GenerationError, match="compiled step keeps absolute positions"):
        list(generate_ids(random_gpt({"kind": "rope"}), [1, 2], max_new_tokens=2, sinks=2, compile=True))
    with pytest.raises(ValueError, match="sinusoidal positions are added to the embeddings"):
        random_gpt({"kind": "sinusoidal"})(torch.zeros(1, 4, dtype=torch.long), window=2, sinks=1)


ARCHITECTURES = [  # (name, ModelConfig options): every option the lean step reads
    ("plain", {}),
    ("gqa", {"n_kv_head": 1}),
    ("qk_norm-gqa", {"qk_norm": True, "n_kv_head": 1}),
    ("rmsnorm-swiglu-parallel", {"norm": "rmsnorm", "mlp": "swiglu", "parallel_residual": True}),
    ("values-relu2-softcap-bias", {"value_embeddings": True, "mlp": "relu2", "logit_softcap": 15.0, "bias": True}),
    ("sandwich-geglu-parallel", {"sublayer_norms": "sandwich", "mlp": "geglu_tanh", "parallel_residual": True}),
    ("post-norms-qknorm", {"sublayer_norms": "post", "qk_norm": True}),
    ("qknorm-projection-gqa", {"qk_norm": True, "qk_norm_span": "projection", "n_kv_head": 1}),
]
LEAN_POSITIONS = [
    {"kind": kind} for kind in ("rope", "xpos", "alibi", "t5", "shaw", "fire", "kerple", "sinusoidal", "none")
]
LEAN_POSITIONS.append({"kind": "rope", "scaling": {"type": "dynamic", "factor": 2.0, "original_max_positions": 8}})
CACHES = {
    "cache": {},
    "rolling": {"rolling": True},
    "rolling-sinks": {"rolling": True, "sinks": 2, "sink_positions": "absolute"},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cache_kind", list(CACHES))
@pytest.mark.parametrize("arch", ARCHITECTURES, ids=[name for name, _ in ARCHITECTURES])
@pytest.mark.parametrize("position", LEAN_POSITIONS, ids=scheme_id)
def test_the_lean_decode_step_equals_the_model_bit_for_bit(position, arch, cache_kind, dtype):
    """``lean_body``'s decode steps give exactly the modules' logits, past a rolling cache's wrap too,
    and the steps do not go through the modules (their parts are read once)."""
    torch.manual_seed(0)
    model = (
        GPT(ModelConfig(vocab_size=61, n_layer=2, n_head=2, d_model=16, block_size=24, position=position, **arch[1]))
        .to(dtype)
        .eval()
    )
    ids = torch.randint(0, 61, (2, 30))
    settings = CACHES[cache_kind]
    capacity = 12 if settings else 30
    with torch.no_grad():
        cache = model.new_cache(2, capacity, **settings)
        model(ids[:, :6], cache)
        expected = [model(ids[:, t : t + 1], cache) for t in range(6, 30)]
        lean, calls = lean_body(model), []
        model.blocks[0].register_forward_pre_hook(lambda module, args: calls.append(args[0].shape[:2]))
        cache = model.new_cache(2, capacity, **settings)
        model(ids[:, :6], cache, body=lean)  # a prefill of 6 tokens: the general path
        got = [model(ids[:, t : t + 1], cache, body=lean) for t in range(6, 30)]
    assert calls == [(2, 6)]
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


def test_generation_decodes_with_the_lean_step():
    """Every cached step of ``generate_ids`` after the prefill runs through the lean loop."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=61, n_layer=2, n_head=2, d_model=16, block_size=24)).eval()
    calls = []
    model.blocks[0].register_forward_pre_hook(lambda module, args: calls.append(args[0].shape[:2]))
    assert len(list(generate_ids(model, [1, 2, 3], max_new_tokens=20, sampling=GREEDY))) == 20
    assert calls == [(1, 3)]


def test_the_lean_decode_step_adds_a_models_adapters():
    """A model with LoRA adapters not yet merged (``add_adapters``, adapters trained away from zero)
    decodes through the lean step to the modules' logits: its parts keep the adapters."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=61, n_layer=2, n_head=2, d_model=16, block_size=24, mlp="swiglu")).eval()
    ids = torch.randint(0, 61, (1, 16))
    with torch.no_grad():
        base = model(ids)
    add_adapters(model, ["q", "v", "o", "mlp"], r=4, alpha=8)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_b" in name:
                param.normal_()
    model.eval()
    with torch.no_grad():
        full = model(ids)
        cache, lean = model.new_cache(1, 16), lean_body(model)
        model(ids[:, :6], cache, body=lean)
        got = torch.cat([model(ids[:, t : t + 1], cache, body=lean) for t in range(6, 16)], dim=1)
    assert (full - base).abs().max() > 0.1  # the adapters change what the model says
    torch.testing.assert_close(got, full[:, 6:], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "position", schemes() + [{"kind": "interpolated", "base": {"kind": "fire"}, "factor": 2.0}], ids=scheme_id
)
def test_every_scheme_runs_in_bf16_close_to_float32_and_decodes(position):
    """A model cast to bf16 (``generate --dtype bfloat16``) runs under every scheme, its full-sequence
    logits within bf16's rounding of the float32 model's (a scheme with its own layers takes bf16 inputs:
    fire, and interpolated over it), and it decodes from its cache."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=61, n_layer=2, n_head=4, d_model=32, block_size=24, position=position)).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids)
        half = model.to(torch.bfloat16)(ids).float()
    assert (half - full).abs().max() < 0.01 < full.abs().max()  # logits of about 0.4: bf16 rounds by about 0.002
    assert len(list(generate_ids(model, [1, 2, 3], max_new_tokens=30, sampling=GREEDY))) == 30
