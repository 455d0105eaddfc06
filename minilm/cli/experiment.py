"""``python -m minilm experiment length-generalization [--quick] [--out DIR] [--seed N] [key=value ...]``:
run the whole length-generalization experiment (``minilm.experiments``) and write its report
(``minilm.report``)."""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

from minilm import experiments, report
from minilm.cli import Parser, run_command

EXPERIMENTS = ("length-generalization",)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv):
    parser = Parser(prog="python -m minilm experiment", description=experiments.__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter,
                    epilog="overrides: section.key=value on the plan (sections: " + ", ".join(experiments.FULL)
                           + "), e.g. data.corpus=texts/ train.max_steps=500")
    parser.add_argument("experiment", choices=EXPERIMENTS)
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    parser.add_argument("--quick", action="store_true", help="tiny models and budgets (a smoke test, minutes)")
    parser.add_argument("--out", help="output directory (default out/<experiment>[-quick])")
    parser.add_argument("--seed", type=int, help="seed of every run (default 1337)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--overwrite", action="store_true", help="replace the runs of an earlier experiment in --out")
    return parser.parse_intermixed_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    out = args.out or os.path.join("out", args.experiment + ("-quick" if args.quick else ""))
    return run_command(lambda: run(args, argv, out),
                       on_interrupt="interrupted; finished runs are kept under " + os.path.join(out, "runs"))


def say(message: str) -> None:
    print(f"[experiment] {message}", file=sys.stderr, flush=True)


def run(args, argv, out: str) -> int:
    started = time.time()
    started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    load_start = report.load_average()
    commit = report.git_commit(REPO, exclude=out)  # the code as it is when the run starts
    plan = experiments.make_plan(args.quick, args.seed, args.overrides)
    runner = experiments.Runner(plan, out, quiet=args.quiet, overwrite=args.overwrite,
                                log=None if args.quiet else say)
    runner.run()
    threads = os.environ.get("OMP_NUM_THREADS")
    command = (f"OMP_NUM_THREADS={threads} " if threads else "") + "python -m minilm experiment " + " ".join(argv)
    path = report.write_report(runner, command, time.time() - started, started_at,
                               (load_start, report.load_average()), commit)
    print(f"wrote {path} ({(time.time() - started) / 60:.1f} min)")
    return 0
