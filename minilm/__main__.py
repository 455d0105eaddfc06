"""``python -m minilm <command> ...``: the package's command-line tools.

    python -m minilm positions list|plot ...     the position registry: list it, draw a scheme
    python -m minilm passkey eval|make-corpus ...  passkey retrieval
    python -m minilm longeval CHECKPOINT          the long-context suite (needles, queries, variable tracking)
    python -m minilm lmeval CHECKPOINT --tasks T   lm-evaluation-harness tasks (pip install -e ".[eval]")
    python -m minilm experiment length-generalization [--quick] ...
    python -m minilm export CHECKPOINT DIR          a checkpoint as a Hugging Face model directory

Each command lives in ``minilm/cli/``; ``--help`` after a command shows its options.
"""
import sys

from minilm.cli import experiment, export, lmeval, longeval, passkey, positions

COMMANDS = {"positions": positions.main, "passkey": passkey.main, "longeval": longeval.main, "lmeval": lmeval.main,
            "experiment": experiment.main, "export": export.main}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}: valid: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return COMMANDS[command](rest)


if __name__ == "__main__":
    sys.exit(main())
