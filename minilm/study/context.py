"""What the study reads about context use (issue #58, "retrieval that needs position"): retrieval by
the distance to the needle, multi-key probes, and a truncated-context control of the loss by position.

* **Multi-key probes** (``minilm.data.retrieval.multikey_probe``): ``retrieval.keys`` pairs with
  distinct keys and independent values in every prompt, the one at the probe's depth asked. A
  single needle has the only marker of its prompt, which a model finds by content alone (NoPE, T5,
  FIRE and Shaw all retrieved it at 100%); with several, the model must bind the asked key to its
  value. The retrieval job writes them beside the single-needle probes (rows with ``keys`` > 1).
* **Retrieval by distance**: every probe row records how far back its answer lies (``distance``,
  ``minilm.data.retrieval.distance``); ``distance_accuracies`` pools, per seed, the rows whose
  distance falls in [a L, b L) (every length and depth), and the tables give the mean over seeds
  ± the t-interval's half-width (the seed is the unit, as every retrieval table of the study:
  ``minilm.study.claims``). Pooled over depths, accuracy at 4L mixes needles within L of the query
  with needles 4L back (rope: 100% at depth 1, 0-3% at depth 0); by distance they are apart.
* **The truncated-context control** (``minilm.evaluation.lengths.truncated_curve``): the loss by
  position of the longest segments again with the context cut to L (every position p >= L sees at
  most L tokens: sliding windows of L advancing by ``eval.truncated_stride``, default L / 2, the
  sliding protocol's, whose runs it shares). A fall of the loss past L that is only the text (every
  flat scheme, NoPE included, fell 0.06-0.09 nats past 4L) falls in both; what the context past L
  buys is the loss cut to L minus the loss with the whole segment, per seed (paired).
"""

from __future__ import annotations

from typing import Optional, Sequence

from minilm.common import markdown_table as table
from minilm.data.retrieval import SIZE, SLOT
from minilm.study.claims import accuracy_text, seed_accuracies
from minilm.study.stats import interval

KEYS = "keys"  # the plan's retrieval setting: pairs in each multi-key probe (1: the single needle only)


def check(plan: dict) -> Optional[str]:
    """A one-line problem with the plan's ``retrieval.keys``, ``eval.truncated_stride`` or ``eval.position_bin``
    (its bins must tile L: the tables' spans are whole bins), or None."""
    L = plan["model"]["block_size"]
    keys, fits = plan.get("retrieval", {}).get(KEYS, 1), min(SIZE, max(1, L // SLOT // 4))
    if not isinstance(keys, int) or isinstance(keys, bool) or not 1 <= keys <= fits:
        return f"retrieval.keys={keys!r} is invalid: expected an integer from 1 (single needle only) to {fits} at L={L}"
    stride = plan.get("eval", {}).get("truncated_stride")
    if stride is not None and (not isinstance(stride, int) or isinstance(stride, bool) or not 1 <= stride <= L):
        return f"eval.truncated_stride={stride!r} is invalid: expected an integer from 1 to {L} (None: L / 2)"
    width = plan.get("eval", {}).get("position_bin")
    if width is not None and (not isinstance(width, int) or isinstance(width, bool) or width < 1 or L % width):
        return f"eval.position_bin={width!r} is invalid: expected an integer >= 1 that divides L={L}"
    return None


def multikey(plan: dict) -> int:
    """The pairs of the plan's multi-key probes, or 0 when it has none (``retrieval.keys`` 1 or unset)."""
    keys = plan.get("retrieval", {}).get(KEYS, 1)
    return keys if keys > 1 else 0


def _multiple(m: float) -> str:
    return "0" if m == 0 else "L" if m == 1 else f"{m:g}L"


def distance_bins(plan: dict) -> list:
    """The distance bins [a, b) in tokens: [0, L), then between consecutive ``retrieval.multiples`` of L
    ([L, 2L), [2L, 4L), [4L, 8L) for 1, 2, 4, 8), each with its name in units of L."""
    L, multiples = plan["model"]["block_size"], sorted(plan["retrieval"]["multiples"])
    edges = [0.0] + [float(m) for m in multiples if m > 0]
    return [(int(a * L), int(b * L), f"[{_multiple(a)}, {_multiple(b)})") for a, b in zip(edges, edges[1:])]


def _in_bin(rows: Sequence[dict], section: str, label: str, low: int, high: int, keys: int, when=None) -> list:
    return [
        r
        for r in rows
        if r["section"] == section
        and r["label"] == label
        and r.get(KEYS, 1) == keys
        and (when is None or r.get("when") == when)
        and r.get("distance") is not None
        and low <= r["distance"] < high
    ]


def distance_accuracies(
    rows: Sequence[dict], section: str, label: str, low: int, high: int, keys: int = 1, when=None
) -> Optional[dict]:
    """{seed: accuracy} over the probe rows of (``section``, ``label``, ``when``) with ``keys`` pairs whose
    answer lies ``low`` <= distance < ``high`` tokens back, every length and depth of the bin counted
    together per seed (correct / trials); a row not run (past a bounded scheme's table) is left out. None
    where no row of the bin was run."""
    by_seed: dict = {}
    for r in _in_bin(rows, section, label, low, high, keys, when):
        if r.get("correct") is not None:
            done = by_seed.setdefault(r["seed"], [0, 0])
            done[0] += r["correct"]
            done[1] += r["trials"]
    return {seed: hits / trials for seed, (hits, trials) in sorted(by_seed.items())} or None


def _distance_cell(rows, section, label, low, high, keys, when) -> str:
    rates = distance_accuracies(rows, section, label, low, high, keys, when)
    if rates is not None:
        return accuracy_text(rates)
    return "n/a (bounded)" if _in_bin(rows, section, label, low, high, keys, when) else ""


def distance_table(rows: Sequence[dict], specs: Sequence[tuple], bins: Sequence[tuple], keys: int = 1) -> str:
    """Accuracy by distance: one line per spec (row name, section, label, when), one column per bin of
    ``distance_bins``; mean over seeds ± the t-interval's half-width in points (per seed)."""
    return table(
        ["model", *(name for *_, name in bins)],
        [
            [name] + [_distance_cell(rows, s, label, a, b, keys, when) for a, b, _ in bins]
            for name, s, label, when in specs
        ],
        "l" + "r" * len(bins),
    )


def _length_cell(rows, section, label, length, keys, when) -> str:
    rates = seed_accuracies(rows, section, label, length, when=when, keys=keys)
    if rates is not None:
        return accuracy_text(rates)
    ran = any((r["section"], r["label"], r["length"], r.get(KEYS, 1)) == (section, label, length, keys) for r in rows)
    return "n/a (bounded)" if ran else ""


def retrieval_lines(study, labels: Sequence[str]) -> list:
    """The report's tables of retrieval by distance (the single needle) and of the multi-key probes (by
    length with depths pooled, and by distance) for the rows trained from scratch, ``labels``."""
    plan, rows, L = study.plan, study.retrieval, study.L
    bins, keys = distance_bins(plan), multikey(plan)
    specs = [(label, "scratch", label, None) for label in labels]
    lines = [
        f"By distance: the probes whose answer lies [a, b) tokens back from the query (in units of L = {L}; every "
        "length and depth whose needle falls there, counted together per seed), mean over seeds ± the 95% "
        "t-interval's half-width in points (per seed). Pooled over depths, a length mixes needles near the query "
        "with needles far from it; here they are apart:",
        "",
        distance_table(rows, specs, bins),
        "",
    ]
    if not keys:
        return lines
    lengths = [int(m * L) for m in plan["retrieval"]["multiples"]]
    body = [[label] + [_length_cell(rows, "scratch", label, t, keys, None) for t in lengths] for label in labels]
    return lines + [
        f"Multi-key probes: {keys} pairs `MARK k v` with distinct keys and independent values in every prompt, the "
        "one at the probe's depth asked (`minilm.data.retrieval.multikey_probe`; the same lengths, depths and "
        "number of probes). A single needle is the only marker of its prompt and can be found by content alone; "
        "here the model must bind the asked key to its value. Chance is still 1/32. Depths pooled:",
        "",
        table(["model"] + [f"{t} ({t // L}L)" for t in lengths], body, "l" + "r" * len(lengths)),
        "",
        "Multi-key probes by distance to the asked needle:",
        "",
        distance_table(rows, specs, bins, keys),
        "",
    ]


def extension_retrieval_lines(study, specs: Sequence[tuple]) -> list:
    """Retrieval by distance before and after extension; ``specs``: (row name, section, label, when)."""
    plan, rows = study.plan, study.retrieval
    bins, keys = distance_bins(plan), multikey(plan)
    lines = [
        "Retrieval by distance to the needle, before and after fine-tuning (the single needle; mean over seeds "
        "± the 95% t-interval's half-width in points, per seed):",
        "",
        distance_table(rows, specs, bins),
        "",
    ]
    if keys:
        lines += [
            f"The same, multi-key probes ({keys} pairs, one asked):",
            "",
            distance_table(rows, specs, bins, keys),
            "",
        ]
    return lines


def protocol_lines(plan: dict) -> list:
    """The protocol's bullets for the truncated-context control and for retrieval by distance and multi-key."""
    L, keys = plan["model"]["block_size"], multikey(plan)
    stride = plan["eval"].get("truncated_stride") or L // 2
    return [
        f"- **Loss by position with the context cut to L** (the control): the same positions of the same segments, "
        f"each position p >= L scored with at most L = {L} tokens visible (sliding windows of {L} tokens advancing "
        f"by {stride}: between {L - stride} and {L - 1} tokens before it; `eval.truncated_stride`); positions below "
        f"L see the same context in both. A fall of the loss past L that is the text, not context use, shows in both.",
        "- **Retrieval by distance**: each probe's answer lies d tokens back from the query's last token "
        "(`minilm.data.retrieval.distance`: from 2 at depth 1 to T - 3 at depth 0); the tables pool, per seed, "
        "every length and depth whose d falls in [0, L), [L, 2L), [2L, 4L), ...; the seed stays the unit."
        + (
            f" **Multi-key probes** (`retrieval.keys` = {keys}): the same lengths, depths and number of probes with "
            f"{keys} pairs of distinct keys and independent values in every prompt, the one at the depth asked: the "
            "model must bind the asked key to its value, not find the only marker."
            if keys
            else ""
        ),
    ]


def span_values(cell: dict, key: str, low: int, high: int, width: int) -> Optional[float]:
    """The mean of a cell's binned curve ``key`` over positions [low, high) (bins of ``width``), or None."""
    curve = cell.get(key)
    if not curve:
        return None
    part = curve[low // width : high // width]
    return sum(part) / len(part) if part else None


def control_lines(study, specs: Sequence[tuple], longest: int, edges: Sequence[int]) -> list:
    """The truncated-context control beside the loss-by-position table: for each spec (row name,
    section, label, step) and each span [a, b) of ``edges`` past L, the mean loss with the context cut
    to L and the paired difference cut - whole segment (nats; mean over seeds ± 95% interval)."""
    width, L = study.plan["eval"]["position_bin"], study.L
    spans = [(a, b) for a, b in zip(edges, edges[1:]) if a >= L]
    stride = study.plan["eval"].get("truncated_stride") or L // 2

    def cells(section, label, step):
        return [
            c
            for c in study.cells
            if (c["section"], c["label"], c.get("step"), c["length"], c["mode"])
            == (section, label, step, longest, "nonoverlapping")
            and c.get("truncated_by_position")
        ]

    def text(values):
        values = [v for v in values if v is not None]
        return interval(values).format(3) if values else ""

    rows = []
    for name, section, label, step in specs:
        these = cells(section, label, step)
        bounded = not these and any(
            (c["section"], c["label"], c["length"], c["status"]) == (section, label, longest, "bounded")
            for c in study.cells
        )
        if bounded:  # past a bounded scheme's table: nothing was scored
            rows.append([name] + ["n/a (bounded)"] * 2 * len(spans))
            continue
        row = [name]
        for a, b in spans:
            cut = [span_values(c, "truncated_by_position", a, b, width) for c in these]
            full = [span_values(c, "by_position", a, b, width) for c in these]
            row += [text(cut), text([x - y for x, y in zip(cut, full) if x is not None and y is not None])]
        rows.append(row)
    header = ["model"] + [f"{h} {a}-{b - 1}" for a, b in spans for h in ("cut to L,", "cut - whole,")]
    return [
        f"The control: the same positions scored with the context cut to L = {L} (every position p >= L sees at "
        f"most {L} tokens: sliding windows of {L} advancing by {stride}, so between {L - stride} and {L - 1} "
        f"tokens before it; positions below L are the same in both), and the paired difference per seed, cut "
        f"to L minus the whole segment: what the context past L buys. A fall of the loss past L that is only the "
        f"text falls in both and leaves the difference flat; positions below L are left out (equal in both):",
        "",
        table(header, rows, "l" + "r" * (len(header) - 1)),
        "",
    ]
