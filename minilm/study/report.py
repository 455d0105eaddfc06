"""The report of the length-generalization study (``minilm.study.plan``): ``report.md`` with
every table as means and 95% intervals over seeds (``minilm.study.stats``), the figures with error
bands (``minilm.study.figures``), the published expectations with paired verdicts, the
protocol, the configs, the git commit, the machine and the wall time per phase; plus
``results.csv`` (one line per cell and seed), ``retrieval.csv`` (one per retrieval cell) and
``passkey.csv`` (one per passkey cell, ``minilm.study.papers``).

A hand-written ``discussion.md`` in the output directory (the explanation of what disagrees
with the literature, written after looking at the numbers) is included as the last section
when present, so ``--report-only`` keeps it; a new run over the directory moves an earlier
one aside (``discussion.1.md``)."""

from __future__ import annotations

import json
import math
import os
from typing import Optional

import yaml

from minilm.common import atomic_write, write_csv
from minilm.common import markdown_table as table
from minilm.data.retrieval import PAIRS
from minilm.figures.canvas import have_matplotlib
from minilm.model.gpt import GPT
from minilm.study import ablation, compare, context, papers, sweep, tuning
from minilm.study.claims import (
    GATE,
    accuracy_text,
    cell_text,
    gate,
    per_seed,
    position_curves,
    retrieval_verdicts,
    seed_accuracies,
    verdicts,
)
from minilm.study.designs import queries_for, scratch_labels
from minilm.study.extension import LABEL_NAMES, extension_labels, oracle_runs, oracle_steps
from minilm.study.figures import study_figures
from minilm.study.plan import DATA_SEED_OFFSET, ExperimentError, Study
from minilm.study.primary import (
    REPO,
    confirmatory_run,
    hypothesis,
    p_shown,
    path_for,
    recorded_test,
    registration,
    retrieval_test,
    tests_text,
)
from minilm.study.provenance import busy_seconds, host_line
from minilm.study.stats import interval
from minilm.training.mixture import weight_for_share

# --------------------------------------------------------------------------- writing


def write_report(
    study: Study, command: str, wall: float, started_at: str, loads: tuple, commit: str, host: Optional[str] = None
) -> str:
    """Write report.md, results.csv, retrieval.csv and the figures under the study's output directory;
    ``host`` is the machine the jobs ran on (None: this one, for a run that has just ended)."""
    host = host or host_line()
    atomic_write(
        os.path.join(study.out, "study.json"),
        json.dumps(
            {
                **study.state(),
                "run": {
                    "command": command,
                    "wall": wall,
                    "started_at": started_at,
                    "loads": list(loads),
                    "commit": commit,
                    "machine": host,
                },
            },
            indent=1,
        ),
    )
    write_csv(
        [{k: v for k, v in c.items() if k not in ("by_position", "truncated_by_position")} for c in study.cells],
        os.path.join(study.out, "results.csv"),
    )
    for rows, name in ((study.retrieval, "retrieval.csv"), (study.passkey, "passkey.csv")):
        path = os.path.join(study.out, name)
        if rows:
            write_csv(rows, path)
        elif os.path.exists(path):  # an earlier run's (--overwrite): this run's report has no such rows
            os.remove(path)
    figures = study_figures(study) if have_matplotlib() else {}
    lines = _header(study, command, wall, started_at, loads, commit, host) + _protocol(study)
    if study.plan["experiment"] == "ablation":
        lines += (
            ablation.report_lines(study.plan, study.cells, figures) + _primary(study, 2, commit) + _discussion(study, 3)
        )
    else:
        both = compare.side_by_side(study, 7, REPO)  # a replication: every claim's verdict at both lengths
        lines += (
            _scratch(study, figures)
            + _positions(study, figures)
            + _retrieval(study, figures)
            + _extension(study, figures)
            + _primary(study, 5, commit)
            + _comparison(study, 6)
            + both
            + _discussion(study, 8 if both else 7)
        )
    lines += _runs_and_configs(study)
    return str(atomic_write(os.path.join(study.out, "report.md"), "\n".join(lines)))


def rewrite_report(out: str) -> str:
    """Write report.md again from ``<out>/study.json`` with this code (and ``discussion.md``), naming the
    machine the jobs ran on, not the one that rewrites it (``recorded_host``)."""
    path = os.path.join(out, "study.json")
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except OSError as exc:
        raise ExperimentError(f"cannot read {path!r}: {exc.strerror or exc}; run the study first") from None
    except ValueError as exc:
        raise ExperimentError(f"{path!r} is not a study record: {exc}") from None
    try:
        run = state["run"]
        study, args = Study.from_state(state, out), (run["command"], run["wall"], run["started_at"], run["loads"])
    except (KeyError, TypeError, AttributeError):  # another program's JSON, or a damaged record
        raise ExperimentError(
            f"{path!r} is not a study record: it lacks what a study writes there (its plan, run and cells); "
            f"run the study again with --overwrite"
        ) from None
    return write_report(study, *args[:3], tuple(args[3]), run["commit"], recorded_host(run, out))


def recorded_host(run: dict, out: str) -> str:
    """The machine a study's jobs ran on: study.json's record, or (records of earlier versions) the
    Machine line of the report.md the run wrote; else this machine, said to be the rewriter's."""
    if run.get("machine"):
        return run["machine"]
    try:
        with open(os.path.join(out, "report.md"), encoding="utf-8") as f:
            for line in f:
                if line.startswith("Machine: "):
                    return line[len("Machine: ") :].rstrip()
    except OSError:
        pass
    return f"{host_line()} (not recorded by the run: the machine that rewrote this report)"


def _header(study: Study, command: str, wall: float, started_at: str, loads: tuple, commit: str, host: str) -> list:
    plan = study.plan
    return [
        (
            "# Length generalization: train short, test long, then extend"
            + (f" (the replication at L = {study.L})" if plan["experiment"] == "replication-512" else "")
        )
        if plan["experiment"] != "ablation"
        else "# Ablations: variants of the study's models against references",
        "",
        f"Command: `{command}`  ",
        f"Started: {started_at}; **wall time {wall / 60:.1f} min** with {study.workers} worker processes of one "
        f"torch thread each; load average at start / end: {loads[0]} / {loads[1]}  ",
        *(
            [
                f"Resumed (`--resume`): that was the last of {study.invocations} invocations at the same "
                f"commit; jobs ran "
                f"for **{busy_seconds(study.done) / 60:.1f} min** in all (the union of their running times)  "
            ]
            if study.invocations > 1
            else []
        ),
        f"Git commit at the start: `{commit}`  ",
        f"Machine: {host}  ",
        f"Seeds: {', '.join(map(str, plan['seeds']))} (seed s initialises every model of that seed; its "
        f"batches follow data seed {DATA_SEED_OFFSET} + s); dtype: {plan['train']['dtype']} (the runs trained in "
        f"{', '.join(sorted({s.get('dtype', '?') for s in study.summaries().values()})) or 'n/a'}; evaluation "
        f"in float32){_claim_seeds(study)}",
        "",
    ]


OPTIMIZER_NAMES = {"adamw": "AdamW", "muon": "Muon (blocks' matrices) with AdamW"}


def _protocol(study: Study) -> list:
    plan, L = study.plan, study.L
    first = next(r.config for r in study.runs.values() if r.section in ("scratch", "ablation"))
    t, n = plan["train"], len(plan["seeds"])
    pre_tokens = t["max_steps"] * t["batch_size"] * L
    cell = next((c for c in study.cells if c["section"] not in (sweep.SECTION, tuning.SECTION)), None)  # holdout
    scored = f"{cell['tokens']:,} tokens ({cell['chars']:,} characters)" if cell else "n/a"
    e = plan["eval"]
    stride = e["fixed_stride"] or L
    lines = [
        "## Protocol",
        "",
        f"- **Model**: {first.model.n_layer} layers, d_model {first.model.d_model}, {first.model.n_head} heads, "
        f"{first.model.vocab_size}-token vocabulary trained on `{plan['data']['corpus']}`, "
        f"~{GPT(first.model).num_params() / 1e6:.2f}M parameters; training length **L = {L}**.",
        f"- **From scratch**: {t['max_steps']} steps x {t['batch_size']} x {L} tokens ({pre_tokens / 1e6:.2f}M "
        f"tokens), {OPTIMIZER_NAMES[first.train.optimizer]} lr "
        f"{t['lr']:g}{' x its kind’s tuned scale' * bool(study.lr_scales)} "
        f"{_falling(first.train, t['min_lr'])} after {t['warmup_steps']} warmup steps. Every scheme of seed s "
        f"sees the same batches. "
        f"**{100 * t['retrieval_share']:g}% of the sequences** (the same rows for every scheme) are retrieval "
        f"sequences (`minilm.data.retrieval`): {_pairs_text()}, each asked {first.train.retrieval_queries} times by "
        f"a later query `MARK k v`, written over the text (a query may copy its answer from the one before"
        + (
            "; the first query's distance to the needle drawn uniformly over the row: `retrieval.spread`), "
            if first.train.retrieval_spread
            else "), "
        )
        + (
            f"the text's loss kept: every text token counts once and each answer {first.train.retrieval_weight:g} "
            f"times at L{_answer_share(plan)} "
            if first.train.retrieval_weight
            else "loss on the answers only, each sequence weighted alike "
        )
        + f"(`minilm.training.mixture`); input and output embeddings "
        f"{'tied' if first.model.tie_embeddings else 'untied'}.",
        f"- **Perplexity**: the first {scored} of the validation split at every length (the split, at most "
        f"{e['max_tokens'] or 'all'} tokens, rounded down to a multiple of the longest length, so every cell "
        f"scores the same tokens). *nonoverlapping*: consecutive segments of T tokens, every token scored, each "
        f"segment from position 0 (the ALiBi paper's protocol; the average token sees T/2 tokens of context). "
        f"*sliding*: segments advancing by T/2, only their last T/2 tokens scored. *fixed-stride*: segments "
        f"advancing by a fixed stride of {stride} tokens at every length, only their last {stride} scored (the PI "
        f"and YaRN papers' protocol, stride 256 there): every scored token sees at least T - {stride} tokens of "
        f"context. The first segment is scored in full. Perplexity = exp(mean nats per scored token). A bounded "
        f"scheme (learned) past its table is n/a.",
        f"- **Statistics**: a perplexity cell is the mean over {n} seed(s) ± the half-width of the 95% confidence "
        f"interval (Student t, n - 1 degrees of freedom; `minilm.study.stats`). A comparison is paired: the ratio "
        f"of two perplexities is computed per seed, and its interval decides the verdict: *yes* when the whole "
        f"interval is on the expected side of the threshold, *no* when it is wholly on the other side, "
        f"*unresolved* when it contains the threshold (or with one seed).",
    ]
    if plan.get("schemes"):
        lines.append(
            "- **Settings of single schemes** (what makes each baseline faithful to its paper; the measurements "
            'behind them: docs/design.md, "Measured choices"): '
            + "; ".join(
                f"{kind}: "
                + ", ".join(
                    f"{section}.{key}={value}" for section, values in tweaks.items() for key, value in values.items()
                )
                for kind, tweaks in plan["schemes"].items()
            )
            + "."
        )
    if plan["experiment"] != "ablation":
        lines += _retrieval_protocol(study)
    return lines + [""]


def _pairs_text() -> str:
    return "one needle pair `MARK k v` per sequence" if PAIRS == 1 else f"1 to {PAIRS} pairs `MARK k v` per sequence"


def _distractors_text() -> str:
    return (
        "no other pair (a single needle)" if PAIRS == 1 else f"{PAIRS - 1} distractor pairs with other keys elsewhere"
    )


def _retrieval_protocol(study: Study) -> list:
    plan, L = study.plan, study.L
    ft, ext, r = plan["finetune"], plan["extension"], plan["retrieval"]
    long, steps = int(ext["factor"] * L), ext["curve_steps"]
    pre_tokens = plan["train"]["max_steps"] * plan["train"]["batch_size"] * L
    ft_tokens = steps[-1] * ft["batch_size"] * long
    return [
        f"- **Loss by position**: the mean loss at each position of the nonoverlapping "
        f"{int(max(plan['eval']['multiples']) * L)}"
        f"-token segments, averaged over bins of {plan['eval']['position_bin']} positions, then over seeds. A scheme "
        f"that uses context keeps lowering its loss as the position grows; one that cannot use what lies past L "
        f"flattens (or rises) past L.",
        f"- **Retrieval**: at each length {', '.join(str(int(m * L)) for m in r['multiples'])} and needle depth "
        f"{', '.join(f'{d:g}' for d in r['depths'])}, {r['trials']} probes per seed: a validation stretch of exactly "
        f"T tokens with the needle pair at that depth (0: the start; 1: right before the query), "
        f"{_distractors_text()}, and the query `MARK k` as its last two tokens; right when the most likely next "
        f"token is the needle's value (exact match). Keys and values are 32 token ids the text never uses: chance is "
        f"1/32 = 3.1%. The unit is the seed (the trained model): intervals are t-intervals over the per-seed "
        f"accuracies, given beside them. **Gate, set before the run**: retrieval past L is read only if the best "
        f"scheme reaches {100 * GATE:.0f}% at L with depths pooled.",
        *context.protocol_lines(plan),
        f"- **Extension** of the rope model of each seed to {long} ({ext['factor']:g}x): {steps[-1]} steps x "
        f"{ft['batch_size']} x {long} tokens ({ft_tokens / 1e6:.3f}M tokens, **{100 * ft_tokens / pre_tokens:.1f}% "
        f"of pretraining**, the same share of retrieval sequences), {_finetune_rate(study)}; one "
        f"run per method and seed, with snapshots at steps {', '.join(map(str, steps[1:-1]))}; step 0 ('before') is "
        f"the source with the scaling applied zero-shot.",
        *papers.protocol_lines(plan),
    ]


def _length_table(cells, section, labels, lengths, mode, L, step=None, names=None) -> str:
    names = names or {}
    return table(
        ["model"] + [f"{t} ({t / L:g}L)" for t in lengths],
        [
            [names.get(label, label)] + [cell_text(cells, section, label, t, mode, step=step) for t in lengths]
            for label in labels
        ],
        "l" + "r" * len(lengths),
    )


def _claim_seeds(study: Study) -> str:
    """Which rows the plan's ``claim_seeds`` trained again (the rows the retrieval claims read)."""
    extra = study.extra_seeds
    rows = sorted({run.label for run in study.runs.values() if run.seed in extra})
    if not extra:
        return ""
    return (
        f"; seeds {', '.join(map(str, extra))} train only the rows the retrieval claims read ({', '.join(rows)}), "
        f"so their exact tests have {len(study.plan['seeds']) + len(extra)} seeds; every table's mean is over the "
        f"seeds a row has"
    )


def _answer_share(plan: dict) -> str:
    """How the answers keep their share of the loss at every length (``retrieval.answer_share``)."""
    share = plan.get("retrieval", {}).get("answer_share")
    if share is None:
        return ""
    long = int(plan["extension"]["factor"] * plan["model"]["block_size"])
    queries = queries_for(plan, long)
    return (
        f"; a row of {long} asks {queries} times, each answer {weight_for_share(share, long, queries):g} times: at "
        f"every length the answers are as dense (`retrieval.query_density`) and carry {100 * share:.1f}% of a row's "
        f"loss weight (`retrieval.answer_share`)"
    )


def _frozen_rates(study: Study) -> list:
    """Where the frozen rates came from (``minilm.study.rates``), and whether git shows them committed
    before this run."""
    r = study.rates
    if not r:
        return []
    when = {True: "committed before this run", False: "not committed before this run", None: "git cannot tell when"}
    commit = f" at {r['commit'][:7]}" if r.get("commit") else ""
    out = "; ".join(f"{x['kind']} x{x['scale']:g}: {x['why']}" for x in r.get("rejected", []))
    return [
        f"The rates were frozen by the tuning step in `{r['path']}`{commit} ({when[r.get('registered')]})."
        + (f" Scales out of the choice: {out}." if out else "")
        + (
            f" Below the task floor at every scale, so chosen by perplexity alone: {', '.join(r['task_failures'])}."
            if r.get("task_failures")
            else ""
        ),
        "",
    ]


def _scratch(study: Study, figures: dict) -> list:
    plan, cells, L = study.plan, study.cells, study.L
    lengths = [int(m * L) for m in plan["eval"]["multiples"]]
    lines = [
        f"## 1. Perplexity: every scheme trained at L = {L}, evaluated at {', '.join(map(str, lengths))} tokens",
        "",
        *tuning.report_lines(plan, cells, study.lr_scales, (study.rates or {}).get("grids", {}).get("scales")),
        *_frozen_rates(study),
    ]
    for mode in plan["eval"]["modes"]:
        lines += [
            f"Perplexity, {mode} protocol:",
            "",
            _length_table(cells, "scratch", scratch_labels(plan), lengths, mode, plan["model"]["block_size"]),
            "",
        ]
    if "lengths" in figures:
        lines += [f"![perplexity against length]({figures['lengths']})", ""]
    return lines


def _positions(study: Study, figures: dict) -> list:
    """Mean loss over position ranges [0, L), [L, 2L), ... of the longest nonoverlapping segments."""
    plan, cells, L = study.plan, study.cells, study.L
    longest, width = int(max(plan["eval"]["multiples"]) * L), plan["eval"]["position_bin"]
    edges = [0] + [int(m * L) for m in plan["eval"]["multiples"]]

    def spans(section, label, step=None):
        curves = position_curves(cells, section, label, longest, step)
        if not curves:
            bounded = any(
                c["status"] == "bounded"
                for c in cells
                if c["section"] == section and c["label"] == label and c["length"] == longest
            )
            return ["n/a (bounded)" if bounded else ""] * (len(edges) - 1)
        return [
            interval([sum(c[a // width : b // width]) / len(c[a // width : b // width]) for c in curves]).format(3)
            for a, b in zip(edges, edges[1:])
        ]

    header = ["model"] + [f"positions {a}-{b - 1}" for a, b in zip(edges, edges[1:])]
    last = plan["extension"]["curve_steps"][-1]
    specs = [(kind, "scratch", kind, None) for kind in scratch_labels(plan)]  # (row name, section, label, step)
    specs += [
        (f"{'rope + ' if m in plan['extension']['methods'] else ''}{LABEL_NAMES[m]}, fine-tuned", "extension", m, last)
        for m in extension_labels(plan)
    ]
    specs += [(name, "oracle", label, None) for label, name in _oracle_names(plan).items()]
    rows = [[name] + spans(section, label, step) for name, section, label, step in specs]
    lines = [
        "## 2. Loss by position: does a scheme use the context past L?",
        "",
        f"Mean loss (nats per token) over position ranges of the nonoverlapping {longest}-token segments (mean ± "
        f"95% interval over seeds); lower further right means the context is used:",
        "",
        table(header, rows, "l" + "r" * (len(header) - 1)),
        "",
        *context.control_lines(study, specs, longest, edges),
    ]
    if "positions" in figures:
        lines += [f"![loss by position]({figures['positions']})", ""]
    return lines


def _accuracy(rows, section, label, length, depth=None, when=None) -> str:
    rates = seed_accuracies(rows, section, label, length, depth, when)
    if rates is None:
        bounded = any(
            r["correct"] is None
            for r in rows
            if r["section"] == section and r["label"] == label and r["length"] == length
        )
        return "n/a (bounded)" if bounded else ""
    return accuracy_text(rates)


def _retrieval(study: Study, figures: dict) -> list:
    plan, rows, L = study.plan, study.retrieval, study.L
    lengths = [int(m * L) for m in plan["retrieval"]["multiples"]]
    best, proportion, passed = gate(rows, plan)
    verdict_line = (
        "not run"
        if best is None
        else f"the best scheme at L is **{best}** with {100 * proportion:.0f}% (mean over seeds): the gate "
        f"({100 * GATE:.0f}%) is **{'passed' if passed else 'failed'}**"
        + ("" if passed else "; no accuracy past L is read below")
    )
    header = ["model"] + [f"{t} ({t // L}L)" for t in lengths]
    body = [[kind] + [_accuracy(rows, "scratch", kind, t) for t in lengths] for kind in scratch_labels(plan)]
    lines = [
        "## 3. Retrieval: every scheme at 1L to 8L and every needle depth",
        "",
        f"Gate: {verdict_line}.",
        "",
        "Exact-match accuracy with depths pooled: mean over seeds ± the 95% t-interval's half-width in points "
        "(the seed is the unit: each seed's probes are one measurement of one model), (per seed):",
        "",
        table(header, body, "l" + "r" * len(lengths)),
        "",
        *context.retrieval_lines(study, scratch_labels(plan)),
    ]
    if "retrieval" in figures:
        lines += [f"![retrieval by length and depth]({figures['retrieval']})", ""]
    return lines


def _extension(study: Study, figures: dict) -> list:
    plan, cells, L = study.plan, study.cells, study.L
    ext, modes, labels = plan["extension"], plan["eval"]["modes"], extension_labels(plan)
    f, steps = int(ext["factor"]), ext["curve_steps"]
    oracle_names = _oracle_names(plan)
    oracle = list(oracle_names)
    names = {m: LABEL_NAMES[m] for m in labels}
    lines = [
        f"## 4. Extending from {L} to {f * L}, with the controls",
        "",
        f"The methods are rope's unless the row names another scheme; *training kept at L* fine-tunes rope on "
        f"the same tokens in rows of {L} (the control for the extra training); the *oracle* rows are trained "
        f"from scratch at {f * L} (what extension is compared with: on the pretraining's sequences, "
        + _oracle_tokens(plan, plan.get("controls", {}).get("oracle_batch_scale", 1.0), "its")
        + f", and on its tokens then the extension's fine-tuning at {f * L}: the extension's tokens "
        f"and steps)"
        + (
            f", at the first {plan['controls'].get('oracle_seeds')} seed(s) only"
            if oracle and plan["controls"].get("oracle_seeds", len(plan["seeds"])) < len(plan["seeds"])
            else ""
        )
        + ".",
        "",
        *sweep.report_lines(plan, cells, study.finetune_lrs, (study.rates or {}).get("grids", {}).get("finetune_lrs")),
        f"Perplexity at {f * L} ({f}L) after each number of fine-tuning steps ({modes[0]} protocol):",
        "",
        table(
            ["method"] + [f"{s} steps" for s in steps],
            [[names[m]] + [cell_text(cells, "extension", m, f * L, modes[0], step=s) for s in steps] for m in labels],
            "l" + "r" * len(steps),
        ),
        "",
    ]
    lines += _plateau(cells, labels, names, f * L, modes[0], steps) + papers.control_lines(study, labels, names)
    if "extension" in figures:
        lines += [f"![extension perplexity by step]({figures['extension']})", ""]
    lengths = [int(m * L) for m in ext["curve_multiples"]]
    for mode in modes:
        lines += [
            f"After {steps[-1]} steps, {mode} protocol:",
            "",
            _length_table(cells, "extension", labels, lengths, mode, L, step=steps[-1], names=names),
        ]
        if oracle:
            lines[-1] += "\n" + "\n".join(
                _length_table(cells, "oracle", oracle, lengths, mode, L, names=oracle_names).splitlines()[2:]
            )
        lines.append("")
    probe_lengths = [int(m * L) for m in plan["retrieval"]["multiples"]]
    body = [
        [names[m], when] + [_accuracy(study.retrieval, "extension", m, t, when=when) for t in probe_lengths]
        for m in labels
        for when in ("before", "after")
    ]
    body += [
        [name, "-"] + [_accuracy(study.retrieval, "oracle", label, t) for t in probe_lengths]
        for label, name in oracle_names.items()
    ]
    lines += [
        "Retrieval accuracy with depths pooled, before (step 0, the method applied zero-shot) and after "
        "fine-tuning: mean over seeds ± the 95% t-interval's half-width in points, (per seed):",
        "",
        table(["method", "when"] + [f"{t} ({t // L}L)" for t in probe_lengths], body, "ll" + "r" * len(probe_lengths)),
        "",
    ]
    if "extension_retrieval" in figures:
        lines += [f"![extension retrieval by length and depth]({figures['extension_retrieval']})", ""]
    lines += context.extension_retrieval_lines(
        study,
        [(f"{names[m]}, {when}", "extension", m, when) for m in labels for when in ("before", "after")]
        + [(name, "oracle", label, None) for label, name in oracle_names.items()],
    )

    def logprob(section, label, t, when=None):
        values = seed_accuracies(study.retrieval, section, label, t, when=when, metric="logprob")
        return interval(list(values.values())).format(3) if values else ""

    body = [
        [names[m], when] + [logprob("extension", m, t, when) for t in probe_lengths]
        for m in labels
        for when in ("before", "after")
    ]
    body += [[name, "-"] + [logprob("oracle", label, t) for t in probe_lengths] for label, name in oracle_names.items()]
    return (
        lines
        + [
            "The same probes scored by the answers' mean log-probability (nats; 0 is certainty; a model "
            "that knows only that the answer is one of the 32 value ids scores log 1/32 = -3.47), which ranks "
            "methods that all retrieve at the ceiling: mean ± 95% interval "
            "over seeds:",
            "",
            table(
                ["method", "when"] + [f"{t} ({t // L}L)" for t in probe_lengths], body, "ll" + "r" * len(probe_lengths)
            ),
            "",
        ]
        + papers.passkey_lines(study, labels, names)
    )


def _finetune_rate(study: Study) -> str:
    runs = [run.config.train for run in study.runs.values()]
    tuned = next((train for train in runs if train.init_from), runs[0])  # else pretraining's, which it inherits
    if study.finetune_lrs:
        ft = study.plan["finetune"]
        return (
            f"each method at the rate the sweep chose for it (section 4), then {tuned.schedule} down to "
            f"{ft['min_lr'] / ft['lr']:g}x it"
        )
    ft = study.plan["finetune"]
    return f"lr {ft['lr']:g} {_falling(tuned, ft['min_lr'])}"


def _falling(train, min_lr: Optional[float] = None) -> str:
    """How a run's rate falls after its warm-up (``train.schedule``), in words."""
    end = f"{train.min_lr if min_lr is None else min_lr:g}"
    if train.schedule == "wsd":
        return f"held, then linear to {end} over the last {100 * train.cooldown:g}% of the steps (wsd)"
    return f"cosine to {end}"


def _oracle_tokens(plan: dict, batch_scale: float, whose: str) -> str:
    """An oracle's "8x the tokens in 1000 steps": its tokens against the pretraining's (``whose`` tokens), at
    ``batch_scale`` x the pretraining's rows per step, and its steps where they differ from the pretraining's."""
    steps = oracle_steps(plan)
    more = steps / plan["train"]["max_steps"]
    times = plan["extension"]["factor"] * batch_scale * more
    return f"{times:.3g}x {whose} tokens" + (f" in {steps} steps" if more != 1 else "")


def _oracle_names(plan: dict) -> dict:
    """Oracle label -> its row name: the kind, length, rows per step and tokens against pretraining."""
    f, rows = plan["extension"]["factor"], plan["train"]["batch_size"]
    return {
        label: f"{kind} trained at {int(f * plan['model']['block_size'])} (oracle, {rows * scale:g} "
        + ("row" if rows * scale == 1 else "rows")
        + " per step, "
        + (
            _oracle_tokens(plan, scale, "the") + ")"
            if scale >= 1
            else "then fine-tuned: the extension's tokens and steps)"
        )
        for kind, label, scale in oracle_runs(plan)
    }


def _plateau(cells, labels, names, long: int, mode: str, steps) -> list:
    """Steps to within 2% of each method's final perplexity, and the change over the last interval."""

    def reached(label):
        values = []
        for seed in {c["seed"] for c in cells if c["section"] == "extension" and c["label"] == label}:
            curve = {s: per_seed(cells, "extension", label, long, mode, step=s).get(seed) for s in steps[1:]}
            if all(v is not None and math.isfinite(v) for v in curve.values()):
                values.append(
                    (
                        next(s for s in steps[1:] if curve[s] <= 1.02 * curve[steps[-1]]),
                        curve[steps[-1]] / curve[steps[-2]],
                    )
                )
        return values

    rows = []
    for label in labels:
        values = reached(label)
        if values:
            rows.append(
                [names[label], " / ".join(str(s) for s, _ in values), interval([r for _, r in values]).format(3)]
            )
    return [
        f"The plateau: the first fine-tuning step whose perplexity at {long} is within 2% of the step-{steps[-1]} "
        f"perplexity (per seed), and the ratio of the last two steps' perplexities ({steps[-1]} / {steps[-2]}; "
        f"mean ± 95% interval over seeds): near 1, the method has stopped improving:",
        "",
        table(["method", "steps to within 2% (per seed)", f"ppl {steps[-1]} / ppl {steps[-2]}"], rows, "lrr"),
        "",
    ]


def _primary(study: Study, number: int, commit: str) -> list:
    """The pre-registered claims (``minilm.study.primary``), their tests and Holm's correction."""
    path, recorded = path_for(study.plan["experiment"]), study.claims
    alpha, tested = compare.tested(study)  # the file as the run read it when it started, else as it is now
    last, before = (recorded["commit"], recorded["registered"]) if recorded else registration(path, commit)
    shown = os.path.relpath(path, REPO)
    if before:
        status = (
            f"last changed in commit `{last[:12]}`, which the run's commit contains: written before the run. "
            f"These are the study's primary claims; everything in section {number + 1} is exploratory."
        )
        title = f"## {number}. Primary claims (pre-registered in `{shown}`), with Holm's correction"
    else:
        why = (
            f"last changed in `{last[:12]}`, which the run's commit does not contain (or the file differs from it)"
            if before is False
            else "git cannot tell when it was written (no checkout, or the file or the run's commit unknown)"
        )
        status = (
            f"{why}: these claims were **not** written before this run, so their tests are exploratory "
            f"here, like everything in section {number + 1}."
        )
        title = f"## {number}. The claims of `{shown}` (not pre-registered for this run: exploratory)"
    named, earlier = confirmatory_run(path, recorded["text"] if recorded else None)
    rule = retrieval_test(path, recorded["text"] if recorded else None, recorded_test(recorded))
    if named:
        status += (
            f" The file names the run that tests these claims: {named}. Earlier runs the file lists, under "
            f"other protocols: {len(earlier)}" + (f" ({'; '.join(earlier)})." if earlier else ".")
        )
    rows = [
        [
            o.claim.id,
            o.claim.claim,
            o.claim.source,
            f"{o.claim.test} ({o.method})" if o.method else o.claim.test,
            hypothesis(o.claim),
            o.estimate,
            "n/a" if o.p is None else f"{o.p:.3g}",
            p_shown(o.adjusted, alpha),
            o.verdict if o.p is not None else "not tested",
        ]
        for o in tested
    ]
    return [
        title,
        "",
        f"The claims file: {status} {tests_text(rule, alpha)} p-values are one-sided; Holm's "
        f"correction runs over all {len(tested)} claims (an untested claim counts as p = 1); *supported* means "
        f"adjusted p < {alpha:g}, *not supported* is not evidence of the opposite.",
        "",
        table(
            ["id", "claim", "source", "test", "alternative", "estimate", "p", "Holm p", "verdict"], rows, "lllllllrl"
        ),
        "",
    ]


def _comparison(study: Study, number: int) -> list:
    modes = study.plan["eval"]["modes"]
    header = ["expectation", "published evidence", "holds when ratio"]
    for mode in modes:
        header += [f"paired ratio, {mode}", f"verdict, {mode}"]
    lines = [
        f"## {number}. Expectations from the literature, with verdicts (written before the run; exploratory)",
        "",
        "Perplexity: each row compares two perplexities through their ratio, computed per seed (mean ± 95% "
        "interval over seeds).",
        "",
        table(header, verdicts(study.cells, study.plan)),
        "",
    ]
    if study.plan["experiment"] != "ablation":
        lines += [
            "Retrieval: each seed's accuracy (its probes and depths counted together unless a depth is "
            "named), or the per-seed difference of two cells (paired); mean and 95% t-interval over seeds.",
            "",
            table(
                ["expectation", "published evidence", "holds when", "measured", "verdict"],
                retrieval_verdicts(study.retrieval, study.plan),
            ),
            "",
        ]
    return lines


def _discussion(study: Study, number: int) -> list:
    path = os.path.join(study.out, "discussion.md")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [
            f"## {number}. Discussion (written by hand after the run; everything else is generated)",
            "",
            f.read().strip(),
            "",
        ]


def _runs_and_configs(study: Study) -> list:
    phases: dict = {}
    for done in study.done.values():
        span = phases.setdefault(done.phase, [done.started, done.ended, 0.0, 0])
        span[0], span[1] = min(span[0], done.started), max(span[1], done.ended)
        span[2] += done.seconds
        span[3] += 1
    summaries = study.summaries()
    rows = [
        [name, s["steps"], f"{s['tokens']:,}", f"{s['seconds']:.0f} s", f"{s['tokens_per_s']:,.0f}"]
        for name, s in summaries.items()
    ]
    lines = [
        "## Wall time",
        "",
        "Phases overlap: the workers start a job as soon as what it needs is done.",
        "",
        table(
            ["phase", "jobs", "first start to last end", "sum of job times"],
            [
                [name, n, f"{(end - start) / 60:.1f} min", f"{total / 60:.1f} min"]
                for name, (start, end, total, n) in phases.items()
            ],
            "lrrr",
        ),
        "",
        "<details><summary>Every training run</summary>",
        "",
        table(["run", "steps", "tokens", "wall time", "tokens/s"], rows, "lrrrr"),
        "",
        "</details>",
        "",
        "## Configs",
        "",
        "The plan (`python -m minilm experiment` settings after overrides):",
        "",
        "```yaml",
        yaml.safe_dump(study.plan, sort_keys=False).rstrip(),
        "```",
        "",
        f"<details><summary>The config of every run of seed {study.plan['seeds'][0]} (other seeds differ only "
        f"in seed and out_dir)</summary>",
        "",
    ]
    for name, run in study.runs.items():
        if run.seed == study.plan["seeds"][0]:
            lines += [f"`{name}`:", "", "```yaml", run.config.to_yaml().rstrip(), "```", ""]
    return lines + ["</details>", ""]
