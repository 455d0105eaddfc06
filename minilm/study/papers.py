"""The extension tested as the PI and YaRN papers test it (issue #58): fine-tuning on text alone, the
passkey zero-shot and after, and perplexity against the control with the same tokens.

* **The text-only arm** (``extension.text_only``): every extension row (each rope scaling, the other
  schemes' interpolations, the keep-at-L control) is fine-tuned again with no retrieval rows in its
  data (``train.retrieval_share`` 0: text alone, as the PI paper fine-tunes on the Pile and PG-19 and
  YaRN on PG-19), as a row of its own, ``<row> text-only`` (``extension.text_only_label``), with its
  twin's curve evaluations, retrieval before and after and passkey. In the study's fine-tuning every
  row carries the task, so its retrieval after fine-tuning is supervised; the text-only twin says what
  the scaling and the tokens do without it. Its rate is its twin's, the one the sweep chose for the
  row (``finetune_of``): that rate was chosen by held-out perplexity on text alone, which is what the
  twin trains on, and with the same rate the twins differ in their data only, so their after - before
  is a paired contrast of what the retrieval rows add. A rate tuned again for text alone would make
  the twins differ twice (and cost a second sweep).
* **The PI paper's passkey** (``extension.passkey_trials`` > 0): ``minilm.evaluation.passkey`` (a
  5-digit key in random-text filler, asked at the end; greedy decoding) on every extension row at step
  0, the method applied to its source with no fine-tuning (the zero-shot passkey of the PI and YaRN
  papers), and after the fine-tuning, at ``passkey_length``: factor x L less the answer's tokens, so
  the prompt and its answer fill the extended window (a learned table interpolated to factor x L holds
  no more), at every ``retrieval.depths`` with ``passkey_trials`` keys each (the same keys for every
  model of a seed). Rows of ``Study.passkey``: section ``passkey``, label, seed, when (before | after),
  length, depth, correct (None: past a bounded table), trials; they read like retrieval rows
  (``claims.seed_accuracies``, the seed the unit; ``when: change``: after - before per seed), so a
  claims file can name them (section passkey).
* **Against the keep-at-L control** (``control_lines``): each row's perplexity at factor x L after
  fine-tuning over that of rope trained on at L with the same tokens (``controls.keep_training``),
  evaluated at L (what "ends below the source's perplexity at L" should be measured against: the
  extra tokens, not the extension, lower it) and at factor x L, per seed, beside the ratio against
  the source at L; text-only rows against the text-only control.
"""

from __future__ import annotations

import os

import torch

from minilm.checkpoints.loading import load_model
from minilm.common import markdown_table as table
from minilm.common import resolve_device
from minilm.evaluation import passkey
from minilm.study.claims import CHANGE, accuracy_text, cell_text, paired_ratio, seed_accuracies
from minilm.study.extension import extension_runs, is_text_only, text_only_label, twin_of
from minilm.study.jobs import Job
from minilm.study.stats import interval
from minilm.study.sweep import finetune_at

SECTION = "passkey"  # the section of the passkey rows, and the prefix of their jobs' keys
TEXT_ONLY = {"retrieval_share": 0.0, "retrieval_weight": 0.0}  # a text-only row's fine-tuning: no retrieval rows


def finetune_of(plan: dict, label: str, lrs: dict) -> dict:
    """Extension row ``label``'s fine-tuning settings: at the rate ``lrs`` holds for it (a text-only
    row: its twin's; none: the plan's ``finetune.lr``), a text-only row with no retrieval rows."""
    settings = finetune_at(plan, lrs.get(twin_of(label)))
    return {**settings, **TEXT_ONLY} if is_text_only(label) else settings


def passkey_length(plan: dict) -> int:
    """The passkey prompt's tokens in the plan's extended window (``prompt_tokens``)."""
    return prompt_tokens(plan["extension"]["factor"], plan["model"]["block_size"])


def prompt_tokens(multiple: float, L: int) -> int:
    """A passkey prompt's tokens in the window ``multiple`` x L: the window less the answer's
    (``passkey.MAX_NEW_TOKENS``), so that prompt and answer fit in it."""
    return int(multiple * L) - passkey.MAX_NEW_TOKENS


def passkey_job(path: str, overrides: list, length: int, depths: list, trials: int, seed: int, device: str) -> list:
    """Passkey rows {length, depth, correct (None: bounded), trials} of one checkpoint with ``overrides``
    (``minilm.evaluation.passkey.accuracy``: ``trials`` keys per depth, drawn from ``seed``)."""
    torch.manual_seed(seed)
    model, tokenizer, _, _ = load_model(path, overrides, device=resolve_device(device))
    rows = passkey.accuracy(model, tokenizer, [length], depths, trials=trials, seed=seed)
    return [
        {
            "length": r["length"],
            "depth": r["depth"],
            "correct": None if r["accuracy"] is None else r["correct"],
            "trials": r["trials"],
        }
        for r in rows
    ]


def build_passkey(study, run, source: str, overrides) -> None:
    """Add to ``study`` the passkey jobs of extension ``run``: before (its ``source`` checkpoint with the
    method's zero-shot ``overrides``, shared by a text-only twin) and after its fine-tuning."""
    plan = study.plan
    trials = plan["extension"].get("passkey_trials", 0)
    if not trials:
        return
    for when, path, after, given in (
        ("before", source, f"train {os.path.basename(source)}", list(overrides)),
        ("after", run.config.out_dir, run.key, []),
    ):
        key = f"{SECTION} {os.path.relpath(path, study.runs_dir)} {' '.join(given)}".strip()
        if key not in {job.key for job in study.jobs}:
            args = (path, given, passkey_length(plan), plan["retrieval"]["depths"], trials, run.seed)
            study.jobs.append(
                Job(key, passkey_job, (*args, plan["train"]["device"]), (after,), "passkey before and after extension")
            )
        where = dict(section=SECTION, label=run.label, seed=run.seed, when=when)
        study._readers.append((key, lambda rows, where=where: [{**where, **row} for row in rows]))


def protocol_lines(plan: dict) -> list:
    """The protocol's bullets for the text-only arm and the passkey."""
    ext, lines = plan["extension"], []
    if ext.get("text_only"):
        lines.append(
            "- **Text-only fine-tuning** (`extension.text_only`): every extension row again with no retrieval "
            "rows in its fine-tuning (`train.retrieval_share` 0, as the PI and YaRN papers fine-tune on text), "
            "at its twin's rate (the twins differ in their data alone), as the row *<row>, text-only*: its "
            "retrieval after fine-tuning is not supervised."
        )
    if ext.get("passkey_trials"):
        lines.append(
            f"- **Passkey** (the PI paper's task, `minilm.evaluation.passkey`): a random 5-digit key in filler "
            f"text of {passkey_length(plan)} tokens (factor x L less the answer's {passkey.MAX_NEW_TOKENS}), "
            f"at depths {', '.join(f'{d:g}' for d in plan['retrieval']['depths'])}, {ext['passkey_trials']} "
            f"keys per depth and seed, asked at the end; right when the greedy continuation starts with the key. "
            f"Zero-shot: the method applied to its source with no fine-tuning (step 0); after: the last step."
        )
    return lines


def _change_text(changes) -> str:
    """'+12 points ± 5 (10/15/11)': the mean per-seed change, the t-interval's half-width, per seed."""
    if not changes:
        return ""
    ci = interval(list(changes.values()))
    spread = "" if ci.half_width is None else f" ± {100 * ci.half_width:.0f}"
    return f"{100 * ci.mean:+.0f} points{spread} (" + "/".join(f"{100 * v:+.0f}" for v in changes.values()) + ")"


def passkey_lines(study, labels, names: dict) -> list:
    """The report's passkey table: each extension row zero-shot, after fine-tuning and after - before,
    depths pooled, the seed the unit."""
    if not study.plan["extension"].get("passkey_trials") or not study.passkey:
        return []
    rows, length, last = study.passkey, passkey_length(study.plan), study.plan["extension"]["curve_steps"][-1]

    def accuracy(label, when):
        rates = seed_accuracies(rows, SECTION, label, length, when=when)
        ran = any(r["label"] == label and r["when"] == when for r in rows)
        return accuracy_text(rates) if rates else "n/a (bounded)" if ran else ""

    body = [
        [
            names[m],
            accuracy(m, "before"),
            accuracy(m, "after"),
            _change_text(seed_accuracies(rows, SECTION, m, length, when=CHANGE)),
        ]
        for m in labels
    ]
    return [
        f"Passkey retrieval at {length} tokens (the PI paper's task: a 5-digit key in filler text, asked at the "
        f"end; chance about 1 in 90,000), zero-shot (step 0: the method applied to its source) and after {last} "
        f"steps, depths pooled: mean over seeds ± the 95% t-interval's half-width in points (per seed); after - "
        f"before per seed:",
        "",
        table(["method", "zero-shot (step 0)", f"after {last} steps", "after - before"], body, "lrrr"),
        "",
    ]


def control_lines(study, labels, names: dict) -> list:
    """The report's table of each extension row's perplexity at factor x L after fine-tuning against the
    keep-at-L control (at L and at factor x L; a text-only row against the text-only control) and against
    its source at L: per-seed ratios, mean ± 95% interval over seeds."""
    plan, cells, L = study.plan, study.cells, study.L
    if "keep" not in labels:
        return []
    mode, last, long = (
        plan["eval"]["modes"][0],
        plan["extension"]["curve_steps"][-1],
        int(plan["extension"]["factor"] * L),
    )
    runs = extension_runs(plan, text_only=True)

    def ratio(label, denominator):
        values = paired_ratio(cells, ("extension", label, long, last), denominator, mode)
        return interval(values).format(3) if values else ""

    body = []
    for m in labels:
        keep = text_only_label("keep") if is_text_only(m) else "keep"
        control = twin_of(m) == "keep"
        body.append(
            [names[m], cell_text(cells, "extension", m, long, mode, step=last)]
            + (
                ["(the control)"] * 2
                if control
                else [ratio(m, ("extension", keep, L, last)), ratio(m, ("extension", keep, long, last))]
            )
            + [ratio(m, ("scratch", runs[m][0], L, None))]
        )
    return [
        f"Against the control with the same tokens, after {last} steps ({mode} protocol): each row's perplexity at "
        f"{long} over that of rope trained on at L on the fine-tuning's tokens (text-only rows: the text-only "
        f"control), evaluated at L = {L} (what a gain over the source at L owes to the extra tokens alone is in the "
        f"control too) and at {long}, and over its source's at L; per-seed ratios, mean ± 95% interval over seeds:",
        "",
        table(
            ["method", f"ppl at {long}", f"/ kept at L, at {L}", f"/ kept at L, at {long}", f"/ source at {L}"],
            body,
            "lrrrr",
        ),
        "",
    ]
