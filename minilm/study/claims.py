"""Reading the study's cells, and the claims written down before the run, with their verdicts.

The unit of replication is the trained model, i.e. the seed. Perplexity claims compare two
cells through their ratio, per seed (paired; t-interval over seeds, ``minilm.study.stats.verdict``).
Retrieval claims read each seed's accuracy (its probes, and depths unless the claim names one,
counted together: ``seed_accuracies``) and take the t-interval over seeds of that accuracy or of
the per-seed difference between two cells (paired: every model of a seed sees the same
probes). Probes of one model are not independent draws of the scheme's ability (seeds of one
scheme differed by 8 to 22 of 32 needles), so they are never pooled across seeds into one
binomial sample: that would give the 32 probes of each of 3 seeds the weight of 96 models.
*yes* when the interval is wholly on the expected side, *no* when wholly on the other,
*unresolved* otherwise.

Retrieval past L is read only when the gate holds: the best scheme reaches ``GATE`` accuracy
at L with depths pooled (a task no model learned measures nothing); otherwise every retrieval
claim past L is "not read".
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from minilm.study.extension import METHOD_NAMES
from minilm.study.stats import Interval, interval, verdict

GATE = 0.90
# a cell's ``when`` (retrieval) or step (perplexity) that reads what fine-tuning changed, per seed: accuracy
# after - before, or perplexity after / before (after - before in log perplexity)
CHANGE = "change"

# --------------------------------------------------------------------------- reading the cells


def per_seed(cells: Sequence[dict], section: str, label: str, length: int, mode: str, step=None) -> dict:
    """{seed: perplexity} of one cell of the study (no entry where it was not run); ``step`` ``CHANGE``:
    {seed: ppl(after) / ppl(before)} (``perplexity_changes``)."""
    if step == CHANGE:
        return perplexity_changes(cells, section, label, length, mode)
    return {
        c["seed"]: c["ppl"]
        for c in cells
        if c["section"] == section
        and c["label"] == label
        and c["length"] == length
        and c["mode"] == mode
        and c.get("step") == step
        and c["ppl"] is not None
    }


def perplexity_changes(cells: Sequence[dict], section: str, label: str, length: int, mode: str) -> dict:
    """{seed: ppl(after) / ppl(before)} of an extension row at ``length``: what its fine-tuning changed, per
    seed (paired: one model before and after); before is step 0 (the method applied zero-shot), after the
    row's last step. Empty where the row has no step 0 or no later step."""
    steps = sorted(
        c["step"]
        for c in cells
        if (c["section"], c["label"], c["length"], c["mode"]) == (section, label, length, mode)
        and c.get("step") is not None
    )
    if not steps or steps[0] != 0 or steps[-1] == 0:
        return {}
    before, after = (per_seed(cells, section, label, length, mode, step=s) for s in (0, steps[-1]))
    return {s: after[s] / before[s] for s in sorted(after) if s in before and before[s] > 0}


def cell_step(cell: dict):
    """The step a perplexity claim's cell reads: ``CHANGE`` for ``when: change``, else its ``step``."""
    return CHANGE if cell.get("when") == CHANGE else cell.get("step")


def mean_log_perplexity(cells: Sequence[dict], section: str, label: str, length: int, mode: str) -> Optional[float]:
    """The mean over seeds of a cell's log perplexity, what a choice of rate on held-out text
    minimises (``sweep``, ``tuning``); None where nothing was run or any seed's is not finite
    (a run that diverged is out)."""
    values = list(per_seed(cells, section, label, length, mode).values())
    if not values or not all(0 < p < math.inf for p in values):
        return None
    return sum(math.log(p) for p in values) / len(values)


def position_curves(
    cells: Sequence[dict], section: str, label: str, length: int, step=None, key: str = "by_position"
) -> list:
    """The per-seed loss-by-position curves (binned) of one run's nonoverlapping cell at ``length``;
    ``key`` "truncated_by_position": the same positions with the context cut to L (the control)."""
    return [
        c[key]
        for c in cells
        if c["section"] == section
        and c["label"] == label
        and c["length"] == length
        and c["mode"] == "nonoverlapping"
        and c.get("step") == step
        and c.get(key)
    ]


def cell_interval(cells, *where, **kw) -> Optional[Interval]:
    values = per_seed(cells, *where, **kw)
    return interval(list(values.values())) if values else None


def cell_text(cells, *where, **kw) -> str:
    ci = cell_interval(cells, *where, **kw)
    if ci is not None:
        return ci.format()
    bounded = any(
        c["status"] == "bounded"
        for c in cells
        if c["section"] == where[0] and c["label"] == where[1] and c["length"] == where[2] and c["mode"] == where[3]
    )
    return "n/a (bounded)" if bounded else ""


def paired_ratio(cells, numerator: tuple, denominator: tuple, mode: str) -> list:
    """Per seed, ppl(numerator) / ppl(denominator); each is (section, label, length, step)."""
    a = per_seed(cells, *numerator[:3], mode, step=numerator[3])
    b = per_seed(cells, *denominator[:3], mode, step=denominator[3])
    return [a[s] / b[s] for s in sorted(a) if s in b]


# --------------------------------------------------------------------------- expectations


def expectations(plan: dict) -> list:
    """(claim, source, numerator, denominator, expect, threshold): the claim holds when
    ppl(numerator) / ppl(denominator) ``expect`` threshold, judged per seed (paired)."""
    L = plan["model"]["block_size"]
    if plan["experiment"] == "ablation":  # its claims are all in its registered file
        return []
    ext = plan["extension"]
    f = int(ext["factor"])
    S = lambda label, m: ("scratch", label, int(m * L), None)  # noqa: E731
    E = lambda label, step, m=f: ("extension", label, int(m * L), step)  # noqa: E731
    out = [
        (
            "sinusoidal at L within 15% of learned at L",
            "at L the schemes are close: ALiBi paper sinusoidal 20.05, rotary 20.07",
            S("sinusoidal", 1),
            S("learned", 1),
            "<",
            1.15,
        ),
        (
            f"alibi at {f}L within 10% of its L perplexity",
            "ALiBi paper: 19.73 at L, 18.41 at 4.9L",
            S("alibi", f),
            S("alibi", 1),
            "<",
            1.10,
        ),
        (
            f"sinusoidal at {f}L at least 2x its L perplexity",
            "ALiBi paper: 20.05 at L, 132.41 at 4.9L",
            S("sinusoidal", f),
            S("sinusoidal", 1),
            ">",
            2.0,
        ),
        (
            f"plain rope at {f}L worse than at L",
            "ALiBi paper: 20.07 at L, 31.58 at 4.9L; PI paper: >1000 at 2x",
            S("rope", f),
            S("rope", 1),
            ">",
            1.0,
        ),
        (f"at {f}L, alibi beats rope", "ALiBi paper: 18.41 vs 31.58 at 4.9L", S("alibi", f), S("rope", f), "<", 1.0),
        (
            f"at {f}L, rope beats sinusoidal",
            "ALiBi paper: 31.58 vs 132.41 at 4.9L",
            S("rope", f),
            S("sinusoidal", f),
            "<",
            1.0,
        ),
        (
            f"t5 at {f}L within 10% of its L perplexity",
            "ALiBi paper: T5 bias 19.65 at L, 20.41 at 4.9L",
            S("t5", f),
            S("t5", 1),
            "<",
            1.10,
        ),
        (
            f"kerple at {f}L within 10% of its L perplexity",
            "KERPLE paper (Chi et al. 2022): flat like ALiBi",
            S("kerple", f),
            S("kerple", 1),
            "<",
            1.10,
        ),
        (
            f"fire at {f}L within 10% of its L perplexity",
            "FIRE paper (Li et al. 2023): generalizes in length",
            S("fire", f),
            S("fire", 1),
            "<",
            1.10,
        ),
        (
            f"at {f}L, xpos beats rope",
            "xPos paper (Sun et al. 2022): extrapolates better than rotary",
            S("xpos", f),
            S("rope", f),
            "<",
            1.0,
        ),
        (
            f"at {f}L, randomized rope beats rope",
            "Ruoss et al. 2023: randomized positions generalize",
            S("randomized", f),
            S("rope", f),
            "<",
            1.0,
        ),
    ]
    last, methods = ext["curve_steps"][-1], [m for m in ext["methods"] if m != "none"]
    for method in methods:
        out.append(
            (
                f"{METHOD_NAMES[method]} after {last} steps: ppl at {f}L below the source's at L",
                "PI paper: 7.20 at 2k before, 6.95 at 8k after",
                E(method, last),
                S("rope", 1),
                "<",
                1.0,
            )
        )
        if plan.get("controls", {}).get("keep_training"):  # the same comparison with the fine-tuning's tokens
            out.append(
                (
                    f"{METHOD_NAMES[method]} after {last} steps: ppl at {f}L below training kept at L's at L",
                    "PI paper: 7.20 at 2k before, 6.95 at 8k after; here against the same tokens trained at L",
                    E(method, last),
                    E("keep", last, 1),
                    "<",
                    1.0,
                )
            )
    for step in [s for s in ext["curve_steps"] if 0 < s <= 50] if "none" in ext["methods"] else []:
        for method in methods:
            out.append(
                (
                    f"after {step} steps, {METHOD_NAMES[method]} beats no scaling at {f}L",
                    "PI and YaRN papers: scaled methods adapt in fewer steps",
                    E(method, step),
                    E("none", step),
                    "<",
                    1.0,
                )
            )
    if "yarn" in methods and "linear" in methods:
        for step in [s for s in ext["curve_steps"] if 0 < s <= 50]:
            out.append(
                (
                    f"after {step} steps, YaRN beats PI at {f}L",
                    "YaRN paper: fewer steps than PI",
                    E("yarn", step),
                    E("linear", step),
                    "<",
                    1.0,
                )
            )
    return out


def verdicts(cells, plan: dict) -> list:
    """Rows of the comparison table: claim, paired ratio per evaluation mode with its interval, verdicts."""
    rows = []
    for claim, source, num, den, expect, threshold in expectations(plan):
        row = [claim, source]
        for mode in plan["eval"]["modes"]:
            ratios = paired_ratio(cells, num, den, mode)
            if not ratios:
                row += ["not run", "n/a"]
                continue
            row += [interval(ratios).format(3) + f" (n={len(ratios)})", verdict(ratios, expect, threshold)]
        rows.append(row[:2] + [f"{expect} {threshold:g}"] + row[2:])
    return rows


# --------------------------------------------------------------------------- retrieval


def _matching(
    rows: Sequence[dict], section: str, label: str, length: int, depth=None, when=None, keys: int = 1
) -> list:
    """The rows of one cell; ``keys``: the pairs in each probe (1, the single needle; rows written before
    multi-key probes existed are single-needle ones)."""
    return [
        r
        for r in rows
        if r["section"] == section
        and r["label"] == label
        and r["length"] == length
        and (depth is None or r["depth"] == depth)
        and (when is None or r.get("when") == when)
        and r.get("keys", 1) == keys
    ]


def seed_accuracies(
    rows, section: str, label: str, length: int, depth=None, when=None, metric: str = "accuracy", keys: int = 1
) -> Optional[dict]:
    """{seed: accuracy} of a cell, each seed's probes counted together (and its depths, when
    ``depth`` is None); None where nothing was run or the length is past a bounded scheme's table.
    ``metric="logprob"``: each seed's mean log-probability of the answers over the same probes.
    ``keys``: the single needle's probes (1) or the multi-key probes with that many pairs.
    ``when`` ``CHANGE``: {seed: after - before} (what fine-tuning changed, paired within the seed)."""
    if when == CHANGE:
        found = [seed_accuracies(rows, section, label, length, depth, w, metric, keys) for w in ("after", "before")]
        if any(f is None for f in found):
            return None
        return {s: found[0][s] - found[1][s] for s in found[0] if s in found[1]} or None
    these = _matching(rows, section, label, length, depth, when, keys)
    key = "correct" if metric == "accuracy" else "logprob"
    if not these or any(r.get(key) is None for r in these):
        return None
    by_seed: dict = {}
    for r in these:
        done = by_seed.setdefault(r["seed"], [0.0, 0])
        done[0] += r["correct"] if key == "correct" else r["logprob"] * r["trials"]
        done[1] += r["trials"]
    return {seed: total / trials for seed, (total, trials) in sorted(by_seed.items())}


def mean_accuracy(rows, *where, **kw) -> Optional[float]:
    """The mean over seeds of a cell's accuracy (None: not run, or bounded)."""
    rates = seed_accuracies(rows, *where, **kw)
    return None if rates is None else sum(rates.values()) / len(rates)


def paired_differences(a: dict, b: dict) -> list:
    """Per seed present in both, accuracy(a) - accuracy(b)."""
    return [a[s] - b[s] for s in sorted(a) if s in b]


def accuracy_text(rates: dict, confidence: float = 0.95) -> str:
    """'94% ± 4 (90/94/97)': the mean over seeds, the t-interval's half-width in points, per seed."""
    ci = interval(list(rates.values()), confidence)
    spread = "" if ci.half_width is None else f" ± {100 * ci.half_width:.0f}"
    return f"{100 * ci.mean:.0f}%{spread} (" + "/".join(f"{100 * v:.0f}" for v in rates.values()) + ")"


def gate(rows, plan: dict) -> tuple:
    """(the best scheme at L with depths pooled, its mean accuracy over seeds, whether it reaches GATE)."""
    L = plan["model"]["block_size"]
    labels = sorted({r["label"] for r in rows if r["section"] == "scratch"})
    scored = [(label, mean_accuracy(rows, "scratch", label, L)) for label in labels]
    scored = [(label, rate) for label, rate in scored if rate is not None]
    if not scored:
        return None, None, False
    label, best = max(scored, key=lambda item: item[1])
    return label, best, best >= GATE


def retrieval_claims(plan: dict) -> list:
    """(claim, source, a, b, expect, threshold): a and b are (section, label, multiple of L, depth or
    None for all depths, when); with b None the claim is "proportion(a) expect threshold", else
    "proportion(a) - proportion(b) expect threshold". Written down before the run."""
    f = int(plan["extension"]["factor"])
    depths = plan["retrieval"]["depths"]
    far = min(depths)
    S = lambda label, m, depth=None: ("scratch", label, m, depth, None)  # noqa: E731
    A = lambda method, m, when="after": ("extension", method, m, None, when)  # noqa: E731
    out = [
        (
            f"rope at {f}L, depths pooled: below 50%",
            "PI paper (Chen et al. 2023): without interpolation a rope "
            "model fails passkey retrieval past its training length",
            S("rope", f),
            None,
            "<",
            0.5,
        ),
        (
            f"alibi at {f}L, needle at depth {far:g} (about {f}L back): below 50%",
            "ALiBi's bias decays attention "
            "with distance: it keeps perplexity past L but cannot reach far context (effective window)",
            S("alibi", f, far),
            None,
            "<",
            0.5,
        ),
        (
            f"alibi at {f}L below alibi at L, depths pooled",
            "the same: flat perplexity, lost retrieval",
            S("alibi", f),
            S("alibi", 1),
            "<",
            0.0,
        ),
        (
            f"rope at {f}L below rope at L, depths pooled",
            "PI paper: rope fails past L",
            S("rope", f),
            S("rope", 1),
            "<",
            0.0,
        ),
    ]
    methods = [m for m in plan["extension"]["methods"] if m != "none"]
    if "none" in plan["extension"]["methods"]:
        out.append(
            (
                f"no scaling after fine-tuning at {f}L: below 50%",
                "PI paper: direct fine-tuning extends the effective window slowly (2048 -> 2560 after 10,000 steps)",
                A("none", f),
                None,
                "<",
                0.5,
            )
        )
    for method in methods:
        out.append(
            (
                f"{METHOD_NAMES[method]} after fine-tuning at {f}L: above 50%",
                "PI paper: passkey retrieval at the extended length after 1,000 steps; YaRN paper: the same for YaRN",
                A(method, f),
                None,
                ">",
                0.5,
            )
        )
        if "none" in plan["extension"]["methods"]:
            out.append(
                (
                    f"after fine-tuning at {f}L, {METHOD_NAMES[method]} above no scaling",
                    "PI and YaRN papers: the scaled methods extend retrieval, direct fine-tuning does not",
                    A(method, f),
                    A("none", f),
                    ">",
                    0.0,
                )
            )
        out.append(
            (
                f"{METHOD_NAMES[method]} at {f}L: after fine-tuning above before (zero-shot)",
                "PI paper: interpolation alone is not enough, fine-tuning restores the model",
                A(method, f),
                A(method, f, "before"),
                ">",
                0.0,
            )
        )
    return out


def retrieval_verdicts(rows, plan: dict) -> list:
    """Rows of the retrieval claims table: claim, source, threshold, statistic with its 95%
    t-interval over seeds (of the accuracy, or of the per-seed difference), verdict."""
    L = plan["model"]["block_size"]
    _, _, passed = gate(rows, plan)
    out = []
    for claim, source, a, b, expect, threshold in retrieval_claims(plan):
        found = [seed_accuracies(rows, *where[:2], int(where[2] * L), where[3], where[4]) for where in (a, b) if where]
        values = (
            None
            if any(r is None for r in found)
            else (list(found[0].values()) if b is None else paired_differences(*found))
        )
        if not values:
            statistic, result = "not run", "n/a"
        elif not passed:
            statistic, result = "not read", "not read (gate failed)"
        else:
            ci = interval(values)
            shown = "" if ci.half_width is None else f" [{100 * ci.low:+.0f}, {100 * ci.high:+.0f}]"
            statistic = (
                (f"{100 * ci.mean:.0f}%" if b is None else f"{100 * ci.mean:+.0f} points")
                + shown
                + f" (n={ci.n} seeds)"
            )
            result = verdict(values, expect, threshold)
        shown = f"{expect} {100 * threshold:g}%" if b is None else f"difference {expect} 0"
        out.append([claim, source, shown, statistic, result])
    return out
