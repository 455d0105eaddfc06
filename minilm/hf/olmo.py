"""The OLMo 3 family both ways (``olmo3``), as transformers 5.24 computes it: a Llama block with its
norms after each sublayer only (``sublayer_norms: post``) and an RMSNorm over all heads' queries at
once and all heads' keys at once, before the heads are split (``qk_norm`` with ``qk_norm_span:
projection``), SwiGLU and grouped-query attention.

Positions per layer: ``layer_types`` of sliding and full attention (by default three sliding layers
and one full, repeated) with one ``sliding_window``, and RoPE settings per layer type:
``rope_parameters`` keyed by ``sliding_attention`` and ``full_attention`` (YaRN on the full layers
only, in OLMo 3's long-context models). Older files' ``rope_scaling`` goes to the full layers only,
and their ``rope_theta`` too: transformers hands it to the full layers and gives the sliding ones the
default base, 500,000, as here.
"""

from __future__ import annotations

from minilm.hf.exaone import post_norm_style, post_norm_tensors, read_weights
from minilm.hf.family import (
    LLAMA_LAYOUT,
    ROTARY,
    Family,
    llama_config,
    llama_shape,
    refuse,
    require,
    sliding_layers,
)
from minilm.hf.rope import rope_by_layer_type, rope_parameters, rope_parameters_by_layer_type
from minilm.positions.layers import layer_types

THETA = 500000.0  # transformers' default base for both layer types


def read_config(hf: dict, path: str) -> dict:
    if hf.get("hidden_act", "silu") != "silu":
        refuse(path, f"hidden_act={hf.get('hidden_act')!r} is not supported for olmo3; supported: silu")
    if hf.get("attention_bias"):
        refuse(path, "attention_bias=true is not supported for OLMo 3")
    legacy = {
        "full_attention": {**(hf.get("rope_scaling") or {}), "rope_theta": hf.get("rope_theta", THETA)},
        "sliding_attention": {"rope_type": "default", "rope_theta": THETA},
    }
    full, layers = sliding_layers(hf, path, 4, rope_by_layer_type(hf, path, legacy))
    return dict(
        llama_shape(hf, path, 1e-5),
        qk_norm=True,
        qk_norm_span="projection",
        sublayer_norms="post",
        mlp="swiglu",
        tie_embeddings=hf.get("tie_word_embeddings", False),
        position=full,
        layers=layers,
    )


def write_layers(m) -> dict:
    """layer_types, sliding_window and rope_parameters per layer type (the sliding layers' own, or
    ``model.position``), for a ``model.layers`` of sliding layers of one window beside full ones."""
    if m.layers is None:
        kinds, windows, sliding = ["full_attention"] * m.n_layer, set(), m.position
    else:
        types = layer_types(m.layers, m.position, m.n_layer)
        windows = {t.window for t in types if t.window is not None}
        slides = {repr(t.position) for t in types if t.window is not None}
        require(
            len(windows) <= 1
            and len(slides) <= 1
            and all(not (t.chunk or t.sinks or t.softcap or t.query_scale) for t in types)
            and all(t.position == m.position for t in types if t.window is None)
            and all(t.position["kind"] == "rope" for t in types),
            "OLMo 3",
            "its model.layers is more than sliding rope layers of one window and one setting beside full "
            "layers with model.position, the design OLMo 3 holds",
        )
        kinds = ["sliding_attention" if t.window is not None else "full_attention" for t in types]
        sliding = next((t.position for t in types if t.window is not None), m.position)
    return {
        "layer_types": kinds,
        # transformers makes the sliding mask in every model, so a window is written even where no layer slides
        "sliding_window": min(windows) if windows else m.block_size,
        "rope_parameters": rope_parameters_by_layer_type(m, "OLMo 3", sliding),
    }


def write(m, sd: dict) -> tuple:
    out = post_norm_tensors(m, sd)
    config = dict(
        llama_config(m, *rope_parameters(m)),
        architectures=["Olmo3ForCausalLM"],
        model_type="olmo3",
        hidden_act="silu",
        attention_bias=False,
        pad_token_id=None,
    )
    config.update(write_layers(m))
    return "olmo3", config, out


OLMO = Family(
    name="OLMo 3",
    model_types=("olmo3",),
    read_config=read_config,
    read_weights=read_weights,
    exports=lambda m: post_norm_style(m, "projection"),
    write=write,
    handles=LLAMA_LAYOUT | {"qk_norm", "qk_norm_span", "layers", "sublayer_norms"},
    buffers=ROTARY,
)
