"""Memory per process of training under DDP and under FSDP at 2 processes (gloo on the CPU):
the bytes each rank holds in weights and AdamW state after two optimizer steps, its peak RSS,
and what ``python -m minilm memory`` predicts for the same step.

    python bench/bench_fsdp_memory.py [--config rope.yaml] [key=value ...]

It launches ``torchrun --nproc_per_node=2`` twice (train.parallel=ddp, then fsdp) on this very
file; each rank sets up the run as ``train.py`` does (``minilm.training.loop.setup``), takes two
steps (``train_step``) in float32 with AdamW, and reports. The defaults add
``train.batch_size=2`` so that weights, not activations, are what differ."""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from minilm.config import resolve_config  # noqa: E402
from minilm.configfile import load_config
from minilm.training.loop import setup, train_step  # noqa: E402
from minilm.training.memory import step_memory  # noqa: E402
from minilm.training.resume import StopFlag  # noqa: E402

FIXED = [
    "train.optimizer=adamw",
    "train.dtype=float32",
    "train.device=cpu",
    "train.max_steps=2",
    "train.warmup_steps=1",
    "train.sample_tokens=0",
]


def local_bytes(tensor) -> int:
    tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return tensor.numel() * tensor.element_size()


def rss_mib(field: str):
    """VmRSS (now) or VmHWM (the peak) of this process from /proc, in MiB; None off Linux."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith(field + ":"))
    except OSError:
        return None


def worker(config_name: str, overrides: list) -> None:
    config = load_config(config_name, overrides + FIXED)
    run = setup(config, quiet=True)
    after_setup = rss_mib("VmRSS")
    reset = os.path.exists("/proc/self/clear_refs")
    if reset:  # Linux: start the peak (VmHWM) afresh, so that it measures the steps, not the setup
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    with StopFlag() as stop:
        for _ in range(2):
            train_step(run, stop)
    weights = sum(local_bytes(p) for p in run.raw.parameters())
    moments = sum(
        local_bytes(v)
        for part in run.optimizer.parts
        for state in part.state.values()
        for v in state.values()
        if torch.is_tensor(v)
    )
    report = os.path.join(config.out_dir, f"rank{run.dist.rank}.json")  # not stdout: the ranks would interleave
    with open(report, "w") as f:
        json.dump(
            {
                "rank": run.dist.rank,
                "weights": weights,
                "optimizer": moments,
                "after_setup": after_setup,
                "peak_steps": rss_mib("VmHWM") if reset else None,
                "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            },
            f,
        )
    torch.distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="rope.yaml")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.worker:
        return worker(args.config, args.overrides)
    overrides = ["train.batch_size=2", *args.overrides]
    # allocations of 64 KiB and more are mapped and returned on free (glibc would otherwise keep freed blocks of up
    # to 32 MiB in its heap), so that the resident set follows what torch holds
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    mib = 2**20
    print(f"{args.config} {' '.join(overrides)}; 2 processes, gloo, float32, AdamW; MiB per process")
    print(
        "| parallel | rank | weights | AdamW state | weights + state | minilm memory's weights + state | "
        "RSS after setup | peak RSS in the steps | peak RSS of the process |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as out:
        for parallel in ("ddp", "fsdp"):
            given = [*overrides, f"train.parallel={parallel}", f"out_dir={os.path.join(out, parallel)}"]
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc_per_node=2",
                    os.path.abspath(__file__),
                    "--worker",
                    "--config",
                    args.config,
                    *given,
                ],
                env=env,
                capture_output=True,
                text=True,
            )
            if proc.returncode:
                sys.exit(f"{parallel} failed:\n{proc.stderr[-3000:]}")
            config = resolve_config(load_config(args.config, given + FIXED))
            row = next(
                r
                for r in step_memory(config.model, config.train.batch_size, 2, torch.float32, "adamw")
                if r["parallel"] == parallel
            )
            expected = (row["weights"] + row["optimizer"]) / mib
            for rank in range(2):
                with open(os.path.join(out, parallel, f"rank{rank}.json")) as f:
                    r = json.load(f)
                print(
                    f"| {parallel} | {rank} | {r['weights'] / mib:.1f} | {r['optimizer'] / mib:.1f} | "
                    f"{(r['weights'] + r['optimizer']) / mib:.1f} | {expected:.1f} | {r['after_setup']:.1f} | "
                    f"{r['peak_steps'] or float('nan'):.1f} | {r['peak_rss']:.1f} |"
                )


if __name__ == "__main__":
    main()
