"""The optimiser and the learning-rate schedule of a training run.

``train.optimizer: adamw`` (the default) is AdamW (Loshchilov & Hutter 2019) on every
parameter, with weight decay on the 2-D weight matrices only. ``muon`` gives the hidden
matrices of the blocks (q/k/v, attention output, the MLP's two) to Muon (Jordan et al. 2024,
"Muon: An optimizer for hidden layers in neural networks"): SGD with Nesterov momentum whose
update is orthogonalised by a Newton-Schulz iteration. The embedding, the LM head, norms,
biases and the position scheme stay with AdamW, as there. Muon's step is scaled by
0.2 * sqrt(max(rows, cols)) (Liu et al. 2025, "Muon is Scalable for LLM Training"), which
gives it the update RMS of AdamW, so that one ``lr`` and one schedule serve both; Muon takes
``train.muon_lr_scale`` times the schedule's rate (3 in the shipped configs, chosen by a sweep:
docs/design.md, "Measured choices").

Ours rather than ``torch.optim.Muon`` (torch >= 2.9), which is the same update but always
orthogonalises in bfloat16: on a CPU without native bf16 units that is emulated and makes a
step several times slower (docs/design.md, "Measured choices"). Here the
iteration runs in the run's compute dtype: bfloat16 on CUDA and on a CPU that trains in bf16
(one with native bf16 units: ``train.dtype: auto``), float32 on the others; on all the matrices
of one shape at once (a batched matmul); and it works with any torch.
"""

from __future__ import annotations

import itertools
import math
from typing import Optional

import torch
from torch import nn

from minilm.common import cpu_has_fast_bf16
from minilm.config import ConfigError


def lr_at(step: int, t) -> float:
    """Linear warm-up to ``lr`` over ``warmup_steps``, then down to ``min_lr`` at ``max_steps``:
    ``schedule: cosine`` by a half cosine over all the remaining steps; ``wsd``
    (warmup-stable-decay: Hu et al. 2024, MiniCPM; Hägele et al. 2024, "Scaling Laws and
    Compute-Optimal Training Beyond Fixed Training Durations") holds ``lr``, then falls
    linearly over the last ``cooldown`` fraction of ``max_steps``."""
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    if step >= t.max_steps:
        return t.min_lr
    if t.schedule == "wsd":
        start = max(t.warmup_steps, t.max_steps * (1 - t.cooldown))
        return t.lr if step < start else t.min_lr + (t.lr - t.min_lr) * (t.max_steps - step) / (t.max_steps - start)
    progress = (step - t.warmup_steps) / max(1, t.max_steps - t.warmup_steps)
    return t.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (t.lr - t.min_lr)


def is_hidden_matrix(name: str, param: torch.Tensor) -> bool:
    """A 2-D weight inside a block (what Muon is for); not the embedding, head or positions."""
    return param.dim() == 2 and name.startswith("blocks.")


NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)  # quintic coefficients of Jordan et al. 2024
RESTART_AT = 2  # the Gram form starts afresh from X before this iteration (gram_iteration)


def orthogonalize(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Approximately U V^T of g = U S V^T (batched over leading dimensions): ``steps``
    iterations of X <- a X + (b A + c A^2) X with A = X X^T, X_0 = g / ||g||_F, on the wide
    orientation (rows <= cols). The singular values end near 1 (within about 0.7-1.2), which
    is what Muon needs, not exactly 1. In float32, a matrix at least twice as wide as it is
    tall takes the same iteration on its Gram matrix (``gram_iteration``)."""
    a, b, c = NEWTON_SCHULZ
    tall = g.shape[-2] > g.shape[-1]
    x = g.mT if tall else g
    x = (x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)).reshape(-1, *x.shape[-2:])
    if x.dtype == torch.float32 and x.shape[-1] >= 2 * x.shape[-2]:
        x = gram_iteration(x, steps)
    else:
        for _ in range(steps):
            gram = torch.bmm(x, x.mT)
            x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    x = x.reshape(g.mT.shape if tall else g.shape)
    return x.mT if tall else x


def gram_iteration(x: torch.Tensor, steps: int) -> torch.Tensor:
    """``orthogonalize``'s iteration on a batch of wide ``x`` (m x n, m <= n) carried out on
    m x m matrices: the Gram Newton-Schulz of the Dao AI Lab (2026,
    tridao.me/blog/2026/gram-newton-schulz). Every iterate is X_k = Q_k X_0 with Q_k a
    polynomial in G_0 = X_0 X_0^T, so the polynomials commute: with
    P_k = a I + b G_k + c G_k^2, X_{k+1} = P_k X_k, G_{k+1} = P_k G_k P_k = P_k (P_k G_k) and
    Q_{k+1} = P_k Q_k. A wide matrix is multiplied only when the iteration starts afresh from
    X_k = Q_k X_0 and G_k = X_k X_k^T (a restart, as theirs: without it, the error on
    nearly low-rank inputs was 40-70 times the plain iteration's in float32; with it, it is
    the plain iteration's: tests/test_optim.py) and at the end. For the main job's 192 x 768
    matrices about 30% fewer FLOPs, for its 192 x 576 q/k/v about 20%."""
    if steps == 0:
        return x
    a, b, c = NEWTON_SCHULZ
    identity = torch.eye(x.shape[-2], dtype=x.dtype, device=x.device)
    q = gram = None
    for step in range(steps):
        if step in (0, RESTART_AT):
            x = x if q is None else torch.bmm(q, x)
            q, gram = None, torch.bmm(x, x.mT)
        p = torch.baddbmm(gram, gram, gram, beta=b, alpha=c).add_(identity, alpha=a)
        q = p if q is None else torch.bmm(p, q)
        if step < steps - 1 and step + 1 != RESTART_AT:  # a restart computes G afresh
            gram = torch.bmm(p, torch.bmm(p, gram))
    return torch.bmm(q, x)


def row_blocks(counts: Optional[tuple]) -> list:
    """Row slices of consecutive blocks of ``counts`` rows, or the whole matrix."""
    edges = [0, *itertools.accumulate(counts or ())]
    return [slice(a, b) for a, b in zip(edges, edges[1:])] or [slice(None)]


class Muon(torch.optim.Optimizer):
    """Muon: momentum buffer B <- mu B + g; update O = orthogonalize(g + mu B) (Nesterov) or
    orthogonalize(B); then decoupled weight decay p <- p (1 - lr wd) and p <- p - lr s O with
    s = 0.2 sqrt(max(rows, cols)). Parameters must be 2-D. ``blocks`` {parameter: row counts}
    orthogonalises those row blocks of a parameter apart, each with its own s: a fused q/k/v
    projection as the three matrices it holds (as the modded-nanogpt speedrun does). ``ns_dtype``:
    the dtype of the iteration (always bfloat16 on CUDA)."""

    def __init__(
        self,
        params,
        lr: float,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        blocks: Optional[dict] = None,
        ns_dtype: torch.dtype = torch.float32,
    ):
        super().__init__(
            params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps)
        )
        self.blocks, self.ns_dtype = blocks or {}, ns_dtype

    @torch.no_grad()
    def step(self, closure=None) -> None:
        """One Muon update of every group; ``closure`` as torch's optimisers take it (torch.distributed's
        checkpoint calls ``step(closure=None)`` to build the state of a fresh one before loading shards)."""
        if closure is not None:
            with torch.enable_grad():
                closure()
        for group in self.param_groups:
            mu, by_shape = group["momentum"], {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"].mul_(mu).add_(p.grad)
                update = p.grad.add(buf, alpha=mu) if group["nesterov"] else buf
                p.mul_(1 - group["lr"] * group["weight_decay"])
                for rows in row_blocks(self.blocks.get(p)):
                    piece = update[rows]
                    tall = piece.shape[0] > piece.shape[1]  # batched in the wide orientation, with its transposes
                    by_shape.setdefault((min(piece.shape), max(piece.shape)), []).append(
                        (p[rows], piece.mT if tall else piece, tall)
                    )
            for (_, cols), items in by_shape.items():
                dtype = torch.bfloat16 if items[0][0].is_cuda else self.ns_dtype
                updates = orthogonalize(torch.stack([u for _, u, _ in items]).to(dtype), group["ns_steps"])
                scale = 0.2 * math.sqrt(cols)
                for (target, _, tall), update in zip(items, updates):
                    target.add_((update.mT if tall else update).to(target.dtype), alpha=-group["lr"] * scale)


def attention_blocks(attention: nn.Module) -> tuple:
    """The rows of q, k and v in a fused q/k/v projection (``train.muon_split_qkv``)."""
    kv = attention.n_kv_head * attention.head_dim
    return attention.n_head * attention.head_dim, kv, kv


class Optimizers:
    """Several torch optimisers stepped, zeroed, saved and restored as one; ``param_groups``
    lists the groups of all of them (the schedule sets ``lr`` on each)."""

    def __init__(self, kind: str, parts: list, position_lr_scale: float = 1.0):
        self.kind, self.parts, self.position_lr_scale = kind, parts, position_lr_scale

    @property
    def param_groups(self) -> list:
        return [group for part in self.parts for group in part.param_groups]

    def set_lr(self, lr: float) -> None:
        """The schedule's rate for this step: ``lr`` on every group, times the group's ``lr_scale``."""
        for group in self.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)

    def step(self, scaler: Optional[torch.amp.GradScaler] = None) -> None:
        """Step every part (through ``scaler`` under float16, which skips a part with inf gradients)."""
        for part in self.parts:
            if scaler is not None:
                scaler.step(part)
            else:
                part.step()

    def unscale(self, scaler: torch.amp.GradScaler) -> None:
        """Divide every part's gradients by the loss scale (before clipping), recording any inf."""
        for part in self.parts:
            scaler.unscale_(part)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self, part_state=None) -> dict:
        """Every part's state dict; ``part_state(part)`` replaces ``part.state_dict()`` (FSDP's gathered one)."""
        return {
            "kind": self.kind,
            "parts": [part_state(part) if part_state else part.state_dict() for part in self.parts],
        }

    def load_state_dict(self, state: dict, load_part=None) -> None:
        """Every part's state; ``load_part(part, its_state)`` replaces ``part.load_state_dict`` (FSDP's).
        The moments are the checkpoint's; the groups' settings (weight decay, betas, rate scales) stay
        the ones this run was built with, which a resumed run's notes name: torch would put back the
        checkpoint's and silently undo a setting changed on resume."""
        load_part = load_part or (lambda part, part_state: part.load_state_dict(part_state))
        kind = state.get("kind", "adamw") if "parts" in state else "adamw"
        if kind != self.kind:
            raise ConfigError(
                f"cannot resume: train.optimizer={self.kind!r} but the checkpoint was trained with "
                f"{kind!r}; use train.optimizer={kind} or start a new out_dir"
            )
        settings = self.group_settings()
        for part, part_state in zip(self.parts, state["parts"] if "parts" in state else [state]):
            try:
                load_part(part, part_state)
            except ValueError:  # torch: another number or size of parameter groups
                raise ConfigError(
                    f"cannot resume: train.position_lr_scale={self.position_lr_scale!r} gives the "
                    f"position parameters "
                    f"{'a group of their own' if self.position_lr_scale != 1 else 'no group of their own'}, "
                    f"unlike the checkpoint's optimiser state: resume with the checkpoint's "
                    f"train.position_lr_scale or start a new out_dir"
                ) from None
        self.restore_settings(settings)

    def group_settings(self) -> list:
        """Each part's groups' settings (everything but their parameters), for ``restore_settings``."""
        return [
            [{k: v for k, v in group.items() if k != "params"} for group in part.param_groups] for part in self.parts
        ]

    def restore_settings(self, settings: list) -> None:
        """Put back the groups' settings that ``group_settings`` read, over those a loaded state brought."""
        for part, groups in zip(self.parts, settings):
            for group, setting in zip(part.param_groups, groups):
                group.update(setting)


def make_optimizer(model: nn.Module, t, device: torch.device, dtype: torch.dtype = torch.float32) -> Optimizers:
    """AdamW (decay on 2-D weights, never on the position scheme's parameters), or with
    ``t.optimizer == "muon"`` Muon for the blocks' matrices and AdamW for everything else; Muon's
    iteration in bfloat16 on CUDA and where the run computes in it (``dtype``) on a CPU with native
    bf16 units, else in float32 (emulated bf16 is several times slower).

    ``t.position_lr_scale`` != 1 gives the position scheme's parameters a group of their own at
    that multiple of the schedule's rate. A table that starts at zero, such as T5's per-bucket
    biases, moves at most about lr per AdamW step: over the study's schedule (sum of lr about
    0.55) it cannot reach the few logits that ALiBi's fixed slopes put between near and far keys
    (1/4 per token on the steepest of 4 heads), however the gradient points. At 1 the groups are
    the ones before the option existed, so old optimiser states still load."""
    muon = t.optimizer == "muon"
    matrices, decay, no_decay, positions = [], [], [], []
    own_group = t.position_lr_scale != 1.0
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if muon and is_hidden_matrix(name, param):
            matrices.append(param)
        elif own_group and name.startswith(("positions.", "layer_positions.")):
            positions.append(param)
        else:
            (
                decay if param.dim() >= 2 and not name.startswith(("positions.", "layer_positions.")) else no_decay
            ).append(param)
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if positions:
        groups.append({"params": positions, "weight_decay": 0.0, "lr_scale": t.position_lr_scale})
    parts = [torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), fused=device.type in ("cpu", "cuda"))]
    if muon:
        blocks = {
            param: attention_blocks(model.get_submodule(name.removesuffix(".qkv.weight")))
            for name, param in model.named_parameters()
            if t.muon_split_qkv and name.endswith("attn.qkv.weight")
        }
        parts.insert(
            0,
            Muon(
                [{"params": matrices, "lr_scale": t.muon_lr_scale}],
                lr=t.lr,
                weight_decay=t.weight_decay,
                blocks=blocks,
                ns_dtype=torch.bfloat16 if dtype == torch.bfloat16 and cpu_has_fast_bf16() else torch.float32,
            ),
        )
    return Optimizers("muon" if muon else "adamw", parts, t.position_lr_scale)
