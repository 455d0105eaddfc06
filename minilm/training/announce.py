"""The opening of a training run: its out_dir (an earlier run's files kept aside) and loggers, and
the lines that say what it is (the model, its parameters and what trains of them, the device, the
notes on settings that do not do what they might seem to, and what a resumed run takes from its
checkpoint)."""

from __future__ import annotations

import os
from typing import Optional

from minilm.config import TrainConfig
from minilm.positions.layers import describe_design
from minilm.training.adapters import count_parameters
from minilm.training.loggers import open_loggers
from minilm.training.optim import lr_at
from minilm.training.outdir import set_aside_previous
from minilm.training.resume import trajectory_changes


def start_metrics(run, state: Optional[dict], taken: list = ()) -> None:
    """Create out_dir, keep aside what an earlier run left there (a fresh run), start the loggers
    (continuing a resumed run's logs), and say what the run (a ``minilm.training.loop.TrainingRun``) is."""
    config, dist, resumed = run.config, run.dist, state is not None
    if dist.main:
        os.makedirs(config.out_dir, exist_ok=True)
        if not resumed:
            start_afresh(run)
        run.loggers = open_loggers(
            config.train.loggers, config.out_dir, run.step if resumed else None, config.to_dict(), run.say
        )
    m = config.model
    trainable, frozen = count_parameters(run.raw)
    position = m.position if m.layers is None else describe_design(m.position, m.layers, m.n_layer)
    run.say(
        f"model: {run.raw.num_params() / 1e6:.2f}M "
        f"parameters{f' ({trainable:,} trained, LoRA)' if frozen else ''}, position {position}, "
        f"{m.n_layer} layers x d_model {m.d_model}, block_size {m.block_size}; "
        f"device {run.device}, {str(run.dtype).replace('torch.', '')}"
        f"{', compiled (the first step compiles)' if run.body is not None else ''}"
        f"{f', {dist.world} processes' if dist.enabled else ''}; "
        f"{run.tokens_per_step:,} tokens/step; out_dir {config.out_dir}"
    )
    t = config.train
    if t.parallel == "fsdp" and not dist.enabled:
        run.say("note: train.parallel=fsdp in one process: there is nothing to shard, the model trains whole")
    if t.warmup_steps >= t.max_steps:
        run.say(
            f"note: train.warmup_steps={t.warmup_steps} >= train.max_steps={t.max_steps}: the whole run warms "
            f"up and the learning rate never reaches train.lr={t.lr:g} (at most {lr_at(t.max_steps - 1, t):.3g})"
        )
    idle = idle_settings(t, run.raw)
    if idle:
        run.say(f"note: {'; '.join(idle)}")
    if resumed:
        say_resumed(run, state, taken)


def start_afresh(run) -> None:
    """A fresh run's out_dir: what an earlier run left is kept aside (``outdir.set_aside_previous``)
    and said in one note, as is a checkpoint that this run's first one will replace."""
    kept = set_aside_previous(run.config.out_dir)
    if kept:
        run.say(f"note: kept the earlier run's {', '.join(kept)} in {run.config.out_dir}; this run starts its own")
    if os.path.exists(run.ckpt_path):
        run.say(f"note: {run.ckpt_path} will be replaced by this run's first checkpoint (--overwrite)")


def say_resumed(run, state: dict, taken: list) -> None:
    """The lines of a resumed run: where it continues, the settings it takes from its checkpoint, and
    what makes it differ from the uninterrupted run (its corpus changed, train settings given anew)."""
    config = run.config
    run.say(f"resuming {run.ckpt_path} at step {run.step}")
    if taken:
        run.say(
            f"note: resuming with the checkpoint's {', '.join(taken)} over the config file's; give a "
            f"setting again on the command line to change it"
        )
    if state.get("corpus_fingerprint") not in (None, run.prepared.manifest.get("source_fingerprint")):
        run.say(
            f"note: data.corpus={config.data.corpus!r} may have changed since the checkpoint was written (its "
            f"files' sizes or dates differ): the run continues on its text as it is now, encoded with the "
            f"checkpoint's tokenizer; if the text changed, it differs from the uninterrupted run"
        )
    world = (state.get("data_state") or {}).get("world_size")
    if world is not None and world != run.dist.world:
        t, was = config.train, state["config"].get("train", {})
        now = run.dist.world * t.grad_accum * t.batch_size  # the global batch: processes x grad_accum x batch_size
        before = world * was.get("grad_accum", t.grad_accum) * was.get("batch_size", t.batch_size)
        if before != now:
            run.say(
                f"note: the checkpoint's run trained on {world} process(es), this one on {run.dist.world}: each "
                f"step now takes {now} sequences, not {before}, so the run differs from the uninterrupted one (the "
                f"same global batch: train.grad_accum x {world / run.dist.world:g})"
            )
    changed = trajectory_changes(config, state)
    if changed:
        run.say(
            f"note: resuming with {', '.join(changed)}: from step {run.step} on the run differs from "
            f"the uninterrupted one (it continues exactly only with the same train settings)"
        )


def idle_settings(t: TrainConfig, model) -> list:
    """'train.KEY=VALUE does nothing ...' for each train setting moved from its default that the run's
    other settings leave unused (a cooldown without wsd, Muon's settings without Muon, the retrieval rows'
    settings without retrieval rows, a position rate scale for a model whose positions have no
    parameters), so that none is taken in silence."""
    default = TrainConfig()
    idle = []
    if t.schedule != "wsd" and t.cooldown != default.cooldown:
        idle.append(
            f"train.cooldown={t.cooldown:g} does nothing with train.schedule={t.schedule!r} (it shapes wsd's decay)"
        )
    for key in ("muon_lr_scale", "muon_split_qkv"):
        if t.optimizer != "muon" and getattr(t, key) != getattr(default, key):
            idle.append(f"train.{key}={getattr(t, key)!r} does nothing with train.optimizer={t.optimizer!r}")
    for key in ("retrieval_queries", "retrieval_spread"):
        if not t.retrieval_share and getattr(t, key) != getattr(default, key):
            idle.append(
                f"train.{key}={getattr(t, key)!r} does nothing with train.retrieval_share=0 (it shapes its rows)"
            )
    learned = any(
        p.requires_grad and name.startswith(("positions.", "layer_positions.")) for name, p in model.named_parameters()
    )
    if t.position_lr_scale != default.position_lr_scale and not learned:
        idle.append(
            f"train.position_lr_scale={t.position_lr_scale:g} does nothing: this model's positions have no parameters"
        )
    return idle
