"""One process that times the main job's training step, for ``bench_train.py --main-job``.

It builds the run exactly as ``python train.py --config rope.yaml`` does (``minilm.training.loop``'s
``setup`` and ``train_step``, the data included), from whichever minilm is importable (``bench_train.py``
points PYTHONPATH at an earlier commit's tree to time that commit's step), or with ``--reference`` the
nanoGPT-style step of ``reference_gpt.py`` at the main job's shape. Then it waits: each line ``N`` read
from stdin runs N steps and answers with their median in ms, so that several such processes can take
turns on the same cores. The first line it prints gives the first step's seconds (a compiled step
compiles there) and the steps the config runs.

    python bench/main_job_step.py [--reference] [section.key=value ...]

With ``--profile N`` it profiles N steps instead (torch.profiler, after 5 warm-up steps) and prints
the operators that take the most time, in ms per step of their own (self) CPU time:

    python bench/main_job_step.py --profile 10                      # the main job's step as shipped
    PYTHONPATH=/path/to/old/tree python bench/main_job_step.py --profile 10   # an earlier commit's
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from reference_gpt import ReferenceGPT, reference_optimizer, reference_step  # noqa: E402

from minilm.common import autocast, resolve_device, resolve_dtype  # noqa: E402
from minilm.configfile import load_config  # noqa: E402
from minilm.training.loop import setup, train_step  # noqa: E402
from minilm.training.resume import StopFlag  # noqa: E402


def main_job_step(overrides: list, out_dir: str):
    """(one step of the main job, the steps it runs)."""
    run = setup(load_config("rope.yaml", [f"out_dir={out_dir}", *overrides]), quiet=True)
    stop = StopFlag()
    return (lambda: train_step(run, stop)), run.config.train.max_steps


def reference_at_main_job_shape(overrides: list):
    """(one nanoGPT-style step at the main job's shape and dtype, the steps the main job runs)."""
    config = load_config("rope.yaml", overrides)
    m, t = config.model, config.train
    device = resolve_device(t.device)
    dtype = resolve_dtype(t.dtype, device)
    torch.manual_seed(0)
    model = ReferenceGPT(config.data.vocab_size, m.n_layer, m.n_head, m.d_model, m.block_size).to(device)
    optimizer = reference_optimizer(model, device)
    x = torch.randint(0, config.data.vocab_size, (t.batch_size, m.block_size), device=device)
    y = torch.randint(0, config.data.vocab_size, (t.batch_size, m.block_size), device=device)
    return (lambda: reference_step(model, optimizer, x, y, autocast(device, dtype))), t.max_steps


def profile(step, steps: int, rows: int = 15) -> None:
    """The ``rows`` operators with the most self CPU time over ``steps`` steps, in ms per step."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    for _ in range(5):
        step()
    with profiler(activities=[ProfilerActivity.CPU]) as recorded:
        for _ in range(steps):
            step()
    events = sorted(recorded.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) / steps / 1000
    print(f"{total:.1f} ms per step of self CPU time over {steps} steps; the top {rows} operators:")
    for event in events[:rows]:
        ms = event.self_cpu_time_total / steps / 1000
        print(f"  {ms:7.2f} ms  {ms / total:5.1%}  {event.count / steps:6.1f} calls  {event.key[:70]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", action="store_true", help="the nanoGPT-style step at the main job's shape")
    parser.add_argument("--profile", type=int, default=0, help="profile this many steps, print the top operators")
    parser.add_argument("overrides", nargs="*", help="section.key=value settings of rope.yaml")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out_dir:
        step, max_steps = (
            reference_at_main_job_shape(args.overrides) if args.reference else main_job_step(args.overrides, out_dir)
        )
        if args.profile:
            return profile(step, args.profile)
        start = time.perf_counter()
        step()
        print(f"ready {time.perf_counter() - start:.3f} {max_steps}", flush=True)
        for line in sys.stdin:
            times = []
            for _ in range(int(line)):
                start = time.perf_counter()
                step()
                times.append(time.perf_counter() - start)
            print(f"{statistics.median(times) * 1000:.3f}", flush=True)


if __name__ == "__main__":
    main()
