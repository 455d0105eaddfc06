"""Decode speed of KV-cached generation against the weights-only floor: ours with the cache,
ours with the compiled step (``--compile``), ours without a cache (--no-cache), and Hugging
Face transformers' ``generate`` on a LlamaForCausalLM of the same shape, in one run.

    python bench/bench_generate.py                      # 6 layers x 384 x 6 heads, vocab 4096
    python bench/bench_generate.py --threads 1 --repeats 5
    python bench/bench_generate.py --dtype bfloat16 --no-hf --no-uncached

Every model has random weights (speed does not depend on them), batch 1, greedy decoding
of ``--new`` tokens after a ``--prompt``-token prompt, all forced (HF: min_new_tokens).
Decode tokens/s = (new tokens - 1) / time from the first new token to the last one (the
first comes out of the prefill), measured through the public API (``generate_ids``; for
HF a streamer timestamps the first token), by the wall clock and per CPU-second of this
process. Best of ``--repeats`` runs. A second floor adds to the matmuls one query's attention
over a full KV cache per layer (prompt + new slots, in the cache's dtype): the bytes a static
cache's compiled step must read at every token besides the weights, so ours compiled is also
shown as a share of it. The floors, ours and ours compiled are measured in turn within each
repeat (floor, floor with cache, cached, compiled, floor, ...), so a slow spell of a shared
machine slows all of them alike; the share of the floor is printed both as best over best and
as the median of the per-repeat shares, the figure to quote on a noisy machine. HF runs last: its
generate, run between ours, was seen to slow the runs of both on a 2-core CPU.
The HF model is LLaMA-style (RMSNorm, SwiGLU MLP with intermediate size 8/3 * d_model so
it has the same parameter count as our 4 * d_model GELU MLP, untied heads off: tied like
ours, SDPA attention). transformers is optional (``pip install -e ".[bench]"``).

Then decode tokens/s at cache lengths of 1x, 4x and 16x (prompt + new): prompts of
length - new tokens, so that the cache ends at that length. It ends with one line: the
default decode (what ``generate`` runs without flags: the eager step with a KV cache)
against both floors.

``--break-even`` measures when compiling pays off: the compile time (the first compiled decode
step, in a fresh process, with an empty inductor cache and again with the cache it left) and
the eager and compiled seconds per token; break-even = compile seconds / (eager - compiled
seconds per token), the new tokens from which compiling would save time overall.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minilm import GPT, ModelConfig  # noqa: E402
from minilm.generation.decode import Sampling, Stats, generate_ids  # noqa: E402

GREEDY = Sampling(temperature=0)


class Rate(tuple):
    """(wall, cpu) decode tokens/s: by the clock, and by this process's CPU time (less
    sensitive to other processes on a shared machine; with one thread it is our own work)."""

    def __new__(cls, tokens, wall_seconds, cpu_seconds):
        return super().__new__(cls, (tokens / wall_seconds, tokens / max(cpu_seconds, 1e-9)))


def ours(model, prompt, new, *, use_cache=True, max_context=None, compile=False, stats=None) -> Rate:
    """Decode rate of ``generate_ids``: from the first new token to the last."""
    for step, _ in enumerate(
        generate_ids(
            model,
            prompt,
            max_new_tokens=new,
            sampling=GREEDY,
            use_cache=use_cache,
            max_context=max_context,
            compile=compile,
            stats=stats,
        )
    ):
        if step == 0:
            wall, cpu = time.perf_counter(), time.process_time()
    return Rate(new - 1, time.perf_counter() - wall, time.process_time() - cpu)


class FirstTokenClock:
    """A transformers streamer that notes when the first new token arrives."""

    def __init__(self):
        self.calls, self.first = 0, None

    def put(self, value):
        self.calls += 1
        if self.calls == 2:  # the first call carries the prompt
            self.first = (time.perf_counter(), time.process_time())

    def end(self):
        pass


def hf_model(args):
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.d_model,
        intermediate_size=args.d_model * 8 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=args.prompt + args.new,
        tie_word_embeddings=True,
    )
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).eval().to(getattr(torch, args.dtype))


def hf_decode_rate(model, prompt, new) -> float:
    ids = torch.tensor([prompt])
    clock = FirstTokenClock()
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            use_cache=True,
            streamer=clock,
            pad_token_id=0,
        )
    wall, cpu = time.perf_counter(), time.process_time()
    assert out.shape[1] == len(prompt) + new
    return Rate(new - 1, wall - clock.first[0], cpu - clock.first[1])


def best(rates):
    """The best wall-clock and the best CPU-time rate of several runs."""
    return max(r[0] for r in rates), max(r[1] for r in rates)


def median_share(rates, floor) -> float:
    """The median of the per-repeat shares rates[i] / floor[i] (wall clock)."""
    return statistics.median(r[0] / f[0] for r, f in zip(rates, floor))


def share_of_floor(rates, floor) -> str:
    """Best over best, and the median of the per-repeat shares (rates[i] / floor[i])."""
    per_repeat = sorted(r[0] / f[0] for r, f in zip(rates, floor))
    listed = " ".join(f"{x:.0%}" for x in per_repeat)
    return (
        f"{best(rates)[0] / best(floor)[0]:.0%} of the floor "
        f"(per repeat: median {median_share(rates, floor):.0%}, {listed})"
    )


def show(name, rates, note=""):
    wall, cpu = best(rates)
    runs = ", ".join(f"{r[0]:.0f}" for r in rates)
    print(f"{name:23s} {wall:8.1f} tokens/s  ({cpu:7.1f} per CPU-second)  runs: {runs}{note}")


def show_floors(floor, cache_floor, total: int) -> None:
    show("matmuls alone (floor):", floor, "   (weights read once per token)")
    show(
        "+ attention, full cache:",
        cache_floor,
        f"   (and a {total}-slot KV cache read per token: {median_share(cache_floor, floor):.0%} of the matmuls' rate)",
    )


def show_compiled(compiled, floor, cache_floor, compile_seconds: float) -> None:
    show("ours, --compile:", compiled, f"   -> {share_of_floor(compiled, floor)}; compiled in {compile_seconds:.0f} s")
    print(
        f"{'':23s} -> {median_share(compiled, cache_floor):.0%} of the floor with the full-cache attention "
        f"(median per repeat)"
    )


@torch.inference_mode()
def weights_floor(model, steps: int, cache_length: int = 0) -> Rate:
    """Tokens/s of the model's matrix-vector products alone (every nn.Linear once per token,
    the LM head included, no attention, no norms, no Python around them): with weights
    larger than the CPU caches this is the memory-bandwidth floor of batch-1 decoding.
    With ``cache_length`` L, also one query's attention over L cached keys and values per
    layer, in the dtype the cache holds: the floor of a step that reads a full KV cache
    of L slots, as the compiled step's static cache does at every token."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(1, 1, m.in_features, dtype=m.weight.dtype) for m in layers]
    cache = model.new_cache(1, cache_length) if cache_length else None  # the shape and dtype generation uses
    held = list(zip(cache.keys, cache.values)) if cache else []
    queries = [torch.randn_like(k[:, :, :1]) for k, _ in held]
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        for layer, x in zip(layers, inputs):
            layer(x)
        for q, (k, v) in zip(queries, held):
            F.scaled_dot_product_attention(q, k, v)
    return Rate(steps, time.perf_counter() - wall, time.process_time() - cpu)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--d-model", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--position", default="rope", help="position kind of our model (default rope)")
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3, help="runs per cached measurement; the best counts")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--growth", default="1,4,16", help="cache lengths as multiples of prompt + new")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled step (ours, --compile)")
    p.add_argument("--no-uncached", action="store_true", help="skip the slow --no-cache measurement")
    p.add_argument(
        "--break-even",
        action="store_true",
        help="only measure the new tokens from which compiling the decode step pays off",
    )
    p.add_argument("--compile-seconds", action="store_true", help=argparse.SUPPRESS)  # one compile, in a child
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    total = args.prompt + args.new
    multiples = [int(m) for m in args.growth.split(",") if m]
    longest = total * max(multiples + [1])
    config = ModelConfig(
        vocab_size=args.vocab,
        n_layer=args.layers,
        n_head=args.heads,
        d_model=args.d_model,
        block_size=longest,
        position={"kind": args.position},
    )
    model = GPT(config).eval().to(getattr(torch, args.dtype))
    prompt = torch.randint(0, args.vocab, (args.prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    print(
        f"model: {args.layers} layers x {args.d_model} wide x {args.heads} heads, vocab {args.vocab}, "
        f"{args.position} positions, {model.num_params() / 1e6:.1f}M params, {args.dtype}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(f"batch 1, greedy, {args.new} new tokens after a {args.prompt}-token prompt; best of {args.repeats}")

    ours(model, prompt, 8, max_context=total)  # warm-up
    if args.compile_seconds:
        stats = Stats()
        ours(model, prompt, args.new, max_context=total, compile=True, stats=stats)
        print(f"compile seconds: {stats.compile_seconds}")  # the shape of the timed runs: args.new new tokens
        return
    if args.break_even:
        break_even(args, model, prompt, total, argv)
        return
    if not args.no_compile:
        start = time.perf_counter()
        ours(model, prompt, args.new, max_context=total, compile=True)  # compiles (for this cache size)
        compile_seconds = time.perf_counter() - start
    floor, cache_floor, cached, compiled = [], [], [], []
    for _ in range(args.repeats):  # in turn, so that the machine's drift touches all of them alike
        floor.append(weights_floor(model, args.new))
        cache_floor.append(weights_floor(model, args.new, cache_length=total))
        cached.append(ours(model, prompt, args.new, max_context=total))
        if not args.no_compile:
            compiled.append(ours(model, prompt, args.new, max_context=total, compile=True))
    show_floors(floor, cache_floor, total)
    floor_wall = best(floor)[0]
    ours_wall, ours_cpu = best(cached)
    show("ours, KV cache:", cached, f"   -> {share_of_floor(cached, floor)}")
    if not args.no_compile:
        show_compiled(compiled, floor, cache_floor, compile_seconds)
    if not args.no_uncached:
        uncached = [ours(model, prompt, args.new, use_cache=False, max_context=total)]
        wall, cpu = best(uncached)
        show(
            "ours, --no-cache:",
            uncached,
            f"   -> the cache is {ours_wall / wall:.1f}x faster ({ours_cpu / cpu:.1f}x per CPU-second)",
        )
    hf = None if args.no_hf else hf_model(args)
    if hf is None and not args.no_hf:
        print('transformers is not installed: skipping the HF comparison (pip install -e ".[bench]")')
    if hf is not None:
        hf_decode_rate(hf, prompt, 8)  # warm-up
        reference = [hf_decode_rate(hf, prompt, args.new) for _ in range(args.repeats)]
        wall, cpu = best(reference)
        show(
            "HF LlamaForCausalLM:",
            reference,
            f"   -> ours is {ours_wall / wall:.1f}x faster "
            f"({ours_cpu / cpu:.1f}x per CPU-second), {wall / floor_wall:.0%} "
            f"of the floor",
        )

    print(f"decode tokens/s as the cache grows ({args.new} new tokens, cache ending at the length shown):")
    for m in multiples:
        length = total * m
        long_prompt = torch.randint(
            0, args.vocab, (length - args.new,), generator=torch.Generator().manual_seed(m)
        ).tolist()
        line = f"  {m:3d}x  cache length {length:6d}:"
        for compile in (False, True)[: 1 if args.no_compile else 2]:
            if compile:  # a new cache size is a new compiled step: compile it before timing
                ours(model, long_prompt, args.new, max_context=length, compile=True)
            wall, cpu = best(
                [ours(model, long_prompt, args.new, max_context=length, compile=compile) for _ in range(args.repeats)]
            )
            line += f"  {'compiled' if compile else 'eager'} {wall:7.1f} tokens/s ({cpu:6.1f} per CPU-second)"
        print(line)
    print(
        f"default decode (no flags: eager, KV cache; {args.new} new tokens, {args.dtype}): {best(cached)[0]:.1f} "
        f"tokens/s = {median_share(cached, cache_floor):.0%} of the floor with the cache reads "
        f"({best(cache_floor)[0]:.1f}), {median_share(cached, floor):.0%} of the weights-only floor "
        f"({best(floor)[0]:.1f}) (medians per repeat)"
    )


def child_compile_seconds(argv, cache_dir: str) -> float:
    """The first compiled decode step's seconds in a fresh process using inductor cache ``cache_dir``."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir)
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *(argv or sys.argv[1:]), "--compile-seconds"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(out.rsplit("compile seconds:", 1)[1])


def break_even(args, model, prompt, total, argv) -> None:
    """Compile seconds (cold, warm), eager and compiled seconds per token, and the break-even."""
    with tempfile.TemporaryDirectory() as cache_dir:
        cold, warm = child_compile_seconds(argv, cache_dir), child_compile_seconds(argv, cache_dir)
    ours(model, prompt, args.new, max_context=total, compile=True)  # compiled here for the timed shape, untimed
    eager, fast = [], []
    for _ in range(args.repeats):
        eager.append(ours(model, prompt, args.new, max_context=total))
        fast.append(ours(model, prompt, args.new, max_context=total, compile=True))
    saved = 1 / best(eager)[0] - 1 / best(fast)[0]
    print(f"compile: {cold:.1f} s with an empty inductor cache, {warm:.1f} s with the cache it left")
    print(
        f"decode: eager {best(eager)[0]:.1f} tokens/s, compiled {best(fast)[0]:.1f} tokens/s: "
        f"{saved * 1e3:.3f} ms saved per token"
    )
    if saved <= 0:
        print("break-even: never (the compiled step is not faster here)")
        return
    print(
        f"break-even: {cold / saved:,.0f} new tokens (empty cache), {warm / saved:,.0f} (warm cache), were every "
        f"step to save what one saves at a {total}-slot cache (a static cache is read whole at every step, so "
        f"longer generations save less per step)"
    )


if __name__ == "__main__":
    main()
