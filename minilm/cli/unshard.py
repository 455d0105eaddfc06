"""``python -m minilm unshard OUT_DIR [--out FILE]``: make one checkpoint file of a sharded
checkpoint (``train.checkpoint_format: sharded``, written by any number of processes), the
optimiser's state included, so that every command takes it and ``--resume`` continues it
(``minilm.training.saving.unshard``)."""

from __future__ import annotations

from minilm.checkpoints import format as checkpoint
from minilm.checkpoints.loading import load_model
from minilm.cli import Parser, run_command
from minilm.training.saving import unshard


def main(argv=None) -> int:
    parser = Parser(prog="minilm unshard", description=__doc__.split("\n\n")[0].replace("``", "'"))
    parser.add_argument("checkpoint", help=f"an out_dir holding {checkpoint.SHARDED}/, or that directory")
    parser.add_argument(
        "--out",
        default=None,
        help=f"the file to write, a name ending in .pt (else a directory to hold {checkpoint.FILENAME}; default: "
        f"{checkpoint.FILENAME} beside {checkpoint.SHARDED}); an existing file is replaced only with --overwrite",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    args = parser.parse_args(argv)
    return run_command(lambda: run(args))


def run(args) -> int:
    path = unshard(args.checkpoint, args.out, overwrite=args.overwrite)
    model, _, config, _ = load_model(path)  # what every other command will do with it
    print(
        f"wrote {path}: step {checkpoint.load(path)['step']}, {model.num_params():,} parameters, "
        f"position {config.model.position['kind']}; resumable (optimiser state included)"
    )
    return 0
