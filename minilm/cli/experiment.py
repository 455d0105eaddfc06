"""``python -m minilm experiment {length-generalization,ablation} [--quick] [--out DIR]
[--seeds 1,2,3] [--workers N] [key=value ...]``: run a whole study (``minilm.study.plan``) in
parallel worker processes and write its report (``minilm.study.report``).

Ctrl-C or SIGTERM stops it: the workers are stopped (``minilm.study.jobs``), the finished jobs stay in
the journal for ``--resume``, and the command says so in one line, with status 130 (SIGINT) or 143 (SIGTERM)."""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import signal
import sys
import threading
import time

from minilm.cli import Parser, run_command, smoke
from minilm.common import keep_aside, resolve_device, resolve_dtype
from minilm.data.sources import source_fingerprint
from minilm.study import designs, primary, provenance, rates, report, sweep, tune, tuning
from minilm.study import plan as experiments
from minilm.study.extension import extension_runs
from minilm.study.jobs import Interrupted
from minilm.study.journal import Journal

REPO = primary.REPO


def parse_args(argv):
    parser = Parser(
        prog="minilm experiment",
        description=experiments.__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="overrides: section.key=value on the plan (sections: "
        + ", ".join(designs.FULL)
        + "), e.g. data.corpus=texts/ train.max_steps=500",
    )
    parser.add_argument("experiment", choices=designs.EXPERIMENTS)
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny models and budgets, the tuning step first: a smoke test of every part (about a minute, 2 cores)",
    )
    parser.add_argument("--out", help="output directory (default out/<experiment>[-quick])")
    parser.add_argument(
        "--seeds", type=seed_list, help="comma-separated seeds, e.g. 1,2,3 (default: 1 to 5; --quick: 1,2)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="parallel runs, one torch thread each (default: the number of CPUs, %(default)s)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="write report.md again from --out's study.json (e.g. after adding discussion.md)",
    )
    parser.add_argument(
        "--tune",
        action="store_true",
        help="run the tuning step only: choose each kind's rate and each extension row's fine-tuning rate on the "
        "tuning seeds and write them to --rates (default: minilm/study/registered/<experiment>.rates.yaml; "
        "--quick: <out>/rates.yaml), which every run of the study then reads",
    )
    parser.add_argument(
        "--rates",
        metavar="FILE",
        help="the frozen rates to train at (default: the registered file; --quick: <out>/rates.yaml, tuned first "
        "when missing or tuned for other settings)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the runs of an earlier experiment in --out")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted experiment in --out: the jobs it finished are read back, not run "
        "again (same arguments, the same commit, rates file and corpus)",
    )
    return parser.parse_intermixed_args(argv)


def seed_list(text: str) -> list:
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers, e.g. 1,2,3") from None
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r} repeats a seed")
    return seeds


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    args.quick = smoke.quick(args.quick)
    out = args.out or os.path.join(
        "out", args.experiment + ("-quick" if args.quick else "") + ("-tuning" if args.tune else "")
    )
    return run_command(
        lambda: stoppable(lambda: run(args, argv, out), out),
        on_interrupt=f"interrupted; the finished jobs are kept in {out}: continue with --resume",
    )


def stoppable(body, out: str) -> int:
    """``body()`` with SIGTERM raised as ``Interrupted``, like Ctrl-C, so that either stops the workers and
    ends the command with one line on stderr and status 130 (SIGINT) or 143 (SIGTERM)."""
    main_thread = threading.current_thread() is threading.main_thread()  # where signal handlers can be set
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        return body()
    except KeyboardInterrupt as exc:
        name = exc.signal if isinstance(exc, Interrupted) else "SIGINT"
        print(f"error: stopped by {name}; the finished jobs are kept in {out}: continue with --resume", file=sys.stderr)
        return 143 if name == "SIGTERM" else 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _terminated(signum, frame):
    raise Interrupted("SIGTERM")


def shown_path(path: str) -> str:
    """``path`` relative to the repository when it lies inside it (the registered rates), else absolute."""
    inside = os.path.abspath(path).startswith(REPO + os.sep)
    return os.path.relpath(path, REPO) if inside else os.path.abspath(path)


def sweep_rows(plan: dict) -> list:
    """The extension rows whose fine-tuning rate the tuning step chooses."""
    return list(extension_runs(plan)) if sweep.rates(plan) else []


def frozen_rates(args, plan: dict, out: str, journal, commit: str, started: float) -> str:
    """The path of the rates the study trains at. ``--tune`` runs the tuning step (``minilm.study.tune``)
    and writes them there; so does ``--quick`` (a smoke test of the whole chain) when its file is
    missing or was tuned for other settings. Otherwise the file must exist and fit the plan."""
    path = args.rates or (os.path.join(out, rates.FILE) if args.quick else rates.registered_path(plan["experiment"]))
    fits = os.path.exists(path) and not rates.differences(
        rates.read(path, plan["experiment"])["tuned_for"], rates.tuned_for(plan)
    )
    if not (args.tune or (args.quick and not args.rates and not fits)):
        return path
    tuner = experiments.Study(plan, out, workers=args.workers, quiet=args.quiet, journal=journal)
    tuner.prepare_data()
    about = {
        "commit": commit,
        "machine": provenance.host_line(),  # with the CPU flags, as a report's Machine line
        "command": "python -m minilm experiment "
        + " ".join([plan["experiment"], *(["--quick"] if args.quick else []), *args.overrides, "--tune"]),
    }
    contents = tune.run_tuning(tuner, designs.scratch_labels(plan), about)
    rates.write(path, contents)
    say(f"the tuning step chose {contents['scales']} x train.lr and fine-tuning rates {contents['finetune_lrs']}")
    print(
        f"wrote {path} ({(time.time() - started) / 60:.1f} min this invocation; the step's jobs ran "
        f"{contents['about']['minutes']} min, {contents['about']['process_minutes']} process-minutes)"
    )
    return path


def say(message: str) -> None:
    print(f"[experiment] {message}", file=sys.stderr, flush=True)


def run(args, argv, out: str) -> int:
    if args.report_only:
        print(f"wrote {report.rewrite_report(out)}")
        return 0
    started = time.time()
    started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    load_start = provenance.load_average()
    commit = provenance.git_commit(REPO, exclude=out)  # the code as it is when the run starts
    if args.workers < 1:
        raise experiments.ExperimentError(f"--workers {args.workers} is invalid: expected at least 1")
    plan = experiments.make_plan(args.experiment, args.quick, args.seeds, args.overrides)
    if args.tune and not tuning.scales(plan):
        tuned = [name for name in designs.EXPERIMENTS if tuning.scales(experiments.make_plan(name, args.quick))]
        raise experiments.ExperimentError(
            f"--tune: {args.experiment} has no tuning step (its runs train at its plan's rates); the "
            f"experiments that have one: {', '.join(tuned)}"
        )
    claims_path = primary.path_for(plan["experiment"])
    if os.path.exists(claims_path):  # what the claims read the plan must give, before anything runs
        primary.check_plan(plan, claims_path)
    earlier = [name for name in ("study.json", "runs") if os.path.exists(os.path.join(out, name))]
    if args.resume and args.overwrite:
        raise experiments.ExperimentError(
            "--resume continues the experiment in --out and --overwrite starts it over: give one of them"
        )
    if earlier and not (args.overwrite or args.resume):  # found before any job runs, in the experiment's own words
        raise experiments.ExperimentError(
            f"--out {out!r} holds an earlier experiment ({', '.join(earlier)}): give "
            f"--resume to continue it, --overwrite to run it again over its runs, "
            f"--report-only to rewrite its report, or another --out"
        )
    journal = Journal(os.path.join(out, "journal"))
    train = plan.get("train", {})
    precision = str(resolve_dtype(train.get("dtype", "auto"), resolve_device(train.get("device", "cpu"))))
    command = "python -m minilm experiment " + " ".join(a for a in argv if a != "--resume")
    invocation = journal.start(commit, plan, resume=args.resume, precision=precision, command=command)
    data = plan["data"]
    journal.bind(
        "corpus",
        source_fingerprint(data["corpus"], data.get("text_field", "text"), {"data.dir": data.get("dir", "data")}),
        f"data.corpus={data['corpus']!r} (its files' sizes, dates or bytes)",
    )
    study = experiments.Study(plan, out, workers=args.workers, quiet=args.quiet, journal=journal)
    if tuning.scales(plan):  # an experiment whose rates are tuned: the tuning step, or its frozen rates
        path = frozen_rates(args, plan, out, journal, commit, started)
        if args.tune:
            return 0
        contents = rates.read(path, plan["experiment"])
        rates.check(contents, path, plan, designs.scratch_labels(plan), sweep_rows(plan))
        digest = hashlib.sha256(json.dumps(contents, sort_keys=True).encode()).hexdigest()
        journal.bind("rates", digest, f"the rates file {path} (its rates)")
        last, before = primary.registration(path, commit)
        study.use_rates(contents, {"path": shown_path(path), "commit": last, "registered": before})
    study.claims = primary.snapshot(plan["experiment"], commit)  # the claims this run tests, as they are now
    if study.claims:  # the rows the retrieval claims read, trained at the plan's claim_seeds too
        study.claimed = primary.retrieval_rows(primary.path_for(plan["experiment"]), study.claims["text"])
    study.build()
    kept = keep_aside(os.path.join(out, "discussion.md")) if earlier and not args.resume else None
    if kept:  # it discussed the earlier run: this run's report must not carry it, and nothing written is lost
        say(
            f"the earlier run's discussion.md is kept as {os.path.basename(kept)}; this report has none until "
            f"you write one (then --report-only)"
        )
    if not args.quiet:
        say(f"{len(study.jobs)} jobs ({len(study.runs)} training runs) on {args.workers} worker processes")
    study.run()
    study.invocations = invocation
    path = report.write_report(
        study, journal.command, time.time() - started, started_at, (load_start, provenance.load_average()), commit
    )
    print(f"wrote {path} ({(time.time() - started) / 60:.1f} min)")
    return 0
