"""The ``minilm`` command (installed by ``pip install .``; also ``python -m minilm``): one
entry for every tool, each a module of ``minilm/cli/`` with its own ``--help``."""

import sys

from minilm.cli import (
    evaluate,
    experiment,
    export,
    extend,
    generate,
    lmeval,
    longeval,
    memory,
    passkey,
    positions,
    train,
    unshard,
)

USAGE = """usage: minilm <command> [options]   (or: python -m minilm <command> [options])

  train --config rope.yaml [key=value ...]   train a model (the shipped configs: rope.yaml, alibi.yaml, ...)
  generate --checkpoint DIR "PROMPT"         stream a continuation from a checkpoint
  evaluate CHECKPOINT ...                    perplexity and bits/char by length; --stream for StreamingLLM
  extend SOURCE --method yarn --factor 4     fine-tune a trained model at factor x its length (full or --lora)
  positions list|plot|layers ...             the position registry: list it, draw a scheme, a config's layers
  passkey eval|make-corpus ...               passkey retrieval
  longeval CHECKPOINT                        the long-context suite (needles, queries, variable tracking)
  lmeval CHECKPOINT --tasks T                lm-evaluation-harness tasks (the eval extra)
  experiment length-generalization|ablation   the length-generalization study and its ablation
  export CHECKPOINT DIR                      a checkpoint as a Hugging Face model directory
  unshard OUT_DIR                            a sharded checkpoint (train.checkpoint_format: sharded) as one file
  memory [CONFIG] [--ranks N]                a training step's memory per process: DDP or FSDP, checkpointing

'minilm <command> --help' shows a command's options."""

COMMANDS = {
    "train": train.main,
    "generate": generate.main,
    "evaluate": evaluate.main,
    "extend": extend.main,
    "positions": positions.main,
    "passkey": passkey.main,
    "longeval": longeval.main,
    "lmeval": lmeval.main,
    "experiment": experiment.main,
    "export": export.main,
    "unshard": unshard.main,
    "memory": memory.main,
}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}: valid: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return COMMANDS[command](rest)


if __name__ == "__main__":
    sys.exit(main())
