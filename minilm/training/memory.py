"""What one training step holds in memory per process, from the shapes alone: weights,
gradients, optimiser state and activations, under DDP or FSDP, with and without activation
checkpointing (``python -m minilm memory``). No weights are allocated: a Llama-3-8B-shaped
model is counted on a laptop.

Per process, for N parameters (P of them in the blocks' matrices, the rest in embeddings,
norms and the head) over R processes:

- weights: 4N bytes (float32 master weights; mixed precision computes in bf16 from them);
- gradients: 4N; DDP also keeps its all-reduce buckets, a second 4N (``DistributedDataParallel``
  with its default ``gradient_as_bucket_view=False``);
- optimiser: AdamW's two moments, 8N; Muon keeps one momentum for its matrices, 4P + 8(N - P);
- FSDP divides the three above by R, and adds the weights it gathers whole, in the compute
  dtype: the root's (embedding, head, final norm; kept through the forward pass) and two
  blocks at a time (the one computing and the one prefetched);
- activations: the tensors autograd keeps for the backward pass, counted by running the
  model's training forward pass and loss on the meta device (shapes only) under autograd's
  saved-tensor hooks (``common.saved_tensor_bytes``), so they follow the code as it is, per
  process (its ``train.batch_size`` rows). Under FSDP the weights are in the compute dtype,
  as its mixed precision gathers them; under DDP they are float32 and autocast keeps a copy
  of each in the compute dtype for the backward pass. Attention is counted as the fused kernels keep it (flash
  attention on the CPU and on CUDA: q, k, v, the output and each row's log-sum-exp): on the
  meta device PyTorch has only the math path, which would keep the T x T scores, so the dry
  run stands in a function that keeps what flash keeps. With checkpointing the pass keeps each
  block's input, and the backward pass recomputes one block at a time on top of that.

A LoRA run (``train.lora``, ``minilm.training.adapters``) trains T parameters (the adapters and
``also_train``) and keeps the other F frozen in the compute dtype: weights 4T + F x its width,
gradients 4T (and DDP's buckets 4T), AdamW's moments 8T; its activations are the dry run of the
adapted model (FSDP is not counted: a LoRA run refuses it).

Every count here is a fixed part plus one part per period of layers (the layer pattern's length,
even with value embeddings: a table per pair of layers), so a deep model is counted from three
shallow ones (``by_depth``): count(q p + r) = count(p + r) + (q - 1) (count(2p) - count(p)), in
seconds at any depth. The count of activations is checked against a real CPU forward pass, and the
shallow counts against the whole model's, in ``tests/test_memory.py``.
Not counted: the CUDA context and allocator slack, communication buffers beyond DDP's buckets,
temporaries inside a kernel, the data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from minilm.common import MinilmError, available_memory, saved_tensor_bytes
from minilm.config import ModelConfig
from minilm.model.attention import QUERY_CHUNK
from minilm.model.gpt import GPT
from minilm.model.lora import add_adapters, freeze_in
from minilm.positions.layers import layer_types
from minilm.training.mixture import mixed_loss
from minilm.training.optim import is_hidden_matrix

ROWS = ("weights", "gradients", "optimizer", "gathered", "activations")
LAYOUTS = (("ddp", False), ("ddp", True), ("fsdp", False), ("fsdp", True))


class _FlashAttention(torch.autograd.Function):
    """What SDPA's flash kernel keeps for its backward pass: q, k, v, the output and the
    (B, heads, T) float32 log-sum-exp of each query's scores. Shapes only (the meta device);
    q and v have one head size in every minilm model."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)  # in the queries' memory layout, as the kernels return it
        ctx.save_for_backward(q, k, v, out, torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device))
        return out

    @staticmethod
    def backward(ctx, grad):  # never run: the dry run has no backward pass
        raise NotImplementedError


MATMULS = (F.linear, torch.matmul, torch.mm, torch.bmm, torch.addmm, torch.baddbmm)


class _DryRun(TorchFunctionMode):
    """What the meta device lacks, stood in: flash attention for SDPA and, with ``autocast``
    (a dtype), CPU autocast's casts: the matrix products take their inputs (weights included)
    in that dtype and everything else runs as given (checked against a real CPU autocast
    pass; CUDA's autocast also runs the norms in float32, which this does not count).
    ``operations`` counts the torch functions the pass called; where those and the ``spent`` of
    earlier passes reach ``DRY_RUN_OPERATIONS`` it stops with ``DryRunTooLong`` (a model of
    ``block_size`` tokens)."""

    def __init__(self, autocast=None, block_size: int = 0, spent: int = 0):
        super().__init__()
        self.autocast, self.block_size = autocast, block_size
        self.operations, self.spent = 0, spent

    def cast(self, value):
        floating = torch.is_tensor(value) and value.is_floating_point()
        return value.to(self.autocast) if self.autocast is not None and floating else value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.operations += 1
        if self.spent + self.operations > DRY_RUN_OPERATIONS:
            raise too_long(self.block_size, self.spent + self.operations)
        if func is F.scaled_dot_product_attention:
            return _FlashAttention.apply(*map(self.cast, args[:3]))
        if func in MATMULS:
            args, kwargs = tuple(map(self.cast, args)), {k: self.cast(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def activation_bytes(
    model_config: ModelConfig,
    batch_size: int,
    dtype: torch.dtype,
    checkpointing: bool,
    gathered: bool = True,
    device: str = "meta",
    lora=None,
    operations: Optional[list] = None,
) -> int:
    """Bytes autograd keeps for the backward pass of one training forward pass and loss over
    ``batch_size`` rows of ``model_config.block_size`` tokens, computed in ``dtype``: with the
    weights in ``dtype`` (``gathered``: as FSDP's mixed precision gathers them), or in float32
    under autocast (DDP), which keeps a ``dtype`` copy of each weight for the backward pass.
    On ``device`` "meta" nothing is allocated (``_DryRun``); on a real device the pass runs
    (how the count is checked). With ``lora`` (a ``LoRAConfig`` with r > 0), the adapted model.
    ``operations``: a list the dry run's count of torch functions called is appended to; the dry
    run stops (``DryRunTooLong``) where those of the list and its own pass ``DRY_RUN_OPERATIONS``."""
    with torch.device(device):
        model = GPT(model_config).to(dtype if gathered else torch.float32).train()
        if lora is not None and lora.r:
            add_adapters(model, lora.targets, lora.r, lora.alpha, lora.also_train)
            freeze_in(model, dtype)
    idx = torch.zeros(batch_size, model_config.block_size, dtype=torch.long, device=device)
    weights = {p.untyped_storage()._cdata for p in model.parameters()}
    mixed = None if gathered or dtype == torch.float32 else dtype
    inside, inputs = [0], {}

    def enter(block, args):  # a block's input is what checkpointing keeps of it
        inside[0] += 1
        inputs.setdefault(args[0].untyped_storage()._cdata, args[0].untyped_storage().nbytes())

    def leave(block, args, out):
        inside[0] -= 1

    if checkpointing and device == "meta":  # torch's checkpoint cannot run on the meta device before torch 2.5
        for block in model.blocks:
            block.register_forward_pre_hook(enter)
            block.register_forward_hook(leave)
    else:
        model.checkpoint_blocks = checkpointing

    if device == "meta":
        mode = _DryRun(mixed, model_config.block_size, sum(operations or ()))
    else:
        mode = torch.autocast(device, dtype=mixed) if mixed is not None else contextlib.nullcontext()

    def forward():
        with mode:
            return model(idx, head=lambda hidden, weight, cap: mixed_loss(hidden, weight, cap, idx, None))

    kept = saved_tensor_bytes(forward, skip=lambda t: inside[0] > 0 or t.untyped_storage()._cdata in weights)[0]
    if operations is not None and device == "meta":
        operations.append(mode.operations)
    return kept + sum(inputs.values())


DRY_RUN_OPERATIONS = 200_000  # torch functions one count may call: 10 to 20 s of the dry run's Python


class DryRunTooLong(MinilmError):
    """A count whose dry runs would call more than ``DRY_RUN_OPERATIONS`` torch functions."""


def too_long(block_size: int, operations: float, largest: Optional[int] = None) -> DryRunTooLong:
    """The one-line refusal of a count at ``block_size`` that takes about ``operations`` (or more)."""
    hint = f"count at model.block_size <= {largest:,}" if largest else "count a shorter model.block_size or pattern"
    return DryRunTooLong(
        f"model.block_size={block_size}: the count would run {operations:,.0f} or more torch operations, past the "
        f"{DRY_RUN_OPERATIONS:,} it may take (attention written out, for a scheme's bias or a layer's window, "
        f"soft-cap or sinks, runs in chunks of queries, so its count grows with the length; SDPA's does not): {hint}"
    )


def check_countable(model_config: ModelConfig, batch_size: int, runs: int) -> None:
    """Refuse, before counting, a count whose dry runs would call more than ``DRY_RUN_OPERATIONS``
    torch functions in all (``runs`` passes over the depths ``by_depth`` counts): where attention is
    written out (a scheme's bias, a layer's window, soft-cap or sinks) it runs in chunks of queries,
    so its work grows with ``block_size``, unlike SDPA's. Estimated from the dry runs of one period
    of layers at two lengths of several chunks each, linear in the tokens; where chunks shrink at
    long lengths the work grows faster, and the dry run itself stops at the limit (``_DryRun``)."""
    T, p, n = model_config.block_size, period(model_config), model_config.n_layer
    widest = max([QUERY_CHUNK] + [t.window or 0 for t in layer_types(model_config.layers, model_config.position, p)])
    lengths = (min(T, 2 * widest), min(T, 4 * widest))
    if lengths[0] == lengths[1]:
        return  # short enough to count whole
    shallow = dataclasses.replace(model_config, n_layer=min(n, p))
    counted = []
    for tokens in lengths:
        activation_bytes(
            dataclasses.replace(shallow, block_size=tokens), batch_size, torch.float32, False, operations=counted
        )
    growth = (counted[1] - counted[0]) / (lengths[1] - lengths[0])
    scale = runs * sum(depths(model_config)) / shallow.n_layer
    estimate = scale * (counted[0] + growth * (T - lengths[0]))
    if estimate > DRY_RUN_OPERATIONS:
        largest = lengths[0] + (DRY_RUN_OPERATIONS / scale - counted[0]) / growth if growth > 0 else 0
        raise too_long(T, estimate, int(largest) if largest >= 1 else None)


def period(model_config: ModelConfig) -> int:
    """The layers after which ``model_config``'s blocks repeat: its layer pattern's length (1 without
    ``model.layers``), made even with value embeddings (one table per pair of layers)."""
    p = len(model_config.layers["pattern"]) if model_config.layers else 1
    return p * 2 // math.gcd(p, 2) if model_config.value_embeddings else p


def depths(model_config: ModelConfig) -> tuple:
    """The depths ``by_depth`` counts ``model_config`` at: its own within four periods, else one
    period, two, and one with the remainder (p, 2p, p + r)."""
    p, n = period(model_config), model_config.n_layer
    return (n,) if n <= 4 * p else (p, 2 * p, p + n % p)


def by_depth(count, model_config: ModelConfig):
    """``count(model_config)`` (a number or a tuple of numbers, each a fixed part plus one part per
    ``period`` of layers) from models of at most two periods and a remainder: with n = q p + r,
    count(n) = count(p + r) + (q - 1) (count(2p) - count(p)). A model within four periods is counted whole."""
    counted = depths(model_config)
    if len(counted) == 1:
        return count(model_config)
    q = model_config.n_layer // period(model_config)
    one, two, rest = (count(dataclasses.replace(model_config, n_layer=k)) for k in counted)
    if isinstance(one, tuple):
        return tuple(c + (q - 1) * (b - a) for a, b, c in zip(one, two, rest))
    return rest + (q - 1) * (two - one)


def lora_counts(model_config: ModelConfig, lora) -> tuple:
    """(trained, frozen) parameters of a LoRA run of ``model_config`` (adapters and also_train trained)."""
    return by_depth(lambda c: _lora_counts(c, lora), model_config)


def _lora_counts(model_config: ModelConfig, lora) -> tuple:
    with torch.device("meta"):
        model = GPT(model_config)
        add_adapters(model, lora.targets, lora.r, lora.alpha, lora.also_train)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trained, sum(p.numel() for p in model.parameters()) - trained


def parameter_counts(model_config: ModelConfig) -> tuple:
    """(all parameters, those of the blocks' matrices (Muon's), the root's (embedding, head,
    final norm, positions), the largest block's)."""
    total, matrices, block = by_depth(_parameter_counts, model_config)
    return total, matrices, total - block * model_config.n_layer, block


def _parameter_counts(model_config: ModelConfig) -> tuple:
    with torch.device("meta"):
        model = GPT(model_config)
    total = sum(p.numel() for p in model.parameters())
    matrices = sum(p.numel() for n, p in model.named_parameters() if is_hidden_matrix(n, p))
    return total, matrices, max(sum(p.numel() for p in b.parameters()) for b in model.blocks)


def step_memory(
    model_config: ModelConfig,
    batch_size: int,
    ranks: int,
    dtype: torch.dtype,
    optimizer: str,
    layouts: tuple = LAYOUTS,
    lora=None,
) -> list:
    """Bytes per process of each of ``ROWS`` and their ``total``, one dict for each of
    ``layouts`` (parallel, checkpointing); FSDP always counts AdamW (it refuses Muon). With
    ``lora`` (r > 0) a LoRA run's, under DDP only (module docstring)."""
    total, matrices, root, block = parameter_counts(model_config)
    width = torch.empty((), dtype=dtype).element_size()
    adapted = lora is not None and lora.r
    layouts = tuple((p, c) for p, c in layouts if p == "ddp") if adapted else layouts
    needed = {(parallel, c) for parallel, checkpointing in layouts for c in {False, checkpointing}}
    check_countable(model_config, batch_size, len(needed))
    spent = []  # the torch operations of every dry run so far, against DRY_RUN_OPERATIONS
    kept = {
        (parallel, c): by_depth(
            lambda m, c=c, parallel=parallel: activation_bytes(
                m, batch_size, dtype, c, gathered=parallel == "fsdp", lora=lora, operations=spent
            ),
            model_config,
        )
        for parallel, c in needed
    }
    if adapted:
        trained, frozen = lora_counts(model_config, lora)
        rows = [
            {
                "parallel": "ddp",
                "checkpointing": c,
                "weights": 4 * trained + width * frozen,
                "gradients": 8 * trained,
                "optimizer": 8 * trained,
                "gathered": 0,
                "activations": kept["ddp", c]
                + ((kept["ddp", False] - kept["ddp", True]) / model_config.n_layer if c else 0),
            }
            for _, c in layouts
        ]
        return [{**row, "total": sum(row[k] for k in ROWS)} for row in rows]
    rows = []
    for parallel, checkpointing in layouts:
        sharded = parallel == "fsdp"
        # with checkpointing, one block's activations are rebuilt at a time in the backward pass
        recomputed = (kept[parallel, False] - kept[parallel, True]) / model_config.n_layer if checkpointing else 0
        moments = 8 * total if sharded or optimizer == "adamw" else 4 * matrices + 8 * (total - matrices)
        share = ranks if sharded else 1
        row = {
            "weights": 4 * total / share,
            "gradients": 4 * total * (1 if sharded else 2) / share,
            "optimizer": moments / share,
            "gathered": (root + 2 * block) * width if sharded else 0,
            "activations": kept[parallel, checkpointing] + (recomputed if checkpointing else 0),
        }
        rows.append({"parallel": parallel, "checkpointing": checkpointing, **row, "total": sum(row.values())})
    return rows


def size_unit(largest: float) -> tuple:
    """(name, bytes) of the unit that sizes up to ``largest`` bytes are printed in: GiB, or MiB below one."""
    return ("GiB", 2**30) if largest >= 2**30 else ("MiB", 2**20)


def check_step_fits(config, device: torch.device, dtype: torch.dtype, ranks: int) -> None:
    """Refuse, before anything is built, a run whose training step needs more memory per process
    than ``device`` has free now, in one line that names the sizes deciding it. A floor comes
    first (16 bytes a parameter for weights, gradients and AdamW's moments; a LoRA run's 20 a trained
    parameter and the frozen ones in the compute dtype; and each block's input kept twice): past the
    free memory it refuses at once; within an eighth of it the dry run of ``step_memory`` (this run's
    layout and adapters) decides, or the floor where that is too long to count; below, the step fits."""
    free = available_memory(device)
    if free is None:
        return
    m, t = config.model, config.train
    params = parameter_counts(m)[0]
    width = torch.empty((), dtype=dtype).element_size()
    lora = t.lora if t.lora.r else None
    if lora is None:
        state = 16 * params / (ranks if t.parallel == "fsdp" else 1)
    else:  # weights 4T + F x width, gradients and DDP's buckets 8T, AdamW's moments 8T (the module docstring)
        trained, frozen = lora_counts(m, lora)
        state = 20 * trained + width * frozen
    floor = state + 2 * t.batch_size * m.block_size * m.n_layer * m.d_model * width
    need, how = floor, "at least "
    if free / 8 < floor <= free:
        layout = ((t.parallel, t.activation_checkpointing),)
        with contextlib.suppress(DryRunTooLong):  # too long to count: the floor decides
            need, how = step_memory(m, t.batch_size, ranks, dtype, t.optimizer, layout, lora=lora)[0]["total"], ""
    if need > free:
        unit, size = size_unit(max(need, free))
        raise MinilmError(
            f"train.batch_size={t.batch_size} x model.block_size={m.block_size} with model.n_layer={m.n_layer}, "
            f"model.d_model={m.d_model} ({params / 1e6:,.1f}M parameters"
            f"{f', adapters of train.lora.r={lora.r}' if lora else ''}): a training step needs {how}"
            f"{need / size:,.1f} {unit} per process (minilm memory) but {free / size:,.1f} {unit} is free on "
            f"{device.type}: lower them"
        )
