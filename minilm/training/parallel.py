"""How the model is spread over the processes of a torchrun: DDP, or FSDP2 (``train.parallel``).

- ``ddp``: every process holds the whole model and optimiser state; gradients are averaged by
  ``DistributedDataParallel`` after the backward pass.
- ``fsdp``: PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) on every block, then on
  the whole model (its root: embedding, final norm, head, position parameters). Each process
  keeps 1/N of every weight, gradient and optimiser moment (a ``DTensor`` shard); a block's
  weights are gathered whole for its forward and again for its backward pass, and its
  gradients are averaged and scattered back to the shards (reduce-scatter). Under bf16 or
  float16 the weights are gathered in that dtype and the gradients reduced in float32
  (``MixedPrecisionPolicy``). The root's weights, the head's among them, are whole only inside
  a forward pass, so the training loss is computed in one (``GPT.forward(head=...)``) and
  every rank runs every forward pass (evaluation in lockstep, ``heldout_loss``).

With one process there is nothing to spread: the model is used as it is. The rest of this
module turns the states of a sharded model into ordinary ones and back: the whole state
dict of the model gathered on rank 0 (``full_model_state``), the optimiser's state as the
ordinary, numbered torch state dict, gathered (``full_optimizer_state``) or loaded
(``load_full_optimizer_state``), so that a checkpoint file is the same whichever way it was
trained.

FSDP2 and torch's distributed state-dict functions are imported by the functions that use them:
importing them costs about a second (DTensor), which every command would otherwise pay.
"""

from __future__ import annotations

import re

import torch
import torch.distributed
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from minilm.config import ConfigError
from minilm.training.distributed import Dist

# measured on 2 gloo processes: FSDP2 did not start in torch 2.4 and 2.6 (it wants CUDA streams); 2.7 and 2.8
# trained with gradients at twice their mean; 2.9, 2.12 and 2.13 follow the one-process run
FSDP2_ON_CPU = tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2]) >= (2, 9)


def is_sharded(parallel: str, dist: Dist) -> bool:
    """Whether ``train.parallel`` shards the model in this process group (FSDP over 2+ ranks)."""
    return parallel == "fsdp" and dist.enabled


def spread(raw: nn.Module, parallel: str, dist: Dist, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """The module the training step calls: ``raw`` itself (one process), its DDP wrapper, or
    ``raw`` sharded in place by FSDP2 (blocks first, then the root).

    Under FSDP only rank 0 holds the whole model: the other ranks build it on the meta device
    (shapes, no memory; ``is_sharded`` tells the caller), and here each receives its shards
    of rank 0's weights, rank 0's buffers and rank 0's random state, so that every rank
    starts where one process would."""
    if not dist.enabled:
        return raw
    if parallel == "ddp":
        return DistributedDataParallel(raw, device_ids=[device.index] if device.type == "cuda" else None)
    if device.type != "cuda" and not FSDP2_ON_CPU:
        raise ConfigError(
            f"train.parallel='fsdp' on {device.type} needs torch >= 2.9 (this is {torch.__version__}): "
            f"use train.parallel=ddp, or a newer torch"
        )
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch < 2.6 keeps FSDP2 under its first name
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    policy = (
        MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        if dtype != torch.float32
        else MixedPrecisionPolicy()
    )
    whole = raw.state_dict() if dist.main else {}  # rank 0's tensors, kept until they are sent
    mesh = init_device_mesh(device.type, (dist.world,))  # train.device's, not whichever accelerator torch finds
    for block in raw.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(raw, mesh=mesh, mp_policy=policy)
    if not dist.main:
        raw.to_empty(device=device)
    for buffer in raw.buffers():  # not sharded; the ones no state dict holds (ALiBi's slopes, ...) too
        torch.distributed.broadcast(buffer, src=0)
    set_model_state_dict(raw, whole, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    random = [torch.get_rng_state()]
    torch.distributed.broadcast_object_list(random, src=0)
    torch.set_rng_state(random[0])
    return raw


def _gathered():
    """State-dict options for whole tensors, on rank 0, on the CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(raw: nn.Module, sharded: bool) -> dict:
    """The model's whole state dict on the CPU: gathered from every rank under FSDP (call it
    on every rank; rank 0 gets the dict, the others an empty one), else ``raw``'s own."""
    if not sharded:
        return raw.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(raw, options=_gathered())


def _numbered(named: dict) -> dict:
    """A state dict keyed by parameter names (torch.distributed.checkpoint's form) as torch's
    ordinary one, the parameters numbered in the order of the groups (an empty one, off rank 0, stays empty)."""
    if not named:
        return named
    index = {name: i for i, name in enumerate(n for group in named["param_groups"] for n in group["params"])}
    return {
        "state": {index[name]: value for name, value in named["state"].items()},
        "param_groups": [{**group, "params": [index[n] for n in group["params"]]} for group in named["param_groups"]],
    }


def _named(numbered: dict, part: torch.optim.Optimizer, raw: nn.Module) -> dict:
    """The inverse of ``_numbered`` for ``part``: numbers -> the names of its parameters."""
    name_of = {id(p): n for n, p in raw.named_parameters()}
    names = [name_of[id(p)] for group in part.param_groups for p in group["params"]]
    return {
        "state": {names[i]: value for i, value in numbered["state"].items()},
        "param_groups": [
            {**group, "params": [names[i] for i in group["params"]]} for group in numbered["param_groups"]
        ],
    }


def full_optimizer_state(raw: nn.Module, part: torch.optim.Optimizer, sharded: bool) -> dict:
    """One optimiser's ordinary state dict, its moments gathered whole under FSDP (every rank
    calls it; rank 0 gets the tensors)."""
    if not sharded:
        return part.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return _numbered(get_optimizer_state_dict(raw, part, options=_gathered()))


def load_full_optimizer_state(raw: nn.Module, part: torch.optim.Optimizer, state: dict, sharded: bool) -> None:
    """Load an ordinary state dict into one optimiser; under FSDP each rank keeps its shards."""
    if not sharded:
        part.load_state_dict(state)
        return
    if len(state["param_groups"]) != len(part.param_groups) or any(
        len(a["params"]) != len(b["params"]) for a, b in zip(state["param_groups"], part.param_groups)
    ):
        raise ValueError("another number or size of parameter groups")  # what torch's own load says
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    # whole tensors given on every rank, sharded as they load
    set_optimizer_state_dict(raw, part, _named(state, part, raw), options=StateDictOptions(full_state_dict=True))
