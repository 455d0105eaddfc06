"""GPT: token embedding -> n_layer pre-norm blocks (LayerNorm, causal self-attention,
GELU MLP) -> final LayerNorm -> LM head tied to the token embedding.

That is the default; ``ModelConfig`` options give the variants that other model families use
(names and weight layouts stay those of the default, so weights map across):

* ``norm: rmsnorm`` (Llama) for every norm, ``norm_eps`` for both kinds;
* ``mlp: gelu_tanh`` (GPT-2's gelu_new) or ``swiglu`` (Llama: ``fc`` holds gate and up);
* ``n_kv_head`` < n_head: grouped-query attention (the cache holds only the k/v heads);
* ``qkv_bias``: a bias on the q/k/v projection only (Qwen2);
* ``qk_norm``: RMSNorm on every head's queries and keys (Qwen3), or with ``qk_norm_span: projection`` on all
  heads' queries at once and all keys at once (OLMo 2/3);
* ``sublayer_norms``: norms on each sublayer's output before the residual add too (``sandwich``: Gemma 2),
  or there only (``post``: OLMo 2, EXAONE 4);
* ``mlp: geglu_tanh``: gelu_tanh(gate) * up (Gemma; ``fc`` holds gate and up as for swiglu);
* ``mlp: relu2``: relu(x)^2 (Primer); ``logit_softcap`` c: logits c * tanh(z / c) (Gemma 2);
* ``value_embeddings``: a token embedding added to the values of each layer (``value_table``);
* ``parallel_residual``: x + attn(ln_1(x)) + mlp(ln_2(x)) (GPT-NeoX);
* ``tie_embeddings: false``: an LM head of its own.

The position scheme is a plug-in from ``minilm.positions`` and acts through its hooks: ``start`` once per
forward pass, ``embed`` after the token embedding, ``rotate`` on q and k in every layer (before the cache
write; after it, at cache positions, for sinks placed there: ``attend_in_cache``), ``bias`` on the attention
logits and ``value_term`` on the attention output; ``model.layers`` gives each layer a scheme, window, chunk,
learned sinks, soft-cap and query scale of its own (``minilm.positions.layers``). Each block's attention reads
one ``ForwardPass``. Positions are explicit tensors: ``cache.length .. cache.length+T-1`` with a cache,
``0..T-1`` without; rows of their own (left-padded prompts, documents that restart at each end-of-text id)
hold one row of positions each (``minilm.model.attention.attend_rows``).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable, Optional

import torch
import torch.utils.checkpoint
from torch import nn

from minilm.config import GATED_MLPS, ModelConfig
from minilm.model.attention import document_layout
from minilm.model.cache import SINK_POSITIONS, KVCache, cache_dtype, check_sink_positions
from minilm.model.functional import linear, rms_norm
from minilm.model.layer import (
    AttentionParts,
    BlockParts,
    ForwardPass,
    block,
    dropout,
    dropped,
    feed_forward,
    self_attention,
)
from minilm.positions import PositionError, PositionScheme, build, describe
from minilm.positions.layers import LayerType, layer_types, own_settings

WEIGHT_DTYPES = "float32, bfloat16, float16"  # what a weight may be stored as (float64 too)


def weight_fault(tensor) -> Optional[str]:
    """Why ``tensor`` cannot be a weight of a GPT, or None: a weight is a floating-point tensor with
    finite values (an integer one would be cast without a word, a NaN or inf reaches every logit). The
    one check of every source of weights, as each reads them: minilm checkpoints
    (``checkpoints.format.check_contents``) and Hugging Face files, safetensors or torch, whole or
    sharded (``hf.reading.read_weights``); the caller names the tensor and its file. Returns
    'as int32: expected floating point (...)' or 'with NaN or infinite values (N of M): expected
    finite values'."""
    if not isinstance(tensor, torch.Tensor):
        return f"as a {type(tensor).__name__}: expected a floating-point tensor ({WEIGHT_DTYPES})"
    if not tensor.is_floating_point():
        return f"as {str(tensor.dtype).replace('torch.', '')}: expected floating point ({WEIGHT_DTYPES})"
    finite = torch.isfinite(tensor)
    if bool(finite.all()):
        return None
    bad = tensor.numel() - int(finite.sum())
    return f"with NaN or infinite values ({bad:,} of {tensor.numel():,}): expected finite values"


def embedding_multiplier(config: ModelConfig, positions: PositionScheme) -> float:
    """What the token embedding is multiplied by before positions are added: sqrt(d_model) as in
    Vaswani et al. 2017 (section 3.4) for ``sqrt_d_model``, and for ``auto`` where the scheme adds
    a unit-amplitude table (``scaled_embedding``: sinusoidal); else 1, or the number given."""
    scale = config.embedding_scale
    if scale == "auto":
        scale = "sqrt_d_model" if positions.scaled_embedding else 1.0
    return math.sqrt(config.d_model) if scale == "sqrt_d_model" else float(scale)


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension (``minilm.model.functional.rms_norm``)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def soft_cap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap * tanh(logits / cap)`` (Gemma Team 2024, "Gemma 2", final logit soft-capping; the
    modded-nanogpt speedrun's logit cap): the logits pass through smoothly near 0 and never leave
    (-cap, cap). ``cap`` 0: the logits unchanged."""
    return logits if not cap else torch.tanh(logits / cap) * cap


def make_norm(config: ModelConfig) -> nn.Module:
    """LayerNorm (with a bias where ``config.bias``) or RMSNorm, over d_model with ``norm_eps``."""
    if config.norm == "rmsnorm":
        return RMSNorm(config.d_model, config.norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.bias)


class CausalSelfAttention(nn.Module):
    """Multi-head attention; with n_kv_head < n_head grouped-query attention (Ainslie et al. 2023,
    "GQA"): ``qkv`` projects to [q (n_head heads) ; k (n_kv_head) ; v (n_kv_head)], each head
    head_dim wide, and key/value head j serves query heads j*g .. (j+1)*g - 1, g = n_head / n_kv_head.
    Keys are rotated and cached with n_kv_head heads and repeated g times just before attention.
    With ``qk_norm`` each head's q and k go through an RMSNorm over head_dim (weights shared by the
    heads, as Qwen3 has it; Henry et al. 2020, "Query-Key Normalization for Transformers")
    before the position scheme rotates them, so the cache holds normalised keys. Its ``layer_type`` adds the
    layer's window, chunk, learned sinks (``sink_logits``), soft-cap and query scale (``minilm.positions.layers``)."""

    def __init__(self, config: ModelConfig, layer_type: Optional[LayerType] = None):
        super().__init__()
        self.layer_type = layer_type or LayerType("all", config.position)  # window, chunk, sinks, soft-cap, q scale
        if self.layer_type.sinks:  # one logit per head in the softmax's denominator (GPT-OSS)
            self.sink_logits = nn.Parameter(torch.zeros(config.n_head))
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.n_kv_head = config.n_kv_head or config.n_head  # None: one key/value head per query head
        width = (self.n_head + 2 * self.n_kv_head) * config.head_dim
        self.qkv = nn.Linear(config.d_model, width, bias=config.bias or config.qkv_bias)
        self.proj = nn.Linear(self.n_head * config.head_dim, config.d_model, bias=config.bias)
        self.dropout = config.dropout
        if config.qk_norm:  # over each head's dims, or (qk_norm_span: projection) over all heads' at once
            whole = config.qk_norm_span == "projection"
            self.q_norm = RMSNorm(config.head_dim * (self.n_head if whole else 1), config.norm_eps)
            self.k_norm = RMSNorm(config.head_dim * (self.n_kv_head if whole else 1), config.norm_eps)
        self.qk_norm, self.norm_span = config.qk_norm, config.qk_norm_span

    def parts(self) -> AttentionParts:
        """This layer's weights and settings as ``self_attention`` reads them, at this call (the
        linears through ``functional.linear``: their adapters included, no module call)."""
        norms = (self.q_norm, self.k_norm) if self.qk_norm else (None, None)
        return AttentionParts(
            partial(linear, self.qkv),
            partial(linear, self.proj),
            *norms,
            self.n_head,
            self.n_kv_head,
            self.head_dim,
            self.layer_type,
            getattr(self, "sink_logits", None),
            self.dropout if self.training else 0.0,
            self.norm_span,
        )

    def forward(self, x, layer: int, fp: ForwardPass):
        """The attention output of x (B, T, d_model); with ``fp.weights_of == layer`` the pair
        (output, attention weights (B, n_head, T, keys)): ``minilm.model.layer.self_attention``."""
        return self_attention(x, layer, fp, self.parts())


class MLP(nn.Module):
    """proj(gelu(fc(x))), with ``mlp: gelu_tanh`` the tanh approximation of GELU (GPT-2's
    gelu_new); with ``mlp: relu2`` proj(relu(fc(x))^2) (So et al. 2021, "Primer", squared ReLU);
    with ``mlp: swiglu`` (Shazeer 2020, "GLU Variants Improve Transformer")
    proj(silu(gate(x)) * up(x)), where ``fc`` (2 d_ff outputs) holds gate then up."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.kind = config.mlp
        width = 2 * config.d_ff if self.kind in GATED_MLPS else config.d_ff
        self.fc = nn.Linear(config.d_model, width, bias=config.bias)
        self.proj = nn.Linear(config.d_ff, config.d_model, bias=config.bias)

    def forward(self, x):
        return feed_forward(x, partial(linear, self.fc), partial(linear, self.proj), self.kind)


def value_table(layer: int, n_layer: int) -> int:
    """The value-embedding table of ``layer``: tables are shared by layers j and n_layer - 1 - j,
    the U-shaped pairing of the modded-nanogpt speedrun (Jordan et al. 2024), which adds
    ``v += E_j[token]`` so that every layer's values can carry the token's identity directly."""
    return min(layer, n_layer - 1 - layer)


class Block(nn.Module):
    """Pre-norm block: x + attn(ln_1(x)), then + mlp(ln_2(.)) of that sum; with ``parallel_residual``
    (GPT-NeoX, Black et al. 2022) both read the block input: x + attn(ln_1(x)) + mlp(ln_2(x)); with
    ``sublayer_norms`` sandwich (Gemma 2) each sublayer's output goes through a norm of its own
    (``post_attn_norm``, ``post_mlp_norm``) before it is added, and with post (OLMo 2) only those
    (no ``ln_1``, ``ln_2``)."""

    def __init__(self, config: ModelConfig, layer_type: Optional[LayerType] = None):
        super().__init__()
        if config.sublayer_norms != "post":
            self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config, layer_type)
        if config.sublayer_norms != "post":
            self.ln_2 = make_norm(config)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)
        self.parallel = config.parallel_residual
        if config.sublayer_norms != "pre":
            self.post_attn_norm, self.post_mlp_norm = make_norm(config), make_norm(config)

    def parts(self) -> BlockParts:
        """This block's sublayers as ``minilm.model.layer.block`` calls them (the attention and the
        MLP as modules: their hooks run)."""
        norms = [getattr(self, name, None) for name in ("ln_1", "ln_2", "post_attn_norm", "post_mlp_norm")]
        return BlockParts(norms[0], self.attn, norms[1], self.mlp, dropout(self.drop), self.parallel, *norms[2:])

    def forward(self, x, layer: int, fp: ForwardPass):
        """The block's output; with ``fp.weights_of == layer`` the pair (output, attention weights)."""
        return block(x, layer, fp, self.parts())


class GPT(nn.Module):
    """The language model of ``config`` (a ``ModelConfig``): token embedding, the position scheme
    (``positions``; per layer type in ``layer_positions``), ``n_layer`` blocks, a final norm and
    the LM head (tied to the embedding unless ``tie_embeddings`` is false). ``forward(idx)`` gives
    logits; ``new_cache`` makes the KV cache that ``forward`` then advances; ``parts()`` hands the
    layer code its tensors (``minilm.model.layer``). Weights start as ``_init_weights`` draws them."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        concat = config.concat_position_dims  # 0: positions added to all d_model dimensions
        self.positions = build(
            config.position,
            d_model=concat or config.d_model,
            n_head=config.n_head,
            block_size=config.block_size,
            head_dim=config.head_dim,
        )
        self.layer_types = layer_types(config.layers, config.position, config.n_layer)
        own = own_settings(self.layer_types, config.position)  # a uniform model has none
        shape = {"d_model": config.d_model, "n_head": config.n_head, "block_size": config.block_size}
        built = {name: build(position, head_dim=config.head_dim, **shape) for name, position in own.items()}
        self.layer_positions = nn.ModuleDict(built) if built else None
        self.layer_schemes = [  # a plain list: the modules are registered once, under positions and layer_positions
            next((built[n] for n, p in own.items() if p == t.position), self.positions) for t in self.layer_types
        ]
        self.wte = nn.Embedding(config.vocab_size, config.d_model - concat)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, layer_type) for layer_type in self.layer_types)
        self.ln_f = make_norm(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        kv_width = (config.n_kv_head or config.n_head) * config.head_dim
        self.value_embeds = (
            nn.ModuleList(nn.Embedding(config.vocab_size, kv_width) for _ in range((config.n_layer + 1) // 2))
            if config.value_embeddings
            else None
        )
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.embedding_scale = embedding_multiplier(config, self.positions)
        self.checkpoint_blocks = False  # train.activation_checkpointing: recompute each block in the backward pass
        self._init_weights()

    def _init_weights(self):
        """GPT-2 init: N(0, 0.02), zero biases, residual projections scaled by 1/sqrt(2 n_layer);
        the token embedding N(0, ``embedding_init_std``) (0.02 unless set: fairseq's transformer LM,
        the set-up of the ALiBi paper's sinusoidal baseline, draws it from N(0, d_model^-0.5) and
        multiplies it by sqrt(d_model), so a token's embedding has unit-scale entries beside the
        unit-amplitude sin/cos table). The position scheme initialises its own parameters."""
        for name, module in self.named_modules():
            if name.startswith(("positions", "layer_positions")):
                continue
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(
                    module.weight, mean=0.0, std=self.config.embedding_init_std if module is self.wte else 0.02
                )
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))
        if self.lm_head.weight is self.wte.weight and self.config.embedding_init_std != 0.02:
            # the tied head's 0.02 draw above overwrote the embedding's: draw it again, last, so that at
            # the default every weight of a tied model is what it was before the option existed
            nn.init.normal_(self.wte.weight, mean=0.0, std=self.config.embedding_init_std)

    def schemes(self) -> list:
        """Every position scheme of the model once: ``positions`` and each layer type's own."""
        return [self.positions, *(self.layer_positions.values() if self.layer_positions is not None else ())]

    def num_params(self) -> int:
        """Trainable parameters, a tied LM head counted once (with the embedding)."""
        return sum(p.numel() for p in self.parameters())

    def new_cache(
        self,
        batch_size: int,
        capacity: int,
        *,
        rolling: bool = False,
        sinks: int = 0,
        sink_positions: str = SINK_POSITIONS[0],
        static: bool = False,
        offsets: Optional[torch.Tensor] = None,
    ) -> KVCache:
        """A KV cache of ``capacity`` token slots for ``batch_size`` sequences: up to ``capacity``
        tokens, or with ``rolling=True`` a sliding window over the last ``capacity`` tokens (the
        first ``sinks`` of them kept for good: attention sinks, placed by ``sink_positions``,
        ``minilm.model.cache``). It holds the n_kv_head k/v heads.
        ``static``: attention always sees every slot (fixed shapes, for a compiled step).
        ``offsets`` (batch_size,): left-padded rows, row b's first token in slot offsets[b]."""
        if any(scheme.draws_at_evaluation for scheme in self.schemes()):
            raise PositionError(
                f"{describe(self.config.position)} draws its positions at random at evaluation "
                f"(eval_positions: sampled), which a KV cache cannot follow: load the model with "
                f"model.position.eval_positions=plain to generate"
            )
        ref = self.wte.weight
        cache = KVCache(
            self.config.n_layer,
            batch_size,
            self.blocks[0].attn.n_kv_head,
            self.config.head_dim,
            capacity,
            rolling=rolling,
            sinks=sinks,
            sink_positions=sink_positions,
            static=static,
            offsets=offsets,
            dtype=cache_dtype(ref),
            device=ref.device,
            spans=[layer_type.cache_span() for layer_type in self.layer_types],
        )
        self.check_renumbering(cache.renumbered)
        return cache

    def check_renumbering(self, renumbered: bool) -> None:
        """ValueError for sinks at cache positions under a scheme that adds positions to the
        embeddings (sinusoidal): those are in every cached key and value and cannot be moved; and
        under layers with windows or chunks of their own, whose keys are not renumbered."""
        if renumbered and any(layer_type.masked for layer_type in self.layer_types):
            raise ValueError(
                "sink_positions='cache' renumbers the positions of one window, but this model's layers have "
                "windows or chunks of their own (model.layers): use sink_positions='absolute'"
            )
        if renumbered and self.positions.embeds:
            raise ValueError(
                f"sink_positions='cache' renumbers positions inside attention, but {self.positions.kind} "
                f"positions are added to the embeddings: use sink_positions='absolute'"
            )

    def forward(
        self,
        idx: torch.Tensor,
        cache: Optional[KVCache] = None,
        *,
        window: Optional[int] = None,
        sinks: int = 0,
        sink_positions: Optional[str] = None,
        context_len: Optional[int] = None,
        return_hidden: bool = False,
        body=None,
        weights_of: Optional[int] = None,
        end_of_text: Optional[int] = None,
        restart_positions: bool = False,
        head: Optional[Callable] = None,
    ):
        """Logits (B, T, vocab) for tokens ``idx`` (B, T); without a cache the tokens sit at
        positions 0..T-1, with one at ``cache.length``.. (and the cache advances).

        - ``cache``: a ``KVCache`` (``new_cache``); its tokens attend to everything it holds; one made
          with ``offsets`` holds left-padded rows, each at its own positions.
        - ``window``, ``sinks`` (no cache): each query sees only the last ``window`` positions and the
          first ``sinks``, placed by ``sink_positions`` as in ``minilm.model.cache`` (default the first
          of SINK_POSITIONS; a cache has its own placement, which this may only repeat).
        - ``context_len``: the length dynamic RoPE scaling sees (default T, or the cache's capacity).
        - ``return_hidden``: the final normalised hidden states instead of logits.
        - ``body``: what runs in ``self.body``'s place (``minilm.generation.compiled``, ``.lean``).
        - ``weights_of`` (a layer index): (logits, that layer's attention weights (B, n_head, T, keys)).
        - ``end_of_text`` (an id; no cache, no window): rows hold documents that each end with it, and
          attention stops at their boundaries; ``restart_positions`` numbers each from 0.
        - ``head(hidden, lm_head_weight, logit_softcap)``: returned instead of the logits, computed
          inside the pass (a loss that never forms the logits; FSDP's head is whole only in a pass).
        """
        B, T = idx.shape
        if window is not None and not (
            isinstance(window, int) and not isinstance(window, bool) and isinstance(sinks, int) and 0 <= sinks < window
        ):  # a window of no keys, or of sinks only, hides every key: NaN scores
            raise ValueError(
                f"window={window!r} with sinks={sinks!r} is invalid: expected an integer window of at least 1 "
                "position and sinks an integer from 0 to window - 1"
            )
        if any(scheme.draws_at_evaluation for scheme in self.schemes()) and not self.training and B > 1:
            # positions drawn at evaluation (randomized, eval_positions: sampled): one draw per row, so that
            # the rows of a batch are independent samples and no score depends on how rows were batched
            rows = [
                self.forward(
                    idx[b : b + 1],
                    cache,
                    window=window,
                    sinks=sinks,
                    sink_positions=sink_positions,
                    context_len=context_len,
                    return_hidden=return_hidden or head is not None,
                    body=body,
                    weights_of=weights_of,
                    end_of_text=end_of_text,
                    restart_positions=restart_positions,
                )
                for b in range(B)
            ]
            if weights_of is not None:
                return tuple(torch.cat(part) for part in zip(*rows))
            return torch.cat(rows) if head is None else self.head_of(torch.cat(rows), head)
        for scheme in self.schemes():
            scheme.check_positions((cache.length if cache is not None else 0) + T - 1)
        if cache is not None:
            if cache.batch_size != B:
                raise ValueError(f"batch of {B} sequences does not match the cache's batch size {cache.batch_size}")
            pos = cache.begin(T)
            context_len = context_len or cache.capacity
        else:
            pos = torch.arange(T, device=idx.device, dtype=torch.float32)
            context_len = context_len or T
        # each scheme as this pass asks it, what it computes once per pass held there (rows of their own differ below)
        passes = {id(scheme): scheme.start(pos, context_len) for scheme in self.schemes()}
        documents = None
        if restart_positions and end_of_text is None:
            raise ValueError("restart_positions restarts them at each end_of_text id: give end_of_text too")
        if end_of_text is not None:
            if cache is not None or window is not None:
                raise ValueError("end_of_text masks documents in a full-sequence pass: not with a cache or a window")
            documents, within = document_layout(idx, end_of_text)
            pos = within if restart_positions else pos
        elif cache is not None and cache.offsets is not None:
            pos = pos[None, :] - cache.offsets[:, None]
        if weights_of is not None and weights_of < 0:
            weights_of += len(self.blocks)  # -1: the last layer
        if sink_positions is not None:
            check_sink_positions(sink_positions)
        if cache is not None:
            renumbered = cache.renumbered
            if sink_positions is not None and cache.sinks and sink_positions != cache.sink_positions:
                raise ValueError(
                    f"sink_positions={sink_positions!r} differs from the cache's placement "
                    f"{cache.sink_positions!r}: make the cache with it (new_cache), or leave it out"
                )
        else:
            renumbered = window is not None and sinks > 0 and (sink_positions or SINK_POSITIONS[0]) == "cache"
            self.check_renumbering(renumbered)
        if renumbered and weights_of is not None:
            raise ValueError("attention weights are not written out for sinks at cache positions")
        scheme = passes[id(self.positions)]
        fp = ForwardPass(pos, scheme, cache, window, sinks, context_len, weights_of, renumbered, documents)
        if self.layer_positions is not None:
            fp = fp._replace(schemes=tuple(passes[id(scheme)] for scheme in self.layer_schemes))
        out = (body or self.body)(idx, fp, return_hidden or head is not None)
        if cache is not None:
            cache.commit()
        return out if head is None else self.head_of(out, head)

    def head_of(self, hidden: torch.Tensor, head: Callable):
        """``head(hidden, lm_head_weight, logit_softcap)``: what ``forward(head=...)`` returns."""
        return head(hidden, self.lm_head.weight, self.config.logit_softcap)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits of final normalised hidden states: the LM head, soft-capped where the model is."""
        return soft_cap(linear(self.lm_head, hidden), self.config.logit_softcap)

    def embed_positions(self, x, fp: ForwardPass):
        """The token embeddings ``x`` with the scheme's positions added (``embed``) or, under
        ``model.concat_position_dims`` N, an N-dim encoding concatenated after them."""
        concat = self.config.concat_position_dims
        if concat:
            tokens, x = x, x.new_zeros(*x.shape[:-1], concat)
        if not fp.per_row:
            x = fp.scheme.embed(x, fp.pos)
        else:  # each row at its own positions; padding (negative positions) takes position 0's
            x = torch.cat([fp.scheme.embed(x[b : b + 1], fp.pos[b].clamp(min=0)) for b in range(len(x))])
        return torch.cat([tokens, x], dim=-1) if concat else x

    def inputs(self, idx, fp: ForwardPass) -> tuple:
        """(the first block's input for tokens ``idx``: embedding, scaled, positions added; ``fp``
        with each layer's value embeddings where the model has them)."""
        x = self.wte(idx)
        if self.embedding_scale != 1.0:
            x = x * self.embedding_scale
        x = dropped(self.embed_positions(x, fp), dropout(self.drop))
        if self.value_embeds is not None:
            tables = [table(idx) for table in self.value_embeds]
            fp = fp._replace(values=[tables[value_table(i, len(self.blocks))] for i in range(len(self.blocks))])
        return x, fp

    def outputs(self, x, return_hidden: bool):
        """The last block's output ``x`` normalised, and (unless ``return_hidden``) its logits."""
        x = self.ln_f(x)
        return x if return_hidden else self.logits(x)

    def body(self, idx, fp: ForwardPass, return_hidden: bool, blocks: Optional[list] = None):
        """The computation of ``forward`` once positions are known: ``inputs``, the blocks,
        ``outputs``. No Python state changes here, so that a compiler can take it whole. ``blocks``:
        what runs in the blocks' place, each called as a block is, (x, layer, fp) (the lean decode step's)."""
        x, fp = self.inputs(idx, fp)
        weights = None
        for layer, step in enumerate(self.blocks if blocks is None else blocks):
            if self.checkpoint_blocks and self.training and torch.is_grad_enabled():
                # only the block's input is kept; its dropout masks are drawn again alike (the RNG state is kept)
                x = torch.utils.checkpoint.checkpoint(step, x, layer, fp, use_reentrant=False)
                continue
            x = step(x, layer, fp)
            if fp.weights_of == layer:
                x, weights = x
        out = self.outputs(x, return_hidden)
        return out if fp.weights_of is None else (out, weights)
