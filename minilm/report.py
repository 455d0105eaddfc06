"""The report of the length-generalization experiment (``minilm.experiments``): ``report.md``
with every table, the plots, the expectations from the literature checked against our
numbers, every config as YAML, the git commit, the machine and the wall times."""
from __future__ import annotations

import os
import platform
import subprocess
from typing import Optional

import torch
import yaml

from minilm import evaluation
from minilm.common import atomic_write, markdown_table as table
from minilm.experiments import KINDS, RUN_DEFAULTS, Runner
from minilm.model import GPT


def git_commit(repo: str, exclude: Optional[str] = None) -> str:
    """``git rev-parse HEAD`` of the repository, plus ' (dirty)' when files differ from it
    (untracked ones included, except under ``exclude``: the experiment's own output)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=repo,
                                capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    skip = None if exclude is None else os.path.relpath(os.path.abspath(exclude), repo) + os.sep
    changed = [line[3:] for line in status if skip is None or not (line[3:].strip('"') + os.sep).startswith(skip)]
    return head + (f" (dirty: {len(changed)} uncommitted or untracked files, e.g. {changed[0]})" if changed else "")


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} logical CPUs "
            f"({torch.get_num_threads()} torch threads){gpu}; Python {platform.python_version()}, "
            f"torch {torch.__version__}")


def load_average() -> str:
    try:
        return ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _table(results, lengths, columns_title="perplexity") -> str:
    rows: dict = {}
    for r in results:
        rows.setdefault(r.label, {})[r.length] = r
    what = "ppl" if columns_title == "perplexity" else "bpc"
    body = table(["model"] + [f"{t}" for t in lengths],
                 [[label] + [cells[t].cell(what) if t in cells else "" for t in lengths]
                  for label, cells in rows.items()],
                 "l" + "r" * len(lengths))
    return f"{columns_title} at evaluation length (tokens):\n\n{body}"


def _get(results, label, length) -> Optional[float]:
    for r in results:
        if r.label == label and r.length == length and r.ppl is not None:
            return r.ppl
    return None


def _fmt(x: Optional[float]) -> str:
    return "n/a" if x is None else (f"{x:.2f}" if x < 1e4 else f"{x:.3g}")


def _ratio(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def checks(tables: dict, L: int, factor: int) -> list:
    """(published expectation, our numbers, agrees?) for the ordering in docs/design.md, "Published yardsticks"."""
    scratch, ext, abl = tables["scratch"], tables["extension"], tables["ablation"]
    p = lambda label, t, rs=scratch: _get(rs, label, t)  # noqa: E731
    out = []

    def add(claim, numbers, ok):
        out.append((claim, numbers, "n/a" if ok is None else ("yes" if ok else "**no**")))

    longest = max(r.length for r in scratch)
    for t in sorted({r.length for r in scratch if r.length > L}):
        ratio = {k: (p(k, t) / p(k, L) if p(k, t) and p(k, L) else None) for k in KINDS}
        if t == 2 * L or t == longest:
            add(f"past L ({t} = {t // L}x), sinusoidal degrades faster than rope",
                f"ppl({t // L}x) / ppl(L): sinusoidal {_ratio(ratio['sinusoidal'])}, rope {_ratio(ratio['rope'])}",
                None if None in (ratio["sinusoidal"], ratio["rope"]) else ratio["sinusoidal"] > ratio["rope"])
    t = longest
    add(f"alibi stays near its L perplexity up to {t // L}x (within 10%)",
        f"alibi {_fmt(p('alibi', L))} at {L}, {_fmt(p('alibi', t))} at {t}",
        None if None in (p("alibi", L), p("alibi", t)) else p("alibi", t) <= 1.1 * p("alibi", L))
    order = sorted((k for k in ("alibi", "none", "rope", "sinusoidal") if p(k, 4 * L) is not None),
                   key=lambda k: p(k, 4 * L))
    add("at 4x without fine-tuning: alibi (≈ none) < rope < sinusoidal",
        "best to worst at 4x: " + ", ".join(f"{k} {_fmt(p(k, 4 * L))}" for k in order),
        (order.index("rope") < order.index("sinusoidal") and order.index("alibi") < order.index("rope"))
        if {"alibi", "rope", "sinusoidal"} <= set(order) else None)
    learned = [r for r in scratch if r.label == "learned" and r.length > L]
    add("learned positions cannot be evaluated past L",
        f"learned past {L}: " + ", ".join(sorted({r.cell() for r in learned})),
        all(r.status == "bounded" for r in learned) if learned else None)
    at_l = sorted((k for k in KINDS if p(k, L) is not None), key=lambda k: p(k, L))
    add("at the training length rope is (slightly) best",
        "best to worst at L: " + ", ".join(f"{k} {_fmt(p(k, L))}" for k in at_l), at_l[0] == "rope" if at_l else None)
    long = factor * L
    base = p("rope, no scaling", L, ext)
    plain_zero = p("rope, no scaling", long, ext)
    for scaling in ("linear", "yarn", "ntk"):
        tuned = p(f"{scaling}, fine-tuned at {long}", long, ext)
        if tuned is not None:
            add(f"rope + {scaling} fine-tuned recovers at {long} (ppl at {long} <= rope's ppl at L {L})",
                f"{_fmt(tuned)} at {long} vs {_fmt(base)} at {L}; plain rope zero-shot at {long}: {_fmt(plain_zero)}",
                None if base is None else tuned <= base)
    add(f"plain rope at {long} without fine-tuning is clearly worse than at L (> 10%)",
        f"{_fmt(plain_zero)} at {long} vs {_fmt(base)} at {L}",
        None if None in (plain_zero, base) else plain_zero > 1.1 * base)
    control = p(f"no scaling, fine-tuned at {long}", long, ext)
    for scaling in ("linear", "yarn"):
        tuned = p(f"{scaling}, fine-tuned at {long}", long, ext)
        if tuned is not None and control is not None:
            add(f"after the same fine-tuning steps, rope + {scaling} beats rope without scaling at {long}",
                f"{_fmt(tuned)} vs {_fmt(control)}", tuned < control)
    two = {r.label: r.ppl for r in abl if r.length == 2 * L}
    bases = [label for label in two if two[label] is not None]
    if len(bases) >= 2:
        values = [two[b] for b in bases]
        add("sinusoidal: a larger base extrapolates better (lower ppl at 2x)",
            ", ".join(f"{b}: {_fmt(two[b])}" for b in bases), all(a >= b for a, b in zip(values, values[1:])))
    return out


def write_report(runner: Runner, args_line: str, wall: float, started_at: str, loads: tuple, commit: str) -> str:
    """Write ``report.md`` (and ``results.csv``, the plots) under the runner's output directory."""
    plots = _write_data(runner)
    lines = _header(runner, args_line, wall, started_at, loads, commit) + _results(runner, plots) \
        + _runs_and_configs(runner)
    return str(atomic_write(os.path.join(runner.out, "report.md"), "\n".join(lines)))


def _write_data(runner: Runner) -> dict:
    """results.csv, and the plots when matplotlib is installed; returns {table: PNG file name}."""
    plan, out, tables = runner.plan, runner.out, runner.tables
    L, factor = plan["model"]["block_size"], plan["extension"]["factor"]
    evaluation.write_csv([r for rows in tables.values() for r in rows], os.path.join(out, "results.csv"))
    plots = {}
    if evaluation.have_matplotlib():
        for name, title in (("scratch", f"trained at {L} tokens, no fine-tuning"),
                            ("extension", f"rope extended to {factor * L}")):
            rows = tables[name]
            dashed = [r.label for r in rows if "zero-shot" in r.label or r.label == "rope, no scaling"]
            plots[name] = os.path.basename(evaluation.plot(rows, os.path.join(out, f"{name}.png"), title, dashed))
    return plots


def _header(runner: Runner, args_line: str, wall: float, started_at: str, loads: tuple, commit: str) -> list:
    """Title, command, machine and the setup of every run."""
    plan = runner.plan
    L, factor = plan["model"]["block_size"], plan["extension"]["factor"]
    first = runner.configs[KINDS[0]]
    e, t, ft = plan["eval"], plan["train"], plan["finetune"]
    scratch = runner.tables["scratch"]
    tokens = scratch[0].tokens if scratch else 0
    chars = scratch[0].chars if scratch else 0
    return [
        "# Length generalization: train short, test long",
        "",
        f"Command: `{args_line}`  ",
        f"Started: {started_at}; wall time {wall / 60:.1f} min; load average at start / end: {loads[0]} / {loads[1]}  ",
        f"Git commit at the start: `{commit}`  ",
        f"Machine: {machine()}",
        "",
        "Timings on a shared machine are approximate.",
        "",
        "## Setup",
        "",
        f"- Model: {first.model.n_layer} layers, d_model {first.model.d_model}, {first.model.n_head} heads, "
        f"{first.model.vocab_size}-token vocabulary ({plan['data']['corpus']}), ~{_params(first) / 1e6:.2f}M "
        f"parameters; training length L = {L}; seed {plan['seed']}; {first.train.dtype} dtype setting.",
        f"- From scratch: {t['max_steps']} steps x {t['batch_size']} x {L} tokens "
        f"({t['max_steps'] * t['batch_size'] * L / 1e6:.2f}M tokens), lr {t['lr']:g} cosine to {t['min_lr']:g}, "
        f"the same batches for every scheme.",
        f"- Extension to {factor * L}: {ft['max_steps']} steps x {ft['batch_size']} x {factor * L} tokens "
        f"({ft['max_steps'] * ft['batch_size'] * factor * L / 1e6:.2f}M tokens) from the rope model, lr {ft['lr']:g} "
        f"cosine to {ft['min_lr']:g}.",
        f"- Evaluation: {e['mode']} windows (each window scored from position 0, as in the ALiBi paper); "
        f"the same {tokens:,} validation tokens ({chars:,} characters) at every length.",
        "",
    ]


def _results(runner: Runner, plots: dict) -> list:
    """Sections 1-4: from scratch, the base ablation, the extension, the published ordering."""
    plan, tables = runner.plan, runner.tables
    L, factor = plan["model"]["block_size"], plan["extension"]["factor"]
    scratch, ablation, ext = tables["scratch"], tables["ablation"], tables["extension"]
    lines = ["## 1. Trained at L, evaluated at 1x-16x L (no fine-tuning)", "",
             _table(scratch, sorted({r.length for r in scratch})), "",
             _table(scratch, sorted({r.length for r in scratch}), "bits/char"), ""]
    if "scratch" in plots:
        lines += [f"![perplexity vs length]({plots['scratch']})", ""]
    lengths = sorted({r.length for r in ablation})
    rows = [[label.replace("base ", "")] + [r.cell() for r in sorted((r for r in ablation if r.label == label),
                                                                      key=lambda r: r.length)]
            for label in dict.fromkeys(r.label for r in ablation)]
    lines += ["## 2. Sinusoidal base frequency", "",
              table(["base"] + [f"ppl at {t} ({t // L}x)" for t in lengths], rows, "l" + "r" * len(lengths)),
              "", f"## 3. Extending rope from {L} to {factor * L}", "",
              "Zero-shot rows use the rope model of section 1 with the scaling applied at evaluation time; "
              f"fine-tuned rows start from it and train {plan['finetune']['max_steps']} steps at {factor * L}.", "",
              _table(ext, sorted({r.length for r in ext})), ""]
    if "extension" in plots:
        lines += [f"![extension]({plots['extension']})", ""]
    lines += ['## 4. Against the published ordering (docs/design.md, "Published yardsticks")', "",
              table(["expectation", "our numbers", "agrees"], checks(tables, L, factor))]
    return lines


def _runs_and_configs(runner: Runner) -> list:
    """Every run's budget and result, the phases' wall times, and every config as YAML."""
    lines = ["", "## Runs", "",
             "Dashed lines in the plots: no fine-tuning at the plotted length. Last column: the trainer's "
             f"own check on {RUN_DEFAULTS['eval_iters']} random validation batches at the run's block_size.", "",
             table(["run", "steps", "tokens", "train wall time", "final val bits/char"],
                   [[name, s["steps"], f"{s['tokens']:,}", f"{s['seconds']:.0f} s", _fmt(s.get("final_val_bpc"))]
                    for name, s in runner.summaries.items()], "lrrrr"),
             "", table(["phase", "wall time"], [[name, f"{seconds / 60:.1f} min"] for name, seconds in runner.phases],
                       "lr"),
             "", "## Configs", "", "The plan (`python -m minilm experiment` settings after overrides):", "",
             "```yaml", yaml.safe_dump(runner.plan, sort_keys=False).rstrip(), "```", "",
             "<details><summary>The config of every run</summary>", ""]
    for name, config in runner.configs.items():
        lines += [f"`{name}`:", "", "```yaml", config.to_yaml().rstrip(), "```", ""]
    return lines + ["</details>", ""]


def _params(config) -> int:
    return GPT(config.model).num_params()
