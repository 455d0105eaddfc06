"""Train a minilm model: ``minilm train --config rope.yaml [section.key=value ...]`` (also
``python train.py`` in a clone, ``python -m minilm train``).

The config is looked up as given, then in ./configs/, then among the configs shipped in the
package (minilm/configs/: rope.yaml, alibi.yaml, ...). Overrides after it are dotted keys
with YAML values, e.g. ``train.max_steps=200 model.position.kind=alibi``. ``--resume``
continues the run in the config's out_dir; ``--print-config`` prints the config the run
would train with (``train.init_from``'s architecture, a tokenizer's vocabulary, with
``--resume`` the checkpoint's train settings) and exits; ``--reprepare`` tokenizes the corpus
again even when its prepared files look current. Under ``torchrun --nproc_per_node=N
train.py ...`` it trains with DDP. Everything else lives in minilm.training.loop.
"""

import argparse
import json

from minilm.checkpoints.format import CheckpointError
from minilm.checkpoints.loading import read_checkpoint
from minilm.cli import Parser, run_command, smoke
from minilm.config import config_keys, resolve_config
from minilm.configfile import load_config
from minilm.training.loop import printed_config, train


def main(argv=None) -> int:
    parser = Parser(
        prog="minilm train",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: minilm train --config rope.yaml train.max_steps=200 model.position.kind=alibi\n\n"
        "config keys (section.key = default: what it does), each settable as an override:\n" + config_keys_text(),
    )
    parser.add_argument(
        "--config",
        help="YAML config file (a path, then ./configs/, then the shipped configs: "
        "rope.yaml, alibi.yaml, ...); defaults if omitted",
    )
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="overrides, values parsed as YAML")
    parser.add_argument("--resume", action="store_true", help="continue the run saved in out_dir/ckpt.pt")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start a new run in an out_dir that holds a checkpoint, replacing it (a ckpt.pt that is not a minilm "
        "checkpoint is kept as ckpt.1.pt)",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the config the run would train with as YAML and exit (train.init_from's architecture, "
        "data.tokenizer's vocabulary; with --resume the checkpoint's train settings)",
    )
    parser.add_argument(
        "--reprepare",
        action="store_true",
        help="tokenize the corpus again (under data.dir) even when its prepared files look current: "
        "for an edit that kept a file's size and mtime",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or messages; print only the summary")
    args = parser.parse_intermixed_args(argv)  # overrides before and after the flags

    return run_command(
        lambda: run(args), on_interrupt="interrupted outside the training loop; checkpoints already in out_dir are kept"
    )


def run(args) -> int:
    config = load_config(args.config, args.overrides)
    if smoke.active():
        config = load_config(args.config, args.overrides + smoke_overrides(config, args.resume))
    config = resolve_config(config)
    if args.print_config:
        print(printed_config(config, resume=args.resume).to_yaml(), end="")
        return 0
    summary = train(config, resume=args.resume, overwrite=args.overwrite, quiet=args.quiet, reprepare=args.reprepare)
    if args.quiet:
        print(json.dumps({k: v for k, v in summary.items() if k != "sample"}))
    if summary["interrupted"]:
        return 130 if summary["interrupted"] == "SIGINT" else 143
    return 0


def smoke_overrides(config, resume: bool = False) -> list:
    """A smoke run's overrides (``smoke.training_overrides``). Its one layer from scratch takes the last
    type of a layer design (``model.layers``), as the study's --quick plan does: a pattern longer than
    the model's layers is refused. A smoke ``--resume`` trains its steps past the checkpoint's (a
    finished run has none left)."""
    overrides = smoke.training_overrides(config.train.init_from)
    if overrides and resume:
        try:
            overrides.append(f"train.max_steps={read_checkpoint(config.out_dir)['step'] + smoke.STEPS}")
        except CheckpointError:
            pass  # no checkpoint to resume: the run says so
    layers = config.model.layers
    if overrides and layers and not config.train.init_from:
        last = layers["pattern"][-1]
        overrides.append(f"model.layers={json.dumps({'pattern': [last], last: layers[last]})}")
    return overrides


def config_keys_text() -> str:
    """Every config key with its default and its one-line help, one per line (what ``minilm train
    --help`` ends with; the manual's config reference reads the same ``minilm.config.config_keys``)."""
    lines = []
    for key, default, choices, text in config_keys():
        shown_choices = f" ({' | '.join(choices)})" if choices else ""
        lines.append(f"  {key} = {default}{shown_choices}: {text}")
    return "\n".join(lines)
