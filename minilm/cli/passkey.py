"""``python -m minilm passkey eval|make-corpus ...``: passkey retrieval accuracy of checkpoints,
and fine-tuning corpora of passkey documents (``minilm.evaluation.passkey``)."""

from __future__ import annotations

import sys

from tqdm import tqdm

from minilm.checkpoints.loading import load_model, read_checkpoint
from minilm.cli import LOADED, Parser, add_probe_grid, run_command, seed, smoke
from minilm.data.hf_tokenizer import load_tokenizer, tokenizer_from_bytes
from minilm.data.sources import corpus_documents, join_documents
from minilm.evaluation import passkey
from minilm.evaluation.passkey import DEFAULT_DEPTHS, PasskeyError, accuracy, markdown, write_corpus
from minilm.hf.reading import is_hf_source


def _make_corpus(args) -> list:
    """make-corpus: the checkpoint's tokenizer measures the lengths; its training split is the mix text."""
    if args.checkpoint.endswith(".model"):
        if args.mix:
            raise PasskeyError(
                f"--mix {args.mix} needs a checkpoint (its training corpus is mixed in), "
                f"not the tokenizer file {args.checkpoint!r}"
            )
        return _write(args, load_tokenizer(args.checkpoint), "")
    if args.mix and is_hf_source(args.checkpoint):
        raise PasskeyError(
            f"--mix {args.mix} needs a minilm checkpoint (its training corpus is mixed in); the "
            f"training text of {args.checkpoint!r} is not known"
        )
    state = read_checkpoint(args.checkpoint)
    text = ""
    if args.mix:
        data = state["config"]["data"]
        skip = {"data.dir": data.get("dir", "data")}  # the documents the run trained on, not its prepared files
        text = join_documents(corpus_documents(data["corpus"], data.get("text_field", "text"), skip)[0])
    return _write(args, tokenizer_from_bytes(state["tokenizer"]), text)


def _write(args, tokenizer, mix_text: str) -> list:
    with tqdm(total=args.n, desc="passkey documents", unit="doc", file=sys.stderr, leave=False) as bar:
        return write_corpus(
            args.out_dir,
            tokenizer,
            args.n,
            args.length,
            args.seed,
            mix_text=mix_text,
            mix=args.mix,
            overwrite=args.overwrite,
            progress=bar,
        )


def main(argv=None) -> int:
    parser = Parser(prog="minilm passkey", description=passkey.__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("eval", help="passkey accuracy of checkpoints per length and depth")
    ev.add_argument("checkpoints", nargs="+")
    add_probe_grid(ev, DEFAULT_DEPTHS, "the key")
    ev.add_argument("--trials", type=int, default=5, help="random keys per length and depth (default %(default)s)")
    ev.add_argument("--seed", type=seed, default=0, help="seeds the keys and the filler (default %(default)s)")
    ev.take_settings(f"every checkpoint's {LOADED}", "model.position.scaling.type=dynamic")
    mk = sub.add_parser("make-corpus", help="write passkey documents as a text corpus directory")
    mk.add_argument("out_dir")
    mk.add_argument(
        "--checkpoint", required=True, help="checkpoint (or tokenizer.model) whose tokenizer measures the lengths"
    )
    mk.add_argument("--n", type=int, default=2000)
    mk.add_argument("--length", type=int, required=True, help="longest document in tokens")
    mk.add_argument(
        "--mix",
        type=float,
        default=0.0,
        help="fraction of the characters taken from the checkpoint's training text (default 0)",
    )
    mk.add_argument("--seed", type=seed, default=0)
    mk.add_argument(
        "--overwrite", action="store_true", help="replace a non-empty out_dir (once the new corpus is whole)"
    )
    args = parser.parse_args(argv)
    if getattr(args, "trials", None):
        args.trials = smoke.trials(args.trials)
    return run_command(lambda: run(args))


def run(args) -> int:
    if args.command == "make-corpus":
        paths = _make_corpus(args)
        print(f"wrote {args.n} passkey documents ({len(paths)} files, mix {args.mix:g}) under {args.out_dir}")
        return 0
    depths = args.depths
    for path in args.checkpoints:
        model, tokenizer, config, _ = load_model(path, args.overrides)
        these = args.lengths or [config.model.block_size * m for m in (1, 2, 4)]
        with tqdm(
            total=len(these) * len(depths) * args.trials, desc=f"passkey {path}", file=sys.stderr, leave=False
        ) as bar:
            rows = accuracy(model, tokenizer, these, depths, args.trials, args.seed, progress=bar)
        print(f"\npasskey accuracy of {path} ({args.trials} trials per cell)\n\n{markdown(rows)}")
    return 0
