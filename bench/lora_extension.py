"""LoRA extension against full fine-tuning, on the length-generalization study's own models.

    python bench/lora_extension.py reports/length-generalization [--workers 2]

It reads a finished study (its study.json and the checkpoints under runs/) and extends every
seed's rope model to 4L with YaRN as the study's YaRN row does (the same 400 steps, batches
and retrieval mixture, data seed 10,000 + s), but with low-rank adapters: rank 8 on q, k, v
and o, the norms trained too, everything else frozen. Its rate is chosen as the study chooses
each row's: fine-tuning the tuning seed's rope model (seed 101, at the scale the tuning chose)
at each of ``LRS`` and scoring 4L on the held-out end of the train split; no table reads seed
101. Then, per seed: retrieval at 1L to 8L (exact match and the answers' log-probability,
the study's probes) and perplexity at 4L, beside the study's full fine-tuning of the same row
(after) and the scaling applied zero-shot (before). The seed is the unit: means with 95%
t-intervals over seeds, and the paired per-seed difference LoRA - full. Writes report.md and
results.json to ``--out`` (default reports/lora-extension).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from minilm.common import atomic_write, markdown_table  # noqa: E402
from minilm.config import build_config  # noqa: E402
from minilm.study.claims import mean_log_perplexity, seed_accuracies  # noqa: E402
from minilm.study.jobs import Job, run_jobs  # noqa: E402
from minilm.study.stats import interval  # noqa: E402
from minilm.study.work import evaluate_job, retrieval_job, train_job  # noqa: E402

LRS = (3e-4, 1e-3, 3e-3)
LORA = {"r": 8, "alpha": 16.0, "targets": ["q", "k", "v", "o"], "also_train": ["norms"]}
ROW = "yarn"


def lora_config(tree: dict, out_dir: str, lr: float, init_from: str = None) -> dict:
    """The study's run config ``tree`` as a LoRA run at ``lr`` (min_lr in the same proportion)."""
    tree = json.loads(json.dumps(tree))
    t = tree["train"]
    t.update(lora=LORA, min_lr=lr * t["min_lr"] / t["lr"], lr=lr, optimizer="adamw")
    if init_from:
        t["init_from"] = init_from
    tree["out_dir"] = out_dir
    return build_config(tree).to_dict()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("study")
    p.add_argument("--out", default=os.path.join(REPO, "reports", "lora-extension"))
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    with open(os.path.join(args.study, "study.json"), encoding="utf-8") as f:
        state = json.load(f)
    plan, runs = state["plan"], state["runs"]
    L, seeds, runs_dir = plan["model"]["block_size"], plan["seeds"], os.path.join(args.out, "runs")
    long, tuning_seed = 4 * L, plan["tuning"]["seeds"][0]
    study_runs = os.path.join(args.study, "runs")
    template = runs[f"rope-{ROW}-{long}-s{seeds[0]}"]["config"]
    source = os.path.join(study_runs, f"rope-lr{state['lr_scales']['rope']:g}-t{tuning_seed}")
    e, r = plan["eval"], plan["retrieval"]
    settings = {**e, "max_tokens": plan["data"]["holdout_tokens"] - 1, "fixed_stride": e["fixed_stride"] or L}
    jobs, started = [], time.time()
    for lr in LRS:  # the rate, on the tuning seed's held-out text
        config = lora_config(
            {**template, "seed": tuning_seed, "data_seed": 10_000 + tuning_seed},
            os.path.join(runs_dir, f"sweep-{lr:g}"),
            lr,
            init_from=source,
        )
        jobs.append(Job(f"train sweep {lr:g}", train_job, (config,)))
        jobs.append(
            Job(
                f"eval sweep {lr:g}",
                evaluate_job,
                (config["out_dir"], [long], ["nonoverlapping"], [], settings, "cpu", tuning_seed, "holdout"),
                (f"train sweep {lr:g}",),
            )
        )
    sweep_keys = tuple(f"eval sweep {lr:g}" for lr in LRS)

    def chosen(done):
        cells = [
            {
                "section": "sweep",
                "label": f"{lr:g}",
                "seed": tuning_seed,
                "step": None,
                "length": c.length,
                "mode": c.mode,
                "ppl": c.ppl,
            }
            for lr in LRS
            for c in done[f"eval sweep {lr:g}"].value
        ]
        scores = {lr: mean_log_perplexity(cells, "sweep", f"{lr:g}", long, "nonoverlapping") for lr in LRS}
        return min((lr for lr in LRS if scores[lr] is not None), key=lambda lr: scores[lr])

    val = {**settings, "max_tokens": e["max_tokens"]}  # the study's validation cells: its first tokens
    lengths = [int(m * L) for m in r["multiples"]]
    for seed in seeds:
        name = f"rope-{ROW}-{long}-s{seed}"
        jobs.append(
            Job(
                f"train {name}",
                train_job,
                after=sweep_keys,
                resolve=lambda done, seed=seed, name=name: (
                    lora_config(runs[name]["config"], os.path.join(runs_dir, name), chosen(done)),
                ),
            )
        )
        out = os.path.join(runs_dir, name)
        jobs.append(
            Job(
                f"retrieval {name}",
                retrieval_job,
                (out, [], lengths, r["depths"], r["trials"], seed, "cpu"),
                (f"train {name}",),
            )
        )
        jobs.append(
            Job(
                f"eval {name}",
                evaluate_job,
                (out, [long], ["nonoverlapping"], [], val, "cpu", seed),
                (f"train {name}",),
            )
        )
    done = run_jobs(jobs, workers=args.workers)
    lr = chosen(done)
    rows = [
        {"section": "lora", "label": ROW, "seed": seed, "when": "after", **row}
        for seed in seeds
        for row in done[f"retrieval rope-{ROW}-{long}-s{seed}"].value
    ]
    ppl = {seed: done[f"eval rope-{ROW}-{long}-s{seed}"].value[0].ppl for seed in seeds}
    study = state["retrieval"]
    full_ppl = {
        c["seed"]: c["ppl"]
        for c in state["cells"]
        if c["section"] == "extension"
        and c["label"] == ROW
        and c["length"] == long
        and c["mode"] == "nonoverlapping"
        and c["step"] == plan["extension"]["curve_steps"][-1]
    }
    summaries = {k: d.value for k, d in done.items() if k.startswith("train rope")}
    write_report(args, plan, lr, rows, study, ppl, full_ppl, summaries, time.time() - started, lengths, long)
    return 0


def write_report(args, plan, lr, rows, study, ppl, full_ppl, summaries, wall, lengths, long) -> None:
    def cell(source, section, t, when, metric="accuracy"):
        values = seed_accuracies(source, section, ROW, t, when=when, metric=metric)
        if not values:
            return "", {}
        ci = interval(list(values.values()))
        scale = 100 if metric == "accuracy" else 1
        return (
            f"{scale * ci.mean:.{0 if scale == 100 else 3}f} ± "
            f"{scale * (ci.half_width or 0):.{0 if scale == 100 else 3}f}",
            values,
        )

    table, paired = [], []
    for metric in ("accuracy", "logprob"):
        for what, source, section, when in (
            ("zero-shot (before)", study, "extension", "before"),
            ("full fine-tuning (the study's)", study, "extension", "after"),
            ("LoRA r=8 (q, k, v, o; norms)", rows, "lora", "after"),
        ):
            table.append([metric, what] + [cell(source, section, t, when, metric)[0] for t in lengths])
        diffs = []
        for t in lengths:
            a, b = cell(rows, "lora", t, "after", metric)[1], cell(study, "extension", t, "after", metric)[1]
            d = [a[s] - b[s] for s in a if s in b]
            scale = 100 if metric == "accuracy" else 1
            ci = interval(d) if len(d) > 1 else None
            diffs.append(
                ""
                if ci is None
                else f"{scale * ci.mean:+.{1 if scale == 100 else 3}f} "
                f"[{scale * ci.low:+.{1 if scale == 100 else 3}f}, {scale * ci.high:+.{1 if scale == 100 else 3}f}]"
            )
        paired.append([metric] + diffs)
    ratios = [ppl[s] / full_ppl[s] for s in ppl if s in full_ppl]
    ci = interval([math.log(x) for x in ratios])
    lines = [
        "# LoRA extension against full fine-tuning (YaRN, 4L)",
        "",
        f"Command: `python bench/lora_extension.py {args.study}`; wall time {wall / 60:.1f} min with "
        f"{args.workers} workers.",
        "",
        f"Each seed's rope model of the study ({', '.join(map(str, plan['seeds']))}) extended from {long // 4} to "
        f"{long} with YaRN as the study's YaRN row ({plan['extension']['curve_steps'][-1]} steps, the same batches), "
        f"with adapters of rank {LORA['r']} (alpha {LORA['alpha']:g}) on {', '.join(LORA['targets'])} and the norms "
        f"trained, everything else frozen; rate {lr:g}, chosen from {', '.join(f'{x:g}' for x in LRS)} by held-out "
        f"perplexity at {long} on tuning seed {plan['tuning']['seeds'][0]} (no table reads it). The seed is the "
        f"unit: mean ± 95% t half-width over seeds.",
        "",
        "Retrieval with depths pooled (accuracy in %, or the answers' mean log-probability in nats):",
        "",
        markdown_table(
            ["metric", "model"] + [f"{t} ({t * 4 // long}L)" for t in lengths], table, "ll" + "r" * len(lengths)
        ),
        "",
        "LoRA - full fine-tuning, paired by seed (mean [95% interval]):",
        "",
        markdown_table(["metric"] + [f"{t} ({t * 4 // long}L)" for t in lengths], paired, "l" + "r" * len(lengths)),
        "",
        f"Perplexity at {long} (validation, nonoverlapping): LoRA / full fine-tuning = {math.exp(ci.mean):.3f} "
        f"[{math.exp(ci.low):.3f}, {math.exp(ci.high):.3f}] (geometric mean over seeds, 95% interval).",
        "",
    ]
    os.makedirs(args.out, exist_ok=True)
    atomic_write(os.path.join(args.out, "report.md"), "\n".join(lines))
    atomic_write(
        os.path.join(args.out, "results.json"),
        json.dumps(
            {"lr": lr, "retrieval": rows, "ppl": ppl, "full_ppl": full_ppl, "summaries": summaries},
            indent=1,
            default=str,
        ),
    )
    atomic_write(os.path.join(args.out, "runs", ".gitignore"), "*\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
