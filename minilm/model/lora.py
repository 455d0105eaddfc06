"""Low-rank adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models",
eq. 3): a frozen linear W gains h = W x + (alpha / r) B A x, with A (r x d_in) and B (d_out x r)
the only weights that train. B starts at zero, so training starts exactly at the base model; A
is drawn as ``nn.Linear`` draws its weight (Kaiming-uniform, a = sqrt(5)), as the paper's
loralib and peft do.

minilm keeps q, k and v in one linear (``attn.qkv``, rows [q; k; v]) and swiglu's gate and up in
another (``mlp.fc``, rows [gate; up]). Each target is an adapter of its own on its rows of that
output, exactly what a LoRA on Llama's separate q_proj, k_proj, v_proj (or gate_proj, up_proj)
computes, so the adapters map one to one onto peft's (``minilm.hf.peft``). Targets (``config.LORA_TARGETS``):
q, k, v, o (the attention's output), and ``mlp`` for every linear of the MLP (gate, up, down;
up and down where the MLP is not gated).

``add_adapters`` puts the adapters in and freezes everything else except what ``also_train``
names (LongLoRA, Chen et al. 2023, section 3.3: embeddings and norms matter for extension);
``merge_adapters`` folds them back into plain linears (W + (alpha / r) B A), the model every
command reads. ``functional.linear`` computes an adapted layer's output.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from minilm.config import GATED_MLPS


class LoRALinear(nn.Linear):
    """A frozen linear with adapters on named row ranges of its output: ``lora_a[name]`` (r x d_in)
    and ``lora_b[name]`` (rows x r) add (alpha / r) B A x to rows ``rows[name]`` of W x + b."""

    def __init__(self, base: nn.Linear, rows: dict, r: int, alpha: float):
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.scale, self.rank, self.rows = alpha / r, r, dict(rows)
        like = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_a = nn.ParameterDict({name: nn.Parameter(torch.empty(r, self.in_features, **like)) for name in rows})
        self.lora_b = nn.ParameterDict(
            {name: nn.Parameter(torch.zeros(stop - start, r, **like)) for name, (start, stop) in rows.items()}
        )
        for a in self.lora_a.values():
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))

    def adapt(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` (= W x + b) with every adapter's (alpha / r) B A x added to its rows (one sum: the
        deltas in row order, zeros between them)."""
        pieces, row = [], 0
        for name, (start, stop) in sorted(self.rows.items(), key=lambda item: item[1]):
            if start > row:
                pieces.append(out.new_zeros(*out.shape[:-1], start - row))
            pieces.append(F.linear(F.linear(x, self.lora_a[name]), self.lora_b[name]) * self.scale)
            row = stop
        if row < self.out_features:
            pieces.append(out.new_zeros(*out.shape[:-1], self.out_features - row))
        return out + (pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)).to(out.dtype)

    def merged_weight(self) -> torch.Tensor:
        """W + (alpha / r) B A on every adapted row range (computed in float32 at least)."""
        wide = torch.promote_types(self.weight.dtype, torch.float32)
        weight = self.weight.detach().to(wide).clone()
        for name, (start, stop) in self.rows.items():
            weight[start:stop] += self.scale * (
                self.lora_b[name].detach().to(wide) @ self.lora_a[name].detach().to(wide)
            )
        return weight.to(self.weight.dtype)


def adapted_rows(model: nn.Module, targets: Sequence[str]) -> dict:
    """{linear's name in the model: {target: (first row, last row + 1)}} of ``targets`` in ``model``
    (a ``minilm.model.gpt.GPT``): q, k, v on ``attn.qkv``, o on ``attn.proj``, mlp on ``mlp.fc``
    (gate and up for swiglu, else up) and ``mlp.proj`` (down)."""
    c = model.config
    q, kv = c.n_head * c.head_dim, (c.n_kv_head or c.n_head) * c.head_dim
    wanted = set(targets) | ({"gate", "up", "down"} if "mlp" in targets else set())
    layout = {
        "attn.qkv": {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)},
        "attn.proj": {"o": (0, c.d_model)},
        "mlp.fc": ({"gate": (0, c.d_ff), "up": (c.d_ff, 2 * c.d_ff)} if c.mlp in GATED_MLPS else {"up": (0, c.d_ff)}),
        "mlp.proj": {"down": (0, c.d_model)},
    }
    found = {}
    for i in range(c.n_layer):
        for linear, rows in layout.items():
            chosen = {name: span for name, span in rows.items() if name in wanted}
            if chosen:
                found[f"blocks.{i}.{linear}"] = chosen
    return found


def trainable_names(model: nn.Module, also_train: Sequence[str]) -> set:
    """The parameters ``also_train`` names beside the adapters: every norm's, the token embedding
    (and value embeddings), the position scheme's, the LM head (tied: the embedding)."""
    names = set()
    norms = {
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.LayerNorm) or type(module).__name__ == "RMSNorm"
    }
    for name, _ in model.named_parameters():
        owner = name.rsplit(".", 1)[0]
        if (
            "norms" in also_train
            and owner in norms
            or "embeddings" in also_train
            and (name.startswith("wte.") or name.startswith("value_embeds."))
            or "position" in also_train
            and name.startswith(("positions.", "layer_positions."))
            or "head" in also_train
            and name.startswith("lm_head.")
        ):
            names.add(name)
    return names


def add_adapters(model: nn.Module, targets: Sequence[str], r: int, alpha: float, also_train: Sequence[str] = ()) -> int:
    """Put adapters of rank ``r`` on ``targets`` (module docstring) and freeze every other weight
    except those ``also_train`` names; returns the number of trainable parameters."""
    extra = trainable_names(model, also_train)
    for param in model.parameters():
        param.requires_grad_(False)
    for name, rows in adapted_rows(model, targets).items():
        parent, child = name.rsplit(".", 1)
        holder = model.get_submodule(parent)
        setattr(holder, child, LoRALinear(getattr(holder, child), rows, r, alpha))
    for name, param in model.named_parameters():
        if ".lora_a." in name or ".lora_b." in name or name in extra:
            param.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def freeze_in(model: nn.Module, dtype: torch.dtype) -> None:
    """Store the frozen weights (``requires_grad`` False) in ``dtype``, a LoRA run's compute dtype:
    they take no gradient and no optimiser state, so nothing needs a float32 copy of them."""
    for param in model.parameters():
        if not param.requires_grad and param.is_floating_point():
            param.data = param.data.to(dtype)


def merge_adapters(model: nn.Module) -> nn.Module:
    """Every ``LoRALinear`` of ``model`` replaced by a plain linear holding W + (alpha / r) B A, in place."""
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear):
            plain = nn.Linear(
                module.in_features,
                module.out_features,
                bias=module.bias is not None,
                device=module.weight.device,
                dtype=module.weight.dtype,
            )
            with torch.no_grad():
                plain.weight.copy_(module.merged_weight())
                if module.bias is not None:
                    plain.bias.copy_(module.bias)
            parent, child = name.rsplit(".", 1)
            setattr(model.get_submodule(parent), child, plain)
    return model


def adapter_parameter_count(model: nn.Module, targets: Sequence[str], r: int) -> int:
    """r (d_in + rows) summed over every adapter: the LoRA formula, from the model's shapes alone."""
    total = 0
    for name, rows in adapted_rows(model, targets).items():
        d_in = model.get_submodule(name).in_features
        total += sum(r * (d_in + stop - start) for start, stop in rows.values())
    return total
