"""Figures that show what a position scheme does.

* ``scheme_figure(scheme, position)`` draws the figure suited to a scheme, always through the
  scheme's own hooks (``embed``, ``inv_freq``/``rotate``, ``bias``) so a figure cannot drift
  from what the model computes:
  additive schemes (sinusoidal, learned) show PE(position) as a heatmap and the cosine
  similarity between positions; rope shows each dimension pair's wavelength before and after
  every scaling (linear / PI, NTK, dynamic NTK, YaRN) and q.k against relative distance;
  bias schemes (alibi, t5) show each head's bias against distance; ``interpolated`` shows the
  wrapped scheme's figure with positions divided by its factor; none explains itself in text.
* attention maps of a model are ``minilm.figures.attention``; every figure is written by
  ``minilm.figures.canvas.save_figure``.

matplotlib is an optional extra (``pip install -e ".[plot]"``). Figures are built with the
object-oriented API (``matplotlib.figure.Figure`` rendered by Agg), never pyplot, so nothing
needs a display and no global backend is switched.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import yaml

from minilm.figures.canvas import require_matplotlib, save_figure
from minilm.positions import PositionScheme, build, scheme_class, unwrap_setting
from minilm.positions.t5 import t5_bucket

COMPARE_FACTOR = 4.0  # rope scalings are compared at this factor when the scheme has none


# --------------------------------------------------------------------------- scheme figures


def _overrides(cls, method: str) -> bool:
    return getattr(cls, method) is not getattr(PositionScheme, method)


def settings_line(position: dict) -> str:
    """The scheme's options, defaults included, as one line of YAML."""
    options = {**scheme_class(position["kind"]).options, **{k: v for k, v in position.items() if k != "kind"}}
    if not options:
        return f"{position['kind']} (no options)"
    flow = yaml.safe_dump(options, default_flow_style=True, sort_keys=False, width=10**6).strip()
    return f"{position['kind']} {flow}"


def _title(fig, scheme: PositionScheme, position: dict, source: Optional[str], extra: str = "") -> None:
    shape = f"d_model={scheme.d_model}, n_head={scheme.n_head}, block_size={scheme.block_size}"
    if not any(p.numel() for p in scheme.parameters()):
        origin = "no trained parameters" + (f" (settings from {source})" if source else "")
    elif source:
        origin = f"trained values from {source}"
    else:
        zeros = all(not bool(p.any()) for p in scheme.parameters())
        origin = f"UNTRAINED: {'all zero' if zeros else 'initial values'} at init; pass --checkpoint for trained values"
    lines = [settings_line(position), f"{shape}; {origin}"] + ([extra] if extra else [])
    fig.suptitle("\n".join(lines), fontsize=11)


def scheme_figure(scheme: PositionScheme, position: dict, *, source: Optional[str] = None):
    """The figure suited to ``scheme`` (built from ``position``); ``source`` names the checkpoint
    its trained values came from (None: the scheme's initial values)."""
    require_matplotlib()
    if scheme.kind == "randomized":  # at evaluation the wrapped scheme sees the plain positions
        fig = scheme_figure(scheme.inner, position.get("inner", {"kind": "rope"}), source=source)
        fig.suptitle(
            f"{fig.get_suptitle()}\nrandomized (max_positions={scheme.max_positions}): in training the "
            f"positions are a sorted sample of [0, {scheme.max_positions}); shown: the plain positions of "
            f"evaluation",
            fontsize=11,
        )
        return fig
    inner = scheme.unwrap()[0]
    cls = type(inner)
    with torch.no_grad():
        if hasattr(inner, "zeta"):
            return _xpos_figure(scheme, position, source)
        if _overrides(cls, "rotate") and hasattr(inner, "inv_freq"):
            return _rope_figure(scheme, position, source)
        if scheme.has_bias:
            return _bias_figure(scheme, position, source)
        if _overrides(cls, "embed"):
            return _additive_figure(scheme, position, source)
        return _text_figure(scheme, position, source)


def plot_scheme(scheme: PositionScheme, position: dict, path: str, *, source: Optional[str] = None) -> str:
    """Draw ``scheme_figure`` and write it to ``path`` (an earlier file there is set aside, never
    replaced: ``save_figure(keep=True)``)."""
    return save_figure(scheme_figure(scheme, position, source=source), path, keep=True)


def _scaled_note(scheme: PositionScheme) -> str:
    if scheme.kind != "interpolated":
        return ""
    return f"position interpolation: {scheme.inner.kind} sees every position divided by {scheme.factor:g}"


def _additive_figure(scheme, position, source):
    """PE heatmap (position x dimension), cosine-similarity matrix, similarity against offset."""
    Figure = require_matplotlib()
    limit = scheme.position_limit()
    n = scheme.block_size if limit is None else min(scheme.block_size, int(math.floor(limit)))
    pos = torch.arange(n, dtype=torch.float32)
    pe = scheme.embed(torch.zeros(1, n, scheme.d_model), pos)[0].float()  # PE(pos): the real embed hook
    unit = pe / pe.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    cosine = unit @ unit.T

    fig = Figure(figsize=(16, 5.2), layout="constrained")
    fig.get_layout_engine().set(w_pad=0.12)
    ax_pe, ax_sim, ax_off = fig.subplots(1, 3, width_ratios=[1.15, 1, 1.2])
    vmax = float(pe.abs().max()) or 1.0
    im = ax_pe.imshow(pe.numpy(), aspect="auto", cmap="RdBu_r", vmin=-vmax, vmax=vmax)
    ax_pe.set(title="PE(position) added to each token", xlabel="embedding dimension", ylabel="position")
    fig.colorbar(im, ax=ax_pe, label="PE value")

    im = ax_sim.imshow(cosine.numpy(), cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ax_sim.set(title="cosine similarity of PE(p) and PE(q)", xlabel="position q", ylabel="position p")
    fig.colorbar(im, ax=ax_sim, label="cosine similarity")

    for ref, style in zip(sorted({0, n // 2, n - 1}), ("-", "--", ":")):
        offsets = (pos - ref).numpy()
        ax_off.plot(offsets, cosine[ref].numpy(), style, lw=1.3, label=f"p = {ref}")
    ax_off.axhline(0, color="grey", lw=0.6)
    ax_off.set(
        title="similarity of position p to every other position",
        xlabel="offset q - p (tokens)",
        ylabel="cosine similarity of PE(p), PE(q)",
    )
    ax_off.legend(loc="upper right", fontsize=9)
    ax_off.grid(alpha=0.3)
    _title(fig, scheme, position, source, _scaled_note(scheme))
    return fig


class RopeCurves(NamedTuple):
    """What the rope figure draws: every scaling's inverse frequencies at one factor."""

    rope: PositionScheme  # the rotary scheme itself (inside interpolated, if wrapped)
    pos_factor: float  # interpolated's position divisor (1 without it)
    factor: float  # the scaling factor compared
    length: int  # L, the original training length
    extended: int  # factor * L
    plain: PositionScheme  # the same rope without scaling
    reference: torch.Tensor  # its inverse frequencies
    curves: list  # (label, scaling type, inverse frequencies)
    selected: torch.Tensor  # the frequencies the selected scheme rotates with at the extended length
    selected_label: str


def _rope_curves(scheme, position) -> RopeCurves:
    """Every scaling of the scheme's rope at one factor, through the scheme's own inv_freq."""
    rope, pos_factor = scheme.unwrap()
    rope_position = unwrap_setting(position)
    selected_type = rope.scaling["type"]
    length = rope.scaling["original_max_positions"]  # L, the original training length
    if selected_type != "none" or rope.scaling["factor"] != 1.0:
        factor = rope.scaling["factor"]
    else:
        factor = pos_factor if pos_factor != 1.0 else COMPARE_FACTOR
    extended = int(round(factor * length))
    shape = dict(d_model=rope.d_model, n_head=rope.n_head, block_size=rope.block_size)

    def variant(kind):
        scaling = {"type": kind, "original_max_positions": length}
        if kind != "none":
            scaling["factor"] = factor
        return build({**rope_position, "scaling": scaling}, **shape)

    plain = variant("none")
    reference = plain.inv_freq(length)
    curves = [
        ("none (original rope)", "none", reference),
        (f"linear / PI \u00d7{factor:g}", "linear", variant("linear").inv_freq(extended)),
        (f"NTK-aware \u00d7{factor:g}", "ntk", variant("ntk").inv_freq(extended)),
        (f"YaRN \u00d7{factor:g}", "yarn", variant("yarn").inv_freq(extended)),
    ]
    curves.append((f"Llama 3 \u00d7{factor:g}", "llama3", variant("llama3").inv_freq(extended)))
    dynamic = variant("dynamic")
    for times in (2, 4):
        curves.append((f"dynamic NTK \u00d7{factor:g} at T={times}L", "dynamic", dynamic.inv_freq(times * length)))
    if selected_type == "longrope":  # its factors are the scheme's own: no other variant has them
        curves += [
            ("LongRoPE, short factors (T <= L)", "longrope", rope.inv_freq(length)),
            ("LongRoPE, long factors (T > L)", "longrope", rope.inv_freq(extended)),
        ]
    if scheme.kind == "interpolated":
        inner_scaling = "" if selected_type == "none" else f" over {selected_type} \u00d7{factor:g}"
        selected_label = f"selected: interpolated, positions / {pos_factor:g}{inner_scaling}"
    elif selected_type == "none":
        selected_label = "selected: rope, no scaling"
    else:
        at = f" at T={extended}" if selected_type == "dynamic" else ""
        selected_label = f"selected: {selected_type} \u00d7{factor:g}{at}"
    # the frequencies the selected scheme rotates with (positions / factor)
    selected = rope.inv_freq(max(1, int(round(extended / pos_factor)))) / pos_factor
    return RopeCurves(rope, pos_factor, factor, length, extended, plain, reference, curves, selected, selected_label)


def _draw_frequencies(fig, ax_wave, ax_ratio, c: RopeCurves) -> None:
    """Left: each pair's wavelength per scaling; middle: its frequency relative to plain rope."""
    pairs = torch.arange(len(c.reference)).numpy()
    colors = {
        "none": "black",
        "linear": "tab:blue",
        "ntk": "tab:orange",
        "yarn": "tab:green",
        "dynamic": "tab:purple",
        "llama3": "tab:brown",
        "longrope": "tab:cyan",
    }
    for ax, transform in ((ax_wave, lambda inv: 2 * math.pi / inv), (ax_ratio, lambda inv: inv / c.reference)):
        ax.plot(
            pairs,
            transform(c.selected).numpy(),
            color="gold",
            lw=7,
            alpha=0.6,
            solid_capstyle="round",
            label=c.selected_label,
            zorder=1,
        )
        styles = {"dynamic": iter(("--", ":")), "longrope": iter(("--", ":"))}  # two curves each
        for label, kind, inv in c.curves:
            style = next(styles[kind]) if kind in styles else "-"
            ax.plot(pairs, transform(inv).numpy(), style, color=colors[kind], lw=1.6, label=label, zorder=2)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.set_xlabel(f"dimension pair i (dims i, i+{c.rope.rot // 2} of the {c.rope.rot} rotated)")
    right = pairs[-1]
    for value, style, text in (
        (c.length, "--", f"training length L={c.length} "),
        (c.extended, ":", f"extended length {c.extended} "),
    ):
        ax_wave.axhline(value, color="red", lw=1, ls=style)
        ax_wave.text(right, value, text, color="red", va="bottom", ha="right", fontsize=9)
    ax_wave.set(
        title="wavelength 2\u03c0/\u03b8\u1d62 of each pair (tokens per turn)", ylabel="wavelength (tokens, log scale)"
    )
    ax_ratio.axhline(1 / c.factor, color="grey", lw=0.8, ls=":")
    ax_ratio.set(
        title="scaled / original frequency (1 = kept, 1/s = interpolated)",
        ylabel="\u03b8\u1d62 scaled / \u03b8\u1d62 original (log scale)",
    )
    ratios = torch.cat([inv / c.reference for _, _, inv in c.curves] + [c.selected / c.reference])
    ratios = ratios[ratios > 0]  # p-RoPE's pairs at frequency 0 never turn: off the log axis
    low, high = min(float(ratios.min()), 1 / c.factor) * 0.8, max(float(ratios.max()), 1 / c.factor) * 1.6
    ax_ratio.set_ylim(low, high)
    powers = range(math.floor(math.log2(low)) + 1, math.ceil(math.log2(high)))
    ax_ratio.set_yticks([2.0**e for e in powers], [f"1/{2**-e}" if e < 0 else f"{2**e}" for e in powers])
    ax_ratio.minorticks_off()
    handles, labels = ax_ratio.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, fontsize=9)


def _draw_rope_dot(ax_qk, scheme, c: RopeCurves) -> None:
    """q.k of the same content at two positions: q = k = 1, which is also the mean over random q = k."""
    distance = torch.arange(c.extended, dtype=torch.float32)
    ones = torch.ones(1, 1, c.extended, c.rope.d_model // c.rope.n_head)

    def dot_at_distance(s):
        q, k = s.rotate(ones, ones, distance, c.extended)
        return (q[0, 0] * k[0, 0, :1]).sum(-1).float()

    base_dot = dot_at_distance(c.plain)
    norm = float(base_dot[0])
    ax_qk.plot(distance.numpy(), (base_dot / norm).numpy(), color="black", lw=0.8, label="none (original rope)")
    if scheme.kind == "interpolated" or c.rope.scaling["type"] != "none":
        ax_qk.plot(
            distance.numpy(),
            (dot_at_distance(scheme) / norm).numpy(),
            color="goldenrod",
            lw=0.9,
            label=c.selected_label,
        )
    ax_qk.axvline(c.length, color="red", lw=1, ls="--", label=f"training length L={c.length}")
    ax_qk.axhline(0, color="grey", lw=0.6)
    ax_qk.set(
        title="q\u00b7k of the same content at distance m - n",
        xlabel="relative distance m - n (tokens)",
        ylabel="q\u00b7k / |q|\u00b2  (q = k = 1, the mean over random q = k)",
    )
    ax_qk.legend(loc="upper right", fontsize=8)
    ax_qk.grid(alpha=0.3)


def _rope_figure(scheme, position, source):
    """Wavelength of each dimension pair before/after every scaling, their ratio to unscaled
    rope, and q.k against relative distance for the selected scheme vs unscaled rope."""
    Figure = require_matplotlib()
    curves = _rope_curves(scheme, position)
    fig = Figure(figsize=(14.5, 5.6), layout="constrained")
    ax_wave, ax_ratio, ax_qk = fig.subplots(1, 3)
    _draw_frequencies(fig, ax_wave, ax_ratio, curves)
    _draw_rope_dot(ax_qk, scheme, curves)
    unscaled = curves.rope.scaling["type"] == "none" and curves.pos_factor == 1.0
    note = f"no scaling selected: scalings compared at factor {curves.factor:g}" if unscaled else ""
    extra = "; ".join(p for p in (_scaled_note(scheme), note) if p)
    _title(fig, scheme, position, source, extra)
    return fig


def _xpos_figure(scheme, position, source):
    """xPos: each pair's zeta, its decay zeta^(distance / scale_base), and q.k against distance
    next to plain rope's (through the scheme's own rotate)."""
    Figure = require_matplotlib()
    xpos, pos_factor = scheme.unwrap()
    span = max(4 * scheme.block_size, int(2 * xpos.scale_base))
    distance = torch.arange(span, dtype=torch.float32)
    pairs = torch.arange(len(xpos.zeta))
    fig = Figure(figsize=(16, 5.2), layout="constrained")
    ax_zeta, ax_decay, ax_qk = fig.subplots(1, 3)
    ax_zeta.plot(pairs.numpy(), xpos.zeta.numpy(), "o-", color="tab:green")
    ax_zeta.set(
        title="\u03b6\u1d62 = (2i/d + \u03b3) / (1 + \u03b3) per pair", xlabel="dimension pair i", ylabel="\u03b6\u1d62"
    )
    for i in sorted({0, len(pairs) // 4, len(pairs) // 2, len(pairs) - 1}):
        decay = xpos.zeta[i] ** (distance / pos_factor / xpos.scale_base)
        ax_decay.plot(distance.numpy(), decay.numpy(), lw=1.4, label=f"pair {i}: \u03b6={float(xpos.zeta[i]):.3f}")
    ax_decay.set(
        title=f"decay \u03b6\u1d62^(distance / {xpos.scale_base:g}) of each pair's q\u00b7k",
        xlabel="distance m - n (tokens)",
        ylabel="factor on the pair's q\u00b7k",
    )
    ax_decay.legend(fontsize=8)
    ones = torch.ones(1, 1, span, xpos.d_model // xpos.n_head)
    plain = build(
        {"kind": "rope", "base": xpos.base, "rotary_fraction": position.get("rotary_fraction", 1.0)},
        d_model=xpos.d_model,
        n_head=xpos.n_head,
        block_size=xpos.block_size,
    )
    for s, label, color in ((plain, "rope (no decay)", "black"), (scheme, "xpos", "goldenrod")):
        q, k = s.rotate(ones, ones, distance, span)
        dots = (q[0, 0, :, None, :] * k[0, 0, None, :1, :]).sum(-1)[:, 0]  # query at distance m from key 0
        ax_qk.plot(distance.numpy(), (dots / dots[0]).numpy(), color=color, lw=0.9, label=label)
    ax_qk.axhline(0, color="grey", lw=0.6)
    ax_qk.set(
        title="q\u00b7k of the same content against distance",
        xlabel="distance m - n (tokens)",
        ylabel="q\u00b7k / q\u00b7k at distance 0",
    )
    ax_qk.legend(fontsize=8)
    for ax in (ax_zeta, ax_decay, ax_qk):
        ax.grid(alpha=0.3)
    _title(fig, scheme, position, source, _scaled_note(scheme))
    return fig


def _bias_figure(scheme, position, source):
    """Each head's bias against distance, the attention a query would pay from bias alone,
    and (t5) the distance buckets."""
    Figure = require_matplotlib()
    import matplotlib  # optional: present once require_matplotlib has passed

    inner, factor = scheme.unwrap()
    is_t5 = hasattr(inner, "num_buckets")
    span = scheme.block_size
    if is_t5:
        span = max(span, int(2 * inner.max_distance * factor))
    k_pos = torch.arange(span, dtype=torch.float32)
    q_pos = torch.tensor([span - 1.0])
    bias = scheme.bias(q_pos, k_pos)  # the real bias hook; a query-dependent one (shaw) sees a query of ones
    bias = (bias[0] if bias.dim() == 4 else bias)[:, 0, :].float()  # (heads, keys)
    distance = (q_pos - k_pos).numpy()
    prior = torch.softmax(bias, dim=-1)

    fig = Figure(figsize=(17 if is_t5 else 12.5, 5.6), layout="constrained")
    axes = fig.subplots(1, 3 if is_t5 else 2)
    ax_bias, ax_prior = axes[0], axes[1]
    cmap = matplotlib.colormaps["viridis"]
    slopes = getattr(inner, "slopes", None)
    heads = bias.shape[0]
    # colour by steepness: by slope for alibi (not monotone in the head index when heads are not a power of 2)
    order = torch.argsort(-slopes).tolist() if slopes is not None else list(range(heads))
    rank = {h: r for r, h in enumerate(order)}
    for h in range(heads):
        label = f"head {h}" + (f": m=$2^{{{math.log2(float(slopes[h]) / factor):.3g}}}$" if slopes is not None else "")
        color = cmap(rank[h] / max(1, heads - 1) * 0.9)
        ax_bias.plot(distance, bias[h].numpy(), color=color, lw=1.4, label=label)
        ax_prior.plot(distance, prior[h].numpy(), color=color, lw=1.4, label=label)
    ax_bias.set(
        title="bias added to the logit of a key at distance i - j", xlabel="distance i - j (tokens)", ylabel="bias"
    )
    ax_prior.set(
        title=f"attention from the bias alone (query at {span - 1}, equal q\u00b7k)",
        xlabel="distance i - j (tokens, symlog)",
        ylabel="softmax weight",
    )
    ax_prior.set_xscale("symlog", linthresh=1)
    ax_bias.legend(fontsize=8, ncol=2 if heads > 6 else 1, loc="lower left" if slopes is not None else "best")
    for ax in (ax_bias, ax_prior):
        ax.grid(alpha=0.3)
    if is_t5:
        ax_bucket = axes[2]
        buckets = t5_bucket(torch.as_tensor(distance) / factor, inner.num_buckets, inner.max_distance)
        ax_bucket.step(distance, buckets.numpy(), where="post", color="tab:blue")
        ax_bucket.axvline(
            inner.max_distance * factor,
            color="red",
            ls="--",
            lw=1,
            label=f"max_distance={inner.max_distance}" + (f" \u00d7{factor:g}" if factor != 1 else ""),
        )
        ax_bucket.set(
            title=f"bucket of each distance ({inner.num_buckets} buckets)",
            xlabel="distance i - j (tokens)",
            ylabel="bucket",
        )
        ax_bucket.legend(loc="lower right", fontsize=9)
        ax_bucket.grid(alpha=0.3)
    reads_q = "shaw: q\u00b7a\u1d37 of a query of ones (the bias depends on each query)" if inner.kind == "shaw" else ""
    _title(fig, scheme, position, source, "; ".join(p for p in (_scaled_note(scheme), reads_q) if p))
    return fig


def _text_figure(scheme, position, source):
    """Schemes with nothing to draw (none): say why, beside the causal mask that orders tokens."""
    Figure = require_matplotlib()
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_text, ax_mask = fig.subplots(1, 2, width_ratios=[2.6, 1])
    ax_text.axis("off")
    inner, _ = scheme.unwrap()
    text = (
        f"{inner.kind}: {scheme_class(inner.kind).description}\n\n"
        "No positional signal: embed, rotate and bias leave tokens\n"
        "and attention untouched, so there is nothing to plot.\n"
        "Order comes from the causal mask only: token t sees tokens\n"
        "0..t, and the model can still infer where it is\n"
        '(Kazemnejad et al. 2023, "The Impact of Positional\n'
        'Encoding on Length Generalization in Transformers").'
    )
    ax_text.text(0.0, 0.5, text, va="center", ha="left", fontsize=11)
    n = 8
    ax_mask.imshow(torch.ones(n, n).tril().numpy(), cmap="Greys", vmin=0, vmax=1.4)
    ax_mask.set(title="causal mask (1 = may attend)", xlabel="key position", ylabel="query position")
    ax_mask.set_xticks(range(n))
    ax_mask.set_yticks(range(n))
    _title(fig, scheme, position, source)
    return fig
