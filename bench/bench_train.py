"""Training-speed benchmark: minilm's training step against a nanoGPT-style reference step.

Default shape: 6 layers, d_model 384, 6 heads, block_size T = 256, batch 16, vocab 4096.
In one run it measures this machine's matmul peak (square matmuls, 2048^3; 1024^3 where a
dtype is emulated and slow), then for each dtype tokens/s and GFLOP/s of

* ours with learned positions (the like-for-like comparison), and ours with ``--position``
  (rope by default): forward, loss, backward, clipping and optimiser step exactly as
  ``minilm.training.loop`` does them (``--optimizer muon`` for Muon); with ``--compile`` also
  ours with learned positions under ``torch.compile``, as ``train.compile: true`` runs it
  (compiled during the warm-up steps, which are not timed);
* the reference (bench/reference_gpt.py): the same shape, learned positions, a standard
  attention block and nanoGPT's step; with ``--compile`` also the reference under
  ``torch.compile`` (nanoGPT's own train.py compiles by default);

and prints ours / reference (and, with ``--compile``, compiled / compiled). The steps of all
of them alternate, and the median step time of each counts, so a noisy machine slows all of
them alike. bfloat16 (autocast) is measured where
the CPU has native bf16 units or on CUDA, float32 always.

FLOPs per trained token (nanoGPT's estimate, PaLM appendix B):

    6 * N + 12 * L * d_model * T

with N the parameter count (the tied embedding / LM head once): 2 N for the forward matmuls
and 4 N for the backward, plus attention scores and weighted sum, 2 * 2 * T * d_model per
layer forward, tripled for forward + backward. The attention term counts the full T x T
matrix; a causal kernel that skips masked blocks does about half of it, so the figure is
the conventional one, not an exact count.

    python bench/bench_train.py                      # the default shape, float32 (+ bfloat16 where native)
    python bench/bench_train.py --dtype float32 --steps 9
    python bench/bench_train.py --compile                # + ours and the reference compiled
    python bench/bench_train.py --n-layer 4 --d-model 192 --n-head 4 --batch-size 8   # the main job's shape

``--main-job`` times the main job's own step instead (``python train.py --config rope.yaml``:
its model, data, optimiser and ``train.compile``), in one process each (``main_job_step.py``) taking
turns on the cores: ours as shipped, ours eager, the step of an earlier commit (``--today``, by
default 1fa6469, the step issue 61 measured: its tree from ``git archive``) and the nanoGPT-style
step at the same shape. It prints each one's median ms per step, its ratio to the earlier commit's,
the first step's seconds (where a compiled step compiles) and the projected training time (steps x
ms per step, plus what the first step took beyond one step; compiled with an empty compile cache):

    python bench/bench_train.py --main-job                 # ours against 1fa6469 and nanoGPT's, torch's threads
    python bench/bench_train.py --main-job --rounds 9 --today 974be8b
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reference_gpt import ReferenceGPT, reference_optimizer, reference_step  # noqa: E402

from minilm import GPT, ModelConfig  # noqa: E402
from minilm.common import autocast, cpu_has_fast_bf16, resolve_device  # noqa: E402
from minilm.config import TrainConfig  # noqa: E402
from minilm.training.losses import lm_loss  # noqa: E402
from minilm.training.optim import make_optimizer  # noqa: E402


def matmul_peak(dtype: torch.dtype, device: torch.device, min_seconds: float = 2.0) -> tuple[float, int]:
    """Best GFLOP/s of square n x n matmuls (n = 2048, or 1024 when the dtype is emulated and slow)."""
    probe = torch.randn(512, 512, dtype=dtype, device=device)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        probe @ probe
        times.append(time.perf_counter() - start)
    n = 2048 if 2 * 512**3 / min(times) > 5e9 else 1024
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
        best = max(best, 2 * n**3 / elapsed / 1e9)
    return best, n


def flops_per_token(model: GPT) -> int:
    c = model.config
    return 6 * model.num_params() + 12 * c.n_layer * c.d_model * c.block_size


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def our_step(args, position: str, device: torch.device, dtype: torch.dtype, x, y, compile: bool = False):
    """(model, step function) of minilm's training step on this shape and position kind,
    ``GPT.body`` compiled as the trainer compiles it with ``compile`` (``train.compile``)."""
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=args.vocab_size,
        n_layer=args.n_layer,
        n_head=args.n_head,
        d_model=args.d_model,
        block_size=args.block_size,
        position={"kind": position},
    )
    model = GPT(config).to(device)
    optimizer = make_optimizer(model, TrainConfig(optimizer=args.optimizer), device, dtype)
    body = torch.compile(model.body, dynamic=False) if compile else None

    def step():
        with autocast(device, dtype):
            loss = lm_loss(model(x, return_hidden=True, body=body), model.lm_head.weight, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


def reference(args, device: torch.device, dtype: torch.dtype, x, y, compile: bool = False):
    torch.manual_seed(0)
    model = ReferenceGPT(args.vocab_size, args.n_layer, args.n_head, args.d_model, args.block_size).to(device)
    optimizer = reference_optimizer(model, device)
    forward = torch.compile(model) if compile else model
    ctx = contextlib.nullcontext() if dtype == torch.float32 else torch.autocast(device.type, dtype=dtype)
    return model, lambda: reference_step(forward, optimizer, x, y, ctx)


def median_seconds(steps: dict, rounds: int, device: torch.device) -> dict:
    """Median seconds per step of each named step function, run in alternation after 2 warm-ups."""
    times = {name: [] for name in steps}
    for round_ in range(rounds + 2):
        for name, step in steps.items():
            sync(device)
            start = time.perf_counter()
            step()
            sync(device)
            if round_ >= 2:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def tree_of(commit: str, into: str) -> str:
    """The minilm package of ``commit`` (this repository's git history) unpacked under ``into``."""
    archive = subprocess.run(
        ["git", "-C", REPO, "archive", "--format=tar", commit, "minilm"], capture_output=True, check=False
    )
    if archive.returncode:
        sys.exit(f"--today {commit}: git archive failed: {archive.stderr.decode().strip()}")
    with tempfile.TemporaryFile() as tar:
        tar.write(archive.stdout)
        tar.seek(0)
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.11.4, 3.10.12
        tarfile.open(fileobj=tar).extractall(into, **safe)
    return into


def main_job(args) -> None:
    """``--main-job``: the main job's step, ours and an earlier commit's and nanoGPT's, in turns."""
    worker = [sys.executable, os.path.join(HERE, "main_job_step.py")]
    with tempfile.TemporaryDirectory() as old, tempfile.TemporaryDirectory() as cache:
        # an empty compile cache: the first step compiles as it does on a machine that never compiled it
        env = dict(
            os.environ,
            TORCHINDUCTOR_CACHE_DIR=cache,
            **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}),
        )
        variants = {
            "ours (rope.yaml as shipped)": (worker, env),
            "ours, eager (train.compile=false)": (worker + ["train.compile=false"], env),
            f"{args.today} (today's step)": (worker, dict(env, PYTHONPATH=tree_of(args.today, old))),
            "nanoGPT-style, the same shape": (worker + ["--reference"], env),
        }
        procs, first = {}, {}
        for name, (command, environment) in variants.items():  # set up one at a time: compiling is not timed
            procs[name] = subprocess.Popen(
                command, cwd=REPO, env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            ready = procs[name].stdout.readline().split()
            if not ready or ready[0] != "ready":
                sys.exit(f"{name}: the step did not start (exit {procs[name].wait()})")
            first[name], steps = float(ready[1]), int(ready[2])

        def ask(name: str, n: int) -> float:
            procs[name].stdin.write(f"{n}\n")
            procs[name].stdin.flush()
            return float(procs[name].stdout.readline())

        for name in procs:
            ask(name, 3)  # warm-up
        rounds = {name: [] for name in procs}
        for _ in range(args.rounds):
            for name in procs:
                rounds[name].append(ask(name, args.steps))
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
    ms = {name: statistics.median(values) for name, values in rounds.items()}
    today = ms[f"{args.today} (today's step)"]
    print(
        f"the main job's step ({steps} steps), {torch.get_num_threads() if not args.threads else args.threads} "
        f"threads, torch {torch.__version__}: median of {args.rounds} rounds of {args.steps} steps, in turns"
    )
    for name in procs:
        projected = (steps * ms[name] / 1000 + max(0.0, first[name] - ms[name] / 1000)) / 60
        print(
            f"  {name:36s} {ms[name]:7.1f} ms/step  {ms[name] / today:5.2f}x today's  "
            f"first step {first[name]:5.1f} s  projected {projected:5.1f} min"
        )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-layer", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--n-head", type=int, default=6)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--position", default="rope", help="our second position kind (default rope)")
    parser.add_argument("--optimizer", default="adamw", choices=("adamw", "muon"), help="our optimiser")
    parser.add_argument(
        "--dtype",
        default="all",
        choices=("all", "float32", "bfloat16"),
        help="all: float32, and bfloat16 where it is native (default)",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--steps", type=int, default=7, help="timed steps of each (after 2 warm-up steps)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also ours (learned) compiled, as train.compile runs it, and the reference compiled",
    )
    parser.add_argument("--main-job", action="store_true", help="the main job's step against --today's and nanoGPT's")
    parser.add_argument("--today", default="1fa6469", help="--main-job: the commit whose step is today's")
    parser.add_argument("--rounds", type=int, default=11, help="--main-job: rounds of --steps steps each")
    args = parser.parse_args(argv)
    if args.main_job:
        return main_job(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    native_bf16 = device.type == "cuda" or (device.type == "cpu" and cpu_has_fast_bf16())
    dtypes = {
        "all": [torch.float32] + ([torch.bfloat16] if native_bf16 else []),
        "float32": [torch.float32],
        "bfloat16": [torch.bfloat16],
    }[args.dtype]
    B, T = args.batch_size, args.block_size
    x = torch.randint(0, args.vocab_size, (B, T), device=device)
    y = torch.randint(0, args.vocab_size, (B, T), device=device)

    peaks = {d: matmul_peak(d, device) for d in (torch.float32, torch.bfloat16)}
    print(
        f"device {device}, {torch.get_num_threads()} threads, torch {torch.__version__}; matmul peak: "
        + ", ".join(f"{str(d).replace('torch.', '')} {gflops:.1f} GFLOP/s ({n}^3)" for d, (gflops, n) in peaks.items())
    )
    if not native_bf16 and args.dtype == "all":
        print("bfloat16 is not measured: this CPU has no native bf16 units (emulated; dtype auto trains in float32)")
    for dtype in dtypes:
        name = str(dtype).replace("torch.", "")
        ours_learned, learned_step = our_step(args, "learned", device, dtype, x, y)
        ours_other, other_step = our_step(args, args.position, device, dtype, x, y)
        ref, ref_step = reference(args, device, dtype, x, y)
        steps = {"learned": learned_step, args.position: other_step, "reference": ref_step}
        if args.compile:
            steps["compiled"] = our_step(args, "learned", device, dtype, x, y, compile=True)[1]
            steps["reference compiled"] = reference(args, device, dtype, x, y, compile=True)[1]
        seconds = median_seconds(steps, args.steps, device)
        print(
            f"{name}: {args.n_layer} layers x d_model {args.d_model}, {args.n_head} heads, T={T}, batch {B}, "
            f"vocab {args.vocab_size}; optimiser {args.optimizer}; median of {args.steps} steps each"
        )
        rates = {}
        rows = [
            ("ours, learned", ours_learned, "learned"),
            (f"ours, {args.position}", ours_other, args.position),
            ("nanoGPT-style reference", ours_learned, "reference"),
        ]
        rows += (
            [
                ("ours, learned, compiled", ours_learned, "compiled"),
                ("reference, compiled", ours_learned, "reference compiled"),
            ]
            if args.compile
            else []
        )
        for label, model, key in rows:
            rates[key] = B * T / seconds[key]
            gflops = flops_per_token(model) * rates[key] / 1e9
            print(
                f"  {label:26s} {seconds[key] * 1000:7.0f} ms/step {rates[key]:9,.0f} tokens/s "
                f"{gflops:7.1f} GFLOP/s ({gflops / peaks[dtype][0]:.0%} of the {name} peak)"
            )
        compiled = (
            (
                f", {rates['compiled'] / rates['reference']:.2f}x (learned, compiled); compiled / compiled: "
                f"{rates['compiled'] / rates['reference compiled']:.2f}x"
            )
            if args.compile
            else ""
        )
        print(
            f"  ours / reference: {rates['learned'] / rates['reference']:.2f}x (learned), "
            f"{rates[args.position] / rates['reference']:.2f}x ({args.position}){compiled}"
        )
        del ref


if __name__ == "__main__":
    main()
