"""The training loop: data, model, optimiser, schedule, evaluation, checkpoints, DDP, autocast.

``train(config)`` runs one experiment end to end and returns a summary dict; ``train.py``
only parses arguments and calls it, and other code (the experiment runner) can call it
in-process. What it does, in order:

1. Prepare the corpus (``minilm.data.prepare``; rank 0 first under DDP); the vocabulary size follows
   its tokenizer (``config.resolve_config``), with ``train.init_from`` the source's (any corpus), with
   ``resume=True`` the checkpoint's (never a tokenizer trained again: the weights learned its ids).
2. Build the model: fresh, from ``train.init_from`` (trained weights through
   ``minilm.checkpoints.loading.load_model``; fresh optimiser and step), or with ``resume=True`` from
   ``<out_dir>/ckpt.pt`` (weights, optimiser, step, RNG and data state), exactly.
3. Loop over optimizer steps. Each step draws one *global* batch of
   ``world_size * grad_accum * batch_size`` sequences from a generator seeded by
   ``config.batch_seed`` (data_seed, else seed) and identical on every rank; rank r takes its own rows of it for
   each micro-step. Every rank therefore sees different sequences, and the data a step
   sees depends only on the global batch, not on how it is split over processes and
   micro-steps: two DDP processes reproduce one process with ``grad_accum=2``. Micro-steps
   before the last skip DDP's gradient all-reduce (``no_sync``).
   With ``train.lora.r`` only low-rank adapters (and ``also_train``) train (``minilm.training.adapters``).
4. The optimiser of ``minilm.training.optim`` (AdamW or Muon; what decays, its docstring says).
   Learning rate: linear warmup over ``warmup_steps``, then down to ``min_lr`` at ``max_steps``:
   a cosine, or held and then a linear cooldown (``train.schedule``, ``minilm.training.optim.lr_at``).
   Gradients are clipped to a global norm of ``grad_clip`` (0 disables).
5. Every ``eval_interval`` steps: loss, perplexity and bits per character on a fixed set of
   ``eval_iters`` validation batches (the same each time). At the end: the same over the whole
   validation split in ``block_size`` segments (at most ``final_eval_tokens`` tokens). Bits per
   character = mean nats per token * val tokens / val characters / ln 2 (tokenizer-independent).
6. Checkpoint ``<out_dir>/ckpt.pt`` (atomic, ``minilm.training.saving.write_checkpoint``) every
   ``checkpoint_interval`` steps, at the end, and when Ctrl-C or SIGTERM stops the run.
   It always holds the latest state (what ``--resume`` needs); the final model is the
   last one. A NaN/inf loss or gradient stops the run before the optimizer step, without
   saving, so the last good checkpoint stays.
7. Print a ``sample_tokens`` sample (temperature 0.8, ``minilm.generation``) and a summary line.

``train`` is four stages: ``setup`` (1-2), ``train_step`` (3-4), ``after_step`` (5-6 during the loop)
and ``finish`` (5-7 at the end). Precision: ``train.dtype`` (``common.resolve_dtype``; auto: bf16
autocast where the hardware has native bf16 units, else float32).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import shutil
import signal
import sys
import time
from typing import Any, Optional

import torch
import torch.distributed
from tqdm import tqdm

from minilm.checkpoints import format as checkpoint
from minilm.common import (
    TRAIN_DTYPES,
    MinilmError,
    WriteError,
    autocast,
    output_path,
    peak_memory_mib,
    resolve_device,
    resolve_dtype,
)
from minilm.config import Config, resolve_config
from minilm.data.batches import Documents, crossing_rows
from minilm.data.corpus import Prepared, prepare
from minilm.data.retrieval import Task
from minilm.evaluation.scoring import document_forward, eval_batches, heldout_loss, split_batches
from minilm.generation.decode import Sampling
from minilm.generation.text import generate_text
from minilm.model.gpt import GPT
from minilm.training.adapters import start_adapters
from minilm.training.announce import start_metrics
from minilm.training.distributed import Dist, init_distributed
from minilm.training.loggers import check_loggers
from minilm.training.memory import check_step_fits
from minilm.training.mixture import draw, mixed_loss, task_for
from minilm.training.optim import Optimizers, lr_at, make_optimizer
from minilm.training.outdir import check_not_own_base, claim
from minilm.training.parallel import full_model_state, is_sharded, load_full_optimizer_state, spread
from minilm.training.resume import StopFlag, check_steps_left, resumed_config, resumed_tokenizer, set_rng_state
from minilm.training.saving import checkpoint_path, load_sharded, resume_state, whole_model, write_checkpoint
from minilm.training.source import starting_config

SAMPLE_TEMPERATURE = 0.8


class TrainingError(MinilmError):
    """The run cannot go on (e.g. a NaN loss); the message is one line for the user."""


# --------------------------------------------------------------------------- settings

# --------------------------------------------------------------------------- evaluation


def val_metrics(loss: float, prepared: Prepared) -> dict:
    return {
        "val_loss": round(loss, 5),
        "val_ppl": round(math.exp(min(loss, 50.0)), 3),
        "val_bpc": round(prepared.bits_per_char(loss, "val"), 5),
    }


def sample_text(model: GPT, tokenizer, num_tokens: int, seed: int) -> str:
    """A short temperature sample continuing a newline (minilm.generation, KV cache)."""
    return generate_text(
        model, tokenizer, "\n", max_new_tokens=num_tokens, sampling=Sampling(temperature=SAMPLE_TEMPERATURE), seed=seed
    )[0]


def _format_time(seconds: float) -> str:
    minutes, sec = divmod(int(round(seconds)), 60)
    return f"{minutes}m{sec:02d}s" if minutes else f"{seconds:.1f}s"


# --------------------------------------------------------------------------- the run


@dataclasses.dataclass
class TrainingRun:
    """Everything one training run holds between its stages."""

    config: Config
    dist: Dist
    device: torch.device
    dtype: torch.dtype
    talk: bool
    prepared: Prepared
    raw: GPT  # the model itself (``model`` may be its DDP or compiled wrapper; FSDP shards ``raw`` in place)
    model: torch.nn.Module
    optimizer: Optimizers
    generator: torch.Generator
    started: float
    step: int = 0
    best_bpc: Optional[float] = None
    last_val: Optional[dict] = None
    task: Optional[Task] = None  # the retrieval task of train.retrieval_share (minilm.training.mixture)
    loss_parts: dict = dataclasses.field(default_factory=dict)  # retrieval_weight > 0: text_loss, task_loss (rank 0)
    scaler: Optional[torch.amp.GradScaler] = None  # train.dtype float16: the loss scale (else None)
    skipped_steps: int = 0  # float16: steps whose gradients overflowed, skipped (the scale then halves)
    loggers: list = dataclasses.field(default_factory=list)  # train.loggers, on rank 0 (minilm.training.loggers)
    lora_base: Optional[dict] = None  # train.lora: the base's path and weights' hash (minilm.training.adapters)
    rows: Any = None  # where the batches come from: the train tokens, or data.min_document_tokens' Documents
    crossing: list = dataclasses.field(default_factory=lambda: [0, 0])  # rows holding a document's end, rows drawn
    body: Any = None  # train.compile: GPT.body compiled (the training passes run it; evaluation stays eager)
    tokens_before: int = 0  # resumed with another batch: the tokens its steps saw beyond step x tokens_per_step

    @property
    def ckpt_path(self) -> str:
        """The checkpoint this run writes: ckpt.pt, or the directory ckpt.dcp (train.checkpoint_format)."""
        return checkpoint_path(self.config.out_dir, self.config.train.checkpoint_format)

    @property
    def sharded(self) -> bool:
        """Whether FSDP shards the model over the processes (train.parallel: fsdp under torchrun)."""
        return is_sharded(self.config.train.parallel, self.dist)

    @property
    def tokens_per_step(self) -> int:
        t = self.config.train
        return t.batch_size * self.config.model.block_size * t.grad_accum * self.dist.world

    def tokens_at(self, step: int) -> int:
        """The tokens trained on by the end of ``step``, a resumed run's earlier steps at their own batch."""
        return self.tokens_before + step * self.tokens_per_step

    def say(self, message: str, result: bool = False) -> None:
        """A note or progress on stderr; with ``result`` what the run produced (its summary, its
        sample), on stdout, so that ``> log`` keeps it."""
        if self.talk:
            tqdm.write(message, file=sys.stdout if result else sys.stderr)

    def log(self, record: dict) -> None:
        for logger in self.loggers:  # rank 0's only
            logger.write(record)

    def save(self, val: Optional[dict] = None) -> str:
        """The checkpoint, as train.checkpoint_format says; called on every rank."""
        try:
            return write_checkpoint(self, val)
        except (OSError, WriteError) as exc:
            reason = exc.reason if isinstance(exc, WriteError) else exc.strerror or exc
            kept = (
                "the previous checkpoint is kept: continue it with --resume once the problem is solved"
                if os.path.exists(self.ckpt_path)
                else "no checkpoint was written"
            )
            raise TrainingError(
                f"cannot save the checkpoint {self.ckpt_path!r} at step {self.step}: {reason}; {kept}"
            ) from None

    def save_snapshot(self) -> str:
        """The weights alone (no optimizer: not resumable) at this step, ``snapshots/step-N.pt``,
        loadable by ``minilm.load_model`` like any checkpoint (``train.snapshot_steps``). A file
        already there (a resumed run's, from the steps after its checkpoint) is kept as
        ``step-N.1.pt`` and said in one note (``common.output_path``), never replaced."""
        path = os.path.join(self.config.out_dir, "snapshots", f"step-{self.step}.pt")
        weights = full_model_state(self.raw, self.sharded)
        try:
            if self.dist.main:
                output_path(path, say=self.say, why=": this run resumed from a checkpoint before that step")
                checkpoint.save(
                    {
                        "model": weights,
                        "config": self.config.to_dict(),
                        "run_dir": os.getcwd(),
                        "tokenizer": self.prepared.tokenizer.to_bytes(),
                        "step": self.step,
                    },
                    path,
                )
        except (OSError, WriteError) as exc:
            reason = exc.reason if isinstance(exc, WriteError) else exc.strerror or exc
            raise TrainingError(f"cannot save the snapshot {path!r}: {reason}") from None
        return path

    @property
    def forward_options(self) -> dict:
        """What every forward pass of the run is given: the documents to mask (``data.document_mask``)."""
        return document_forward(self.config.data, self.prepared.eot_id)

    def validate(self, batches, progress: Optional[str] = None) -> dict:
        """Validation metrics over ``batches``; ``progress``: a bar of that description while the run talks."""
        return val_metrics(
            heldout_loss(
                self.raw,
                batches,
                self.device,
                self.dtype,
                self.dist,
                lockstep=self.sharded,
                progress=progress if self.talk else None,
                **self.forward_options,
            ),
            self.prepared,
        )


def train(
    config: Config, *, resume: bool = False, overwrite: bool = False, quiet: bool = False, reprepare: bool = False
) -> dict:
    """Train as ``config`` says; return a summary dict.

    Summary keys: checkpoint (path), steps (optimizer steps done in total), tokens (training
    tokens seen in total), seconds (wall time of this call, data preparation included), dtype,
    tokens_per_s (this call's training throughput), best_val_bpc (the lowest of the run's evaluations:
    the periodic ones, each on ``train.eval_iters`` random windows, and the final one, the whole split
    up to ``train.final_eval_tokens``: two measures, so the best can be a lucky draw of windows; the final
    one is final_val_bpc), final_val_loss, final_val_bpc, final_val_ppl, interrupted (signal name or
    None), sample (text or None).
    A fresh run refuses an out_dir that holds a checkpoint unless ``overwrite`` (which replaces
    only a minilm checkpoint: a ckpt.pt of the user's is set aside); any run refuses the
    out_dir that holds its ``train.init_from``; one out_dir serves one live run at a time
    (``minilm.training.outdir``). Raises a MinilmError (ConfigError,
    CheckpointError, DataError, OutDirError, TrainingError, ...) with a one-line message.
    ``reprepare`` tokenizes the corpus again even where its prepared files look current.
    """
    main = int(os.environ.get("RANK", "0")) == 0
    check_loggers(config.train.loggers)  # a missing package is said before anything is done
    check_not_own_base(
        config.out_dir, config.train.init_from, resume=resume
    )  # before out_dir is claimed: nothing written
    with claim(config.out_dir, resume=resume, overwrite=overwrite, main=main):
        return _train(config, resume=resume, quiet=quiet, reprepare=reprepare)


def _train(config: Config, *, resume: bool, quiet: bool, reprepare: bool = False) -> dict:
    run = setup(config, resume=resume, quiet=quiet, reprepare=reprepare)
    val_set = eval_batches(run.prepared.val, run.config)
    start_step, loop_started, interrupted = run.step, time.time(), None
    meter = {"tokens": 0, "since": time.time()}  # tokens/s over the steps since the last log line
    with (
        tqdm(
            total=run.config.train.max_steps,
            initial=run.step,
            disable=not run.talk,
            dynamic_ncols=True,
            unit="step",
            file=sys.stderr,
        ) as bar,
        StopFlag() as stop,
    ):
        while run.step < run.config.train.max_steps and interrupted is None:
            loss, grad_norm, lr, stop_requested = train_step(run, stop)
            bar.update(1)
            interrupted = after_step(run, bar, meter, val_set, loss, grad_norm, lr, stop_requested, stop)
    try:
        return finish(run, val_set, interrupted, start_step, time.time() - loop_started)
    finally:
        for logger in run.loggers:
            logger.close()


def printed_config(config: Config, resume: bool = False) -> Config:
    """The config ``--print-config`` prints: what the run's start would train with, found as ``setup``
    finds it but without preparing data: ``starting_config``'s (the source's architecture and
    vocabulary, a data.tokenizer's vocabulary), with ``resume`` the checkpoint's train settings except
    those given again (``resumed_config``, after the same checks as the run's)."""
    config = starting_config(config, fresh=not resume)[0]
    if resume:
        config = resumed_config(config, resume_state(config, torch.device("cpu")))[0]
    return config


def setup(config: Config, *, resume: bool = False, quiet: bool = False, reprepare: bool = False) -> TrainingRun:
    """Stages 1-2: data, model, optimiser and data generator, fresh, from init_from or resumed."""
    started, t = time.time(), config.train
    dist = init_distributed(t)
    device = resolve_device(t.device, setting="train.device", local_rank=dist.local_rank)
    dtype = resolve_dtype(t.dtype, device, setting="train.dtype", valid=TRAIN_DTYPES)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    config, source, said = starting_config(config, fresh=not resume)
    if said and dist.main and not quiet:
        tqdm.write(said, file=sys.stderr)
    state, taken = None, []
    if resume:  # checked against what the config asks for, before any data is prepared
        state = resume_state(config, device)
        config, taken = resumed_config(config, state)  # the checkpoint's train settings, except those given again
        check_steps_left(config, state, taken)
    if not dist.main:  # rank 0 prepares the data, the others then reuse its files
        dist.barrier()
    prepared = prepare(
        config.data,
        quiet=not (dist.main and not quiet),
        tokenizer=resumed_tokenizer(config, state) if state is not None else source.tokenizer if source else None,
        reprepare=reprepare and dist.main,
    )
    if dist.main:
        dist.barrier()
    config = resolve_config(config, tokenizer=prepared.tokenizer)
    t = config.train  # what this run trains with: the source's, the checkpoint's, or as given
    dtype = resolve_dtype(t.dtype, device, setting="train.dtype", valid=TRAIN_DTYPES)
    torch.manual_seed(config.seed)
    check_step_fits(config, device, dtype, dist.world if dist.enabled else 1)  # before anything is allocated
    on_meta = is_sharded(t.parallel, dist) and not dist.main  # FSDP: rank 0 builds, the others get their shards
    with torch.device("meta") if on_meta else contextlib.nullcontext():
        raw = GPT(config.model)
    if not on_meta:
        if ((state is not None and "model" in state) or source is not None) and not t.lora.r:  # sharded: below
            raw.load_state_dict(state["model"] if state is not None else source.model.state_dict())
        elif t.lora.r:  # the base's weights, the adapters and (resumed) what they had learned
            raw.load_state_dict(source.model.state_dict())
            lora_base = start_adapters(raw, t.lora, source, dtype, config.out_dir, state)
        raw.to(device)
    raw.checkpoint_blocks = t.activation_checkpointing
    model = spread(raw, t.parallel, dist, device, dtype)  # FSDP replaces raw's parameters by their shards
    run = TrainingRun(
        config,
        dist,
        device,
        dtype,
        dist.main and not quiet,
        prepared,
        raw,
        model,
        make_optimizer(raw, t, device, dtype),
        torch.Generator().manual_seed(config.batch_seed),
        started,
        lora_base=lora_base if t.lora.r else None,
        body=torch.compile(raw.body, dynamic=False)
        if compiles(config.train, device, dtype, sharded=is_sharded(t.parallel, dist))
        else None,
    )
    if state is not None and "model" not in state:
        load_sharded(state, raw, run.optimizer)
    elif state is not None:
        run.optimizer.load_state_dict(
            state["optimizer"], functools.partial(load_full_optimizer_state, raw, sharded=run.sharded)
        )
    if state is not None:
        run.step, run.best_bpc = int(state["step"]), state.get("best_val_bpc")
        seen = state["data_state"].get("tokens_seen", run.step * run.tokens_per_step)
        run.tokens_before = int(seen) - run.step * run.tokens_per_step
        set_rng_state(state["rng"], device)
        run.generator.set_state(state["data_state"]["generator"])
    if dtype == torch.float16:  # fp16 overflows where bf16 does not: scale the loss, skip steps that overflow
        run.scaler = torch.amp.GradScaler(device.type)
        if state is not None and "scaler" in state:
            run.scaler.load_state_dict(state["scaler"])
            run.skipped_steps = int(state.get("skipped_steps", 0))
    run.task = task_for(config, prepared)
    run.rows = (
        Documents(prepared.train, prepared.eot_id, config.data.min_document_tokens)
        if config.data.min_document_tokens
        else prepared.train
    )
    start_metrics(run, state, taken)
    return run


COMPILE_PAYS_AFTER = 1000  # train.compile auto: steps from which compiling pays for itself (docs/benchmarks.md)


def compiles(t, device: torch.device, dtype: torch.dtype, sharded: bool = False) -> bool:
    """Whether the run compiles its training passes (``train.compile``): true, or ``auto`` on a run of
    at least ``COMPILE_PAYS_AFTER`` steps on a CPU with inductor's C++ compiler ($CXX or g++), training in
    ``dtype`` bf16 or float16 autocast, not ``sharded`` by FSDP (what was measured: a CPU, unsharded, bf16; a
    float32 step was no faster compiled, on an AVX2-only CPU). Refused in one line where true asks for a C++
    compiler that is missing."""
    if t.compile is False or (
        t.compile == "auto"
        and (t.max_steps < COMPILE_PAYS_AFTER or sharded or device.type != "cpu" or dtype == torch.float32)
    ):
        return False
    if device.type != "cpu":
        return True
    compiler = os.environ.get("CXX") or "g++"
    found = shutil.which(compiler) is not None
    if found or t.compile == "auto":
        return found
    raise TrainingError(
        f"train.compile=true compiles the step with a C++ compiler on the CPU, and {compiler} was not found: "
        f"install one (or set $CXX), or train.compile=false"
    )


def train_step(run: TrainingRun, stop: StopFlag) -> tuple:
    """Stages 3-4: one optimizer step over the next global batch; returns (mean loss,
    gradient norm or None, lr, whether any rank was asked to stop)."""
    t, dist, device = run.config.train, run.dist, run.device
    B, T, A = t.batch_size, run.config.model.block_size, t.grad_accum
    lr = lr_at(run.step, t)
    run.optimizer.set_lr(lr)
    x_all, y_all, mask_all = draw(
        run.rows,
        B * A * dist.world,
        T,
        run.generator,
        run.step,
        t.retrieval_share,
        run.task,
        keep_text=t.retrieval_weight > 0,
    )
    if run.prepared.eot_id is not None:
        run.crossing[0] += crossing_rows(x_all, run.prepared.eot_id)
        run.crossing[1] += len(x_all)
    loss_sum = torch.zeros((), dtype=torch.float64)
    run.loss_parts.clear()  # what mixed_loss logs: this step's, from its last micro-batch
    for micro in range(A):
        row = micro * dist.world + dist.rank
        x, y = (
            x_all[row * B : (row + 1) * B].to(device, non_blocking=True),
            y_all[row * B : (row + 1) * B].to(device, non_blocking=True),
        )
        # DDP averages the gradients over the ranks after the last micro-step only; FSDP after every one,
        # into the shards, so that no rank ever holds whole gradients
        last = micro == A - 1
        with contextlib.nullcontext() if (not dist.enabled or last or run.sharded) else run.model.no_sync():
            with autocast(device, run.dtype):
                mask = None if mask_all is None else mask_all[row * B : (row + 1) * B].to(device)
                loss = (
                    run.model(
                        x,
                        head=lambda hidden, weight, cap: mixed_loss(
                            hidden, weight, cap, y, mask, t.retrieval_weight, run.loss_parts
                        ),
                        body=run.body,
                        **run.forward_options,
                    )
                    / A
                )  # the loss inside the forward pass
            (run.scaler.scale(loss) if run.scaler else loss).backward()
        loss_sum += loss.detach().double().cpu()
    if run.scaler:  # the true gradients, then their norm (computed anyway: an inf in it is an overflow)
        run.optimizer.unscale(run.scaler)
    grad_norm = (
        torch.nn.utils.clip_grad_norm_(run.raw.parameters(), t.grad_clip or math.inf)
        if t.grad_clip > 0 or run.scaler
        else None
    )
    if grad_norm is not None and hasattr(grad_norm, "full_tensor"):  # FSDP: a DTensor, the same on every rank
        grad_norm = grad_norm.full_tensor()
    # one small all-reduce: mean loss over ranks, and agreement on stopping
    flags = torch.tensor([float(loss_sum), 1.0 if stop.signum is not None else 0.0], dtype=torch.float64)
    if dist.enabled:
        flags = flags.to(device)
        torch.distributed.all_reduce(flags)
        flags = flags.cpu()
    loss_value = float(flags[0]) / dist.world
    # float16: the scaled gradients overflowed; no part steps, and the scaler's update halves the scale
    overflow = run.scaler is not None and math.isfinite(loss_value) and not torch.isfinite(grad_norm)
    if overflow:
        run.skipped_steps += 1
    elif not math.isfinite(loss_value) or (grad_norm is not None and not torch.isfinite(grad_norm)):
        what = "loss" if not math.isfinite(loss_value) else "gradient norm"
        kept = (
            f"the last good checkpoint {run.ckpt_path} is kept"
            if os.path.exists(run.ckpt_path)
            else "no checkpoint was written"
        )
        raise TrainingError(
            f"{what} is {loss_value if what == 'loss' else float(grad_norm)} at step "
            f"{run.step + 1}: stopping; {kept}; try a lower train.lr or train.grad_clip"
        )
    else:
        run.optimizer.step(run.scaler)
    if run.scaler:
        run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    run.step += 1
    return loss_value, None if overflow else grad_norm, lr, float(flags[1]) > 0


def after_step(
    run: TrainingRun, bar, meter: dict, val_set, loss: float, grad_norm, lr: float, stop_requested: bool, stop: StopFlag
) -> Optional[str]:
    """Stages 5-6 during the loop: log, evaluate and checkpoint on their intervals; returns the
    name of the signal that stops the run, or None."""
    t, step = run.config.train, run.step
    meter["tokens"] += run.tokens_per_step
    if step % t.log_interval == 0 or step == t.max_steps:
        now = time.time()
        speed = meter["tokens"] / max(now - meter["since"], 1e-9)
        meter.update(tokens=0, since=now)
        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{speed:,.0f}", refresh=False)
        run.log(
            {
                "event": "train",
                "step": step,
                "tokens": run.tokens_at(step),
                "loss": round(loss, 5),
                "lr": lr,
                "grad_norm": None if grad_norm is None else round(float(grad_norm), 4),
                "tokens_per_s": round(speed, 1),
                "elapsed_s": round(now - run.started, 2),
                "memory_mib": peak_memory_mib(run.device),
                **{k: round(float(v), 5) for k, v in run.loss_parts.items()},
                **({"skipped_steps": run.skipped_steps, "loss_scale": run.scaler.get_scale()} if run.scaler else {}),
            }
        )
    if step % t.eval_interval == 0 and step < t.max_steps:
        run.last_val = run.validate(val_set)
        bpc = run.last_val["val_bpc"]
        run.best_bpc = bpc if run.best_bpc is None else min(run.best_bpc, bpc)
        run.log({"event": "eval", "step": step, "tokens": run.tokens_at(step), **run.last_val})
        run.say(
            f"step {step}: val loss {run.last_val['val_loss']:.4f}, ppl {run.last_val['val_ppl']:.2f}, "
            f"{bpc:.4f} bits/char"
        )
    if step in t.snapshot_steps:
        run.save_snapshot()
    stop_now = stop_requested and step < t.max_steps  # a signal during the last step: just finish
    if (step % t.checkpoint_interval == 0 and step < t.max_steps) or stop_now:  # the end saves in finish
        run.save(run.last_val)
    if step % t.eval_interval == 0 or step % t.checkpoint_interval == 0:
        meter.update(tokens=0, since=time.time())  # tokens/s counts training time only
    if stop_now:
        return signal.Signals(stop.signum).name if stop.signum else "SIGTERM"
    return None


def finish(run: TrainingRun, val_set, interrupted: Optional[str], start_step: int, train_seconds: float) -> dict:
    """Stages 5-7 at the end: full validation, the last checkpoint, a sample and the summary."""
    t, step, final, sample = run.config.train, run.step, None, None
    if interrupted is None:
        batches = (
            split_batches(run.prepared.val, run.config.model.block_size, t.batch_size, t.final_eval_tokens)
            if t.final_eval_tokens > 0
            else val_set
        )
        final = run.validate(batches, progress="final evaluation")
        run.best_bpc = final["val_bpc"] if run.best_bpc is None else min(run.best_bpc, final["val_bpc"])
        run.log({"event": "final", "step": step, "tokens": run.tokens_at(step), **final})
        run.save(final)
        whole = whole_model(run) if t.sample_tokens > 0 else None
        if whole is not None:  # a LoRA model's frozen weights are in the compute dtype: sample under its autocast
            with autocast(run.device, run.dtype) if t.lora.r else contextlib.nullcontext():
                sample = sample_text(whole, run.prepared.tokenizer, t.sample_tokens, run.config.seed)
    summary = {
        "checkpoint": run.ckpt_path,
        "steps": step,
        "tokens": run.tokens_at(step),
        "seconds": round(time.time() - run.started, 2),
        "dtype": str(run.dtype).replace("torch.", ""),
        "tokens_per_s": round((step - start_step) * run.tokens_per_step / max(train_seconds, 1e-9), 1),
        "best_val_bpc": run.best_bpc,
        "final_val_loss": final and final["val_loss"],
        "final_val_bpc": final and final["val_bpc"],
        "final_val_ppl": final and final["val_ppl"],
        "interrupted": interrupted,
        "sample": sample,
        **({"skipped_steps": run.skipped_steps} if run.scaler else {}),
        **({"rows_crossing_documents": run.crossing[0] / run.crossing[1]} if run.crossing[1] else {}),
    }
    if sample is not None:
        run.say(
            f"--- sample ({t.sample_tokens} tokens, temperature {SAMPLE_TEMPERATURE}) ---\n{sample.strip()}\n---",
            result=True,
        )
    if interrupted:
        run.say(f"interrupted by {interrupted} at step {step}: saved {run.ckpt_path}; continue with --resume")
    else:
        run.say(
            f"done: {step} steps, {summary['tokens'] / 1e6:.2f}M tokens in {_format_time(summary['seconds'])} "
            f"({summary['tokens_per_s']:,.0f} tokens/s); val {final['val_bpc']:.4f} bits/char "
            f"(loss {final['val_loss']:.4f}, best {run.best_bpc:.4f}); checkpoint {run.ckpt_path}"
            + (
                f"; {summary['rows_crossing_documents']:.1%} of the rows crossed a document boundary"
                if run.crossing[1]
                else ""
            ),
            result=True,
        )
    run.model = run.raw  # DDP's wrapper and its Reducer are freed before the process group (Dist.finish)
    run.dist.finish()
    return summary
