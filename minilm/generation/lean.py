"""The eager decode step: one new token per row through every layer with as little Python per
layer as the same computation allows. ``generate`` decodes with it unless the step is compiled.

A bf16 decode step of the benchmark's model (6 layers x 384) on a 2-core CPU spends about 2.6 ms
in its matrix products, which run at the floor, and through ``GPT.body`` about 1.5 ms more in
Python between them: module calls (about 3 us each), submodule and parameter lookups (about
0.6 us each) and layers of small calls (docs/benchmarks.md, "Training step and decoding").
``lean_body(model)`` reads each
layer's tensors and settings once per generation into plain tuples, then runs the layers in one
loop that calls the same functions as the modules, in the same order: the model's own
(``minilm.model.functional``, ``split_heads``), the position scheme's rotation, the cache's update and
``attend``. Its logits equal ``GPT.body``'s bit for bit (tests/test_generation.py).

It takes the passes that ``takes_step`` accepts: the model in evaluation mode, one token per
row, a cache that is not static (a compiled step's), positions shared by the rows, sinks at
absolute positions, no attention weights asked for; every other pass runs ``GPT.body``. Hooks
on the model's submodules do not run inside it; hooks on the model itself do.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F

from minilm.model.attention import attend, scale_queries
from minilm.model.functional import activation, rms_norm
from minilm.model.gpt import GPT, ForwardPass, RMSNorm, split_heads
from minilm.positions.layers import LayerType


class Layer(NamedTuple):
    """One block's tensors and settings, read once (plain fields: no module lookups per step)."""

    ln_1: Callable
    ln_2: Callable
    qkv: tuple  # (weight, bias) of the q/k/v projection
    proj: tuple  # (weight, bias) of the attention output
    fc: tuple  # (weight, bias) of the MLP's first layer
    out: tuple  # (weight, bias) of the MLP's second layer
    q_norm: Optional[Callable]  # model.qk_norm: RMSNorm of each query head, else None
    k_norm: Optional[Callable]
    mlp: str  # model.mlp
    parallel: bool  # model.parallel_residual
    plain: bool  # the layer's attention is plain softmax attention (``LayerType.plain``, no learned sinks)
    layer_type: LayerType  # model.layers: the layer's window, chunk, sinks, soft-cap, query scale
    sink_logits: Optional[torch.Tensor]  # learned sinks (``sinks: learned``), else None


def norm_function(norm) -> Callable:
    """``norm``'s forward as a function of x alone: the same call its ``forward`` makes."""
    if isinstance(norm, RMSNorm):
        return partial(rms_norm, weight=norm.weight, eps=norm.eps)
    return partial(
        F.layer_norm, normalized_shape=norm.normalized_shape, weight=norm.weight, bias=norm.bias, eps=norm.eps
    )


def read_layer(block) -> Layer:
    attn, mlp = block.attn, block.mlp
    return Layer(
        norm_function(block.ln_1),
        norm_function(block.ln_2),
        (attn.qkv.weight, attn.qkv.bias),
        (attn.proj.weight, attn.proj.bias),
        (mlp.fc.weight, mlp.fc.bias),
        (mlp.proj.weight, mlp.proj.bias),
        norm_function(attn.q_norm) if attn.qk_norm else None,
        norm_function(attn.k_norm) if attn.qk_norm else None,
        mlp.kind,
        block.parallel,
        attn.layer_type.plain,
        attn.layer_type,
        getattr(attn, "sink_logits", None),
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
    through the lean loop, every other pass through ``model.body``. The model's weights must not
    be replaced while it is in use (they may change in place)."""
    layers = [read_layer(block) for block in model.blocks]
    attn = model.blocks[0].attn
    heads, kv_heads, head_dim, expand = attn.n_head, attn.n_kv_head, attn.head_dim, attn.expand

    def body(idx, fp: ForwardPass, return_hidden: bool):
        if not takes_step(model, idx, fp):
            return model.body(idx, fp, return_hidden)
        x, fp = model.inputs(idx, fp)
        cache, pos = fp.cache, fp.pos
        window, sinks = (cache.capacity, cache.sinks) if cache.rolling else (None, 0)
        B, T, C = x.shape
        for i, layer in enumerate(layers):  # CausalSelfAttention.forward, MLP.forward and Block.forward
            scheme = fp.schemes[i] if fp.schemes else fp.scheme
            q, k, v = split_heads(
                F.linear(layer.ln_1(x), *layer.qkv), heads, kv_heads, head_dim, layer.q_norm, layer.k_norm, fp, scheme
            )
            if fp.values is not None:
                v = v + fp.values[i].view(B, T, -1, head_dim).transpose(1, 2)
            q = scale_queries(q, pos, layer.layer_type)
            k, v, k_pos = cache.update(i, k, v)
            k, v = expand(k), expand(v)
            if layer.plain and not (scheme.has_bias or scheme.has_value_term):
                # what ``attend`` does for one query over a cache that holds only what it may see
                y = F.scaled_dot_product_attention(q.to(k.dtype), k, v)
            else:
                y = attend(
                    q.to(k.dtype),
                    k,
                    v,
                    pos,
                    k_pos,
                    scheme,
                    cached=True,
                    window=window,
                    sinks=sinks,
                    layer=layer.layer_type,
                    sink_logits=layer.sink_logits,
                )
            attended = F.linear(y.to(q.dtype).transpose(1, 2).reshape(B, T, -1), *layer.proj)
            h = x + attended  # parallel_residual: the MLP reads the block's input, else this sum
            x = h + F.linear(
                activation(layer.mlp, F.linear(layer.ln_2(x if layer.parallel else h), *layer.fc)), *layer.out
            )
        return model.outputs(x, return_hidden)

    return body
