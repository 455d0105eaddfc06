"""The ablation experiment (``python -m minilm experiment ablation``): variants of the study's
models, each trained from scratch with the study's recipe and seeds and read against a
reference trained beside it (same seed, same batches: paired).

A variant is one scheme under one condition (``variants``). The references are the schemes as
the study trains them ("as in the study"). The groups:

* **base**: sinusoidal positions with base 1,000 and 100,000 beside Vaswani et al.'s 10,000 (does
  a longer wavelength range extrapolate better?).
* **dim-dropout**: dimension-specific dropout on the sinusoidal table (``positions.sinusoidal``,
  ``dim_dropout``), the linear ramp of the teaching notes (0.2 on the fastest pair to 0.1 on the
  slowest) and a flat rate with the same mean (0.15), which tells the ramp from dropout as such.
* **concat**: the position encoding concatenated to the token embedding instead of added
  (``model.concat_position_dims``: half the width each), for sinusoidal and learned positions.
  The width, and so every transformer weight, is the same; the token embedding (and learned's
  table) is half as wide, so the concatenated model has fewer parameters, not more: the
  comparison the teaching notes' argument for addition calls for.
* **gap**: what closes the gap at L between the schemes (issue #27): the same schemes without
  the retrieval task (the text-only rows the study's perplexity ratios are held to), and, where
  the mixture's task rows carry no text loss, also with the mixture's text tokens (fewer
  steps), which separates the task's effect from the tokens'; with
  twice the tokens (twice the steps, same schedule shape: is it undertraining?); and learned
  positions with a ten times larger learning rate on the table (is the table too slow to move?).
* **dtype**: the study's schemes trained in float32 beside the study's bf16 autocast (where the
  CPU has native bf16, ``train.dtype: auto`` takes it): the paired check that the precision does
  not move the conclusions (on a host without native bf16 both sides are float32).
"""

from __future__ import annotations

from typing import Sequence

from minilm.common import markdown_table
from minilm.study.claims import paired_ratio, per_seed
from minilm.study.stats import interval

REFERENCE = "as in the study"
GROUPS = {
    "base": "Sinusoidal base frequency",
    "dim-dropout": "Dimension-specific dropout on sinusoidal positions",
    "concat": "Concatenated instead of added, at equal width",
    "gap": "What closes the gap at L",
    "dtype": "float32 against the study's dtype",
}


def variants(plan: dict) -> dict:
    """{name: {scheme, condition, group, position, model, train}} of the ablation, sized for the
    plan (concatenation takes half of its d_model; twice the tokens doubles its steps). The
    references have group None."""
    half, t = plan["model"]["d_model"] // 2, plan["train"]
    double = {"max_steps": 2 * t["max_steps"], "warmup_steps": 2 * t["warmup_steps"]}
    share = 0.0 if t.get("retrieval_weight") else t.get("retrieval_share", 0.0)  # rows without text loss
    same_text = {
        "retrieval_share": 0.0,
        "retrieval_weight": 0.0,
        "max_steps": max(1, round((1 - share) * t["max_steps"])),
        "warmup_steps": max(1, round((1 - share) * t["warmup_steps"])),
    }

    def variant(scheme, condition=REFERENCE, group=None, position=None, model=None, train=None):
        return {
            "scheme": scheme,
            "condition": condition,
            "group": group,
            "position": {"kind": scheme, **(position or {})},
            "model": model or {},
            "train": train or {},
        }

    return {
        "sinusoidal": variant("sinusoidal"),
        "learned": variant("learned"),
        "rope": variant("rope"),
        "alibi": variant("alibi"),
        "sinusoidal-base1000": variant("sinusoidal", "base 1,000", "base", {"base": 1000.0}),
        "sinusoidal-base100000": variant("sinusoidal", "base 100,000", "base", {"base": 100000.0}),
        "sinusoidal-dimdrop-ramp": variant(
            "sinusoidal", "dim dropout ramp 0.2 -> 0.1", "dim-dropout", {"dim_dropout": [0.2, 0.1]}
        ),
        "sinusoidal-dimdrop-flat": variant(
            "sinusoidal", "dim dropout flat 0.15", "dim-dropout", {"dim_dropout": [0.15, 0.15]}
        ),
        "sinusoidal-concat": variant(
            "sinusoidal", f"concatenated ({half} + {half} dims)", "concat", model={"concat_position_dims": half}
        ),
        "learned-concat": variant(
            "learned", f"concatenated ({half} + {half} dims)", "concat", model={"concat_position_dims": half}
        ),
        **{
            f"{scheme}-no-task": variant(
                scheme, "no retrieval task", "gap", train={"retrieval_share": 0.0, "retrieval_weight": 0.0}
            )
            for scheme in ("sinusoidal", "rope", "learned")
        },
        **{
            f"{scheme}-no-task-same-text": variant(
                scheme, "no retrieval task, the mixture's text tokens", "gap", train=same_text
            )
            for scheme in (("sinusoidal", "rope", "learned") if share else ())
        },  # with text in every row: no-task
        **{
            f"{scheme}-2x-tokens": variant(scheme, "2x tokens", "gap", train=double)
            for scheme in ("sinusoidal", "learned")
        },
        "learned-table-lr10": variant("learned", "table lr x10", "gap", train={"position_lr_scale": 10.0}),
        **{
            f"{scheme}-float32": variant(scheme, "float32", "dtype", train={"dtype": "float32"})
            for scheme in ("sinusoidal", "rope", "alibi")
        },
    }


def reference_of(table: dict, name: str) -> str:
    """The reference a variant is read against: its scheme as in the study."""
    scheme = table[name]["scheme"]
    return next(n for n, v in table.items() if v["scheme"] == scheme and v["group"] is None)


def ratio_text(cells: Sequence[dict], a: str, b: str, length: int, mode: str) -> str:
    """ppl(a) / ppl(b) per seed (paired), mean ± the 95% t half-width over seeds."""
    ratios = paired_ratio(cells, ("ablation", a, length, None), ("ablation", b, length, None), mode)
    return interval(ratios).format(3) if ratios else ""


def group_rows(plan: dict, cells: Sequence[dict], group: str, mode: str) -> list:
    """Rows of one group's table: each variant after its reference, perplexity at every length
    (mean ± 95% interval) and its paired ratio to the reference at every length."""
    table, L = plan["ablation"]["variants"], plan["model"]["block_size"]
    lengths = [int(m * L) for m in plan["ablation"]["multiples"]]
    names = [n for n, v in table.items() if v["group"] == group]
    order = []
    for name in names:
        for n in (reference_of(table, name), name):
            if n not in order:
                order.append(n)
    rows = []
    for name in order:
        v, ref = table[name], reference_of(table, name)
        ppl = [list(per_seed(cells, "ablation", name, t, mode).values()) for t in lengths]
        rows.append(
            [
                v["scheme"],
                v["condition"],
                *[interval(p).format() if p else "n/a" for p in ppl],
                *["-" if name == ref else ratio_text(cells, name, ref, t, mode) or "n/a" for t in lengths],
            ]
        )
    return rows


def gap_rows(plan: dict, cells: Sequence[dict], mode: str) -> list:
    """Rows of the gap table: per condition (the reference and the gap group's), each scheme's
    perplexity at L as a paired ratio to sinusoidal's under the same condition, where run."""
    table, L = plan["ablation"]["variants"], plan["model"]["block_size"]
    conditions = [REFERENCE] + [v["condition"] for v in table.values() if v["group"] == "gap"]
    reference = {v["scheme"]: n for n, v in table.items() if v["group"] is None}
    rows = []
    for condition in dict.fromkeys(conditions):
        named = {
            v["scheme"]: n for n, v in table.items() if v["condition"] == condition and v["group"] in (None, "gap")
        }
        against = named.get("sinusoidal", reference.get("sinusoidal"))
        versus = "sinusoidal" if "sinusoidal" in named else f"sinusoidal ({REFERENCE})"
        for scheme, name in named.items():
            if scheme != "sinusoidal" and against:
                rows.append([condition, f"{scheme} / {versus}", ratio_text(cells, name, against, L, mode)])
    return rows


def select(plan: dict, groups: Sequence[str]) -> dict:
    """The variants of ``groups``, with the references they are read against."""
    table = variants(plan)
    chosen = {n for n, v in table.items() if v["group"] in groups}
    schemes = {table[n]["scheme"] for n in chosen} | ({"sinusoidal"} if "gap" in groups else set())
    return {n: v for n, v in table.items() if n in chosen or (v["group"] is None and v["scheme"] in schemes)}


def report_lines(plan: dict, cells: Sequence[dict], figures: dict) -> list:
    """Section 1 of the ablation's report: the variants' settings, one table per group, the gap table."""
    L, mode = plan["model"]["block_size"], plan["eval"]["modes"][0]
    lengths = [int(m * L) for m in plan["ablation"]["multiples"]]
    header = (
        ["scheme", "condition"]
        + [f"ppl {t} ({t // L}L)" for t in lengths]
        + [f"/ reference at {t // L}L" for t in lengths]
    )
    settings = [
        f"`{name}`: {v['scheme']}, {v['condition']}: "
        + ", ".join(
            [f"position {v['position']}"]
            + [f"{section}.{k}={x}" for section in ("model", "train") for k, x in v[section].items()]
        )
        for name, v in plan["ablation"]["variants"].items()
    ]
    lines = [
        "## 1. Variants against references",
        "",
        "Each run is the recipe of the protocol with these settings "
        "(the scheme's own settings of the protocol apply to its variants too):",
        "",
        *[f"- {text}" for text in settings],
        "",
        f"Perplexity ({mode} protocol), mean ± 95% interval over seeds; each variant's paired ratio to its "
        f"reference (the same scheme {REFERENCE}, same seeds and batches), mean ± 95% interval.",
        "",
    ]
    for number, group in enumerate(plan["ablation"]["groups"], 1):
        lines += [
            f"## 1.{number} {GROUPS[group]}",
            "",
            markdown_table(header, group_rows(plan, cells, group, mode), "ll" + "r" * 2 * len(lengths)),
            "",
        ]
        if group == "gap":
            lines += [
                "Each scheme at L against sinusoidal under the same condition (paired ratio):",
                "",
                markdown_table(["condition", "ratio", f"at L = {L}"], gap_rows(plan, cells, mode), "llr"),
                "",
            ]
    if "ablation" in figures:
        lines += [f"![the ablation's perplexity against length]({figures['ablation']})", ""]
    return lines
