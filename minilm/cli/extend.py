"""Extend a trained model to a longer context: ``minilm extend SOURCE --method yarn --factor 4
[section.key=value ...]`` (also ``python -m minilm extend``).

SOURCE is a minilm run (an out_dir or a checkpoint file) or a transformers model directory (or
hf:NAME from the local cache); its architecture, tokenizer and length are the run's, and the new
length is its length x the factor. The method is a rope scaling (linear or pi, ntk, dynamic, yarn,
llama3, longrope, proportional) or interpolated (position interpolation around any kind, learned and
sinusoidal included). The rest is the shipped extension config's (extend_rope_yarn.yaml, ...: the
schedule, the corpus, the budget), with the overrides after SOURCE on top, as minilm train takes them;
--lora trains the adapters of extend_yarn_lora.yaml instead of every weight. It says what it will train,
then trains with the usual progress and summary. Everything else lives in minilm.training.extend.
"""

import argparse
import json
import re
import sys
import textwrap

from minilm.cli import Parser, run_command, smoke
from minilm.common import shown
from minilm.config import ConfigError, resolve_config
from minilm.configfile import load_config
from minilm.training.extend import ALIASES, METHODS, describe_plan, plan_extension
from minilm.training.loop import printed_config, train


def main(argv=None) -> int:
    parser = Parser(
        prog="minilm extend",
        usage="minilm extend SOURCE --method METHOD --factor FACTOR [--lora] [--out OUT] [--resume] [--overwrite]\n"
        "                     [--print-config] [--quiet] [section.key=value ...]",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  minilm extend out/rope --method yarn --factor 4\n"
        "  minilm extend models/my-llama --method yarn --factor 2 --lora data.corpus=my_long_texts/\n"
        "  minilm extend out/learned --method interpolated --factor 4 train.max_steps=100",
    )
    parser.add_argument(
        "words",
        nargs="+",
        metavar="SOURCE section.key=value",
        help="a minilm out_dir or checkpoint file, or a transformers model; and overrides of the run's config "
        "anywhere among the options, values parsed as YAML",
    )
    parser.add_argument(
        "--method",
        required=True,
        help=f"how positions reach the new length: {', '.join(METHODS)} "
        f"({', '.join(f'{a} = {m}' for a, m in ALIASES.items())})",
    )
    parser.add_argument(
        "--factor", required=True, type=float, help="the new length over the source's, a number > 1 (e.g. 4)"
    )
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (extend_yarn_lora.yaml's), not all")
    parser.add_argument("--out", help="the run's out_dir (default: beside the source, e.g. out/rope-yarn-x4)")
    parser.add_argument("--resume", action="store_true", help="continue the extension saved in its out_dir")
    parser.add_argument(
        "--overwrite", action="store_true", help="start anew in an out_dir that holds a checkpoint, replacing it"
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the config the run would train with (the source's architecture and tokenizer's vocabulary; "
        "with --resume the checkpoint's train settings) and exit",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or messages; print only the summary")
    args = parser.parse_args(argv)
    return run_command(
        lambda: run(args), on_interrupt="interrupted outside the training loop; checkpoints already in out_dir are kept"
    )


def run(args) -> int:
    """Plan the extension, say what it trains, train it; the exit status (130/143 when interrupted)."""
    source, overrides = source_and_overrides(args.words)
    plan = plan_extension(source, args.method, args.factor, lora=args.lora, out_dir=args.out, overrides=overrides)
    config = resolve_config(load_config(plan.config_path, plan.overrides + smoke.training_overrides(plan.source)))
    if args.print_config:  # what the run starts from, as train --print-config prints it
        print(printed_config(config, resume=args.resume).to_yaml(), end="")
        return 0
    if not args.quiet:
        said = describe_plan(plan, config)
        print(textwrap.fill(said, width=110, break_on_hyphens=False, break_long_words=False), file=sys.stderr)
    summary = train(config, resume=args.resume, overwrite=args.overwrite, quiet=args.quiet)
    if args.quiet:
        print(json.dumps({k: v for k, v in summary.items() if k != "sample"}))
    if summary["interrupted"]:
        return 130 if summary["interrupted"] == "SIGINT" else 143
    return 0


SETTING = re.compile(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*=")  # out_dir=..., train.max_steps=...: a key, then =


def source_and_overrides(words: list) -> tuple:
    """(SOURCE, the overrides) of the positional arguments: SOURCE is the one that is no ``key=value``, wherever
    it stands; none or several is a one-line error."""
    sources = [word for word in words if not SETTING.match(word)]
    if len(sources) != 1:
        raise ConfigError(
            f"minilm extend takes one SOURCE (a minilm run or a transformers model directory) among the "
            f"section.key=value overrides; got {len(sources)}: {shown(sources)}"
        )
    return sources[0], [word for word in words if SETTING.match(word)]
