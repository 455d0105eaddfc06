"""The eager decode step: one new token per row through every layer with as little Python per
layer as the same computation allows. ``generate`` decodes with it unless the step is compiled.

At decoding's sizes the Python between the matrix products (module calls, submodule and
parameter lookups) costs as much as the products themselves (docs/design.md, "Measured
choices"). ``lean_body(model)`` reads each block's parts (``minilm.model.layer``: its tensors, settings and
sublayers as plain functions) once per generation and runs ``GPT.body`` with them in the blocks'
place: the same code as the modules' forward (``minilm.model.layer.block``, ``self_attention``),
without a module call or lookup per step. Its logits equal the modules' bit for bit
(tests/test_generation.py).

It takes the passes that ``takes_step`` accepts: the model in evaluation mode, one token per
row, a cache that is not static (a compiled step's), positions shared by the rows, sinks at
absolute positions, no attention weights asked for; every other pass runs the modules. Hooks
on the model's submodules do not run inside it; hooks on the model itself do.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from minilm.model.functional import linear, rms_norm
from minilm.model.gpt import GPT, ForwardPass, RMSNorm
from minilm.model.layer import AttentionParts, BlockParts, block, feed_forward, self_attention


def norm_function(norm) -> Callable:
    """``norm``'s forward as a function of x alone: the same call its ``forward`` makes."""
    if isinstance(norm, RMSNorm):
        return partial(rms_norm, weight=norm.weight, eps=norm.eps)
    return partial(
        F.layer_norm, normalized_shape=norm.normalized_shape, weight=norm.weight, bias=norm.bias, eps=norm.eps
    )


def linear_function(layer: nn.Linear) -> Callable:
    """``functional.linear(layer, x)`` as a function of x alone: a plain linear's weight and bias read
    once; a layer with adapters (``minilm.model.lora``) keeps adding theirs."""
    if type(layer) is nn.Linear:
        return partial(F.linear, weight=layer.weight, bias=layer.bias)
    return partial(linear, layer)


NORMS = ("ln_1", "ln_2", "post_attn_norm", "post_mlp_norm")  # a block's norms, as its sublayer_norms give them


def read_block(module) -> BlockParts:
    """A block's parts, read once: the modules' own computation (``minilm.model.layer``) in functions
    of x that need no module lookups (evaluation: no dropout)."""
    attn, mlp = module.attn, module.mlp
    norms = (norm_function(attn.q_norm), norm_function(attn.k_norm)) if attn.qk_norm else (None, None)
    attention = AttentionParts(
        linear_function(attn.qkv),
        linear_function(attn.proj),
        *norms,
        attn.n_head,
        attn.n_kv_head,
        attn.head_dim,
        attn.layer_type,
        getattr(attn, "sink_logits", None),
        0.0,
        attn.norm_span,
    )
    block_norms = {name: norm_function(getattr(module, name)) if hasattr(module, name) else None for name in NORMS}
    return BlockParts(
        block_norms["ln_1"],
        partial(self_attention, parts=attention),
        block_norms["ln_2"],
        partial(feed_forward, fc=linear_function(mlp.fc), proj=linear_function(mlp.proj), kind=mlp.kind),
        None,
        module.parallel,
        block_norms["post_attn_norm"],
        block_norms["post_mlp_norm"],
    )


def takes_step(model: GPT, idx: torch.Tensor, fp: ForwardPass) -> bool:
    """Whether this pass is a decode step the lean loop computes (see the module's docstring)."""
    cache = fp.cache
    return (
        cache is not None
        and not cache.static
        and idx.shape[1] == 1
        and not model.training
        and not fp.per_row
        and not fp.renumbered
        and fp.weights_of is None
    )


def lean_body(model: GPT) -> Callable:
    """A replacement for ``model.body`` (``GPT.forward(body=...)``) for one generation: decode steps
    through ``GPT.body`` with the blocks' parts read once (``read_block``), every other pass through
    the modules. The model's weights must not be replaced while it is in use (they may change in place)."""
    blocks = [partial(block, parts=read_block(module)) for module in model.blocks]

    def body(idx, fp: ForwardPass, return_hidden: bool):
        return model.body(idx, fp, return_hidden, blocks if takes_step(model, idx, fp) else None)

    return body
