"""The experiments: train short, test long, then extend; every run with several seeds, side by
side in parallel processes (``python -m minilm experiment NAME``).

**length-generalization** (Press et al. 2022; Chen et al. 2023, PI; Peng et al. 2023, YaRN).
For every seed s (every run of seed s sees the same batches, so comparisons are paired):
1. **From scratch**: one model per kind of ``KINDS`` at training length L, at the rate
   ``minilm.study.tuning`` chose for its kind on the tuning seeds (and the plan's ``schemes``
   settings), every row text with a needle of the retrieval task (``minilm.data.retrieval``).
2. **Perplexity** at ``eval.multiples`` of L (``minilm.evaluation.scoring``'s modes), loss by
   position; **retrieval** probes at ``retrieval.multiples`` and ``depths``.
3. **Extension** to ``factor`` x L: rope with each of ``extension.methods``, learned and sinusoidal
   by interpolation, fine-tuned with snapshots at ``curve_steps`` (step 0: the method zero-shot),
   at the rate ``minilm.study.sweep`` chose on held-out training text; with ``extension.text_only`` each
   row again on text alone, and the PI paper's passkey before and after (``minilm.study.papers``).
4. **Controls**: rope trained on at L with the fine-tuning's tokens (``keep_training``), and
   ``controls.oracle`` trained from scratch at factor x L on the pretraining's sequences.
**ablation**: variants of the study's models against references (``minilm.study.ablation``).
Runs are ``minilm.study.jobs`` jobs; their results are ``Study.cells`` and ``Study.retrieval``,
which ``minilm.study.report`` writes up. Checkpoints go under ``<out>/runs/`` (git-ignored).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Optional

from minilm.common import MinilmError, atomic_write
from minilm.config import ConfigError, build_config, resolve_config
from minilm.configfile import apply_overrides
from minilm.data import corpus as data
from minilm.evaluation.scoring import MODES
from minilm.study import context, papers, sweep, tuning
from minilm.study.ablation import GROUPS, select
from minilm.study.designs import EXPERIMENTS, KINDS, PLANS, queries_for, scratch_labels
from minilm.study.extension import (
    extension_run_name,
    extension_runs,
    oracle_runs,
    oracle_steps,
    plan_problem,
    scaling_override,
)
from minilm.study.jobs import Done, Job, run_jobs
from minilm.study.work import evaluate_job, retrieval_job, train_job
from minilm.training.mixture import weight_for_share

# Randomized positions (Ruoss et al. 2023) come from [0, RANDOMIZED_REACH x the longest evaluated length);
# seed s initialises, data seed DATA_SEED_OFFSET + s orders the batches (both recorded).
RANDOMIZED_REACH, DATA_SEED_OFFSET = 4, 10_000

# trainer settings every run of the study shares: no periodic evaluation, one checkpoint at the end
RUN_DEFAULTS = {
    "eval_interval": 10**9,
    "eval_iters": 2,
    "log_interval": 10,
    "checkpoint_interval": 10**9,
    "sample_tokens": 0,
    "final_eval_tokens": 0,
}


class ExperimentError(MinilmError):
    """A bad experiment setting; the message is one line meant for the user."""


# --------------------------------------------------------------------------- plan and configs


def make_plan(experiment: str = "length-generalization", quick: bool = False, seeds=None, overrides=()) -> dict:
    """The nested settings of an experiment (``PLANS``) with ``key=value`` overrides applied."""
    if experiment not in EXPERIMENTS:
        raise ExperimentError(f"experiment {experiment!r} is unknown: valid: {', '.join(EXPERIMENTS)}")
    plan = copy.deepcopy(PLANS[(experiment, quick)])
    for assignment in overrides:
        section = assignment.split("=", 1)[0].strip().lstrip("-").split(".")[0]
        if section not in plan or section in ("seeds", "experiment"):
            valid = [s for s in plan if s not in ("seeds", "experiment")]
            raise ExperimentError(
                f"override {assignment!r}: unknown section {section!r}; valid: {', '.join(valid)} (seeds: --seeds)"
            )
    apply_overrides(plan, overrides)
    plan["seeds"] = list(seeds) if seeds is not None else plan["seeds"]
    if not plan["seeds"] or len(set(plan["seeds"])) != len(plan["seeds"]):
        raise ExperimentError(f"seeds={plan['seeds']} are invalid: expected distinct integers")
    extra = plan.get("claim_seeds", [])
    taken = set(plan["seeds"]) | set(plan.get("tuning", {}).get("seeds", []))
    if not isinstance(extra, list) or len(set(extra)) != len(extra) or taken & set(extra):
        raise ExperimentError(
            f"claim_seeds={extra} is invalid: expected a list of seeds apart from the seeds {plan['seeds']} and "
            f"the tuning seeds"
        )
    kinds = plan.get("kinds", KINDS)
    if any(k not in KINDS for k in kinds) or "rope" not in kinds or len(set(kinds)) != len(kinds):
        raise ExperimentError(
            f"kinds={kinds} is invalid: expected distinct kinds of {', '.join(KINDS)}, rope among them"
        )
    problem = (plan_problem(plan, kinds) if "extension" in plan else None) or tuning.check(plan) or context.check(plan)
    if problem:
        raise ExperimentError(problem)
    share = plan.get("retrieval", {}).get("answer_share")
    if share is not None and not (isinstance(share, (int, float)) and 0 < share < 1):
        raise ExperimentError(f"retrieval.answer_share={share} is invalid: expected a fraction above 0 and below 1")
    density = plan.get("retrieval", {}).get("query_density")
    if density is not None and not (
        isinstance(density, list) and len(density) == 2 and all(isinstance(x, (int, float)) and x > 0 for x in density)
    ):
        raise ExperimentError(
            f"retrieval.query_density={density} is invalid: expected [queries, tokens], e.g. [3, 128]: 3 queries a "
            f"row of 128 tokens"
        )
    spread = plan.get("retrieval", {}).get("spread", False)
    if not isinstance(spread, bool):
        raise ExperimentError(f"retrieval.spread={spread!r} is invalid: expected true or false")
    for length in {
        plan["model"]["block_size"],
        int(plan.get("extension", {}).get("factor", 1) * plan["model"]["block_size"]),
    }:
        try:
            if share is not None:
                weight_for_share(share, length, queries_for(plan, length))
        except (ValueError, TypeError) as exc:
            raise ExperimentError(f"retrieval.query_density: {exc}: use fewer queries") from None
    unknown = [m for m in plan["eval"]["modes"] if m not in MODES]
    if unknown or not plan["eval"]["modes"]:
        raise ExperimentError(f"eval.modes={plan['eval']['modes']} is invalid: valid: {', '.join(MODES)}")
    if "ablation" in plan:
        unknown = [g for g in plan["ablation"]["groups"] if g not in GROUPS]
        if unknown or not plan["ablation"]["groups"]:
            raise ExperimentError(
                f"ablation.groups={plan['ablation']['groups']} is invalid: valid: {', '.join(GROUPS)}"
            )
        plan["ablation"]["variants"] = select(plan, plan["ablation"]["groups"])
    else:  # a setting that no run can take is refused here, before the command writes anything
        for label in scratch_labels(plan):
            position, model = arm_of(plan, label)
            run_config(plan, "out", position, plan["seeds"][0], settings={"model": model})
    return plan


def arm_of(plan: dict, label: str) -> tuple:
    """(position setting, model settings) of row ``label`` from scratch: a kind, or one of the plan's arms."""
    arm = plan.get("arms", {}).get(label)
    return ({"kind": label}, {}) if arm is None else (arm["position"], dict(arm.get("model", {})))


def randomized_reach(plan: dict) -> int:
    """``max_positions`` of the randomized scheme: RANDOMIZED_REACH x the longest evaluated length
    (perplexity, retrieval and the extension's curves)."""
    multiples = (
        plan["eval"]["multiples"]
        + plan.get("retrieval", {}).get("multiples", [])
        + plan.get("extension", {}).get("curve_multiples", [])
    )
    return RANDOMIZED_REACH * int(max(multiples) * plan["model"]["block_size"])


def run_config(
    plan: dict,
    out_dir: str,
    position: dict,
    seed: int,
    *,
    block_size: Optional[int] = None,
    init_from: Optional[str] = None,
    batch_scale: int = 1,
    settings: Optional[dict] = None,
    finetune: Optional[dict] = None,
):
    """The Config of one run: the plan's model, data and training budget (the fine-tuning budget,
    with snapshots at the curve steps, with ``init_from``; ``finetune`` in place of the plan's
    fine-tuning settings: the sweep's rate), this position and seed, and what the
    plan's ``schemes`` section sets for this kind (its position options, model and train keys:
    the settings that make a baseline faithful to its paper), then ``settings`` (model and train
    keys of an ablation's variant). ``batch_scale`` multiplies the batch size (a control at
    another length on the same number of tokens)."""
    tweaks = copy.deepcopy(plan.get("schemes", {}).get(position["kind"], {}))
    for section, values in (settings or {}).items():
        tweaks.setdefault(section, {}).update(values)
    position = {**position, **tweaks.get("position", {})}
    if position["kind"] == "randomized" and "max_positions" not in position:
        position["max_positions"] = randomized_reach(plan)
    train_settings = {**RUN_DEFAULTS, **plan["train"], **tweaks.get("train", {})}
    share, length = plan.get("retrieval", {}).get("answer_share"), block_size or plan["model"]["block_size"]
    if share is not None and train_settings.get("retrieval_share"):  # the task's density and share at every length
        queries, spread = queries_for(plan, length), plan["retrieval"].get("spread", False)
        train_settings.update(
            retrieval_queries=queries,
            retrieval_weight=weight_for_share(share, length, queries),
            retrieval_spread=spread,
        )
    if init_from is not None:
        steps = plan["extension"]["curve_steps"]
        train_settings.update(
            finetune or plan["finetune"],
            init_from=init_from,
            max_steps=steps[-1],
            snapshot_steps=[s for s in steps if 0 < s < steps[-1]],
        )
    batch = train_settings["batch_size"] * batch_scale
    if batch < 1 or abs(batch - round(batch)) > 1e-9:
        raise ExperimentError(
            f"a control needs batch_size {train_settings['batch_size']} x {batch_scale:g} = {batch:g} "
            f"rows for the same tokens: choose a batch size that extension.factor divides"
        )
    train_settings["batch_size"] = round(batch)
    tree = {
        "model": {
            **plan["model"],
            **tweaks.get("model", {}),
            "position": position,
            "block_size": block_size or plan["model"]["block_size"],
        },
        "data": plan["data"],
        "train": train_settings,
        "out_dir": out_dir,
        "seed": seed,
        "data_seed": DATA_SEED_OFFSET + seed,
    }
    try:
        return resolve_config(build_config(copy.deepcopy(tree)))
    except ConfigError as exc:
        raise ExperimentError(f"experiment settings: {exc}") from None


# --------------------------------------------------------------------------- the study


@dataclasses.dataclass
class StudyRun:
    """One trained model of the study (``train`` job ``key``) and what it is for."""

    key: str
    section: str  # scratch | extension | oracle | ablation (the ablation experiment)
    label: str  # the row of its table (scheme, base, method)
    seed: int
    config: object
    source: str = ""  # extension: the run it starts from (its step 0, the method applied zero-shot)


class Study:
    """Builds the job graph of a plan, runs it, and keeps the results as flat cells.

    ``cells``: dicts with section, label, seed, step (fine-tuning steps; None outside the
    extension), mode, length, ppl, bpc, nll, tokens, chars, status, by_position (nonoverlapping:
    mean nats per bin of ``eval.position_bin`` positions; truncated_by_position: the same, context cut
    to L). ``retrieval``: dicts with section, label, seed, when (extension: before | after), length, depth,
    correct (None: bounded), trials, logprob, keys (pairs per probe), distance (to the answer:
    ``minilm.study.context``). ``passkey``: the same for the passkey (``minilm.study.papers``). ``runs``: name ->
    StudyRun;
    ``done``: job key -> ``minilm.study.jobs.Done`` (values and times)."""

    def __init__(self, plan: dict, out: str, *, workers: int = 1, quiet: bool = False, journal=None):
        self.plan, self.out, self.workers, self.quiet, self.journal = plan, out, workers, quiet, journal
        self.invocations = 1  # of the command, resumed (``--resume``) after the first
        self.runs_dir = os.path.join(out, "runs")
        self.runs: dict = {}
        self.jobs: list = []
        self._readers: list = []  # (job key, function turning its value into cells)
        self.cells: list = []
        self.retrieval: list = []
        self.passkey: list = []
        self.done: dict = {}
        self.scored_tokens: Optional[int] = None
        self._evaluations: dict = {}  # (checkpoint, overrides, split) -> (key, {(mode, length)}) of its evaluation job
        # the frozen rates (``use_rates``): kind -> its scale of train.lr; extension row -> its fine-tuning rate
        self.lr_scales, self.finetune_lrs = {}, {}
        self.rates: Optional[dict] = None  # where they were read: path, commit, registered, grids
        self.claimed: set = set()  # (section, label) the retrieval claims read: trained at ``claim_seeds`` too
        self.claims: Optional[dict] = None  # the claims file as the run read it (``minilm.study.primary.snapshot``)

    @property
    def L(self) -> int:
        return self.plan["model"]["block_size"]

    @property
    def extra_seeds(self) -> list:
        """The plan's ``claim_seeds`` that trained runs (the rows the retrieval claims read), sorted."""
        return sorted({run.seed for run in self.runs.values()} & set(self.plan.get("claim_seeds", [])))

    def _train(
        self,
        name: str,
        section: str,
        label: str,
        seed: int,
        position: dict,
        phase: str,
        after=(),
        source: str = "",
        **kw,
    ) -> str:
        """A training job of run ``name`` (``run_config``'s keywords in ``kw``); returns its key."""
        config = run_config(self.plan, os.path.join(self.runs_dir, name), position, seed, **kw)
        self.runs[name] = StudyRun(f"train {name}", section, label, seed, config, source)
        self.jobs.append(Job(f"train {name}", train_job, (config.to_dict(),), tuple(after), phase))
        return f"train {name}"

    def cells_of(self, keys, done: dict) -> list:
        """The cells and retrieval rows that finished jobs ``keys`` gave."""
        return [row for key, read in self._readers if key in keys for row in read(done[key].value)]

    def use_rates(self, contents: dict, where: dict) -> None:
        """Train at the frozen rates ``contents`` (``minilm.study.rates``; ``where`` says where they
        were read): each kind at its scale, each extension row at its rate. The tuning's held-out
        cells and retrieval rows join the study's, for the report's tables of the choice."""
        self.lr_scales = {k: float(v) for k, v in contents["scales"].items()}
        self.finetune_lrs = {k: float(v) for k, v in contents["finetune_lrs"].items()}
        self.rates = {
            **where,
            "grids": contents.get("grids", {}),
            "rejected": contents.get("rejected", []),
            "task_failures": contents.get("task_failures", []),
        }
        self.cells.extend(contents.get("cells", []))
        self.retrieval.extend(contents.get("retrieval", []))

    def tuned_source(self, kind: str, seed: int) -> str:
        """The tuning seed's run of ``kind`` at the scale chosen for it."""
        return os.path.join(self.runs_dir, tuning.run_name(kind, self.lr_scales[kind], seed))

    def arm(self, label: str) -> tuple:
        """(position setting, model settings) of row ``label`` from scratch (``arm_of``)."""
        return arm_of(self.plan, label)

    def _by_kind(self, kind: str) -> dict:
        """``run_config`` keywords of a run from scratch of ``kind`` (or arm): its model settings, at its
        frozen scale of the rate."""
        train = tuning.rates(self.plan, self.lr_scales[kind]) if kind in self.lr_scales else {}
        return {"settings": {"model": self.arm(kind)[1], "train": train}}

    def _evaluate(
        self,
        after: str,
        path: str,
        multiples,
        modes,
        where: dict,
        overrides=(),
        phase="",
        split: str = "val",
        truncated: bool = False,
    ) -> str:
        """Cells of ``where`` at ``multiples`` of L in ``modes`` (``truncated``: with the loss by position's
        control, the context cut to L), from a new evaluation job (all its cells in one ``score_many`` pass)
        or from one already planned for the same checkpoint, overrides and split with (at least) those cells
        (the control a cell of its own); returns the job's key."""
        lengths = [int(m * self.L) for m in multiples]
        cells = {(mode, t) for mode in modes for t in lengths} | ({("truncated", self.L)} if truncated else set())
        what = (path, tuple(overrides), split)
        key, planned = self._evaluations.get(what, (None, set()))
        if not cells <= planned:
            key = " ".join(
                [
                    "eval",
                    *([split] if split != "val" else []),
                    os.path.relpath(path, self.runs_dir),
                    *overrides,
                    ",".join(modes),
                    ",".join(map(str, lengths)),
                    *(["truncated"] if truncated else []),
                ]
            )
            settings = {
                **self.plan["eval"],
                "max_tokens": self.scored_tokens if split == "val" else self.plan["data"]["holdout_tokens"] - 1,
                "fixed_stride": self.plan["eval"]["fixed_stride"] or self.L,
                "truncate": self.L if truncated else None,
            }
            args = (
                path,
                lengths,
                list(modes),
                list(overrides),
                settings,
                self.plan["train"]["device"],
                where["seed"],
                split,
            )
            self.jobs.append(Job(key, evaluate_job, args, (after,), phase))
            self._evaluations[what] = (key, cells)
        self._readers.append(
            (
                key,
                lambda results, where=where, cells=cells: [
                    {
                        **where,
                        "mode": r.mode,
                        "length": r.length,
                        "ppl": r.ppl,
                        "bpc": r.bpc,
                        "nll": r.nll,
                        "tokens": r.tokens,
                        "chars": r.chars,
                        "status": r.status,
                        "by_position": r.by_position,
                        "truncated_by_position": r.truncated_by_position,
                    }
                    for r in results
                    if (r.mode, r.length) in cells
                ],
            )
        )
        return key

    def _retrieval(self, after: str, path: str, overrides, where: dict, seed: int, phase: str, multiples=None) -> None:
        """Retrieval rows of ``where`` at the plan's lengths (or ``multiples`` of L) and depths, the single
        needle's and the multi-key probes (``retrieval.keys``); probes depend on the seed only. The tuning's
        runs (section tuning) are probed on the held-out text, with the single needle only."""
        r = self.plan["retrieval"]
        key = f"retrieval {os.path.relpath(path, self.runs_dir)} {' '.join(overrides)}".strip()
        if key not in {job.key for job in self.jobs}:
            lengths = [int(m * self.L) for m in (multiples or r["multiples"])]
            split = "holdout" if where["section"] == tuning.SECTION else "val"
            self.jobs.append(
                Job(
                    key,
                    retrieval_job,
                    (
                        path,
                        list(overrides),
                        lengths,
                        r["depths"],
                        r["trials"],
                        seed,
                        self.plan["train"]["device"],
                        split,
                        r.get(context.KEYS, 1) if split == "val" else 1,
                    ),
                    (after,),
                    phase,
                )
            )
        self._readers.append((key, lambda rows, where=where: [{**where, **row} for row in rows]))

    def prepare_data(self) -> None:
        """Prepare the corpus once, here, before the workers start (they would race to do it), and
        fix ``scored_tokens``: the validation split (or eval.max_tokens) rounded down to a multiple
        of the longest evaluation length, so every cell of the study scores the same tokens."""
        config = run_config(self.plan, os.path.join(self.runs_dir, "-"), {"kind": "rope"}, self.plan["seeds"][0])
        val = data.prepare(config.data, quiet=self.quiet).val
        e = self.plan["eval"]
        multiples = [
            *e["multiples"],
            *self.plan.get("extension", {}).get("curve_multiples", []),
            *self.plan.get("ablation", {}).get("multiples", []),
        ]
        longest = int(max(multiples) * self.L)
        available = len(val) - 1 if e["max_tokens"] is None else min(e["max_tokens"], len(val) - 1)
        if available < longest:
            raise ExperimentError(
                f"the validation split has {available} scorable tokens, fewer than the longest "
                f"evaluation length {longest}: use more text or shorter eval.multiples"
            )
        self.scored_tokens = available // longest * longest
        need = int(self.plan.get("extension", {}).get("factor", 0) * self.L) + 1
        if sweep.rates(self.plan) and self.plan["data"]["holdout_tokens"] < need:
            raise ExperimentError(
                f"data.holdout_tokens={self.plan['data']['holdout_tokens']} is too few for the sweep: "
                f"it scores {need - 1}-token segments; hold out at least {need}"
            )

    def build(self) -> list:
        """The job graph: training first (rope first, it unblocks the extension), then the rest."""
        if self.scored_tokens is None:
            self.prepare_data()
        if self.plan["experiment"] == "ablation":
            self._build_ablation()
            return self.jobs
        seeds, controls = self.plan["seeds"], self.plan.get("controls", {})
        long = int(self.plan["extension"]["factor"] * self.L)
        if tuning.scales(self.plan) and self.rates is None:
            raise ExperimentError("the study trains at frozen rates: read them first (Study.use_rates)")
        extensions = extension_runs(self.plan, text_only=True)  # with their text-only twins
        for seed in seeds:  # rope first: its runs unblock the extension
            self._scratch("rope", seed)
            for label, (kind, position, kw) in extensions.items():
                if kind == "rope":
                    self._extend(label, seed, kind, position, kw)
        for seed in seeds:
            for kind in scratch_labels(self.plan):
                if kind != "rope":
                    self._scratch(kind, seed)
            for label, (kind, position, kw) in extensions.items():
                if kind != "rope":
                    self._extend(label, seed, kind, position, kw)
            for kind, label, scale in (
                oracle_runs(self.plan) if seed in seeds[: controls.get("oracle_seeds", 1)] else []
            ):
                self._oracle(kind, label, scale, seed, long)
        self._build_claim_seeds(extensions)
        self._build_evaluations()
        return self.jobs

    def _build_claim_seeds(self, extensions: dict) -> None:
        """The rows the retrieval claims read (``claimed``), and the runs they start from, at each of
        the plan's ``claim_seeds``: seeds beyond the tables' five for the exact test, whose p cannot fall
        below 2^-n (``minilm.study.primary``). Rope first, as in ``build``."""
        rows = sorted(  # a passkey claim reads an extension row's passkey: that row
            {
                label
                for section, label in self.claimed
                if section in ("extension", papers.SECTION) and label in extensions
            }
        )
        kinds = {label for section, label in self.claimed if section == "scratch"} | {extensions[r][0] for r in rows}
        for seed in self.plan.get("claim_seeds", []) if self.claimed else []:
            for kind in sorted(kinds, key=lambda k: k != "rope"):
                if kind in scratch_labels(self.plan):
                    self._scratch(kind, seed)
            for label in rows:
                self._extend(label, seed, *extensions[label])

    def _scratch(self, kind: str, seed: int) -> None:
        """The run of ``kind`` (or arm) from scratch at ``seed``, at its frozen rate."""
        self._train(
            f"{kind}-s{seed}", "scratch", kind, seed, self.arm(kind)[0], "train from scratch", **self._by_kind(kind)
        )

    def _oracle(self, kind: str, label: str, scale: float, seed: int, long: int) -> None:
        """An oracle control of ``kind`` trained from scratch at ``long`` tokens with ``scale`` x the
        pretraining's rows per step, for ``oracle_steps`` steps (the plan's controls.oracle_steps_scale x the
        pretraining's). The equal-token oracle (``oracle_runs``: 1 / factor of the rows, the pretraining's
        tokens in as many steps) then takes the extension's fine-tuning at ``long``
        (its steps, its tokens, the rate of the no-scaling row): the extension's tokens and steps in
        all, only never at L. Its pretraining (section oracle-source) is not evaluated."""
        name, equal = f"{label}-{long}-oracle-s{seed}", label in {lbl for _, lbl, s in oracle_runs(self.plan) if s < 1}
        by_kind = self._by_kind(kind)
        if not equal:  # the oracle on the pretraining's sequences, for controls.oracle_steps_scale x its steps
            by_kind["settings"]["train"] = {**by_kind["settings"]["train"], "max_steps": oracle_steps(self.plan)}
        key = self._train(
            name,
            "oracle-source" if equal else "oracle",
            label,
            seed,
            {"kind": kind},
            "train the oracle controls",
            **by_kind,
            block_size=long,
            batch_scale=scale,
        )
        if equal:
            self._train(
                f"{label}-{long}-oracle-tuned-s{seed}",
                "oracle",
                label,
                seed,
                {"kind": kind},
                "train the oracle controls",
                after=[key],
                source=name,
                init_from=os.path.join(self.runs_dir, name),
                block_size=long,
                finetune=sweep.finetune_at(self.plan, self.finetune_lrs.get("none")),
            )

    def _extend(self, label: str, seed: int, source_kind: str, position: dict, kw: dict) -> None:
        """Extension row ``label``'s fine-tuning run from the seed's ``source_kind`` model (section
        extension), at the rate the sweep chose for the row (a text-only row: its twin's, no retrieval rows)."""
        source, name = f"{source_kind}-s{seed}", extension_run_name(label, seed, self.plan)
        self._train(
            name,
            "extension",
            label,
            seed,
            position,
            "fine-tune the extensions",
            after=[f"train {source}"],
            source=source,
            init_from=os.path.join(self.runs_dir, source),
            finetune=papers.finetune_of(self.plan, label, self.finetune_lrs),
            **kw,
        )

    def _build_ablation(self) -> None:
        for seed in self.plan["seeds"]:
            for name, v in self.plan["ablation"]["variants"].items():
                key = self._train(
                    f"{name}-s{seed}",
                    "ablation",
                    name,
                    seed,
                    v["position"],
                    "train the ablation",
                    settings={"model": v["model"], "train": v["train"]},
                )
                self._evaluate(
                    key,
                    self.runs[f"{name}-s{seed}"].config.out_dir,
                    self.plan["ablation"]["multiples"],
                    self.plan["eval"]["modes"],
                    dict(section="ablation", label=name, seed=seed, step=None),
                    phase="evaluate the ablation",
                )

    def _build_evaluations(self) -> None:
        plan, ext, modes = self.plan, self.plan["extension"], self.plan["eval"]["modes"]
        for run in [r for r in self.runs.values() if r.section in ("scratch", "oracle")]:
            phase = "from scratch" if run.section == "scratch" else "of the oracle controls"
            self._evaluate(
                run.key,
                run.config.out_dir,
                plan["eval"]["multiples"],
                modes,
                dict(section=run.section, label=run.label, seed=run.seed, step=None),
                phase=f"evaluate {phase}",
                truncated=True,
            )
            self._retrieval(
                run.key,
                run.config.out_dir,
                (),
                dict(section=run.section, label=run.label, seed=run.seed),
                run.seed,
                f"retrieval {phase}",
            )
        for run in [r for r in self.runs.values() if r.section == "extension"]:
            source = os.path.join(self.runs_dir, run.source or f"rope-s{run.seed}")
            start = scaling_override(run.label, ext["factor"], int(ext["factor"] * self.L))
            where = dict(section="extension", label=run.label, seed=run.seed)
            for step in ext["curve_steps"]:
                path = (
                    source
                    if step == 0
                    else (
                        run.config.out_dir
                        if step == ext["curve_steps"][-1]
                        else os.path.join(run.config.out_dir, "snapshots", f"step-{step}.pt")
                    )
                )
                self._evaluate(
                    run.key,
                    path,
                    ext["curve_multiples"],
                    modes if step == ext["curve_steps"][-1] else modes[:1],
                    {**where, "step": step},
                    overrides=start if step == 0 else (),
                    phase="evaluate the extension curves",
                    truncated=step == ext["curve_steps"][-1],  # the loss by position reads the last step
                )
            self._retrieval(
                f"train {os.path.basename(source)}",
                source,
                start,
                {**where, "when": "before"},
                run.seed,
                "retrieval before and after extension",
            )
            self._retrieval(
                run.key,
                run.config.out_dir,
                (),
                {**where, "when": "after"},
                run.seed,
                "retrieval before and after extension",
            )
            papers.build_passkey(self, run, source, start)

    def run(self) -> None:
        os.makedirs(self.runs_dir, exist_ok=True)
        atomic_write(os.path.join(self.runs_dir, ".gitignore"), "# checkpoints of the study's runs: not for git\n*\n")
        if not self.jobs:
            self.build()
        self.done = run_jobs(self.jobs, workers=self.workers, quiet=self.quiet, journal=self.journal)
        for key, read in self._readers:
            rows = read(self.done[key].value)
            (
                self.retrieval
                if key.startswith("retrieval")
                else self.passkey
                if key.startswith(papers.SECTION)
                else self.cells
            ).extend(rows)

    def state(self) -> dict:
        """Everything the report needs, as plain data (``study.json``; ``from_state`` reads it back)."""
        return {
            "plan": self.plan,
            "workers": self.workers,
            "claims": self.claims,
            "finetune_lrs": self.finetune_lrs,
            "lr_scales": self.lr_scales,
            "rates": self.rates,
            "invocations": self.invocations,
            "cells": self.cells,
            "retrieval": self.retrieval,
            "passkey": self.passkey,
            "runs": {
                name: {**dataclasses.asdict(run), "config": run.config.to_dict()} for name, run in self.runs.items()
            },
            "done": {key: dataclasses.asdict(done) for key, done in self.done.items()},
        }

    @classmethod
    def from_state(cls, state: dict, out: str) -> "Study":
        study = cls(state["plan"], out, workers=state["workers"])
        study.cells, study.retrieval, study.claims = state["cells"], state["retrieval"], state.get("claims")
        study.finetune_lrs, study.lr_scales = state.get("finetune_lrs", {}), state.get("lr_scales", {})
        study.rates, study.passkey = state.get("rates"), state.get("passkey", [])
        study.invocations = state.get("invocations", 1)
        study.runs = {
            name: StudyRun(**{**run, "config": build_config(run["config"])}) for name, run in state["runs"].items()
        }
        study.done = {key: Done(**done) for key, done in state["done"].items()}
        return study

    def summaries(self) -> dict:
        """Run name -> trainer summary of every finished training job."""
        return {name: self.done[run.key].value for name, run in self.runs.items() if run.key in self.done}
