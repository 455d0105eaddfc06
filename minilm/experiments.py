"""Experiments that run end to end from one command and write a self-contained report.

    python -m minilm.experiments length-generalization [--quick] [--out DIR] [--seed N] [key=value ...]

``length-generalization`` (train short, test long; Press et al. 2022; Chen et al. 2023; Peng et al. 2023):

1. From scratch, identical tiny models and budgets (same seed, same batches): one model per
   position kind (sinusoidal, learned, rope, alibi, t5, none) at training length L.
2. Each is evaluated at 1x .. 16x L (non-overlapping windows, the same scored tokens at
   every length; ``minilm.evaluation``).
3. Base-frequency ablation: sinusoidal with base 1000, 10000 (the model of step 1) and
   100000, at L and 2L.
4. Context extension to 4L from the rope model: position interpolation (linear), NTK-aware
   and YaRN scaling, each fine-tuned for the same few steps at 4L with a lower learning
   rate, plus plain rope fine-tuned at 4L without scaling (control); and the same scalings
   zero-shot (no fine-tuning), plus dynamic NTK. All evaluated at 1x .. 16x L.

Everything goes under ``--out``: ``report.md`` (tables, links to the plots, every config as
YAML, git commit, machine, wall times), ``results.csv`` (every evaluated cell), the PNG
plots (when matplotlib is installed) and ``runs/<name>/`` with the checkpoints (a
``.gitignore`` there keeps them out of git). Settings are a nested plan (``FULL`` or
``QUICK``); ``key=value`` arguments override it, e.g. ``data.corpus=my_texts/``,
``train.max_steps=500``, ``finetune.max_steps=50``, ``eval.max_tokens=8192``.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import subprocess
import sys
import time
from typing import Optional

import yaml

KINDS = ("sinusoidal", "learned", "rope", "alibi", "t5", "none")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The full run: about 35-40 minutes on an idle 2-core CPU (float32).
FULL = {
    "seed": 1337,
    "model": {"n_layer": 4, "n_head": 4, "d_model": 128, "block_size": 128, "dropout": 0.0, "bias": False},
    "data": {"corpus": "shakespeare", "vocab_size": 1024, "dir": "data"},
    "train": {"batch_size": 16, "max_steps": 600, "lr": 2.0e-3, "min_lr": 2.0e-4, "warmup_steps": 60,
              "weight_decay": 0.1, "grad_clip": 1.0, "dtype": "auto", "device": "auto"},
    "finetune": {"batch_size": 4, "max_steps": 200, "lr": 5.0e-4, "min_lr": 5.0e-5, "warmup_steps": 20},
    "extension": {"factor": 4, "scalings": ["linear", "ntk", "yarn"], "control": True},
    "ablation": {"bases": [1000.0, 10000.0, 100000.0], "multiples": [1, 2]},
    "eval": {"multiples": [1, 2, 4, 8, 16], "max_tokens": 16384, "batch_tokens": 8192, "mode": "nonoverlapping"},
}

# --quick: the same steps with tiny models, a few dozen training steps and short evaluations.
QUICK = copy.deepcopy(FULL)
QUICK["model"].update({"n_layer": 2, "n_head": 2, "d_model": 32, "block_size": 32})
QUICK["train"].update({"batch_size": 8, "max_steps": 30, "warmup_steps": 5, "lr": 3.0e-3, "min_lr": 3.0e-4})
QUICK["finetune"].update({"batch_size": 2, "max_steps": 10, "warmup_steps": 2})
QUICK["eval"].update({"multiples": [1, 2, 4], "max_tokens": 1024})

# trainer settings every run of an experiment shares: no periodic evaluation, one checkpoint at the end
RUN_DEFAULTS = {"eval_interval": 10 ** 9, "eval_iters": 2, "log_interval": 10, "checkpoint_interval": 10 ** 9,
                "sample_tokens": 0, "final_eval_tokens": 0}


class ExperimentError(ValueError):
    """A bad experiment setting; the message is one line meant for the user."""


# --------------------------------------------------------------------------- plan and configs

def make_plan(quick: bool = False, seed: Optional[int] = None, overrides=()) -> dict:
    """The nested settings of a run: FULL or QUICK with ``key=value`` overrides applied."""
    from minilm.config import ConfigError, apply_override
    plan = copy.deepcopy(QUICK if quick else FULL)
    for assignment in overrides:
        key = assignment.split("=", 1)[0].strip().lstrip("-")
        if key.split(".")[0] not in plan:
            raise ExperimentError(f"override {assignment!r}: unknown section {key.split('.')[0]!r}; "
                                  f"valid: {', '.join(plan)}")
        try:
            apply_override(plan, assignment)
        except ConfigError as exc:
            raise ExperimentError(str(exc)) from None
    if seed is not None:
        plan["seed"] = seed
    return plan


def run_config(plan: dict, out_dir: str, position: dict, *, block_size: Optional[int] = None,
               init_from: Optional[str] = None):
    """The Config of one run: the plan's model, data and training budget (the fine-tune budget
    with ``init_from``), this position setting, and the shared trainer settings."""
    from minilm.config import ConfigError, build_config
    from minilm.trainer import resolve_config
    train = {**RUN_DEFAULTS, **plan["train"]}
    if init_from is not None:
        train.update(plan["finetune"])
        train["init_from"] = init_from
    tree = {"model": {**plan["model"], "position": position,
                      "block_size": block_size or plan["model"]["block_size"]},
            "data": plan["data"], "train": train, "out_dir": out_dir, "seed": plan["seed"]}
    try:
        return resolve_config(build_config(copy.deepcopy(tree)))
    except ConfigError as exc:
        raise ExperimentError(f"experiment settings: {exc}") from None


# --------------------------------------------------------------------------- facts for the report

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
    import torch
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


# --------------------------------------------------------------------------- the experiment

class Runner:
    """Trains and evaluates the runs of one experiment, keeping results and timings."""

    def __init__(self, plan: dict, out: str, quiet: bool = False):
        self.plan, self.out, self.quiet = plan, out, quiet
        self.runs_dir = os.path.join(out, "runs")
        self.configs: dict = {}  # run name -> Config
        self.summaries: dict = {}  # run name -> trainer summary
        self.tables: dict = {"scratch": [], "ablation": [], "extension": []}  # table -> [evaluation.Result]
        self._scored: dict = {}  # (run, overrides, length) -> Result, so no cell is computed twice
        self.phases: list = []  # (phase, seconds)

    def say(self, message: str) -> None:
        if not self.quiet:
            print(f"[experiment] {message}", file=sys.stderr, flush=True)

    def train(self, name: str, position: dict, **kw) -> str:
        from minilm.trainer import train
        config = run_config(self.plan, os.path.join(self.runs_dir, name), position, **kw)
        self.configs[name] = config
        self.say(f"training {name}: position {position}, block_size {config.model.block_size}, "
                 f"{config.train.max_steps} steps" + (f" from {kw['init_from']}" if kw.get("init_from") else ""))
        self.summaries[name] = train(config, quiet=self.quiet)
        return config.out_dir

    def evaluate(self, name: str, label: str, multiples, *, overrides=(), table: str) -> None:
        """Score run ``name`` at ``multiples`` of L (all at the same scored tokens: the longest
        length of the plan fixes them) and add the cells to ``table`` under ``label``."""
        import dataclasses

        from minilm import evaluation
        e, L = self.plan["eval"], self.plan["model"]["block_size"]
        lengths = [int(m * L) for m in multiples]
        todo = [t for t in lengths if (name, tuple(overrides), t) not in self._scored]
        if todo:
            longest = int(max(max(e["multiples"]), max(self.plan["ablation"]["multiples"])) * L)
            budget = e["max_tokens"] // longest * longest  # the same scored tokens for every call
            for r in evaluation.evaluate_checkpoints(
                    [os.path.join(self.runs_dir, name)], lengths=todo, mode=e["mode"], max_tokens=budget,
                    overrides=overrides, labels=[label], batch_tokens=e["batch_tokens"], quiet=self.quiet):
                self._scored[(name, tuple(overrides), r.length)] = r
        self.tables[table] += [dataclasses.replace(self._scored[(name, tuple(overrides), t)], label=label)
                               for t in lengths]

    def phase(self, name: str, started: float) -> None:
        self.phases.append((name, time.time() - started))

    def run(self) -> None:
        plan = self.plan
        os.makedirs(self.runs_dir, exist_ok=True)
        with open(os.path.join(self.runs_dir, ".gitignore"), "w") as f:
            f.write("# checkpoints of minilm.experiments runs: not for git\n*\n")
        multiples = plan["eval"]["multiples"]

        started = time.time()
        for kind in KINDS:
            self.train(kind, {"kind": kind})
        self.phase(f"train {len(KINDS)} schemes from scratch", started)

        started = time.time()
        for kind in KINDS:
            self.evaluate(kind, kind, multiples, table="scratch")
        self.phase("evaluate them at every length", started)

        started = time.time()
        for base in plan["ablation"]["bases"]:
            name = "sinusoidal" if base == 10000 else f"sinusoidal-base{base:g}"
            if name != "sinusoidal":
                self.train(name, {"kind": "sinusoidal", "base": float(base)})
            self.evaluate(name, f"base {base:g}", plan["ablation"]["multiples"], table="ablation")
        self.phase("sinusoidal base ablation", started)

        started = time.time()
        factor = plan["extension"]["factor"]
        long = int(factor * plan["model"]["block_size"])
        source = os.path.join(self.runs_dir, "rope")
        self.evaluate("rope", "rope, no scaling", multiples, table="extension")
        for scaling in [*plan["extension"]["scalings"], "dynamic"]:
            self.evaluate("rope", f"{scaling}, zero-shot", multiples, table="extension",
                          overrides=[f"model.position.scaling={{type: {scaling}, factor: {factor}}}"])
        for scaling in plan["extension"]["scalings"]:
            name = f"rope-{scaling}-{long}"
            self.train(name, {"kind": "rope", "scaling": {"type": scaling, "factor": factor}},
                       block_size=long, init_from=source)
            self.evaluate(name, f"{scaling}, fine-tuned at {long}", multiples, table="extension")
        if plan["extension"]["control"]:
            name = f"rope-plain-{long}"
            self.train(name, {"kind": "rope"}, block_size=long, init_from=source)
            self.evaluate(name, f"no scaling, fine-tuned at {long}", multiples, table="extension")
        self.phase(f"rope extension to {long}", started)


# --------------------------------------------------------------------------- the report

def _table(results, lengths, columns_title="perplexity") -> str:
    head = "| model | " + " | ".join(f"{t}" for t in lengths) + " |"
    lines = [f"{columns_title} at evaluation length (tokens):", "", head, "|---|" + "---:|" * len(lengths)]
    rows: dict = {}
    for r in results:
        rows.setdefault(r.label, {})[r.length] = r
    for label, cells in rows.items():
        lines.append(f"| {label} | " + " | ".join(cells[t].cell("ppl" if columns_title == "perplexity" else "bpc")
                                                  if t in cells else "" for t in lengths) + " |")
    return "\n".join(lines)


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
    """(published expectation, our numbers, agrees?) for the ordering in DESIGN.md section 5."""
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
    from minilm import evaluation
    plan, out = runner.plan, runner.out
    L = plan["model"]["block_size"]
    factor = plan["extension"]["factor"]
    tables = runner.tables
    evaluation.write_csv([r for rows in tables.values() for r in rows], os.path.join(out, "results.csv"))
    plots = {}
    if evaluation.have_matplotlib():
        for table, title in (("scratch", f"trained at {L} tokens, no fine-tuning"),
                             ("extension", f"rope extended to {factor * L}")):
            rows = tables[table]
            dashed = [r.label for r in rows if "zero-shot" in r.label or r.label == "rope, no scaling"]
            plots[table] = os.path.basename(evaluation.plot(rows, os.path.join(out, f"{table}.png"), title, dashed))
    first = runner.configs[KINDS[0]]
    e, t, ft = plan["eval"], plan["train"], plan["finetune"]
    scratch = tables["scratch"]
    tokens = scratch[0].tokens if scratch else 0
    chars = scratch[0].chars if scratch else 0
    lines = [
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
        "## 1. Trained at L, evaluated at 1x-16x L (no fine-tuning)",
        "",
        _table(scratch, sorted({r.length for r in scratch})),
        "",
        _table(scratch, sorted({r.length for r in scratch}), "bits/char"),
        "",
    ]
    if "scratch" in plots:
        lines += [f"![perplexity vs length]({plots['scratch']})", ""]
    ablation = tables["ablation"]
    lines += ["## 2. Sinusoidal base frequency", "",
              "| base | " + " | ".join(f"ppl at {t} ({t // L}x)" for t in sorted({r.length for r in ablation}))
              + " |", "|---|" + "---:|" * len({r.length for r in ablation})]
    for label in dict.fromkeys(r.label for r in ablation):
        lines.append(f"| {label.replace('base ', '')} | " + " | ".join(
            r.cell() for r in sorted((r for r in ablation if r.label == label), key=lambda r: r.length)) + " |")
    ext = tables["extension"]
    lines += ["", f"## 3. Extending rope from {L} to {factor * L}", "",
              "Zero-shot rows use the rope model of section 1 with the scaling applied at evaluation time; "
              f"fine-tuned rows start from it and train {plan['finetune']['max_steps']} steps at {factor * L}.", "",
              _table(ext, sorted({r.length for r in ext})), ""]
    if "extension" in plots:
        lines += [f"![extension]({plots['extension']})", ""]
    lines += ["## 4. Against the published ordering (DESIGN.md section 5)", "",
              "| expectation | our numbers | agrees |", "|---|---|---|"]
    lines += [f"| {c} | {n} | {ok} |" for c, n, ok in checks(tables, L, factor)]
    lines += ["", "## Runs", "",
              "Dashed lines in the plots: no fine-tuning at the plotted length. Last column: the trainer's "
              f"own check on {RUN_DEFAULTS['eval_iters']} random validation batches at the run's block_size.", "",
              "| run | steps | tokens | train wall time | final val bits/char |",
              "|---|---:|---:|---:|---:|"]
    for name, s in runner.summaries.items():
        lines.append(f"| {name} | {s['steps']} | {s['tokens']:,} | {s['seconds']:.0f} s | "
                     f"{_fmt(s.get('final_val_bpc'))} |")
    lines += ["", "| phase | wall time |", "|---|---:|"]
    lines += [f"| {name} | {seconds / 60:.1f} min |" for name, seconds in runner.phases]
    lines += ["", "## Configs", "", "The plan (`python -m minilm.experiments` settings after overrides):", "",
              "```yaml", yaml.safe_dump(plan, sort_keys=False).rstrip(), "```", "",
              "<details><summary>The config of every run</summary>", ""]
    for name, config in runner.configs.items():
        lines += [f"`{name}`:", "", "```yaml", config.to_yaml().rstrip(), "```", ""]
    lines += ["</details>", ""]
    path = os.path.join(out, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def _params(config) -> int:
    from minilm import GPT
    return GPT(config.model).num_params()


# --------------------------------------------------------------------------- command line

EXPERIMENTS = ("length-generalization",)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minilm.experiments", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="overrides: section.key=value on the plan (sections: "
                                            + ", ".join(FULL) + "), e.g. data.corpus=texts/ train.max_steps=500")
    parser.add_argument("experiment", choices=EXPERIMENTS)
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    parser.add_argument("--quick", action="store_true", help="tiny models and budgets (a smoke test, minutes)")
    parser.add_argument("--out", help="output directory (default out/<experiment>[-quick])")
    parser.add_argument("--seed", type=int, help="seed of every run (default 1337)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_intermixed_args(argv)

    from minilm.checkpoint import CheckpointError
    from minilm.config import ConfigError
    from minilm.data import DataError
    from minilm.evaluation import EvaluationError
    from minilm.tokenizer import TokenizerError
    from minilm.trainer import TrainingError

    out = args.out or os.path.join("out", args.experiment + ("-quick" if args.quick else ""))
    started, started_at, load_start = time.time(), datetime.datetime.now().astimezone().isoformat(timespec="seconds"), \
        load_average()
    commit = git_commit(REPO, exclude=out)  # the code as it is when the run starts
    try:
        plan = make_plan(args.quick, args.seed, args.overrides)
        runner = Runner(plan, out, quiet=args.quiet)
        runner.run()
        threads = os.environ.get("OMP_NUM_THREADS")
        argv_line = (f"OMP_NUM_THREADS={threads} " if threads else "") + "python -m minilm.experiments " \
            + " ".join(sys.argv[1:] if argv is None else argv)
        path = write_report(runner, argv_line, time.time() - started, started_at, (load_start, load_average()),
                            commit)
    except (ExperimentError, ConfigError, CheckpointError, DataError, TokenizerError, TrainingError,
            EvaluationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; finished runs are kept under " + os.path.join(out, "runs"), file=sys.stderr)
        return 130
    print(f"wrote {path} ({(time.time() - started) / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
