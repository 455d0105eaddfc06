"""KV cache bytes and decode speed of a local/global model (positions per layer, ``model.layers``)
against the same model with every layer global, on one host in one run.

    python bench/bench_layers.py                       # 6 x 192, 5:1 local/global, window 256, context 2048
    python bench/bench_layers.py --window 512 --context 4096 --repeats 3

The hybrid has ``layers={pattern: [local]*5 + [global], local: {window: W}, global: null}`` (the
pattern repeated over ``--layers``); the uniform model is the same config without ``layers``, with
the hybrid's weights copied in. Random weights, rope, batch ``--batch``. For each model and dtype:
``model.new_cache(batch, context)`` (each local layer keeps a ring of W slots: ``cache.nbytes()``),
a random prompt of ``context - new`` tokens prefilled through ``model(ids, cache)`` under
``torch.no_grad()``, then ``new`` greedy tokens decoded one at a time through the lean step, as
``generate`` runs it (``model(tok, cache, body=lean_body(model))``), so the cache ends at ``context``.
Prefill and decode are timed apart (wall clock; the decode steps alone, argmax included). Every
repeat runs uniform then hybrid (A/B/A/B), so a slow spell of the machine touches both; the table
gives medians over repeats (and each repeat's figures) and hybrid / uniform ratios. float32 always,
bf16 too where the CPU has native bf16 units (AVX512-BF16 or AMX; a bf16 model's CPU cache holds
float32).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minilm import GPT, ModelConfig  # noqa: E402
from minilm.common import cpu_has_fast_bf16  # noqa: E402
from minilm.generation.lean import lean_body  # noqa: E402


def host() -> str:
    """lscpu's model name, family/model numbers and the flags that matter here."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown host (no lscpu)"
    info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    info = {k.strip(): v.strip() for k, v in info.items()}
    flags = info.get("Flags", "").split()
    shown = [f for f in ("avx2", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
    return (
        f"{info.get('Model name', '?')} (family {info.get('CPU family', '?')} model {info.get('Model', '?')}), "
        f"{os.cpu_count()} CPUs, flags: {' '.join(shown) or 'none of avx2/avx512_bf16/amx'}"
    )


def build(args, hybrid: bool, dtype) -> GPT:
    layers = {"pattern": ["local"] * args.local + ["global"], "local": {"window": args.window}, "global": None}
    config = ModelConfig(
        vocab_size=args.vocab,
        n_layer=args.layers,
        n_head=args.heads,
        d_model=args.d_model,
        d_ff=args.d_ff,
        block_size=args.context,
        norm="rmsnorm",
        mlp="swiglu",
        qk_norm=True,
        position={"kind": "rope"},
        layers=layers if hybrid else None,
    )
    torch.manual_seed(0)
    return GPT(config).eval().to(dtype)


@torch.no_grad()
def run(model, prompt, new: int, context: int):
    """(prefill seconds, decode tokens/s, cache bytes) of one prefill and ``new`` lean decode steps."""
    cache = model.new_cache(prompt.shape[0], context)
    body = lean_body(model)
    start = time.perf_counter()
    logits = model(prompt, cache)
    prefill = time.perf_counter() - start
    tok = logits[:, -1:].argmax(-1)
    start = time.perf_counter()
    for _ in range(new):
        tok = model(tok, cache, body=body)[:, -1:].argmax(-1)
    decode = time.perf_counter() - start
    assert cache.length == context
    return prefill, prompt.shape[0] * new / decode, cache.nbytes()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--local", type=int, default=5, help="local layers before each global one (default 5: 5:1)")
    p.add_argument("--d-model", type=int, default=192)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=512)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--window", type=int, default=256, help="the local layers' sliding window W")
    p.add_argument("--context", type=int, default=None, help="tokens in the cache at the end (default 8 W)")
    p.add_argument("--new", type=int, default=128, help="decoded tokens (the prompt is context - new)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5, help="A/B rounds; medians are reported")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--dtypes", default="auto", help="comma list of float32,bfloat16 (auto: bf16 where native)")
    args = p.parse_args(argv)
    args.context = args.context or 8 * args.window
    if args.threads:
        torch.set_num_threads(args.threads)
    dtypes = args.dtypes.split(",") if args.dtypes != "auto" else ["float32"] + ["bfloat16"] * cpu_has_fast_bf16()
    n_global = sum(i % (args.local + 1) == args.local for i in range(args.layers))
    slots = (args.layers - n_global) * min(args.window, args.context) + n_global * args.context
    print(f"host: {host()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}")
    print(
        f"model: {args.layers} x {args.d_model}, {args.heads} heads, swiglu {args.d_ff}, rmsnorm, qk_norm, rope, "
        f"vocab {args.vocab}; hybrid {args.local}:1 local (window {args.window}) / global; batch {args.batch}, "
        f"context {args.context} ({args.context / args.window:g} W): prompt {args.context - args.new} + "
        f"{args.new} decoded; {args.repeats} repeats A/B, medians"
    )
    full = args.layers * args.context
    print(f"expected cache ratio: {slots} / {full} slots = {slots / full:.3f}")
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, args.vocab, (args.batch, args.context - args.new), generator=gen)
    rows = []
    for name in dtypes:
        dtype = getattr(torch, name)
        hybrid = build(args, True, dtype)
        uniform = build(args, False, dtype)
        uniform.load_state_dict(hybrid.state_dict())  # the same weights
        models = {"uniform": uniform, f"{args.local}:1 local/global": hybrid}
        for model in models.values():  # warm-up, the timed prompt and 8 steps
            run(model, prompt, 8, args.context - args.new + 8)
        results = {label: [] for label in models}
        for _ in range(args.repeats):
            for label, model in models.items():
                results[label].append(run(model, prompt, args.new, args.context))
        medians = {}
        for label, runs in results.items():
            prefill = statistics.median(r[0] for r in runs)
            rate = statistics.median(r[1] for r in runs)
            medians[label] = (runs[0][2] / 2**20, prefill, rate)
            pre = ", ".join(f"{r[0]:.3f}" for r in runs)
            dec = ", ".join(f"{r[1]:.0f}" for r in runs)
            rows.append(f"| {name} | {label} | {medians[label][0]:.2f} | {prefill:.3f} | {rate:.1f} | {pre} | {dec} |")
        (u_mib, u_pre, u_rate), (h_mib, h_pre, h_rate) = medians.values()
        rows.append(
            f"| {name} | hybrid / uniform | {h_mib / u_mib:.3f} | {h_pre / u_pre:.2f} | {h_rate / u_rate:.2f} | | |"
        )
    print()
    print("| dtype | model | KV cache MiB | prefill s | decode tokens/s | prefill runs (s) | decode runs |")
    print("|---|---|---:|---:|---:|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
