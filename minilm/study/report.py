"""The report of the length-generalization study (``minilm.study.plan``): ``report.md`` with
every table as means and 95% intervals over seeds (``minilm.study.stats``), the figures with error
bands (``minilm.study.figures``), the published expectations with paired verdicts, the
protocol, the configs, the git commit, the machine and the wall time per phase; plus
``results.csv`` (one line per cell and seed) and ``passkey.csv``.

A hand-written ``discussion.md`` in the output directory (the explanation of what disagrees
with the literature, written after looking at the numbers) is included as the last section
when present, so re-running keeps it."""
from __future__ import annotations

import csv
import io
import json
import os
import platform
import subprocess
from typing import Optional, Sequence

import torch
import yaml

from minilm.common import atomic_write, cpu_has_fast_bf16, markdown_table as table
from minilm.figures.canvas import have_matplotlib
from minilm.model.gpt import GPT
from minilm.study.figures import curve_figure, length_figure
from minilm.study.plan import KINDS, METHOD_NAMES, ExperimentError, Study
from minilm.study.stats import Interval, interval, verdict


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


def cpu_flags() -> str:
    """The CPU's vector and matrix extensions that decide float32 / bf16 speed."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
    return (", ".join(shown) or "none of avx2/avx512/amx") + f"; torch sees native bf16: {cpu_has_fast_bf16()}"


# --------------------------------------------------------------------------- reading the cells

def per_seed(cells: Sequence[dict], section: str, label: str, length: int, mode: str, step=None) -> dict:
    """{seed: perplexity} of one cell of the study (no entry where it was not run)."""
    return {c["seed"]: c["ppl"] for c in cells if c["section"] == section and c["label"] == label
            and c["length"] == length and c["mode"] == mode and c.get("step") == step and c["ppl"] is not None}


def cell_interval(cells, *where, **kw) -> Optional[Interval]:
    values = per_seed(cells, *where, **kw)
    return interval(list(values.values())) if values else None


def _cell(cells, *where, **kw) -> str:
    ci = cell_interval(cells, *where, **kw)
    if ci is not None:
        return ci.format()
    bounded = any(c["status"] == "bounded" for c in cells if c["section"] == where[0] and c["label"] == where[1]
                  and c["length"] == where[2] and c["mode"] == where[3])
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
    L, ext = plan["model"]["block_size"], plan["extension"]
    f = int(ext["factor"])
    S = lambda label, m: ("scratch", label, int(m * L), None)  # noqa: E731
    E = lambda label, step, m=f: ("extension", label, int(m * L), step)  # noqa: E731
    A = lambda base, m: ("ablation", base, int(m * L), None)  # noqa: E731
    out = [
        ("sinusoidal at L within 15% of learned at L", "at L the schemes are close: ALiBi paper sinusoidal 20.05, "
         "rotary 20.07", S("sinusoidal", 1), S("learned", 1), "<", 1.15),
        (f"alibi at {f}L within 10% of its L perplexity", "ALiBi paper: 19.73 at L, 18.41 at 4.9L",
         S("alibi", f), S("alibi", 1), "<", 1.10),
        (f"sinusoidal at {f}L at least 2x its L perplexity", "ALiBi paper: 20.05 at L, 132.41 at 4.9L",
         S("sinusoidal", f), S("sinusoidal", 1), ">", 2.0),
        (f"plain rope at {f}L worse than at L", "ALiBi paper: 20.07 at L, 31.58 at 4.9L; PI paper: >1000 at 2x",
         S("rope", f), S("rope", 1), ">", 1.0),
        (f"at {f}L, alibi beats rope", "ALiBi paper: 18.41 vs 31.58 at 4.9L", S("alibi", f), S("rope", f), "<", 1.0),
        (f"at {f}L, rope beats sinusoidal", "ALiBi paper: 31.58 vs 132.41 at 4.9L",
         S("rope", f), S("sinusoidal", f), "<", 1.0),
        (f"t5 at {f}L within 10% of its L perplexity", "ALiBi paper: T5 bias 19.65 at L, 20.41 at 4.9L",
         S("t5", f), S("t5", 1), "<", 1.10),
        (f"kerple at {f}L within 10% of its L perplexity", "KERPLE paper (Chi et al. 2022): flat like ALiBi",
         S("kerple", f), S("kerple", 1), "<", 1.10),
        (f"fire at {f}L within 10% of its L perplexity", "FIRE paper (Li et al. 2023): generalizes in length",
         S("fire", f), S("fire", 1), "<", 1.10),
        (f"at {f}L, xpos beats rope", "xPos paper (Sun et al. 2022): extrapolates better than rotary",
         S("xpos", f), S("rope", f), "<", 1.0),
        (f"at {f}L, randomized rope beats rope", "Ruoss et al. 2023: randomized positions generalize",
         S("randomized", f), S("rope", f), "<", 1.0),
        ("sinusoidal base 100,000 beats 10,000 at 2L", "expectation of our first report (a longer wavelength "
         "range extrapolates better)", A("100000", 2), A("10000", 2), "<", 1.0),
        ("sinusoidal base 10,000 beats 1,000 at 2L", "the same expectation", A("10000", 2), A("1000", 2), "<", 1.0),
    ]
    last, methods = ext["curve_steps"][-1], [m for m in ext["methods"] if m != "none"]
    for method in methods:
        out.append((f"{METHOD_NAMES[method]} after {last} steps: ppl at {f}L below the source's at L",
                    "PI paper: 7.20 at 2k before, 6.95 at 8k after", E(method, last), S("rope", 1), "<", 1.0))
    for step in [s for s in ext["curve_steps"] if 0 < s <= 50] if "none" in ext["methods"] else []:
        for method in methods:
            out.append((f"after {step} steps, {METHOD_NAMES[method]} beats no scaling at {f}L",
                        "PI and YaRN papers: scaled methods adapt in fewer steps", E(method, step), E("none", step),
                        "<", 1.0))
    if "yarn" in methods and "linear" in methods:
        for step in [s for s in ext["curve_steps"] if 0 < s <= 50]:
            out.append((f"after {step} steps, YaRN beats PI at {f}L", "YaRN paper: fewer steps than PI",
                        E("yarn", step), E("linear", step), "<", 1.0))
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


# --------------------------------------------------------------------------- writing

def write_report(study: Study, command: str, wall: float, started_at: str, loads: tuple, commit: str) -> str:
    """Write report.md, results.csv, passkey.csv and the figures under the study's output directory."""
    atomic_write(os.path.join(study.out, "study.json"), json.dumps(
        {**study.state(), "run": {"command": command, "wall": wall, "started_at": started_at, "loads": list(loads),
                                  "commit": commit}}, indent=1))
    _write_csv(study.cells, os.path.join(study.out, "results.csv"))
    _write_csv(study.passkey, os.path.join(study.out, "passkey.csv"))
    figures = _figures(study) if have_matplotlib() else {}
    lines = (_header(study, command, wall, started_at, loads, commit) + _protocol(study) + _scratch(study, figures)
             + _ablation(study, figures) + _extension(study, figures) + _comparison(study) + _discussion(study)
             + _runs_and_configs(study))
    return str(atomic_write(os.path.join(study.out, "report.md"), "\n".join(lines)))


def rewrite_report(out: str) -> str:
    """Write report.md again from ``<out>/study.json`` with this code (and ``discussion.md``)."""
    path = os.path.join(out, "study.json")
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except OSError as exc:
        raise ExperimentError(f"cannot read {path!r}: {exc.strerror or exc}; run the study first") from None
    except ValueError as exc:
        raise ExperimentError(f"{path!r} is not a study record: {exc}") from None
    run = state["run"]
    return write_report(Study.from_state(state, out), run["command"], run["wall"], run["started_at"],
                        tuple(run["loads"]), run["commit"])


def _write_csv(rows: Sequence[dict], path: str) -> None:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(path, text.getvalue())


def _series(cells, section, labels, lengths, mode, step=None, names=None) -> list:
    return [((names or {}).get(label, label), [(t, cell_interval(cells, section, label, t, mode, step=step))
                                               for t in lengths]) for label in labels]


def _figures(study: Study) -> dict:
    plan, cells, L = study.plan, study.cells, study.L
    modes, ext = plan["eval"]["modes"], plan["extension"]
    lengths = [int(m * L) for m in plan["eval"]["multiples"]]
    out = {}
    out["scratch"] = length_figure([(mode, _series(cells, "scratch", KINDS, lengths, mode)) for mode in modes],
                                   os.path.join(study.out, "scratch.png"), f"trained at L = {L} tokens, "
                                   f"mean and 95% interval over {len(plan['seeds'])} seeds", L)
    bases = [f"{b:g}" for b in plan["ablation"]["bases"]]
    out["ablation"] = length_figure(
        [(mode, _series(cells, "ablation", bases, [int(m * L) for m in plan["ablation"]["multiples"]], mode,
                        names={b: f"base {b}" for b in bases})) for mode in modes],
        os.path.join(study.out, "ablation.png"), "sinusoidal base frequency", L)
    steps = ext["curve_steps"]
    panels = []
    for m in ext["curve_multiples"]:
        t = int(m * L)
        series = [(METHOD_NAMES[method], [(s, cell_interval(cells, "extension", method, t, modes[0], step=s))
                                          for s in steps]) for method in ext["methods"]]
        panels.append((f"at {t} tokens ({m:g}L)", series))
    out["extension"] = curve_figure(panels, os.path.join(study.out, "extension.png"),
                                    f"rope extended from {L} to {int(ext['factor'] * L)}: {modes[0]} perplexity "
                                    f"against fine-tuning steps (mean, 95% interval)")
    return {name: os.path.basename(path) for name, path in out.items()}


def _header(study: Study, command: str, wall: float, started_at: str, loads: tuple, commit: str) -> list:
    plan = study.plan
    return [
        "# Length generalization: train short, test long, then extend",
        "",
        f"Command: `{command}`  ",
        f"Started: {started_at}; **wall time {wall / 60:.1f} min** with {study.workers} worker processes of one "
        f"torch thread each; load average at start / end: {loads[0]} / {loads[1]}  ",
        f"Git commit at the start: `{commit}`  ",
        f"Machine: {machine()}; CPU flags: {cpu_flags()}  ",
        f"Seeds: {', '.join(map(str, plan['seeds']))}; dtype: {plan['train']['dtype']}",
        "",
    ]


OPTIMIZER_NAMES = {"adamw": "AdamW", "muon": "Muon (blocks' matrices) with AdamW"}


def _protocol(study: Study) -> list:
    plan, L = study.plan, study.L
    first = next(iter(study.runs.values())).config
    t, ft, ext = plan["train"], plan["finetune"], plan["extension"]
    long, steps = int(ext["factor"] * L), ext["curve_steps"]
    pre_tokens = t["max_steps"] * t["batch_size"] * L
    ft_tokens = steps[-1] * ft["batch_size"] * long
    cell = next((c for c in study.cells), None)
    scored = f"{cell['tokens']:,} tokens ({cell['chars']:,} characters)" if cell else "n/a"
    n = len(plan["seeds"])
    return [
        "## Protocol", "",
        f"- **Model**: {first.model.n_layer} layers, d_model {first.model.d_model}, {first.model.n_head} heads, "
        f"{first.model.vocab_size}-token vocabulary trained on `{plan['data']['corpus']}`, "
        f"~{GPT(first.model).num_params() / 1e6:.2f}M parameters; training length **L = {L}**.",
        f"- **From scratch**: {t['max_steps']} steps x {t['batch_size']} x {L} tokens ({pre_tokens / 1e6:.2f}M "
        f"tokens), {OPTIMIZER_NAMES[first.train.optimizer]} lr {t['lr']:g} cosine to {t['min_lr']:g} after {t['warmup_steps']} warmup steps. "
        f"Seed s fixes the initialisation and the batches; every scheme of seed s sees the same batches.",
        f"- **Extension** of the rope model of each seed to {long} ({ext['factor']:g}x): {steps[-1]} steps x "
        f"{ft['batch_size']} x {long} tokens ({ft_tokens / 1e6:.3f}M tokens, **{100 * ft_tokens / pre_tokens:.1f}% "
        f"of pretraining**), lr {ft['lr']:g} cosine to {ft['min_lr']:g}; one run per method and seed, with "
        f"snapshots at steps {', '.join(map(str, steps[1:-1]))}; step 0 is the source with the scaling applied "
        f"zero-shot. Pretraining is the long phase and fine-tuning a short one, as in the papers (PI: 1,000 steps "
        f"on a model pretrained on 1T tokens).",
        f"- **Evaluation**: the first {scored} of the validation split at every length, i.e. the whole split "
        f"rounded down to a multiple of the longest length (so every cell scores the same tokens). "
        f"*nonoverlapping*: consecutive segments of T tokens, every token scored, each segment from position 0 "
        f"(as the ALiBi paper evaluates; the average token sees T/2 tokens of context). *sliding*: segments of T "
        f"tokens advancing by a stride of T/2; only the last T/2 tokens of each segment are scored, so every scored "
        f"token sees at least T/2 tokens of context; the first segment is scored in full. Perplexity = "
        f"exp(mean nats per scored token). A bounded scheme (learned) past its table is n/a.",
        f"- **Statistics**: every cell is the mean over {n} seed(s) ± the half-width of the 95% confidence interval "
        f"(Student t with n - 1 degrees of freedom; `minilm.study.stats`). A comparison is paired: the ratio of two "
        f"perplexities is computed per seed, and its interval decides the verdict: *yes* when the whole interval "
        f"is on the expected side of the threshold, *no* when it is wholly on the other side, *unresolved* "
        f"when it contains the threshold (or with one seed).",
        f"- **Passkey**: {plan['passkey']['trials']} trials at each depth {plan['passkey']['depths']} and length "
        f"{', '.join(str(int(m * L)) for m in plan['passkey']['multiples'])}, greedy decoding, per seed.",
        "",
    ]


def _length_table(cells, section, labels, lengths, mode, step=None, names=None) -> str:
    names = names or {}
    return table(["model"] + [f"{t} ({t / (lengths[0] or 1):g}L)" for t in lengths],
                 [[names.get(label, label)] + [_cell(cells, section, label, t, mode, step=step) for t in lengths]
                  for label in labels], "l" + "r" * len(lengths))


def _scratch(study: Study, figures: dict) -> list:
    plan, cells, L = study.plan, study.cells, study.L
    lengths = [int(m * L) for m in plan["eval"]["multiples"]]
    lines = [f"## 1. Every scheme trained at L = {L}, evaluated at {', '.join(map(str, lengths))} tokens", ""]
    for mode in plan["eval"]["modes"]:
        lines += [f"Perplexity, {mode} mode:", "", _length_table(cells, "scratch", KINDS, lengths, mode), ""]
    if "scratch" in figures:
        lines += [f"![perplexity against length]({figures['scratch']})", ""]
    return lines


def _ablation(study: Study, figures: dict) -> list:
    plan, cells, L = study.plan, study.cells, study.L
    lengths = [int(m * L) for m in plan["ablation"]["multiples"]]
    bases = [f"{b:g}" for b in plan["ablation"]["bases"]]
    lines = ["## 2. Sinusoidal base frequency (the fair, sqrt(d_model)-scaled sinusoidal model)", ""]
    for mode in plan["eval"]["modes"]:
        lines += [f"Perplexity, {mode} mode:", "",
                  _length_table(cells, "ablation", bases, lengths, mode, names={b: f"base {b}" for b in bases}), ""]
    if "ablation" in figures:
        lines += [f"![base ablation]({figures['ablation']})", ""]
    return lines


def _extension(study: Study, figures: dict) -> list:
    plan, cells, L = study.plan, study.cells, study.L
    ext, modes = plan["extension"], plan["eval"]["modes"]
    f, steps = int(ext["factor"]), ext["curve_steps"]
    names = {m: METHOD_NAMES[m] for m in ext["methods"]}
    lines = [f"## 3. Extending rope from {L} to {f * L}", "",
             f"Perplexity at {f * L} ({f}L) after each number of fine-tuning steps ({modes[0]} mode):", "",
             table(["method"] + [f"{s} steps" for s in steps],
                   [[names[m]] + [_cell(cells, "extension", m, f * L, modes[0], step=s) for s in steps]
                    for m in ext["methods"]], "l" + "r" * len(steps)), ""]
    if "extension" in figures:
        lines += [f"![extension curves]({figures['extension']})", ""]
    lengths = [int(m * L) for m in ext["curve_multiples"]]
    for mode in modes:
        lines += [f"After {steps[-1]} steps, {mode} mode:", "",
                  _length_table(cells, "extension", ext["methods"], lengths, mode, step=steps[-1], names=names), ""]
    lines += _passkey(study, names)
    return lines


def _passkey(study: Study, names: dict) -> list:
    rows, lengths = study.passkey, sorted({r["length"] for r in study.passkey})
    if not rows:
        return []
    def acc(method, when, length):
        by_seed: dict = {}
        for r in rows:
            if r["label"] == method and r["when"] == when and r["length"] == length and r["accuracy"] is not None:
                by_seed.setdefault(r["seed"], []).append(r["accuracy"])
        return interval([100 * sum(v) / len(v) for v in by_seed.values()]).format(0) if by_seed else "n/a"
    body = [[names[m], when] + [acc(m, when, t) for t in lengths]
            for m in names for when in ("before", "after")]
    return ["Passkey accuracy (%, mean over seeds ± 95% interval), before (step 0, scaling applied zero-shot) "
            "and after fine-tuning:", "",
            table(["method", "when"] + [f"{t} tokens" for t in lengths], body, "ll" + "r" * len(lengths)), ""]


def _comparison(study: Study) -> list:
    modes = study.plan["eval"]["modes"]
    header = ["expectation", "published evidence", "holds when ratio"]
    for mode in modes:
        header += [f"paired ratio, {mode}", f"verdict, {mode}"]
    return ["## 4. Expectations from the literature, with paired verdicts", "",
            "Each row compares two perplexities through their ratio, computed per seed (mean ± 95% interval over "
            "seeds).", "", table(header, verdicts(study.cells, study.plan)), ""]


def _discussion(study: Study) -> list:
    path = os.path.join(study.out, "discussion.md")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return ["## 5. Discussion (written by hand after the run; everything else is generated)", "", f.read().strip(),
                ""]


def _runs_and_configs(study: Study) -> list:
    phases: dict = {}
    for done in study.done.values():
        span = phases.setdefault(done.phase, [done.started, done.ended, 0.0, 0])
        span[0], span[1] = min(span[0], done.started), max(span[1], done.ended)
        span[2] += done.seconds
        span[3] += 1
    summaries = study.summaries()
    rows = [[name, s["steps"], f"{s['tokens']:,}", f"{s['seconds']:.0f} s", f"{s['tokens_per_s']:,.0f}"]
            for name, s in summaries.items()]
    lines = ["## Wall time", "",
             "Phases overlap: the workers start a job as soon as what it needs is done.", "",
             table(["phase", "jobs", "first start to last end", "sum of job times"],
                   [[name, n, f"{(end - start) / 60:.1f} min", f"{total / 60:.1f} min"]
                    for name, (start, end, total, n) in phases.items()], "lrrr"), "",
             "<details><summary>Every training run</summary>", "",
             table(["run", "steps", "tokens", "wall time", "tokens/s"], rows, "lrrrr"), "", "</details>", "",
             "## Configs", "", "The plan (`python -m minilm experiment` settings after overrides):", "",
             "```yaml", yaml.safe_dump(study.plan, sort_keys=False).rstrip(), "```", "",
             f"<details><summary>The config of every run of seed {study.plan['seeds'][0]} (other seeds differ only "
             f"in seed and out_dir)</summary>", ""]
    for name, run in study.runs.items():
        if run.seed == study.plan["seeds"][0]:
            lines += [f"`{name}`:", "", "```yaml", run.config.to_yaml().rstrip(), "```", ""]
    return lines + ["</details>", ""]
