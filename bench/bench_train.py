"""Training-speed benchmark: forward, backward and AdamW step of the trainer on a fixed shape.

Default shape: 6 layers, d_model 384, 6 heads, block_size T = 256, batch 16, vocab 4096,
RoPE. It prints tokens/s, achieved GFLOP/s and their fraction of this machine's measured
matmul peak in float32 and bfloat16 (square matmuls, 2048^3; 1024^3 where a dtype is
emulated and slow), with the same optimiser, loss and autocast as ``minilm.trainer``.

FLOPs per trained token (nanoGPT's estimate, PaLM appendix B):

    6 * N + 12 * L * d_model * T

with N the parameter count (the tied embedding / LM head once): 2 N for the forward matmuls
and 4 N for the backward, plus attention scores and weighted sum, 2 * 2 * T * d_model per
layer forward, tripled for forward + backward. The attention term counts the full T x T
matrix; a causal kernel that skips masked blocks does about half of it, so the figure is
the conventional one, not an exact count.

    python bench/bench_train.py                      # the default shape, dtype auto
    python bench/bench_train.py --dtype float32 --steps 5
    python bench/bench_train.py --compile            # torch.compile (compile time reported)
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minilm import GPT, ModelConfig  # noqa: E402
from minilm.config import TrainConfig  # noqa: E402
from minilm.common import autocast, resolve_device, resolve_dtype  # noqa: E402
from minilm.trainer import loss_fn, make_optimizer  # noqa: E402


def matmul_peak(dtype: torch.dtype, device: torch.device, min_seconds: float = 2.0) -> tuple[float, int]:
    """Best GFLOP/s of square n x n matmuls (n = 2048, or 1024 when the dtype is emulated and slow)."""
    probe = torch.randn(512, 512, dtype=dtype, device=device)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        probe @ probe
        times.append(time.perf_counter() - start)
    n = 2048 if 2 * 512 ** 3 / min(times) > 5e9 else 1024
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    a @ b  # warm up
    best, spent = 0.0, 0.0
    while spent < min_seconds:
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        spent += elapsed
        best = max(best, 2 * n ** 3 / elapsed / 1e9)
    return best, n


def flops_per_token(model: GPT) -> int:
    c = model.config
    return 6 * model.num_params() + 12 * c.n_layer * c.d_model * c.block_size


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-layer", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--n-head", type=int, default=6)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--position", default="rope", help="position kind (default rope)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (after 2 warm-up steps)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=args.vocab_size, n_layer=args.n_layer, n_head=args.n_head, d_model=args.d_model,
                         block_size=args.block_size, position={"kind": args.position})
    raw = GPT(config).to(device)
    optimizer = make_optimizer(raw, TrainConfig(), device)
    compile_s = None
    model = raw
    if args.compile:
        model = torch.compile(raw)
    B, T = args.batch_size, args.block_size
    x = torch.randint(0, args.vocab_size, (B, T), device=device)
    y = torch.randint(0, args.vocab_size, (B, T), device=device)
    phases = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step(record: bool) -> None:
        t0 = time.perf_counter()
        with autocast(device, dtype):
            loss = loss_fn(model(x), y)
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        t3 = time.perf_counter()
        if record:
            phases["forward"] += t1 - t0
            phases["backward"] += t2 - t1
            phases["optimizer"] += t3 - t2

    start = time.perf_counter()
    step(False)
    if args.compile:
        compile_s = time.perf_counter() - start
    step(False)
    for _ in range(args.steps):
        step(True)
    seconds = sum(phases.values()) / args.steps
    tokens_per_s = B * T / seconds
    gflops = flops_per_token(raw) * tokens_per_s / 1e9

    print(f"shape: {args.n_layer} layers x d_model {args.d_model}, {args.n_head} heads, T={T}, batch {B}, vocab "
          f"{args.vocab_size}, {args.position}; {raw.num_params() / 1e6:.2f}M params; {flops_per_token(raw) / 1e6:.1f} "
          f"MFLOP/token")
    print(f"device {device}, autocast {str(dtype).replace('torch.', '')}, {torch.get_num_threads()} threads"
          f"{f', compiled in {compile_s:.1f}s' if compile_s is not None else ''}")
    print(f"step {seconds * 1000:.0f} ms (forward {phases['forward'] / args.steps * 1000:.0f}, backward "
          f"{phases['backward'] / args.steps * 1000:.0f}, clip+optimizer {phases['optimizer'] / args.steps * 1000:.0f})")
    print(f"throughput: {tokens_per_s:,.0f} tokens/s, {gflops:.1f} GFLOP/s")
    peaks = {}
    for peak_dtype in (torch.float32, torch.bfloat16):
        peaks[peak_dtype], n = matmul_peak(peak_dtype, device)
        print(f"matmul peak {str(peak_dtype).replace('torch.', '')}: {peaks[peak_dtype]:.1f} GFLOP/s ({n}^3)")
    print(f"fraction of peak: {gflops / peaks[torch.float32]:.0%} of float32, "
          f"{gflops / peaks[torch.bfloat16]:.0%} of bfloat16")
    if peaks[torch.bfloat16] < peaks[torch.float32]:
        print("note: bfloat16 matmuls are slower than float32 here (no native bf16 units: emulated), so "
              "dtype auto trains in float32")

if __name__ == "__main__":
    main()
