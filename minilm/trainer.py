"""The training loop: data, model, AdamW, schedule, evaluation, checkpoints, DDP, autocast.

``train(config)`` runs one experiment end to end and returns a summary dict; ``train.py``
only parses arguments and calls it, and other code (the experiment runner) can call it
in-process. What it does, in order:

1. Prepare the corpus (``minilm.data.prepare``; rank 0 first under DDP) and set
   ``model.vocab_size`` from the tokenizer. With ``train.init_from`` the corpus is encoded
   with the source checkpoint's tokenizer (any corpus: a fine-tuning mixture too), and
   ``data.vocab_size`` follows it.
2. Build the model: fresh, from ``train.init_from`` (trained weights, fresh optimiser and
   step; ``minilm.extension`` adapts positions for context extension), or with
   ``resume=True`` from ``<out_dir>/ckpt.pt`` (weights, optimiser, step, RNG and data
   state), which continues the interrupted run exactly.
3. Loop over optimizer steps. Each step draws one *global* batch of
   ``world_size * grad_accum * batch_size`` windows from a generator seeded by
   ``config.seed`` and identical on every rank; rank r takes its own rows of it for
   each micro-step. Every rank therefore sees different windows, and the data a step
   sees depends only on the global batch, not on how it is split over processes and
   micro-steps: two DDP processes reproduce one process with ``grad_accum=2``. Micro-steps
   before the last skip DDP's gradient all-reduce (``no_sync``).
4. AdamW (Loshchilov & Hutter 2019) with weight decay on the 2-D weight matrices only
   (attention, MLP, the tied token embedding / LM head); LayerNorm weights, biases and
   the position scheme's parameters (learned tables, T5 bias buckets) are not decayed,
   so rarely seen far positions are not pulled to zero. Learning rate: linear warmup
   over ``warmup_steps``, then cosine decay to ``min_lr`` at ``max_steps``. Gradients are
   clipped to a global norm of ``grad_clip`` (0 disables).
5. Every ``eval_interval`` steps: loss, perplexity and bits per character on a fixed set
   of ``eval_iters`` validation batches (the same windows each time, so evaluations are
   comparable). At the end: the same numbers over the whole validation split in
   non-overlapping ``block_size`` windows (at most ``final_eval_tokens`` tokens).
   Bits per character = mean nats per token * val tokens / val characters / ln 2, which
   does not depend on the tokenizer.
6. Checkpoint ``<out_dir>/ckpt.pt`` (atomic, ``minilm.checkpoint.save``) every
   ``checkpoint_interval`` steps, at the end, and when Ctrl-C or SIGTERM stops the run.
   It always holds the latest state (what ``--resume`` needs); the final model is the
   last one. A NaN/inf loss or gradient stops the run before the optimizer step, without
   saving, so the last good checkpoint stays.
7. Print a ``sample_tokens`` sample (temperature 0.8, ``minilm.generation``) and a summary line.

Precision: ``train.dtype`` auto = bfloat16 autocast on CUDA with bf16 support and on CPUs
with native bf16 matrix units (AVX512-BF16 or AMX), else float32 (without those units
PyTorch's CPU bf16 matmuls are emulated and far slower than float32).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import threading
import time
from typing import Optional

import torch
import torch.nn.functional as F

from minilm import checkpoint
from minilm.checkpoint import CheckpointError
from minilm.config import Config, ConfigError
from minilm.model import GPT

SAMPLE_TEMPERATURE = 0.8
METRICS_FILE = "metrics.jsonl"


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a NaN loss); the message is one line for the user."""


# --------------------------------------------------------------------------- settings

def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """auto -> CUDA, then MPS, then CPU; an explicit device must be available."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank)
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name!r} is not available on this machine: use auto or cpu")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ConfigError("train.device='mps' is not available on this machine: use auto or cpu")
    if name == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device(name)


def cpu_has_fast_bf16() -> bool:
    """True when this CPU has native bf16 matrix instructions (AVX512-BF16 or AMX tiles)."""
    cpu = torch.cpu
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(cpu, name, lambda: False)() for name in checks)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The autocast dtype for ``train.dtype`` (auto: bf16 where the hardware does it fast)."""
    if name == "float32":
        return torch.float32
    if name == "bfloat16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if device.type == "cpu":
        return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    return torch.float32


def autocast(device: torch.device, dtype: torch.dtype):
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def resolve_config(config: Config) -> Config:
    """The config a run uses: ``model.vocab_size`` follows ``data.vocab_size`` (the tokenizer)."""
    return dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=config.data.vocab_size))


def lr_at(step: int, t) -> float:
    """Linear warmup to ``lr`` over ``warmup_steps``, then cosine decay to ``min_lr`` at ``max_steps``."""
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    if step >= t.max_steps:
        return t.min_lr
    progress = (step - t.warmup_steps) / max(1, t.max_steps - t.warmup_steps)
    return t.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (t.lr - t.min_lr)


def make_optimizer(model: GPT, t, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on 2-D weight matrices only, never on the position scheme's parameters."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (decay if param.dim() >= 2 and not name.startswith("positions.") else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), fused=device.type in ("cpu", "cuda"))


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


# --------------------------------------------------------------------------- distributed

@dataclasses.dataclass
class Dist:
    rank: int = 0
    local_rank: int = 0
    world: int = 1
    owned: bool = False  # this process group was created by train() and is destroyed at its end

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self):
        if self.enabled:
            torch.distributed.barrier()


def init_distributed(train_cfg) -> Dist:
    """Join the process group when started by torchrun (WORLD_SIZE > 1): gloo on CPU, nccl on CUDA.
    A group that is already initialised (by the caller) is used as it is."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return Dist(rank=dist.get_rank(), local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                    world=dist.get_world_size())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(train_cfg.device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Dist(rank=rank, local_rank=local_rank, world=world, owned=True)


# --------------------------------------------------------------------------- evaluation

@torch.no_grad()
def evaluate(model: GPT, batches, device, dtype, dist: Dist) -> float:
    """Mean next-token loss (nats) over ``batches`` [(x, y), ...]; under DDP each rank takes a share."""
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # (sum of losses, tokens)
    for i, (x, y) in enumerate(batches):
        if i % dist.world != dist.rank:
            continue
        x, y = x.to(device), y.to(device)
        with autocast(device, dtype):
            logits = model(x)
        total[0] += F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1), reduction="sum").double()
        total[1] += y.numel()
    if dist.enabled:
        torch.distributed.all_reduce(total)
    model.train(was_training)
    return float(total[0] / total[1])


def eval_batches(val, config: Config):
    """The fixed validation windows of the periodic evaluation (same windows every time)."""
    from minilm.data import get_batch

    generator = torch.Generator().manual_seed(config.seed)
    t = config.train
    return [get_batch(val, t.batch_size, config.model.block_size, generator) for _ in range(t.eval_iters)]


def split_batches(val, block_size: int, batch_size: int, max_tokens: int):
    """The validation split (its first ``max_tokens + 1`` tokens) in non-overlapping windows."""
    tokens = torch.from_numpy(val[: max_tokens + 1].astype("int64"))
    n = (len(tokens) - 1) // block_size
    full = tokens[: n * block_size + 1]
    x, y = full[:-1].view(n, block_size), full[1:].view(n, block_size)
    batches = [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, n, batch_size)]
    rest = len(tokens) - 1 - n * block_size
    if rest > 0:
        tail = tokens[n * block_size:]
        batches.append((tail[:-1][None], tail[1:][None]))
    return batches


def val_metrics(loss: float, prepared) -> dict:
    return {"val_loss": round(loss, 5), "val_ppl": round(math.exp(min(loss, 50.0)), 3),
            "val_bpc": round(prepared.bits_per_char(loss, "val"), 5)}


# --------------------------------------------------------------------------- sampling

def sample_text(model: GPT, tokenizer, num_tokens: int, seed: int) -> str:
    """A short temperature sample continuing a newline (minilm.generation, KV cache)."""
    from minilm.generation import Sampling, generate_text

    return generate_text(model, tokenizer, "\n", max_new_tokens=num_tokens,
                         sampling=Sampling(temperature=SAMPLE_TEMPERATURE), seed=seed)[0]


# --------------------------------------------------------------------------- stopping

class StopFlag:
    """Ctrl-C / SIGTERM set a flag that the loop checks after each step (a second Ctrl-C aborts)."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._old = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc):
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


# --------------------------------------------------------------------------- the run

def _rng_state(device) -> dict:
    """The global RNG states (dropout); the data generator's state is saved as data_state."""
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _first_difference(a, b, prefix=""):
    """The first dotted key where two nested dicts differ, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            diff = _first_difference(a.get(key), b.get(key), f"{prefix}{key}.")
            if diff:
                return diff
        return None
    return None if a == b else (prefix.rstrip("."), a, b)


def _check_resumable(config: Config, state: dict) -> None:
    """Resuming needs the same model, data and seed; train settings may change (e.g. max_steps)."""
    ours, theirs = config.to_dict(), state["config"]
    for section in ("model", "data", "seed"):
        diff = _first_difference(ours.get(section), theirs.get(section), f"{section}.")
        if diff:
            key, now, before = diff
            raise ConfigError(f"cannot resume {state['path']}: {key}={now!r} but the checkpoint has {before!r}; "
                              f"use the same setting or start a new out_dir")


def _truncate_metrics(path: str, step: int) -> None:
    """On resume, drop log lines past the checkpoint's step (from the part of the run that was lost)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    keep = []
    for line in lines:
        try:
            if json.loads(line).get("step", 0) <= step:
                keep.append(line)
        except ValueError:
            continue
    with open(path, "w") as f:
        f.writelines(keep)


def _format_time(seconds: float) -> str:
    minutes, sec = divmod(int(round(seconds)), 60)
    return f"{minutes}m{sec:02d}s" if minutes else f"{seconds:.1f}s"


def train(config: Config, *, resume: bool = False, quiet: bool = False) -> dict:
    """Train as ``config`` says; return a summary dict.

    Summary keys: checkpoint (path), steps (optimizer steps done in total), tokens (training
    tokens seen in total), seconds (wall time of this call, data preparation included),
    tokens_per_s (this call's training throughput), best_val_bpc, final_val_loss,
    final_val_bpc, final_val_ppl, interrupted (signal name or None), sample (text or None).
    Raises ConfigError, CheckpointError, DataError or TrainingError with one-line messages.
    """
    started = time.time()
    from minilm.data import get_batch, prepare

    t = config.train
    dist = init_distributed(t)
    device = resolve_device(t.device, dist.local_rank)
    dtype = resolve_dtype(t.dtype, device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    talk = dist.main and not quiet

    def say(message: str) -> None:
        if talk:
            from tqdm import tqdm
            tqdm.write(message, file=sys.stderr)

    # 1. the source checkpoint of init_from, whose tokenizer the new run keeps
    source = None
    if t.init_from:
        from minilm.extension import load_source_weights, prepare_extension
        from minilm.tokenizer import Tokenizer

        config, source = prepare_extension(config, t.init_from)
        source_tokenizer = Tokenizer.from_bytes(source["tokenizer"])
        config = dataclasses.replace(config, data=dataclasses.replace(
            config.data, vocab_size=source_tokenizer.vocab_size))

    # 2. data: rank 0 prepares, the others then reuse its files
    if not dist.main:
        dist.barrier()
    prepared = prepare(config.data, quiet=not talk, tokenizer=source_tokenizer if source else None)
    if dist.main:
        dist.barrier()
    tokenizer_bytes = prepared.tokenizer.to_bytes()
    config = dataclasses.replace(config, model=dataclasses.replace(
        config.model, vocab_size=prepared.tokenizer.vocab_size))

    # 3. model (fresh, init_from, or resumed)
    state = None
    ckpt_path = os.path.join(config.out_dir, checkpoint.FILENAME)
    if resume:
        if not os.path.exists(ckpt_path):
            raise CheckpointError(f"cannot resume: no checkpoint {ckpt_path!r}; run without --resume to start "
                                  f"a new run in out_dir={config.out_dir!r}")
        state = checkpoint.load(ckpt_path, map_location=str(device))
        _check_resumable(config, state)
        for key in ("optimizer", "step", "rng", "data_state"):
            if key not in state:
                raise CheckpointError(f"cannot resume {ckpt_path!r}: it lacks '{key}' (not a training checkpoint)")
    elif dist.main and os.path.exists(ckpt_path):
        say(f"note: {ckpt_path} exists and will be replaced by this new run (use --resume to continue it)")

    torch.manual_seed(config.seed)
    raw = GPT(config.model)
    if source is not None and state is None:
        load_source_weights(raw, source)
    if state is not None:
        raw.load_state_dict(state["model"])
    raw.to(device)
    optimizer = make_optimizer(raw, t, device)
    generator = torch.Generator().manual_seed(config.seed)
    step = 0
    best_bpc = None
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
        best_bpc = state.get("best_val_bpc")
        _set_rng_state(state["rng"], device)
        generator.set_state(state["data_state"]["generator"])
    del source

    model = raw
    if dist.enabled:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(raw, device_ids=[device.index] if device.type == "cuda" else None)
    if t.compile:
        model = torch.compile(model)

    B, T, A = t.batch_size, config.model.block_size, t.grad_accum
    tokens_per_step = B * T * A * dist.world
    metrics_path = os.path.join(config.out_dir, METRICS_FILE)
    if dist.main:
        os.makedirs(config.out_dir, exist_ok=True)
        if state is not None:
            _truncate_metrics(metrics_path, step)
        elif os.path.exists(metrics_path):
            os.unlink(metrics_path)
    val_set = eval_batches(prepared.val, config)

    def log(record: dict) -> None:
        if dist.main:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def save(val: Optional[dict] = None) -> str:
        if not dist.main:
            return ckpt_path
        return checkpoint.save({
            "model": raw.state_dict(), "config": config.to_dict(), "tokenizer": tokenizer_bytes,
            "optimizer": optimizer.state_dict(), "step": step, "rng": _rng_state(device),
            "data_state": {"generator": generator.get_state(), "world_size": dist.world,
                           "tokens_seen": step * tokens_per_step},
            "best_val_bpc": best_bpc, "val": val,
        }, ckpt_path)

    if talk:
        say(f"model: {raw.num_params() / 1e6:.2f}M parameters, position {config.model.position}, "
            f"{config.model.n_layer} layers x d_model {config.model.d_model}, block_size {T}; "
            f"device {device}, {str(dtype).replace('torch.', '')}"
            f"{f', {dist.world} processes' if dist.enabled else ''}; "
            f"{tokens_per_step:,} tokens/step; out_dir {config.out_dir}")
        if state is not None:
            say(f"resuming {ckpt_path} at step {step}")

    # 4. the loop
    from tqdm import tqdm

    raw.train()
    start_step, loop_started = step, time.time()
    last_val: Optional[dict] = None
    interrupted = None
    bar = tqdm(total=t.max_steps, initial=step, disable=not talk, dynamic_ncols=True, unit="step", file=sys.stderr)
    window_tokens, window_started = 0, time.time()
    with StopFlag() as stop:
        while step < t.max_steps:
            lr = lr_at(step, t)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x_all, y_all = get_batch(prepared.train, B * A * dist.world, T, generator)
            loss_sum = torch.zeros((), dtype=torch.float64)
            for micro in range(A):
                rows = slice((micro * dist.world + dist.rank) * B, (micro * dist.world + dist.rank + 1) * B)
                x, y = x_all[rows].to(device, non_blocking=True), y_all[rows].to(device, non_blocking=True)
                sync = contextlib.nullcontext() if (not dist.enabled or micro == A - 1) else model.no_sync()
                with sync:
                    with autocast(device, dtype):
                        loss = loss_fn(model(x), y) / A
                    loss.backward()
                loss_sum += loss.detach().double().cpu()
            grad_norm = None
            if t.grad_clip > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(raw.parameters(), t.grad_clip)
            # one small all-reduce: mean loss over ranks, and agreement on stopping
            flags = torch.tensor([float(loss_sum), 1.0 if stop.signum is not None else 0.0], dtype=torch.float64)
            if dist.enabled:
                flags = flags.to(device)
                torch.distributed.all_reduce(flags)
                flags = flags.cpu()
            loss_value = float(flags[0]) / dist.world
            if not math.isfinite(loss_value) or (grad_norm is not None and not torch.isfinite(grad_norm)):
                bar.close()
                what = "loss" if not math.isfinite(loss_value) else "gradient norm"
                kept = f"the last good checkpoint {ckpt_path} is kept" if os.path.exists(ckpt_path) \
                    else "no checkpoint was written"
                raise TrainingError(f"{what} is {loss_value if what == 'loss' else float(grad_norm)} at step "
                                    f"{step + 1}: stopping; {kept}; try a lower train.lr or train.grad_clip")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            window_tokens += tokens_per_step
            bar.update(1)

            if step % t.log_interval == 0 or step == t.max_steps:
                now = time.time()
                speed = window_tokens / max(now - window_started, 1e-9)
                window_tokens, window_started = 0, now
                bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{lr:.2e}", tok_s=f"{speed:,.0f}", refresh=False)
                log({"event": "train", "step": step, "tokens": step * tokens_per_step, "loss": round(loss_value, 5),
                     "lr": lr, "grad_norm": None if grad_norm is None else round(float(grad_norm), 4),
                     "tokens_per_s": round(speed, 1), "elapsed_s": round(now - started, 2)})
            if step % t.eval_interval == 0 and step < t.max_steps:
                last_val = val_metrics(evaluate(raw, val_set, device, dtype, dist), prepared)
                best_bpc = last_val["val_bpc"] if best_bpc is None else min(best_bpc, last_val["val_bpc"])
                log({"event": "eval", "step": step, "tokens": step * tokens_per_step, **last_val})
                say(f"step {step}: val loss {last_val['val_loss']:.4f}, ppl {last_val['val_ppl']:.2f}, "
                    f"{last_val['val_bpc']:.4f} bits/char")
            stop_now = float(flags[1]) > 0
            stop_now = stop_now and step < t.max_steps  # a signal during the last step: just finish
            if (step % t.checkpoint_interval == 0 and step < t.max_steps) or stop_now:  # the end saves below
                save(last_val)
            if step % t.eval_interval == 0 or step % t.checkpoint_interval == 0:
                window_tokens, window_started = 0, time.time()  # tokens/s counts training time only
            if stop_now:
                interrupted = signal.Signals(stop.signum).name if stop.signum else "SIGTERM"
                break
    bar.close()
    train_seconds = time.time() - loop_started

    # 5. the end: full validation, checkpoint, sample, summary
    final = None
    if interrupted is None:
        if t.final_eval_tokens > 0:
            batches = split_batches(prepared.val, T, B, t.final_eval_tokens)
            final = val_metrics(evaluate(raw, batches, device, dtype, dist), prepared)
        else:
            final = val_metrics(evaluate(raw, val_set, device, dtype, dist), prepared)
        best_bpc = final["val_bpc"] if best_bpc is None else min(best_bpc, final["val_bpc"])
        log({"event": "final", "step": step, "tokens": step * tokens_per_step, **final})
        save(final)
    sample = None
    if interrupted is None and dist.main and t.sample_tokens > 0:
        sample = sample_text(raw, prepared.tokenizer, t.sample_tokens, config.seed)
    summary = {
        "checkpoint": ckpt_path, "steps": step, "tokens": step * tokens_per_step,
        "seconds": round(time.time() - started, 2),
        "tokens_per_s": round((step - start_step) * tokens_per_step / max(train_seconds, 1e-9), 1),
        "best_val_bpc": best_bpc,
        "final_val_loss": final and final["val_loss"], "final_val_bpc": final and final["val_bpc"],
        "final_val_ppl": final and final["val_ppl"], "interrupted": interrupted, "sample": sample,
    }
    if talk:
        if sample is not None:
            say(f"--- sample ({t.sample_tokens} tokens, temperature {SAMPLE_TEMPERATURE}) ---\n{sample.strip()}\n---")
        if interrupted:
            say(f"interrupted by {interrupted} at step {step}: saved {ckpt_path}; continue with --resume")
        else:
            say(f"done: {step} steps, {step * tokens_per_step / 1e6:.2f}M tokens in {_format_time(summary['seconds'])} "
                f"({summary['tokens_per_s']:,.0f} tokens/s); val {final['val_bpc']:.4f} bits/char "
                f"(loss {final['val_loss']:.4f}, best {best_bpc:.4f}); checkpoint {ckpt_path}")
    if dist.enabled:
        dist.barrier()
        if dist.owned:
            torch.distributed.destroy_process_group()
    return summary
