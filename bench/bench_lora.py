"""A LoRA step against a full fine-tuning step of the same ~110M-parameter Llama-shaped model
(12 layers x 768, 12 heads, SwiGLU 2,048, a 32,000-token vocabulary, the head tied), one row
of ``--tokens`` tokens: tokens/s and the process's peak memory, each mode in a fresh process,
beside what ``minilm memory`` predicts for it.

    python bench/bench_lora.py                   # bf16 autocast where the CPU has native bf16
    python bench/bench_lora.py --dtype float32 --steps 8

Peak memory is the process's largest resident set during the timed steps (sampled every
millisecond from /proc/self/statm by a thread) less what it held before the model was built (the
interpreter and torch): the step's memory, not the build's (the weights are built in float32 and
the frozen ones then cast). The prediction is ``minilm memory``'s for one process without DDP
(its all-reduce buckets, the second gradient term, left out).
LoRA: rank 8 on q, k, v, o, the norms trained too, frozen weights in the compute dtype.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from minilm import GPT, ModelConfig  # noqa: E402
from minilm.common import cpu_has_fast_bf16, markdown_table  # noqa: E402
from minilm.config import LoRAConfig  # noqa: E402
from minilm.model.lora import add_adapters, freeze_in  # noqa: E402
from minilm.training.memory import step_memory  # noqa: E402
from minilm.training.mixture import mixed_loss  # noqa: E402

LORA = LoRAConfig(r=8, alpha=16.0, targets=["q", "k", "v", "o"], also_train=["norms"])


def shape(tokens: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=32000,
        n_layer=12,
        n_head=12,
        d_model=768,
        d_ff=2048,
        mlp="swiglu",
        norm="rmsnorm",
        block_size=tokens,
        position={"kind": "rope"},
    )


def resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakResident(threading.Thread):
    """The largest resident set seen while it runs (``stop()`` returns it)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.running = resident(), True

    def run(self):
        while self.running:
            self.peak = max(self.peak, resident())
            time.sleep(0.001)

    def stop(self) -> int:
        self.running = False
        self.join()
        return max(self.peak, resident())


def one_mode(mode: str, tokens: int, steps: int, dtype: torch.dtype) -> dict:
    """Train ``steps`` steps in this process; the measurements as a dict."""
    before = resident()
    torch.manual_seed(0)
    model = GPT(shape(tokens))
    if mode == "lora":
        add_adapters(model, LORA.targets, LORA.r, LORA.alpha, LORA.also_train)
        freeze_in(model, dtype)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=1e-4, fused=True)
    model.train()
    times, sampler = [], PeakResident()
    for step in range(steps + 2):  # two warm-up steps
        if step == 2:
            sampler.start()
        idx = torch.randint(0, 32000, (1, tokens))
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss = model(idx, head=lambda hidden, weight, cap: mixed_loss(hidden, weight, cap, idx, None))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= 2:
            times.append(time.perf_counter() - started)
    peak = sampler.stop()
    times.sort()
    return {
        "mode": mode,
        "trained": sum(p.numel() for p in trained),
        "params": sum(p.numel() for p in model.parameters()),
        "tokens_per_s": tokens / times[len(times) // 2],
        "peak": peak - before,
    }


def predicted(mode: str, tokens: int, dtype: torch.dtype) -> float:
    row = step_memory(
        shape(tokens), 1, 1, dtype, "adamw", layouts=(("ddp", False),), lora=LORA if mode == "lora" else None
    )[0]
    return row["total"] - row["gradients"] / 2  # one process: no DDP buckets


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5, help="timed steps per mode (median), after 2 warm-up steps")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    p.add_argument("--mode", choices=["lora", "full"], help=argparse.SUPPRESS)  # one mode, in a child process
    args = p.parse_args(argv)
    name = ("bfloat16" if cpu_has_fast_bf16() else "float32") if args.dtype == "auto" else args.dtype
    dtype = getattr(torch, name)
    if args.mode:
        print(json.dumps(one_mode(args.mode, args.tokens, args.steps, dtype)))
        return 0
    rows = []
    for mode in ("full", "lora"):
        # a fixed mmap threshold: glibc then returns freed large blocks (the float32 weights the frozen ones were
        # cast from) to the system, so the resident set shows what the step holds, not what malloc kept
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--mode",
                mode,
                "--tokens",
                str(args.tokens),
                "--steps",
                str(args.steps),
                "--dtype",
                name,
            ],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        r = json.loads(child.stdout.strip().splitlines()[-1])
        rows.append(
            [
                mode,
                f"{r['params'] / 1e6:.1f}M",
                f"{r['trained']:,}",
                f"{r['tokens_per_s']:,.0f}",
                f"{r['peak'] / 2**20:,.0f}",
                f"{predicted(mode, args.tokens, dtype) / 2**20:,.0f}",
            ]
        )
    print(f"1 x {args.tokens} tokens a step, {name}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(
        markdown_table(
            ["mode", "parameters", "trained", "tokens/s (median)", "peak MiB (measured)", "MiB (minilm memory)"],
            rows,
            "llrrrr",
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
