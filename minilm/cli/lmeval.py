"""``python -m minilm lmeval CHECKPOINT --tasks T[,T...] [section.key=value ...]``: lm-evaluation-harness
tasks on any checkpoint (``minilm.evaluation.harness``), its settings changed by ``section.key=value``
arguments (a RoPE scaling, say); prints lm_eval's table."""

from __future__ import annotations

import argparse

from minilm.cli import LOADED, Parser, run_command
from minilm.evaluation import harness


def main(argv=None) -> int:
    parser = Parser(prog="minilm lmeval", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="checkpoint, out_dir, or Hugging Face model directory / hf:NAME")
    parser.add_argument("--tasks", required=True, help="comma-separated lm_eval task names")
    parser.add_argument("--include-path", default=None, help="a folder of task YAML files of your own")
    parser.add_argument(
        "--limit", type=limit, default=None, help="documents per task: a whole number >= 1, or a fraction in (0, 1)"
    )
    parser.add_argument("--num-fewshot", type=lambda s: at_least(s, 0, "--num-fewshot"), default=None)
    parser.add_argument("--batch-size", type=lambda s: at_least(s, 1, "--batch-size"), default=1)
    parser.add_argument(
        "--max-length",
        type=lambda s: at_least(s, 2, "--max-length"),
        default=None,
        help="tokens the model reads (default: block_size)",
    )
    parser.add_argument("--device", default="cpu")
    parser.take_settings(
        f"the checkpoint's {LOADED}", "model.position.scaling.type=yarn model.position.scaling.factor=4"
    )
    args = parser.parse_args(argv)
    return run_command(lambda: run(args))


def at_least(text: str, low: int, option: str) -> int:
    """An argparse type's body: an integer >= ``low``."""
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"{option}={text!r} is invalid: expected an integer >= {low}")
    return value


def limit(text: str):
    """--limit: documents per task, a whole number >= 1, or a fraction of them in (0, 1) (lm_eval's two readings)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if 0 < value < 1:
        return value
    if value >= 1 and value == int(value):
        return int(value)
    raise argparse.ArgumentTypeError(
        f"--limit={text!r} is invalid: expected a whole number of documents >= 1, or a fraction in (0, 1)"
    )


def run(args) -> int:
    harness.require()
    from lm_eval.utils import make_table  # the optional extra, there once require() has passed

    results = harness.evaluate(
        args.checkpoint,
        [t for t in args.tasks.split(",") if t],
        overrides=args.overrides,
        limit=args.limit,
        batch_size=args.batch_size,
        max_length=args.max_length,
        num_fewshot=args.num_fewshot,
        include_path=args.include_path,
        device=args.device,
    )
    print(make_table(results))
    return 0
