"""What a machine with a GPU checks of minilm in a few minutes (bench/gpu_check.sh runs it after the
device tests), printing one table per part; nothing here is a timed assertion:

1. every position scheme on the GPU: greedy decoding with a KV cache (prefill, then one token at a
   time), a rolling window with sinks, and two left-padded prompts decoded together, each against
   the uncached recomputation (the largest logit difference; greedy tokens equal);
2. the main job's model for ``--steps`` steps (``rope.yaml``): tokens/s and bits/char;
3. decode speed of the main job's shape with a KV cache (tokens/s, batch 1);
4. a LoRA step of a random Llama-3.2-1B-shaped model at ``--tokens`` tokens (bench/llama32_1b_lora.yaml:
   rank 8 on q, k, v, o, norms and embeddings trained, activation checkpointing, bf16 autocast,
   frozen weights in bf16): peak memory against ``minilm memory``'s figure, and seconds per step.

    python bench/gpu_check.py                       # on cuda
    python bench/gpu_check.py --device cpu --smoke  # tiny sizes: that the script runs (CI)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from minilm import GPT, ModelConfig  # noqa: E402
from minilm.common import markdown_table  # noqa: E402
from minilm.configfile import load_config  # noqa: E402
from minilm.generation.decode import Sampling, generate_rows  # noqa: E402
from minilm.model.lora import add_adapters, freeze_in  # noqa: E402
from minilm.positions.base import available  # noqa: E402
from minilm.training.loop import train  # noqa: E402
from minilm.training.memory import step_memory  # noqa: E402
from minilm.training.mixture import mixed_loss  # noqa: E402

SETTINGS = {"interpolated": {"kind": "interpolated", "inner": {"kind": "rope"}, "factor": 2}}


def schemes(device: torch.device, smoke: bool) -> list:
    """Per scheme: the largest |cached - uncached| logit, and whether greedy tokens agree, for a full
    cache, a rolling window with 2 sinks, and two left-padded prompts of different lengths."""
    rows = []
    for kind in available():
        torch.manual_seed(0)
        config = ModelConfig(
            vocab_size=97, n_layer=2, n_head=4, d_model=64, block_size=64, position=SETTINGS.get(kind, {"kind": kind})
        )
        model = GPT(config).to(device).eval()
        ids = torch.randint(0, 97, (1, 24), device=device)
        with torch.no_grad():
            full = model(ids)
            cache = model.new_cache(1, 64)
            stepped = torch.cat(
                [model(ids[:, :16], cache)] + [model(ids[:, t : t + 1], cache) for t in range(16, 24)], 1
            )
            diff = float((full - stepped).abs().max())
        cells = [kind, f"{diff:.1e}"]
        greedy = Sampling(temperature=0)
        try:  # a rolling window with sinks, cached against recomputed
            prompt, options = [[1, 2, 3, 4, 5, 6, 7] * 3], {"max_context": 16, "sinks": 2, "sampling": greedy}
            cached = [t.tolist() for t in generate_rows(model, prompt, max_new_tokens=12, **options)]
            again = [t.tolist() for t in generate_rows(model, prompt, max_new_tokens=12, use_cache=False, **options)]
            cells.append("same" if cached == again else "DIFFERENT")
        except Exception as exc:  # a scheme that refuses the setting says why, in one line
            cells.append(f"refused: {str(exc).splitlines()[0][:60]}")
        prompts = [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10]]  # left-padded together, against each alone without a cache
        together = torch.stack(list(generate_rows(model, prompts, max_new_tokens=12, sampling=greedy))).T.tolist()
        alone = [
            [int(t) for t in generate_rows(model, [p], max_new_tokens=12, use_cache=False, sampling=greedy)]
            for p in prompts
        ]
        cells.append("same" if together == alone else "DIFFERENT")
        rows.append(cells)
    return rows


def main_job(device: torch.device, steps: int, smoke: bool) -> list:
    out = tempfile.mkdtemp(prefix="gpu_check_")
    extra = (
        [
            "model.n_layer=1",
            "model.d_model=32",
            "model.n_head=2",
            "model.block_size=32",
            "train.batch_size=2",
            "train.final_eval_tokens=2000",
        ]
        if smoke
        else []
    )
    config = load_config(
        "rope.yaml",
        [
            f"train.max_steps={steps}",
            f"train.device={device.type}",
            f"out_dir={out}",
            "train.sample_tokens=0",
            f"train.eval_interval={steps}",
            f"data.dir={os.path.join(out, 'data')}",
            *extra,
        ],
    )
    summary = train(config, quiet=True)
    return [
        ["rope.yaml", steps, f"{summary['tokens_per_s']:,.0f}", f"{summary['final_val_bpc']:.4f}", summary["dtype"]]
    ]


def decode(device: torch.device, smoke: bool) -> list:
    config = load_config("rope.yaml", ["data.vocab_size=4096"]).model
    config.vocab_size = 4096
    model = GPT(config).to(device).eval()
    new = 16 if smoke else 256
    for _ in range(2):  # the first run warms up
        started = time.time()
        for _ in generate_rows(model, [[1] * 16], max_new_tokens=new, sampling=Sampling(temperature=0)):
            pass
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.time() - started
    return [["rope.yaml shape, batch 1", new, f"{new / seconds:,.0f}"]]


def lora_step(device: torch.device, tokens: int, steps: int, smoke: bool) -> list:
    overrides = [f"model.block_size={tokens}"]
    if smoke:
        overrides += [
            "model.n_layer=2",
            "model.d_model=64",
            "model.n_head=4",
            "model.n_kv_head=2",
            "model.d_ff=128",
            "model.vocab_size=500",
            "data.vocab_size=500",
        ]
    config = load_config(os.path.join(REPO, "bench", "llama32_1b_lora.yaml"), overrides)
    lora, dtype = config.train.lora, torch.bfloat16 if device.type == "cuda" else torch.float32
    predicted = step_memory(config.model, 1, 1, dtype, "adamw", layouts=(("ddp", True),), lora=lora)[0]["total"]
    model = GPT(config.model)
    add_adapters(model, lora.targets, lora.r, lora.alpha, lora.also_train)
    freeze_in(model, dtype)
    model.to(device).train()
    model.checkpoint_blocks = True
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        idx = torch.randint(0, config.model.vocab_size, (1, tokens), device=device)
        started = time.time()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(idx, head=lambda hidden, weight, cap: mixed_loss(hidden, weight, cap, idx, None))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.time() - started)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else float("nan")
    return [
        [
            f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}B, {tokens} tokens",
            steps,
            f"{min(times):.2f}",
            f"{peak / 2**30:.2f}",
            f"{predicted / 2**30:.2f}",
            f"{peak / predicted:.2f}",
        ]
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=300, help="main-job steps (default 300)")
    p.add_argument("--tokens", type=int, default=8192, help="tokens of the LoRA step (default 8192)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, a few steps: that every part runs")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run it on a machine with a GPU (or --device cpu --smoke)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"# minilm GPU check on {name}, torch {torch.__version__}\n")
    steps, tokens = (4, 64) if args.smoke else (args.steps, args.tokens)
    print("## Schemes: cached against uncached\n")
    print(
        markdown_table(
            [
                "scheme",
                "max |cached - full| logit",
                "rolling window + 2 sinks, greedy",
                "two left-padded prompts, greedy",
            ],
            schemes(device, args.smoke),
        ),
        "\n",
    )
    print("## The main job's model\n")
    print(
        markdown_table(["config", "steps", "tokens/s", "bits/char", "dtype"], main_job(device, steps, args.smoke)), "\n"
    )
    print("## Decode\n")
    print(markdown_table(["model", "new tokens", "tokens/s"], decode(device, args.smoke)), "\n")
    print("## A LoRA step of a Llama-3.2-1B shape\n")
    print(
        markdown_table(
            ["model", "steps", "best s/step", "peak GiB", "minilm memory GiB", "peak / predicted"],
            lora_step(device, tokens, 3, args.smoke),
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
