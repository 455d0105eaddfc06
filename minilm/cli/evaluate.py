"""Perplexity and bits/char of checkpoints on the held-out split at several lengths:
``minilm evaluate`` (also ``python evaluate.py`` in a clone, ``python -m minilm evaluate``).

    minilm evaluate out/rope out/alibi                      # 1x, 2x, 4x, 8x, 16x each block_size
    minilm evaluate out/rope --lengths 256,1024 --mode sliding --stride 128
    minilm evaluate out/rope model.position.scaling.type=dynamic   # a RoPE scaling, no fine-tuning
    minilm evaluate out/rope model.position.scaling='{type: yarn, factor: 4}'
    minilm evaluate out/rope --stream                       # StreamingLLM: full, window, window + sinks

Prints markdown tables (perplexity, bits/char), writes a CSV and, with matplotlib, a PNG
of perplexity against length; with --stream the loss by band of positions of one long text
under four kinds of attention (minilm.evaluation.streaming), as a table, a CSV and a PNG of
loss against position. The work is done by minilm.evaluation.
"""

import os
import sys

from minilm.cli import LOADED, Parser, number_list, run_command
from minilm.common import output_path, write_csv
from minilm.evaluation import lengths as evaluation
from minilm.evaluation import streaming
from minilm.figures.canvas import PlotError, check_figure_path, have_matplotlib
from minilm.hf.reading import is_hf_source
from minilm.training.outdir import check_writable


def main(argv=None) -> int:
    parser = Parser(
        prog="minilm evaluate",
        description="Perplexity and bits/char on the validation split at several lengths.",
        epilog="--position.KEY=VALUE is the old spelling of model.position.KEY=VALUE (accepted for one release).",
    )
    parser.take_settings(
        f"every checkpoint's {LOADED}",
        "model.position.scaling.type=yarn model.position.scaling.factor=4",
        old_position=True,
    )
    parser.add_argument(
        "checkpoints",
        nargs="+",
        help="checkpoint files, out_dirs holding ckpt.pt, or Hugging Face model directories / hf:NAME",
    )
    parser.add_argument(
        "--lengths",
        type=lambda s: number_list(s, int, "--lengths"),
        help="absolute segment lengths, e.g. 128,256,512 (default: multiples of each block_size)",
    )
    parser.add_argument(
        "--multiples",
        type=lambda s: number_list(s, float, "--multiples"),
        help="multiples of each model's block_size (default 1,2,4,8,16)",
    )
    parser.add_argument("--mode", choices=["nonoverlapping", "sliding"], default="nonoverlapping")
    parser.add_argument("--stride", type=int, help="sliding mode: tokens each segment advances (default: length/2)")
    parser.add_argument(
        "--split",
        choices=evaluation.SPLITS,
        default="val",
        help="what is scored: the validation split, or the text held out of the train split "
        "(data.holdout_tokens) to choose settings on",
    )
    parser.add_argument("--max-tokens", type=int, help="scored validation tokens (default 65536; 0 = the whole split)")
    parser.add_argument("--batch-tokens", type=int, help="tokens per forward pass (default 8192)")
    parser.add_argument(
        "--stream",
        action="store_true",
        help="score one long text token by token with full attention, a rolling window, and the "
        "window with sinks at absolute and at cache positions (StreamingLLM)",
    )
    parser.add_argument(
        "--stream-tokens", type=int, help="--stream: tokens of the validation split scored (default 16 x block_size)"
    )
    parser.add_argument("--max-context", type=int, help="--stream: the window in tokens (default block_size)")
    parser.add_argument(
        "--sink-tokens",
        type=int,
        help=f"--stream: the first tokens kept in view (default {streaming.DEFAULT_SINKS})",
    )
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    parser.add_argument("--csv", help="CSV output (default: eval-<mode>.csv next to the first checkpoint)")
    parser.add_argument("--plot", help="PNG output (default: eval-<mode>.png next to the first checkpoint)")
    parser.add_argument("--no-files", action="store_true", help="print the tables only")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)  # checkpoints and settings among the options too

    if args.stream and (
        args.lengths
        or args.multiples
        or args.stride is not None
        or args.mode != "nonoverlapping"
        or args.max_tokens is not None
        or args.batch_tokens is not None
    ):
        parser.error(
            "--stream scores one text with its own protocol: leave out --lengths, --multiples, --mode, "
            "--stride, --max-tokens and --batch-tokens (its length is --stream-tokens)"
        )
    if args.lengths and args.multiples:
        parser.error("--lengths and --multiples both choose the lengths: give one of them")
    args.multiples = args.multiples or [1, 2, 4, 8, 16]
    args.max_tokens = 65536 if args.max_tokens is None else args.max_tokens
    args.batch_tokens = 8192 if args.batch_tokens is None else args.batch_tokens
    if args.stream and args.split != "val":
        parser.error("--stream scores the validation split: --split is an option of the length tables")
    if not args.stream and any(v is not None for v in (args.stream_tokens, args.max_context, args.sink_tokens)):
        parser.error("--stream-tokens, --max-context and --sink-tokens are options of --stream")
    args.sink_tokens = streaming.DEFAULT_SINKS if args.sink_tokens is None else args.sink_tokens
    return run_command(lambda: (stream_report if args.stream else report)(args, args.overrides))


def report(args, overrides) -> int:
    """Score, print the tables, write the CSV and the plot."""
    check_outputs(args)
    results = evaluation.evaluate_checkpoints(
        args.checkpoints,
        lengths=args.lengths,
        multiples=args.multiples,
        mode=args.mode,
        stride=args.stride,
        max_tokens=args.max_tokens or None,
        overrides=overrides,
        batch_tokens=args.batch_tokens,
        dtype=args.dtype,
        device=args.device,
        quiet=args.quiet,
        split=args.split,
    )
    first = results[0]
    print(
        f"{'validation' if args.split == 'val' else 'held-out training text'} perplexity, {args.mode} segments"
        + (f" (stride {args.stride or 'length/2'})" if args.mode == "sliding" else "")
        + f", {scored(results)}\n"
    )
    print(evaluation.markdown_table(results, "ppl") + "\n")
    print(evaluation.markdown_table(results, "bpc"))
    if not args.no_files:
        name = f"eval-{'' if args.split == 'val' else args.split + '-'}{args.mode}"  # eval-holdout-*: not the val's
        csv_path = output_path(args.csv) if args.csv else default_output(first.checkpoint, f"{name}.csv")
        print(f"\nwrote {evaluation.write_csv(results, csv_path)}", file=sys.stderr)
        if have_matplotlib():
            png = evaluation.plot(
                results,
                output_path(args.plot) if args.plot else default_output(first.checkpoint, f"{name}.png"),
                split=args.split,
            )
            print(f"wrote {png}", file=sys.stderr)
    return 0


def scored(results) -> str:
    """What each row scored: one count where every checkpoint scored the same text, else one per row (their
    tokenizers or splits differ, and so do their tokens and, capped by --max-tokens, their characters)."""
    counts = {r.label: f"{r.tokens:,} scored tokens ({r.chars:,} characters)" for r in results}
    if len(set(counts.values())) == 1:
        return next(iter(counts.values()))
    return "scored text by row: " + "; ".join(f"{label} {count}" for label, count in counts.items())


def check_outputs(args) -> None:
    """A --csv or --plot that cannot be written (or drawn) is found before the evaluation, not after it."""
    if args.plot and not have_matplotlib():
        raise PlotError("--plot needs matplotlib: pip install -e '.[plot]'")
    for option, path in (("--csv", args.csv), ("--plot", args.plot)):
        if path and not args.no_files:
            check_writable(os.path.dirname(os.path.abspath(path)), option)
    if args.plot and not args.no_files:
        check_figure_path(args.plot)


def stream_report(args, overrides) -> int:
    """--stream: every checkpoint's loss by band of positions under each kind of attention."""
    check_outputs(args)
    streams = []
    for path in args.checkpoints:
        these = streaming.stream_checkpoint(
            path,
            overrides,
            tokens=args.stream_tokens,
            window=args.max_context,
            sinks=args.sink_tokens,
            dtype=args.dtype,
            device=args.device,
            quiet=args.quiet,
        )
        print(
            f"{path}: streaming loss (nats per token) by band of positions, {these[0].tokens:,} tokens of the "
            f"validation split\n\n{streaming.band_table(these)}\n"
        )
        streams += these
    if not args.no_files:
        csv_path = output_path(args.csv) if args.csv else default_output(args.checkpoints[0], "stream.csv")
        print(f"wrote {write_csv(streaming.band_rows(streams), csv_path, keep=True)}", file=sys.stderr)
        if have_matplotlib():
            png = streaming.plot_streams(
                streams, output_path(args.plot) if args.plot else default_output(args.checkpoints[0], "stream.png")
            )
            print(f"wrote {png}", file=sys.stderr)
    return 0


def default_output(checkpoint: str, name: str) -> str:
    """Where a table or plot goes unless named: beside a minilm checkpoint (in its out_dir), in
    the current directory for a Hugging Face model (``hf:NAME`` is no directory to write into).
    An earlier file of that name is kept as ``<stem>.1<suffix>`` (``.2``, ...), never replaced."""
    if is_hf_source(checkpoint):
        base = os.getcwd()
    else:
        base = (
            os.path.abspath(checkpoint) if os.path.isdir(checkpoint) else os.path.dirname(os.path.abspath(checkpoint))
        )
    return output_path(os.path.join(base, name))
