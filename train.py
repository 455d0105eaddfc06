"""Train a minilm model: ``python train.py --config rope.yaml [section.key=value ...]``.

The config is looked up as given, then in configs/. Overrides after it are dotted keys
with YAML values, e.g. ``train.max_steps=200 model.position.kind=alibi``. ``--resume``
continues the run in the config's out_dir; ``--print-config`` prints the resolved config
and exits. Under ``torchrun --nproc_per_node=N train.py ...`` it trains with DDP.
Everything else lives in minilm.trainer.
"""
import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="example: python train.py --config rope.yaml train.max_steps=200 "
                                            "model.position.kind=alibi")
    parser.add_argument("--config", help="YAML config file (looked up in . then configs/); defaults if omitted")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="overrides, values parsed as YAML")
    parser.add_argument("--resume", action="store_true", help="continue the run saved in out_dir/ckpt.pt")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or messages; print only the summary")
    args = parser.parse_args(argv)

    import json

    from minilm.checkpoint import CheckpointError
    from minilm.config import ConfigError, load_config
    from minilm.data import DataError
    from minilm.tokenizer import TokenizerError
    from minilm.trainer import TrainingError, resolve_config, train

    try:
        config = resolve_config(load_config(args.config, args.overrides))
        if args.print_config:
            print(config.to_yaml(), end="")
            return 0
        summary = train(config, resume=args.resume, quiet=args.quiet)
    except (ConfigError, CheckpointError, DataError, TokenizerError, TrainingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted outside the training loop; checkpoints already in out_dir are kept",
              file=sys.stderr)
        return 130
    if args.quiet:
        print(json.dumps({k: v for k, v in summary.items() if k != "sample"}))
    if summary["interrupted"]:
        return 130 if summary["interrupted"] == "SIGINT" else 143
    return 0


if __name__ == "__main__":
    sys.exit(main())
